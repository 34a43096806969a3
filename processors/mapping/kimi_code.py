"""Kimi Code CLI: the 16-event external-hooks surface (AEP-0002 Annex A.6).

Pinned by ``conformance/fixtures/mappings/kimi-code.json``: ``map_hook`` is the pure hook mapping
(``hooks`` + ``fallback``). The fixture's kap-server web channel (``ws_modes``) is not mapped: no
receiver speaks that WebSocket, and mapping code with no receiver is untested in practice.
``map_signal`` adds what the fixture calls runtime state: the per-prompt run synthesis with its
stale-run drain, the permission pair's companions and the card of the opt-in held PreToolUse gate.
What Kimi Code gets back (neutral replies, the gate's options and reply) is the receiver's
(``aep_collector.receivers.hook_vendors.kimi_code``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.model import Event, Signal

from .drafting import (
    PERMISSION_OPTIONS,
    digest,
    draft,
    gate_card,
    get_dict,
    get_str,
    hook_fallback,
    permission_prompt,
    tool_ref,
)
from .hook_vendors import Payload

__all__ = ["AGENT", "HOOKS", "KimiState", "new_state", "map_hook", "map_signal", "gate_request", "permission_key"]

AGENT = "kimi-code"

# Bounds on runtime state: a daemon lives for weeks, sessions and unanswered prompts accumulate.
MAX_SESSIONS = 4096
MAX_PENDING_PERMISSIONS = 1024


# --- pure hook mapping (fixture `hooks` + `fallback`) ---------------------------------------------


def _prompt_text(prompt: Any) -> str | None:
    """The prompt as text: a plain string, or the text parts of a content-part array joined."""
    if isinstance(prompt, str):
        return prompt or None
    if isinstance(prompt, list):
        texts = [p["text"] for p in prompt if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "\n".join(texts) if texts else None
    return None


def _int(value: Any) -> int | None:
    """An integer that is not a bool (``isinstance(True, int)`` holds in Python)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tool(payload: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    name = get_str(payload, "tool_name")
    return tool_ref(name, get_str(payload, "tool_call_id")), name


def _tool_error(err: Any) -> dict[str, str]:
    """Kimi sends ``{name, message}``; a bare string or nothing degrades to the generic type."""
    if isinstance(err, dict):
        out = {"type": get_str(err, "name") or get_str(err, "type") or "tool_error"}
        if get_str(err, "message"):
            out["message"] = err["message"]
        return out
    out = {"type": "tool_error"}
    if isinstance(err, str) and err:
        out["message"] = err
    return out


def _session_started(p: Payload) -> Event:
    # cwd is workstation-local and never rides (fixture identity $comment).
    return draft("session.started", {"trigger": p["source"]} if get_str(p, "source") else {})


def _session_ended(p: Payload) -> Event:
    # The vendor's single reason value `exit` normalizes to the closed enum.
    return draft("session.ended", {"reason": "normal"})


def _prompt_submitted(p: Payload) -> Event:
    text = _prompt_text(p.get("prompt"))
    if p.get("is_steer") is True:
        # A steer rides the RUNNING turn: no run boundary exists here, so never run.started.
        return draft("x.kimi-code.run.steer_submitted", {"prompt": text} if text else {},
                     _capture={"prompt": "redacted"} if text else None)
    return draft("run.started", {"trigger": "user", **({"prompt": text} if text else {})})


def _stop(p: Payload) -> Event:
    # stop_hook_active is the vendor's continuation plumbing, not a session fact.
    return draft("run.finished", {})


def _stop_failure(p: Payload) -> Event:
    kind = get_str(p, "error_type") or "error"
    error = {"type": kind}
    if get_str(p, "error_message"):
        error["message"] = p["error_message"]
    # error_type doubles as the required run.failed reason and error.type (fixture StopFailure).
    return draft("run.failed", {"reason": kind, "error": error})


def _interrupt(p: Payload) -> Event:
    # The vendor fires Interrupt only for the user's Esc; turn_id never becomes a run id.
    return draft("run.cancelled", {"by": "user"})


def _pre_tool(p: Payload) -> Event:
    tool, tool_name = _tool(p)
    data: dict[str, Any] = {"tool": tool}
    if "tool_input" in p:
        data["args_digest"] = digest(p["tool_input"])
        if isinstance(p["tool_input"], dict):
            data["args"] = p["tool_input"]
    return draft("tool.requested", data, tool_name)


def _post_tool(p: Payload) -> Event:
    tool, tool_name = _tool(p)
    data: dict[str, Any] = {"tool": tool}
    if "tool_output" in p:
        data["result_digest"] = digest(p["tool_output"])
        if isinstance(p["tool_output"], (str, dict)):
            data["result"] = p["tool_output"]
    return draft("tool.completed", data, tool_name)


def _post_tool_failure(p: Payload) -> Event:
    tool, tool_name = _tool(p)
    return draft("tool.failed", {"tool": tool, "error": _tool_error(p.get("error"))}, tool_name)


def _permission_request(p: Payload) -> Event:
    _, tool_name = _tool(p)
    prompt = get_str(p, "display") or permission_prompt(
        tool_name or "tool", get_str(get_dict(p, "tool_input"), "command"))
    # Observe-only: the vendor's own TUI owns the choice surface, so no options are claimed
    # and the answer arrives out of band (fixture PermissionRequest; AEP-0008).
    return draft("attention.requested", {"kind": "permission", "prompt": prompt, "respond_via": ["oob"]},
                 tool_name)


def _permission_result(p: Payload) -> Event:
    decision = get_str(p, "decision")
    if decision == "cancelled":
        return draft("attention.resolved", {"resolution": "dismissed"})
    if decision is None or decision == "error":
        # An internal gate failure (or no decision at all) is not an answer: never invent one.
        data = {"error": p["error"]} if get_str(p, "error") else {}
        return draft(hook_fallback(AGENT, "PermissionResult"), data,
                     _capture={"error": "redacted"} if data else None)
    answer = {"option": decision}
    if get_str(p, "feedback"):
        answer["text"] = p["feedback"]
    data = {"answer": answer, "via": "oob"}
    if get_str(p, "selected_label"):
        data["label"] = p["selected_label"]  # the vendor's label fact, metadata per the pin
    return draft("attention.answered", data)


def _subagent(type_: str, key: str) -> Callable[[Payload], Event]:
    def handler(p: Payload) -> Event:
        data = {key: p[key]} if get_str(p, key) else {}
        return draft(type_, data, get_str(p, "agent_name"), _capture={key: "redacted"} if data else None)
    return handler


def _compaction(type_: str, count_key: str) -> Callable[[Payload], Event]:
    def handler(p: Payload) -> Event:
        data: dict[str, Any] = {}
        if get_str(p, "trigger"):
            data["trigger"] = p["trigger"]
        if _int(p.get(count_key)) is not None:
            data[count_key] = p[count_key]
        return draft(type_, data)
    return handler


def _notification(p: Payload) -> Event:
    # Background-task status only: never an attention loop (no needs-input hook on this vendor).
    data = {out: p[key] for key, out in (("severity", "severity"), ("title", "message"), ("body", "body"))
            if get_str(p, key)}
    return draft("progress.status", data, get_str(p, "notification_type"),
                 _capture={"body": "redacted"} if "body" in data else None)


HOOKS: dict[str, Callable[[Payload], Event]] = {
    "SessionStart": _session_started,
    "SessionEnd": _session_ended,
    "UserPromptSubmit": _prompt_submitted,
    "Stop": _stop,
    "StopFailure": _stop_failure,
    "Interrupt": _interrupt,
    "PreToolUse": _pre_tool,
    "PostToolUse": _post_tool,
    "PostToolUseFailure": _post_tool_failure,
    "PermissionRequest": _permission_request,
    "PermissionResult": _permission_result,
    "SubagentStart": _subagent("delegation.subagent.started", "prompt"),
    "SubagentStop": _subagent("delegation.subagent.stopped", "response"),
    # The POST moment is the truthful carrier; the pre moment degrades to the fallback, not null.
    "PreCompact": _compaction(hook_fallback(AGENT, "PreCompact"), "token_count"),
    "PostCompact": _compaction("session.compacted", "estimated_token_count"),
    "Notification": _notification,
}
"""Kimi's hook surface (the 16 events of Annex A.6), one handler per hook (the hook family's table
style). The receiver registers exactly these: Kimi refuses the WHOLE config for an event name it
does not know."""


def map_hook(name: str, payload: Any) -> Event:
    """One Kimi hook call -> one draft (pure; the fixture pins it at the default capture posture)."""
    p = payload if isinstance(payload, dict) else {}
    handler = HOOKS.get(name)
    # AEP-0001 §6: the enum grows (newer releases add UserPromptQueued, TurnStarted, ...): degrade.
    d = handler(p) if handler is not None else draft(hook_fallback(AGENT, name or "unnamed"), {})
    d["session"] = get_str(p, "session_id")  # identity.session_from; SubagentStart/Stop carry none
    return d


# --- opt-in held PreToolUse gate (AEP_KIMI_CONTROL=1) ----------------------------------------------


def permission_key(payload: Any, signal: Signal) -> str:
    """The key pairing an observed PermissionRequest with its PermissionResult: the tool call id.

    Without one nothing can be paired (joins never invent): the card gets a key of its own, is
    swept before session.ended, and a result without an id is an orphan the attention book drops.
    """
    call = get_str(payload, "tool_call_id")
    return f"permission:{call}" if call else f"permission:unpaired@{signal.received_ns}"


def gate_request(payload: Any, key: str | None = None, options: list[dict[str, str]] | None = None) -> Event:
    """The answerable permission request a held PreToolUse raises (the receiver's options, respond_via control)."""
    p = payload if isinstance(payload, dict) else {}
    tool_name = get_str(p, "tool_name")
    detail = get_str(get_dict(p, "tool_input"), "command")
    d = draft("attention.requested", gate_card(tool_name or "tool", detail, options or PERMISSION_OPTIONS), tool_name,
              _attention_key=key)
    d["session"] = get_str(p, "session_id")
    return d


# --- runtime state -----------------------------------------------------------------------------------


@dataclass
class KimiState:
    """Open synthesized runs per session and the PermissionRequests still waiting for a result."""

    open_runs: OrderedDict[str, bool] = field(default_factory=OrderedDict)
    pending: OrderedDict[str, int] = field(default_factory=OrderedDict)  # tool_call_id -> received_ns
    max_sessions: int = MAX_SESSIONS
    max_pending: int = MAX_PENDING_PERMISSIONS

    def set_run(self, session: str, is_open: bool) -> None:
        if is_open:
            self.open_runs[session] = True
            self.open_runs.move_to_end(session)
            while len(self.open_runs) > self.max_sessions:
                self.open_runs.popitem(last=False)  # the least recently active session forgets its run
        else:
            self.open_runs.pop(session, None)

    def remember_request(self, call_id: str, received_ns: int) -> None:
        self.pending[call_id] = received_ns
        self.pending.move_to_end(call_id)
        while len(self.pending) > self.max_pending:
            self.pending.popitem(last=False)


def new_state() -> KimiState:
    """Fresh runtime state for one Kimi daemon."""
    return KimiState()


def map_signal(signal: Signal, state: KimiState) -> list[Event]:
    """A Kimi hook call -> drafts, updating ``state``."""
    payload = signal.payload if isinstance(signal.payload, dict) else {}
    name = get_str(payload, "hook_event_name") or signal.name or ""
    main = map_hook(name, payload)
    session = main.get("session")
    lane = session or "unknown"
    drafts: list[Event] = []
    type_ = main["type"]

    if type_ in ("tool.completed", "tool.failed") and signal.tool_closed:
        # The receiver's gate denied this call and said so (tool.denied{by: "policy"}); Kimi Code
        # 2.1.0 still reports the blocked call as a PostToolUseFailure: kept, off the tool lifecycle.
        main = draft("x.kimi-code.tool.blocked", {"tool": main["data"]["tool"]}, main.get("subject"),
                     severity="debug")
        main["session"] = session
        type_ = main["type"]

    if type_ == "run.started":
        # Kimi drain rule: a run left open (no Stop/StopFailure/Interrupt) is cancelled by the next prompt.
        main["_drain"] = "cancelled"
        state.set_run(lane, True)
    elif type_ in ("run.finished", "run.failed", "run.cancelled"):
        state.set_run(lane, False)
    elif type_ == "session.ended" and state.open_runs.pop(lane, None):
        # Same drain rule at SessionEnd: close the stale run before the session terminal.
        drafts.append({"type": "run.cancelled", "data": {}, "session": session})
    elif type_ == "attention.requested":
        call_id = get_str(payload, "tool_call_id")
        # The attention book pairs the observed card with its PermissionResult legs on this key,
        # and sweeps it before session.ended if no result ever comes.
        main["_attention_key"] = permission_key(payload, signal)
        if call_id:
            if call_id in state.pending:
                # Asked again for the same call before any result: the earlier card is superseded,
                # closed before the new one opens (the book holds one open card per key).
                drafts.append({"type": "attention.resolved", "data": {"resolution": "dismissed"},
                               "session": session, "_attention_key": main["_attention_key"]})
            state.remember_request(call_id, signal.received_ns)

    drafts.append(main)

    if name == "PreToolUse" and signal.hold is not None:
        drafts.append(gate_request(payload, signal.hold, signal.options))  # held under the receiver's key
    elif name == "PermissionResult" and type_ in ("attention.answered", "attention.resolved"):
        requested_ns = state.pending.pop(get_str(payload, "tool_call_id") or "", None)
        latency = None if requested_ns is None else max(0, (signal.received_ns - requested_ns) // 1_000_000)
        main["_attention_key"] = permission_key(payload, signal)
        if type_ == "attention.answered":
            # Runtime companions (fixture $comment, smoke-pinned): the answer closes the request, and a
            # vendor-side rejection is enforced by the runtime, not by an AEP policy.
            resolved = {"type": "attention.resolved", "data": {"resolution": "answered"}, "session": session,
                        "_attention_key": main["_attention_key"]}
            drafts.append(resolved)
            if get_str(payload, "decision") == "rejected":
                tool, tool_name = _tool(payload)
                denied = draft("tool.denied", {"tool": tool, "by": "runtime"}, tool_name)
                denied["session"] = session
                drafts.append(denied)
        else:
            resolved = main
        if latency is not None:
            resolved["data"]["latency_ms"] = latency
    return drafts
