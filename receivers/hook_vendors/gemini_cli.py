"""The ``gemini_cli`` receiver: Gemini CLI command hooks, through ``aep-collector-hook gemini-cli``.

Observe-only (reference stack §1.3): no hook here is answerable, so there is no control leg at
all, and every reply is ``{}`` (the shim always exits 0: exit code 2 would block).
"""

from __future__ import annotations

from typing import Any

from aep_collector.receivers.hook_vendors import shim_hooks
from aep_collector.receivers.hook_vendors.surface import HookHandling, declare
from aep_collector.receivers.wiring import HANDLER_NAME, Wiring, json_target

VENDOR = "gemini-cli"
# AfterModel fires per streamed chunk: mapped when sent, but not registered by default (§1.3).
UNREGISTERED = frozenset({"AfterModel"})


HANDLING = HookHandling()


def registration(url: str | None, cfg: Any) -> Wiring:
    """The ``settings.json`` ``hooks`` block, every registered hook through the shim.

    Format (geminicli.com/docs/hooks/reference, "Configuration schema"): ``hooks.<Event>`` is a
    list of definitions ``{matcher?, hooks: [{type: "command", command, name, timeout}]}``;
    timeout is in MILLISECONDS (default 60000); no matcher runs for every tool. Stable-channel
    builds need ``hooksConfig.enabled``.
    """
    hooks = {name: [{"hooks": [{"type": "command", "name": HANDLER_NAME, "command": command,
                                "timeout": timeout * 1000}]}]
             for name, command, timeout in shim_hooks.registered(VENDOR, url, cfg, UNREGISTERED)}
    block = {"hooksConfig": {"enabled": True}, "hooks": hooks}
    return Wiring(VENDOR, [json_target(".gemini/settings.json", block)], [
        "merge into ~/.gemini/settings.json (or .gemini/settings.json in a project), "
        "or run: aep-collector hooks gemini-cli --install",
        "Gemini CLI loads hooks only in a trusted folder: trust the project folder when gemini asks, "
        "or add it to ~/.gemini/trustedFolders.json as {\"/abs/project\": \"TRUST_FOLDER\"}"])


# Gemini CLI hooks decide through exit code 2 or JSON on stdout; exit 0 with the family's neutral
# `{}` changes nothing.
DECLARATION = declare(VENDOR, HANDLING, 8379, registration,
                      "Gemini CLI command hooks via aep-collector-hook (POST /hook); observe-only")
GeminiCliConfig = DECLARATION.config_class  # made by declare (vendor_config), exported here under its name
FACTORY = DECLARATION.factory()
