"""The ``kilocode`` receiver: the Kilo Code plugin's moments.

``js/kilocode-plugin.js`` (a ``{ server }`` module in the config's ``plugin`` array) forwards bus
events, ``tool.execute.before/after`` and, on Kilo <=7.4.5, the hold-open ``permission.ask``.
Kilo >=7.4.6 asks on the bus instead (``permission.asked``, ``question.asked``); with
``reply_routes`` on, an operator's answer is POSTed to Kilo's own server (see
``aep_collector.receivers.plugin_vendors.bus``).
"""

from __future__ import annotations

from .bus import declare

AGENT = "kilocode"
DECLARATION = declare(AGENT, "KiloCodeConfig", 8391,
                      "Kilo Code plugin (js/kilocode-plugin.js); held permission.ask and reply-route answers for an operator")
KiloCodeConfig = DECLARATION.config_class
FACTORY = DECLARATION.factory()
