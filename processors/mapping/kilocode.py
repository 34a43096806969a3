"""Kilo Code plugin moments -> AEP drafts (AEP-0002 Annex A.8; fixture ``mappings/kilocode.json``).

Kilo Code is an OpenCode fork: the OpenCode table on its own identity (``aep_collector.processors.mapping.plugin_bus``
holds the shared logic and the Signal shape), plus the dual permission surface:
``<=7.4.5`` the held ``permission.ask`` hook; ``>=7.4.6`` bus ``permission.asked``/``question.asked``
answered over REST (the receiver's ``bus_replies``; the server address is ``PluginInput.serverUrl``,
forwarded by the plugin).
"""

from __future__ import annotations

from . import plugin_bus
from .plugin_bus import REPLY_ROUTE_OPTIONS, diff_todos, new_state, session_of

__all__ = ["AGENT", "FAMILY", "REPLY_ROUTE_OPTIONS", "new_state", "map_signal", "map_moment", "diff_todos",
           "session_of"]

AGENT = "kilocode"
FAMILY = plugin_bus.BusFamily(agent=AGENT, reply_routes=True)
map_moment = FAMILY.map_moment
"""One fixture moment (``{kind, ...}``) -> one draft, or None."""
map_signal = FAMILY.map_signal
"""A plugin POST -> drafts, with runs, todo diffs, callID pairing and dedupe from the ``BusState``."""
