"""The ``codex`` receiver: Codex command hooks, through ``aep-collector-hook codex``.

Codex has no HTTP hook type (reference stack §1.2): each firing runs the shim, which POSTs the
payload here and prints the reply. ``hook_event_name`` names the moment; ``{}`` is neutral.
A ``PermissionRequest`` is held for an operator while a control route is live; the answer
becomes Codex's ``hookSpecificOutput.decision``.
"""

from __future__ import annotations

from typing import Any

from aep_collector.receivers.hook_replies import permission_reply
from aep_collector.receivers.hook_vendors import shim_hooks
from aep_collector.receivers.hook_vendors.surface import HookHandling, HookHeldConfig, declare
from aep_collector.receivers.wiring import Wiring, json_target

VENDOR = "codex"


HANDLING = HookHandling(permission_reply=permission_reply,
                        # Codex has no failure twin: PostToolUse is the only moment the tool is known to have run.
                        dismissed_by=frozenset({"PostToolUse"}),
                        # Codex 0.169 fires SessionEnd (session.ended): nothing held may outlive it.
                        session_end=frozenset({"SessionEnd"}))


def registration(url: str | None, cfg: Any) -> Wiring:
    """``~/.codex/hooks.json`` (``$CODEX_HOME``), every mapped hook through the shim (the ten Annex
    A.2 maps, and SessionEnd, fired by Codex 0.169).

    Format (developers.openai.com/codex/hooks; Codex 0.169.0 reads it): ``hooks.<Event>`` is a
    list of groups ``{matcher?, hooks: [{type: "command", command, timeout}]}``; timeout in
    seconds (default 600); a group without ``matcher`` runs for every tool. Codex runs a new or
    changed hook only once it is trusted, keyed on the hook's content: a reinstall that changes
    nothing writes the same bytes and keeps that trust.
    """
    hooks = {name: [{"hooks": [{"type": "command", "command": command, "timeout": timeout}]}]
             for name, command, timeout in shim_hooks.registered(VENDOR, url, cfg)}
    return Wiring(VENDOR, [json_target("hooks.json", {"hooks": hooks}, "CODEX_HOME:.codex")], [
        "save as ~/.codex/hooks.json (or merge; $CODEX_HOME moves it), or run: aep-collector hooks codex --install",
        "Codex runs these hooks only once trusted, and skips untrusted ones silently: open `codex`, "
        "run /hooks and trust the aep-collector hooks; for one headless run pass "
        "`codex exec --dangerously-bypass-hook-trust`",
        "earlier aep-collector versions printed [hooks] tables for ~/.codex/config.toml: remove them, "
        "Codex runs the hooks of both files"])


# Codex hooks read stdout as JSON only on exit 0; an empty object decides nothing (every field of
# its hook output wire schemas defaults): the family's neutral `{}` fits.
DECLARATION = declare(VENDOR, HANDLING, 8378, registration,
                      "Codex command hooks via aep-collector-hook (POST /hook); held PermissionRequest",
                      keys=HookHeldConfig)
CodexConfig = DECLARATION.config_class  # made by declare (vendor_config), exported here under its name
FACTORY = DECLARATION.factory()
