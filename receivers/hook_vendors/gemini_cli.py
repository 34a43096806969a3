"""The ``gemini_cli`` receiver: Gemini CLI command hooks, through ``aep-collector-hook gemini-cli``, on 8379.

Observe-only (reference stack §1.3): no hook here is answerable, so there is no control leg at
all, and every reply is ``{}`` (the shim always exits 0: exit code 2 would block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.processors.mapping import gemini_cli
from aep_collector.receivers.hook_http import HookReceiverConfig
from aep_collector.receivers.hook_vendors import blocks
from aep_collector.receivers.hook_vendors.surface import HookVendorSurface, Spec
from aep_collector.receivers.wiring import Wiring, json_target

VENDOR = "gemini-cli"
# AfterModel fires per streamed chunk: mapped when sent, but not registered by default (§1.3).
HOOKS = tuple(h for h in gemini_cli.HOOKS if h != "AfterModel")


@dataclass
class GeminiCliConfig(HookReceiverConfig):
    """Config of the ``gemini_cli`` receiver."""

    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)


SPEC = Spec(mapping=gemini_cli)


def registration(url: str | None, cfg: Any) -> Wiring:
    """The ``settings.json`` ``hooks`` block, every registered hook through the shim.

    Format (geminicli.com/docs/hooks/reference, "Configuration schema"): ``hooks.<Event>`` is a
    list of definitions ``{matcher?, hooks: [{type: "command", command, name, timeout}]}``;
    timeout is in MILLISECONDS (default 60000); no matcher runs for every tool. Stable-channel
    builds need ``hooksConfig.enabled``.
    """
    hooks = {}
    for name in HOOKS:
        command, timeout = blocks.shim_hook(VENDOR, name, url, cfg)
        hooks[name] = [{"hooks": [{"type": "command", "name": "aep-collector", "command": command,
                                   "timeout": timeout * 1000}]}]
    block = {"hooksConfig": {"enabled": True}, "hooks": hooks}
    return Wiring(VENDOR, [json_target(".gemini/settings.json", block)], [
        "merge into ~/.gemini/settings.json (or .gemini/settings.json in a project), "
        "or run: aep-collector hooks gemini-cli --install",
        "Gemini CLI loads hooks only in a trusted folder: trust the project folder when gemini asks, "
        "or add it to ~/.gemini/trustedFolders.json as {\"/abs/project\": \"TRUST_FOLDER\"}"])


DECLARATION = VendorDeclaration(
    agent='gemini-cli', receiver_type='gemini_cli', port=8379, config_class=GeminiCliConfig,
    surface=lambda cfg, component: HookVendorSurface(SPEC, cfg, component),
    mapping=gemini_cli.__name__, registration=registration, hooks=HOOKS, neutral_reply=gemini_cli.NEUTRAL_REPLY,
    description='Gemini CLI command hooks via aep-collector-hook (POST /hook) on 127.0.0.1:8379; observe-only',
)
FACTORY = DECLARATION.factory()
