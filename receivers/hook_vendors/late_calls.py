"""Keep a run's end behind its tool calls whose report is posted detached (Kimi Code's PostToolUse).

A vendor that fires its after-tool hook fire-and-forget (the shim answers at once and posts from a
detached child, ``VendorDeclaration.detached``) can have its run-ending hook (Stop) reach the
collector first. AEP-0002: a run's events come before its terminal; an event after it is outside
the run. So a Stop of a session with a call still unreported enters the pipeline when the
session's open calls are reported, or after ``grace`` seconds, or as soon as any other hook of the
session arrives, or at shutdown; its reply waits for that (a durable record before the reply, as
for every hook: the wait is the detached report's few milliseconds, at most ``grace``). A report
later than that is still delivered, outside the ended run.

A call still unreported when its run's end goes in is forgotten then: a tool Kimi killed (or a
crash) never reports, and it must not make every later Stop of the session wait the grace too.
Each one is logged and counted (``unreported_tool_calls`` in /healthz).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aep_collector.pipeline.model import Signal

log = logging.getLogger("aep.receiver.late_calls")

SignalConsumer = Callable[[list[Any]], Awaitable[Any]]
"""What a receiver hands its signals to (the pipeline's consume); a held Stop is delivered through it."""
_SESSIONS_KEPT = 1024
"""Sessions with unreported calls remembered; the oldest is forgotten beyond this (bounded state)."""


class _Held:
    __slots__ = ("signal", "deliver", "reported", "sent", "delivered", "task")

    def __init__(self, signal: Signal, deliver: SignalConsumer) -> None:
        self.signal, self.deliver = signal, deliver
        self.reported = asyncio.Event()  # the session's open calls are all reported
        self.sent = False
        self.delivered = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class LateCalls:
    """Open detached calls per session and the run-ending signals held behind them."""

    def __init__(self, grace: float, agent: str = "") -> None:
        self.grace = grace
        self.agent = agent
        self.open: OrderedDict[str, set[str]] = OrderedDict()
        self.held: dict[str, _Held] = {}
        self.forgotten = 0
        """Calls whose run ended without their report (see the module docstring)."""

    def opened(self, session: str, call: str) -> None:
        self.open.setdefault(session, set()).add(call)
        self.open.move_to_end(session)
        while len(self.open) > _SESSIONS_KEPT:
            self.open.popitem(last=False)

    def reported(self, session: str, call: str) -> None:
        """The call's report is in the pipeline: a Stop waiting only for it may go."""
        calls = self.open.get(session)
        if calls is None:
            return
        calls.discard(call)
        if not calls:
            del self.open[session]
            held = self.held.get(session)
            if held is not None:
                held.reported.set()

    async def hold(self, session: str, signal: Signal, deliver: SignalConsumer) -> bool:
        """Hold a run-ending ``signal`` while the session has an unreported call and return once it
        is delivered; False (at once): nothing to wait for, deliver it now."""
        if self.grace <= 0 or not self.open.get(session) or session in self.held:
            return False
        held = _Held(signal, deliver)
        self.held[session] = held
        held.task = asyncio.ensure_future(self._wait(session, held))
        await held.delivered.wait()
        return True

    async def release(self, session: str) -> None:
        """Deliver the session's held signal now (another hook of it arrived) and wait until it is in."""
        held = self.held.get(session)
        if held is not None:
            await self._send(session, held)
            if held.task is not None and not held.task.done():
                held.task.cancel()  # its grace timer is moot; nothing pending is left at shutdown

    async def close(self) -> None:
        """Shutdown: every held signal goes in now."""
        for session in list(self.held):
            await self.release(session)

    async def _wait(self, session: str, held: _Held) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(held.reported.wait(), self.grace)
        await self._send(session, held)

    async def _send(self, session: str, held: _Held) -> None:
        if held.sent:  # delivered, or being delivered by the other path: wait for it
            await held.delivered.wait()
            return
        held.sent = True
        if self.held.get(session) is held:
            del self.held[session]
        # The run is over: a call still open was lost or comes late; it holds no later Stop.
        lost = self.open.pop(session, None)
        if lost:
            self.forgotten += len(lost)
            log.warning("%s session %s: run ended with tool call(s) %s never reported (the tool killed, or "
                        "a crash?); not waited for again, a report that still comes lands outside the run",
                        self.agent, session, ", ".join(sorted(lost)[:5]))
        try:
            await held.deliver([held.signal])  # FailOpenDelivery: never raises, failures go to health
        finally:
            held.delivered.set()
