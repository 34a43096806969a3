"""LogRecords per second through the ``otlp`` receiver over gRPC and HTTP at several batch sizes.

The receiver runs in a child process (its own interpreter, so client work does not share its GIL)
with a pluggable next consumer; the parent sends the same export request over and over with a few
in flight and counts a request done when its response arrives, which the receiver sends only after
``consume`` returned. Figures are a rough guide to headroom, not a test: nothing is asserted.
Besides records/s (wall clock, which a busy machine moves), each row gives the receiver process's
CPU µs per record over the same requests (every thread of it, grpc's included): what other load
on the machine moves least; and the client's own CPU µs per request.

The clients are lean on purpose, as bench_hooks' generator is: on two cores the client competes
with the receiver for CPU, and the library clients this benchmark used before cost about as much a
request as the receiver's own transport work (grpcio's asyncio client 270-890 µs, aiohttp's
180-570 µs, from batch 1 to 1000, measured beside the receiver with a null consumer), so they
measured the client as much as the receiver. Each request is built once, before the clock starts
(headers and body), and driven by one thread over blocking sockets: OTLP/HTTP as HTTP/1.1 on
keep-alive connections, each reply read as far as its status (200 or the run stops) and
``Content-Length``; OTLP/gRPC as HTTP/2 written by hand, enough for unary calls on one connection
(HPACK without Huffman strings, which grpc's C core does not send; flow control for the request
bodies; SETTINGS and PING acknowledged), every call answered with ``grpc-status: 0`` or the run
stops. They cost 25-110 µs (HTTP) and 70-160 µs (gRPC) a request. The receiver's side is what it
was: the same bodies to the real grpc and aiohttp servers, with the headers grpcio sends (its own
user agent) and over HTTP Host, User-Agent, Content-Type and Content-Length (aiohttp's Accept and
Accept-Encoding left out).

    .venv/bin/python bench/bench_otlp.py                      # consumer: the whole pipeline (default)
    .venv/bin/python bench/bench_otlp.py --consumer null      # the receiver alone
    .venv/bin/python bench/bench_otlp.py --consumer pkg.mod:make_consumer   # e.g. a whole pipeline

The receiver is measured on protobuf's upb backend only (the one a default install gets): the
pure-Python backend is an order of magnitude slower, and a run on it exits with an error rather
than printing figures that describe a misconfigured machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import multiprocessing
import re
import select
import socket
import time
from multiprocessing.connection import Connection
from typing import Any

from result import emit

BATCHES = (1, 100, 1000)
EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


class NullConsumer:
    """Counts records and does nothing else: the receiver's own cost."""

    def __init__(self) -> None:
        self.records = 0

    async def consume(self, batch: list[Any]) -> list[Any]:
        self.records += len(batch)
        return []


class MappingConsumer(NullConsumer):
    """The real mapping processor (dispatch + ``vscode_otel``/``codex_otel``) over every batch."""

    def __init__(self) -> None:
        super().__init__()
        from aep_collector.processors.mapping import MappingProcessor

        self.mapping = MappingProcessor()
        self.drafts = 0

    async def consume(self, batch: list[Any]) -> list[Any]:
        self.records += len(batch)
        self.drafts += len(self.mapping(batch))
        return []


class PipelineConsumer(NullConsumer):
    """The whole pipeline: mapping -> runs -> capture -> stamping -> JSONL (to a temp dir)."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        from pathlib import Path

        from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
        from aep_collector.pipeline.component import CreateSettings
        from aep_collector.pipeline.envelope import Stamper
        from aep_collector.pipeline.host import Health
        from aep_collector.pipeline.pipeline import Pipeline
        from aep_collector.processors.capture import CaptureProcessor
        from aep_collector.processors.mapping import MappingProcessor
        from aep_collector.processors.runs import RunsProcessor

        self.tmp = tempfile.mkdtemp(prefix="aep-bench-otlp-")
        health = Health()
        self.jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=f"{self.tmp}/logs",
                                                                           fsync="never"))
        self.jsonl.health = health
        self.pipeline = Pipeline("bench", [MappingProcessor(), RunsProcessor(), CaptureProcessor()],
                                 Stamper(Path(self.tmp), "bench"), health, [("exporter/jsonl", self.jsonl)], [])

    async def consume(self, batch: list[Any]) -> list[Any]:
        self.records += len(batch)
        await self.pipeline.consume(batch)
        return []


def make_consumer(spec: str) -> Any:
    """``pipeline``, ``mapping``, ``null``, or ``module:callable`` returning an object with ``async consume``."""
    if spec == "pipeline":
        return PipelineConsumer()
    if spec == "mapping":
        return MappingConsumer()
    if spec == "null":
        return NullConsumer()
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)()


def require_upb() -> None:
    """Exit loudly unless protobuf runs on its upb backend (see the module docstring)."""
    from google.protobuf.internal import api_implementation

    backend = api_implementation.Type()
    if backend != "upb":
        raise SystemExit(f"protobuf backend is {backend!r}, not 'upb' (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION "
                         "set, or a protobuf wheel without upb): the OTLP figures would not describe the "
                         "receiver as installed")


def serve(spec: str, profile: str, mode: str, conn: Connection) -> None:
    """Child process: run the receiver until the parent says stop, then report what it consumed."""
    require_upb()
    from aep_collector.pipeline.component import CreateSettings
    from aep_collector.pipeline.host import Host
    from aep_collector.pipeline.service import freeze_startup_heap, raise_young_threshold
    from aep_collector.receivers.otlp import OtlpConfig, OtlpReceiver

    async def main() -> None:
        consumer = make_consumer(spec)
        cfg = OtlpConfig(profile=profile, mode=mode, grpc={"endpoint": "127.0.0.1:0"},
                         http={"endpoint": "127.0.0.1:0"}, max_request_bytes=64 << 20)
        receiver = OtlpReceiver(CreateSettings(id=f"otlp/{profile}"), cfg, consumer)
        await receiver.start(Host())
        # As the collector does once started (pipeline/service.py run_until_signalled): the start-up
        # heap (grpc, protobuf, aiohttp) leaves the cyclic collector's scans and the young generation
        # grows, as in bench_pipeline.
        freeze_startup_heap()
        raise_young_threshold()
        conn.send((receiver.grpc_port, receiver.http_port))
        # "cpu" asks for this process's CPU seconds so far (every thread: grpc's own included), so
        # the parent can take the receiver's CPU per record around each measurement; "stop" ends.
        while await asyncio.get_running_loop().run_in_executor(None, conn.recv) == "cpu":
            conn.send(time.process_time())
        await receiver.shutdown()
        conn.send(getattr(consumer, "records", None))

    asyncio.run(main())


def request_body(records: int) -> bytes:
    """One export request of ``records`` VS Code tool-call records (the fixture's shape)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    request = ExportLogsServiceRequest()
    rl = request.resource_logs.add()
    for key, value in (("service.name", "copilot-chat"), ("service.version", "0.37.0"),
                       ("session.id", "vsc_bench_1")):
        rl.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    sl = rl.scope_logs.add()
    sl.scope.name = "copilot-chat"
    for i in range(records):
        lr = sl.log_records.add()
        lr.time_unix_nano = 1783073704221000000 + i
        lr.severity_number = 9
        lr.event_name = "copilot_chat.tool.call"
        lr.attributes.extend([
            KeyValue(key="gen_ai.tool.name", value=AnyValue(string_value="readFile")),
            KeyValue(key="duration_ms", value=AnyValue(int_value=63 + i % 50)),
            KeyValue(key="success", value=AnyValue(bool_value=i % 10 != 0)),
        ])
        if i % 10 == 0:
            lr.attributes.append(KeyValue(key="error.type", value=AnyValue(string_value="ToolCallError")))
    return request.SerializeToString()


_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *([0-9]+)")


def http_closed_loop(port: int, request: bytes, requests: int, concurrency: int) -> None:
    """Send ``request`` (a whole ``POST``, built beforehand) ``requests`` times over ``concurrency``
    keep-alive HTTP/1.1 connections, each sending its next one as soon as its reply is whole.

    One thread, ``select``, a reply read only as far as its status and ``Content-Length`` (as
    bench_hooks' generator does), so the client's CPU a request stays small beside the receiver's.
    """
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(min(concurrency, requests))]
    replies: dict[socket.socket, bytes] = {}
    sent = finished = 0
    try:
        for s in socks:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(request)
            replies[s] = b""
            sent += 1
        while finished < requests:
            ready = select.select(list(replies), [], [], 30)[0]
            if not ready:
                raise RuntimeError("no reply within 30 s")
            for s in ready:
                data = s.recv(65536)
                if not data:
                    raise RuntimeError("the receiver closed a keep-alive connection")
                reply = replies[s] + data
                head_end = reply.find(b"\r\n\r\n")
                if head_end < 0:
                    replies[s] = reply
                    continue
                m = _CONTENT_LENGTH.search(reply[:head_end].lower())
                if m is None:  # aiohttp always sends one for a plain Response
                    raise RuntimeError(f"reply without Content-Length: {reply[:200]!r}")
                if len(reply) < head_end + 4 + int(m.group(1)):
                    replies[s] = reply
                    continue
                if reply[9:12] != b"200":
                    raise RuntimeError(f"HTTP reply {reply[:300]!r}")
                finished += 1
                if sent < requests:
                    s.sendall(request)  # blocking is fine: the receiver reads while this one writes
                    replies[s] = b""
                    sent += 1
                else:
                    del replies[s]
    finally:
        for s in socks:
            s.close()


# The gRPC half of the lean client: HTTP/2 by hand, enough for unary calls to one server.

_STATIC = [("", "")] + [tuple(e.split(" ", 1)) if " " in e else (e, "") for e in (  # RFC 7541 Appendix A
    ":authority", ":method GET", ":method POST", ":path /", ":path /index.html", ":scheme http",
    ":scheme https", ":status 200", ":status 204", ":status 206", ":status 304", ":status 400",
    ":status 404", ":status 500", "accept-charset", "accept-encoding gzip, deflate", "accept-language",
    "accept-ranges", "accept", "access-control-allow-origin", "age", "allow", "authorization",
    "cache-control", "content-disposition", "content-encoding", "content-language", "content-length",
    "content-location", "content-range", "content-type", "cookie", "date", "etag", "expect", "expires",
    "from", "host", "if-match", "if-modified-since", "if-none-match", "if-range", "if-unmodified-since",
    "last-modified", "link", "location", "max-forwards", "proxy-authenticate", "proxy-authorization",
    "range", "referer", "refresh", "retry-after", "server", "set-cookie", "strict-transport-security",
    "transfer-encoding", "user-agent", "vary", "via", "www-authenticate")]


class Hpack:
    """An HPACK (RFC 7541) header block decoder without Huffman strings: grpc's C core sends
    plain ones, and a Huffman string stops the run with an error rather than being misread."""

    def __init__(self) -> None:
        self.table: list[tuple[str, str]] = []  # the dynamic table, newest first
        self.size = 0
        self.max_size = 4096

    def _int(self, data: bytes, at: int, bits: int) -> tuple[int, int]:
        mask = (1 << bits) - 1
        value = data[at] & mask
        at += 1
        if value < mask:
            return value, at
        shift = 0
        while True:
            byte = data[at]
            at += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, at

    def _str(self, data: bytes, at: int) -> tuple[str, int]:
        huffman = data[at] & 0x80
        length, at = self._int(data, at, 7)
        if huffman:
            raise RuntimeError("a Huffman-coded header string (this client reads plain ones only)")
        return data[at:at + length].decode("latin-1"), at + length

    def _entry(self, index: int) -> tuple[str, str]:
        if index < len(_STATIC):
            return _STATIC[index]
        return self.table[index - len(_STATIC)]

    def _add(self, name: str, value: str) -> None:
        self.table.insert(0, (name, value))
        self.size += len(name) + len(value) + 32
        self._evict()

    def _evict(self) -> None:
        while self.size > self.max_size:
            name, value = self.table.pop()
            self.size -= len(name) + len(value) + 32

    def decode(self, data: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        at = 0
        while at < len(data):
            byte = data[at]
            if byte & 0x80:  # indexed field
                index, at = self._int(data, at, 7)
                name, value = self._entry(index)
            elif byte & 0xE0 == 0x20:  # dynamic table size update
                self.max_size, at = self._int(data, at, 5)
                self._evict()
                continue
            else:  # literal: with incremental indexing (01), without (0000) or never indexed (0001)
                indexing = byte & 0xC0 == 0x40
                index, at = self._int(data, at, 6 if indexing else 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, at = self._str(data, at)
                value, at = self._str(data, at)
                if indexing:
                    self._add(name, value)
            out[name] = value
        return out


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _hpack_literal(name: str, value: str) -> bytes:
    # Literal without indexing, new name, plain strings (every length here is < 127).
    return b"\x00" + bytes((len(name),)) + name.encode() + bytes((len(value),)) + value.encode()


def grpc_closed_loop(port: int, path: str, message: bytes, requests: int, concurrency: int) -> None:
    """Call the unary method ``path`` with ``message`` ``requests`` times over one HTTP/2 connection,
    ``concurrency`` calls in flight, each answered with ``grpc-status: 0`` or the run stops.

    One thread and a blocking socket; the request frames are built once. It does what a unary
    call needs and no more: HPACK without Huffman for the replies, flow control for the request
    bodies (this side advertises windows no reply can fill), SETTINGS and PING acknowledged.
    """
    DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
    big = (1 << 31) - 1
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)  # a stalled receiver stops the run
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    block = (b"\x83\x86"  # :method POST, :scheme http
             + _hpack_literal(":path", path) + _hpack_literal(":authority", f"127.0.0.1:{port}")
             + _hpack_literal("content-type", "application/grpc") + _hpack_literal("te", "trailers")
             # what grpcio's client sends besides, so the receiver parses as much as before
             + _hpack_literal("grpc-accept-encoding", "identity, deflate, gzip")
             + _hpack_literal("user-agent", "bench-otlp"))
    body = b"\x00" + len(message).to_bytes(4, "big") + message  # the gRPC length prefix, uncompressed
    hpack = Hpack()
    send_window, initial, max_frame = 65535, 65535, 16384  # HTTP/2 defaults until the server's SETTINGS
    streams: dict[int, list[Any]] = {}  # stream id -> [bytes of the body still to send, its window, headers]
    pending: list[int] = []  # streams with body left to send, oldest first
    next_id, sent, finished = 1, 0, 0
    buf = b""
    header_block: list[Any] = []  # [stream, bytes] of a HEADERS still awaiting its CONTINUATION

    def start() -> None:
        nonlocal next_id, sent
        sid, next_id, sent = next_id, next_id + 2, sent + 1
        sock.sendall(_frame(HEADERS, 0x4, sid, block))  # END_HEADERS
        streams[sid] = [0, initial, {}]
        pending.append(sid)

    def pump() -> None:
        # Send what the windows allow, streams in order; the last frame of a body ends its stream.
        nonlocal send_window
        out = []
        for sid in list(pending):
            state = streams[sid]
            while state[0] < len(body) and send_window > 0 and state[1] > 0:
                n = min(len(body) - state[0], send_window, state[1], max_frame)
                end = state[0] + n == len(body)
                out.append(_frame(DATA, 0x1 if end else 0, sid, body[state[0]:state[0] + n]))
                state[0] += n
                state[1] -= n
                send_window -= n
            if state[0] == len(body):
                pending.remove(sid)
        if out:
            sock.sendall(b"".join(out))

    def headers(sid: int, data: bytes, end: bool) -> None:
        nonlocal finished
        fields = hpack.decode(data)
        state = streams.get(sid)
        if state is None:
            raise RuntimeError(f"HEADERS on stream {sid}, which this client did not open")
        state[2].update(fields)
        if end:
            got = state[2]
            if got.get(":status") != "200" or got.get("grpc-status") != "0":
                raise RuntimeError(f"gRPC call failed: {got}")
            del streams[sid]
            finished += 1
            if sent < requests:
                start()

    try:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                     + _frame(SETTINGS, 0, 0, (2).to_bytes(2, "big") + (0).to_bytes(4, "big")  # no push
                              + (4).to_bytes(2, "big") + big.to_bytes(4, "big"))  # initial window
                     + _frame(WINDOW, 0, 0, (big - 65535).to_bytes(4, "big")))
        for _ in range(min(concurrency, requests)):
            start()
        pump()
        while finished < requests:
            data = sock.recv(262144)
            if not data:
                raise RuntimeError("the receiver closed the HTTP/2 connection")
            buf += data
            while len(buf) >= 9:
                length = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + length:
                    break
                kind, flags, sid = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & big
                payload, buf = buf[9:9 + length], buf[9 + length:]
                if kind == DATA:
                    pass  # the reply message: this side's windows never run out (see SETTINGS above)
                elif kind == HEADERS:
                    if flags & 0x8:  # PADDED
                        payload = payload[1:length - payload[0]]
                    if flags & 0x20:  # PRIORITY
                        payload = payload[5:]
                    if flags & 0x4:
                        headers(sid, payload, bool(flags & 0x1))
                    else:
                        header_block[:] = [sid, payload, bool(flags & 0x1)]
                elif kind == CONTINUATION:
                    header_block[1] += payload
                    if flags & 0x4:
                        headers(*header_block)
                        header_block.clear()
                elif kind == SETTINGS:
                    if not flags & 0x1:
                        for at in range(0, len(payload), 6):
                            key, value = int.from_bytes(payload[at:at + 2], "big"), int.from_bytes(payload[at + 2:at + 6], "big")
                            if key == 4:
                                for state in streams.values():
                                    state[1] += value - initial
                                initial = value
                            elif key == 5:
                                max_frame = value
                        sock.sendall(_frame(SETTINGS, 0x1, 0))
                elif kind == WINDOW:
                    increment = int.from_bytes(payload, "big") & big
                    if sid == 0:
                        send_window += increment
                    elif sid in streams:
                        streams[sid][1] += increment
                elif kind == PING:
                    if not flags & 0x1:
                        sock.sendall(_frame(PING, 0x1, 0, payload))
                elif kind in (RST, GOAWAY):
                    raise RuntimeError(f"the receiver sent {'RST_STREAM' if kind == RST else 'GOAWAY'}: {payload!r}")
            pump()
    finally:
        sock.close()


def measure(call: Any, requests: int, cpu: Any) -> tuple[float, float, float]:
    """Seconds ``call(n)`` takes to get ``requests`` answers (after 20 unmeasured, to warm up
    connections and code paths), the receiver process's CPU seconds meanwhile (``cpu()`` reads its
    clock) and this process's: the client's."""
    call(min(20, requests))
    cpu0, own0 = cpu(), time.process_time()
    start = time.perf_counter()
    call(requests)
    wall = time.perf_counter() - start
    return wall, cpu() - cpu0, time.process_time() - own0


def run(ports: tuple[int, int], target: int, concurrency: int, conn: Connection,
        batches: tuple[int, ...] = BATCHES) -> list[tuple[Any, ...]]:
    grpc_port, http_port = ports
    rows = []

    def cpu() -> float:
        conn.send("cpu")
        return float(conn.recv())

    for transport in ("gRPC", "HTTP"):
        for batch in batches:
            body = request_body(batch)
            requests = max(target // batch, 50)
            if transport == "gRPC":
                def call(n: int, body: bytes = body) -> None:
                    grpc_closed_loop(grpc_port, EXPORT, body, n, concurrency)
            else:
                request = (f"POST /v1/logs HTTP/1.1\r\nHost: 127.0.0.1:{http_port}\r\nUser-Agent: bench-otlp\r\n"
                           f"Content-Type: application/x-protobuf\r\nContent-Length: {len(body)}\r\n\r\n").encode()

                def call(n: int, request: bytes = request + body) -> None:
                    http_closed_loop(http_port, request, n, concurrency)
            seconds, cpu_s, own_s = measure(call, requests, cpu)
            rows.append((transport, batch, requests, requests * batch, len(body), seconds, cpu_s, own_s))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="records per measurement (default 20000)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    parser.add_argument("--consumer", default="pipeline", help="pipeline | mapping | null | module:callable")
    parser.add_argument("--profile", default="vscode", choices=("vscode", "codex"))
    parser.add_argument("--mode", default="primary", choices=("companion", "primary"))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help="records per request, comma-separated (default 1,100,1000)")
    args = parser.parse_args()
    require_upb()

    ctx = multiprocessing.get_context("spawn")  # grpc does not survive fork
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(args.consumer, args.profile, args.mode, child), daemon=True)
    proc.start()
    try:
        ports = parent.recv()
        batches = tuple(int(b) for b in args.batches.split(","))
        rows = run(ports, args.records, args.concurrency, parent, batches)
        parent.send("stop")
        consumed = parent.recv()
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()

    print(f"otlp receiver -> {args.consumer} consumer ({args.profile}, {args.mode} mode), "
          f"{args.concurrency} requests in flight")
    print(f"{'transport':<9} {'batch':>6} {'requests':>9} {'records':>8} {'bytes/req':>10} {'seconds':>8} "
          f"{'records/s':>10} {'requests/s':>10} {'rx CPU µs/record':>17} {'client µs/req':>14}")
    for transport, batch, requests, records, size, seconds, cpu_s, own_s in rows:
        print(f"{transport:<9} {batch:>6} {requests:>9} {records:>8} {size:>10} {seconds:>8.2f} "
              f"{records / seconds:>10.0f} {requests / seconds:>10.0f} {cpu_s / records * 1e6:>17.2f} "
              f"{own_s / requests * 1e6:>14.0f}")
    if consumed is not None:
        print(f"records consumed by the receiver's consumer (warm-up included): {consumed}")
    emit("otlp", consumer=args.consumer, profile=args.profile, mode=args.mode, concurrency=args.concurrency,
         rows=[{"transport": t, "batch": b, "requests": n, "records": r, "bytes_per_request": size,
                "records_per_s": r / seconds, "receiver_cpu_us_per_record": cpu_s / r * 1e6,
                "client_cpu_us_per_request": own_s / n * 1e6}
               for t, b, n, r, size, seconds, cpu_s, own_s in rows])


if __name__ == "__main__":
    main()
