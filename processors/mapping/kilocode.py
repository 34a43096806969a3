"""Kilo Code plugin moments -> AEP drafts (AEP-0002 Annex A.8; fixture ``mappings/kilocode.json``).

Kilo Code is an OpenCode fork: the OpenCode table on its own identity (``aep_collector.processors.mapping.plugin_bus``
holds the shared logic and the Signal shape), plus the dual permission surface:
``<=7.4.5`` the held ``permission.ask`` hook; ``>=7.4.6`` bus ``permission.asked``/``question.asked``
answered over REST (the receiver's ``bus_replies``; the server address is ``PluginInput.serverUrl``,
forwarded by the plugin).
"""

from __future__ import annotations

from .plugin_bus import BusFamily
from .plugin_bus import new_state as new_state

AGENT = "kilocode"
FAMILY = BusFamily(agent=AGENT)
map_moment, map_signal = FAMILY.map_moment, FAMILY.map_signal  # see BusFamily
