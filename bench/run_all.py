"""Run every benchmark, one after another, and print their tables.

    python bench/run_all.py            # the full set (about five minutes on 2 cores)
    python bench/run_all.py --quick    # shorter runs, same shape (for a smoke check)

Each benchmark prints its own figures and the ratios its targets are stated in; nothing here
asserts on time. Run on an otherwise idle machine: the ratios are measured in the same run, so
steady load cancels, but bursts do not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    q = args.quick
    runs = [
        ("hook round trip, JSONL + relay exporters (open loop)",
         ["bench_hooks.py", "--rates", "100,1000", "--duration", "5" if q else "30", "--relay"]),
        ("command shim start-up", ["bench_shim.py", "--runs", "10" if q else "40"]),
        ("instructions per event in-process (callgrind, N vs 2N events)",
         ["bench_instructions.py", "--events", "500" if q else "2000", *([] if q else ["--stages"])]),
        ("pipeline throughput in-process (one core)", ["bench_pipeline.py", "--events", "20000" if q else "100000"]),
        ("OTLP LogRecords through the whole pipeline", ["bench_otlp.py", "--records", "5000" if q else "60000"]),
        ("relay role fan-out to SSE/WebSocket subscribers", ["bench_relay_role.py", "--events", "2000" if q else "20000"]),
        ("persistent sending queue, peer down", ["bench_queue.py", "--events", "20000" if q else "200000"]),
        ("fleet on NATS JetStream: events/s in, hook -> gateway subscriber latency",
         ["bench_nats.py", "--events", "10000" if q else "50000", "--duration", "5" if q else "20"]),
        ("memory with live sessions", ["bench_memory.py", "--sessions", "200" if q else "1000",
                                       "--events", "20" if q else "100"]),
    ]
    failed = 0
    for title, cmd in runs:
        print(f"\n== {title}\n$ python bench/{' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(BENCH / cmd[0]), *cmd[1:]], cwd=BENCH.parent)
        print(f"({time.perf_counter() - t0:.0f} s{'' if rc == 0 else f', exit {rc}'})", flush=True)
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
