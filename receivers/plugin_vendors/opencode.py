"""The ``opencode`` receiver: the OpenCode plugin's moments.

``js/opencode-plugin.js`` (dropped into ``.opencode/plugins/``) forwards bus events, the
``tool.execute.before/after`` hooks and the hold-open ``permission.ask``. Control-capable: the
ask is answered over ``control.attention.respond`` (see ``aep_collector.receivers.plugin_vendors.bus``).
OpenCode 1.18 asks on the bus (``permission.asked``), like Kilo >=7.4.6: with ``reply_routes`` on,
an operator's answer is POSTed to OpenCode's own server at the ``serverUrl`` the plugin forwards
(seen live with ``opencode serve``; ``opencode run`` rejects such an ask by itself at once).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.processors.mapping import opencode as mapping
from aep_collector.receivers.tool_gate import HeldConfig

from . import install
from .bus import BusSurface

AGENT = mapping.AGENT


@dataclass
class OpenCodeConfig(HeldConfig):
    """Config of the ``opencode`` receiver."""

    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)
    attention_timeout: float = 55.0
    """Seconds a held ``permission.ask`` waits for an operator before ``{}`` (the plugin waits longer)."""
    reply_routes: bool = True
    """Answer bus asks over OpenCode's server route (``POST /session/{id}/permissions/{id}``,
    ``POST /question/{id}/reply``) at the loopback ``serverUrl`` the plugin forwards."""
    reply_route_timeout: float = 5.0
    """Seconds one such POST may take."""

    def validate(self) -> None:
        super().validate()
        if self.reply_route_timeout <= 0:
            raise ValueError("reply_route_timeout must be positive")


DECLARATION = VendorDeclaration.of_mapping(
    mapping, port=8390, config_class=OpenCodeConfig, surface=functools.partial(BusSurface, mapping),
    registration=install.renderer(AGENT),
    description="OpenCode plugin (js/opencode-plugin.js); held permission.ask and reply-route answers for an operator")
FACTORY = DECLARATION.factory()
