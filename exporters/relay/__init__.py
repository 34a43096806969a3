"""The ``relay`` exporter: events to an AEP relay over WebSocket, one connection per agent (AEP-0003 §3.5).

Each agent identity gets its own connection and hello, so the relay's roster and session claims
are honest: a connection claims only the sessions its agent emitted, and a command for a session
reaches the one connection that owns it. Inbound commands go to ``host.control.submit``; the
router's acks come back through ``export`` like any event. ``export`` never waits on the network.

A connection opens when its agent's first event arrives, or earlier through ``open(agent)``
(e.g. when a receiver registers a control-capable agent, so ``route_live`` is already true when
its first attention request comes). A connection that has emitted nothing claims no session: the
relay routes nothing to it until its agent emits.

Health before the first connection: each connection shows ``connecting`` from its start until its
first hello is answered, so ``/healthz`` never reads ok while an agent's events have never reached
the relay (a relay that accepts TCP and never answers would otherwise look healthy for
``connect_timeout`` or ``hello_timeout``). With no connection yet (no agent has emitted or
registered a control leg) there is nothing to reach and nothing waiting: no condition.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Event

from .config import RelayConfig
from .link import AgentLink
from .outbox import Ticket

__all__ = ["FACTORY", "RelayConfig", "RelayExporter"]

log = logging.getLogger("aep.exporter.relay")

SHUTDOWN_FLUSH = 2.0
"""Seconds shutdown waits for a live connection to flush its outbox before closing it."""
CONNECTING = "connecting"
"""Health cause shown while a connection has not yet completed its first hello (logged at INFO)."""
SHOWN_AGENTS = 5
"""Agents named in the ``connecting`` detail; more are counted."""


class RelayExporter:
    """Keeps one ``AgentLink`` per agent and the exporter-wide ``relay`` health flag."""

    def __init__(self, settings: CreateSettings, config: RelayConfig) -> None:
        config.validate()
        self.id = f"exporter/{settings.id}"
        self.config = config
        self.instance = config.instance or f"{socket.gethostname()}/{os.getpid()}"
        self.host = Host()
        self.links: dict[str, AgentLink] = {}
        self._problems: dict[str, set[str]] = {}
        self._overflowing: set[str] = set()
        self._started = False
        self._stopped = False

    async def start(self, host: Host) -> None:
        self.host = host
        if not self.config.enabled:  # opt-in: no external relay configured, nothing to reach or warn about
            self._stopped = True
            return
        host.health.set_flag(self.id, "relay", False)
        self._started = True
        for link in self.links.values():
            self._start(link)
        watch = getattr(host.control, "watch", None)
        if watch is not None:
            watch(self.open)  # control-capable agents connect before their first event

    async def export(self, events: list[Event]) -> int:
        """Queue each event on its own agent's connection; returns at once, with how many of
        ``events`` it left out (counted ``dropped``) so the memory queue counts only the rest."""
        if not self.config.enabled:
            return len(events)  # switched off: nothing sent, nothing lost, so neither counter
        by_agent, left_out = self._by_agent(events)  # those without an agent, so far
        if self._stopped:
            n = sum(map(len, by_agent.values()))
            if n:
                log.warning("%s: %d events exported after shutdown were not sent", self.id, n)
            left_out += n
        else:
            for agent, batch in by_agent.items():
                self._link(agent).enqueue(batch)
        if left_out:
            self.host.health.count(self.id, "dropped", left_out)
        return left_out

    async def deliver(self, events: list[Event]) -> int:
        """The sending queue's call: returns once the relay confirmed every event (a ``pong`` after
        it), however long the relay is away; raises if one was lost, so the batch is retried.
        Returns how many of ``events`` it left out (no agent: counted ``dropped`` once it settles)."""
        if not self.config.enabled:
            return len(events)
        if self._stopped:
            raise RuntimeError("the relay exporter is shut down")
        by_agent, no_agent = self._by_agent(events)
        tickets = []
        done: list[Ticket] = []  # settled parts of a batch larger than the outbox
        cap = self.config.outbox_size
        for agent, batch in by_agent.items():
            link = self._link(agent)
            while len(batch) > cap:
                # More than the outbox holds would overflow it on its own, and the retry would
                # too, for good: such a batch goes an outbox at a time, each confirmed first.
                ticket = Ticket(cap)
                link.enqueue(batch[:cap], ticket, wake=False)
                await link.send_now()
                await ticket.done
                if ticket.lost:
                    raise RuntimeError(f"{ticket.lost} events were dropped from the relay outbox before delivery")
                done.append(ticket)
                batch = batch[cap:]
            ticket = Ticket(len(batch))
            link.enqueue(batch, ticket, wake=False)
            await link.send_now()  # from this task while the link's writer is idle: no wake-up
            tickets.append(ticket)
        if len(tickets) == 1:
            # Every hook's delivery is one agent's batch: awaited alone, its ticket costs no
            # gathering future, done callback or extra loop turn between the pong and the cursor.
            await tickets[0].done
        else:
            await asyncio.gather(*(t.done for t in tickets))
        lost = sum(t.lost for t in tickets)
        if lost:
            raise RuntimeError(f"{lost} events were dropped from the relay outbox before delivery")
        # Counted once the batch settled: a retried batch would count them again on every attempt.
        if no_agent:
            self.host.health.count(self.id, "dropped", no_agent)
        refused = sum(t.refused for t in (*done, *tickets))  # too big for the relay: never retried
        if refused:
            self.host.health.count(self.id, "failed", refused)
        return no_agent + refused

    def _by_agent(self, events: list[Event]) -> tuple[dict[str, list[Event]], int]:
        """``events`` grouped by agent, in order, and how many have no agent (shown as an incident)."""
        by_agent: dict[str, list[Event]] = {}
        no_agent = 0
        for event in events:
            agent = event.get("agent")
            if not isinstance(agent, str) or not agent:
                no_agent += 1
                continue
            by_agent.setdefault(agent, []).append(event)
        if no_agent:
            self.host.health.incident(self.id, "no-agent", "an event without an agent cannot be sent to a relay")
        return by_agent, no_agent

    @property
    def persistent_queue(self) -> bool:
        """Switched off (no ``endpoint``): nothing is sent, so nothing is queued on disk either."""
        return self.config.enabled

    def open(self, agent: str) -> None:
        """Open ``agent``'s connection now, before its first event; a no-op if it exists."""
        if not self._stopped:
            self._link(agent)

    def _link(self, agent: str) -> AgentLink:
        link = self.links.get(agent)
        if link is None:
            link = self.links[agent] = AgentLink(agent, self)
            if self._started:
                self._start(link)
        return link

    def _start(self, link: AgentLink) -> None:
        # Until its first hello is answered nothing of this agent has reached the relay: /healthz
        # must not read ok meanwhile. An expected state, not a failure, so it logs at INFO.
        self._problems.setdefault(CONNECTING, set()).add(link.agent)
        self._show_connecting()
        link.start()

    def _show_connecting(self) -> None:
        agents = sorted(self._problems.get(CONNECTING, ()))
        if not agents:
            return
        named = ", ".join(agents[:SHOWN_AGENTS])
        if len(agents) > SHOWN_AGENTS:
            named += f" and {len(agents) - SHOWN_AGENTS} more"
        self.host.health.fail(self.id, CONNECTING, f"not yet connected to the relay at {self.config.shown} "
                                                   f"for {named}", quiet=True)

    async def shutdown(self) -> None:
        self._stopped = True
        await asyncio.gather(*(link.stop(SHUTDOWN_FLUSH) for link in self.links.values()))
        self.live_changed()

    # -- what the links report through ------------------------------------------------------

    def report(self, agent: str, cause: str, detail: str) -> None:
        self._problems.setdefault(cause, set()).add(agent)
        self.host.health.fail(self.id, cause, f"{agent}: {detail}")

    def clear(self, agent: str) -> None:
        """``agent``'s connection completed a hello: its connection problems (``connecting`` too) are over."""
        for cause in list(self._problems):
            self.resolve(agent, cause)

    def resolve(self, agent: str, cause: str) -> None:
        """``agent`` no longer has ``cause``; it clears once no agent has it."""
        agents = self._problems.get(cause)
        if agents is None or agent not in agents:
            return
        agents.discard(agent)
        if not agents:
            del self._problems[cause]
            self.host.health.recover(self.id, cause)
        elif cause == CONNECTING:
            self._show_connecting()  # the detail names only those still waiting

    def overflowing(self, agent: str, on: bool, detail: str = "") -> None:
        if on:
            self._overflowing.add(agent)
            self.host.health.fail(self.id, "outbox-overflow", detail)
        elif agent in self._overflowing:
            self._overflowing.discard(agent)
            if not self._overflowing:  # the drop counter stays in /healthz ``dropped``
                self.host.health.recover(self.id, "outbox-overflow")

    def live_changed(self) -> None:
        self.host.health.set_flag(self.id, "relay", any(link.live for link in self.links.values()))


FACTORY = Factory(
    kind=Kind.EXPORTER,
    type="relay",
    config_class=RelayConfig,
    create=lambda settings, cfg: RelayExporter(settings, cfg),
    description="Sends events to an AEP relay over WebSocket, one connection per agent; "
                "hands inbound commands to the control router",
)
