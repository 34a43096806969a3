"""AEP 0.1 event validation: the envelope, registered payloads and the stream-level rules.

Three layers, each usable alone:

- ``envelope_errors(event)``: the envelope schema (AEP-0001 §5–§8) written as code, with ``time``
  and ``source`` format checks that a JSON Schema library would silently skip.
- ``payload_errors(event)``: the registered payload shapes (AEP-0002 §5), for ``aep validate``
  style checks; ingest only needs the envelope (AEP-0003 §3.2).
- ``StreamValidator``: rules over several events in emission order (AEP-0001 §7, AEP-0002 §2/§7,
  AEP-0004 §3), with per-session state keyed by ``(source, session)`` (AEP-0001 §5.2).

The patterns here are deliberately written independently of ``aep_collector.pipeline.envelope``: the validator
is what checks the stamper, so it must not share the stamper's mistakes.
"""

from __future__ import annotations

import argparse
import calendar
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from .canonical import digest

# Every rule token a Problem can carry, with the spec text it enforces.
RULES: dict[str, str] = {
    "json": "RFC 8259; AEP-0003 §3.1",
    "jsonl": "AEP-0003 §3.1",
    "object": "AEP-0001 §5",
    "required": "AEP-0001 §5.1",
    "null": "AEP-0001 §5.1",
    "attribute": "AEP-0001 §5.1",
    "version": "AEP-0001 §5.1 #1",
    "time": "AEP-0001 §5.1 #5",
    "source": "AEP-0001 §5.1 #6",
    "traceparent": "AEP-0001 §5.1 #14",
    "type": "AEP-0001 §6",
    "category": "AEP-0002 §3",
    "scope": "AEP-0001 §5.2; AEP-0004 §2.2",
    "extension-name": "AEP-0001 §5.4",
    "extension-value": "AEP-0001 §5.4",
    "severity": "AEP-0001 §8.1",
    "capture": "AEP-0001 §8.2",
    "payload": "AEP-0002 §5",
    "id-collision": "AEP-0001 §7.4",
    "seq-regression": "AEP-0001 §7.2",
    "epoch-regression": "AEP-0001 §7.2",
    "run-terminal": "AEP-0002 §2",
    "session-ended": "AEP-0002 §2",
    "attention-dangling": "AEP-0002 §7.2",
    "ack-decision": "AEP-0004 §3",
    "form-values": "AEP-0002 §5.3; AEP-0006",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One violated rule: a token of ``RULES``, a JSON Pointer into the event, and why."""

    rule: str
    path: str
    message: str

    @property
    def cite(self) -> str:
        """The spec section the rule comes from."""
        return RULES.get(self.rule, "")


# ---------------------------------------------------------------------------------------------
# Envelope (AEP-0001 §5; schemas/aep-event.schema.json)

AEP_VERSION = "0.1"
CATEGORIES = frozenset(
    {
        "agent",
        "session",
        "run",
        "progress",
        "tool",
        "delegation",
        "attention",
        "resource",
        "error",
        "state",
        "assessment",
        "message",
        "control",
    }
)
SEVERITIES = ("debug", "info", "notice", "warning", "error", "critical")
CAPTURES = ("none", "metadata", "redacted", "full")
REQUIRED = ("aep", "id", "type", "time", "source", "agent")
CORE = frozenset(
    {
        "aep",
        "id",
        "type",
        "subject",
        "time",
        "source",
        "agent",
        "session",
        "run",
        "step",
        "seq",
        "epoch",
        "cause",
        "traceparent",
        "severity",
        "capture",
        "data",
    }
)

# [0-9], never \d: Python's \d also matches non-ASCII digits. fullmatch everywhere, because `$`
# alone would accept a trailing newline.
_CORE_TYPE = re.compile(r"[a-z]+(?:\.[a-z0-9_]+)+")
_VENDOR_TYPE = re.compile(r"x\.[a-z0-9_-]+\.[a-z0-9_]+(?:\.[a-z0-9_]+)+")
# AEP-0001 §5.2 / AEP-0004 §2.2: the closed list of foreign-emitter session types (no seq).
_FOREIGN_TYPE = re.compile(
    r"control\.attention\.respond|control\.cancel|control\.pause|control\.resume"
    r"|x\.[a-z0-9_-]+\.control\..+|attention\.routed"
)
_EXTENSION_NAME = re.compile(r"[a-z0-9]{1,20}")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_DATE_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?"
    r"(?:[Zz]|[+-]([0-9]{2}):([0-9]{2}))"
)
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]*")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_AUTHORITY_END = re.compile(r"[/?#]")
_IP_LITERAL_AUTHORITY = re.compile(r"(?:[^@\[\]]*@)?\[[0-9A-Za-z:._~!$&'()*+,;=-]+\](?::[0-9]*)?")


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> TypeGuard[int]:
    # bool is an int in Python, never in JSON. Honest deviation: JSON Schema counts 1.0 as an
    # integer, but a float counter is an emitter bug (it re-serializes as "1.0"), so it is refused.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def time_problem(value: str) -> str | None:
    """Why ``value`` is not an RFC 3339 date-time with an offset, or None."""
    m = _DATE_TIME.fullmatch(value)
    if m is None:
        return "must be an RFC 3339 date-time with an offset, e.g. 2026-07-03T10:15:04.221Z"
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not 1 <= month <= 12:
        return f"month {month:02d} is out of range"
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        return f"day {day:02d} does not exist in {year:04d}-{month:02d}"
    # RFC 3339 §5.6: second 60 is a leap second.
    if hour > 23 or minute > 59 or second > 60:
        return "time of day is out of range"
    if m.group(7) is not None and (int(m.group(7)) > 23 or int(m.group(8)) > 59):
        return "offset is out of range"
    return None


def uri_problem(value: str) -> str | None:
    """Why ``value`` is not an absolute URI (RFC 3986 §4.3, fragment allowed), or None."""
    if _URI.fullmatch(value) is None:
        if ":" not in value or not value[:1].isalpha():
            return "must be an absolute URI with a scheme, e.g. aep://host/agent/name"
        return "contains characters a URI cannot carry unencoded"
    if _BAD_PERCENT.search(value):
        return "has a % not followed by two hex digits"
    if value.count("#") > 1:
        return "has more than one #"
    rest = value.split(":", 1)[1]
    authority = ""
    if rest.startswith("//"):
        authority = _AUTHORITY_END.split(rest[2:], maxsplit=1)[0]
        rest = rest[2 + len(authority) :]
    if (
        "[" in rest
        or "]" in rest
        or (("[" in authority or "]" in authority) and _IP_LITERAL_AUTHORITY.fullmatch(authority) is None)
    ):
        return "has [ or ] outside an IP-literal host"
    return None


def type_problem(value: str) -> Problem | None:
    """The grammar or category problem of an event ``type`` string, or None."""
    if _VENDOR_TYPE.fullmatch(value):
        return None
    head = value.split(".", 1)[0]
    if head == "x":
        return Problem("type", "/type", f"vendor type {value!r} must be x.{{vendor}}.{{category}}.{{rest}}")
    if head.isascii() and head.islower() and head.isalpha() and head not in CATEGORIES:
        return Problem("category", "/type", f"{head!r} is not one of the 13 categories of AEP 0.1")
    if head not in CATEGORIES or _CORE_TYPE.fullmatch(value) is None:
        return Problem(
            "type",
            "/type",
            f"{value!r} is not {{category}}.{{rest}}: lowercase [a-z0-9_] segments, two or more",
        )
    return None


def _nonempty(rule: str) -> Callable[[str, Any, list[Problem]], None]:
    def check(name: str, value: Any, out: list[Problem]) -> None:
        if not isinstance(value, str) or not value:
            out.append(
                Problem(rule, _pointer(name), f"{name} must be a non-empty string, got {_show(value)}")
            )

    return check


_string = _nonempty("attribute")


def _check_aep(name: str, value: Any, out: list[Problem]) -> None:
    if value != AEP_VERSION or not isinstance(value, str):
        out.append(Problem("version", "/aep", f'aep must be "0.1", got {_show(value)}'))


def _check_type(name: str, value: Any, out: list[Problem]) -> None:
    if not isinstance(value, str):
        out.append(Problem("type", "/type", f"type must be a string, got {_show(value)}"))
        return
    problem = type_problem(value)
    if problem is not None:
        out.append(problem)


def _check_time(name: str, value: Any, out: list[Problem]) -> None:
    why = time_problem(value) if isinstance(value, str) else "must be a string"
    if why is not None:
        out.append(Problem("time", "/time", f"time {_show(value)} {why}"))


def _check_source(name: str, value: Any, out: list[Problem]) -> None:
    why = uri_problem(value) if isinstance(value, str) else "must be a string"
    if why is not None:
        out.append(Problem("source", "/source", f"source {_show(value)} {why}"))


def _check_counter(name: str, value: Any, out: list[Problem]) -> None:
    if not _is_int(value) or value < 0:
        out.append(
            Problem("attribute", _pointer(name), f"{name} must be a non-negative integer, got {_show(value)}")
        )


def _check_traceparent(name: str, value: Any, out: list[Problem]) -> None:
    if not isinstance(value, str) or _TRACEPARENT.fullmatch(value) is None:
        out.append(
            Problem(
                "traceparent",
                "/traceparent",
                f"traceparent {_show(value)} is not a W3C value 00-<32 hex>-<16 hex>-<2 hex>",
            )
        )


def _check_severity(name: str, value: Any, out: list[Problem]) -> None:
    if value not in SEVERITIES or not isinstance(value, str):
        out.append(
            Problem("severity", "/severity", f"severity {_show(value)} is not one of {', '.join(SEVERITIES)}")
        )


def _check_capture(name: str, value: Any, out: list[Problem]) -> None:
    if value not in CAPTURES or not isinstance(value, str):
        out.append(
            Problem("capture", "/capture", f"capture {_show(value)} is not one of {', '.join(CAPTURES)}")
        )


def _check_data(name: str, value: Any, out: list[Problem]) -> None:
    if not isinstance(value, dict):
        out.append(Problem("attribute", "/data", f"data must be an object, got {_show(value)}"))


_CORE_CHECKS: dict[str, Callable[[str, Any, list[Problem]], None]] = {
    "aep": _check_aep,
    "id": _string,
    "type": _check_type,
    "subject": _string,
    "time": _check_time,
    "source": _check_source,
    "agent": _string,
    "session": _string,
    "run": _string,
    "step": _string,
    "seq": _check_counter,
    "epoch": _check_counter,
    "cause": _string,
    "traceparent": _check_traceparent,
    "severity": _check_severity,
    "capture": _check_capture,
    "data": _check_data,
}


def _scope_problems(event: dict[str, Any], etype: str, out: list[Problem]) -> None:
    def has(name: str) -> bool:
        return event.get(name) is not None  # a null was reported already; treat it as absent

    # AEP-0001 §5.2: the schema's three cases, in the schema's order.
    if etype.startswith("agent."):
        for name in ("session", "run", "step", "seq"):
            if has(name):
                out.append(Problem("scope", _pointer(name), f"agent-scoped {etype} must not carry {name}"))
    elif _FOREIGN_TYPE.fullmatch(etype):
        if not has("session"):
            out.append(
                Problem("scope", "/session", f"{etype} is addressed to a session and must carry session")
            )
        if has("seq"):
            out.append(
                Problem(
                    "scope",
                    "/seq",
                    f"{etype} comes from a foreign emitter and must not carry seq (AEP-0004 §2.2)",
                )
            )
    else:
        for name in ("session", "seq"):
            if not has(name):
                out.append(Problem("scope", _pointer(name), f"session-scoped {etype} must carry {name}"))


def envelope_errors(event: object) -> list[Problem]:
    """Every envelope problem of one event (AEP-0001 §5–§8); empty means envelope-valid."""
    if not isinstance(event, dict):
        return [Problem("object", "", f"an Event is a JSON object, got {_show(event)}")]
    out: list[Problem] = []
    for name in REQUIRED:
        if name not in event:
            out.append(Problem("required", _pointer(name), f"required attribute {name} is missing"))
    for key, value in event.items():
        if not isinstance(key, str):
            out.append(Problem("extension-name", "", f"attribute name {key!r} is not a string"))
            continue
        if value is None:
            # AEP-0001 §5.1: an absent optional is omitted, never null.
            out.append(Problem("null", _pointer(key), f"{key} is null; omit an absent attribute instead"))
            continue
        check = _CORE_CHECKS.get(key)
        if check is not None:
            check(key, value, out)
            continue
        if _EXTENSION_NAME.fullmatch(key) is None:
            out.append(
                Problem(
                    "extension-name",
                    _pointer(key),
                    f"extension attribute name {key!r} must match [a-z0-9]{{1,20}}",
                )
            )
        if not isinstance(value, (str, int)):  # bool is an int: allowed, as the schema allows it
            out.append(
                Problem(
                    "extension-value",
                    _pointer(key),
                    f"extension attribute {key} must be a string, integer or boolean, got {_show(value)}",
                )
            )
    etype = event.get("type")
    if isinstance(etype, str):
        _scope_problems(event, etype, out)
    return out


# ---------------------------------------------------------------------------------------------
# Payloads (AEP-0002 §5.2–§5.4, AEP-0004 §3/§5). Schemas are open: only named fields are checked.

Check = Callable[[Any, str, list[Problem]], None]


def _leaf(path: str) -> str:
    last = path.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")
    return f"item {last}" if last.isdigit() else last


def _kind(test: Callable[[Any], bool], what: str) -> Check:
    def check(value: Any, path: str, out: list[Problem]) -> None:
        if not test(value):
            out.append(Problem("payload", path, f"{_leaf(path)} must be {what}, got {_show(value)}"))

    return check


_STR = _kind(lambda v: isinstance(v, str), "a string")
_BOOL = _kind(lambda v: isinstance(v, bool), "a boolean")
_OBJECT = _kind(lambda v: isinstance(v, dict), "an object")
_INT = _kind(_is_int, "an integer")
_UINT = _kind(lambda v: _is_int(v) and v >= 0, "a non-negative integer")
_NUMBER = _kind(_is_number, "a number")
_AMOUNT = _kind(lambda v: _is_number(v) and v >= 0, "a non-negative number")
_PERCENT = _kind(lambda v: _is_number(v) and 0 <= v <= 100, "a number from 0 to 100")
_OBJECT_OR_STR = _kind(lambda v: isinstance(v, (dict, str)), "an object or a string")
_DATE_TIME_STR = _kind(lambda v: isinstance(v, str) and time_problem(v) is None, "an RFC 3339 date-time")
# AEP-0002 §5.2: currency is an ISO 4217 alpha-3 code.
_ISO_4217 = re.compile(r"[A-Z]{3}")
_CURRENCY = _kind(
    lambda v: isinstance(v, str) and _ISO_4217.fullmatch(v) is not None,
    'an ISO 4217 alpha-3 code such as "USD"',
)


def _enum(*values: str) -> Check:
    return _kind(lambda v: isinstance(v, str) and v in values, "one of " + ", ".join(values))


def _array(item: Check) -> Check:
    def check(value: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(value, list):
            out.append(Problem("payload", path, f"{_leaf(path)} must be an array, got {_show(value)}"))
            return
        for i, element in enumerate(value):
            item(element, f"{path}/{i}", out)

    return check


def _object(fields: dict[str, Check], required: tuple[str, ...] = (), extra: Check | None = None) -> Check:
    def check(value: Any, path: str, out: list[Problem]) -> None:
        if not isinstance(value, dict):
            out.append(Problem("payload", path, f"{_leaf(path)} must be an object, got {_show(value)}"))
            return
        for name in required:
            if name not in value:
                out.append(Problem("payload", path + _pointer(name), f"{name} is required"))
        for name, sub in fields.items():
            if name in value:
                sub(value[name], path + _pointer(name), out)
        if extra is not None:
            extra(value, path, out)

    return check


def _select_needs_choices(value: Any, path: str, out: list[Problem]) -> None:
    # AEP-0002 §5.2 field_spec (AEP-0006): choices is REQUIRED when type is select.
    if value.get("type") == "select" and "choices" not in value:
        out.append(Problem("payload", path + "/choices", "a select field_spec requires choices"))


def _one_offset_variant(value: Any, path: str, out: list[Problem]) -> None:
    # AEP-0002 §5.2 citation: at most one of char/page/block is populated.
    if sum(1 for k in ("char", "page", "block") if k in value) > 1:
        out.append(Problem("payload", path, "a citation offset populates at most one of char, page, block"))


_USAGE = {"gen_ai.usage.input_tokens": _UINT, "gen_ai.usage.output_tokens": _UINT}
_COST = _object(
    {
        "currency": _CURRENCY,
        "total": _AMOUNT,
        "prompt": _AMOUNT,
        "completion": _AMOUNT,
        "cache": _AMOUNT,
        "reasoning": _AMOUNT,
    },
    required=("currency",),
)
_TOOL = _object({"name": _STR, "call_id": _STR}, required=("name",))
_ERROR = _object({"type": _STR, "message": _STR})
_CHOICE = _object({"id": _STR, "label": _STR}, required=("id", "label"))
_FIELD_SPEC = _object(
    {
        "id": _STR,
        "type": _enum("string", "number", "boolean", "select"),
        "label": _STR,
        "required": _BOOL,
        "multi": _BOOL,
        "other": _BOOL,
        "choices": _array(_CHOICE),
        "min": _NUMBER,
        "max": _NUMBER,
    },
    required=("id", "type", "label"),
    extra=_select_needs_choices,
)
_ANSWER = _object({"option": _STR, "text": _STR, "values": _OBJECT})
_CHILD = _object({"session": _STR, "run": _STR, "agent": _STR})
_DOCUMENT = _object(
    {"id": _STR, "score": _NUMBER, "content_redacted": _STR, "content": _STR, "metadata": _OBJECT}
)
_SPAN = _object({"start": _INT, "end": _INT})
_CITATION = _object(
    {
        "source": _object({"id": _STR, "uri": _STR, "title": _STR}),
        "cited_text_redacted": _STR,
        "cited_text": _STR,
        "document_index": _UINT,
        "offset": _object(
            {
                "char": _SPAN,
                "page": _object({"page": _INT, "start": _INT, "end": _INT}),
                "block": _object({"block": _INT, "start": _INT, "end": _INT}),
            },
            extra=_one_offset_variant,
        ),
    },
    required=("source",),
)
_GUARDRAIL = _object(
    {
        "stage": _enum("input", "output"),
        "verdict": _enum("allowed", "flagged", "blocked", "modified"),
        "categories": _array(_object({"name": _STR, "score": _NUMBER}, required=("name",))),
        "detector": _object({"name": _STR, "version": _STR}),
        "explanation": _STR,
    }
)

PAYLOADS: dict[str, Check] = {
    "session.started": _object(
        {
            "label": _STR,
            "parent": _object({"session": _STR, "run": _STR, "agent": _STR}, required=("session",)),
            "client": _object({"name": _STR, "version": _STR}, required=("name",)),
            "gen_ai.request.model": _STR,
            "cwd": _STR,
        }
    ),
    "session.ended": _object(
        {
            "reason": _enum("normal", "error", "timeout", "killed", "compaction"),
            "duration_ms": _UINT,
            "runs": _UINT,
        }
    ),
    "session.compacted": _object(
        {"trigger": _STR, "strategy": _STR, "estimated_token_count": _UINT, "forgotten": _UINT, **_USAGE}
    ),
    "run.started": _object(
        {
            "trigger": _enum("user", "schedule", "agent", "control", "resume"),
            "prompt": _STR,
            "cost": _COST,
            **_USAGE,
        }
    ),
    "run.finished": _object({"duration_ms": _UINT, "summary": _STR, "cost": _COST, **_USAGE}),
    "run.failed": _object({"reason": _STR, "error": _ERROR, "duration_ms": _UINT}, required=("reason",)),
    "run.cancelled": _object(
        {"by": _enum("user", "control", "policy", "shutdown"), "reason": _STR, "duration_ms": _UINT}
    ),
    "run.step.started": _object({"name": _STR, "initial_num_steps": _UINT}),
    "run.step.finished": _object({"status": _STR}),
    "tool.requested": _object(
        {"tool": _TOOL, "args_digest": _STR, "args": _OBJECT, "args_redacted": _OBJECT}, required=("tool",)
    ),
    "tool.completed": _object(
        {
            "tool": _TOOL,
            "duration_ms": _UINT,
            "status": _STR,
            "result_digest": _STR,
            "result": _OBJECT_OR_STR,
            "result_redacted": _OBJECT_OR_STR,
            "cost": _COST,
            **_USAGE,
        },
        required=("tool",),
    ),
    "tool.failed": _object(
        {"tool": _TOOL, "error": _ERROR, "duration_ms": _UINT}, required=("tool", "error")
    ),
    "tool.denied": _object(
        {"tool": _TOOL, "by": _enum("policy", "user_setting", "runtime"), "rule": _STR},
        required=("tool", "by"),
    ),
    "attention.requested": _object(
        {
            "kind": _enum("permission", "input", "auth", "review", "form", "other"),
            "prompt": _STR,
            "options": _array(_CHOICE),
            "fields": _array(_FIELD_SPEC),
            "expires_at": _DATE_TIME_STR,
            "respond_via": _array(_enum("control", "oob")),
            "context": _OBJECT,
        },
        required=("kind", "prompt"),
    ),
    "attention.answered": _object(
        {"answer": _ANSWER, "by": _STR, "via": _enum("control", "oob")}, required=("answer",)
    ),
    "attention.resolved": _object(
        {"resolution": _enum("answered", "auto", "dismissed"), "latency_ms": _UINT}, required=("resolution",)
    ),
    "attention.timeout": _object({"after_ms": _UINT}),
    "attention.routed": _object({"to": _STR, "via": _STR}),
    "agent.presence": _object({"state": _enum("online", "offline", "busy")}, required=("state",)),
    "agent.idle": _object({"since_ms": _UINT, "reason": _STR}),
    "agent.health": _object(
        {"status": _enum("ok", "degraded", "failing"), "detail": _STR}, required=("status",)
    ),
    "agent.heartbeat": _object({"tick": _UINT, "interval_ms": _UINT}),
    "progress.status": _object({"message": _STR, "phase": _STR, "percent": _PERCENT}),
    "progress.task.planned": _object({"task": _object({"id": _STR}), "parent": _STR}),
    "progress.task.completed": _object({"task": _object({"id": _STR}), "status": _STR}),
    "progress.artifact.produced": _object(
        {"artifact": _object({"id": _STR, "name": _STR, "mime": _STR, "bytes": _UINT, "uri": _STR})}
    ),
    "delegation.subagent.started": _object({"child": _CHILD, "agent_type": _STR, "role": _STR}),
    "delegation.subagent.stopped": _object(
        {"child": _CHILD, "agent_type": _STR, "status": _STR, "duration_ms": _UINT}
    ),
    "error.raised": _object({"error": _ERROR, "code": _STR, "fatal": _BOOL}),
    "state.snapshot": _object({"state": _OBJECT, "key": _STR, "rev": _UINT}),
    "state.delta": _object({"delta": _array(_OBJECT), "key": _STR, "rev": _UINT}),
    "resource.retrieval.requested": _object(
        {"query": _STR, "query_digest": _STR, "corpus": _STR, "top_k": _UINT}
    ),
    "resource.retrieval.returned": _object(
        {"documents": _array(_DOCUMENT), "count": _UINT, "corpus": _STR, "duration_ms": _UINT}
    ),
    "resource.retrieval.reranked": _object(
        {
            "query": _STR,
            "query_digest": _STR,
            "model": _STR,
            "top_k": _UINT,
            "input_documents": _array(_DOCUMENT),
            "output_documents": _array(_DOCUMENT),
            "count": _UINT,
            "duration_ms": _UINT,
        }
    ),
    "resource.citation.recorded": _object({"citations": _array(_CITATION), "count": _UINT}),
    "assessment.evaluation.recorded": _object(
        {
            "gen_ai.evaluation.name": _STR,
            "gen_ai.evaluation.score.value": _NUMBER,
            "gen_ai.evaluation.score.label": _STR,
            "gen_ai.evaluation.explanation": _STR,
            "evaluator": _STR,
        }
    ),
    "assessment.feedback.received": _object(
        {"rating": _NUMBER, "label": _STR, "comment": _STR, "correction": _STR, "source": _STR}
    ),
    "assessment.guardrail.recorded": _object({"guardrail": _GUARDRAIL}),
    "control.attention.respond": _object({"answer": _ANSWER}, required=("answer",)),
    "control.cancel": _object({"scope": _enum("run", "session"), "reason": _STR}, required=("scope",)),
    "control.pause": _object({}),
    "control.resume": _object({}),
    "control.accepted": _object({}),
    "control.rejected": _object(
        {"reason": _enum("unsupported", "unauthorized", "busy", "refused", "invalid"), "detail": _STR},
        required=("reason",),
    ),
}


def payload_errors(event: object) -> list[Problem]:
    """Problems of a registered type's ``data`` (AEP-0002 §5); unknown and ``x.*`` types pass."""
    if not isinstance(event, dict) or not isinstance(event.get("data"), dict):
        return []  # no payload to check; a non-object data is an envelope problem
    etype = event.get("type")
    check = PAYLOADS.get(etype) if isinstance(etype, str) else None
    if check is None:
        return []
    out: list[Problem] = []
    check(event["data"], "/data", out)
    return out


def event_errors(event: object) -> list[Problem]:
    """Envelope and payload problems of one event."""
    return envelope_errors(event) + payload_errors(event)


# ---------------------------------------------------------------------------------------------
# Stream rules

_RUN_TERMINALS = frozenset({"run.finished", "run.failed", "run.cancelled"})
_ATTENTION_TERMINALS = frozenset({"attention.resolved", "attention.timeout"})
_ACKS = frozenset({"control.accepted", "control.rejected"})


def form_value_problems(fields: list[Any], values: dict[str, Any], capture: str, path: str) -> list[Problem]:
    """Problems of an ``answer.values`` against the request's field_specs (AEP-0002 §5.3, AEP-0006)."""
    out: list[Problem] = []
    # Below redacted, string values and `other` free text are legitimately gated out (AEP-0002 §5.3),
    # so a missing required value is only a fault where content is carried.
    content = capture in ("redacted", "full")
    for spec in fields:
        if not isinstance(spec, dict) or not isinstance(spec.get("id"), str):
            continue
        fid = spec["id"]
        where = path + _pointer(fid)
        if fid not in values:
            if spec.get("required") is True and content:
                out.append(Problem("form-values", where, f"required field {fid!r} has no value"))
            continue
        value, ftype = values[fid], spec.get("type")
        if ftype == "select":
            choices = raw if isinstance(raw := spec.get("choices"), list) else []
            ids = {c["id"] for c in choices if isinstance(c, dict) and isinstance(c.get("id"), str)}
            multi = spec.get("multi") is True
            if multi != isinstance(value, list):
                shape = "an array of choice ids" if multi else "one choice id, not an array"
                out.append(Problem("form-values", where, f"select field {fid!r} takes {shape}"))
                continue
            for item in value if multi else [value]:
                if isinstance(item, str) and (item in ids or spec.get("other") is True):
                    continue
                out.append(
                    Problem(
                        "form-values",
                        where,
                        f"{_show(item)} is not a choices[].id of select field {fid!r}, "
                        "and the field does not allow other",
                    )
                )
        elif ftype == "number" and not _is_number(value):
            out.append(Problem("form-values", where, f"number field {fid!r} answered with {_show(value)}"))
        elif ftype == "boolean" and not isinstance(value, bool):
            out.append(Problem("form-values", where, f"boolean field {fid!r} answered with {_show(value)}"))
        elif ftype == "string" and not isinstance(value, str):
            out.append(Problem("form-values", where, f"string field {fid!r} answered with {_show(value)}"))
    return out


@dataclass
class SessionState:
    """What the stream rules remember of one ``(source, session)``."""

    epoch: int | None = None
    high: int | None = None  # highest seq seen in `epoch`
    ended: str | None = None  # id of the session.ended
    terminals: dict[str, tuple[str, str]] = field(default_factory=dict)  # run -> (type, id)
    pending: dict[str, None] = field(default_factory=dict)  # open attention requests, in order
    forms: dict[str, list[Any]] = field(default_factory=dict)  # request id -> field_specs
    acks: dict[str, tuple[str, str]] = field(default_factory=dict)  # command id -> (type, ack id)


def _fingerprint(event: dict[str, Any]) -> str:
    try:
        return digest(event)
    except (TypeError, ValueError):  # not JSON data (a Python caller's object): compare its repr
        return "repr:" + repr(sorted(event.items(), key=lambda kv: str(kv[0])))


class StreamValidator:
    """Stream-level rules over events fed in emission order; state per ``(source, session)``.

    It assumes the stream of each session is in emission order (an emitter's own log, or what the
    collector emits). A capture merged from two relays may carry legal backfill (AEP-0001 §7.2),
    which this reports as a seq regression.
    """

    def __init__(self) -> None:
        self.sessions: dict[tuple[str, str], SessionState] = {}
        self._seen: dict[tuple[str, str], str] = {}  # (source, id) -> content fingerprint

    def feed(self, event: object) -> list[Problem]:
        """Check one event against everything fed before it."""
        if not isinstance(event, dict):
            return []
        source, eid, etype = event.get("source"), event.get("id"), event.get("type")
        if isinstance(source, str) and isinstance(eid, str):
            fingerprint = _fingerprint(event)
            first = self._seen.get((source, eid))
            if first is None:
                self._seen[(source, eid)] = fingerprint
            elif first == fingerprint:
                return []  # AEP-0001 §7.4: redelivery of the same Event; dedupe, judge it once
            else:
                # Not tracked further: which Event the id names is now ambiguous, and its seq, ack or
                # terminal would only repeat this one fault as derivative problems.
                return [
                    Problem("id-collision", "/id", f"id {eid!r} of {source} already names a different Event")
                ]
        session = event.get("session")
        if not isinstance(source, str) or not isinstance(session, str) or not isinstance(etype, str):
            return []
        if etype.startswith("agent.") or _FOREIGN_TYPE.fullmatch(etype):
            return []  # unsequenced: ordered by time and cause, owning no session state
        out: list[Problem] = []
        state = self.sessions.get((source, session))
        if state is None:
            state = self.sessions[(source, session)] = SessionState()
        self._order(event, state, out)
        self._lifecycle(event, etype, state, out)
        return out

    def finish(self) -> list[Problem]:
        """Problems only the end of the stream reveals.

        None exist in AEP 0.1: a session may never end and a request may stay open until it does
        (AEP-0002 §4.1 note, §7.2), so every rule is decided when its event arrives.
        """
        return []

    def _order(self, event: dict[str, Any], state: SessionState, out: list[Problem]) -> None:
        seq, epoch = event.get("seq"), event.get("epoch", 0)
        if not _is_int(seq) or not _is_int(epoch) or seq < 0 or epoch < 0:
            return  # an envelope problem, reported there
        if state.epoch is None or epoch > state.epoch:
            # A new epoch is only ever declared by the emitter's attribute (AEP-0001 §7.2).
            state.epoch, state.high = epoch, seq
        elif epoch < state.epoch:
            out.append(
                Problem(
                    "epoch-regression",
                    "/epoch",
                    f"epoch {epoch} after epoch {state.epoch}: an earlier epoch is never reused",
                )
            )
        elif state.high is not None and seq <= state.high:
            what = "reuses the position of another Event" if seq == state.high else "goes backwards"
            out.append(
                Problem(
                    "seq-regression",
                    "/seq",
                    f"seq {seq} after seq {state.high} in epoch {epoch} {what}; "
                    "a restart must declare a new epoch",
                )
            )
        else:
            state.high = seq

    def _lifecycle(self, event: dict[str, Any], etype: str, state: SessionState, out: list[Problem]) -> None:
        eid = event.get("id")
        eid = eid if isinstance(eid, str) else "?"
        data = raw if isinstance(raw := event.get("data"), dict) else {}
        subject = event.get("subject")
        if etype in _RUN_TERMINALS:
            run = event.get("run")
            if isinstance(run, str):
                # AEP-0002 §2 convention 5: one terminal per run across every epoch.
                if run in state.terminals:
                    first_type, first_id = state.terminals[run]
                    out.append(
                        Problem(
                            "run-terminal", "/type", f"run {run!r} already reached {first_type} ({first_id})"
                        )
                    )
                else:
                    state.terminals[run] = (etype, eid)
        elif etype == "attention.requested":
            state.pending[eid] = None
            if data.get("kind") == "form" and isinstance(data.get("fields"), list):
                state.forms[eid] = data["fields"]
        elif etype in _ATTENTION_TERMINALS:
            if isinstance(subject, str):
                state.pending.pop(subject, None)
        elif etype == "attention.answered":
            answer = data.get("answer")
            values = answer.get("values") if isinstance(answer, dict) else None
            if isinstance(subject, str) and subject in state.forms and isinstance(values, dict):
                capture = event.get("capture", "metadata")
                out.extend(form_value_problems(state.forms[subject], values, capture, "/data/answer/values"))
        elif etype == "session.ended":
            if state.pending:
                # AEP-0002 §7.2: a request's terminal comes before session.ended.
                out.append(
                    Problem(
                        "attention-dangling",
                        "/type",
                        "session ended with attention request(s) still pending: " + ", ".join(state.pending),
                    )
                )
            if state.ended is not None:
                out.append(Problem("session-ended", "/type", f"session already ended ({state.ended})"))
            else:
                state.ended = eid
        elif etype in _ACKS:
            cause = event.get("cause")
            if isinstance(cause, str):
                # AEP-0004 §3: one decision per command; a retry is re-acked byte-identically.
                if cause in state.acks:
                    first_type, first_id = state.acks[cause]
                    out.append(
                        Problem(
                            "ack-decision",
                            "/cause",
                            f"command {cause!r} was already answered by {first_type} ({first_id})",
                        )
                    )
                else:
                    state.acks[cause] = (etype, eid)


# ---------------------------------------------------------------------------------------------
# JSONL files (AEP-0003 §3.1)


@dataclass(frozen=True, slots=True)
class Finding:
    """A problem found on one line of a JSONL stream (1-based)."""

    line: int
    problem: Problem


@dataclass
class Report:
    """The outcome of validating a JSONL stream."""

    name: str = "<lines>"
    count: int = 0  # lines read, blank ones included
    problems: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        """A human-readable summary, one ``name:line: [rule] path: message (cite)`` per problem."""
        lines = []
        for f in self.problems:
            p = f.problem
            where = f" {p.path}:" if p.path else ""
            lines.append(f"{self.name}:{f.line}: [{p.rule}]{where} {p.message} ({p.cite})")
        noun = "line" if self.count == 1 else "lines"
        if self.ok:
            lines.append(f"{self.name}: {self.count} {noun}, valid")
        else:
            bad = len({f.line for f in self.problems})
            lines.append(
                f"{self.name}: {self.count} {noun}, {len(self.problems)} problem(s) on {bad} line(s), invalid"
            )
        return "\n".join(lines)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        names = [k for k, _ in pairs]
        dup = next(k for k in obj if names.count(k) > 1)
        # RFC 8259 §4: parsers disagree on which duplicate wins, so an envelope with one is ambiguous.
        raise ValueError(f"member name {dup!r} appears twice in one object")
    return obj


def _parse(text: str) -> tuple[Any, Problem | None]:
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_members), None
    except json.JSONDecodeError as e:
        cut = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string")
        torn = " (the line ends mid-value: a torn write?)" if cut else ""
        return None, Problem("json", "", f"not JSON: {e.msg} at column {e.colno}{torn}")
    except (ValueError, RecursionError) as e:
        return None, Problem("json", "", f"not JSON: {e}")


def validate_lines(lines: Iterable[str | bytes], name: str = "<lines>") -> Report:
    """Validate a JSONL stream line by line: JSON, envelope, payload, then the stream rules."""
    report = Report(name=name)
    stream = StreamValidator()
    for number, raw in enumerate(lines, start=1):
        report.count = number
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                report.problems.append(
                    Finding(number, Problem("jsonl", "", f"not UTF-8: {e.reason} at byte {e.start}"))
                )
                continue
        text = raw[:-1] if raw.endswith("\n") else raw
        if not text.strip():
            report.problems.append(
                Finding(number, Problem("jsonl", "", "blank line; JSONL has one Event per line"))
            )
            continue
        event, problem = _parse(text)
        if problem is not None:
            report.problems.append(Finding(number, problem))
            continue
        problems = envelope_errors(event)
        # Stream rules are defined over Events; an envelope-invalid line is reported, not tracked.
        later = payload_errors(event) + (stream.feed(event) if not problems else [])
        report.problems.extend(Finding(number, p) for p in problems + later)
    report.problems.extend(Finding(report.count, p) for p in stream.finish())
    return report


def validate_file(path: str | Path) -> Report:
    """Validate a JSONL file (gzip too) with its rotated predecessors; raises OSError when unreadable."""
    from .jsonl_files import iter_lines

    return validate_lines(iter_lines(path), name=str(path))


def main_validate_events(argv: list[str]) -> int:
    """``aep-collector validate-events FILE.jsonl``: print the report; 0 valid, 1 invalid, 2 unreadable."""
    parser = argparse.ArgumentParser(
        prog="aep-collector validate-events",
        description="Validate AEP 0.1 events in a JSONL file ('-' for stdin).",
    )
    parser.add_argument("file", help="JSONL file, one AEP event per line (a session's rotated and .gz files "
                                     "are read before it; a .gz file alone is read too)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage error
        return 2 if e.code else 0
    try:
        if args.file == "-":
            report = validate_lines(sys.stdin.buffer, name="<stdin>")
        else:
            report = validate_file(args.file)
    except OSError as e:
        print(f"aep-collector validate-events: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.ok else 1
