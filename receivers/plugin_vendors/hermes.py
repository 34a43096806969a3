"""The ``hermes`` receiver: Hermes Agent shell hooks, through the shared shim.

Hermes runs each ``hooks:`` entry of ``~/.hermes/config.yaml`` with the stdin envelope
``{hook_event_name, tool_name, tool_input, session_id, cwd, extra}`` (NousResearch/hermes-agent
``agent/shell_hooks.py``); the entry's command is ``aep-collector-hook hermes``, which POSTs it
here. ``{}`` proceeds untouched on every hook.

Observe-only by default. With ``control: true`` (``AEP_HERMES_CONTROL=1`` in the default config)
a ``pre_tool_call`` whose tool matches ``gate_tools`` is held as an Allow/Deny request; a deny is
the vendor's block directive ``{"action": "block", "message": ...}``, an allow is ``{}`` (the call
goes on into Hermes' own approval gate), a timeout or a hung-up shim is ``{}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.control import PERMISSION_OPTIONS, attention_key
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.payload import get_dict, get_str
from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.receivers.hook_http import FailOpenDelivery
from aep_collector.receivers.tool_gate import GateConfig, StrictGateSurface
from aiohttp import web

from . import install
from .moments import need_name, observe, unwrap

AGENT = "hermes"
MAPPING = "aep_collector.processors.mapping.hermes"

# NousResearch/hermes-agent agent/shell_hooks.py `_parse_response`: empty stdout or a JSON object
# without `action`/`decision` (pre_tool_call) or a non-empty `context` (elsewhere) is no directive,
# so `{}` lets every hook proceed untouched.
NEUTRAL_REPLY: dict[str, Any] = {}

_DEFAULT_DENY = "Denied by the operator (AEP)."


def deny_reply(reason: str | None = None) -> dict[str, Any]:
    """The ``pre_tool_call`` block directive for a denial (the vendor requires a non-empty message)."""
    # agent/shell_hooks.py `_parse_pre_tool_call`: {"action": "block", "message": ...} is canonical.
    text = reason.strip() if isinstance(reason, str) else ""
    return {"action": "block", "message": text or _DEFAULT_DENY}


def context_reply(text: str | None) -> dict[str, Any]:
    """The ``pre_llm_call`` context injection (steering); empty text is the neutral reply."""
    if isinstance(text, str) and text.strip():
        return {"context": text}
    return dict(NEUTRAL_REPLY)


@dataclass
class HermesConfig(GateConfig):
    """Config of the ``hermes`` receiver (``control``, ``gate_tools``, ``attention_timeout``: the gate)."""

    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)


class HermesSurface(StrictGateSurface):
    """Hermes' side of the shared hook server, with the opt-in operator-deny gate."""

    agent = AGENT
    neutral_reply = NEUTRAL_REPLY

    def __init__(self, config: HermesConfig, component: str = "receiver/hermes") -> None:
        super().__init__(config, component, PERMISSION_OPTIONS)  # the gate is binary: allow | deny

    def signal(self, payload: dict[str, Any], request: web.Request) -> Signal:
        body, given = unwrap(payload, request)
        own = body.get("hook_event_name")
        name = own if isinstance(own, str) and own else given
        return Signal(agent=AGENT, name=need_name(name, "hook_event_name"), payload=body)

    async def handle(self, signal: Signal, deliver: FailOpenDelivery) -> Any:
        p = signal.payload
        if signal.name == "pre_tool_call" and self.gate.gates(p.get("tool_name")):
            key = attention_key("gate", get_str(get_dict(p, "extra"), "tool_call_id"))
            applied = await self.gate.decide(signal, key, self.validate)
            if applied is not None and applied.option == "deny":
                return deny_reply(applied.text)  # the block directive; message never empty
            return NEUTRAL_REPLY
        if signal.name == "on_session_finalize":
            await self.gate.loop.sweep(get_str(p, "session_id"))
        return await observe(signal, deliver, NEUTRAL_REPLY)


DECLARATION = VendorDeclaration(
    agent=AGENT, receiver_type="hermes", port=8393, config_class=HermesConfig, surface=HermesSurface, mapping=MAPPING,
    registration=install.renderer(AGENT), hooks=install.HERMES_HOOKS, held_hooks=frozenset({"pre_tool_call"}),
    neutral_reply=NEUTRAL_REPLY,
    description="Hermes Agent shell hooks via aep-collector-hook (POST /hook); observe-only, opt-in operator-deny gate")
FACTORY = DECLARATION.factory()
