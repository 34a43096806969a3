"""The ``pi`` receiver: the pi extension's forwarded bus events.

``js/pi-extension.js`` (a factory ``(pi) => { pi.on(...) }``, discovered in pi's ``extensions/``
folder) POSTs each moment as ``{session: {id, file, cwd}, event: {type, ...}}``; ``event.type`` names it.
Observe-only by non-subscription: by default the extension registers no interception handler
and every reply is empty (the handler returns ``undefined``).

The opt-in gate needs both halves: the extension registers ``tool_call`` only with
``AEP_PI_CONTROL=1`` in pi's environment, and this receiver holds a matched call only with
``control: true``. A deny replies ``{"block": true, "reason": ...}``; allow, timeout and a
hung-up extension reply nothing (the call proceeds). ``deltas: true`` lets stream updates
(``message_update``, ``tool_execution_update``) through as ``x.pi.*`` debug events.
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

AGENT = "pi"
MAPPING = "aep_collector.processors.mapping.pi"

# badlogic/pi-mono packages/coding-agent/docs/extensions.md: a handler that returns nothing
# (`undefined`) leaves the moment untouched; the extension prints/returns nothing on fail-open.
NEUTRAL_REPLY: dict[str, Any] | None = None
_DEFAULT_DENY = "Denied by the operator (AEP)."


def deny_reply(reason: str | None = None) -> dict[str, Any]:
    """The blockable ``tool_call`` handler's denial: ``{block: true, reason}`` (reason never empty)."""
    # extensions.md "tool_call (can block)": returning {block: true, reason} stops the call.
    text = reason.strip() if isinstance(reason, str) else ""
    return {"block": True, "reason": text or _DEFAULT_DENY}


@dataclass
class PiConfig(GateConfig):
    """Config of the ``pi`` receiver (``control``, ``gate_tools``, ``attention_timeout``: the gate)."""

    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)
    deltas: bool = False
    """Map stream updates (``x.pi.message.delta``, ``x.pi.tool.update``); off by default (fixture pi)."""


class PiSurface(StrictGateSurface):
    """pi's side of the shared hook server, with the opt-in ``tool_call`` gate."""

    agent = AGENT
    neutral_reply = NEUTRAL_REPLY

    def __init__(self, config: PiConfig, component: str = "receiver/pi") -> None:
        super().__init__(config, component, PERMISSION_OPTIONS)  # the gate is binary: allow | deny
        self.config: PiConfig = config

    def signal(self, payload: dict[str, Any], request: web.Request) -> Signal:
        body, given = unwrap(payload, request)
        own = get_str(get_dict(body, "event"), "type")
        signal = Signal(agent=AGENT, name=need_name(own or given, "event.type"), payload=body)
        signal.deltas = self.config.deltas  # the mapping's stream-update switch, per receiver
        return signal

    def awaits_reply(self, signal: Signal) -> bool:
        """Only ``tool_call`` reads its reply (the gate); every other moment may be batched."""
        return signal.name == "tool_call"

    async def handle(self, signal: Signal, deliver: FailOpenDelivery) -> Any:
        event = get_dict(signal.payload, "event")
        if signal.name == "tool_call":
            if self.gate.gates(get_str(event, "toolName")):
                applied = await self.gate.decide(signal, attention_key("gate", get_str(event, "toolCallId")), self.validate)
                if applied is not None and applied.option == "deny":
                    return deny_reply(applied.text)  # {block: true, reason}
            else:
                await deliver([signal])  # maps to nothing: tool_execution_start already said it
            return NEUTRAL_REPLY
        if signal.name == "session_shutdown":
            await self.gate.loop.sweep(get_str(get_dict(signal.payload, "session"), "id"))
        return await observe(signal, deliver, NEUTRAL_REPLY)


DECLARATION = VendorDeclaration(
    agent=AGENT, receiver_type="pi", port=8396, config_class=PiConfig, surface=PiSurface, mapping=MAPPING,
    registration=install.renderer(AGENT), neutral_reply=NEUTRAL_REPLY,
    description="pi extension events (POST /hook); observe-only, opt-in tool_call gate")
FACTORY = DECLARATION.factory()
