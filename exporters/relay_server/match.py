"""The relay's pure rules (AEP-0001 §5, AEP-0003 §6): envelope check, attr-match, command test.

Shared by the ``relay_server`` exporter and the test relay double, so both judge an event or a
filter the same way.
"""

from __future__ import annotations

import re
from typing import Any

from aep_collector.pipeline.validate import envelope_errors

VERSION = "0.1"
_VENDOR_COMMAND = re.compile(r"^x\.[a-z0-9_-]+\.control\.")
_CORE = frozenset({"aep", "id", "type", "subject", "time", "source", "agent", "session", "run", "step", "seq",
                   "epoch", "cause", "traceparent", "severity", "capture", "data"})
_FILTER_KEYS = frozenset({"id", "type", "subject", "source", "agent", "session", "run", "step", "epoch",
                          "cause", "severity", "capture"})
_EXTENSION = re.compile(r"[a-z0-9]{1,20}")
_TYPE_PATTERN = re.compile(r"^([a-z0-9_-]+\.)+\*$")
_SEVERITIES = ("debug", "info", "notice", "warning", "error", "critical")
_DEFAULTS = {"severity": "info", "capture": "metadata", "epoch": 0}


def is_command(event_type: str) -> bool:
    """What the relay routes instead of buffering: ``control.*`` but the acks, and vendor commands."""
    if event_type.startswith("control."):
        return event_type not in ("control.accepted", "control.rejected")
    return _VENDOR_COMMAND.match(event_type) is not None


def envelope_problem(ev: Any) -> str | None:
    """The first envelope problem of ``ev`` (AEP-0001 §5-§8, scope rules of §5.2), or None.

    The rules are ``aep-collector validate-events``' own (``envelope_errors``), not a second, looser
    copy: whatever the relay accepts is then safe to buffer, key by ``session`` and fan out."""
    problems = envelope_errors(ev)
    return problems[0].message if problems else None


_SERVED = frozenset({"", "/id", "/type", "/time", "/source", "/agent", "/session", "/seq", "/epoch",
                     "/severity", "/capture"})
"""Where ``served_problem`` looks for a problem to name: the event itself and what the relay reads."""


def served_problem(ev: Any) -> str | None:
    """Why an event from the collector's own pipelines cannot be buffered and served, or None.

    A plug-in receiver or processor can pass on a stamped-looking event the stamper keeps as it is
    (a string ``seq``, a list ``id``): buffered, it would break ordering or keying for its whole
    session; served, consumers would get a mistyped envelope. This runs per event on the hot path,
    so it checks only the types of the attributes the relay reads (under a microsecond); the full
    envelope check (about 15 µs) runs only for an event that fails, to name what is wrong."""
    if type(ev) is dict:
        get = ev.get
        # Exact types, what the stamper writes; ``_typed`` is the same check allowing subclasses.
        if (type(get("id")) is str and type(get("type")) is str and type(get("time")) is str
                and type(get("source")) is str and type(get("agent")) is str
                and type(get("session", "")) is str and type(get("seq", 0)) is int
                and type(get("epoch", 0)) is int and type(get("severity", "")) is str
                and type(get("capture", "")) is str):
            return None
    if isinstance(ev, dict) and _typed(ev):
        return None  # a str or int subclass (a StrEnum type): served as it is
    named = [p.message for p in envelope_errors(ev) if p.path in _SERVED and p.rule != "scope"]
    return named[0] if named else "an envelope attribute the relay reads has the wrong type"


def _typed(ev: dict[str, Any]) -> bool:
    counters = [ev.get("seq", 0), ev.get("epoch", 0)]
    return (all(isinstance(ev.get(k), str) for k in ("id", "type", "time", "source", "agent"))
            and all(isinstance(ev.get(k, ""), str) for k in ("session", "severity", "capture"))
            and all(isinstance(v, int) and not isinstance(v, bool) for v in counters))


def filter_problem(flt: Any) -> str | None:
    """Why ``flt`` is not a valid attr-match filter (AEP-0003 §6.1, failing closed), or None."""
    if not isinstance(flt, dict):
        return "a filter is a JSON object"
    for key, pred in flt.items():
        allowed = key in _FILTER_KEYS or (key not in _CORE and _EXTENSION.fullmatch(key))
        if not allowed:
            return f"{key!r} cannot be filtered on"
        if key == "severity" and isinstance(pred, dict):
            if not pred or set(pred) - {"gte", "lte"} or any(v not in _SEVERITIES for v in pred.values()):
                return "severity takes gte/lte with a known level"
            continue
        if isinstance(pred, list) and not pred:
            return f"{key}: an empty any-of matches nothing"
        for value in pred if isinstance(pred, list) else [pred]:
            if not isinstance(value, (str, int, bool)):
                return f"{key}: predicates are scalars"
            if isinstance(value, str) and "*" in value and (key != "type" or not _TYPE_PATTERN.match(value)):
                return f"{key}: {value!r} is not a valid pattern"
    return None


def matches(flt: dict[str, Any], ev: dict[str, Any]) -> bool:
    """attr-match (AEP-0003 §6.2): an absent attribute fails, except those with a default."""
    for key, pred in flt.items():
        if key in ev:
            value = ev[key]
        elif key in _DEFAULTS:
            value = _DEFAULTS[key]
        else:
            return False
        if key == "severity" and isinstance(pred, dict):
            rank = _SEVERITIES.index(value) if value in _SEVERITIES else -1
            if "gte" in pred and rank < _SEVERITIES.index(pred["gte"]):
                return False
            if "lte" in pred and rank > _SEVERITIES.index(pred["lte"]):
                return False
            continue
        if not any(_equal(p, value, key) for p in (pred if isinstance(pred, list) else [pred])):
            return False
    return True


def _equal(pattern: Any, value: Any, key: str) -> bool:
    if key == "type" and isinstance(pattern, str) and pattern.endswith(".*"):
        return isinstance(value, str) and value.startswith(pattern[:-1])
    return type(pattern) is type(value) and pattern == value  # JSON true is not 1
