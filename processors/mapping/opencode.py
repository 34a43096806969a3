"""OpenCode plugin moments -> AEP drafts (AEP-0002 Annex A.7; fixture ``mappings/opencode.json``).

The in-process plugin forwards bus events, ``tool.execute.before/after`` and the hold-open
``permission.ask``; the shared family logic, the Signal shape and the reply contract live in
``aep_collector.processors.mapping.plugin_bus``.
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Event, Signal

from . import plugin_bus
from .plugin_bus import (
    NEUTRAL_REPLY,
    REPLY_ROUTE_OPTIONS,
    BusState,
    allow_reply,
    attention_key,
    deny_reply,
    diff_todos,
    new_state,
    permission_reply,
    permission_route,
    permission_route_body,
    question_route,
    question_route_body,
)

__all__ = ["AGENT", "NEUTRAL_REPLY", "FAMILY", "REPLY_ROUTE_OPTIONS", "new_state", "map_signal", "map_moment",
           "diff_todos", "attention_key", "allow_reply", "deny_reply", "permission_reply",
           "permission_route", "permission_route_body", "question_route", "question_route_body"]

AGENT = "opencode"
# OpenCode 1.18.33 asks on the bus (permission.asked / permission.replied {requestID, reply}), seen
# live, and answers on the same server route as Kilo; the opencode.json pins cover only the held
# permission.ask hook and are unaffected.
FAMILY = plugin_bus.BusFamily(agent=AGENT, reply_routes=True)


def map_moment(moment: Any) -> Event | None:
    """One fixture moment (``{kind, ...}``) -> one draft, or None."""
    return FAMILY.map_moment(moment)


def map_signal(signal: Signal, state: BusState) -> list[Event]:
    """A plugin POST -> drafts, with runs, todo diffs, callID pairing and dedupe from ``state``."""
    return FAMILY.map_signal(signal, state)
