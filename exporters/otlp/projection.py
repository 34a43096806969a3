"""AEP event -> OTLP LogRecord, as a plain data-model dict (AEP-0005 §3; pinned by otlp-expected.json).

The dict keeps the pins' shape (``time_unix_nano``, ``event_name``, ``severity_*``, ``resource``,
``attributes``, ``trace_id``/``span_id``/``flags``, ``body``); ``aep_collector.exporters.otlp.wire`` turns it
into protobuf. Keeping the pure projection apart from the wire is what lets both be pinned.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

CAPTURE_ORDER = ("none", "metadata", "redacted", "full")
RANK = {level: i for i, level in enumerate(CAPTURE_ORDER)}
# AEP-0005 §3.4 (schemas/registry/severity.json ``otlp``); an absent severity is info.
SEVERITY = {
    "debug": ("DEBUG", 5),
    "info": ("INFO", 9),
    "notice": ("INFO2", 10),
    "warning": ("WARN", 13),
    "error": ("ERROR", 17),
    "critical": ("FATAL", 21),
}
# Envelope attribute -> LogRecord attribute when present (``aep.capture`` is always set).
OPTIONAL = (("session", "aep.session_id"), ("run", "aep.run_id"), ("step", "aep.step"), ("seq", "aep.sequence"),
            ("epoch", "aep.epoch"), ("cause", "aep.causation_id"), ("subject", "aep.subject"))
_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$")


def time_unix_nano(stamp: str) -> int:
    """RFC 3339 -> epoch nanoseconds, exactly: whole seconds by datetime, the fraction by its digits.

    A leap second (``:60``, RFC 3339 §5.6) is the next second's start, as POSIX time counts it. A
    time OTLP's ``fixed64`` cannot hold (before 1970, after 2554) raises ValueError: the event is
    left out as unprojectable, where the protobuf's own error, raised for the whole request, had
    the sending queue retry the batch for good."""
    m = _TIME.match(stamp)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    clock, leap = m.group(1), m.group(1).endswith(":60")
    whole = datetime.fromisoformat((clock[:-2] + "59" if leap else clock) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    fraction = int((m.group(2) or "0").ljust(9, "0"))
    nanos = (int(whole.timestamp()) + leap) * 1_000_000_000 + fraction
    if not 0 <= nanos < 1 << 64:
        raise ValueError(f"time {stamp!r} is outside what OTLP's time_unix_nano holds (1970 to 2554)")
    return nanos


def above(capture: str, ceiling: str) -> bool:
    return RANK.get(capture, RANK["full"]) > RANK[ceiling]


def to_otlp(event: dict[str, Any], max_capture: str = "metadata") -> dict[str, Any]:
    """The LogRecord of ``event``. Above ``max_capture`` its data goes entirely (no body, nothing
    hoisted) while ``aep.capture`` still says what the event declared."""
    capture = event.get("capture", "metadata")
    severity = event.get("severity", "info")
    text, number = SEVERITY.get(severity, SEVERITY["info"])
    attrs: dict[str, Any] = {
        "aep.agent_id": event["agent"],
        "aep.event_id": event["id"],
        "aep.capture": capture,
        "aep.source": event["source"],
    }
    for name, key in OPTIONAL:
        if name in event:
            attrs[key] = event[name]
    data = event.get("data")
    if not isinstance(data, dict) or above(capture, max_capture) or capture == "none":
        data = {}
    body = {}
    for key, value in data.items():
        if key.startswith("gen_ai."):
            attrs[key] = value  # top-level gen_ai.* only: OTel GenAI semantic conventions
        else:
            body[key] = value
    record: dict[str, Any] = {
        "time_unix_nano": time_unix_nano(event["time"]),
        "event_name": "dev.aep." + event["type"],
        "severity_text": text,
        "severity_number": number,
        "resource": {"service.name": event["agent"]},
        "attributes": attrs,
    }
    tp = event.get("traceparent")
    if isinstance(tp, str) and tp.count("-") == 3:
        _, trace_id, span_id, flags = tp.split("-")
        record.update(trace_id=trace_id, span_id=span_id, flags=int(flags, 16))
    if body:
        record["body"] = body
    return record
