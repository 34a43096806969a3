"""What the Claude-Code-shaped hook vendors share: dispatch, tool refs, digests, permission cards.

Named after the receivers it serves (``aep_collector.receivers.hook_vendors``, plus Claude Code).

Claude Code, Codex, Qwen Code, Gemini CLI and VS Code agent hooks all POST (or pipe) one JSON
object per hook firing, named by ``hook_event_name``, with snake_case fields (``session_id``,
``tool_name``, ``tool_use_id``, ``tool_input``, ``tool_response``). Each vendor module is a table
``{hook name: handler}`` built from the pieces below; anything not in the table degrades to the
mechanical fallback (AEP-0001 §6). Drafts carry full content; the capture processor gates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from aep_collector.pipeline.control import card_key as control_card_key
from aep_collector.pipeline.model import Event, Signal
from aep_collector.processors.mapping.drafting import (
    PERMISSION_OPTIONS,
    digest,
    draft,
    get_str,
    hook_fallback,
    json_copy,
    permission_prompt,
)

Payload = dict[str, Any]
Handler = Callable[[Payload, Any], "Event | list[Event] | None"]
"""A hook handler: (payload, mapping state) -> one draft, several, or None (deliberately nothing)."""

# Redacted-minimum free text a hook payload carries outside the schema's annotated fields.
REDACTED = "redacted"

# Claude Code dedupe convention (Qwen fixture `Notification_permission`): these notification
# subtypes duplicate a first-class hook (PermissionRequest, Elicitation) and are suppressed.
DUPLICATE_NOTIFICATIONS: frozenset[str] = frozenset({"permission_prompt", "elicitation_dialog"})

# Tool-input keys that name what a permission is for, most specific first.
_DETAIL_KEYS = ("command", "file_path", "path", "url", "pattern", "query")


def payload_of(signal: Signal) -> Payload:
    """The signal's payload, or an empty dict when the vendor sent something that is not an object."""
    return signal.payload if isinstance(signal.payload, dict) else {}


def hook_name(signal: Signal) -> str:
    """The hook the payload names itself (``hook_event_name``), else the name the receiver saw."""
    return get_str(payload_of(signal), "hook_event_name") or signal.name or "unnamed"


def hook_call(signal: Signal) -> tuple[str, Payload]:
    """(``hook_name``, ``payload_of``) of a signal in one step (the per-event dispatch)."""
    payload = signal.payload if isinstance(signal.payload, dict) else {}
    name = payload.get("hook_event_name")
    if isinstance(name, str) and name:
        return name, payload
    return signal.name or "unnamed", payload


def session_of(payload: Payload) -> str | None:
    """``session_id`` when it is a non-empty string; None sends the draft to the ``unknown`` lane."""
    return get_str(payload, "session_id")


def map_table(
    agent: str,
    table: Mapping[str, Handler],
    name: str,
    payload: Any,
    state: Any = None,
    run: str | None = None,
    keyed: Signal | None = None,
) -> list[Event]:
    """Dispatch one hook through a vendor table; unknown hooks take the fallback, never a core type.

    With ``keyed`` (the signal mapped), its permission cards are tagged as ``key_permissions``
    tags them, in the same walk of the drafts.
    """
    body: Payload = payload if isinstance(payload, dict) else {}
    handler = table.get(name)
    out = handler(body, state) if handler is not None else fallback(agent, name)
    if out is None:
        return []
    drafts = [out] if isinstance(out, dict) else list(out)
    session = body.get("session_id")
    if not (isinstance(session, str) and session):
        session = None  # as session_of: only a non-empty string names a session
    for d in drafts:
        etype = d["type"]
        if not etype.startswith("agent."):  # AEP-0001: agent-scoped events carry no session, run or step
            if "session" not in d:
                d["session"] = session
            if run is not None and "run" not in d:
                d["run"] = run
        if keyed is not None and etype == "attention.requested" and d["data"].get("kind") == "permission":
            d["_attention_key"] = card_key(keyed)
    return drafts


def no_state() -> None:
    """``new_state`` of a stateless vendor: the vendor names every run and tool call itself."""
    return None


def table_mapping(agent: str, table: Mapping[str, Handler]) -> tuple[
        Callable[[str, Any], list[Event]], Callable[[Signal, Any], list[Event]]]:
    """``map_hook`` and ``map_signal`` of a vendor whose hooks ``table`` maps in full, stateless."""

    def map_hook(name: str, payload: Any) -> list[Event]:
        return map_table(agent, table, name, payload)

    def map_signal(signal: Signal, state: None) -> list[Event]:
        name, payload = hook_call(signal)
        return map_table(agent, table, name, payload)  # map_hook without the extra call

    return map_hook, map_signal


def session_start_handler(agent: str) -> Handler:
    """The SessionStart table entry of ``agent`` (``session_started`` under its client name)."""
    return lambda payload, _state: session_started(agent, payload)


def fallback(agent: str, name: str) -> Event:
    """AEP-0001 §6: an unmapped hook lands at ``x.{agent}.session.{snake}`` with ``{}`` data."""
    return draft(hook_fallback(agent, name), {})


def merge_capture(d: Event, **levels: str) -> Event:
    """Mark vendor free-text fields of ``d`` with their capture minimum (only those present)."""
    data = d["data"]
    # A plain key (every caller's) is one membership test; only a dotted path takes the walk.
    plain = isinstance(data, dict)
    marks = {path: level for path, level in levels.items()
             if (path in data if plain and "." not in path else _has_path(data, path))}
    if marks:
        d.setdefault("_capture", {}).update(marks)
    return d


def _has_path(data: Payload, path: str) -> bool:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# --- tools ---------------------------------------------------------------------------------


def tool_of(payload: Payload, call_ids: bool = True) -> dict[str, str]:
    """``tool_ref`` from ``tool_name`` / ``tool_use_id`` (Gemini passes call_ids=False: it has none)."""
    # ``tool_ref(get_str(...), get_str(...))`` inlined: this runs on every tool hook.
    name = payload.get("tool_name")
    ref = {"name": name if isinstance(name, str) and name else "unknown"}
    if call_ids:
        call_id = payload.get("tool_use_id")
        if isinstance(call_id, str) and call_id:
            ref["call_id"] = call_id
    return ref


def tool_requested(payload: Payload, _state: Any = None, *, call_ids: bool = True) -> Event:
    """PreToolUse-style hook -> ``tool.requested`` with ``args_digest`` over the original input."""
    tool = tool_of(payload, call_ids)
    data: Payload = {"tool": tool}
    if payload.get("tool_input") is not None:
        raw = payload["tool_input"]
        data["args_digest"] = digest(raw)  # AEP-0003 §9.3: over the original, before redaction
        if isinstance(raw, dict):  # the schema's `args` is an object; a bare string is digest-only
            data["args"] = json_copy(raw)
    name = tool["name"]
    if name.__class__ is not str:  # a str subclass: ``draft`` makes the subject a str
        return draft("tool.requested", data, name)
    return {"type": "tool.requested", "data": data, "subject": name}  # ``draft``'s, without the call


def tool_completed(payload: Payload, _state: Any = None, *, call_ids: bool = True) -> Event:
    """PostToolUse-style hook -> ``tool.completed`` with ``result_digest`` over the original response."""
    tool = tool_of(payload, call_ids)
    data: Payload = {"tool": tool}
    if payload.get("tool_response") is not None:
        raw = payload["tool_response"]
        data["result_digest"] = digest(raw)
        if isinstance(raw, (dict, str)):  # the schema's `result` is an object or a string
            data["result"] = json_copy(raw)
    _duration(payload, data)
    name = tool["name"]
    if name.__class__ is not str:  # a str subclass: ``draft`` makes the subject a str
        return draft("tool.completed", data, name)
    return {"type": "tool.completed", "data": data, "subject": name}  # ``draft``'s, without the call


def _duration(payload: Payload, data: Payload) -> None:
    """Keep the vendor's ``duration_ms`` (Claude Code 2.1 and Qwen 0.24 send it on PostToolUse)."""
    ms = payload.get("duration_ms")
    if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0:
        data["duration_ms"] = int(ms)


def tool_failed(payload: Payload, error_type: str, message: Any, *, call_ids: bool = True) -> Event:
    """A failed tool call: ``error.type`` is structural, ``error.message`` is redacted-gated by schema."""
    tool = tool_of(payload, call_ids)
    error: Payload = {"type": error_type}
    if isinstance(message, str) and message:
        error["message"] = message
    data: Payload = {"tool": tool, "error": error}
    _duration(payload, data)
    return draft("tool.failed", data, tool["name"])


def tool_use_failure(payload: Payload, _state: Any = None) -> Event:
    """PostToolUseFailure -> ``tool.failed``; ``is_interrupt: true`` synthesizes type ``interrupt``."""
    # Qwen fixture PostToolUseFailure: no vendor taxonomy, so the generic `tool_error` (digest §2.7).
    kind = "interrupt" if payload.get("is_interrupt") is True else "tool_error"
    return tool_failed(payload, kind, payload.get("error"))


def tool_denied(payload: Payload, _state: Any = None) -> Event:
    """PermissionDenied -> ``tool.denied``; ``by`` from the payload when it is a schema value, else policy."""
    tool = tool_of(payload)
    by = get_str(payload, "by")
    data: Payload = {"tool": tool, "by": by if by in ("policy", "user_setting", "runtime") else "policy"}
    rule = get_str(payload, "rule")
    if rule:
        data["rule"] = rule
    reason = get_str(payload, "reason")
    if reason:  # the classifier's explanation is model text
        data["reason"] = reason
    return merge_capture(draft("tool.denied", data, tool["name"]), reason=REDACTED)


# --- permission ----------------------------------------------------------------------------


def permission_detail(tool_input: Any) -> tuple[str | None, str | None]:
    """(what the permission is for, the agent's description of it) from a tool input."""
    if not isinstance(tool_input, dict):
        return None, None
    detail = next((v for k in _DETAIL_KEYS if (v := get_str(tool_input, k))), None)
    return detail, get_str(tool_input, "description")


def permission_request(payload: Payload, _state: Any = None) -> Event:
    """PermissionRequest -> ``attention.requested`` kind permission, answerable over control."""
    tool = get_str(payload, "tool_name") or "unknown"
    detail, description = permission_detail(payload.get("tool_input"))
    data = {
        # Taxonomy digest §2.4: the real text at the redacted attention ceiling; the capture
        # processor synthesizes "{agent} requests permission: {tool}" below it (AEP-0003 §9.2).
        "kind": "permission",
        "prompt": permission_prompt(tool, detail, description),
        "options": [dict(o) for o in PERMISSION_OPTIONS],
        "respond_via": ["control"],
    }
    return draft("attention.requested", data, tool)


def card_key(signal: Signal) -> str:
    """The attention key of the permission card ``signal`` raises (``pipeline.control.card_key``;
    the receiver holding the card computes the same)."""
    payload = payload_of(signal)
    return control_card_key(get_str(payload, "tool_name"), payload.get("tool_input"), signal.received_ns)


def key_permissions(drafts: list[Event], signal: Signal) -> list[Event]:
    """Tag the permission cards among ``drafts`` with ``card_key``."""
    for d in drafts:
        if d["type"] == "attention.requested" and d["data"].get("kind") == "permission":
            d["_attention_key"] = card_key(signal)
    return drafts


# --- session and run -----------------------------------------------------------------------


_SESSION_KEYS = (("source", "trigger"), ("model", "gen_ai.request.model"), ("agent_type", "agent_type"),
                 ("permission_mode", "permission_mode"), ("cwd", "cwd"))


def session_started(agent: str, payload: Payload) -> Event:
    """SessionStart -> ``session.started`` (client object, trigger, model; cwd is redacted-gated)."""
    data: Payload = {"client": {"name": agent}}
    for key, out in _SESSION_KEYS:
        value = payload.get(key)
        if isinstance(value, str) and value:
            data[out] = value
    return draft("session.started", data)


def session_ended(payload: Payload, _state: Any = None) -> Event:
    """SessionEnd -> ``session.ended``; every vendor reason collapses to ``normal`` (closed enum)."""
    return draft("session.ended", {"reason": "normal"})


def run_started(payload: Payload, _state: Any = None) -> Event:
    """UserPromptSubmit -> ``run.started`` with the prompt (redacted-gated by schema)."""
    data: Payload = {"trigger": "user"}
    prompt = get_str(payload, "prompt")
    if prompt:
        data["prompt"] = prompt
    return draft("run.started", data)


def run_finished(payload: Payload, _state: Any = None) -> Event:
    """Stop -> ``run.finished`` (Qwen's ``input_tokens`` as flat usage; reply text is not captured)."""
    data: Payload = {}
    tokens = payload.get("input_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        data["gen_ai.usage.input_tokens"] = tokens
    return draft("run.finished", data)


def run_failed(payload: Payload, _state: Any = None) -> Event:
    """StopFailure -> ``run.failed`` with the vendor's error token as the machine ``reason``."""
    data: Payload = {"reason": get_str(payload, "error") or "unknown"}
    details = get_str(payload, "error_details")
    if details:
        data["error_details"] = details
    return merge_capture(draft("run.failed", data), error_details=REDACTED)


# --- delegation, compaction, notification ----------------------------------------------------


def subagent(type_: str, payload: Payload) -> Event:
    """SubagentStart/Stop -> ``delegation.subagent.*``, subject the vendor's agent id."""
    data: Payload = {}
    agent_type = get_str(payload, "agent_type")
    if agent_type:
        data["agent_type"] = agent_type
    return draft(type_, data, get_str(payload, "agent_id"))


def subagent_started(payload: Payload, _state: Any = None) -> Event:
    """SubagentStart -> ``delegation.subagent.started``."""
    return subagent("delegation.subagent.started", payload)


def subagent_stopped(payload: Payload, _state: Any = None) -> Event:
    """SubagentStop -> ``delegation.subagent.stopped`` (``stop_hook_active`` is loop plumbing, dropped)."""
    return subagent("delegation.subagent.stopped", payload)


def compacted(payload: Payload, _state: Any = None) -> Event:
    """The one compaction moment -> ``session.compacted{trigger}``; summaries are redacted-gated."""
    data: Payload = {}
    trigger = get_str(payload, "trigger") or get_str(payload, "compact_trigger")
    if trigger:
        data["trigger"] = trigger
    for key in ("compact_summary", "custom_instructions"):
        value = get_str(payload, key)
        if value:
            data[key] = value
    return merge_capture(draft("session.compacted", data),
                         compact_summary=REDACTED, custom_instructions=REDACTED)


def nothing(_payload: Payload, _state: Any = None) -> None:
    """A hook deliberately mapped to no event."""
    return None


def notification(payload: Payload, _state: Any = None, *,
                 suppress: frozenset[str] = frozenset()) -> Event | None:
    """Notification -> ``progress.status`` (subject the subtype), or None for a suppressed subtype."""
    kind = get_str(payload, "notification_type")
    if kind in suppress:
        return None
    data: Payload = {}
    for key in ("message", "title"):
        value = get_str(payload, key)
        if value:
            data[key] = value  # progress.status.message is redacted by schema; title is vendor text
    return merge_capture(draft("progress.status", data, kind), title=REDACTED)


LIFECYCLE_HOOKS: dict[str, Handler] = {
    "SessionEnd": session_ended,
    "UserPromptSubmit": run_started,
    "Stop": run_finished,
    "StopFailure": run_failed,
    "PreToolUse": tool_requested,
    "PostToolUse": tool_completed,
    "PostToolUseFailure": tool_use_failure,
}
"""The session, run and tool hooks Claude Code and Qwen Code map alike (after their own SessionStart)."""
