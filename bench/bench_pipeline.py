"""Events per second through the pipeline in-process: mapping + runs + capture + stamping + JSONL.

Usage: python bench/bench_pipeline.py [--events N] [--batch B] [--sessions S]
Prints figures and the ratio to the 100,000 events/s target. One core: everything runs on one
thread, as in the collector.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporters.jsonl import JsonlConfig, JsonlExporter  # noqa: E402
from pipeline.component import CreateSettings  # noqa: E402
from pipeline.envelope import Stamper  # noqa: E402
from pipeline.host import Host  # noqa: E402
from pipeline.model import Signal  # noqa: E402
from pipeline.pipeline import Pipeline  # noqa: E402
from processors.capture import CaptureConfig, CaptureProcessor  # noqa: E402
from processors.mapping import MappingProcessor  # noqa: E402
from processors.runs import RunsProcessor  # noqa: E402

TARGET = 100_000


def signals(n: int, sessions: int) -> list[Signal]:
    out = []
    for i in range(n):
        sid = f"bench-{i % sessions}"
        call = f"toolu_{i}"
        if i % 2 == 0:
            out.append(Signal("claude-code", "PreToolUse", {
                "session_id": sid, "hook_event_name": "PreToolUse", "tool_name": "Bash",
                "tool_input": {"command": f"pytest -q tests/test_{i}.py", "description": "run"},
                "tool_use_id": call, "cwd": "/home/dev/project"}))
        else:
            out.append(Signal("claude-code", "PostToolUse", {
                "session_id": sid, "hook_event_name": "PostToolUse", "tool_name": "Bash",
                "tool_input": {"command": "pytest"}, "tool_response": {"stdout": "ok " * 20, "exit_code": 0},
                "tool_use_id": call}))
    return out


async def run(events: int, batch: int, sessions: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(state_dir=Path(tmp))
        jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=f"{tmp}/logs", fsync="never"))
        await jsonl.start(host)
        procs = [MappingProcessor(), RunsProcessor(), CaptureProcessor(CaptureConfig())]
        pipe = Pipeline("bench", procs, Stamper(Path(tmp), "bench"), host.health, [("exporter/jsonl", jsonl)], [])
        work = signals(events, sessions)
        # Warm-up: imports, first file opens.
        for i in range(0, min(2000, events), batch):
            await pipe.consume(work[i:i + batch])
        start = time.perf_counter()
        cpu0 = time.process_time()
        for i in range(0, events, batch):
            await pipe.consume(work[i:i + batch])
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        await jsonl.shutdown()
    return {"events": events, "wall_s": wall, "cpu_s": cpu, "events_per_s": events / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--sessions", type=int, default=100)
    args = ap.parse_args()
    print(f"{'batch':>6} {'events':>8} {'wall s':>8} {'events/s':>10} {'vs target':>10}")
    for b in sorted({1, 100, args.batch}):
        r = asyncio.run(run(args.events, b, args.sessions))
        print(f"{b:>6} {r['events']:>8} {r['wall_s']:>8.2f} {r['events_per_s']:>10.0f} "
              f"{r['events_per_s'] / TARGET:>9.2f}x")


if __name__ == "__main__":
    main()
