"""The ``cline`` receiver: Cline's subprocess hooks, through the shared shim.

Cline runs one hook file per event (``.cline/hooks/TaskStart``, ``PreToolUse``, ...; cline/cline
``sdk/packages/core/src/hooks/hook-file-config.ts``) with the typed payload on stdin; each file
runs ``aep-collector-hook cline``, which POSTs the payload here. Every payload names itself with
``hookName``. Observe-only: no hook moment is answerable, the hello declares an empty
``control.accepts``, and every reply is ``{}``, which carries none of the agent-mutating fields
(``CONTROL_FIELDS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.receivers.held import AttentionHolder
from aep_collector.receivers.hook_http import FailOpenDelivery, HookReceiverConfig, HookServer
from aiohttp import web

from . import install
from .moments import need_name, observe, unwrap

AGENT = "cline"
MAPPING = "aep_collector.processors.mapping.cline"

# The agent-mutating keys of a hook reply; observe-only means a reply never carries any of them.
CONTROL_FIELDS = frozenset({"cancel", "review", "context", "contextModification", "overrideInput",
                            "errorMessage", "systemPrompt", "appendMessages"})
# The SDK's hook runner (cline/cline sdk/packages/core/src/hooks/subprocess.ts `toHookControl`, with
# subprocess-runner.ts `parseHookStdout`): empty stdout parses to nothing and a JSON object without
# one of CONTROL_FIELDS is "no control", so `{}` is the fail-open reply on every hook.
NEUTRAL_REPLY: dict[str, Any] = {}


@dataclass
class ClineConfig(HookReceiverConfig):
    """Config of the ``cline`` receiver."""

    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)


class ClineSurface:
    """Cline's side of the shared hook server: deliver, reply ``{}``."""

    agent = AGENT

    def __init__(self, config: ClineConfig, component: str = "receiver/cline") -> None:
        self.config = config
        self.loop = AttentionHolder(AGENT, component, 1.0)  # never holds; it only declares the empty control block

    async def on_start(self, host: Host, server: HookServer) -> None:
        assert server.deliver is not None
        self.loop.bind(host, server.deliver, [], server.consumer)

    def signal(self, payload: dict[str, Any], request: web.Request) -> Signal:
        body, given = unwrap(payload, request)
        own = body.get("hookName")
        name = own if isinstance(own, str) and own else given
        return Signal(agent=AGENT, name=need_name(name, "hookName"), payload=body)

    def neutral(self, signal: Signal | None) -> Any:
        return NEUTRAL_REPLY

    async def handle(self, signal: Signal, deliver: FailOpenDelivery) -> Any:
        return await observe(signal, deliver, NEUTRAL_REPLY)


DECLARATION = VendorDeclaration(
    agent=AGENT, receiver_type="cline", port=8392, config_class=ClineConfig, surface=ClineSurface, mapping=MAPPING,
    registration=install.renderer(AGENT), hooks=install.CLINE_HOOK_FILES, neutral_reply=NEUTRAL_REPLY,
    description="Cline subprocess hooks via aep-collector-hook (POST /hook); observe-only")
FACTORY = DECLARATION.factory()
