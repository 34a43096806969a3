"""The ``gemini_cli`` receiver: Gemini CLI command hooks, through ``aep-collector-hook gemini-cli``.

Observe-only (reference stack §1.3): no hook here is answerable, so there is no control leg at
all, and every reply is ``{}`` (the shim always exits 0: exit code 2 would block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aep_collector.receivers.hook_http import HookReceiverConfig
from aep_collector.receivers.hook_vendors import shim_hooks
from aep_collector.receivers.hook_vendors.surface import HookHandling, declare
from aep_collector.receivers.registration import mapped_hooks
from aep_collector.receivers.wiring import Wiring, json_target

VENDOR = "gemini-cli"
MAPPING = "aep_collector.processors.mapping.gemini_cli"
# AfterModel fires per streamed chunk: mapped when sent, but not registered by default (§1.3).
UNREGISTERED = frozenset({"AfterModel"})
# Gemini CLI hooks decide through exit code 2 or JSON on stdout; exit 0 with `{}` changes nothing.
NEUTRAL_REPLY: dict[str, Any] = {}


@dataclass
class GeminiCliConfig(HookReceiverConfig):
    """Config of the ``gemini_cli`` receiver."""

    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)


HANDLING = HookHandling()


def registration(url: str | None, cfg: Any) -> Wiring:
    """The ``settings.json`` ``hooks`` block, every registered hook through the shim.

    Format (geminicli.com/docs/hooks/reference, "Configuration schema"): ``hooks.<Event>`` is a
    list of definitions ``{matcher?, hooks: [{type: "command", command, name, timeout}]}``;
    timeout is in MILLISECONDS (default 60000); no matcher runs for every tool. Stable-channel
    builds need ``hooksConfig.enabled``.
    """
    hooks = {}
    for name in mapped_hooks(VENDOR, UNREGISTERED):
        command, timeout = shim_hooks.shim_hook(VENDOR, name, url, cfg)
        hooks[name] = [{"hooks": [{"type": "command", "name": "aep-collector", "command": command,
                               "timeout": timeout * 1000}]}]
    block = {"hooksConfig": {"enabled": True}, "hooks": hooks}
    return Wiring(VENDOR, [json_target(".gemini/settings.json", block)], [
        "merge into ~/.gemini/settings.json (or .gemini/settings.json in a project), "
        "or run: aep-collector hooks gemini-cli --install",
        "Gemini CLI loads hooks only in a trusted folder: trust the project folder when gemini asks, "
        "or add it to ~/.gemini/trustedFolders.json as {\"/abs/project\": \"TRUST_FOLDER\"}"])


DECLARATION = declare(VENDOR, MAPPING, HANDLING, GeminiCliConfig, 8379, registration,
                      "Gemini CLI command hooks via aep-collector-hook (POST /hook); observe-only",
                      neutral_reply=NEUTRAL_REPLY)
FACTORY = DECLARATION.factory()
