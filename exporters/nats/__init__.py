"""The ``nats`` exporter: every event into a NATS JetStream stream, and commands back from the fleet.

Each event is published to ``<subject_prefix>.<agent>.<session>`` with ``Nats-Msg-Id`` = its id,
so a resend (a retried batch, a replay of the sending queue after a restart) is stored once
within the stream's duplicate window. A batch is published in order on one connection and
``deliver`` returns only when JetStream acknowledged every event; a failure raises, and the
sending queue retries the whole batch (what was stored already is deduped). An event NATS can
never take (above the server's ``max_payload`` or the stream's ``max_msg_size``) is not published:
counted as ``dropped`` and shown in ``/healthz``, it must not hold up every event behind it;
``deliver`` returns how many it left out, so the queue does not count them ``exported`` too. See
``aep_collector.pipeline.natsconn`` for the subjects and headers.

Control across machines: with ``control`` on, the exporter answers requests on its
per-collector subject ``<control_prefix>.<collector>``, announced in the ``Aep-Control`` header
of every event it publishes. A request carries one AEP command; it goes to the collector's own
control router exactly as a relay's command would, and the reply is the ack events the router
recorded for it (so a retransmission gets the same bytes again).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import orjson
from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Event
from aep_collector.pipeline.natsconn import (
    ACCEPTS_HEADER,
    AGENT_HEADER,
    CONNECTING,
    CONTROL_HEADER,
    ERROR_HEADER,
    MSG_ID_HEADER,
    PROBE_HEADER,
    Link,
    NatsConnection,
    NatsStream,
    answered,
    default_collector,
    event_subject,
    token,
)
from aep_collector.pipeline.wire import dumps_bytes

__all__ = ["FACTORY", "NatsExporter", "NatsExporterConfig"]

log = logging.getLogger("aep.exporter.nats")

Message = tuple[str, bytes, dict[str, str]]
"""Subject, body and headers of one event's NATS message."""
STORED, DUPLICATE, DROPPED = "stored", "duplicate", "dropped"
"""What became of one event published synchronously (``NatsExporter._publish``)."""


@dataclass
class NatsExporterConfig:
    """Config of the ``nats`` exporter (edge tier)."""

    connection: NatsConnection = field(default_factory=NatsConnection)
    stream: NatsStream = field(default_factory=NatsStream)
    publish_timeout: float = 5.0
    """Seconds a batch may wait for the connection and for JetStream's acks before it is retried."""
    max_in_flight: int = 512
    """Events published before waiting for their acks (1 = one at a time, ack by ack)."""
    control: bool = True
    """Serve operators' commands for this collector's held requests over NATS."""
    control_prefix: str = "aep.control"
    collector: str | None = None
    """This collector's name in the fleet (its control subject); default ``<hostname>-<hash of state_dir>``."""

    def __post_init__(self) -> None:
        if self.collector is not None and not self.collector.strip():
            self.collector = None

    def validate(self) -> None:
        self.connection.validate()
        self.stream.validate()
        if self.publish_timeout <= 0:
            raise ValueError("publish_timeout must be positive")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        prefix = self.control_prefix
        if not prefix or any(not t or token(t) != t for t in prefix.split(".")):
            raise ValueError(f"control_prefix {prefix!r}: dot-separated tokens of letters, digits, '_' and '-'")
        events = self.stream.subject_prefix
        if prefix == events or prefix.startswith(f"{events}."):
            # The stream binds <subject_prefix>.>: it would store each command and answer it first.
            raise ValueError(f"control_prefix {prefix!r} is inside subject_prefix {events!r}: the stream would "
                             "capture every command sent to this collector")


class NatsExporter:
    """Publishes to JetStream (``deliver``) and serves the collector's control subject."""

    def __init__(self, settings: CreateSettings, config: NatsExporterConfig) -> None:
        config.validate()
        self.id = f"exporter/{settings.id}"
        self.config = config
        self.host = Host()
        self.link = Link(config.connection, self._up, self._down)
        self.js: Any = None
        self.control_subject = ""
        self._stream_ok = False
        self._stopped = False
        self._sub: Any = None
        self._watched: set[str] = set()
        self._routed: set[str] = set()
        self._accepts: dict[str, bytes | None] = {}
        self._down_logged = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, host: Host) -> None:
        self.host = host
        collector = self.config.collector or default_collector(host.state_dir)
        self.control_subject = f"{self.config.control_prefix}.{token(collector)}"
        host.health.set_flag(self.id, "nats", False)
        # Until the first connection is up nothing has reached NATS: /healthz must not read ok.
        host.health.fail(self.id, CONNECTING, self.link.pending, quiet=True)
        if self.config.control:
            watch = getattr(host.control, "watch", None)
            if watch is not None:
                watch(self._watch)
        # Never blocks start: a collector starting while NATS is away keeps its events in the
        # sending queue and connects when NATS is back.
        self.link.start(f"nats:{self.id}")

    async def shutdown(self) -> None:
        self._stopped = True
        self._route(False)
        await self.link.close()
        self.host.health.set_flag(self.id, "nats", False)

    async def _up(self, nc: Any) -> None:
        if self.js is None:
            self.js = nc.jetstream(timeout=self.config.publish_timeout,
                                   publish_async_max_pending=max(4000, self.config.max_in_flight + 1))
        if self.config.control and self._sub is None:
            if await self._subject_taken(nc):
                # Its commands would reach both collectors' routers: two decisions for one command.
                self.host.health.fail(self.id, "control-subject-taken",
                                      f"another collector answers on {self.control_subject}: give each one its "
                                      "own `collector` name; this one serves no commands and holds no requests")
            else:
                self.host.health.recover(self.id, "control-subject-taken")
                self._sub = await nc.subscribe(self.control_subject, cb=self._on_command)
                # The route goes live only once the server has the subscription: a command sent
                # right after must find a responder.
                await nc.flush(self.config.publish_timeout)
        self._down_logged = False
        self.host.health.recover(self.id, "nats-down")
        self.host.health.recover(self.id, CONNECTING)
        self.host.health.set_flag(self.id, "nats", True)
        if self._sub is not None:
            self._route(True)
        log.info("%s: connected to NATS (control subject %s)", self.id, self.control_subject)

    async def _subject_taken(self, nc: Any) -> bool:
        """Whether another collector already answers on this collector's control subject (two hosts
        with one hostname and one state_dir path get one default name). Only a reply says so: a
        timeout is a collector gone without NATS noticing yet (this one's previous run, perhaps)."""
        return await answered(nc, self.control_subject, self.config.publish_timeout) is True

    def _down(self, detail: str) -> None:
        self._route(False)
        self.host.health.set_flag(self.id, "nats", False)
        self.host.health.fail(self.id, "nats-down", detail)
        if not self._down_logged:
            self._down_logged = True
            log.warning("%s: %s; events wait in the sending queue", self.id, detail)

    # -- control routes -------------------------------------------------------------------------

    def _watch(self, agent: str) -> None:
        self._watched.add(agent)
        self._accepts.pop(agent, None)
        if self.link.nc is not None and self.link.nc.is_connected and self._sub is not None:
            self._route(True)

    def _route(self, live: bool) -> None:
        """Tell the router whether an operator's answer can reach this collector's held requests."""
        set_route = getattr(self.host.control, "set_route", None)
        if set_route is None:
            return
        agents = (self._watched - self._routed) if live else set(self._routed)
        for agent in agents:
            set_route(agent, live)
            (self._routed.add if live else self._routed.discard)(agent)

    def _accepts_header(self, agent: str) -> bytes | None:
        if agent not in self._accepts:
            accepts = getattr(self.host.control, "accepts", None)
            value = accepts(agent) if accepts is not None else None
            self._accepts[agent] = None if value is None else json.dumps(sorted(value)).encode()
        return self._accepts[agent]

    async def _on_command(self, msg: Any) -> None:
        """One command request: decide it through the control router, reply with its recorded acks."""
        headers = msg.headers or {}
        if PROBE_HEADER in headers:  # a gateway asking whether this collector still answers
            await self._reply(msg, b"", None)
            return
        agent = headers.get(AGENT_HEADER)
        try:
            command = orjson.loads(msg.data)
            if not isinstance(command, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            self.host.health.count(self.id, "bad-commands")
            await self._reply(msg, b"", {ERROR_HEADER: f"invalid: the command is not a JSON object ({exc})"})
            return
        submit = getattr(self.host.control, "submit", None)
        if not agent or submit is None:
            await self._reply(msg, b"", {ERROR_HEADER: "unsupported: no agent named or no control router"})
            return
        acks = await submit(command, agent)
        self.host.health.count(self.id, "commands")
        await self._reply(msg, b"\n".join(dumps_bytes(e) for e in acks or []), None)

    async def _reply(self, msg: Any, body: bytes, headers: dict[str, str] | None) -> None:
        if not msg.reply:
            return
        try:
            await self.link.nc.publish(msg.reply, body, headers=headers)
        except Exception as exc:  # the gateway's request times out and it nacks on our behalf
            log.warning("%s: could not reply to a command: %s: %s", self.id, type(exc).__name__, exc)

    # -- delivery -------------------------------------------------------------------------------

    def _message(self, event: Event) -> Message:
        agent = str(event.get("agent") or "unknown")
        session = event.get("session")
        headers = {MSG_ID_HEADER: str(event.get("id", ""))}
        if self._sub is not None:  # serving control here (not when another collector has the subject)
            headers[CONTROL_HEADER] = self.control_subject
            accepts = self._accepts_header(agent)
            if accepts is not None:
                headers[ACCEPTS_HEADER] = accepts.decode()
        subject = event_subject(self.config.stream.subject_prefix, agent,
                                session if isinstance(session, str) else None)
        return subject, dumps_bytes(event), headers

    async def deliver(self, events: list[Event]) -> int:
        """Return once JetStream stored (or deduped) every event, in order; raise to have it retried.

        Returns how many events were left out as too large for NATS (each counted ``dropped``)."""
        if self._stopped:
            raise RuntimeError("the nats exporter is shut down")
        timeout = self.config.publish_timeout
        nc = await self.link.wait(timeout)
        js = self.js
        if not self._stream_ok:
            await self.config.stream.ensure(js)
            self._stream_ok = True
        pending: list[tuple[asyncio.Future[Any], Event, Message]] = []
        duplicates = dropped = 0
        try:
            for event in events:
                message = self._message(event)
                if self._too_large(nc.max_payload, event, message):
                    dropped += 1
                    continue
                if self.config.max_in_flight == 1:
                    ack = await self._publish(js, event, message, timeout)
                    duplicates, dropped = duplicates + (ack == DUPLICATE), dropped + (ack == DROPPED)
                    continue
                # No wait_stall: with a timeout the client yields per message (a socket write each);
                # max_in_flight stays below its pending bound (see _up), so nothing blocks.
                subject, body, headers = message
                pending.append((await js.publish_async(subject, body, headers=headers), event, message))
                if len(pending) >= self.config.max_in_flight:
                    dup, drop = await self._settle(js, pending, timeout)
                    duplicates, dropped = duplicates + dup, dropped + drop
                    pending = []
            dup, drop = await self._settle(js, pending, timeout)
            duplicates, dropped = duplicates + dup, dropped + drop
        except BaseException:
            self._stream_ok = False  # a stream deleted meanwhile is created again by the retry
            for fut, _, _ in pending:
                fut.cancel()
            raise
        if duplicates:
            self.host.health.count(self.id, "deduplicated", duplicates)
        if dropped:  # counted once the batch is settled, not again on each retry of it
            self.host.health.count(self.id, "dropped", dropped)
        return dropped

    async def _settle(self, js: Any, pending: list[tuple[asyncio.Future[Any], Event, Message]],
                      timeout: float) -> tuple[int, int]:
        """Wait for the acks of ``pending``: (how many JetStream had already, how many it refused as too large)."""
        if not pending:
            return 0, 0
        await asyncio.wait([fut for fut, _, _ in pending], timeout=timeout)
        duplicates = dropped = 0
        for fut, event, message in pending:
            if fut.done():
                ack = fut.result()  # a refused publish raises here: the batch is retried
                duplicates += bool(getattr(ack, "duplicate", False))
                continue
            # nats-py never resolves an async publish JetStream refused with an error (reading the
            # refusal raises inside its reply handler): the same message again, synchronously,
            # brings the refusal itself, or a timeout; a first copy stored after all is deduped.
            fut.cancel()
            ack = await self._publish(js, event, message, timeout)
            duplicates, dropped = duplicates + (ack == DUPLICATE), dropped + (ack == DROPPED)
        return duplicates, dropped

    async def _publish(self, js: Any, event: Event, message: Message, timeout: float) -> str:
        """One event, acknowledged: ``STORED``, ``DUPLICATE`` (JetStream had it already) or ``DROPPED``."""
        from nats.js.errors import APIError

        subject, body, headers = message
        try:
            ack = await js.publish(subject, body, timeout=timeout, headers=headers)
        except APIError as exc:
            if exc.err_code == 10054:  # "message size exceeds maximum allowed": the stream's max_msg_size
                self._drop(event, f"{len(body)} bytes, above the stream's max_msg_size")
                return DROPPED
            raise
        return DUPLICATE if ack.duplicate else STORED

    def _too_large(self, max_payload: int, event: Event, message: Message) -> bool:
        """An event NATS can never take: retrying it would hold up every event behind it for good."""
        _, body, headers = message
        # The server counts the header block ("NATS/1.0\r\n", "k: v\r\n" each, "\r\n") too, and
        # closes the connection of a client that sends more than max_payload.
        size = len(body) + 12 + sum(len(k) + len(v.encode()) + 4 for k, v in headers.items())
        if size <= max_payload:
            return False
        self._drop(event, f"{size} bytes with its headers, above the server's max_payload of {max_payload}")
        return True

    def _drop(self, event: Event, why: str) -> None:
        """Show an event NATS can never take; ``deliver`` counts it once the batch is settled."""
        self.host.health.incident(self.id, "event-too-large",
                                  f"event {event.get('id')} ({event.get('type')}) not published: {why}")

    async def export(self, events: list[Event]) -> int:
        """For the memory queue: deliver, retrying with backoff until delivered or shut down."""
        attempt = 0
        while True:
            try:
                return await self.deliver(events)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopped:
                    raise
                if attempt == 0:
                    log.warning("%s: publishing %d events failed (%s: %s); retrying", self.id, len(events),
                                type(exc).__name__, exc)
                await asyncio.sleep(min(0.2 * 2 ** min(attempt, 6), 5.0))
                attempt += 1


FACTORY = Factory(
    kind=Kind.EXPORTER,
    type="nats",
    config_class=NatsExporterConfig,
    create=lambda settings, cfg: NatsExporter(settings, cfg),
    description="Publishes every event to a NATS JetStream stream (subject per agent and session, "
                "Nats-Msg-Id = event id); serves this collector's control subject for fleet operators",
)
