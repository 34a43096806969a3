"""The persistent sending queue's cost per event while its peer is down, and its drain rate after.

Usage: python bench/bench_queue.py [--events N] [--batch B] [--fsync interval|always|never]

Measures, on one thread as in the collector: ``put`` (serialize + one append per batch, what a hook
pays for each queued exporter) with nobody delivering; then the drain rate (read back, parse,
``deliver`` to a peer that takes everything at once, cursor step per batch). The baseline is the
JSONL exporter writing the same events, which every hook pays already.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter  # noqa: E402
from aep_collector.pipeline.component import CreateSettings  # noqa: E402
from aep_collector.pipeline.host import Health, Host  # noqa: E402
from aep_collector.pipeline.sending_queue import SendingQueue, SendingQueueConfig  # noqa: E402
from result import emit  # noqa: E402


def events(n: int) -> list[dict]:
    return [{"aep": "0.1", "id": f"01JBENCH{i:018d}", "type": "tool.completed", "subject": "Bash",
             "time": "2026-12-03T08:00:00.000Z", "source": f"aep://h/agent/claude-code/session/s{i % 8}",
             "agent": "claude-code", "session": f"s{i % 8}", "run": "r1", "seq": i, "epoch": 1,
             "capture": "metadata", "data": {"tool": {"name": "Bash", "call_id": f"t{i}"}, "status": "success",
                                             "duration_ms": 12}} for i in range(n)]


async def run(n: int, batch: int, fsync: str) -> None:
    evs = events(n)
    batches = [evs[i:i + batch] for i in range(0, n, batch)]
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=f"{tmp}/logs", fsync=fsync))
        await jsonl.start(Host())
        t0 = time.perf_counter()
        for b in batches:
            jsonl.export_now(b)
        t_jsonl = time.perf_counter() - t0
        await jsonl.shutdown()

        taken = 0
        done = asyncio.Event()

        async def peer(got: list[dict]) -> None:
            nonlocal taken
            taken += len(got)
            if taken >= n:
                done.set()

        cfg = SendingQueueConfig(fsync=fsync, max_bytes=1 << 31)
        q = SendingQueue("exporter/bench", Path(tmp) / "q", cfg, peer, Health())
        q.open()
        t0 = time.perf_counter()
        for b in batches:
            q.put(b)  # the peer is down: nobody drains while we write
        t_put = time.perf_counter() - t0
        size = q.pending_bytes
        q.start()
        t0 = time.perf_counter()
        await done.wait()
        t_drain = time.perf_counter() - t0
        await q.drain(1.0)
    print(f"events {n}, batch {batch}, fsync {fsync}, {size / n:.0f} bytes/event on disk")
    print(f"{'':28}{'us/event':>10}{'events/s':>12}")
    print(f"{'JSONL write (baseline)':28}{t_jsonl / n * 1e6:>10.2f}{n / t_jsonl:>12,.0f}")
    print(f"{'queue put, peer down':28}{t_put / n * 1e6:>10.2f}{n / t_put:>12,.0f}")
    print(f"{'queue drain to a fast peer':28}{t_drain / n * 1e6:>10.2f}{n / t_drain:>12,.0f}")
    print(f"queue put / JSONL write: {t_put / t_jsonl:.2f}x")
    emit("queue", events=n, batch=batch, fsync=fsync, bytes_per_event=size / n, jsonl_us=t_jsonl / n * 1e6,
         put_us=t_put / n * 1e6, drain_us=t_drain / n * 1e6)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--fsync", default="interval", choices=["interval", "always", "never"])
    args = ap.parse_args()
    asyncio.run(run(args.events, args.batch, args.fsync))
    return 0


if __name__ == "__main__":
    sys.exit(main())
