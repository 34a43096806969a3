"""The opt-in operator gate: hold a matched tool call as an Allow/Deny(/Ask) request.

VS Code agent and Kimi Code (``aep_collector.receivers.hook_vendors``), Hermes and pi (``aep_collector.receivers.plugin_vendors``)
share it (reference stack §1.5, §1.6, §1.10, §1.12). Off by default (observe-only): nothing is
held and ``control.accepts`` is declared empty. On (``control: true``), a call whose tool name
matches ``gate_tools`` is held on the shared ``AttentionHolder`` while a control route is live, and a
``control.attention.respond`` decides it (AEP-0008 through ``permission_choice``). Timeout,
dismissal or a hung-up vendor leave the call to the vendor (no decision). What differs per
vendor stays with the caller: the options, the validator, the reply and any follow-up event.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from aep_collector.pipeline.control import RESPOND
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Signal
from aep_collector.receivers.held import Applied, AttentionHolder, Follow, Validator, permission_validator
from aep_collector.receivers.hook_http import HookReceiverConfig, HookServer


@dataclass
class HeldConfig(HookReceiverConfig):
    """Keys of a receiver that can hold a hook for an operator."""

    attention_timeout: float = 55.0
    """Seconds a held hook waits for an operator before the vendor decides alone."""
    attention_limit: ClassVar[float | None] = None
    """The largest hold window the vendor's own hook timeout leaves room for (None: no limit)."""

    def validate(self) -> None:
        super().validate()
        if self.attention_timeout <= 0:
            raise ValueError("attention_timeout must be positive")
        limit = self.attention_limit
        if limit is not None and self.attention_timeout > limit:
            raise ValueError(f"attention_timeout must be at most {limit:g} s "
                             "(the vendor's hook timeout must stay above the hold window)")


@dataclass
class GateConfig(HeldConfig):
    """Keys of a receiver with the opt-in operator gate (``attention_timeout``: its hold window)."""

    control: bool = False
    """Hold matched tool calls for an operator (declares ``control.attention.respond``); off by default."""
    gate_tools: str = ".*"
    """Regular expression SEARCHED in the tool name (the reference's ``RegExp.test``); anchor it
    (``^(Bash|Write)$``) for exact names. Only consulted when ``control`` is on."""

    def validate(self) -> None:
        super().validate()
        try:
            re.compile(self.gate_tools)
        except re.error as exc:
            raise ValueError(f"gate_tools is not a valid regular expression: {exc}") from None


def expires_at(timeout: float) -> str:
    """RFC 3339 UTC time ``timeout`` seconds from now (``attention.requested.expires_at``)."""
    at = datetime.fromtimestamp(time.time() + timeout, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def gate_validator(options: list[dict[str, str]]) -> Validator:
    """The permission validator plus the strict gate refusals: empty answers and form values."""
    # Reference stack §0.6: the Hermes and pi gates refuse an empty answer, form values or a
    # foreign option as `invalid` (the request stays held), where the VS Code and Kimi gates take
    # `permission_validator` and an empty answer falls through to a plain deny. Kept as they differ.
    base = permission_validator(options)

    def validate(answer: dict[str, Any]) -> str | None:
        problem = base(answer)
        if problem is not None:
            return problem
        if "values" in answer:
            return "a tool gate takes an option or text, not form values"
        text = answer.get("text")
        if answer.get("option") is None and not (isinstance(text, str) and text.strip()):
            return "an empty answer decides nothing: send option allow or deny"
        return None

    return validate


class ToolGate:
    """One receiver's gate: its switch, its tool pattern, its options and its attention holder."""

    def __init__(self, agent: str, component: str, config: GateConfig, options: list[dict[str, str]]) -> None:
        self.enabled = bool(config.control)
        self.pattern = re.compile(config.gate_tools)
        self.options = options
        self.loop = AttentionHolder(agent, component, config.attention_timeout)

    def accepts(self) -> list[str]:
        """``control.accepts`` exactly as the config makes it: declared but empty while the gate is off."""
        return [RESPOND] if self.enabled else []

    def bind(self, host: Host, server: HookServer) -> None:
        """At receiver start: declare what is honoured and how events leave."""
        assert server.deliver is not None
        self.loop.bind(host, server.deliver, self.accepts(), server.consumer)

    def health(self) -> dict[str, Any]:
        """``/healthz`` ``control`` (reference stack §0.1): true only while the gate is on and honoured,
        i.e. a control route is live that can answer it."""
        return {"control": self.enabled and self.loop.live()}

    def gates(self, tool: Any) -> bool:
        """Hold a call of ``tool`` now? Gate on, name matched, a live route (else no added latency)."""
        if not self.enabled or not isinstance(tool, str) or self.pattern.search(tool) is None:
            return False
        return self.loop.live()

    async def decide(self, signal: Signal, key: str | None, validator: Validator,
                     follow: Follow | None = None) -> Applied | None:
        """Hold ``signal`` until an operator answers; the applied answer, or None for no decision.

        The mapping raises the request only for a signal whose ``hold`` is set. ``follow`` may add
        one event per lane, cause-linked by it to that lane's ``attention.answered``.
        """
        signal.hold = key or "gate"  # a call without an id is still held, under no attention key
        signal.options = self.options  # the card offers what the answer is applied against
        signal.expires_at = expires_at(self.loop.timeout)
        end = await self.loop.hold_permission(signal, key, self.options, validator, follow=follow)
        return end.applied  # None: the route went away, timeout, dismissal (a keyed card is swept later)


class StrictGateSurface:
    """The parts of a ``HookSurface`` every receiver built around a strict (§0.6) gate shares.

    Hermes and pi: observe-only unless the gate is on; an empty answer, form values or a foreign
    option is refused ``invalid``. Subclasses set ``agent`` and ``neutral_reply`` and write
    ``signal`` and ``handle``.
    """

    agent: ClassVar[str]
    neutral_reply: ClassVar[Any]

    def __init__(self, config: GateConfig, component: str, options: list[dict[str, str]]) -> None:
        self.config = config
        self.gate = ToolGate(self.agent, component, config, options)
        self.validate = gate_validator(options)

    async def on_start(self, host: Host, server: HookServer) -> None:
        self.gate.bind(host, server)

    def health_extra(self) -> dict[str, Any]:
        return self.gate.health()

    def neutral(self, signal: Signal | None) -> Any:
        return self.neutral_reply
