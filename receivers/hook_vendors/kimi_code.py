"""The ``kimi_code`` receiver: Kimi Code CLI shell hooks, through ``aep-collector-hook kimi-code``.

Observe-only by default (``control.accepts`` declared empty). With ``control: true`` a PreToolUse
whose tool matches ``gate_tools`` is held as a four-way permission card mapped down onto Kimi's
binary reply: allow / allow_session = no objection (``{}``; Kimi's own permission flow still
runs), deny / cancel = ``permissionDecision: "deny"`` with the reason, plus
``tool.denied{by: "policy"}``. Unanswered frees the hook with ``{}`` (reference stack §1.6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aep_collector.receivers.hook_vendors import shim_hooks
from aep_collector.receivers.hook_vendors.surface import (
    NEUTRAL_REPLY,
    Gate,
    HookGateConfig,
    HookHandling,
    declare,
)
from aep_collector.receivers.wiring import Target, Wiring

VENDOR = "kimi-code"
# Kimi Code 2.1.0 kills a PostToolUse hook's whole process group ~0.1-0.2 s after starting it (the
# tool call's signal ends; seen live: a `sleep 0.2` hook never finished, a setsid'ed one did).
# A Python shim is not reliably reading its stdin by then, so those hooks start in a new session
# (`setsid`, where the system has it; else as before). The shim then answers at once and posts
# from a detached child (pipeline/shim.py `detached`).
DETACHED_HOOKS = frozenset({"PostToolUse", "PostToolUseFailure"})
MAX_DETACHED_GRACE = 5.0
"""Seconds: a lost PostToolUse never holds run.finished (and the Stop's reply) longer than this;
below the shim's 6 s wait for a hook's reply, so the record still comes before the reply."""
NEW_SESSION = ("/bin/sh -c 'command -v setsid >/dev/null 2>&1 && exec setsid \"$@\"; exec \"$@\"' "
               "aep-new-session")


# Kimi parses exit-0 stdout as JSON; the family's neutral `{}` is structured output with no message
# and no permissionDecision, i.e. "allow, nothing to add" (the reference stack's default reply too).
# Except on UserPromptSubmit: Kimi Code 2.1.0 puts any non-empty stdout of that hook, `{}`
# included, into the model's context as `<hook_result hook_event="UserPromptSubmit">{}</hook_result>`
# (seen live in the request the model received). Empty stdout adds nothing.
SILENT_HOOKS = frozenset({"UserPromptSubmit"})
# Annex A.6: the held gate offers parity with the vendor's native four-way decision, mapped down
# onto the binary hook reply (allow/allow_session = no objection; deny/cancel = block).
GATE_OPTIONS: list[dict[str, str]] = [
    {"id": "allow", "label": "Allow"},
    {"id": "allow_session", "label": "Allow for this session"},
    {"id": "deny", "label": "Deny"},
    {"id": "cancel", "label": "Cancel"},
]


def neutral_reply(hook: str) -> dict[str, Any] | None:
    """The fail-open reply body for ``hook``; ``None`` means an empty body (nothing on stdout)."""
    return None if hook in SILENT_HOOKS else dict(NEUTRAL_REPLY)


def gate_decision(option: str) -> str:
    """A gate option id -> the binary hook decision; anything unrecognized refuses (AEP-0008)."""
    return "allow" if option in ("allow", "allow_session") else "deny"


def pretool_reply(decision: str, reason: str | None = None) -> dict[str, Any]:
    """The PreToolUse reply body for a binary gate decision (``allow`` or ``deny``)."""
    if decision == "allow":
        # Allow is "no hook objection" only: Kimi's own permission flow still runs downstream.
        return dict(NEUTRAL_REPLY)
    if decision != "deny":
        raise ValueError(f"decision must be 'allow' or 'deny', not {decision!r}")
    # Only the literal permissionDecision "deny" blocks; the reason is rendered by the vendor
    # (kimi-code agent-core-v2 externalHooks/internal/runHook.ts, HookSpecificOutputSchema).
    return {"hookSpecificOutput": {"permissionDecision": "deny",
                                   "permissionDecisionReason": reason or "Denied by operator"}}


@dataclass
class KimiCodeKeys(HookGateConfig):
    """The ``kimi_code`` receiver's own keys (``declare`` makes its config class of them: ``KimiCodeConfig``)."""

    attention_timeout: float = 50.0
    """Seconds a gated PreToolUse waits for an operator (registered hook timeout: 60)."""
    detached_grace: float = 1.5
    """Seconds a Stop whose session has a PostToolUse still unreported (posted detached, it can come
    second) waits for it before run.finished goes in; the Stop's reply follows. 0: no wait."""

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.detached_grace <= MAX_DETACHED_GRACE:  # NaN fails too
            raise ValueError(f"detached_grace must be between 0 and {MAX_DETACHED_GRACE:g} seconds")


HANDLING = HookHandling(
    neutral=neutral_reply,  # an empty body on UserPromptSubmit (Kimi would show `{}` to the model)
    session_end=frozenset({"SessionEnd"}),
    gate=Gate(options=GATE_OPTIONS, decide=gate_decision, reply=pretool_reply),
    call_id_key="tool_call_id",
    # The detached PostToolUse can reach the collector after Stop: run.finished waits for it (late_calls).
    ends_run=frozenset({"Stop"}),
)


def registration(url: str | None, cfg: Any) -> Wiring:
    """``[[hooks]]`` tables for ``~/.kimi-code/config.toml``, all 16 events through the shim.

    Exactly the mapping's table (Annex A.6): Kimi refuses the WHOLE config for an event name it does not know.

    Format (moonshotai.github.io/kimi-code customization/hooks, "Configuration"): each table has
    only ``event``, ``matcher``, ``command``, ``timeout`` (integer seconds 1-600, default 30); no
    matcher matches everything. Anything else in a table breaks the whole file.
    """
    lines: list[str] = []
    for name, command, timeout in shim_hooks.registered(VENDOR, url, cfg):
        if name in DETACHED_HOOKS:
            command = NEW_SESSION + " " + command
        lines += ["[[hooks]]", f"event = {shim_hooks.toml_str(name)}", f"command = {shim_hooks.toml_str(command)}",
                  f"timeout = {timeout}", ""]
    return Wiring(VENDOR, [Target("config.toml", "toml", "\n".join(lines), base="KIMI_CODE_HOME:.kimi-code")], [
        "append at the very END of ~/.kimi-code/config.toml ($KIMI_CODE_HOME moves it): a key written "
        "below a [[hooks]] table belongs to that table; or run: aep-collector hooks kimi-code --install"])


DECLARATION = declare(VENDOR, HANDLING, 8398, registration,
                      "Kimi Code shell hooks via aep-collector-hook (POST /hook); opt-in PreToolUse gate",
                      keys=KimiCodeKeys, detached=DETACHED_HOOKS,
                      # Kimi Code puts any UserPromptSubmit stdout, `{}` too, into the model context.
                      neutral_by_event={h: b"" for h in SILENT_HOOKS})
FACTORY = DECLARATION.factory()
