"""The relay role's HTTP/SSE/WebSocket surface (AEP-0003 bindings, AEP-0004 routing).

One aiohttp app on the configured loopback port:

- ``GET /events`` and ``/.well-known/aep``: discovery; ``POST /events``: ingest (JSON or NDJSON,
  the whole batch validated before anything is ingested; commands refused: they flow only on the
  authenticated duplex);
- ``GET /stream``: SSE with ``filter``, ``capture``, ``from`` (or ``Last-Event-ID``), ``live=0``;
- ``/socket``: WebSocket with the hello handshake, subscriptions, roster, event ingest and commands;
- ``GET /healthz``: ``{"ok": true}``, plus counts and the collector's health when authorized.

Every subscriber has one outlet with a byte budget: past ``soft_limit`` its debug/info events are
shed (counted), past ``hard_limit`` it is disconnected (WS: ``closing`` then 1013; SSE: the stream
ends; a connection that stopped reading is aborted). A replay is a snapshot of buffer entries queued
as one ``Backlog``, rendered only as the subscriber drains it (any size, bounded memory, outside
the budget). Snapshot, backlog and registration happen with no ``await`` between them, so live
events queue behind the replay: nothing is lost, duplicated or reordered at the seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.body import (
    UNREAD_BODY,
    BodyDeadlines,
    BodyError,
    read_body,
    reply_and_close,
)
from aep_collector.pipeline.wire import dumps, loads
from aiohttp import WSMsgType, web

from .buffer import Buffers, Entry, from_problem
from .match import VERSION, envelope_problem, filter_problem, is_command, matches

log = logging.getLogger("aep.exporter.relay_server")

LEVELS = ("none", "metadata", "redacted", "full")
_SHEDDABLE = frozenset({"debug", "info"})
_LAST_ID = re.compile(r"(.+):([0-9]+):([0-9]+)")  # [0-9]: \d would take non-ASCII digits
_CORS = {"access-control-allow-origin": "*"}
_UNSAFE_ID = re.compile("[\r\n\x00]")


def _parse(text: str) -> Any:
    """The receivers' decoder (orjson first): it also refuses nesting past ``MAX_DEPTH``, which
    down-levelling and re-encoding could not survive, naming the problem (``ValueError``)."""
    return loads(text)


def _position(digits: str) -> int:
    """A resume counter from a ``Last-Event-ID``. One longer than any integer an accepted event can
    carry (the decoder refuses those) is past every held position: it becomes one that is too."""
    limit = sys.get_int_max_str_digits()
    return int(digits) if not limit or len(digits) <= limit else 10 ** limit


def _one_line(text: str) -> str:
    """``text`` for an SSE comment line: a line break in a session name must not end the comment."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


_WARNED: set[tuple[Any, Any]] = set()


def _foreign_claim(ev: dict[str, Any]) -> str | None:
    """None when an event from another emitter (or a command) keeps the level it claims, else the
    level to take it at (``honest_claim``): its claim then cannot be what every subscriber at or
    above it trusts. Checked once per foreign event, never on the collector's own."""
    from aep_collector.processors.capture.ceiling import honest_claim

    claim = honest_claim(ev)
    if claim == ev.get("capture", "metadata"):
        return None
    said = (ev.get("agent"), ev.get("type"))
    if said in _WARNED or len(_WARNED) >= 1024:  # once per sender and type, not per event
        return claim
    _WARNED.add(said)
    log.warning("an event of type %s from %s claims capture %r but its content needs more; "
                "subscribers below full get it down-levelled", ev.get("type"), ev.get("agent"),
                ev.get("capture", "metadata"))
    return claim


def _frame(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_REPLAYS_WAITING = 1
"""Replays a WebSocket connection may have queued behind the one being sent before its next frame
is read: each holds a snapshot of the buffers (up to ``buffer`` x ``max_sessions`` entries) until
it is sent, so a consumer that subscribes with ``from`` again and again without reading waits in
its socket, not in this process's memory."""

_STALL_GRACE = 2.0
"""Seconds a subscriber cut off past ``hard_limit`` gets to take its ending before the transport is
aborted: a consumer that stopped reading never drains the write that would end its stream."""


class Backlog:
    """A replay snapshot (buffer entries, not their text) rendered only as the subscriber drains it,
    so a replay larger than ``hard_limit`` neither sits in memory as text nor trips the limit."""

    def __init__(self, entries: list[Entry], render: Callable[[Entry], str | None]) -> None:
        self.entries, self.render, self.at = entries, render, 0

    def stop(self) -> None:
        """Send nothing more of it (its subscription ended) and let its snapshot go."""
        self.entries, self.at = [], 0

    def take(self, limit: int) -> list[str]:
        """Up to ``limit`` rendered items; empty once the snapshot is exhausted."""
        out: list[str] = []
        while self.at < len(self.entries) and len(out) < limit:
            item = self.render(self.entries[self.at])
            self.at += 1
            if item is not None:
                out.append(item)
        return out


class Outlet:
    """One subscriber's outgoing queue with a byte budget (slow-consumer shedding).

    The queue holds text, ``Backlog`` replays (expanded in place when the drain reaches them, so
    live text queued behind one leaves after all of it) and one ``("end", why)``."""

    def __init__(self, soft: int, hard: int) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.pending = 0
        self.soft, self.hard = soft, hard
        self.closed = False
        self.shed = 0
        self.backlog: Backlog | None = None
        self.on_overflow: Callable[[], None] | None = None
        self.replays = 0
        """Replays queued or being sent (each holds its snapshot until it is sent)."""
        self._replay_done = asyncio.Event()

    def put(self, item: str, severity: str | None = None) -> bool:
        """Queue an item; False when it was shed or the outlet is over its hard limit (now closing)."""
        if self.closed:
            return False
        if self.pending > self.hard:
            self.overflow()
            return False
        if severity is not None and self.pending > self.soft and severity in _SHEDDABLE:
            self.shed += 1
            return False
        self.pending += len(item)
        self.queue.put_nowait(item)
        return True

    def replay(self, backlog: Backlog) -> None:
        """Queue a replay: it counts against no budget, it is only rendered as fast as it is sent."""
        if not self.closed:
            self.replays += 1
            self.queue.put_nowait(backlog)

    async def replays_below(self, limit: int) -> None:
        """Return once fewer than ``limit`` replays are queued or being sent, or the outlet closed."""
        while self.replays >= limit and not self.closed:
            self._replay_done.clear()
            await self._replay_done.wait()

    def _replay_ended(self, dropped: int = 1) -> None:
        self.replays -= dropped
        self._replay_done.set()

    async def batch(self, limit: int = 512) -> list[Any]:
        """The next items to send: from the replay being expanded, else one queued item and whatever
        else is already queued (up to ``limit``, stopping at a replay). Taken items leave the budget."""
        while True:
            if self.backlog is not None:
                items: list[Any] = self.backlog.take(limit)
                if items:
                    return items
                self.backlog = None
                self._replay_ended()
            first = await self.queue.get()
            if isinstance(first, Backlog):
                self.backlog = first
                continue
            items = [first]
            while len(items) < limit and not self.queue.empty():
                nxt = self.queue.get_nowait()
                if isinstance(nxt, Backlog):
                    self.backlog = nxt
                    break
                items.append(nxt)
            for item in items:
                if isinstance(item, str):
                    self.pending -= len(item)
            return items

    def overflow(self) -> None:
        """Past ``hard_limit``: what is still queued is dropped (the consumer resumes from the last
        position it got), the ending goes first, and a stalled writer is aborted after a grace."""
        if self.closed:
            return
        self.end("backpressure", drop=True)
        if self.on_overflow is not None:
            self.on_overflow()

    def end(self, why: str, drop: bool = False) -> None:
        """Queue the ending once; ``drop``: nothing still queued is worth sending (the peer is gone).
        An ending already queued is kept with what precedes it (a refusal frame before its close)."""
        if drop and not self.closed:
            self.backlog = None
            while not self.queue.empty():
                self.queue.get_nowait()
            self.pending = 0
            self._replay_ended(self.replays)  # their snapshots are gone
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(("end", why))
        self._replay_done.set()  # a reader waiting for replays to be sent is let go


@dataclass(eq=False)
class Sub:
    filter: dict[str, Any]
    ceiling: str | None
    replay: Backlog | None = None
    """Its replay, stopped when the subscription ends before all of it is sent."""

    def end(self) -> None:
        if self.replay is not None:
            self.replay.stop()


@dataclass(eq=False)
class Conn:
    """One ``/socket`` connection."""

    ws: web.WebSocketResponse
    outlet: Outlet
    hello: dict[str, Any] | None = None
    subs: dict[str, Sub] = field(default_factory=dict)
    claims: dict[str, None] = field(default_factory=dict)
    busy: Coroutine[Any, Any, None] | None = None
    """A command's ``busy`` answer (the router's queue was full), awaited before the next frame is read."""

    @property
    def role(self) -> str:
        role = (self.hello or {}).get("role")
        return role if role in ("emitter", "consumer", "both") else "both"

    def identity(self, key: str) -> Any:
        ident = (self.hello or {}).get("identity")
        return ident.get(key) if isinstance(ident, dict) else None

    @property
    def capabilities(self) -> dict[str, Any]:
        caps = (self.hello or {}).get("capabilities")
        return caps if isinstance(caps, dict) else {}

    def send(self, frame: dict[str, Any]) -> None:
        self.outlet.put(_frame(frame))


@dataclass(eq=False)
class Stream:
    """One SSE subscriber."""

    sub: Sub
    outlet: Outlet


class Surface:
    """The relay role's state and handlers; ``owner`` is the exporter (control, health, token)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        cfg = owner.config
        self.cfg = cfg
        self.buffers = Buffers(cfg.buffer, cfg.max_sessions)
        self.conns: list[Conn] = []
        self.streams: list[Stream] = []
        self.started = time.monotonic()
        self.shed_total = 0
        self.last: dict[str, dict[str, Any]] = {}
        self.bodies = BodyDeadlines()
        """``POST /events`` bodies still arriving, ended at shutdown (nothing of them was ingested)."""

    # -- app ------------------------------------------------------------------------------------

    def app(self) -> web.Application:
        self.bodies = BodyDeadlines()  # built at each start: a restarted role is no longer stopping
        app = web.Application(client_max_size=self.cfg.max_body)
        app.router.add_get("/events", self.discovery)
        app.router.add_get("/.well-known/aep", self.discovery)
        app.router.add_post("/events", self.post)
        app.router.add_get("/stream", self.stream)
        app.router.add_get("/socket", self.socket)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_route("OPTIONS", "/stream", self.preflight)
        return app

    def capabilities(self) -> dict[str, Any]:
        return {"filters": ["attr-match"], "replay": {"buffer": self.cfg.buffer, "all": True},
                "capture": list(LEVELS[:LEVELS.index(self.cfg.max_capture) + 1]), "control": {"accepts": self.owner.accepts_union()}, "roster": {}}

    def ceiling(self, asked: str | None) -> str:
        """The subscriber's ceiling, never above ``max_capture``."""
        cap = self.cfg.max_capture
        return cap if asked is None or LEVELS.index(asked) > LEVELS.index(cap) else asked

    def authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        # RFC 7235 §2.1: the scheme is case-insensitive ("bearer" is Bearer); the token is not.
        offered = header[7:] if header[:7].lower() == "bearer " else request.query.get("access_token", "")
        # surrogatepass: a header's non-UTF-8 bytes arrive as lone surrogates; they must compare
        # (unequal, in constant time), not raise.
        return hmac.compare_digest(offered.encode("utf-8", "surrogatepass"),
                                   self.owner.token.encode("utf-8", "surrogatepass"))

    @staticmethod
    def unauthorized() -> web.Response:
        return web.json_response({"error": "unauthorized", "detail": "a bearer token is required"},
                                 status=401, headers=_CORS)

    async def preflight(self, request: web.Request) -> web.Response:
        return web.Response(status=204, headers={
            **_CORS, "access-control-allow-methods": "GET, OPTIONS",
            "access-control-allow-headers": "authorization, accept, content-type, last-event-id",
            "access-control-max-age": "86400"})

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response({"aep": [VERSION], "role": "collector",
                                  "endpoints": {"events": "/events", "stream": "/stream", "socket": "/socket"},
                                  "capabilities": self.capabilities()})

    async def healthz(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = {"ok": True}
        if self.authorized(request):
            body.update(sessions=len(self.buffers.sessions), connections=len(self.conns),
                        subscribers=len(self.streams) + sum(len(c.subs) for c in self.conns),
                        consumers=self.owner.consumers, shed=self.shed_total,
                        uptime_s=int(time.monotonic() - self.started), collector=self.owner.health_snapshot(),
                        last_events=self.last if self.cfg.max_capture == "full" else _screened_last(self.last))
        return web.json_response(body)

    # -- ingest and fan-out ---------------------------------------------------------------------

    def ingest(self, ev: dict[str, Any], text: str, conn: Conn | None) -> None:
        """An event from another emitter (HTTP or WebSocket); commands go to ``route``."""
        etype = ev["type"]
        if is_command(etype):
            self.route(ev, text, conn)
            return
        claim = _foreign_claim(ev)
        if "seq" in ev and "session" in ev:
            if conn is not None:
                conn.claims.setdefault(ev["session"], None)
            self.buffers.admit(ev, text, claim)
        self.fan_out(ev, text, claim)  # live fan-out forwards every copy, duplicates included (AEP-0003 §5)

    def publish(self, ev: dict[str, Any]) -> None:
        """An event the collector's own pipelines stamped (capped by its capture processor: its
        claim is honest, so it is not checked again here, on the hot path). The exporter has checked
        the types of what the relay reads (``served_problem``)."""
        text = dumps(ev)
        if "seq" in ev and isinstance(ev.get("session"), str):
            self.buffers.admit(ev, text)
        self.fan_out(ev, text)

    def fan_out(self, ev: dict[str, Any], text: str, claim: str | None = None) -> None:
        """``claim``: the level to trust ``ev`` at when its own ``capture`` is not (``_foreign_claim``)."""
        agent = ev.get("agent")
        if isinstance(agent, str):  # for `aep-collector status`: the last event per agent, metadata only
            if agent not in self.last and len(self.last) >= 1000:
                self.last.pop(next(iter(self.last)))
            self.last[agent] = {"time": ev.get("time"), "type": ev.get("type"), "session": ev.get("session")}
        variants: dict[str | None, str | None] = {None: text}
        severity = ev.get("severity", "info")
        for conn in self.conns:
            for sub in list(conn.subs.values()):
                if matches(sub.filter, ev):
                    body = self._variant(ev, text, sub.ceiling, variants, claim)
                    if body is not None and not conn.outlet.put(body, severity):
                        self._shed(conn.outlet)
        for stream in self.streams:
            if matches(stream.sub.filter, ev):
                body = self._variant(ev, text, stream.sub.ceiling, variants, claim)
                if body is not None and not stream.outlet.put(_sse_chunk(ev, body, body is not text), severity):
                    self._shed(stream.outlet)

    def _shed(self, outlet: Outlet) -> None:
        self.shed_total += 1
        if outlet.closed:
            self.owner.report_shed("a subscriber fell past the hard limit and was disconnected")
        else:
            self.owner.report_shed("a slow subscriber's debug/info events were shed")

    @staticmethod
    def _variant(ev: dict[str, Any], text: str, ceiling: str | None, cache: dict[str | None, str | None],
                 claim: str | None = None) -> str | None:
        """The text a subscriber with ``ceiling`` gets: the raw text, or a down-levelled copy.

        ``claim`` (an event from another emitter whose content breaks its own ``capture``) is the
        level the event is taken at instead of the one it states."""
        if ceiling in cache:
            return cache[ceiling]
        level = ev.get("capture", "metadata") if claim is None else claim
        if level in LEVELS and LEVELS.index(level) <= LEVELS.index(ceiling or "full"):
            cache[ceiling] = text
        else:
            from aep_collector.processors.capture.ceiling import (
                downlevel,  # the one down-levelling the capture processor uses
            )

            cache[ceiling] = dumps(downlevel(ev, ceiling or "metadata", source=claim))
        return cache[ceiling]

    # -- command routing (AEP-0004 §4) ---------------------------------------------------------

    def route(self, cmd: dict[str, Any], text: str, sender: Conn | None) -> None:
        def refuse(code: str, detail: str) -> None:
            if sender is not None:
                sender.send({"type": "error", "code": code, "cause": cmd["id"], "detail": detail})

        session = cmd["session"]
        targets: list[Any] = [c for c in self.conns if c.hello is not None and c.role != "consumer"
                              and session in c.claims]
        targets.extend(self.owner.owners_of(session))
        if not targets:
            refuse("no-route", f"no live emitter owns session {session!r}")
            return
        if len(targets) > 1:
            refuse("ambiguous", f"{len(targets)} emitters claim session {session!r}")
            self.owner.contested(session)
            return
        target = targets[0]
        if isinstance(target, Conn):
            control = target.capabilities.get("control")
            accepts = control.get("accepts") if isinstance(control, dict) else None
            if isinstance(accepts, list) and cmd["type"] not in accepts:
                refuse("unsupported", f"the target does not accept {cmd['type']}")
                return
            if not target.outlet.put(text):  # forwarded byte-identically (AEP-0004 §4 rule 5)
                # Its outlet is closing (cut off past hard_limit): the command would be lost unanswered.
                refuse("no-route", f"the emitter claiming session {session!r} is being disconnected")
                return
        else:
            busy = self.owner.submit(cmd, target)
            if busy is not None:
                if sender is not None:
                    sender.busy = busy  # awaited by its reader: the consumer waits, not our memory
                else:  # commands arrive only on a WebSocket (POST refuses them); never unanswered
                    asyncio.get_running_loop().create_task(busy)
        self.fan_out(cmd, text, _foreign_claim(cmd))

    def roster(self) -> list[dict[str, Any]]:
        entries = []
        for conn in self.conns:
            if conn.hello is None or conn.role == "consumer":
                continue
            for session in conn.claims:
                entry: dict[str, Any] = {"session": session, "agent": conn.identity("agent"),
                                         "instance": conn.identity("instance")}
                for key in ("control", "emits"):
                    if key in conn.capabilities:
                        entry[key] = conn.capabilities[key]
                entries.append(entry)
        entries.extend(self.owner.own_roster())
        return entries

    # -- HTTP ingest ------------------------------------------------------------------------------

    async def post(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("AEP-Version") != VERSION:  # AEP-0003 §3.2: before everything else
            return web.json_response({"versions": [VERSION]}, status=426)
        if not self.authorized(request):
            return self.unauthorized()
        if request.content_length is not None and request.content_length > self.cfg.max_body:
            return web.json_response({"error": "payload-too-large", "max_bytes": self.cfg.max_body}, status=413)
        media = request.content_type
        if media not in ("application/json", "application/x-ndjson"):
            return web.json_response({"error": "unsupported-media-type",
                                      "detail": "send application/json or application/x-ndjson"}, status=415)
        try:
            body = (await read_body(request, self.cfg.max_body, self.cfg.body_timeout, self.bodies)).decode("utf-8")
        except BodyError as exc:
            refusal = web.json_response({"error": exc.cause, "detail": exc.detail, **exc.extra}, status=exc.status)
            if exc.status == 503:  # shutting down: nothing was ingested, the emitter resends (AEP-0003 §3.2)
                refusal.headers["Retry-After"] = "1"
            # The rest of an unread body would be read before the connection is let go: close instead.
            return await reply_and_close(request, refusal) if exc.cause in UNREAD_BODY else refusal
        except UnicodeDecodeError:
            return web.json_response({"error": "invalid-json", "detail": "the body is not UTF-8"}, status=400)
        lines = [body] if media == "application/json" else [x for x in body.split("\n") if x.strip()]
        if len(lines) > self.cfg.max_batch:
            return web.json_response({"error": "too-many-events", "max": self.cfg.max_batch, "count": len(lines)},
                                     status=413)
        events = []
        for i, line in enumerate(lines):  # the whole batch is checked before anything is ingested
            try:
                ev = _parse(line)
            except ValueError as exc:
                return web.json_response({"error": "invalid-json", "line": i, "detail": str(exc)}, status=400)
            problem = envelope_problem(ev)
            if problem is not None:
                return web.json_response({"error": "invalid-event", "line": i, "detail": problem}, status=400)
            if is_command(ev["type"]):
                return web.json_response({"error": "invalid-event", "line": i,
                                          "detail": "commands flow only on an authenticated WebSocket"}, status=403)
            text = line.strip()
            events.append((ev, _frame(ev) if _breaks_line(text) else text))  # SSE data is one line
        for ev, text in events:
            self.ingest(ev, text, None)
        return web.Response(status=202)

    # -- SSE --------------------------------------------------------------------------------------

    async def stream(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            return self.unauthorized()
        q = request.query

        def bad(detail: str) -> web.Response:
            return web.Response(status=400, text=detail, headers=_CORS)

        try:
            flt = loads(q.get("filter", "{}"))
        except ValueError:
            return bad("filter is not JSON")
        problem = filter_problem(flt)
        if problem is not None:
            return bad(f"invalid filter: {problem}")
        ceiling = q.get("capture")
        if ceiling is not None and ceiling not in LEVELS:
            return bad(f"capture must be one of {', '.join(LEVELS)}")
        from_: Any = None
        if "from" in q:
            if q["from"] == "all":
                from_ = "all"
            else:
                try:
                    from_ = loads(q["from"])
                except ValueError:
                    return bad("from is not JSON")
        elif "Last-Event-ID" in request.headers:
            m = _LAST_ID.fullmatch(request.headers["Last-Event-ID"])
            if m:  # anything else is not a position this relay sent: no resume, as [ref]
                from_ = [{"session": m.group(1), "epoch": _position(m.group(2)), "seq": _position(m.group(3))}]
        fp = from_problem(from_, self.cfg.max_from)
        if fp is not None:
            return bad(fp[1] if fp[0] != "limit-exceeded" else f"from too large: {fp[1]}")
        live = q.get("live") != "0"
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache",
                                           **_CORS})
        await resp.prepare(request)
        stream = Stream(Sub(flt, self.ceiling(ceiling)), Outlet(self.cfg.soft_limit, self.cfg.hard_limit))
        stream.outlet.on_overflow = self._abort_later(request)
        # From here to registration: no await, so the replay snapshot and live meet without a gap or
        # overlap: live events are queued behind the snapshot, which is rendered as it is sent.
        if from_ is not None:
            replay = self.buffers.replay(from_)
            for session, (epoch, seq) in replay.exhausted:
                stream.outlet.put(f": replay-exhausted {_one_line(session)} {epoch}:{seq}\n\n")
            entries = replay.entries
            named = {p["session"] for p in from_} if isinstance(from_, list) else None
            if not live and named is not None and isinstance(flt.get("session"), str) and flt["session"] not in named:
                entries = entries + self.buffers.whole(flt["session"])
            stream.outlet.replay(self._backlog(entries, stream.sub, sse=True))
        if live:
            self.streams.append(stream)
            self.owner.consumer_joined()  # an operator is watching: holding is worth it
        else:
            stream.outlet.put(": replay-complete\n\n")
            stream.outlet.end("complete")
        try:
            await self._drain_sse(stream, resp)
        finally:
            if stream in self.streams:
                self.streams.remove(stream)
                self.owner.consumer_left()
        return resp

    def _backlog(self, entries: list[Entry], sub: Sub, sse: bool) -> Backlog:
        """Replay ``entries`` with the filter and ceiling of live delivery, as SSE chunks or WS frames."""
        def render(e: Entry) -> str | None:
            if not matches(sub.filter, e.event):
                return None
            body = self._variant(e.event, e.text, sub.ceiling, {}, e.claim)
            return body if body is None or not sse else _sse_chunk(e.event, body, body is not e.text)

        return Backlog(entries, render)

    @staticmethod
    def _abort_later(request: web.Request) -> Callable[[], None]:
        """What an outlet past ``hard_limit`` does besides queueing its ending: a writer stuck on a
        consumer that stopped reading never reaches that ending, and a closed transport still waits
        for its unsent bytes, so whatever connection is left after the grace is aborted."""
        def arm() -> None:
            def abort() -> None:
                transport = request.transport  # None once the connection is gone
                if transport is not None:
                    transport.abort()

            asyncio.get_running_loop().call_later(_STALL_GRACE, abort)

        return arm

    async def _drain_sse(self, stream: Stream, resp: web.StreamResponse) -> None:
        outlet = stream.outlet
        try:
            ending = None
            while ending is None:
                chunks = []
                for item in await outlet.batch():  # one write per burst, not per event
                    if isinstance(item, tuple):
                        ending = item[1]
                        break
                    chunks.append(item)
                if chunks:
                    await resp.write("".join(chunks).encode("utf-8"))
            if ending == "shutdown":
                await resp.write(b": shutting-down\n\n")
            elif ending == "backpressure":
                resp.force_close()  # disconnected: not kept alive for another request
            with contextlib.suppress(Exception):
                await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError, RuntimeError):
            outlet.closed = True

    # -- WebSocket ------------------------------------------------------------------------------

    async def socket(self, request: web.Request) -> web.StreamResponse:
        if not self.authorized(request):
            return self.unauthorized()
        ws = web.WebSocketResponse(max_msg_size=self.cfg.max_body, compress=False, heartbeat=None)
        await ws.prepare(request)
        conn = Conn(ws, Outlet(self.cfg.soft_limit, self.cfg.hard_limit))
        conn.outlet.on_overflow = self._abort_later(request)
        writer = asyncio.get_running_loop().create_task(self._drain_ws(conn))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    try:
                        self._text(conn, msg.data)
                    except Exception:  # a frame we failed on must not take the connection with it
                        log.exception("relay role: a WebSocket frame could not be handled")
                        conn.send({"type": "error", "code": "internal",
                                   "detail": "the relay could not handle this frame; see its log"})
                    if conn.busy is not None:
                        busy, conn.busy = conn.busy, None
                        await busy
                    await conn.outlet.replays_below(_REPLAYS_WAITING + 1)
                elif msg.type == WSMsgType.BINARY:
                    conn.send({"type": "error", "code": "binary-unsupported"})
                    conn.outlet.end("1003")
                if conn.outlet.closed:
                    break
        finally:
            self._drop(conn)
            conn.outlet.end("gone", drop=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer, 5.0)
            writer.cancel()
        return ws

    def _drop(self, conn: Conn) -> None:
        if conn in self.conns:
            self.conns.remove(conn)
            if conn.role in ("consumer", "both"):
                self.owner.consumer_left()

    async def _drain_ws(self, conn: Conn) -> None:
        outlet, ws = conn.outlet, conn.ws
        try:
            why = None
            while why is None:
                for item in await outlet.batch():
                    if isinstance(item, tuple):
                        why = item[1]
                        break
                    await ws.send_str(item)
            if why == "backpressure":
                with contextlib.suppress(Exception):
                    await ws.send_str(_frame({"type": "closing", "reason": "backpressure", "delivered": []}))
                await ws.close(code=1013, message=b"backpressure")
            elif why in ("1002", "1003"):
                await ws.close(code=int(why))
            elif why == "shutdown":
                await ws.close(code=1001, message=b"collector stopping")
        except (ConnectionResetError, RuntimeError, asyncio.CancelledError):
            pass
        finally:
            self._drop(conn)
            outlet.end("gone", drop=True)  # closed: and a reader waiting for a replay to be sent is let go
            with contextlib.suppress(Exception):
                await ws.close()

    def _text(self, conn: Conn, text: str) -> None:
        why = "a frame is a JSON object"
        try:
            frame: Any = _parse(text)
        except ValueError as exc:
            frame, why = None, str(exc)
        if conn.hello is None:
            self._hello(conn, frame)
            return
        if not isinstance(frame, dict):
            conn.send({"type": "error", "code": "bad-json", "detail": why})
            return
        kind = frame.get("type")
        if isinstance(kind, str) and "." in kind:
            problem = envelope_problem(frame)
            if problem is not None:
                conn.send({"type": "error", "code": "invalid-event", "detail": problem,
                           **({"cause": frame["id"]} if isinstance(frame.get("id"), str) else {})})
                return
            if conn.role == "consumer" and not is_command(kind):
                conn.send({"type": "error", "code": "unauthorized", "cause": frame["id"],
                           "detail": "a consumer connection does not emit events"})
                return
            self.ingest(frame, _frame(frame) if _breaks_line(text) else text, conn)
        elif kind == "subscribe":
            self._subscribe(conn, frame)
        elif kind == "unsubscribe":
            gone = conn.subs.pop(str(frame.get("id")), None)
            if gone is not None:
                gone.end()
            conn.send({"type": "unsubscribed", "id": frame.get("id")})
        elif kind == "roster":
            rid = frame.get("id")
            if not isinstance(rid, str):
                conn.send({"type": "error", "code": "invalid", "detail": "a roster request needs an id"})
            elif conn.role == "emitter":
                conn.send({"type": "error", "id": rid, "code": "unauthorized"})
            else:
                conn.send({"type": "roster", "id": rid, "entries": self.roster()})
        elif kind == "ping":
            conn.send({"type": "pong", **({"t": frame["t"]} if "t" in frame else {})})
        # AEP-0003 §2: pong, closing, a second hello and unknown frames are ignored.

    def _hello(self, conn: Conn, frame: Any) -> None:
        if not isinstance(frame, dict) or frame.get("type") != "hello":
            conn.send({"type": "error", "code": "hello-required"})
            conn.outlet.end("1002")
            return
        versions = frame.get("versions")
        if not isinstance(versions, list) or VERSION not in versions:
            conn.send({"type": "error", "code": "version-unsupported", "versions": [VERSION]})
            conn.outlet.end("1002")
            return
        conn.hello = frame
        self.conns.append(conn)
        conn.send({"type": "hello", "versions": [VERSION], "role": "both",
                   "identity": {"agent": "aep-collector", "instance": self.owner.instance},
                   "capabilities": self.capabilities()})
        if conn.role in ("consumer", "both"):
            self.owner.consumer_joined()

    def _subscribe(self, conn: Conn, frame: dict[str, Any]) -> None:
        sid = frame.get("id")
        if conn.role == "emitter":
            conn.send({"type": "error", "id": sid, "code": "unauthorized", "detail": "an emitter does not subscribe"})
            return
        flt = frame.get("filter", {})
        problem = filter_problem(flt)
        code = "invalid-filter"
        ceiling = frame.get("capture")
        if problem is None and ceiling is not None and ceiling not in LEVELS:
            problem = f"capture must be one of {', '.join(LEVELS)}"
        from_ = frame.get("from")
        if problem is None:
            fp = from_problem(from_, self.cfg.max_from)
            if fp is not None:
                code, problem = fp
        if problem is None and str(sid) not in conn.subs and len(conn.subs) >= self.cfg.max_subscriptions:
            code, problem = "limit-exceeded", f"a connection holds at most {self.cfg.max_subscriptions} subscriptions"
        if problem is not None:
            conn.send({"type": "error", "id": sid, "code": code, "detail": problem})
            return
        sub = Sub(flt, self.ceiling(ceiling))
        conn.send({"type": "subscribed", "id": sid})
        if from_ is not None:
            replay = self.buffers.replay(from_)
            for session, (epoch, seq) in replay.exhausted:
                conn.send({"type": "replay-exhausted", "sub": sid, "session": session,
                           "earliest": {"epoch": epoch, "seq": seq}})
            sub.replay = self._backlog(replay.entries, sub, sse=False)
            conn.outlet.replay(sub.replay)
        key = str(sid) if sid is not None else f"_{id(sub)}"
        replaced = conn.subs.get(key)
        if replaced is not None:  # the same id again: the earlier subscription ends here
            replaced.end()
        conn.subs[key] = sub

    # -- heartbeats and shutdown -----------------------------------------------------------------

    async def heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.ping_interval)
            t = int(time.time() * 1000)
            for conn in list(self.conns):
                conn.send({"type": "ping", "t": t})
            for stream in list(self.streams):
                stream.outlet.put(": ping\n\n")

    def close_all(self) -> None:
        """End every stream and socket, and every ingest body still arriving: its emitter gets a
        retryable 503 now instead of holding the stop until aiohttp's ``shutdown_timeout``."""
        self.bodies.end()
        for stream in list(self.streams):
            stream.outlet.closed = False
            stream.outlet.end("shutdown")
        for conn in list(self.conns):
            conn.outlet.end("shutdown")


def _breaks_line(text: str) -> bool:
    """Whether raw JSON text holds a line break (whitespace between tokens) that would split an SSE
    ``data:`` line: such text is re-encoded on one line."""
    return "\n" in text or "\r" in text


def _sse_chunk(ev: dict[str, Any], body: str, lowered: bool = False) -> str:
    """``lowered``: ``body`` is ``ev`` down-levelled for the subscriber, its session perhaps screened."""
    chunk = f"event: {ev['type']}\ndata: {body}\n"
    session = ev.get("session")
    # A session with a line break (or NUL) cannot be an SSE id: written out it would inject lines
    # into the stream. Such an event is delivered without a resume position. So is one whose
    # session the down-level screened (the hop's rule, ``_screen_id``): the id would spell what the
    # data no longer does, and the digest would resume nothing.
    if "seq" in ev and isinstance(session, str) and not _UNSAFE_ID.search(session) \
            and not (lowered and _screened_by_hop(session)):
        chunk += f"id: {session}:{ev.get('epoch', 0)}:{ev['seq']}\n"
    return chunk + "\n"


def _screened_last(last: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last event per agent as a subscriber below ``full`` sees its envelope: an agent or a
    session holding content as its digest (the hop's rule, ``_screen_id``). Done when ``/healthz``
    is read, not per event."""
    from aep_collector.processors.capture.structure import opaque

    out: dict[str, dict[str, Any]] = {}
    for agent, ev in last.items():
        session = ev.get("session")
        if isinstance(session, str) and _screened_by_hop(session):
            ev = {**ev, "session": opaque(session)}
        out[opaque(agent) if _screened_by_hop(agent) else agent] = ev
    return out


def _screened_by_hop(session: str) -> bool:
    from aep_collector.processors.capture.ceiling import _hop_detector

    return _hop_detector().sensitive(session)
