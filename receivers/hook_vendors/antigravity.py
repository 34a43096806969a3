"""The ``antigravity`` receiver: Antigravity ``hooks.json`` command hooks, via the shim.

No Antigravity payload names its own hook (reference stack §1.11), so the event name comes as
``POST /hook?hook=<EventName>``; the registration passes it to the shim as its EVENT argument.
A request without ``?hook=`` is refused with a 400 ``missing-hook`` (nothing can be mapped
without it; the shim then prints the neutral reply). Names are matched case-insensitively, and
unknown names are accepted: they map to ``x.antigravity.hook.<name>`` (the fixture's fallback).
Observe-only, no control leg; replies are byte-pinned: ``{"decision": ""}`` on PreToolUse and
Stop, ``{}`` elsewhere (the shim prints exactly those bytes).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from aep_collector.receivers.hook_vendors import shim_hooks
from aep_collector.receivers.hook_vendors.surface import NEUTRAL_REPLY, HookHandling, declare
from aep_collector.receivers.registration import mapped_hooks
from aep_collector.receivers.wiring import Wiring, json_target

VENDOR = "antigravity"
# Byte-pinned observe-only replies (reference stack §1.11; design record "Observe-only"): the
# vendor safely handles an empty decision string since CLI 1.0.16, so PreToolUse never grants,
# blocks or prompts, and Stop never prolongs the loop ("continue"). Every other hook gets `{}`
# (the family's NEUTRAL_REPLY: no injectSteps, no terminationBehavior); the surface calls
# `neutral_reply(hook)`.
NEUTRAL_REPLIES: dict[str, dict[str, str]] = {"PreToolUse": {"decision": ""}, "Stop": {"decision": ""}}
_BY_NAME = {hook.lower(): reply for hook, reply in NEUTRAL_REPLIES.items()}
TOOL_HOOKS = frozenset({"PreToolUse", "PostToolUse"})


def neutral_reply(hook: str) -> dict[str, Any]:
    """The fail-open reply body for ``hook``, its name in any case (a fresh dict; serialize with ``json.dumps``)."""
    return dict(_BY_NAME.get(hook.strip().lower(), NEUTRAL_REPLY))


def canonical(name: str) -> str:
    """The documented spelling of a ``?hook=`` name given in any case (the mapped hook list's); other
    names pass through, so the mapping files them under its fallback."""
    return _spellings().get(name.strip().lower(), name.strip())


@cache
def _spellings() -> dict[str, str]:
    return {hook.lower(): hook for hook in mapped_hooks(VENDOR)}


def exact_neutral(hook: str) -> bytes:
    """Reference stack §1.11 pins the bytes: ``{"decision": ""}`` (with the space) on PreToolUse
    and Stop, ``{}`` elsewhere; json.dumps' default separators give exactly that."""
    return json.dumps(neutral_reply(hook)).encode()


HANDLING = HookHandling(name_keys=(), neutral=exact_neutral, canonical=canonical)


def registration(url: str | None, cfg: Any) -> Wiring:
    """A ``hooks.json`` named hook registering the five events, each passing its name to the shim.

    Format (hooks.json as Antigravity loads it): top-level keys are hook names; ``PreToolUse`` /
    ``PostToolUse`` take ``{matcher, hooks: [handler]}`` groups (``"*"`` = every tool), the other
    events a flat list of handlers ``{type: "command", command, timeout}`` (whole seconds, default
    30). An unknown key is dropped silently and a malformed file loads nothing.
    """
    events: dict[str, Any] = {}
    for name, command, timeout in shim_hooks.registered(VENDOR, url, cfg):
        handler = {"type": "command", "command": command, "timeout": timeout}
        events[name] = [{"matcher": "*", "hooks": [handler]}] if name in TOOL_HOOKS else [handler]
    return Wiring(VENDOR, [json_target(".gemini/config/hooks.json", {"aep-collector": events})], [
        "merge into ~/.gemini/config/hooks.json (or <workspace>/.agents/hooks.json); CLI >= 1.0.16; "
        "or run: aep-collector hooks antigravity --install"])


DECLARATION = declare(VENDOR, HANDLING, 8395, registration,
                      "Antigravity hooks.json command hooks via aep-collector-hook (POST /hook?hook=)",
                      needs_event=True,  # its payloads never name their hook
                      # Reference stack §1.11 pins the bytes on the hooks whose reply is not `{}`.
                      neutral_by_event={h: exact_neutral(h) for h in NEUTRAL_REPLIES})
FACTORY = DECLARATION.factory()
