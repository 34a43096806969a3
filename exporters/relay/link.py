"""One agent's WebSocket connection to the relay: hello, outbox flush, inbound commands, reconnect.

Delivery: an event leaves the outbox when it is written, and stays *in flight* until the relay
answers a ``ping`` sent after it. The relay handles a connection's frames in order (AEP-0003 §2),
so that ``pong`` proves everything before the ping was ingested. A lost connection puts what is
still in flight back at the head of the outbox; the relay dedupes the resend on ``(source, id)``
(AEP-0001 §7.4). A relay that never answers ``ping`` falls back to "written is delivered".

Session claims: the relay routes a command to the connection that emitted the session's events
(AEP-0003 §3.5.3), so a fresh connection re-sends the latest event of every session it had claimed
and has nothing newer queued for: an idle session (a held permission request) stays routable.

Inbound commands wait in a bounded queue for the control router, which takes them one at a time (a
gateway's router waits on the edge that holds the session). A command that finds the queue full is
answered ``control.rejected`` ``busy`` at once (AEP-0004 §3, §7: every command gets its ack), so a
relay sending commands faster than they are taken cannot grow the collector's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from aep_collector.pipeline.control import BusyAnswers
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Event
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.frames import CloseCode

from .frames import backoff_delay, capped, category, hello, hello_problem, is_command, is_event, parse
from .outbox import Outbox, Pending, Ticket, pending, settle

if TYPE_CHECKING:
    from .config import RelayConfig

log = logging.getLogger("aep.exporter.relay")

RECLAIM_SESSIONS = 1024
"""Sessions per agent whose latest event is remembered for re-claiming after a reconnect."""
CONFIRM_EVERY = 256
"""Frames per socket write during a long flush; each write ends in a confirming ping unless one is
outstanding (one at a time), so a write the relay does not read always has a ping to wait on."""
MAX_FRAME = 16 * 1024 * 1024
WRITE_BYTES = 1 << 20
"""A flush stops adding frames to one socket write past this many characters (flow control between)."""
COMMAND_CHARS = MAX_FRAME
"""Characters of command frames a link holds for the router at most, beside ``command_queue``: a
queue of maximal frames would otherwise hold ``command_queue`` x 16 MiB. An empty queue takes any."""


def compact(frame: dict[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


class LinkOwner(Protocol):
    """What a link needs from its exporter: config, host, and the exporter-wide health reporting."""

    id: str
    config: RelayConfig
    host: Host
    instance: str

    def report(self, agent: str, cause: str, detail: str) -> None: ...

    def clear(self, agent: str) -> None: ...

    def resolve(self, agent: str, cause: str) -> None: ...

    def overflowing(self, agent: str, on: bool, detail: str = "") -> None: ...

    def live_changed(self) -> None: ...


@dataclass(slots=True)
class _Ping:
    t: int
    mark: int
    """Every in-flight entry numbered up to ``mark`` was written before this ping."""
    deadline: float


class AgentLink:
    """The relay connection of one agent identity; ``enqueue`` never waits on the network."""

    def __init__(self, agent: str, owner: LinkOwner) -> None:
        self.agent = agent
        self.owner = owner
        cfg = owner.config
        self.outbox = Outbox(cfg.outbox_size, cfg.overflow)
        self.inflight: deque[tuple[int, Pending]] = deque()
        self.categories: set[str] = set()
        self.latest: OrderedDict[str, Pending] = OrderedDict()
        self.state = "idle"
        """idle, connecting, hello, live, backoff or closed."""
        self.live = False
        self.attempts = 0
        self.connections = 0
        self.declared: list[str] | None = None
        self._ws: ClientConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._commands: asyncio.Queue[tuple[dict[str, Any], int]] = asyncio.Queue(cfg.command_queue)
        """Inbound commands (with their frame's length) waiting for the router, in arrival order."""
        self._command_chars = 0
        self._busy = BusyAnswers(owner, agent, log)
        """Answers ``busy`` what finds ``_commands`` full; knows what is queued and what it answered."""
        self._wake = asyncio.Event()
        self._closing = False
        self._rehello = False
        self._written = 0
        self._ping: _Ping | None = None
        self._alarm: asyncio.TimerHandle | None = None
        """Wakes the writer at an outstanding ping's deadline (see ``_write``)."""
        self._parked: ClientConnection | None = None
        """The connection whose writer is parked waiting for work (``send_now`` may write on it)."""
        self._writer_error: Exception | None = None
        """What a ``send_now`` write raised: the parked writer raises it, ending the connection."""
        self._confirms = True
        self._abandoned: int | None = None
        """The ``t`` of the ping whose silence switched confirmation off: its late pong turns it back on."""
        self._probe: asyncio.Task[bool] | None = None
        """A WebSocket protocol ping sent when a confirming ping went unanswered (see ``_overdue``)."""
        self._last_t = 0
        self._episode_dropped = 0
        self._logged: set[str] = set()
        self._down_since_live = True
        self._requeued = 0
        self._claimed: list[Pending] = []
        """The claims the current connection re-sent (a 1009 may be about one of them)."""

    # -- the exporter's side ---------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=f"relay:{self.agent}")
        self._worker = loop.create_task(self._submit_loop(), name=f"relay-commands:{self.agent}")

    def enqueue(self, events: list[Event], ticket: Ticket | None = None, wake: bool = True) -> None:
        """Queue ``events``; ``ticket`` (from ``deliver``) is settled as each is confirmed or lost.
        ``wake=False``: the caller writes them itself with ``send_now``."""
        for event in events:
            item = pending(capped(event), ticket)
            name = category(item.type)
            if name is not None:
                self.categories.add(name)
            if item.session is not None:
                if item.type == "session.ended":
                    self.latest.pop(item.session, None)
                else:
                    self.latest[item.session] = item
                    self.latest.move_to_end(item.session)
                    if len(self.latest) > RECLAIM_SESSIONS:
                        self.latest.popitem(last=False)
            self._dropped(self.outbox.push(item))
        if self.live and self._accepts() != self.declared:
            # Opt-in gates join ``accepts`` on the next hello (reference-stack §0.4): re-hello now.
            self._rehello = True
        if wake:
            self._wake.set()

    async def send_now(self) -> None:
        """Write what is queued from the caller's task when the writer is parked with nothing to
        do (the sending queue's delivery, after ``enqueue(..., wake=False)``): the same flush the
        writer would make, without a loop turn and a task step to wake it. Otherwise, or when the
        writer has something else to do first (a re-hello, closing), it wakes the writer."""
        ws = self._parked
        if ws is None or self._rehello or self._closing or not self.outbox:
            self._wake.set()
            return
        try:
            await self._flush(ws)
        except Exception as exc:  # the writer raises it: the connection ends as if it had failed there
            self._writer_error = exc
            self._wake.set()
            return
        self._arm()

    @property
    def pending(self) -> int:
        """Events not yet confirmed delivered: queued plus in flight."""
        return len(self.outbox) + len(self.inflight)

    async def stop(self, grace: float) -> None:
        """Flush for up to ``grace`` seconds if connected, send ``closing``, close; never hang."""
        self._closing = True
        self._wake.set()
        task = self._task
        if task is not None:
            if not self.live:
                task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(task), grace)
            except (TimeoutError, asyncio.CancelledError, Exception):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker
        self.state = "closed"
        # The last teardown put what was in flight back at the head: those may have arrived.
        unconfirmed = min(self._requeued, len(self.outbox)) + len(self.inflight)
        unsent = len(self.outbox) - min(self._requeued, len(self.outbox))
        # Events of a ``deliver`` call wait in the sending queue on disk: not lost, not counted.
        unsent -= sum(1 for item in list(self.outbox)[min(self._requeued, len(self.outbox)):] if item.ticket)
        if unsent:
            self.owner.host.health.count(self.owner.id, "dropped", unsent)
        if unsent or unconfirmed:
            log.warning("%s: shut down with %d events for %s never sent to the relay and %d sent but "
                        "unconfirmed (the JSONL log keeps them)", self.owner.id, unsent, self.agent, unconfirmed)

    # -- connection loop -------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        while not self._closing:
            self.attempts += 1
            self.state = "connecting"
            try:
                ws = await connect(self.owner.config.url, **self._connect_options())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every refusal is reported, then retried with backoff
                self._connect_failed(exc)
                await self._backoff(attempt)
                attempt += 1
                continue
            self._ws = ws
            completed = False
            opened = asyncio.get_running_loop().time()
            try:
                completed = await self._session(ws)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug or an odd relay ends this connection, not the link
                log.error("%s: relay connection for %s failed: %s: %s",
                          self.owner.id, self.agent, type(exc).__name__, exc)
            finally:
                await self._teardown(ws)
            # A relay that takes the hello and drops the connection at once must not be redialled
            # at the first backoff step forever: only a connection that lasted resets the backoff.
            if completed and asyncio.get_running_loop().time() - opened >= self.owner.config.backoff_max:
                attempt = 0
            if self._rehello and not self._closing:
                self._rehello = False
                continue
            if self._closing:
                break
            await self._backoff(attempt)
            attempt += 1
        self.state = "closed"

    def _connect_options(self) -> dict[str, Any]:
        cfg = self.owner.config
        headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else None
        return {
            "additional_headers": headers,
            "open_timeout": cfg.connect_timeout,
            # Protocol-level keepalive; AEP-0003 §3.5.5 recommends a timeout of three intervals.
            "ping_interval": cfg.ping_interval,
            "ping_timeout": cfg.ping_interval * 3,
            "close_timeout": min(cfg.connect_timeout, 2.0),
            "compression": None,
            "proxy": None,  # a relay is on loopback or a named host: never through an HTTP proxy
            "max_size": MAX_FRAME,
            "user_agent_header": "aep-collector",
        }

    async def _backoff(self, attempt: int) -> None:
        cfg = self.owner.config
        self.state = "backoff"
        await asyncio.sleep(backoff_delay(attempt, cfg.backoff_initial, cfg.backoff_max))

    def _connect_failed(self, exc: Exception) -> None:
        if isinstance(exc, InvalidStatus):
            status = exc.response.status_code
            if status in (401, 403):
                self.owner.report(self.agent, "unauthorized",
                                  f"the relay refused the WebSocket upgrade with HTTP {status}; check the token")
                return
            self.owner.report(self.agent, "upgrade-refused",
                              f"the relay answered the WebSocket upgrade with HTTP {status}")
            return
        cfg = self.owner.config
        if isinstance(exc, TimeoutError):
            # TCP may well be accepted (a wrong service on the port, a stuck relay): the upgrade
            # never completing is a state worth showing, not only a retry in the log.
            self.owner.report(self.agent, "handshake-timeout",
                              f"{cfg.shown}: no completed WebSocket upgrade within {cfg.connect_timeout:g} s")
            return
        if isinstance(exc, ssl.SSLError):
            # Not "down": a wss:// endpoint that does not speak TLS or a certificate not trusted
            # here, which no amount of retrying fixes.
            self.owner.report(self.agent, "tls-failed",
                              f"{cfg.shown}: the TLS handshake failed ({type(exc).__name__}: {cfg.scrub(str(exc))})")
            return
        if isinstance(exc, InvalidHandshake):
            self.owner.report(self.agent, "upgrade-failed",
                              f"{cfg.shown}: the WebSocket upgrade failed ({type(exc).__name__}: {cfg.scrub(str(exc))})")
            return
        if self._down_since_live:
            self._down_since_live = False
            log.warning("%s: relay %s unreachable for %s (%s: %s); events wait in the outbox",
                        self.owner.id, cfg.shown, self.agent, type(exc).__name__, cfg.scrub(str(exc)))

    async def _session(self, ws: ClientConnection) -> bool:
        """Hello, then read and write until the connection ends; True if the hello completed."""
        cfg = self.owner.config
        self.state = "hello"
        self.declared = self._accepts()
        frame = hello(self.agent, self.owner.instance, sorted(self.categories), self.declared, cfg.ack_window_ms)
        try:
            await ws.send(compact(frame))
            first = await asyncio.wait_for(ws.recv(), cfg.hello_timeout)
        except TimeoutError:
            self.owner.report(self.agent, "hello-timeout", f"no hello from the relay within {cfg.hello_timeout} s")
            return False
        except ConnectionClosed as exc:
            self.owner.report(self.agent, "hello-closed",
                              f"the relay closed the connection during the hello (code {_code(exc)})")
            return False
        problem = hello_problem(parse(first))
        if problem is not None:
            self.owner.report(self.agent, *problem)
            return False
        self.owner.clear(self.agent)
        self.live, self.state = True, "live"
        self.connections += 1
        self._confirms, self._ping, self._abandoned = True, None, None
        log.info("%s: relay connection for %s up (%s)", self.owner.id, self.agent, self.owner.config.shown)
        self._down_since_live = True
        self.owner.live_changed()
        self._route(True)
        reader = asyncio.create_task(self._read(ws))
        writer = asyncio.create_task(self._write(ws, self._claims()))
        try:
            done, rest = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also when this task is cancelled (shutdown): every exception of both is retrieved
            # here, never reported by asyncio as a stray "Task exception was never retrieved".
            for task in (reader, writer):
                task.cancel()
            outcomes = await asyncio.gather(reader, writer, return_exceptions=True)
        for task, exc in zip((reader, writer), outcomes, strict=True):
            if task in done and isinstance(exc, BaseException) and not isinstance(exc, ConnectionClosed):
                log.error("%s: relay connection for %s failed: %s: %s",
                          self.owner.id, self.agent, type(exc).__name__, exc)
        return True

    async def _teardown(self, ws: ClientConnection) -> None:
        was_live = self.live
        self.live, self._ws = False, None
        if was_live:
            log.info("%s: relay connection for %s down (code %s)", self.owner.id, self.agent, ws.close_code)
            self.owner.live_changed()
            self._route(False)
            self._closed_by_relay(ws)
        back = [item for _, item in self.inflight]
        if was_live and getattr(ws.protocol.close_rcvd, "code", None) == CloseCode.MESSAGE_TOO_BIG:
            back = self._too_big(back)
        self._claimed = []
        self._requeued = len(back)
        self.inflight.clear()
        self._ping = None
        self._end_probe()
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        self._dropped(self.outbox.push_front(back))
        try:
            await asyncio.wait_for(ws.close(), self.owner.config.connect_timeout)
        except Exception:  # a relay that stopped reading never completes the close handshake
            pass
        finally:
            # Else the socket stays open and the relay keeps it as a claimant of our sessions.
            ws.transport.abort()

    def _closed_by_relay(self, ws: ClientConnection) -> None:
        """Show a relay's close of a live connection with a code that says why (1008 policy, 1009 too
        big, 1013 backpressure, ...) as an incident: the next hello clears the connection problems, so
        a relay that closes every connection after its hello would otherwise read healthy while
        nothing reaches it. A restart (1001) and a normal close (1000) are not problems."""
        frame = getattr(ws.protocol, "close_rcvd", None)
        if frame is None or frame.code in (1000, 1001) or self._closing:
            return
        try:
            name = CloseCode(frame.code).name.lower().replace("_", " ")
        except ValueError:
            name = "an unregistered code"
        reason = f": {frame.reason!r}" if frame.reason else ""
        self.owner.host.health.incident(self.owner.id, "relay-closed",
                                        f"{self.agent}: the relay closed the connection with code {frame.code} "
                                        f"({name}){reason}; {self.pending} events wait for it")

    def _too_big(self, back: list[Pending]) -> list[Pending]:
        """``back`` (what was in flight when the relay closed with 1009) without the event it cannot take.

        The frame over the relay's limit was read last and is still unconfirmed, so it is in flight
        or among this connection's claims; whichever of those is largest is at least its size, so
        over the limit too. Resent, it would close every connection for good with the sending
        queue's delivery waiting behind it: it is left out instead, the largest one per close."""
        claims = self._claimed
        biggest = max((*back, *claims), key=lambda item: len(item.text), default=None)
        if biggest is None:
            return back
        if biggest.session is not None and self.latest.get(biggest.session) is biggest:
            del self.latest[biggest.session]  # never sent again as the session's claim
        if not any(item is biggest for item in back):  # a claim, delivered before: only its re-claim is too big
            return back
        back = [item for item in back if item is not biggest]
        if biggest.ticket is not None:
            biggest.ticket.refuse()  # ``deliver`` counts it and leaves it out of the retried batch
        else:
            self.owner.host.health.count(self.owner.id, "failed")
        try:
            ident = json.loads(biggest.text).get("id")
        except ValueError:
            ident = None
        detail = (f"{self.agent}: the relay closed the connection with 1009 (message too big): event {ident!r} "
                  f"({len(biggest.text.encode())} bytes), the largest unconfirmed, is over its limit and was "
                  "dropped (the JSONL log keeps it)")
        log.error("%s: %s", self.owner.id, detail)
        self.owner.host.health.incident(self.owner.id, "event-too-big", detail)
        return back

    def _claims(self) -> list[Pending]:
        queued = self.outbox.sessions()
        return [item for session, item in self.latest.items() if session not in queued]

    # -- writing ---------------------------------------------------------------------------

    async def _write(self, ws: ClientConnection, claims: list[Pending]) -> None:
        self._claimed = claims
        for item in claims:  # not tracked: a lost claim is recomputed on the next connection
            await ws.send(item.text)
        self._writer_error = None
        while True:
            if self._rehello and not self._closing:
                await ws.send(compact({"type": "closing", "reason": "capabilities-changed", "delivered": []}))
                return
            if self.outbox:
                await self._flush(ws)
                continue
            if self._episode_dropped:
                log.warning("%s: relay outbox for %s drained; %d events were dropped while it was full",
                            self.owner.id, self.agent, self._episode_dropped)
                self._episode_dropped = 0
                self.owner.overflowing(self.agent, False)
            if self._confirms and self.inflight and self._ping is None:
                await self._send_ping(ws)
                continue
            if self._closing and not self.inflight:
                await ws.send(compact({"type": "closing", "reason": "shutdown", "delivered": []}))
                await ws.close(1000, "collector shutting down")
                return
            self._wake.clear()
            # The pong's deadline wakes this loop like new work does (a timer, not a wait_for task).
            self._arm()
            self._parked = ws
            try:
                await self._wake.wait()
            finally:
                self._parked = None
            if self._writer_error is not None:
                exc, self._writer_error = self._writer_error, None
                raise exc

    async def _flush(self, ws: ClientConnection) -> None:
        """Write what is queued: every frame in one socket write, in order, the confirming ping
        last (one syscall per flush instead of one per event and one per ping)."""
        texts: list[str] = []
        size = 0
        while self.outbox and len(texts) < CONFIRM_EVERY and size < WRITE_BYTES:
            item = self.outbox.pop()
            self._requeued = max(0, self._requeued - 1)  # requeued entries sit at the head
            self._written += 1
            self.inflight.append((self._written, item))
            texts.append(item.text)
            size += len(item.text)
        if self._confirms and self._ping is None:
            # Also mid-flush (WRITE_BYTES of large events may be far fewer than CONFIRM_EVERY): a
            # relay that stops reading leaves a ping overdue, which is how a stall is noticed.
            texts.append(self._new_ping())
        await _send_all(ws, texts)
        if not self._confirms:
            settle(i for _, i in self.inflight)
            self.inflight.clear()
        else:
            cap = self.owner.config.outbox_size
            while len(self.inflight) > cap:  # bounded: past the cap, written is all we know
                settle([self.inflight.popleft()[1]])

    def _arm(self) -> None:
        """Arm the alarm for the outstanding ping's deadline, unless one is armed. One alarm stays
        armed across pings: a ping a delivery each created and cancelled a timer, and a cancelled
        timer stays in the loop's heap until its time comes. An alarm set for an earlier ping's
        deadline rings early; the writer then arms it for this one."""
        if self._ping is not None and self._alarm is None:
            self._alarm = asyncio.get_running_loop().call_at(self._ping.deadline, self._ring)

    def _ring(self) -> None:
        self._alarm = None
        self._overdue()
        self._arm()  # rung early (an earlier ping's deadline) or deadline moved on: watch the current one
        self._wake.set()

    def _overdue(self) -> None:
        """Judge a confirming ping past its deadline. A relay without ``ping`` frames still answers
        a WebSocket protocol ping once it has read ours; a stalled relay or a cut network answers
        neither, and then what was written must not count as delivered (the sending queue would
        commit it): it stays in flight, health says the relay is stalled, and the keepalive ends
        a dead connection, whose teardown puts it back in the outbox."""
        ping, ws, loop = self._ping, self._ws, asyncio.get_running_loop()
        if ping is None or ws is None or loop.time() < ping.deadline:
            return
        cfg = self.owner.config
        ping.deadline = loop.time() + cfg.hello_timeout
        probe = self._probe
        if probe is None:
            self._probe = loop.create_task(_answers_ping(ws), name=f"relay-probe:{self.agent}")
        elif probe.done() and probe.result():
            # The relay read our ping, a deadline ago, and did not answer it: it lacks ping frames.
            self._end_probe()
            self._confirms, self._ping, self._abandoned = False, None, ping.t
            settle(i for _, i in self.inflight)
            self.inflight.clear()
            self._once("no-pong", "the relay does not answer ping frames; events sent to it now "
                                  "count as delivered once written")
        elif not probe.done():
            self.owner.report(self.agent, "relay-stalled",
                              f"the relay has not read what was sent to it for over {2 * cfg.hello_timeout:g} s; "
                              f"{self.pending} events wait for it")

    def _end_probe(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        self.owner.resolve(self.agent, "relay-stalled")

    async def _send_ping(self, ws: ClientConnection) -> None:
        await ws.send(self._new_ping())

    def _new_ping(self) -> str:
        """A confirming ping for everything written so far, now outstanding; its frame text."""
        loop = asyncio.get_running_loop()
        # AEP-0003 §3.5.5: ``t`` is echoed; the reference uses milliseconds, kept strictly rising here.
        t = max(self._last_t + 1, int(loop.time() * 1000))
        self._last_t = t
        self._ping = _Ping(t, self._written, loop.time() + self.owner.config.hello_timeout)
        self._arm()  # watched even while the writer is blocked on a relay that stopped reading
        return f'{{"type":"ping","t":{t}}}'

    # -- reading ---------------------------------------------------------------------------

    async def _read(self, ws: ClientConnection) -> None:
        async for raw in ws:
            frame = parse(raw)
            if frame is None:
                kind = "binary" if isinstance(raw, bytes) else "non-JSON"
                self.owner.host.health.count(self.owner.id, "bad-frames")
                self._once(f"garbage-{kind}", f"ignored a {kind} frame from the relay (counted as bad-frames)")
                continue
            kind = frame.get("type")
            if is_event(frame):
                if is_command(str(kind)):
                    if self._commands.full() or (self._command_chars + len(raw) > COMMAND_CHARS
                                                 and not self._commands.empty()):
                        await self._busy.answer(frame, self.agent, self._commands.qsize())
                    else:
                        self._commands.put_nowait((frame, len(raw)))
                        self._command_chars += len(raw)
                        self._busy.queued(frame)
                else:
                    self._once(f"event-{kind}", f"ignored a {kind} event the relay sent to an emitter connection")
            elif kind == "ping":
                reply: dict[str, Any] = {"type": "pong"}
                if "t" in frame:
                    reply["t"] = frame["t"]
                await ws.send(compact(reply))
            elif kind == "pong":
                self._confirmed(frame.get("t"))
            elif kind == "error":
                self._error(frame)
            elif kind == "closing":
                log.info("%s: the relay is closing %s's connection: %s", self.owner.id, self.agent,
                         frame.get("reason", "no reason given"))
            # AEP-0003 §2: unknown frame types (and a second hello) MUST be ignored.

    def _confirmed(self, t: Any) -> None:
        ping = self._ping
        if isinstance(t, bool):
            return
        if ping is None or t != ping.t:
            if not self._confirms and self._abandoned is not None and t == self._abandoned:
                # Only slow, not without ping frames: what is written from now on waits for a pong again.
                self._confirms, self._abandoned = True, None
                log.info("%s: the relay answered a ping for %s late; deliveries wait for its pong again",
                         self.owner.id, self.agent)
            return
        while self.inflight and self.inflight[0][0] <= ping.mark:
            settle([self.inflight.popleft()[1]])
        self._ping = None
        self._end_probe()
        # The writer, parked until this pong, has something to do only if one of these holds
        # (what its loop checks before parking again); else waking it is a task step for nothing.
        if self.outbox or self.inflight or self._closing or self._rehello or self._episode_dropped:
            self._wake.set()

    def _error(self, frame: dict[str, Any]) -> None:
        code = str(frame.get("code", "error"))
        detail = frame.get("detail")
        cause = frame.get("cause")
        if cause is not None and code == "invalid-event":
            # AEP-0003 §3.6: the relay refused an event of ours (``cause`` is its id) and will not
            # buffer or fan it out, though the next pong confirms it: lost at the relay, so shown.
            self.owner.host.health.count(self.owner.id, "relay-refusals")
            shown = f"{detail}"[:200] if detail else "no detail given"
            self.owner.host.health.incident(self.owner.id, "event-refused",
                                            f"{self.agent}: the relay refused event {str(cause)[:80]!r} as invalid: "
                                            f"{shown!r}")
            return
        if cause is not None:
            # AEP-0004 §4.3: a relay-behalf refusal of command ``cause``; it never enters history.
            self.owner.host.health.count(self.owner.id, "relay-refusals")
            log.warning("%s: the relay refused command %s on %s's connection: %s%s", self.owner.id, cause,
                        self.agent, code, f" ({detail})" if detail else "")
            return
        self._once(f"error-{code}", f"the relay sent error {code!r}{f': {detail}' if detail else ''}")

    async def _submit_loop(self) -> None:
        """Hands inbound commands to the control router in arrival order, off the reading path."""
        while True:
            command, size = await self._commands.get()
            self._command_chars -= size
            self._busy.taken(command, self._commands.empty())
            control = self.owner.host.control
            submit = getattr(control, "submit", None)
            if submit is None:
                self.owner.report(self.agent, "no-control-router",
                                  f"a {command.get('type')} command arrived but the collector has no control router")
                continue
            try:
                await submit(command, self.agent)
            except Exception as exc:  # the router's fault is reported; the link keeps going
                self.owner.host.health.incident(self.owner.id, "submit-failed", f"{type(exc).__name__}: {exc}")

    # -- helpers ---------------------------------------------------------------------------

    def _accepts(self) -> list[str] | None:
        control = self.owner.host.control
        if control is None:
            return None
        try:
            value = control.accepts(self.agent)
        except Exception as exc:  # a broken router must not stop events flowing
            self._once("accepts-failed", f"host.control.accepts failed: {type(exc).__name__}: {exc}")
            return None
        return None if value is None else [str(v) for v in value]

    def _route(self, live: bool) -> None:
        set_route = getattr(self.owner.host.control, "set_route", None)
        if set_route is None:
            return
        try:
            set_route(self.agent, live)
        except Exception as exc:
            self._once("set-route-failed", f"host.control.set_route failed: {type(exc).__name__}: {exc}")

    def _dropped(self, items: list[Pending]) -> None:
        if not items:
            return
        settle(items, delivered=False)
        cfg = self.owner.config
        # Events of a ``deliver`` call are not lost: their batch waits in the sending queue on
        # disk and is retried whole, so counting them here would count them dropped, then exported.
        lost = sum(1 for item in items if item.ticket is None)
        if lost:
            self.owner.host.health.count(self.owner.id, "dropped", lost)
        for item in items:
            if item.session is not None and self.latest.get(item.session) is item:
                del self.latest[item.session]  # never resurrect a dropped event as a claim
        first = self._episode_dropped == 0
        self._episode_dropped += len(items)
        notable = sum(not i.low for i in items)
        self.owner.overflowing(self.agent, True, f"{self.agent}: outbox full at {cfg.outbox_size} events "
                                                 f"({cfg.overflow}); {self._episode_dropped} dropped since it filled")
        if first:
            log.warning("%s: relay outbox for %s is full (%d events); dropping per %s, debug/info first",
                        self.owner.id, self.agent, cfg.outbox_size, cfg.overflow)
        if notable:  # AEP-0003 §8.4: notice and above are never dropped silently
            log.warning("%s: dropped %d notice-or-above events for %s: the outbox held nothing lower",
                        self.owner.id, notable, self.agent)

    def _once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning("%s: %s: %s", self.owner.id, self.agent, message)


async def _send_all(ws: ClientConnection, texts: list[str]) -> None:
    """Send each of ``texts`` as its own text frame, in order, with one write to the socket.

    websockets has no public call for several messages at once; its connection's
    ``send_context`` plus the Sans-I/O ``protocol`` is the pattern its own ``send`` uses. A
    version without them gets one ``send`` per frame (the same frames, more writes)."""
    context = getattr(ws, "send_context", None)
    protocol = getattr(ws, "protocol", None)
    if len(texts) == 1 or context is None or not hasattr(protocol, "send_text"):
        for text in texts:
            await ws.send(text)
        return
    transport = getattr(ws, "transport", None)
    async with context():
        for text in texts:
            protocol.send_text(text.encode())
        # The context's exit writes each frame with a transport write of its own, and an idle
        # transport makes each one a send(2): joined here, a flush is one system call (and one
        # segment for the relay to read) instead of one per frame. Only frames are queued here
        # (the state was OPEN); an end-of-stream marker (b"") would be left to websockets.
        if transport is not None and hasattr(protocol, "data_to_send"):
            chunks = protocol.data_to_send()
            if all(chunks):
                transport.write(b"".join(chunks))
            else:
                protocol.writes[:0] = chunks


async def _answers_ping(ws: ClientConnection) -> bool:
    """Whether the peer answers a WebSocket protocol ping (proof it read everything sent before)."""
    try:
        await (await ws.ping())
    except Exception:  # the connection is ending: no answer, and its teardown follows
        return False
    return True


def _code(exc: ConnectionClosed) -> int | None:
    frame = exc.rcvd or exc.sent
    return frame.code if frame is not None else None
