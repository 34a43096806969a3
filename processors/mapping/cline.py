"""Cline subprocess hooks (AEP-0002 Annex A.9) -> AEP drafts; pinned by ``mappings/cline.json``.

Every hook payload carries its own ``hookName`` and ``taskId`` (the AEP session). Run boundaries
are real (``agent_start``/``agent_resume`` open, ``agent_end``/``agent_abort``/``agent_error``
close) but carry no run id, so the ``runs`` processor mints it from the draft types. The typed
``iteration`` is the envelope ``step``. Observe-only: nothing maps to ``attention.*``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aep_collector.pipeline.model import Event, Signal

from .drafting import draft, get_dict, get_str, tool_ref
from .plugin_vendors import (
    ABSENT,
    dotted_fallback,
    step_of,
    tool_completed,
    tool_failed,
    tool_requested,
    usage,
)

__all__ = ["AGENT", "ClineState", "new_state", "map_hook", "map_signal"]

AGENT = "cline"


_PENDING_LIMIT = 4096  # tool_call ids waiting for their tool_result; oldest dropped beyond this


@dataclass
class ClineState:
    """Runtime joins: the tool name of each pending ``tool_call`` by (taskId, call id)."""

    tools: dict[tuple[str | None, str], str] = field(default_factory=dict)


def new_state() -> ClineState:
    """A fresh, empty runtime state."""
    return ClineState()


def _error_parts(error: Any) -> tuple[str | None, str | None]:
    """(name, message) of the typed ``error`` (``{name, message, stack}``), degrading odd shapes."""
    if isinstance(error, dict):
        name = get_str(error, "name")
        message = get_str(error, "message")
        return name, message
    if isinstance(error, str) and error:
        return None, error
    return None, None


def _agent_start(p: dict[str, Any], attrs: dict[str, Any], trigger: str) -> list[Event]:
    out: list[Event] = []
    if get_str(p, "parent_agent_id"):
        # Fixture agent_start_parented: a typed parent id opens the delegation pair BEFORE the run.
        out.append(draft("delegation.subagent.started", {}, subject=get_str(p, "agent_id"),
                         session=attrs.get("session")))
    out.append(draft("run.started", {"trigger": trigger}, **attrs))
    return out


def _terminal(p: dict[str, Any], terminal: Event) -> list[Event]:
    out = [terminal]
    if get_str(p, "parent_agent_id"):
        # Fixture agent_end_parented: the run terminal first, then the delegation close (no step).
        out.append(draft("delegation.subagent.stopped", {}, subject=get_str(p, "agent_id"),
                         session=terminal.get("session")))
    return out


def _agent_end(p: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    data: dict[str, Any] = {}
    summary = get_str(get_dict(p, "turn"), "outputText")
    if summary:
        data["summary"] = summary  # run.finished.summary is redacted-gated by its schema
    return _terminal(p, draft("run.finished", data, **attrs))


def _agent_abort(p: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    # Annex A.9: abort is a cancellation (not a failure); the free-text reason is redacted-gated.
    data: dict[str, Any] = {"by": "user"}
    reason = get_str(p, "reason")
    if reason:
        data["reason"] = reason
    return _terminal(p, draft("run.cancelled", data, **attrs))


def _agent_error(p: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    name, message = _error_parts(p.get("error"))
    error: dict[str, Any] = {"type": name or "error"}
    if message:
        error["message"] = message
    return _terminal(p, draft("run.failed", {"reason": name or "error", "error": error}, **attrs))


def _tool_call(p: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    call = get_dict(p, "tool_call")
    legacy = get_dict(p, "preToolUse")  # the older shape the SDK still sends beside the typed record
    name = get_str(call, "name") or get_str(legacy, "toolName")
    args = call["input"] if "input" in call else legacy.get("parameters", ABSENT)
    return [tool_requested(tool_ref(name, get_str(call, "id")), args, **attrs)]


def _tool_result(p: dict[str, Any], attrs: dict[str, Any], tool_name: str | None) -> list[Event]:
    record = get_dict(p, "tool_result")
    legacy = get_dict(p, "postToolUse")
    name = get_str(record, "name") or get_str(legacy, "toolName") or tool_name
    ref = tool_ref(name, get_str(record, "id"))
    duration = record.get("durationMs", legacy.get("executionTimeMs"))
    error = record.get("error")
    if error is None and record == {} and legacy.get("success") is False:
        error = legacy.get("result") or "tool error"
    if error:
        # The typed ToolCallRecord.error splits honestly; Cline names no error class (§2.7 generic).
        _, message = _error_parts(error)
        return [tool_failed(ref, "tool_error", message=message, duration_ms=duration, **attrs)]
    result = record["output"] if "output" in record else legacy.get("result", ABSENT)
    return [tool_completed(ref, duration_ms=duration, result=result, **attrs)]


def _prompt_submit(p: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    # message.user.submitted is reserved (AEP-0002 §4.3): the fact rides vendor-scoped at debug.
    data: dict[str, Any] = {}
    hint: dict[str, str] = {}
    prompt = get_str(get_dict(p, "userPromptSubmit"), "prompt")
    if prompt:
        data["prompt"] = prompt
        hint["prompt"] = "redacted"
    return [draft("x.cline.prompt.submitted", data, severity="debug", _capture=hint or None, **attrs)]


def _pre_compact(p: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    # The vendor exposes only the PRE moment (the Gemini PreCompress precedent, fixture pre_compact).
    info = get_dict(p, "preCompact")
    data: dict[str, Any] = {}
    strategy = get_str(info, "compactionStrategy")
    if strategy:
        data["strategy"] = strategy
    data.update(usage(info.get("tokensIn"), info.get("tokensOut")))
    hint: dict[str, str] = {}
    for key, field_name in (("contextJsonPath", "context_json_path"), ("contextRawPath", "context_raw_path")):
        path = get_str(info, key)
        if path:  # machine paths into a context dump are content-bearing: redacted+
            data[field_name] = path
            hint[field_name] = "redacted"
    return [draft("session.compacted", data, _capture=hint or None, **attrs)]


def _session_shutdown(p: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    # The session.ended reason enum is closed: a vendor free-text reason collapses to normal.
    data: dict[str, Any] = {"reason": "normal"}
    hint: dict[str, str] = {}
    reason = get_str(p, "reason")
    if reason:
        data["vendor_reason"] = reason
        hint["vendor_reason"] = "redacted"
    return [draft("session.ended", data, _capture=hint or None, **attrs)]


Handler = Callable[[dict[str, Any], dict[str, Any]], list[Event]]
"""(payload, envelope attrs) -> the hook's drafts in pinned order."""

_HOOKS: dict[str, Handler] = {
    "agent_start": partial(_agent_start, trigger="user"),
    "agent_resume": partial(_agent_start, trigger="resume"),
    "agent_end": _agent_end,
    "agent_abort": _agent_abort,
    "agent_error": _agent_error,
    "tool_call": _tool_call,
    "prompt_submit": _prompt_submit,
    "pre_compact": _pre_compact,
    "session_shutdown": _session_shutdown,
}


def map_hook(payload: Any, hook: str | None = None, *, tool_name: str | None = None) -> list[Event]:
    """One hook payload -> drafts in pinned order; ``tool_name`` fills a ``tool_result`` without one."""
    p = payload if isinstance(payload, dict) else {}
    name = get_str(p, "hookName") or hook or ""
    session = get_str(p, "taskId")
    attrs: dict[str, Any] = {"session": session, "step": step_of(p.get("iteration"))}
    if get_str(p, "parent_agent_id"):
        # A subagent loops inside its parent's task (same session): its run rides its own lane so the
        # runs processor keeps the parent's run open (aep_collector.processors.runs `_lane`). The delegation pair
        # is the parent's event and is built without it.
        attrs["_lane"] = get_str(p, "agent_id") or "subagent"
    if name == "tool_result":
        return _tool_result(p, attrs, tool_name)  # the one handler that needs the runtime join
    handler = _HOOKS.get(name)
    if handler is None:
        # AEP-0001 §6, fixture fallback: unknown hooks degrade to x.cline.* with underscores as dots.
        return [draft(dotted_fallback(AGENT, name), {}, severity="debug", **attrs)]
    return handler(p, attrs)


def map_signal(signal: Signal, state: ClineState) -> list[Event]:
    """Map one hook call, remembering tool names so a thin ``tool_result`` still names its tool."""
    payload = signal.payload if isinstance(signal.payload, dict) else {}
    hook = get_str(payload, "hookName") or signal.name
    session = get_str(payload, "taskId")
    tool_name: str | None = None
    if hook == "tool_call":
        call = get_dict(payload, "tool_call")
        call_id, name = get_str(call, "id"), get_str(call, "name")
        if call_id and name:
            state.tools[(session, call_id)] = name
            while len(state.tools) > _PENDING_LIMIT:
                state.tools.pop(next(iter(state.tools)))
    elif hook == "tool_result":
        call_id = get_str(get_dict(payload, "tool_result"), "id")
        if call_id:
            tool_name = state.tools.pop((session, call_id), None)
    elif hook == "session_shutdown":
        for key in [k for k in state.tools if k[0] == session]:
            del state.tools[key]
    return map_hook(payload, hook, tool_name=tool_name)
