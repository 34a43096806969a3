"""A small AEP relay for tests, after the reference relay (core-bindings-control §3, §4.4, §6).

Speaks what the official SDK and our relay exporter need, on 127.0.0.1:
- ``/socket``: hello first in each direction (``hello-required`` / ``version-unsupported`` then
  close 1002), subscribe/subscribed/unsubscribe with attr-match and ``from`` replay, ``ping``/
  ``pong``, event ingest, per-connection session claims, command routing to the ONE claimant
  (``no-route`` / ``ambiguous`` / ``unsupported`` / ``unauthorized`` error frames with ``cause``),
  and the ``roster`` frame (declared);
- ``POST /events`` (JSON or NDJSON, whole batch validated first), ``GET /events`` and
  ``/.well-known/aep`` discovery, ``GET /stream`` SSE with ``filter``, ``from``, ``live=0``;
- ``GET /healthz``.

Ingest: buffer admission dedupes on ``(source, id)``; live fan-out forwards every copy as received
(byte-identical text), duplicates included, to SSE and socket subscribers alike. With no token the
relay is watch-only: every command is refused ``unauthorized``. With a token, an upgrade or stream
request without it gets 401.

Not modelled: capture ceilings (refused rather than ignored), eviction (so no ``replay-exhausted``),
backpressure. ``stop()`` closes every socket with 1001 as a relay restart does; the inspection
records (``received``, ``stored``, the dedupe set) outlive it, so a test can check the union of
what arrived across a restart. Fault knobs: ``fault_hello`` (close mid-hello, never answer,
answer garbage, answer two versions, refuse the version or the hello, hold the answer until
``release_hellos``), ``answer_pings``, ``freeze_at`` (a relay that hangs mid-stream) and ``send``
(any frame, garbage included, to an agent's connections). ``wait_until`` is the bounded polling
every relay test uses.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hmac
import itertools
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aep_collector.exporters.relay_server.match import (
    VERSION,
    envelope_problem,
    filter_problem,
    is_command,
    matches,
)
from aiohttp import WSMsgType, web

CAPABILITIES: dict[str, Any] = {
    "filters": ["attr-match"],
    "replay": {"buffer": 100000, "all": True},
    "control": {"accepts": []},
    "roster": {},
}
HELLO_FAULTS = ("close", "silent", "garbage", "two-versions", "hold", "version-unsupported", "hello-required")


def _compact(frame: dict[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


@dataclass(eq=False)
class Connection:
    """One ``/socket`` connection as the relay sees it."""

    ws: web.WebSocketResponse
    out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    frames: list[Any] = field(default_factory=list)
    """Every frame received, in order: the parsed object, or the raw text/bytes when not JSON."""
    hello: dict[str, Any] | None = None
    live: bool = False
    """The hello exchange completed (the relay answered)."""
    muted: bool = False
    held: bool = False
    early: list[str] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    subs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return str((self.hello or {}).get("role") or "both")

    @property
    def agent(self) -> str | None:
        identity = (self.hello or {}).get("identity")
        return identity.get("agent") if isinstance(identity, dict) else None

    @property
    def instance(self) -> str | None:
        identity = (self.hello or {}).get("identity")
        return identity.get("instance") if isinstance(identity, dict) else None

    @property
    def capabilities(self) -> dict[str, Any]:
        caps = (self.hello or {}).get("capabilities")
        return caps if isinstance(caps, dict) else {}

    def send(self, frame: dict[str, Any] | str | bytes) -> None:
        self.out.put_nowait(_compact(frame) if isinstance(frame, dict) else frame)

    def close(self, code: int) -> None:
        self.out.put_nowait(("close", code))


@dataclass(eq=False)
class _Stream:
    filter: dict[str, Any]
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


_SHUTDOWN, _COMPLETE = object(), object()


class RelayDouble:
    """The test relay; ``await start()``, point clients at ``url`` / ``ws_url``, ``await stop()``."""

    def __init__(self, token: str | None = None, *, port: int = 0) -> None:
        self.token = token
        self.port = port
        self.received: list[dict[str, Any]] = []
        """Every event ingested (envelope-valid), in arrival order, duplicates and commands included."""
        self.stored: list[dict[str, Any]] = []
        """The buffer admissions: deduplicated on ``(source, id)``, in admission order."""
        self.forwarded: list[tuple[str | None, str]] = []
        """Commands routed: ``(target agent, frame text as forwarded)``."""
        self.refusals: list[dict[str, Any]] = []
        """Relay-behalf refusal frames sent, in order."""
        self._seen: set[tuple[str, str]] = set()
        self._buffers: dict[str, list[tuple[tuple[int, int], int, str, dict[str, Any]]]] = {}
        self._order = itertools.count()
        self._connections: list[Connection] = []
        self._history: list[Connection] = []
        self._streams: list[_Stream] = []
        self._faults: deque[str] = deque()
        self.answer_pings = True
        """False models a relay that ignores ``ping`` frames from its clients."""
        self.freeze_at: int | None = None
        """Once ``stored`` holds this many events the relay hangs: socket frames are recorded, then
        neither ingested nor answered (no pong), until ``stop()``. A restart test uses it so its kill
        lands mid-stream by construction rather than by timing."""
        self._runner: web.AppRunner | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/events", self._post)
        app.router.add_get("/events", self._discovery)
        app.router.add_get("/.well-known/aep", self._discovery)
        app.router.add_get("/stream", self._stream)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """A relay restart: end SSE streams, close every socket with 1001, stop listening."""
        for stream in self._streams:
            stream.queue.put_nowait(_SHUTDOWN)
        conns, self._connections = self._connections, []
        for conn in conns:
            conn.live = False
        await asyncio.gather(*(self._close(c) for c in conns), return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.freeze_at = None  # only once every socket is closed: the restarted relay is a fresh process

    async def _close(self, conn: Connection) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.ws.close(code=1001, message=b"relay restarting"), 2.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/socket"

    # -- inspection and fault knobs -------------------------------------------------------

    def frames_from(self, agent: str) -> list[Any]:
        """Every frame received on connections whose hello named ``agent``, hello first, in order."""
        return [f for c in self._history if c.agent == agent for f in c.frames]

    def connections(self, agent: str | None = None, *, live: bool = True) -> list[Connection]:
        """Open connections (hello-complete when ``live``), optionally those of one agent."""
        conns = [c for c in self._connections if c.live or not live]
        return [c for c in conns if agent is None or c.agent == agent]

    def hellos(self, agent: str) -> list[dict[str, Any]]:
        """Every hello ``agent`` sent, across connections, in order."""
        return [c.hello for c in self._history if c.agent == agent and c.hello is not None]

    def store_for(self, session: str) -> list[dict[str, Any]]:
        return [e for e in self.stored if e.get("session") == session]

    @property
    def subscriber_count(self) -> int:
        """SSE streams plus socket subscriptions that are live now."""
        return len(self._streams) + sum(len(c.subs) for c in self._connections if c.live)

    def fault_hello(self, mode: str, times: int = 1) -> None:
        """Misbehave on the next ``times`` non-consumer hellos; ``mode`` is one of ``HELLO_FAULTS``."""
        if mode not in HELLO_FAULTS:
            raise ValueError(f"unknown hello fault {mode!r}")
        self._faults.extend([mode] * times)

    def release_hellos(self) -> None:
        """Answer every hello held by ``fault_hello("hold")``, then process what each client pipelined."""
        for conn in self._connections:
            if conn.held:
                conn.held = False
                self._welcome(conn)
                early, conn.early = conn.early, []
                for text in early:
                    self._frame(conn, text)

    def send(self, agent: str, frame: dict[str, Any] | str | bytes) -> int:
        """Send ``frame`` (an object, raw text or bytes) to every live connection of ``agent``."""
        conns = self.connections(agent)
        for conn in conns:
            conn.send(frame)
        return len(conns)

    # -- WebSocket -------------------------------------------------------------------------

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return web.Response(status=401, headers={"access-control-allow-origin": "*"})
        ws = web.WebSocketResponse(timeout=2.0, max_msg_size=16 * 1024 * 1024, compress=False)
        await ws.prepare(request)
        conn = Connection(ws)
        self._connections.append(conn)
        self._history.append(conn)
        pump = asyncio.create_task(self._pump(conn))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._text(conn, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    # AEP-0003 §2: binary frames are reserved in 0.1.
                    conn.frames.append(msg.data)
                    conn.send({"type": "error", "code": "binary-unsupported"})
                    conn.close(1003)
                else:
                    break
        finally:
            conn.live = False
            if conn in self._connections:
                self._connections.remove(conn)
            conn.out.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pump, 2.0)
        return ws

    async def _pump(self, conn: Connection) -> None:
        """The one writer of a connection, so replies, replay and fan-out keep their order."""
        with contextlib.suppress(Exception):
            while True:
                item = await conn.out.get()
                if item is None:
                    return
                if isinstance(item, tuple):
                    await conn.ws.close(code=item[1])
                    return
                if isinstance(item, bytes):
                    await conn.ws.send_bytes(item)
                else:
                    await conn.ws.send_str(item)

    def _text(self, conn: Connection, text: str) -> None:
        try:
            frame: Any = json.loads(text)
        except ValueError:
            frame = None
        conn.frames.append(frame if isinstance(frame, dict) else text)
        if conn.muted or (self.freeze_at is not None and len(self.stored) >= self.freeze_at):
            return
        if conn.held:
            conn.early.append(text)
            return
        if conn.hello is None:
            self._first(conn, frame)
            return
        self._frame(conn, text, frame)

    def _first(self, conn: Connection, frame: Any) -> None:
        if not isinstance(frame, dict) or frame.get("type") != "hello":
            conn.send({"type": "error", "code": "hello-required"})
            conn.close(1002)
            return
        versions = frame.get("versions")
        if not isinstance(versions, list) or VERSION not in versions:
            conn.send({"type": "error", "code": "version-unsupported", "versions": [VERSION]})
            conn.close(1002)
            return
        conn.hello = frame
        mode = self._faults.popleft() if self._faults and conn.role != "consumer" else "normal"
        if mode == "close":
            conn.close(1011)
        elif mode == "silent":
            conn.muted = True
        elif mode == "garbage":
            conn.send("}{ not a hello")
            conn.muted = True
        elif mode == "two-versions":
            conn.send({"type": "hello", "versions": [VERSION, "0.2"], "role": "both",
                       "identity": {"agent": "aep-relay"}, "capabilities": CAPABILITIES})
            conn.muted = True
        elif mode == "hold":
            conn.held = True
        elif mode in ("version-unsupported", "hello-required"):
            conn.send({"type": "error", "code": mode, **({"versions": ["9.9"]} if mode == "version-unsupported" else {})})
            conn.close(1002)
        else:
            self._welcome(conn)

    def _welcome(self, conn: Connection) -> None:
        conn.live = True
        conn.send({"type": "hello", "versions": [VERSION], "role": "both", "identity": {"agent": "aep-relay"},
                   "capabilities": CAPABILITIES})

    def _frame(self, conn: Connection, text: str, frame: Any = None) -> None:
        if frame is None:
            try:
                frame = json.loads(text)
            except ValueError:
                frame = None
        if not isinstance(frame, dict):
            conn.send({"type": "error", "code": "bad-json"})
            return
        kind = frame.get("type")
        if isinstance(kind, str) and "." in kind:
            problem = envelope_problem(frame)
            if problem is not None:
                conn.send({"type": "error", "code": "invalid-event", "detail": problem,
                           **({"cause": frame["id"]} if isinstance(frame.get("id"), str) else {})})
                return
            self._ingest(frame, text, conn)
        elif kind == "subscribe":
            self._subscribe(conn, frame)
        elif kind == "unsubscribe":
            conn.subs.pop(str(frame.get("id")), None)
            conn.send({"type": "unsubscribed", "id": frame.get("id")})
        elif kind == "roster":
            self._roster(conn, frame)
        elif kind == "ping" and self.answer_pings:
            conn.send({"type": "pong", **({"t": frame["t"]} if "t" in frame else {})})
        # AEP-0003 §2: pong, closing, a second hello and unknown frames are ignored.

    def _subscribe(self, conn: Connection, frame: dict[str, Any]) -> None:
        sid = frame.get("id")
        flt = frame.get("filter", {})
        problem = filter_problem(flt)
        if problem is None and "capture" in frame:
            problem = "this relay double applies no capture ceiling"
        replay: list[str] = []
        if problem is None:
            replay, problem = self._replay(frame.get("from"), flt)
        if problem is not None:
            conn.send({"type": "error", "id": sid, "code": "invalid-filter", "detail": problem})
            return
        conn.subs[str(sid) if sid is not None else f"_{next(self._order)}"] = flt
        conn.send({"type": "subscribed", "id": sid})
        for text in replay:
            conn.send(text)

    def _roster(self, conn: Connection, frame: dict[str, Any]) -> None:
        rid = frame.get("id")
        if not isinstance(rid, str):
            conn.send({"type": "error", "code": "invalid", "detail": "a roster request needs an id"})
            return
        if conn.role == "emitter":
            conn.send({"type": "error", "id": rid, "code": "unauthorized"})
            return
        entries = []
        for other in self.connections():
            if other.role == "consumer":
                continue
            caps = other.capabilities
            for session in other.claims:
                entry: dict[str, Any] = {"session": session, "agent": other.agent, "instance": other.instance}
                if "control" in caps:
                    entry["control"] = caps["control"]
                if "emits" in caps:
                    entry["emits"] = caps["emits"]
                entries.append(entry)
        conn.send({"type": "roster", "id": rid, "entries": entries})

    # -- ingest, routing, fan-out ------------------------------------------------------------

    def _ingest(self, ev: dict[str, Any], text: str, conn: Connection | None) -> None:
        self.received.append(ev)
        etype = ev["type"]
        if is_command(etype):
            self._route(ev, text, conn)
            return
        if "seq" in ev:  # a sequenced session event: claimed, buffered once, fanned out
            session = ev["session"]
            if conn is not None and session not in conn.claims:
                conn.claims.append(session)
            key = (ev["source"], ev["id"])
            if key not in self._seen:
                self._seen.add(key)
                self.stored.append(ev)
                pos = (ev.get("epoch", 0), ev["seq"])
                bisect.insort(self._buffers.setdefault(session, []), (pos, next(self._order), text, ev))
        self._fan_out(ev, text)  # AEP-0003 §5: live fan-out forwards every copy, duplicates included

    def _route(self, cmd: dict[str, Any], text: str, sender: Connection | None) -> None:
        def refuse(code: str, detail: str) -> None:
            frame = {"type": "error", "code": code, "cause": cmd["id"], "detail": detail}
            self.refusals.append(frame)
            if sender is not None:
                sender.send(frame)

        if self.token is None:
            refuse("unauthorized", "watch-only relay: no token is configured, so commands never flow")
            return
        claimants = [c for c in self.connections() if c.role != "consumer" and cmd["session"] in c.claims]
        if not claimants:
            refuse("no-route", f"no connected emitter owns session {cmd['session']!r}")
            return
        if len(claimants) > 1:
            refuse("ambiguous", f"{len(claimants)} connections claim session {cmd['session']!r}")
            return
        target = claimants[0]
        control = target.capabilities.get("control")
        accepts = control.get("accepts") if isinstance(control, dict) else None
        if isinstance(accepts, list) and cmd["type"] not in accepts:
            refuse("unsupported", f"the target does not accept {cmd['type']}")
        else:
            target.send(text)  # forwarded byte-identically (AEP-0004 §4 rule 5)
            self.forwarded.append((target.agent, text))
        self._fan_out(cmd, text)

    def _fan_out(self, ev: dict[str, Any], text: str) -> None:
        for conn in self.connections():
            for flt in list(conn.subs.values()):
                if matches(flt, ev):
                    conn.send(text)
        for stream in self._streams:
            if matches(stream.filter, ev):
                stream.queue.put_nowait((ev, text))

    def _replay(self, from_: Any, flt: dict[str, Any]) -> tuple[list[Any], str | None]:
        """Buffered events strictly after each position (or all held, for ``"all"``), filtered."""
        if from_ is None:
            return [], None
        if from_ == "all":
            picks = [e for buf in self._buffers.values() for e in buf]
        elif isinstance(from_, list):
            picks = []
            for pos in from_:
                if not isinstance(pos, dict) or not isinstance(pos.get("session"), str):
                    return [], "each from entry is {session, epoch?, seq?}"
                after = (pos.get("epoch", 0), pos.get("seq", -1))
                picks.extend(e for e in self._buffers.get(pos["session"], []) if e[0] > after)
        else:
            return [], "from is an array of positions or \"all\""
        return [e[2] for e in picks if matches(flt, e[3])], None

    # -- HTTP ------------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("Authorization", "")
        offered = header[7:] if header.startswith("Bearer ") else request.query.get("access_token", "")
        return hmac.compare_digest(offered.encode(), self.token.encode())

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _discovery(self, request: web.Request) -> web.Response:
        return web.json_response({"aep": [VERSION], "role": "collector",
                                  "endpoints": {"events": "/events", "stream": "/stream", "socket": "/socket"},
                                  "capabilities": CAPABILITIES})

    async def _post(self, request: web.Request) -> web.Response:
        # AEP-0003 §3.2: the version check comes before everything else.
        if request.headers.get("AEP-Version") != VERSION:
            return web.json_response({"versions": [VERSION]}, status=426)
        if not self._authorized(request):
            return web.Response(status=401, headers={"access-control-allow-origin": "*"})
        body = await request.text()
        if request.content_type == "application/json":
            lines = [body]
        elif request.content_type == "application/x-ndjson":
            lines = [line for line in body.split("\n") if line.strip()]
        else:
            return web.json_response({"error": "unsupported-media-type"}, status=415)
        events = []
        for i, line in enumerate(lines):  # the whole batch is checked before anything is ingested
            try:
                ev = json.loads(line)
            except ValueError as exc:
                return web.json_response({"error": "invalid-json", "line": i, "detail": str(exc)}, status=400)
            problem = envelope_problem(ev)
            if problem is not None:
                return web.json_response({"error": "invalid-event", "line": i, "detail": problem}, status=400)
            if is_command(ev["type"]):
                # Deviation from [ref], as the digest recommends: commands flow only on the duplex.
                return web.json_response({"error": "invalid-event", "line": i,
                                          "detail": "commands flow only on an authenticated WebSocket"}, status=403)
            text = line.strip()
            events.append((ev, _compact(ev) if "\n" in text else text))  # SSE data is one line
        for ev, line in events:
            self._ingest(ev, line, None)
        return web.Response(status=202)

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return web.Response(status=401, headers={"access-control-allow-origin": "*"})
        try:
            flt = json.loads(request.query.get("filter", "{}"))
            raw_from = request.query.get("from")
            from_ = None if raw_from is None else "all" if raw_from == "all" else json.loads(raw_from)
        except ValueError:
            return web.Response(status=400, text="bad filter or from JSON")
        problem = filter_problem(flt)
        if problem is None and "capture" in request.query:
            problem = "this relay double applies no capture ceiling"
        if problem is None:
            _, problem = self._replay(from_, flt)
        if problem is not None:
            return web.Response(status=400, text=problem, headers={"access-control-allow-origin": "*"})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache",
                                           "access-control-allow-origin": "*"})
        await resp.prepare(request)
        stream = _Stream(flt)
        # Replay snapshot and registration with no await between them: nothing lost or reordered.
        replay, _ = self._replay(from_, flt)
        for text in replay:
            stream.queue.put_nowait((json.loads(text), text))
        if request.query.get("live") == "0":
            stream.queue.put_nowait(_COMPLETE)
        else:
            self._streams.append(stream)
        try:
            while True:
                item = await stream.queue.get()
                if item is _SHUTDOWN:
                    await resp.write(b": shutting-down\n\n")
                    break
                if item is _COMPLETE:
                    await resp.write(b": replay-complete\n\n")
                    break
                ev, text = item
                chunk = f"event: {ev['type']}\ndata: {text}\n"
                if "session" in ev and "seq" in ev:
                    chunk += f"id: {ev['session']}:{ev.get('epoch', 0)}:{ev['seq']}\n"
                await resp.write((chunk + "\n").encode("utf-8"))
            with contextlib.suppress(Exception):
                await resp.write_eof()
        except ConnectionResetError:
            pass
        finally:
            if stream in self._streams:
                self._streams.remove(stream)
        return resp


async def wait_until(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Poll ``condition`` until it is truthy and return it; fail naming ``what`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def _serve(port: int, token: str | None) -> None:
    relay = RelayDouble(token=token, port=port)
    await relay.start()
    print(f"relay double listening on 127.0.0.1:{relay.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":  # `python -m tests.relay_double [port]`: a relay for benchmarks and demos
    import sys

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0, None))
