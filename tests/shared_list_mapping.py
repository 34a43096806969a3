"""A plug-in-style mapping that hands back module-level objects: one list for "nothing to emit"
and one constant draft, the same objects on every call (nothing in the mapping contract forbids
it). ``tests/test_mapping_ownership.py`` maps it through the processor."""

from __future__ import annotations

from typing import Any

AGENT = "shared-list"
NOTHING: list[dict[str, Any]] = []
PING: list[dict[str, Any]] = [{"type": "progress.note", "session": "s1", "data": {"note": "ping"}}]


def new_state() -> None:
    return None


def map_signal(signal: Any, state: None) -> list[dict[str, Any]]:
    return PING if signal.name == "Ping" else NOTHING
