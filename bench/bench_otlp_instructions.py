"""Instructions per record on the OTLP receiver's side: decode, flatten and ingest, null consumer.

Usage: python bench/bench_otlp_instructions.py [--requests N] [--batch B] [--workload bench|varied|both]
                                              [--consumer null|pipeline]

Counted with ``valgrind --tool=callgrind`` as ``bench_instructions.py`` counts the in-process path:
the same process runs N and 2N export requests through the receiver's gRPC servicer method
(``_grpc_export``: parse, flatten, the ingest loop, the response) and the figure is
(I(2N) - I(N)) / (N x B). The transport (grpc's C core, aiohttp) is not in it: with the default
null consumer this is the receiver's own cost per record, what its code can change; with
``--consumer pipeline`` the records go on through ``bench_otlp.py``'s whole pipeline (mapping,
runs, capture, stamping, JSONL), the path ``bench_otlp.py`` times. Workloads:

- ``bench``: ``bench_otlp.py``'s request, B copilot_chat tool.call records whose attributes repeat
  (one body sent over and over, as that benchmark does);
- ``varied``: B records per request whose attributes mostly differ from record to record (token
  counts, request ids, durations, as chat-completion records carry), every request a different body,
  so the receiver's attribute cache misses often.

The bodies are built before the counted loop, the 2N run's in both runs. Needs valgrind; exits 2
without it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from pathlib import Path
from typing import Any

from result import callgrind, emit

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("bench", "varied")


def varied_body(batch: int, request: int) -> bytes:
    """``batch`` copilot_chat records of one request, most attribute values unique to their record."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def kv(key: str, **value: Any) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(**value))

    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.extend([kv("service.name", string_value="copilot-chat"),
                                   kv("service.version", string_value="0.37.0"),
                                   kv("session.id", string_value="vsc_bench_1")])
    sl = rl.scope_logs.add()
    sl.scope.name = "copilot-chat"
    for i in range(batch):
        n = request * batch + i
        lr = sl.log_records.add()
        lr.time_unix_nano = 1783073704221000000 + n
        lr.severity_number = 9
        if i % 2:
            lr.event_name = "copilot_chat.tool.call"
            lr.attributes.extend([kv("gen_ai.tool.name", string_value=("readFile", "runInTerminal")[n % 2]),
                                  kv("duration_ms", int_value=17 + n * 7 % 4000),
                                  kv("success", bool_value=n % 10 != 0),
                                  kv("gen_ai.tool.call.id", string_value=f"call_{n:08x}")])
        else:
            lr.event_name = "copilot_chat.chat.response"
            lr.attributes.extend([kv("gen_ai.request.model", string_value="gpt-4.1"),
                                  kv("gen_ai.response.id", string_value=f"chatcmpl-{n:012d}"),
                                  kv("gen_ai.usage.input_tokens", int_value=1000 + n * 37 % 90000),
                                  kv("gen_ai.usage.output_tokens", int_value=n * 13 % 4000),
                                  kv("duration_ms", int_value=300 + n * 11 % 20000)])
    return req.SerializeToString()


def bodies(workload: str, batch: int, requests: int) -> list[bytes]:
    if workload == "bench":
        from bench_otlp import request_body

        return [request_body(batch)] * requests
    return [varied_body(batch, r) for r in range(requests)]


def inner(workload: str, batch: int, requests: int, built: int, consumer_spec: str = "null") -> None:
    """The measured process: warm up, then ``requests`` exports through ``_grpc_export``."""
    from aep_collector.pipeline.component import CreateSettings
    from aep_collector.pipeline.service import freeze_startup_heap, raise_young_threshold
    from aep_collector.receivers.otlp import OtlpConfig, OtlpReceiver
    from bench_otlp import make_consumer

    consumer = make_consumer(consumer_spec)
    receiver = OtlpReceiver(CreateSettings(id="otlp/vscode"),
                            OtlpConfig(profile="vscode", mode="primary", grpc={"endpoint": "127.0.0.1:0"}),
                            consumer)
    warm = bodies(workload, batch, 5)
    work = bodies(workload, batch, 5 + max(built, requests))[5:5 + requests]  # varied: not the warm-up's again

    # As the collector does once started (and bench_otlp's receiver): without it a full collection
    # over the start-up heap fell in one run and not the other, and read as ~90,000 a record.
    freeze_startup_heap()
    raise_young_threshold()

    async def run() -> None:
        for body in warm + work:
            await receiver._grpc_export(body, None)  # type: ignore[arg-type]  # success never touches it

    asyncio.run(run())
    if consumer.records != (len(warm) + len(work)) * batch:
        raise SystemExit(f"consumed {consumer.records} records, expected {(len(warm) + len(work)) * batch}")


def count(workload: str, batch: int, requests: int, built: int, consumer: str) -> int:
    return callgrind([sys.executable, str(Path(__file__).resolve()), "--inner", str(requests), "--workload",
                      workload, "--batch", str(batch), "--built", str(built), "--consumer", consumer],
                     ROOT, {"PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin"})


def per_record(workload: str, batch: int, requests: int, consumer: str) -> float:
    built = 2 * requests
    return (count(workload, batch, built, built, consumer)
            - count(workload, batch, requests, built, consumer)) / (requests * batch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50, help="N (default 50; the second run has 2N)")
    ap.add_argument("--batch", type=int, default=100, help="records per request (default 100)")
    ap.add_argument("--workload", default="both", choices=(*WORKLOADS, "both"))
    ap.add_argument("--consumer", default="null", choices=("null", "pipeline"),
                    help="null: the receiver alone (default); pipeline: on through the whole pipeline")
    ap.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--built", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner is not None:
        inner(args.workload, args.batch, args.inner, args.built, args.consumer)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind not found: instruction counts need valgrind --tool=callgrind", file=sys.stderr)
        return 2
    figures = {}
    for workload in (WORKLOADS if args.workload == "both" else (args.workload,)):
        figures[workload] = per_record(workload, args.batch, args.requests, args.consumer)
        print(f"{workload:>7}: {figures[workload]:>9,.0f} instructions/record "
              f"(N={args.requests} vs 2N requests of {args.batch} records, gRPC servicer method, "
              f"{args.consumer} consumer)")
    emit("otlp_instructions", batch=args.batch, requests=args.requests, consumer=args.consumer,
         instructions_per_record=figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
