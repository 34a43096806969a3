"""The opt-in operator gate Hermes and pi share: hold a matched tool call as an Allow/Deny request.

Off by default (observe-only): nothing is held and ``control.accepts`` is declared empty. On
(``control: true``), a call whose tool name fully matches ``gate_tools`` is held while a control
route is live; ``control.attention.respond`` decides it. Answers follow AEP-0008 with the strict
reading the reference gates use (reference stack §0.6): an option id as given, text equal to an
option id or label is that option, any other text denies with the text as the reason; an empty
answer, form ``values`` or a foreign option is refused ``invalid`` and the request stays pending.
Timeout, dismissal or a hung-up vendor leave the call to the vendor (no decision).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pipeline.control import RESPOND
from pipeline.host import Host
from pipeline.model import Signal
from receivers.held import Applied, HeldLoop, Validator, permission_choice, permission_validator
from receivers.hook_http import HookReceiverConfig, HookServer

from .common import CURRENT_REQUEST, expires_at, switch, wait_or_gone


@dataclass
class GateConfig(HookReceiverConfig):
    """Keys of a receiver with the opt-in operator gate."""

    control: bool | str = False
    """Hold matched tool calls for an operator (``1``/``true`` too, for ``${env:...}``); off by default."""
    gate_tools: str = ".*"
    """Regex that must FULLY match a tool name for its call to be held; default every tool."""
    attention_timeout: float = 55.0
    """Seconds a held call waits for an answer before the vendor decides alone."""

    def validate(self) -> None:
        super().validate()
        self.control = switch(self.control, "control")
        try:
            re.compile(self.gate_tools)
        except re.error as exc:
            raise ValueError(f"gate_tools is not a valid regex: {exc}") from None
        if self.attention_timeout <= 0:
            raise ValueError("attention_timeout must be positive")


def gate_validator(options: list[dict[str, str]]) -> Validator:
    """The permission validator plus the gate's refusals: empty answers and form values."""
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
    """One receiver's gate: its held loop, its switch and its tool pattern."""

    def __init__(self, agent: str, component: str, config: GateConfig, options: list[dict[str, str]]) -> None:
        self.enabled = switch(config.control, "control")
        self.pattern = re.compile(config.gate_tools)
        self.options = options
        self.timeout = config.attention_timeout
        self.loop = HeldLoop(agent, component, config.attention_timeout)
        self.bound = False

    def bind(self, host: Host, server: HookServer) -> None:
        """Declare exactly what is honoured: ``control.attention.respond`` only while the gate is on."""
        assert server.deliver is not None
        self.loop.bind(host, server.deliver, [RESPOND] if self.enabled else [], server.consumer)
        self.bound = self.loop.router is not None

    def health(self) -> dict[str, Any]:
        """``/healthz`` ``control``: true only when the gate is on and declared to the router."""
        return {"control": self.enabled and self.bound}

    def gates(self, tool: Any) -> bool:
        """Whether a call of ``tool`` is held now: gate on, name matched, an operator reachable."""
        if not self.enabled or not isinstance(tool, str) or self.pattern.fullmatch(tool) is None:
            return False
        return self.loop.live()

    async def decide(self, signal: Signal, key: str | None) -> Applied | None:
        """Hold ``signal`` (the mapping raises the request when ``Signal.hold`` is set); None = no decision."""
        signal.hold = key or "gate"
        signal.attrs["expires_at"] = expires_at(self.timeout)
        hold = await self.loop.request(signal, gate_validator(self.options), key)
        if hold is None:
            return None
        outcome = await wait_or_gone(self.loop, hold, CURRENT_REQUEST.get())
        if outcome.how != "answered" or outcome.answer is None:
            return None
        applied = permission_choice(outcome.answer, self.options)
        recorded: dict[str, Any] = {"option": applied.option}
        if applied.text:
            recorded["text"] = applied.text  # the deny reason (redacted-gated)
        await self.loop.answered(hold, outcome, recorded)
        return applied
