"""The ``qwen_code`` receiver: Qwen Code's native ``http`` hooks.

Qwen Code POSTs each hook's JSON straight here (reference stack §1.4; ``aep-collector-hook
qwen-code`` serves command-hook deployments). A ``PermissionRequest`` is held for an operator
while a control route is live, exactly as Claude Code's; ``{}`` is neutral everywhere.
"""

from __future__ import annotations

from typing import Any

from aep_collector.receivers.hook_replies import permission_reply
from aep_collector.receivers.hook_vendors import shim_hooks
from aep_collector.receivers.hook_vendors.surface import HookHandling, HookHeldConfig, declare
from aep_collector.receivers.registration import hook_url, mapped_hooks
from aep_collector.receivers.wiring import HANDLER_NAME, Wiring, json_target

VENDOR = "qwen-code"
TOOL_HOOKS = frozenset({"PreToolUse", "PostToolUse", "PostToolUseFailure", "PermissionRequest",
                        "PermissionDenied"})


HANDLING = HookHandling(permission_reply=permission_reply,
                        dismissed_by=frozenset({"PostToolUse", "PostToolUseFailure", "PermissionDenied"}),
                        session_end=frozenset({"SessionEnd"}))


def registration(url: str | None, cfg: Any) -> Wiring:
    """The ``settings.json`` ``hooks`` block with native ``http`` hooks to the receiver.

    Format (Qwen Code docs, users/features/hooks "HTTP Hooks"): ``{type: "http", url, timeout,
    name}``, timeout in SECONDS (default 600); loopback URLs pass its SSRF guard.
    """
    target = hook_url(url, cfg.endpoint if cfg is not None else DECLARATION.endpoint)
    hooks: dict[str, Any] = {}
    for name in mapped_hooks(VENDOR):
        handler = {"type": "http", "url": target, "name": HANDLER_NAME,
                   "timeout": shim_hooks.hook_timeout(VENDOR, name, cfg)}
        entry: dict[str, Any] = {"hooks": [handler]}
        if name in TOOL_HOOKS:
            entry = {"matcher": "*", **entry}
        hooks[name] = [entry]
    return Wiring(VENDOR, [json_target(".qwen/settings.json", {"hooks": hooks})], [
        "merge into ~/.qwen/settings.json (or .qwen/settings.json in a project), "
        "or run: aep-collector hooks qwen-code --install"])


# Qwen Code hooks docs ("Hook Output Structure"): exit 0 with a JSON object whose every field is
# optional; the family's neutral `{}` asks for nothing and decides nothing.
DECLARATION = declare(VENDOR, HANDLING, 8380, registration,
                      "Qwen Code native http hooks (POST /hook); held PermissionRequest", keys=HookHeldConfig)
QwenCodeConfig = DECLARATION.config_class  # made by declare (vendor_config), exported here under its name
FACTORY = DECLARATION.factory()
