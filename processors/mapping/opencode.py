"""OpenCode plugin moments -> AEP drafts (AEP-0002 Annex A.7; fixture ``mappings/opencode.json``).

The in-process plugin forwards bus events, ``tool.execute.before/after`` and the hold-open
``permission.ask``; the shared family logic and the Signal shape live in
``aep_collector.processors.mapping.plugin_bus``.
"""

from __future__ import annotations

from .plugin_bus import BusFamily
from .plugin_bus import new_state as new_state

AGENT = "opencode"
# OpenCode 1.18.33 asks on the bus (permission.asked / permission.replied {requestID, reply}), seen
# live, and answers on the same server route as Kilo; the opencode.json pins cover only the held
# permission.ask hook and are unaffected.
FAMILY = BusFamily(agent=AGENT)
map_moment, map_signal = FAMILY.map_moment, FAMILY.map_signal  # see BusFamily
