"""The ``opencode`` receiver: the OpenCode plugin's moments on ``127.0.0.1:8390``.

``js/opencode-plugin.js`` (dropped into ``.opencode/plugins/``) forwards bus events, the
``tool.execute.before/after`` hooks and the hold-open ``permission.ask``. Control-capable: the
ask is answered over ``control.attention.respond`` (see ``receivers.plugin_vendors.bus``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.component import Factory, Kind
from processors.mapping import opencode as mapping
from receivers.gate import HeldConfig
from receivers.hook_http import HookServer

from .bus import BusSurface

AGENT = mapping.AGENT


@dataclass
class OpenCodeConfig(HeldConfig):
    """Config of the ``opencode`` receiver."""

    endpoint: str = "127.0.0.1:8390"
    attention_timeout: float = 55.0
    """Seconds a held ``permission.ask`` waits for an operator before ``{}`` (the plugin waits longer)."""


FACTORY = Factory(
    kind=Kind.RECEIVER,
    type="opencode",
    config_class=OpenCodeConfig,
    create=lambda settings, cfg, next_consumer: HookServer(
        settings, cfg, next_consumer, BusSurface(mapping, cfg, f"receiver/{settings.id}")),
    description="OpenCode plugin (js/opencode-plugin.js) on 127.0.0.1:8390; holds permission.ask for an operator",
)
