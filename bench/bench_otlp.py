"""LogRecords per second through the ``otlp`` receiver over gRPC and HTTP at several batch sizes.

The receiver runs in a child process (its own interpreter, so client work does not share its GIL)
with a pluggable next consumer; the parent fires pre-encoded export requests with a few in
flight and counts a request done when its response arrives, which the receiver sends only after
``consume`` returned. Figures are a rough guide to headroom, not a test: nothing is asserted.
Besides records/s (wall clock, which a busy machine moves), each row gives the receiver process's
CPU µs per record over the same requests (every thread of it, grpc's included): what other load
on the machine moves least.

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


async def drive(send: Any, body: bytes, requests: int, concurrency: int, cpu: Any) -> tuple[float, float]:
    """Seconds to get ``requests`` responses with ``concurrency`` requests in flight, and the
    receiver process's CPU seconds meanwhile (``cpu()`` reads its clock)."""
    for _ in range(min(20, requests)):  # warm-up: connections, code paths
        await send(body)
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            await send(body)
    cpu0 = cpu()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return wall, cpu() - cpu0


async def run(ports: tuple[int, int], target: int, concurrency: int, conn: Connection,
              batches: tuple[int, ...] = BATCHES) -> list[tuple[Any, ...]]:
    import aiohttp
    import grpc

    grpc_port, http_port = ports
    rows = []
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}",
                                        options=[("grpc.max_send_message_length", 64 << 20)])
    export = channel.unary_unary(EXPORT)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))
    url = f"http://127.0.0.1:{http_port}/v1/logs"

    def cpu() -> float:
        conn.send("cpu")
        return float(conn.recv())

    async def send_grpc(body: bytes) -> None:
        await export(body)

    async def send_http(body: bytes) -> None:
        async with http.post(url, data=body, headers={"Content-Type": "application/x-protobuf"}) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
            await r.read()
    try:
        for transport, send in (("gRPC", send_grpc), ("HTTP", send_http)):
            for batch in batches:
                body = request_body(batch)
                requests = max(target // batch, 50)
                seconds, cpu_s = await drive(send, body, requests, concurrency, cpu)
                rows.append((transport, batch, requests, requests * batch, len(body), seconds, cpu_s))
    finally:
        await http.close()
        await channel.close()
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
        rows = asyncio.run(run(ports, args.records, args.concurrency, parent, batches))
        parent.send("stop")
        consumed = parent.recv()
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()

    print(f"otlp receiver -> {args.consumer} consumer ({args.profile}, {args.mode} mode), "
          f"{args.concurrency} requests in flight")
    print(f"{'transport':<9} {'batch':>6} {'requests':>9} {'records':>8} {'bytes/req':>10} "
          f"{'seconds':>8} {'records/s':>10} {'requests/s':>10} {'rx CPU µs/record':>17}")
    for transport, batch, requests, records, size, seconds, cpu_s in rows:
        print(f"{transport:<9} {batch:>6} {requests:>9} {records:>8} {size:>10} {seconds:>8.2f} "
              f"{records / seconds:>10.0f} {requests / seconds:>10.0f} {cpu_s / records * 1e6:>17.2f}")
    if consumed is not None:
        print(f"records consumed by the receiver's consumer (warm-up included): {consumed}")
    emit("otlp", consumer=args.consumer, profile=args.profile, mode=args.mode, concurrency=args.concurrency,
         rows=[{"transport": t, "batch": b, "requests": n, "records": r, "bytes_per_request": size,
                "records_per_s": r / seconds, "receiver_cpu_us_per_record": cpu_s / r * 1e6}
               for t, b, n, r, size, seconds, cpu_s in rows])


if __name__ == "__main__":
    main()
