"""Quill hook calls -> AEP event drafts (pure: the signal in, drafts out)."""

from __future__ import annotations

from typing import Any

from aep_collector.api import Signal

AGENT = "quill"


def new_state() -> None:
    """Quill's mapping keeps no state."""
    return None


def map_signal(signal: Signal, state: None) -> list[dict[str, Any]]:
    payload = signal.payload if isinstance(signal.payload, dict) else {}
    session = payload.get("session")
    if signal.name == "begin":
        return [{"type": "session.started", "session": session, "data": {"client": {"name": AGENT}}}]
    if signal.name == "ask":
        data: dict[str, Any] = {"trigger": "user"}
        if isinstance(payload.get("prompt"), str):
            data["prompt"] = payload["prompt"]
        return [{"type": "run.started", "session": session, "data": data}]
    if signal.name == "done":
        return [{"type": "run.finished", "session": session, "data": {}}]
    if signal.name == "end":
        return [{"type": "session.ended", "session": session, "data": {"reason": "normal"}}]
    return []
