"""The ``vscode`` receiver: VS Code agent hooks, through ``aep-collector-hook vscode``.

Observe-only by default (``control.accepts`` declared empty). With ``control: true`` a PreToolUse
whose tool matches ``gate_tools`` is held as a permission card with options allow / deny / ask
inside VS Code's hook timeout (default hold 25 s under its default 30 s); free text denies with
the text as reason; a commanded deny also emits ``tool.denied{by: "policy"}``; unanswered frees
the hook with no decision (reference stack §1.5).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aep_collector.receivers.hook_vendors import shim_hooks
from aep_collector.receivers.hook_vendors.surface import Gate, HookGateConfig, HookHandling, declare
from aep_collector.receivers.wiring import Target, Wiring

VENDOR = "vscode"
# The vendor's own three-way PreToolUse decision: ask escalates into VS Code's approval flow.
GATE_OPTIONS: list[dict[str, str]] = [
    {"id": "allow", "label": "Allow"},
    {"id": "deny", "label": "Deny"},
    {"id": "ask", "label": "Ask in VS Code"},
]


def pretool_reply(decision: str, reason: str | None = None) -> dict[str, Any]:
    """The held PreToolUse gate's reply (VS Code hooks reference, "PreToolUse output").

    ``{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision":
    "allow"|"deny"|"ask", "permissionDecisionReason"?}}``; ``ask`` escalates into VS Code's own
    approval flow and a deny reason is shown to the model.
    """
    if decision not in ("allow", "deny", "ask"):
        raise ValueError(f"PreToolUse decision must be 'allow', 'deny' or 'ask', not {decision!r}")
    out: dict[str, Any] = {"hookEventName": "PreToolUse", "permissionDecision": decision}
    if reason:
        out["permissionDecisionReason"] = reason
    return {"hookSpecificOutput": out}


@dataclass
class VscodeKeys(HookGateConfig):
    """The ``vscode`` receiver's own keys (``declare`` makes its config class of them: ``VscodeConfig``)."""

    attention_timeout: float = 25.0
    """Seconds a gated PreToolUse waits for an operator: inside VS Code's default 30 s hook timeout."""


HANDLING = HookHandling(
    # The reference-hooks docs name `hook_event_name`; some VS Code builds spell it camelCase.
    name_keys=("hook_event_name", "hookEventName"),
    gate=Gate(options=GATE_OPTIONS, decide=lambda option: option, reply=pretool_reply),
    call_id_key="tool_use_id",
)


def registration(url: str | None, cfg: Any) -> Wiring:
    """A ``.github/hooks/aep-collector.json`` hooks file, every event (the 8-event Preview surface) through the shim.

    Format (code.visualstudio.com/docs/agents/reference/hooks-reference, "Hook command
    properties"): ``hooks.<Event>`` is a list of ``{type: "command", command, timeout}``, timeout in
    SECONDS (default 30). PreToolUse gets room above the hold window even while the gate is off,
    so turning it on needs no re-registration.
    """
    hooks = {name: [{"type": "command", "command": command, "timeout": timeout}]
             for name, command, timeout in shim_hooks.registered(VENDOR, url, cfg)}
    text = json.dumps({"hooks": hooks}, indent=2) + "\n"
    return Wiring(VENDOR, [Target(".github/hooks/aep-collector.json", "file", text, base="project")], [
        "save as .github/hooks/aep-collector.json in the workspace, or run there: "
        "aep-collector hooks vscode --install (--project DIR for another workspace)",
        "VS Code also reads .claude/settings.json hooks: a workspace wired for Claude Code reports there too"])


# VS Code hooks reference (code.visualstudio.com/docs/agents/reference/hooks-reference): exit 0
# with the common output format, every field optional; the family's neutral `{}` lets the agent
# proceed unchanged.
DECLARATION = declare(VENDOR, HANDLING, 8381, registration,
                      "VS Code agent hooks via aep-collector-hook (POST /hook); opt-in PreToolUse gate",
                      keys=VscodeKeys)
FACTORY = DECLARATION.factory()
