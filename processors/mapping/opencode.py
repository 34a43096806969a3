"""OpenCode plugin moments -> AEP drafts (AEP-0002 Annex A.7; fixture ``mappings/opencode.json``).

The in-process plugin forwards bus events, ``tool.execute.before/after`` and the hold-open
``permission.ask``; the shared family logic and the Signal shape live in
``aep_collector.processors.mapping.plugin_bus``.
"""

from __future__ import annotations

from . import plugin_bus
from .plugin_bus import REPLY_ROUTE_OPTIONS, diff_todos, new_state, session_of

__all__ = ["AGENT", "FAMILY", "REPLY_ROUTE_OPTIONS", "new_state", "map_signal", "map_moment", "diff_todos",
           "session_of"]

AGENT = "opencode"
# OpenCode 1.18.33 asks on the bus (permission.asked / permission.replied {requestID, reply}), seen
# live, and answers on the same server route as Kilo; the opencode.json pins cover only the held
# permission.ask hook and are unaffected.
FAMILY = plugin_bus.BusFamily(agent=AGENT, reply_routes=True)
map_moment = FAMILY.map_moment
"""One fixture moment (``{kind, ...}``) -> one draft, or None."""
map_signal = FAMILY.map_signal
"""A plugin POST -> drafts, with runs, todo diffs, callID pairing and dedupe from the ``BusState``."""
