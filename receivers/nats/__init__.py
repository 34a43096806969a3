"""The ``nats`` receiver (gateway tier): a durable JetStream consumer feeding AEP events to a pipeline.

It reads the stream the edge collectors' ``nats`` exporters publish to, in stream order, through
a durable pull consumer: a restarted gateway resumes where its acknowledgements left off. A
fetched batch goes through the pipeline (durable exporters such as ``jsonl`` write it before
``consume`` returns) and only then is each message acknowledged; what was not acknowledged is
redelivered by JetStream. Events already taken in are skipped, by ``(source, id)`` as AEP
dedupes (bounded memory), so a redelivery never reaches the exporters twice.

Control: every event names the collector holding its session (``Aep-Control``) and what its
agent accepts (``Aep-Accepts``). The receiver registers the agent with this collector's control
router and tells it where the session lives, so a command an operator sends here (through the
relay role or a relay exporter) is forwarded to that collector as a NATS request; the acks in
the reply are handed to the pipeline like any event (a re-ack again, byte-identical).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Event
from aep_collector.pipeline.natsconn import (
    ACCEPTS_HEADER,
    AGENT_HEADER,
    CONNECTING,
    CONTROL_HEADER,
    ERROR_HEADER,
    Link,
    NatsConnection,
    NatsStream,
    answered,
    token,
)
from aep_collector.pipeline.pipeline import NotDurable
from aep_collector.pipeline.validate import envelope_errors
from aep_collector.pipeline.wire import DecodeError, dumps_bytes, loads
from aep_collector.processors.capture.ceiling import honest_claim

__all__ = ["FACTORY", "NatsReceiver", "NatsReceiverConfig"]

log = logging.getLogger("aep.receiver.nats")

ACK_TYPES = frozenset({"control.accepted", "control.rejected"})
MAX_ACKS = 10_000
"""Acks kept, as the pipeline made them, for byte-identical re-sends."""


@dataclass
class NatsReceiverConfig:
    """Config of the ``nats`` receiver."""

    connection: NatsConnection = field(default_factory=NatsConnection)
    stream: NatsStream = field(default_factory=NatsStream)
    durable: str = "aep-gateway"
    """The durable consumer's name: gateways sharing it share the work; distinct names each see all."""
    batch: int = 256
    """Messages fetched (and acknowledged) per pipeline call."""
    ack_wait: float = 30.0
    """Seconds JetStream waits for an acknowledgement before redelivering."""
    max_ack_pending: int = 20_000
    control: bool = True
    """Forward operators' commands to the collector holding the session."""
    control_timeout: float = 5.0
    """Seconds to wait for that collector's reply before nacking ``busy``."""
    remember_ids: int = 200_000
    """Events remembered, by ``(source, id)``, to skip a redelivered message (oldest forgotten first)."""

    def validate(self) -> None:
        self.connection.validate()
        self.stream.validate()
        if token(self.durable) != self.durable or self.durable == "~":
            raise ValueError(f"durable {self.durable!r}: letters, digits, '_' and '-' only")
        if self.batch < 1 or self.max_ack_pending < self.batch:
            raise ValueError("batch must be at least 1 and max_ack_pending at least batch")
        if self.ack_wait <= 0 or self.control_timeout <= 0:
            raise ValueError("ack_wait and control_timeout must be positive")
        if self.remember_ids < self.max_ack_pending:
            raise ValueError("remember_ids must be at least max_ack_pending")


class NatsReceiver:
    def __init__(self, settings: CreateSettings, config: NatsReceiverConfig, next_consumer: Any) -> None:
        config.validate()
        self.id = f"receiver/{settings.id}"
        self.config = config
        self.next = next_consumer
        self.host = Host()
        self.link = Link(config.connection, self._up, self._down)
        # Keyed on (source, id), never a bare id: two emitters may mint the same id (AEP-0001).
        self.seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.acks: OrderedDict[tuple[str, str], list[tuple[Any, Event]]] = OrderedDict()
        self.forwarded: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._forwarders: dict[str, _Forwarder] = {}
        self.known: dict[str, str | None] = {}
        """Agents registered with the control router, with the accepts they were registered with."""
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._stopped = False
        self._down_logged = False

    async def start(self, host: Host) -> None:
        self.host = host
        # Until the first connection is up nothing is consumed: /healthz must not read ok.
        host.health.fail(self.id, CONNECTING, self.link.pending, quiet=True)
        self.link.start(f"nats:{self.id}")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"consume:{self.id}")

    async def shutdown(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._sub is not None:
            # A pull request's late status reply may sit unread in its inbox: the connection's drain
            # would wait on it (until close gives up on the drain, leaving a cancelled task behind).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._sub.unsubscribe(), 2.0)
        await self.link.close()

    async def _up(self, nc: Any) -> None:
        self._down_logged = False
        self.host.health.recover(self.id, "nats-down")
        self.host.health.recover(self.id, CONNECTING)
        log.info("%s: connected to NATS; consuming %s as %s", self.id, self.config.stream.name,
                 self.config.durable)

    def _down(self, detail: str) -> None:
        self.host.health.fail(self.id, "nats-down", detail)
        if not self._down_logged:
            self._down_logged = True
            log.warning("%s: %s; the stream keeps events until the gateway is back", self.id, detail)

    # -- consuming ------------------------------------------------------------------------------

    async def _subscribe(self) -> Any:
        from nats.js import api

        nc = await self.link.wait(3600.0)
        js = nc.jetstream(timeout=self.config.control_timeout)
        stream, durable = self.config.stream.name, self.config.durable
        await self.config.stream.ensure(js)
        sub = await js.pull_subscribe(
            f"{self.config.stream.subject_prefix}.>", durable=durable, stream=stream,
            config=api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT, ack_wait=self.config.ack_wait,
                                      max_ack_pending=self.config.max_ack_pending,
                                      deliver_policy=api.DeliverPolicy.ALL))
        # An existing durable is taken as it is by the client: settings changed since it was made
        # (both can be updated in place) are applied here, or they would be ignored without a word.
        current = (await js.consumer_info(stream, durable)).config
        want = (self.config.ack_wait, self.config.max_ack_pending)
        if (current.ack_wait, current.max_ack_pending) != want:
            had = f"ack_wait {current.ack_wait} s and max_ack_pending {current.max_ack_pending}"
            try:
                await js.add_consumer(stream, config=dataclasses.replace(
                    current, ack_wait=want[0], max_ack_pending=want[1]))
            except Exception as exc:  # a server that cannot update it: consumed all the same, and shown
                self.host.health.incident(self.id, "durable-settings-kept",
                                          f"durable {durable} keeps {had}: {type(exc).__name__}: {exc}")
            else:
                log.info("%s: durable %s now has ack_wait %s s and max_ack_pending %d (it had %s)", self.id,
                         durable, want[0], want[1], had)
        return sub

    async def _run(self) -> None:
        from nats.errors import TimeoutError as NatsTimeout

        failures = 0
        while not self._stopped:
            try:
                if self._sub is None:
                    self._sub = await self._subscribe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a missing or mismatched stream, a refused consumer, NATS away
                failures = await self._failed(exc, failures)
                continue
            try:
                msgs = await self._sub.fetch(self.config.batch, timeout=1.0)
            except (NatsTimeout, TimeoutError):
                msgs = []  # nothing new: the consumer works
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away, stream leader moving: retried, reported once
                failures = await self._failed(exc, failures)
                self._sub = None if failures % 10 == 0 else self._sub
                continue
            if failures:
                failures = 0
                self.host.health.recover(self.id, "consume-failed")
            if msgs:
                await self._take(msgs)

    async def _failed(self, exc: Exception, failures: int) -> int:
        """Log (first and every 50th time) and show in ``/healthz`` that nothing is consumed, then back off."""
        failures += 1
        detail = f"consuming {self.config.stream.name} as {self.config.durable} fails: {type(exc).__name__}: {exc}"
        if failures == 1 or failures % 50 == 0:
            log.warning("%s: %s; retrying", self.id, detail)
        if self.link.ready.is_set():  # while NATS is away, nats-down says it already
            self.host.health.fail(self.id, "consume-failed", detail)
        await asyncio.sleep(min(0.1 * failures, 2.0))
        return failures

    async def _take(self, msgs: list[Any]) -> None:
        """Pipeline first, then the acknowledgements: nothing is acknowledged before it is written."""
        events: list[Event] = []
        acks: list[tuple[Any, Event | None]] = []  # each message, with the event it brings in (if any)
        batch: set[tuple[str, str]] = set()  # a copy stored twice (outside JetStream's duplicate window) may share a fetch
        for msg in msgs:
            event = self._parse(msg)
            if event is None:
                with contextlib.suppress(Exception):
                    await msg.term()  # never valid, never redelivered
                continue
            self._learn(event, msg.headers or {})
            key = _key(event)
            if key in self.seen or key in batch:
                self.host.health.count(self.id, "duplicates")
                acks.append((msg, None))
                continue
            batch.add(key)
            events.append(event)
            acks.append((msg, event))
        held: set[Any] = set()
        if events:
            try:
                held = await self._consume(events)
            except Exception as exc:  # not acknowledged: JetStream redelivers after ack_wait
                self.host.health.incident(self.id, "pipeline-error", f"{type(exc).__name__}: {exc}")
                return
            taken = [e for e in events if e.get("session") not in held] if held else events
            if held:  # the durable record did not take them: not acknowledged, so JetStream redelivers them
                self.host.health.incident(self.id, "not-written",
                                          f"{len(events) - len(taken)} events of {len(held)} session(s) not in the "
                                          "durable record; left unacknowledged, taken again when redelivered")
            else:
                self.host.health.recover(self.id, "pipeline-error")
            self.host.health.count(self.id, "accepted", len(taken))
            self._remember(map(_key, taken))
        for msg, event in acks:
            if event is not None and held and event.get("session") in held:
                continue
            with contextlib.suppress(Exception):  # a lost ack means a redelivery, which is skipped
                await msg.ack()

    def _parse(self, msg: Any) -> Event | None:
        """The message's event, envelope-valid and claiming no less than its content needs; else None."""
        try:
            value = loads(msg.data)
        except DecodeError as exc:
            problem: str | None = f"not JSON: {exc}"
        else:
            problem = self._admit(value)
        if problem is not None:
            self.host.health.count(self.id, "rejected")
            self.host.health.incident(self.id, "not-an-event",
                                      f"a message on {msg.subject} is not an AEP event ({problem[:300]}); dropped")
            return None
        return value  # a dict: _admit checked it

    def _admit(self, value: Any) -> str | None:
        """What makes ``value`` no event to take in, or None (its capture claim made honest in place)."""
        problems = envelope_errors(value)
        if problems:  # an exporter would choke on it (a session that is not a string, a seq that is not a number)
            return f"{problems[0].message}; {len(problems)} problem(s)"
        claim = honest_claim(value)
        if claim != value.get("capture", "metadata"):
            # AEP-0001 §8.2(a): every hop trusts the claim, and this collector did not gate the event:
            # a claim its content breaks is raised to what it holds, so the capture processor (and
            # the relay role's ceiling) cut it down instead of passing content above the ceiling.
            self.host.health.count(self.id, "reclaimed")
            self.host.health.incident(self.id, "capture-claim-too-low",
                                      f"event {value['id'][:64]} ({value['type'][:64]}) from {value['agent'][:64]} "
                                      f"claims capture {value.get('capture', 'metadata')!r} but holds more; "
                                      f"taken as {claim!r}")
            value["capture"] = claim
        return None

    async def _consume(self, events: list[Event]) -> set[Any]:
        """Hand ``events`` to the pipelines (nothing acknowledged counts as written before the durable
        record has it); returns the sessions whose events it did not take (none: all written)."""
        held: set[Any] = set()
        try:
            lanes = await self.next.consume_each_acked(events)
        except NotDurable as exc:  # the other sessions' events went through
            lanes, held = exc.lanes, exc.sessions
        for pipeline, out in lanes:
            for event in out:
                if event.get("type") in ACK_TYPES:  # kept to re-send exactly what went out
                    self.acks.setdefault(_key(event), []).append((pipeline, event))
        while len(self.acks) > MAX_ACKS:
            self.acks.popitem(last=False)
        return held

    def _remember(self, keys: Any) -> None:
        for key in keys:
            self.seen[key] = None
        while len(self.seen) > self.config.remember_ids:
            self.seen.popitem(last=False)

    # -- control --------------------------------------------------------------------------------

    def _learn(self, event: Event, headers: dict[str, str]) -> None:
        """Tell the router which collector holds this event's session and what its agent accepts."""
        control = self.host.control
        subject = headers.get(CONTROL_HEADER)
        session = event.get("session")
        if not self.config.control or control is None or not subject or not isinstance(session, str):
            return
        agent = event["agent"]
        raw = headers.get(ACCEPTS_HEADER)
        if raw is not None and self.known.get(agent) != raw:
            try:
                accepts = [str(a) for a in json.loads(raw)]
            except (ValueError, TypeError):
                accepts = None
            if accepts is not None:
                self.known[agent] = raw
                control.register(agent, accepts, self.next)
        control.remote(agent, session, self._forwarder(subject), subject, ended=event["type"] == "session.ended")

    def _forwarder(self, subject: str) -> _Forwarder:
        forwarder = self._forwarders.get(subject)
        if forwarder is None:
            if len(self._forwarders) >= MAX_ACKS:
                self._forwarders.clear()  # a cache: the router keeps those it uses
            forwarder = self._forwarders[subject] = _Forwarder(self, subject)
        return forwarder

    async def _probe(self, subject: str) -> bool:
        """Whether a collector still answers on ``subject``: only "no responders" says it is gone
        (a timeout may be a slow collector, and without NATS nothing can be told)."""
        nc = self.link.nc
        if nc is None or not self.link.ready.is_set():
            return True
        return await answered(nc, subject, self.config.control_timeout) is not False

    async def _forward(self, subject: str, command: Event, agent: str) -> list[Event] | None:
        nc = self.link.nc
        if nc is None or not self.link.ready.is_set():
            return None
        try:
            reply = await nc.request(subject, dumps_bytes(command), timeout=self.config.control_timeout,
                                     headers={AGENT_HEADER: agent})
        except Exception as exc:  # no responders, timeout: the router nacks busy
            log.warning("%s: command %s for %s not delivered to %s: %s", self.id, command.get("id"), agent,
                        subject, type(exc).__name__)
            return None
        if (reply.headers or {}).get(ERROR_HEADER):
            log.warning("%s: %s refused command %s: %s", self.id, subject, command.get("id"),
                        reply.headers[ERROR_HEADER])
            return None
        try:
            acks = [loads(line) for line in reply.data.split(b"\n") if line]
            problem = next((p for p in map(self._admit, acks) if p is not None), None)
        except DecodeError as exc:
            problem = f"not JSON: {exc}"
        if problem is not None:  # taken as no answer: the router nacks busy instead of leaving the command unanswered
            log.warning("%s: %s answered command %s with something that is not its acks (%s)", self.id, subject,
                        command.get("id"), problem[:300])
            return None
        fresh = [a for a in acks if _key(a) not in self.seen]
        if fresh:
            held = await self._consume(fresh)
            # One the durable record did not take comes again from the stream (the edge published it).
            self._remember(_key(a) for a in fresh if a.get("session") not in held)
        key = (str(command.get("source")), str(command.get("id")))
        retransmitted = key in self.forwarded
        self.forwarded[key] = None
        while len(self.forwarded) > MAX_ACKS:
            self.forwarded.popitem(last=False)
        # An ack already taken in: on a retransmitted command, re-send what the pipeline made of
        # it the first time (no second record); on a first copy, its stream copy came first.
        for ack in acks:
            if ack in fresh or not retransmitted:
                continue
            for pipeline, event in self.acks.get(_key(ack), []):
                pipeline.deliver([event], redelivery=True)
        return acks


class _Forwarder:
    """How the control router reaches the collector answering on ``subject``: a command (called),
    or whether it still answers at all (``probe``, for a session more than one collector claims)."""

    def __init__(self, receiver: NatsReceiver, subject: str) -> None:
        self.receiver, self.subject = receiver, subject

    async def __call__(self, command: Event, agent: str) -> list[Event] | None:
        return await self.receiver._forward(self.subject, command, agent)

    async def probe(self) -> bool:
        return await self.receiver._probe(self.subject)


def _key(event: Event) -> tuple[str, str]:
    """What a consumer dedupes an event on (AEP-0001): ``(source, id)``; an envelope-valid event has both."""
    return event["source"], event["id"]


FACTORY = Factory(
    kind=Kind.RECEIVER,
    type="nats",
    config_class=NatsReceiverConfig,
    create=lambda settings, cfg, next_consumer: NatsReceiver(settings, cfg, next_consumer),
    description="Gateway tier: a durable JetStream consumer of the fleet's AEP events; forwards "
                "operators' commands to the collector holding the session",
    emits_signals=False,  # AEP events already: a gateway pipeline needs no mapping processor
)
