"""The ``opencode`` receiver: the OpenCode plugin's moments.

``js/opencode-plugin.js`` (dropped into ``.opencode/plugins/``) forwards bus events, the
``tool.execute.before/after`` hooks and the hold-open ``permission.ask``. Control-capable: the
ask is answered over ``control.attention.respond`` (see ``aep_collector.receivers.plugin_vendors.bus``).
OpenCode 1.18 asks on the bus (``permission.asked``), like Kilo >=7.4.6: with ``reply_routes`` on,
an operator's answer is POSTed to OpenCode's own server at the ``serverUrl`` the plugin forwards
(seen live with ``opencode serve``; ``opencode run`` rejects such an ask by itself at once).
"""

from __future__ import annotations

from .bus import declare

AGENT = "opencode"
DECLARATION = declare(AGENT, "OpenCodeConfig", 8390,
                      "OpenCode plugin (js/opencode-plugin.js); held permission.ask and reply-route answers for an operator")
OpenCodeConfig = DECLARATION.config_class
FACTORY = DECLARATION.factory()
