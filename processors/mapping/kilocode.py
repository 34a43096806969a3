"""Kilo Code plugin moments -> AEP drafts (AEP-0002 Annex A.8; fixture ``mappings/kilocode.json``).

Kilo Code is an OpenCode fork: the OpenCode table on its own identity (``aep_collector.processors.mapping.plugin_bus``
holds the shared logic, the Signal shape and the reply contract), plus the dual permission surface:
``<=7.4.5`` the held ``permission.ask`` hook (``output.status``, ``permission_reply``); ``>=7.4.6`` bus
``permission.asked``/``question.asked`` answered over REST (``permission_route_body``,
``question_route_body``; the server address is ``PluginInput.serverUrl``, forwarded by the plugin).
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

__all__ = ["AGENT", "NEUTRAL_REPLY", "FAMILY", "REPLY_ROUTE_OPTIONS", "new_state", "map_signal",
           "map_moment", "diff_todos", "attention_key", "allow_reply", "deny_reply",
           "permission_reply", "permission_route", "permission_route_body", "question_route",
           "question_route_body"]

AGENT = "kilocode"
FAMILY = plugin_bus.BusFamily(agent=AGENT, reply_routes=True)


def map_moment(moment: Any) -> Event | None:
    """One fixture moment (``{kind, ...}``) -> one draft, or None."""
    return FAMILY.map_moment(moment)


def map_signal(signal: Signal, state: BusState) -> list[Event]:
    """A plugin POST -> drafts, with runs, todo diffs, callID pairing and dedupe from ``state``."""
    return FAMILY.map_signal(signal, state)
