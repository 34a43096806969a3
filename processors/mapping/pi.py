"""pi extension-bus events (AEP-0002 Annex A.12) -> AEP drafts; pinned by ``mappings/pi.json``.

The extension forwards every moment as ``{session: {id, file, cwd}, event: {type, ...}}``, the
session read in-process from ``ctx.sessionManager``. One run per AGENT LOOP (``agent_start`` ->
``agent_end``, typed by the last assistant ``stopReason``); ``turnIndex`` is the envelope step.
Observe-only by non-subscription; stream updates are suppressed unless the deltas opt-in is on
(the receiver's ``deltas`` config rides on every signal as ``Signal.deltas``; ``AEP_PI_DELTAS`` is
only the default of a state built without one). With the receiver's opt-in gate, the extension
also forwards ``tool_call``; a held one (``Signal.hold`` set) becomes the gate's Allow/Deny request.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.model import Event, Signal

from .drafting import (
    PERMISSION_OPTIONS,
    digest,
    draft,
    get_dict,
    get_str,
    snake_case,
    tool_ref,
)
from .hook_vendors import Payload
from .plugin_vendors import (
    ABSENT,
    gate_request_draft,
    step_of,
    tool_completed,
    tool_failed,
    tool_requested,
    usage,
)

__all__ = ["AGENT", "DELTAS_ENV", "GATE_OPTIONS", "PiState", "new_state", "map_event",
           "map_signal", "message_text", "gate_request"]

AGENT = "pi"


DELTAS_ENV = "AEP_PI_DELTAS"  # the operator opt-in for stream updates (default off)
GATE_OPTIONS: list[dict[str, str]] = PERMISSION_OPTIONS  # the opt-in gate is binary: allow | deny
_COMPLETIONS = ("stop", "length", "toolUse")  # bounded terminations are completions (Annex A.12)


def gate_request(payload: Any, expires_at: str | None = None) -> Event:
    """The answerable Allow/Deny request a held ``tool_call`` raises (extensions.md "tool_call (can block)")."""
    p = payload if isinstance(payload, dict) else {}
    event = get_dict(p, "event")
    name = get_str(event, "toolName")
    detail = get_str(get_dict(event, "input"), "command")
    return gate_request_draft(name, detail, get_str(event, "toolCallId"), get_str(get_dict(p, "session"), "id"),
                              None, expires_at)


@dataclass
class PiState:
    """Runtime: the deltas opt-in and the sessions whose agent loop (run) is open."""

    deltas: bool = False
    open_loops: set[str | None] = field(default_factory=set)


def new_state(deltas: bool | None = None) -> PiState:
    """A fresh state; ``deltas`` None reads the ``AEP_PI_DELTAS`` opt-in (``1``/``true``)."""
    if deltas is None:
        deltas = os.environ.get(DELTAS_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return PiState(deltas=deltas)


def message_text(content: Any) -> str | None:
    """A message's text: a plain string as is, a content-part array as its joined ``text`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"
                 and isinstance(p.get("text"), str)]
        return "".join(parts)
    return None


def _content(message: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``content_digest`` over the text (never over the part array, fixture pi) plus the text itself."""
    text = message_text(message.get("content"))
    if text is None:
        return {}, {}
    return {"content_digest": digest(text), "content": text}, {"content": "redacted"}


def _message_usage(message: dict[str, Any]) -> dict[str, Any]:
    counts = get_dict(message, "usage")
    return usage(counts.get("input"), counts.get("output"))


def _last_assistant(messages: Any) -> dict[str, Any] | None:
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            return message
    return None


def _agent_end(event: Payload, _info: Payload, _deltas: bool) -> Event:
    last = _last_assistant(event.get("messages"))
    if last is None:
        return draft("run.finished", {})  # fixture agent_end_empty: a bare completion
    reason = get_str(last, "stopReason")
    data: dict[str, Any] = {"stop_reason": reason} if reason else {}
    if reason == "error":
        error: dict[str, Any] = {"type": "error"}  # the schema requires error; pi names no class
        if get_str(last, "errorMessage"):
            error["message"] = last["errorMessage"]
        return draft("run.failed", {"reason": "error", **data, "error": error})
    if reason == "aborted":
        # Esc and programmatic aborts look alike on this bus: no `by` claim (fixture agent_end_aborted).
        return draft("run.cancelled", data)
    data.update(_message_usage(last))
    summary = message_text(last.get("content"))
    if summary:
        data["summary"] = summary  # run.finished.summary is redacted-gated by its schema
    return draft("run.finished", data)


def _tool(event: dict[str, Any]) -> dict[str, str]:
    return tool_ref(get_str(event, "toolName"), get_str(event, "toolCallId"))


_Handler = Callable[[Payload, Payload, bool], "Event | None"]
"""A bus moment's handler: (event, session info, deltas opt-in) -> a draft, or None (a pinned null)."""


def _session_start(event: Payload, info: Payload, _deltas: bool) -> Event:
    data: dict[str, Any] = {"client": {"name": AGENT}}
    hint: dict[str, str] = {}
    if get_str(event, "reason"):
        data["reason"] = event["reason"]
    if get_str(info, "cwd"):
        data["cwd"] = info["cwd"]  # session.started.cwd is redacted-gated by its schema
    for key, name in (("file", "session_file"), ("previousSessionFile", "previous_session_file")):
        path = get_str(info if key == "file" else event, key)
        if path:  # machine paths: redacted+, no digest
            data[name] = path
            hint[name] = "redacted"
    return draft("session.started", data, _capture=hint or None)


def _session_shutdown(event: Payload, _info: Payload, _deltas: bool) -> Event:
    # Every vendor teardown reason is orderly: schema reason normal, the vendor token alongside.
    data = {"reason": "normal"}
    if get_str(event, "reason"):
        data["vendor_reason"] = event["reason"]
    return draft("session.ended", data)


def _session_compact(event: Payload, _info: Payload, _deltas: bool) -> Event:
    data: dict[str, Any] = {}
    if get_str(event, "reason"):
        data["reason"] = event["reason"]
    if isinstance(event.get("willRetry"), bool):
        data["will_retry"] = event["willRetry"]
    return draft("session.compacted", data)  # the vendor's post moment, emitted once


def _agent_start(_event: Payload, _info: Payload, _deltas: bool) -> Event:
    return draft("run.started", {})  # no trigger: the bus does not say who started it


def _turn(type_: str) -> _Handler:
    def handler(event: Payload, _info: Payload, _deltas: bool) -> Event:
        # The vendor's own turnIndex on both boundaries: the envelope step, zero synthesis.
        return draft(type_, {}, step=step_of(event.get("turnIndex")))
    return handler


def _message_start(event: Payload, _info: Payload, _deltas: bool) -> Event | None:
    message = get_dict(event, "message")
    if message.get("role") != "user":
        return None  # the assistant boundary is taken once, at its end
    data, hint = _content(message)
    return draft("x.pi.message.submitted", data, severity="debug", _capture=hint or None)


def _message_end(event: Payload, _info: Payload, _deltas: bool) -> Event | None:
    message = get_dict(event, "message")
    if message.get("role") != "assistant":
        return None  # the user boundary was taken at its start; tool results belong to the trio
    data = {"stop_reason": message["stopReason"]} if get_str(message, "stopReason") else {}
    data.update(_message_usage(message))
    content, hint = _content(message)
    data.update(content)
    return draft("x.pi.message.replied", data, severity="debug", _capture=hint or None)


def _message_update(event: Payload, _info: Payload, deltas: bool) -> Event | None:
    if not deltas:
        return None  # token streaming is stream-shaped: nothing at the default posture
    update = get_dict(event, "assistantMessageEvent")
    data = {"kind": update["type"]} if get_str(update, "type") else {}
    hint = {}
    if isinstance(update.get("delta"), str):
        data["delta"] = update["delta"]
        hint["delta"] = "redacted"
    return draft("x.pi.message.delta", data, severity="debug", _capture=hint or None)


def _tool_start(event: Payload, _info: Payload, _deltas: bool) -> Event:
    return tool_requested(_tool(event), event["args"] if "args" in event else ABSENT)


def _tool_update(event: Payload, _info: Payload, deltas: bool) -> Event | None:
    if not deltas:
        return None
    ref = _tool(event)
    data: dict[str, Any] = {"tool": ref}
    hint = {}
    if "partialResult" in event:
        data["partial_digest"] = digest(event["partialResult"])
        data["partial"] = event["partialResult"]
        hint["partial"] = "redacted"  # a partial result is content (fixture: whole results redacted+)
    return draft("x.pi.tool.update", data, subject=ref["name"], severity="debug", _capture=hint or None)


def _tool_end(event: Payload, _info: Payload, _deltas: bool) -> Event:
    ref = _tool(event)
    if event.get("isError") is True:
        # The vendor's own typed isError flag, never inferred; the message is redacted-gated.
        message = message_text(get_dict(event, "result").get("content"))
        return tool_failed(ref, "error", message=message)
    return tool_completed(ref, result=event.get("result", ABSENT))


def _renamed(type_: str, *fields: tuple[str, str], redacted: bool = False) -> _Handler:
    """A bus moment kept under ``x.pi.*`` at debug, with its string ``fields`` (vendor key, data key)."""
    def handler(event: Payload, _info: Payload, _deltas: bool) -> Event:
        data = {out: value for key, out in fields if (value := _field(event, key))}
        hint = {out: "redacted" for out in data} if redacted else {}
        return draft(type_, data, severity="debug", _capture=hint or None)
    return handler


def _field(event: Payload, path: str) -> str | None:
    """A string at a dotted ``path`` of the event (``model.id``), else None."""
    *parents, key = path.split(".")
    obj = event
    for parent in parents:
        obj = get_dict(obj, parent)
    return get_str(obj, key)


EVENTS: dict[str, _Handler] = {
    "session_start": _session_start,
    "session_shutdown": _session_shutdown,
    "session_compact": _session_compact,
    "agent_start": _agent_start,
    "agent_end": _agent_end,
    "turn_start": _turn("run.step.started"),
    "turn_end": _turn("run.step.finished"),
    "message_start": _message_start,
    "message_end": _message_end,
    "message_update": _message_update,
    "tool_execution_start": _tool_start,
    "tool_execution_update": _tool_update,
    "tool_execution_end": _tool_end,
    "agent_settled": _renamed("x.pi.agent.settled"),
    "session_info_changed": _renamed("x.pi.session.info", ("name", "name"), redacted=True),  # user content
    "session_tree": _renamed("x.pi.session.tree"),
    "model_select": _renamed("x.pi.model.select", ("source", "source"), ("model.id", "model")),
    "thinking_level_select": _renamed("x.pi.thinking.select", ("level", "level")),
}
"""pi's extension bus, one handler per moment (the hook family's table style)."""


def map_event(payload: Any, deltas: bool = False, *, event_type: str | None = None) -> Event | None:
    """One forwarded moment -> a draft, or None for the deliberate nulls (pinned ``expected``).

    ``deltas`` is the stream-update opt-in (pinned ``deltas_expected``); ``event_type`` names the
    moment when the forwarded ``event`` lacks its own ``type``.
    """
    p = payload if isinstance(payload, dict) else {}
    event = get_dict(p, "event")
    info = get_dict(p, "session")
    kind = get_str(event, "type") or event_type or ""
    handler = EVENTS.get(kind)
    # AEP-0001 §6, fixture fallback: future bus members land under x.pi.event.* (two segments deep).
    d = handler(event, info, deltas) if handler is not None else \
        draft(f"x.pi.event.{snake_case(kind)}", {}, severity="debug")
    session = get_str(info, "id")
    if d is not None and session is not None:
        d["session"] = session
    return d


def map_signal(signal: Signal, state: PiState) -> list[Event]:
    """Map one moment with the agent-loop rule: duplicate opens keep the live run; orphan ends drop."""
    payload = signal.payload if isinstance(signal.payload, dict) else {}
    kind = get_str(get_dict(payload, "event"), "type") or signal.name
    session = get_str(get_dict(payload, "session"), "id")
    if kind == "tool_call":
        # Only the opt-in gate forwards it; tool_execution_start already said tool.requested.
        if signal.hold is None:
            return []
        return [gate_request(payload, signal.expires_at)]
    deltas = signal.deltas
    if deltas is None:
        deltas = state.deltas
    if kind == "agent_start":
        if session in state.open_loops:
            return []  # Annex A.12 identity: a duplicate open keeps the live run
        state.open_loops.add(session)
    elif kind == "agent_end":
        if session not in state.open_loops:
            return []  # fixture agent_end_empty: the daemon drops an end when no run is open
        state.open_loops.discard(session)
    elif kind == "session_shutdown" and session in state.open_loops:
        state.open_loops.discard(session)
        # pi quit with its agent loop open (no agent_end came): the run ends here, before the session.
        cancelled = draft("run.cancelled", {"by": "shutdown"}, session=session)
        out = map_event(payload, deltas, event_type=signal.name)
        return [cancelled] if out is None else [cancelled, out]
    out = map_event(payload, deltas, event_type=signal.name)
    return [] if out is None else [out]
