"""The emitter side of the WebSocket binding as plain data: hello, frame kinds, backoff (AEP-0003 §2, §4)."""

from __future__ import annotations

import random
import re
from typing import Any

from aep_collector.pipeline.model import Event
from aep_collector.pipeline.wire import DecodeError, loads

VERSIONS = ("0.1",)
LEVELS = ("none", "metadata", "redacted", "full")
CAPTURE = LEVELS[:3]
"""What every hello declares in ``capabilities.capture``; ``capped`` keeps each event within it."""
CATEGORIES = frozenset({"agent", "session", "run", "progress", "tool", "delegation", "attention",
                        "resource", "error", "state", "assessment", "message", "control"})
ACKS = frozenset({"control.accepted", "control.rejected"})
_VENDOR_COMMAND = re.compile(r"^x\.[a-z0-9_-]+\.control\.")


def capped(event: Event) -> Event:
    """``event`` as it may go on a connection whose hello declared ``CAPTURE``: down-levelled when it
    claims more (a pipeline at ``full``) or a level no one knows; otherwise the same object."""
    declared = event.get("capture", "metadata")
    if declared in CAPTURE:
        return event
    # The AEP-0001 §8.2 hop algorithm, shared with the capture processor (a pure function).
    from aep_collector.processors.capture.ceiling import downlevel

    return downlevel(event, CAPTURE[-1])


def category(event_type: str) -> str | None:
    """The category an event type belongs to, for ``capabilities.emits``; None when it names none."""
    parts = event_type.split(".")
    name = parts[2] if parts[0] == "x" and len(parts) > 2 else parts[0]
    return name if name in CATEGORIES else None


def hello(agent: str, instance: str, emits: list[str], accepts: list[str] | None,
          ack_window_ms: int) -> dict[str, Any]:
    """The emitter's hello; ``accepts`` None means no control leg, so no ``control`` block (AEP-0004 §4)."""
    capabilities: dict[str, Any] = {"emits": sorted(emits), "capture": list(CAPTURE)}
    if accepts is not None:
        capabilities["control"] = {"accepts": list(accepts), "ack_window_ms": ack_window_ms}
    return {"type": "hello", "versions": list(VERSIONS), "role": "emitter",
            "identity": {"agent": agent, "instance": instance}, "capabilities": capabilities}


def parse(text: str | bytes) -> dict[str, Any] | None:
    """A text frame's JSON object, or None for binary, undecodable or non-object frames."""
    if not isinstance(text, str):
        return None  # AEP-0003 §2: binary frames are reserved in 0.1
    try:
        value = loads(text)  # the collector's one decoder: lone surrogates become U+FFFD here too
    except DecodeError:
        return None
    return value if isinstance(value, dict) else None


def is_event(frame: dict[str, Any]) -> bool:
    """AEP-0003 §2: a frame whose ``type`` has a dot is an Event; otherwise a connection frame."""
    kind = frame.get("type")
    return isinstance(kind, str) and "." in kind


def is_command(event_type: str) -> bool:
    """An inbound command for the target: ``control.*`` but the acks, or ``x.{vendor}.control.*``."""
    if event_type.startswith("control."):
        return event_type not in ACKS
    return _VENDOR_COMMAND.match(event_type) is not None


def hello_problem(frame: dict[str, Any] | None) -> tuple[str, str] | None:
    """Why the relay's first frame is not an acceptable hello, as ``(cause, detail)``; None when it is."""
    if frame is None:
        return "bad-hello", "the relay's first frame is not a JSON object"
    kind = frame.get("type")
    if kind == "error":
        code = str(frame.get("code", "error"))
        if code == "version-unsupported":
            return code, f"the relay supports {frame.get('versions')!r}, this exporter speaks {list(VERSIONS)!r}"
        if code == "hello-required":
            return code, "the relay did not take our hello as the first frame"
        return "hello-refused", f"the relay answered the hello with error {code!r}: {frame.get('detail', '')}"
    if kind != "hello":
        return "bad-hello", f"the relay's first frame is {kind!r}, not hello"
    versions = frame.get("versions")
    # AEP-0003 §4: the responder's hello selects exactly one version.
    if not isinstance(versions, list) or len(versions) != 1:
        return "bad-hello", f"the relay's hello must select exactly one version, got {versions!r}"
    if versions[0] not in VERSIONS:
        return "bad-hello", f"the relay selected version {versions[0]!r}, which this exporter did not offer"
    return None


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(maximum, initial * 2**attempt)]."""
    ceiling = min(maximum, initial * (2 ** min(attempt, 32)))
    return (rng or random).uniform(0.0, ceiling)
