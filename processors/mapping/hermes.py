"""Hermes Agent shell hooks (AEP-0002 Annex A.10) -> AEP drafts; pinned by ``mappings/hermes.json``.

A shell hook receives ``{hook_event_name, tool_name, tool_input, session_id, cwd, extra}``.
``session_id`` is the AEP session; ``extra.turn_id`` is a REAL per-turn id and rides verbatim as
the draft ``run``. ``on_session_end`` fires per TURN (a run terminal); ``on_session_finalize`` is
the only session end. The vendor's own approval gate and its ``clarify`` tool are observed
read-only (``respond_via: ["oob"]``): the human answers in Hermes, never from the bus. Cards and
their legs share an ``_attention_key``; the mapping processor's attention book pairs them, drops
legs whose card it never saw and sweeps open cards before ``session.ended``.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.model import Event, Signal

from .drafting import (
    PERMISSION_OPTIONS,
    digest,
    draft,
    get_dict,
    get_str,
    tool_ref,
)
from .plugin_vendors import (
    ABSENT,
    dotted_fallback,
    gate_request_draft,
    number,
    tool_completed,
    tool_failed,
    tool_requested,
)

__all__ = ["AGENT", "SCHEMA_VERSION", "APPROVAL_OPTIONS", "CLARIFY_PROMPT", "HermesState",
           "new_state", "map_hook", "map_signal", "clarify_choices",
           "clarify_fields", "approval_key", "clarify_key", "GATE_OPTIONS", "gate_request"]

log = logging.getLogger("aep.mapping.hermes")

AGENT = "hermes"

# Fixture identity: every payload's drift sentinel; another value means re-verify the shapes.
SCHEMA_VERSION = "hermes.observer.v1"

# Fixture pre_approval_request: the vendor's return contract (the choices post_approval_response
# can deliver) with its own menu wording; labels degrade to ids below the redacted ceiling.
APPROVAL_OPTIONS: tuple[dict[str, str], ...] = (
    {"id": "once", "label": "Allow once"},
    {"id": "session", "label": "Allow for this session"},
    {"id": "always", "label": "Add to permanent allowlist"},
    {"id": "deny", "label": "Deny"},
)
CLARIFY_TOOL = "clarify"
CLARIFY_PROMPT = "hermes asks a question"  # structural at every ceiling (fixture clarify pre)
MAX_CHOICES = 4  # the vendor caps offered choices at four (its UI appends "Other")
_CLI_TIMEOUT = ("The user did not provide a response within the time limit. "
                "Use your best judgement to make the choice and proceed.")
_GATEWAY_TIMEOUT = re.compile(r"^\[user did not respond within [^\]]*\]$")
_CANCELLED_PREFIX = "The user cancelled"
_UNDELIVERABLE = "[clarify prompt could not be delivered]"
_APPROVAL_HOOKS = ("pre_approval_request", "post_approval_response")
_LIMIT = 4096  # bound on every runtime table; the oldest entries go first
GATE_OPTIONS: list[dict[str, str]] = PERMISSION_OPTIONS  # the opt-in operator gate is binary: allow | deny


@dataclass
class HermesState:
    """Runtime joins: sessions seen, the lane each open approval was raised on, drift logged."""

    sessions: dict[str, None] = field(default_factory=dict)
    approval_lanes: dict[str, str | None] = field(default_factory=dict)
    drift_logged: set[str] = field(default_factory=set)


def new_state() -> HermesState:
    """A fresh, empty runtime state."""
    return HermesState()


def approval_key(extra: dict[str, Any]) -> str | None:
    """The vendor correlation of an approval card: ``session_key|pattern_key`` (fixture identity)."""
    pattern = get_str(extra, "pattern_key")
    return f"approval:{get_str(extra, 'session_key')}|{pattern}" if pattern else None


def clarify_key(call_id: str | None) -> str | None:
    """The vendor correlation of a clarify card: its ``tool_call_id``."""
    return f"clarify:{call_id}" if call_id else None


def gate_request(payload: Any, expires_at: str | None = None) -> Event:
    """The answerable Allow/Deny request a gated ``pre_tool_call`` raises (reference stack §1.10)."""
    p = payload if isinstance(payload, dict) else {}
    extra = get_dict(p, "extra")
    name = get_str(p, "tool_name")
    detail = get_str(get_dict(p, "tool_input"), "command")
    return gate_request_draft(name, detail, get_str(extra, "tool_call_id"), get_str(p, "session_id"),
                              get_str(extra, "turn_id"), expires_at)


def _trim(table: dict[Any, Any]) -> None:
    while len(table) > _LIMIT:
        table.pop(next(iter(table)))


# --- clarify: the form overlay (AEP-0006) --------------------------------------------------------


def _flatten_choice(choice: Any) -> str:
    """The vendor's entry-point normalization of one choice to its display text."""
    if choice is None:
        return ""
    if isinstance(choice, str):
        return choice.strip()
    if isinstance(choice, dict):
        for key in ("label", "description", "text", "title"):
            value = choice.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
        return ""
    if isinstance(choice, (list, tuple)):
        return " ".join(_flatten_choice(c) for c in choice).strip()
    return str(choice).strip()


def clarify_choices(raw: Any) -> list[str]:
    """Offered choices as the vendor shows them: unwrapped, trimmed, empties dropped, at most four."""
    if not isinstance(raw, list):
        return []
    return [c for c in (_flatten_choice(item) for item in raw) if c][:MAX_CHOICES]


def clarify_fields(question: Any, choices: list[str], multi: bool = False) -> list[dict[str, Any]] | None:
    """The one-field form of a clarify question: a select with Other, or a string; None without one."""
    if not isinstance(question, str) or not question.strip():
        return None  # fixture clarify question-less: no card
    label = question.strip()
    if not choices:
        return [{"id": "1", "type": "string", "label": label, "required": True}]
    spec: dict[str, Any] = {"id": "1", "type": "select", "label": label, "required": True, "other": True,
                            "choices": [{"id": str(i), "label": c} for i, c in enumerate(choices, start=1)]}
    if multi:
        spec["multi"] = True
    return [spec]


def _clarify_card(tool_input: Any, call_id: str | None, attrs: dict[str, Any]) -> list[Event]:
    args = tool_input if isinstance(tool_input, dict) else {}
    choices = clarify_choices(args.get("choices"))
    fields = clarify_fields(args.get("question"), choices, multi=bool(args.get("multi_select")) and bool(choices))
    if fields is None:
        return []
    data = {"kind": "form", "prompt": CLARIFY_PROMPT, "fields": fields, "respond_via": ["oob"]}
    return [draft("attention.requested", data, subject=call_id, severity="notice",
                  _structural={"prompt": CLARIFY_PROMPT}, _attention_key=clarify_key(call_id), **attrs)]


def _clarify_result(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def _clarify_outcome(extra: dict[str, Any], status: str | None, attrs: dict[str, Any]) -> list[Event]:
    subject = get_str(extra, "tool_call_id")
    attrs = {**attrs, "_attention_key": clarify_key(subject)}
    if status in ("blocked", "error"):
        # The ask never completed: the card closes dismissed beside the pinned denial / failure.
        return [draft("attention.resolved", {"resolution": "dismissed"}, subject=subject, **attrs)]
    result = _clarify_result(extra.get("result"))
    if result is None or "user_response" not in result:
        return []  # an unparseable result makes no lifecycle claim (joins never invent)
    response = result["user_response"]
    if isinstance(response, str):
        response = response.strip()
    if response is None or response == "" or response == []:
        return [draft("attention.resolved", {"resolution": "dismissed"}, subject=subject, **attrs)]
    if isinstance(response, str):
        if response == _CLI_TIMEOUT or _GATEWAY_TIMEOUT.match(response):
            return [draft("attention.timeout", {}, subject=subject, **attrs)]
        if response.startswith(_CANCELLED_PREFIX) or response == _UNDELIVERABLE:
            return [draft("attention.resolved", {"resolution": "dismissed"}, subject=subject, **attrs)]
    offered = [c.strip() for c in result.get("choices_offered") or [] if isinstance(c, str)]
    ids = {c: str(i) for i, c in reversed(list(enumerate(offered, start=1)))}

    def as_value(text: Any) -> Any:
        # A picked choice is its STRUCTURAL 1-based id; anything else is the Other free text.
        text = text.strip() if isinstance(text, str) else text
        return ids.get(text, text) if isinstance(text, str) else text

    if isinstance(response, list):
        value: Any = [as_value(r) for r in response if isinstance(r, str) and r.strip()]
    elif isinstance(response, str):
        value = as_value(response)
    else:
        return []
    # The card's field, rebuilt from what the vendor says it offered: the values gate needs its type.
    fields = clarify_fields(result.get("question") or "clarify", offered, multi=isinstance(response, list))
    data = {"answer": {"values": {"1": value}}, "via": "oob"}
    return [draft("attention.answered", data, subject=subject, _fields=fields, **attrs)]


# --- the hooks ------------------------------------------------------------------------------------


def _post_tool_call(p: dict[str, Any], extra: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    name = get_str(p, "tool_name")
    ref = tool_ref(name, get_str(extra, "tool_call_id"))
    status = get_str(extra, "status")
    duration = extra.get("duration_ms")
    if status == "blocked":
        # A blocking hook, no human loop: tool.denied by policy; the block message is the rule (redacted+).
        data: dict[str, Any] = {"tool": ref}
        if number(duration) is not None:
            data["duration_ms"] = duration
        data["by"] = "policy"
        hint: dict[str, str] = {}
        message = get_str(extra, "error_message")
        if message:
            data["rule"] = message
            hint["rule"] = "redacted"
        out = [draft("tool.denied", data, subject=ref["name"], _capture=hint or None, **attrs)]
    elif status == "error":
        error_type = get_str(extra, "error_type") or "tool_error"
        out = [tool_failed(ref, error_type, message=extra.get("error_message"), duration_ms=duration, **attrs)]
    else:
        result = extra["result"] if "result" in extra else ABSENT
        out = [tool_completed(ref, duration_ms=duration, result=result, **attrs)]
    if name == CLARIFY_TOOL:
        out += _clarify_outcome(extra, status, attrs)
    return out


def _approval_request(extra: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    command = get_str(extra, "command")
    prompt = f"Approval requested: {command}" if command else "Approval requested"
    data = {"kind": "permission", "prompt": prompt, "options": [dict(o) for o in APPROVAL_OPTIONS],
            "respond_via": ["oob"]}  # AEP-0008: answered in Hermes' own UI, never from the bus
    return [draft("attention.requested", data, subject=get_str(extra, "pattern_key"), severity="notice",
                  _attention_key=approval_key(extra), **attrs)]


def _approval_response(extra: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    subject = get_str(extra, "pattern_key")
    attrs = {**attrs, "_attention_key": approval_key(extra)}
    choice = get_str(extra, "choice")
    if choice == "timeout":
        return [draft("attention.timeout", {}, subject=subject, **attrs)]
    if choice is None:
        # The gate closed without a decision the vendor could name: no answer is claimed.
        return [draft("attention.resolved", {"resolution": "dismissed"}, subject=subject, **attrs)]
    return [draft("attention.answered", {"answer": {"option": choice}, "via": "oob"}, subject=subject, **attrs)]


def _session_end(extra: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    # Annex A.10, the naming trap: this hook fires PER TURN, so it closes the run, never the session.
    if extra.get("interrupted") is True:
        return [draft("run.cancelled", {"by": "user"}, **attrs)]
    if extra.get("completed") is False:
        # Deviation (unpinned): a turn that neither completed nor was interrupted ended in failure.
        return [draft("run.failed", {"reason": "incomplete"}, **attrs)]
    return [draft("run.finished", {}, **attrs)]


def _subagent(name: str, extra: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    child_id = get_str(extra, "child_session_id")
    data: dict[str, Any] = {"child": {"session": child_id} if child_id else {}}
    hint: dict[str, str] = {}
    if name == "subagent_start":
        if get_str(extra, "child_role"):
            data["role"] = extra["child_role"]
        text_key, text_field = "child_goal", "goal"
        event_type = "delegation.subagent.started"
    else:
        if get_str(extra, "child_status"):
            data["status"] = extra["child_status"]
        if number(extra.get("duration_ms")) is not None:
            data["duration_ms"] = extra["duration_ms"]
        text_key, text_field = "child_summary", "summary"
        event_type = "delegation.subagent.stopped"
    text = get_str(extra, text_key)
    if text:  # the child's goal / summary is content: redacted-gated
        data[text_field] = text
        hint[text_field] = "redacted"
    return [draft(event_type, data, subject=child_id, _capture=hint or None, **attrs)]


def _api_error(extra: dict[str, Any], attrs: dict[str, Any]) -> list[Event]:
    data: dict[str, Any] = {}
    for key in ("status_code", "retry_count"):
        if number(extra.get(key)) is not None:
            data[key] = extra[key]
    if get_str(extra, "reason"):
        data["reason"] = extra["reason"]
    hint: dict[str, str] = {}
    if "error" in extra and extra["error"] is not None:
        data["error"] = extra["error"]  # the vendor error object carries a message: redacted-gated
        hint["error"] = "redacted"
    return [draft("x.hermes.api.error", data, severity="error", _capture=hint or None, **attrs)]


def map_hook(payload: Any, hook: str | None = None, *, approval_session: str | None = None) -> list[Event]:
    """One stdin envelope -> drafts in pinned order.

    ``approval_session`` is the runtime fact approval payloads lack: their ``extra.session_key``
    joined against sessions already seen (None = the unknown lane).
    """
    p = payload if isinstance(payload, dict) else {}
    extra = get_dict(p, "extra")
    name = get_str(p, "hook_event_name") or hook or ""
    session = get_str(p, "session_id") or get_str(extra, "parent_session_id")
    if name in _APPROVAL_HOOKS and session is None:
        # Fixture identity: approval payloads carry session_id "" — never mint a lane from a key.
        session = approval_session
    attrs: dict[str, Any] = {"session": session,
                             "run": get_str(extra, "turn_id") or get_str(extra, "parent_turn_id")}
    if name == "on_session_start":
        data: dict[str, Any] = {"client": {"name": AGENT}}
        if get_str(p, "cwd"):
            data["cwd"] = p["cwd"]  # session.started.cwd is redacted-gated by its schema
        return [draft("session.started", data, **attrs)]
    if name == "pre_llm_call":
        data = {"trigger": "user"}
        message = extra.get("user_message")
        if isinstance(message, str):
            data["message_digest"] = digest(message)  # AEP-0003 §9.3: over the original text
            data["prompt"] = message
        return [draft("run.started", data, **attrs)]
    if name == "pre_tool_call":
        ref = tool_ref(get_str(p, "tool_name"), get_str(extra, "tool_call_id"))
        args = p["tool_input"] if p.get("tool_input") is not None else ABSENT
        out = [tool_requested(ref, args, **attrs)]
        if ref["name"] == CLARIFY_TOOL:
            out += _clarify_card(p.get("tool_input"), get_str(extra, "tool_call_id"), attrs)
        return out
    if name == "post_tool_call":
        return _post_tool_call(p, extra, attrs)
    if name == "pre_approval_request":
        return _approval_request(extra, attrs)
    if name == "post_approval_response":
        return _approval_response(extra, attrs)
    if name == "on_session_end":
        return _session_end(extra, attrs)
    if name in ("subagent_start", "subagent_stop"):
        return _subagent(name, extra, attrs)
    if name == "api_request_error":
        return _api_error(extra, attrs)
    if name == "on_session_finalize":
        return [draft("session.ended", {"reason": "normal"}, **attrs)]
    if name == "on_session_reset":
        # Annex A.10: fires AFTER the swap with the SUCCESSOR's id; session.ended would end it at birth.
        data = {"reason": extra["reason"]} if get_str(extra, "reason") else {}
        return [draft("x.hermes.session.reset", data, **attrs)]
    # AEP-0001 §6, fixture fallback: unregistered hooks degrade to x.hermes.* with underscores as dots.
    return [draft(dotted_fallback(AGENT, name), {}, severity="debug", **attrs)]


# --- runtime --------------------------------------------------------------------------------------


_VERSION_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _check_drift(extra: dict[str, Any], state: HermesState) -> None:
    version = extra.get("telemetry_schema_version")
    if version == SCHEMA_VERSION:
        return
    # Payload text never reaches the log verbatim: only a version-shaped token is quoted, and the
    # set of logged values is bounded (a hostile payload could mint endless "versions").
    shown = version if isinstance(version, str) and _VERSION_TOKEN.fullmatch(version) else \
        f"<{type(version).__name__}, not a version token>"
    if shown not in state.drift_logged and len(state.drift_logged) < 32:
        state.drift_logged.add(shown)
        log.warning("hermes payload telemetry_schema_version %s (pinned %r): re-verify the hook shapes",
                    shown, SCHEMA_VERSION)


def _seen(state: HermesState, *ids: str | None) -> None:
    for sid in ids:
        if sid:
            state.sessions.pop(sid, None)
            state.sessions[sid] = None
    _trim(state.sessions)


def _closed_answers(drafts: list[Event]) -> list[Event]:
    """Each observed answer followed by ``resolved{answered}`` (fixture: "the daemon ... follows")."""
    out: list[Event] = []
    for d in drafts:
        out.append(d)
        if d["type"] == "attention.answered":
            # Tagged like the answer: the attention book drops both when it never saw the card.
            out.append(draft("attention.resolved", {"resolution": "answered"}, subject=d.get("subject"),
                             session=d.get("session"), run=d.get("run"), _attention_key=d.get("_attention_key")))
    return out


def map_signal(signal: Signal, state: HermesState) -> list[Event]:
    """Map one shell-hook call with the runtime joins: session lanes and the answer that closes a card."""
    payload = signal.payload if isinstance(signal.payload, dict) else {}
    extra = get_dict(payload, "extra")
    name = get_str(payload, "hook_event_name") or signal.name
    _check_drift(extra, state)
    _seen(state, get_str(payload, "session_id"), get_str(extra, "parent_session_id"))
    if name not in _APPROVAL_HOOKS:
        if name == "on_session_finalize":  # cards left open there are the attention book's to sweep
            ended = get_str(payload, "session_id")
            for key in [k for k, lane in state.approval_lanes.items() if lane == ended]:
                del state.approval_lanes[key]
        drafts = _closed_answers(map_hook(payload, name))
        if name == "pre_tool_call" and signal.hold is not None:
            # The receiver's opt-in operator gate holds this call: its request follows the tool's.
            drafts.append(gate_request(payload, signal.expires_at))
        return drafts
    session_key = get_str(extra, "session_key")
    lane = session_key if session_key in state.sessions else None  # a gateway key never mints a lane
    key = approval_key(extra)
    if key is not None and name == "pre_approval_request":
        state.approval_lanes[key] = lane
        _trim(state.approval_lanes)
    elif key is not None and key in state.approval_lanes:
        lane = state.approval_lanes.pop(key)  # a response lands on its request's lane, whatever was seen since
    return _closed_answers(map_hook(payload, name, approval_session=lane))
