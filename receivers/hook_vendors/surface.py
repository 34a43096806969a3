"""The hook-family receiver surface: one implementation, six vendors, each a ``VendorDeclaration``
(``declare``) with a ``HookHandling``.

Codex, Gemini CLI, Qwen Code, VS Code agent, Kimi Code and Antigravity all hand the shared
``HookServer`` one JSON object per hook firing. What differs is data: where the hook name is
(the payload's ``hook_event_name``, or ``?hook=`` for Antigravity), the neutral reply, and the
control posture. What a vendor gets back (neutral replies, decision bodies, the gate's options and
how an option becomes the vendor's decision) is its receiver module's; the mapping turns the
signal into drafts and tags a held card with the key the receiver holds it on. Two held loops:

* the permission card (Codex, Qwen Code), here: a ``PermissionRequest`` is held while a control
  route is live, as Claude Code's is (reference stack §1.2, §1.4);
* the opt-in PreToolUse gate (VS Code agent, Kimi Code): the shared ``aep_collector.receivers.tool_gate.ToolGate``
  (also Hermes' and pi's), off by default; on, a PreToolUse whose tool name matches
  ``gate_tools`` is held as a permission card; a commanded deny also emits
  ``tool.denied{by: "policy"}`` cause-linked to the answer (§1.5, §1.6), built here. The gate's
  key and options reach the mapping on the held ``Signal`` (``hold``, ``options``).

Gemini CLI and Antigravity are observe-only: no control leg at all.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from aep_collector.pipeline.canonical import digest
from aep_collector.pipeline.control import RESPOND, Hold, card_key, permission_key
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Event, Signal
from aep_collector.pipeline.payload import get_str, tool_ref
from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.receivers.held import (
    DENY_MESSAGE,
    Applied,
    AttentionHolder,
    permission_validator,
)
from aep_collector.receivers.hook_http import (
    FailOpenDelivery,
    HookError,
    HookReceiverConfig,
    HookServer,
    query_hook,
    vendor_config,
)
from aep_collector.receivers.hook_vendors.late_calls import LateCalls
from aep_collector.receivers.registration import (
    hold_wait as hold_wait,  # re-exported: tests/test_shim.py reads it here
)
from aep_collector.receivers.tool_gate import GateConfig, HeldConfig, ToolGate
from aiohttp import web

MAX_VENDOR_TIMEOUT = 600
"""Seconds: the largest hook timeout Kimi accepts; hold windows must leave room under it."""
HOLD_MARGIN = 10
"""Seconds a registered vendor-side timeout exceeds the hold window (VS Code 25 -> 35, Kimi 50 -> 60)."""
ATTENTION_LIMIT = MAX_VENDOR_TIMEOUT - HOLD_MARGIN
"""The ``attention_limit`` of every hook-family config that holds (``HookHeldConfig``)."""


@dataclass
class HookHeldConfig(HeldConfig):
    """Keys of a hook-family receiver that holds a hook (a held PermissionRequest or gated
    PreToolUse waits ``attention_timeout`` for an operator, then the vendor gets its neutral reply)."""

    attention_limit: ClassVar[float | None] = ATTENTION_LIMIT


@dataclass
class HookGateConfig(GateConfig):
    """Keys of a hook-family receiver with the opt-in PreToolUse gate (VS Code agent, Kimi Code;
    each adds its own ``attention_timeout`` default, inside its vendor's hook timeout)."""

    attention_limit: ClassVar[float | None] = ATTENTION_LIMIT

NEUTRAL_REPLY: dict[str, Any] = {}
"""The family's fail-open reply: each vendor reads a JSON object on stdout (or as the HTTP body)
whose every field is optional, so ``{}`` asks for nothing and decides nothing (why, per vendor: its
module's docstring). Kimi Code and Antigravity add per-hook exceptions."""
PERMISSION_HOOK = "PermissionRequest"
"""Held as a permission card where the vendor has a ``permission_reply`` (Codex, Qwen Code)."""
GATED_HOOK = "PreToolUse"
"""Held by the opt-in gate where the vendor has one (VS Code agent, Kimi Code)."""


Payload = dict[str, Any]
Reply = Callable[..., Payload]


@dataclass(frozen=True)
class Gate:
    """The vendor side of the PreToolUse gate (the shared ``aep_collector.receivers.tool_gate.ToolGate`` holds it)."""

    options: list[dict[str, str]]
    """What the card offers (the mapping draws it with them, ``Signal.options``)."""
    decide: Callable[[str], str]
    """Applied option id -> the vendor's decision (``allow``, ``deny``, ``ask``)."""
    reply: Reply
    """(decision, reason) -> the PreToolUse reply body."""


@dataclass(frozen=True)
class HookHandling:
    """How the shared surface handles one vendor's hooks: where the hook is named, which are held
    or dismiss a hold, the gate. Who the vendor is and its neutral reply: its ``VendorDeclaration``."""

    name_keys: tuple[str, ...] = ("hook_event_name",)
    """Payload keys naming the hook, first present wins; ``()`` means only ``?hook=`` names it."""
    neutral: Callable[[str], Any] | None = None
    """Per-hook neutral reply; default the declaration's ``neutral_reply``."""
    canonical: Callable[[str], str] | None = None
    """Normalizes a hook name given in the query (Antigravity spells them case-insensitively)."""
    permission_reply: Reply | None = None
    """Set for vendors whose PermissionRequest is held (Codex, Qwen): (behavior, message) -> reply."""
    dismissed_by: frozenset[str] = frozenset()
    """Hooks meaning the held permission's tool ran or was refused in the vendor itself."""
    session_end: frozenset[str] = frozenset()
    """Hooks that end a session: pending holds are dismissed before they are delivered."""
    gate: Gate | None = None
    ends_run: frozenset[str] = frozenset()
    """Hooks ending a run: held behind the session's detached tool reports (``late_calls``)."""
    call_id_key: str | None = None
    """Payload key of the vendor's tool call id: the gate's key and ``tool.denied`` name the call
    with it, and it pairs a PreToolUse with its detached report. Required with ``gate``."""

    @property
    def held_hooks(self) -> frozenset[str]:
        """The hooks the surface may hold: the permission card's, the gate's (``handle``)."""
        held = {PERMISSION_HOOK} if self.permission_reply is not None else set()
        if self.gate is not None:
            held.add(GATED_HOOK)
        return frozenset(held)


def declare(agent: str, handling: HookHandling, port: int, registration: Callable[[str | None, Any], Any],
            description: str, *, keys: type = HookReceiverConfig, **facts: Any) -> VendorDeclaration:
    """A hook-family vendor's declaration, the family's facts derived rather than written per vendor:
    the receiver type and mapping module from ``agent`` (``qwen-code`` -> ``qwen_code``), the held
    hooks from ``handling``, the config class from ``keys`` and ``port`` (``vendor_config``), the
    neutral reply ``NEUTRAL_REPLY``. ``facts``: the rest of the ``VendorDeclaration`` (shim facts,
    a vendor's own neutral replies)."""
    receiver_type = agent.replace("-", "_")
    facts.setdefault("neutral_reply", NEUTRAL_REPLY)
    declaration = VendorDeclaration(
        agent=agent, receiver_type=receiver_type, mapping=f"aep_collector.processors.mapping.{receiver_type}",
        port=port, config_class=vendor_config(agent, keys, port, f"{__package__}.{receiver_type}"),
        registration=registration, held_hooks=handling.held_hooks,
        surface=lambda config, component: HookVendorSurface(declaration, handling, config, component),
        description=description, **facts)
    return declaration


def vendor_timeout(attention_timeout: float) -> int:
    """Seconds the vendor should allow a held hook: above the hold window and the shim's wait."""
    return math.ceil(attention_timeout) + HOLD_MARGIN


class HookVendorSurface:
    """A ``HookSurface`` driven by a ``HookHandling`` (see the module docstring)."""

    def __init__(self, declaration: VendorDeclaration, handling: HookHandling, config: HookReceiverConfig,
                 component: str) -> None:
        self.declaration, self.handling, self.config = declaration, handling, config
        self.agent: str = declaration.agent
        self.gate: ToolGate | None = None
        if handling.gate is not None:
            assert isinstance(config, GateConfig), f"{self.agent}: a gate vendor's config is a GateConfig"
            self.gate = ToolGate(self.agent, component, config, handling.gate.options)
            # VS Code / Kimi: an empty answer is a plain deny (reference stack §0.6), unlike Hermes / pi.
            self.gate_validator = permission_validator(handling.gate.options)
            self.loop = self.gate.loop  # one attention holder per receiver: the gate's
        else:
            self.loop = AttentionHolder(self.agent, component, getattr(config, "attention_timeout", 55.0))
        self.calls: dict[tuple[str, str], Hold] = {}
        self.denied: OrderedDict[tuple[str, str], None] = OrderedDict()
        """Calls the gate denied (session, call id): their tool.denied closed them."""
        self.late: LateCalls | None = None
        if handling.ends_run and handling.call_id_key and declaration.detached:
            self.late = LateCalls(getattr(config, "detached_grace", 0.0), self.agent)

    # -- HookSurface ---------------------------------------------------------------------------

    def accepts(self) -> list[str] | None:
        """``control.accepts`` exactly as the config makes it: the gates that are on, nothing more."""
        if self.handling.permission_reply is not None:
            return [RESPOND]
        if self.gate is not None:
            return self.gate.accepts()  # declared-but-empty while the gate is off
        return None  # observe-only: no control block at all

    async def on_start(self, host: Host, server: HookServer) -> None:
        assert server.deliver is not None
        self.loop.bind(host, server.deliver, self.accepts(), server.consumer)

    async def on_stop(self) -> None:
        if self.late is not None:
            await self.late.close()  # a held run end goes in before the server stops

    def health_extra(self) -> dict[str, Any]:
        extra = self.gate.health() if self.gate is not None else {}
        if self.late is not None:  # run ends waiting for a detached tool report (late_calls)
            extra = {**extra, "held_run_ends": len(self.late.held), "unreported_tool_calls": self.late.forgotten}
        return extra

    def signal(self, payload: dict[str, Any], request: web.Request) -> Signal:
        name = next((v for k in self.handling.name_keys if (v := get_str(payload, k))), None)
        if name is None:
            name = query_hook(request)
            if name is not None and self.handling.canonical is not None:
                name = self.handling.canonical(name)
        if name is None:
            if not self.handling.name_keys:
                # Antigravity payloads never name their hook; the shim passes its EVENT argument.
                raise HookError(400, "missing-hook", f"{self.agent} payloads do not name their hook: "
                            "POST /hook?hook=<EventName> (aep-collector-hook passes its EVENT argument)")
            raise HookError(400, "invalid-payload",
                        f"{self.handling.name_keys[0]} is missing or not a string (or pass ?hook=<EventName>)")
        return Signal(agent=self.agent, name=name, payload=payload)

    def neutral(self, signal: Signal | None) -> Any:
        if self.handling.neutral is not None:
            return self.handling.neutral(signal.name if signal is not None else "")
        default = self.declaration.neutral_reply
        return None if default is None else dict(default)

    async def handle(self, signal: Signal, deliver: FailOpenDelivery) -> Any:
        name, payload = signal.name, signal.payload
        session = _session(payload)
        key, late = self.handling.call_id_key, self.late
        call_id = get_str(payload, key) if key is not None else None
        if late is not None:
            if name not in self.declaration.detached:
                await late.release(session)  # a held run end goes before anything else of its session
                if name in self.handling.ends_run and await late.hold(session, signal, deliver):
                    return self.neutral(signal)  # in the pipeline behind the session's late reports
                if name == "PreToolUse" and call_id is not None:
                    late.opened(session, call_id)
        if name == PERMISSION_HOOK and self.handling.permission_reply is not None:
            return await self._permission(signal)
        if name == GATED_HOOK and self.gate is not None and self.gate.gates(get_str(payload, "tool_name")):
            return await self._gate(signal)
        if name in self.handling.dismissed_by:
            # The tool ran (or was refused) in the vendor itself: the held card is moot.
            hold = self.calls.pop((session, _about(payload)), None)
            if hold is not None:
                await self.loop.dismiss(hold)
        elif name in self.handling.session_end:
            await self.loop.sweep(session)  # AEP-0002 §7.1: nothing left open at session.ended
        if self.handling.gate is not None and name in _AFTER_TOOL:
            if call_id is not None and (session, call_id) in self.denied:
                del self.denied[(session, call_id)]
                # Kimi Code still reports the call the gate blocked, as a PostToolUseFailure (live):
                # the call is closed already, so the mapping keeps it off the tool lifecycle.
                signal.tool_closed = True
        await deliver([signal])
        if late is not None and call_id is not None and name in self.declaration.detached:
            late.reported(session, call_id)
        return self.neutral(signal)

    # -- the permission card (Codex, Qwen Code) ------------------------------------------------

    async def _permission(self, signal: Signal) -> Any:
        assert self.handling.permission_reply is not None
        p = signal.payload
        key = card_key(get_str(p, "tool_name"), p.get("tool_input"), signal.received_ns)  # the mapping's too
        call = (_session(p), _about(p))  # what a PostToolUse names
        end = await self.loop.hold_permission(signal, key, calls=self.calls, call=call)
        if end.applied is None:
            # No route (the vendor's own prompt decides, respond_via oob), timeout or dismissal.
            return self.neutral(signal)
        if end.applied.option == "allow":
            return self.handling.permission_reply("allow")
        # AEP-0008: free text on a permission is the refusing option with the text as guidance.
        return self.handling.permission_reply("deny", end.applied.text or DENY_MESSAGE)

    # -- the opt-in PreToolUse gate (VS Code agent, Kimi Code) ---------------------------------

    async def _gate(self, signal: Signal) -> Any:
        side, gate, call_id_key = self.handling.gate, self.gate, self.handling.call_id_key
        assert side is not None and gate is not None and call_id_key is not None

        def denial(applied: Applied, request: Event, answered: Event | None) -> Event | None:
            if side.decide(applied.option) != "deny":
                return None
            call = get_str(signal.payload, call_id_key)
            if call is not None:
                self.denied[(_session(signal.payload), call)] = None
                while len(self.denied) > _DENIED_KEPT:
                    self.denied.popitem(last=False)
            return _policy_denial(self.agent, call_id_key, signal.payload, applied.text or DENY_MESSAGE, request, answered)

        applied = await gate.decide(signal, gate_key(signal, call_id_key), self.gate_validator, follow=denial)
        if applied is None:
            return self.neutral(signal)  # unanswered frees the hook with no decision (fail-open)
        decision = side.decide(applied.option)
        if decision != "deny":
            return side.reply(decision)
        return side.reply("deny", applied.text or DENY_MESSAGE)


def gate_key(signal: Signal, call_id_key: str) -> str:
    """The attention key of one held PreToolUse: its call (id, else tool + input digest) and its moment.

    Unique per hold, so a re-sent call opens its own card; the mapping tags the card with it (``Signal.hold``).
    """
    p = signal.payload
    call = get_str(p, call_id_key) or f"{get_str(p, 'tool_name') or 'unknown'}:{digest(p.get('tool_input'))}"
    return f"gate:{call}@{signal.received_ns}"


_AFTER_TOOL = frozenset({"PostToolUse", "PostToolUseFailure"})
_DENIED_KEPT = 1024


def _policy_denial(agent: str, call_id_key: str, payload: Payload, reason: str, request: Event,
                   answered: Event | None) -> Event:
    """``tool.denied{by: "policy"}`` for a commanded deny: no further hook fires for the blocked call."""
    tool = tool_ref(get_str(payload, "tool_name"), get_str(payload, call_id_key))
    draft: Event = {"type": "tool.denied", "agent": agent, "session": request.get("session"),
                    "subject": tool["name"], "data": {"tool": tool, "by": "policy", "reason": reason},
                    "_capture": {"reason": "redacted"}}  # the deny reason is operator text (a capture level)
    if request.get("run"):
        draft["run"] = request["run"]
    draft["cause"] = answered["id"] if answered is not None else request["id"]
    return draft


def _about(payload: Payload) -> str:
    """What a permission is about (its payload names no call id): pairs a held card with its PostToolUse."""
    return permission_key(get_str(payload, "tool_name"), payload.get("tool_input"))


def _session(payload: Payload) -> str:
    return get_str(payload, "session_id") or "unknown"
