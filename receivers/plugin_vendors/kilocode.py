"""The ``kilocode`` receiver: the Kilo Code plugin's moments.

``js/kilocode-plugin.js`` (a ``{ server }`` module in the config's ``plugin`` array) forwards bus
events, ``tool.execute.before/after`` and, on Kilo <=7.4.5, the hold-open ``permission.ask``.
Kilo >=7.4.6 asks on the bus instead (``permission.asked``, ``question.asked``); with
``reply_routes`` on, an operator's answer is POSTed to Kilo's own server (see
``aep_collector.receivers.plugin_vendors.bus``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.processors.mapping import kilocode as mapping
from aep_collector.receivers.tool_gate import HeldConfig

from . import install
from .bus import BusSurface

AGENT = mapping.AGENT


@dataclass
class KiloCodeConfig(HeldConfig):
    """Config of the ``kilocode`` receiver."""

    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)
    attention_timeout: float = 55.0
    """Seconds a held ask waits for an operator (the plugin's own hold bound is above it)."""
    reply_routes: bool = True
    """Answer >=7.4.6 bus asks over Kilo's server routes (``POST /session/{id}/permissions/{id}``,
    ``POST /question/{id}/reply``) at the loopback ``serverUrl`` the plugin forwards."""
    reply_route_timeout: float = 5.0
    """Seconds one such POST may take."""

    def validate(self) -> None:
        super().validate()
        if self.reply_route_timeout <= 0:
            raise ValueError("reply_route_timeout must be positive")


DECLARATION = VendorDeclaration.of_mapping(
    mapping, port=8391, config_class=KiloCodeConfig, surface=functools.partial(BusSurface, mapping),
    registration=install.renderer(AGENT),
    description="Kilo Code plugin (js/kilocode-plugin.js); held permission.ask and reply-route answers for an operator")
FACTORY = DECLARATION.factory()
