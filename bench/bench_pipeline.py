"""Events per second through the pipeline in-process: mapping + runs + capture + stamping + JSONL.

Usage: python bench/bench_pipeline.py [--events N] [--batch B] [--sessions S]   (batches 1, 100 and B)
Prints figures, the ratio to the 100,000 events/s target, and the µs per event against a floor
measured in the same run: the same stamped events serialized with orjson and appended to a file
(one write per batch), nothing else. Issue 16's target is at most 5x the floor; the floor is also
the machine's raw speed, for comparing runs across machines. One core: everything runs on one
thread, as in the collector.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter  # noqa: E402
from aep_collector.pipeline.component import CreateSettings  # noqa: E402
from aep_collector.pipeline.envelope import Stamper  # noqa: E402
from aep_collector.pipeline.host import Host  # noqa: E402
from aep_collector.pipeline.model import Signal  # noqa: E402
from aep_collector.pipeline.pipeline import Pipeline  # noqa: E402
from aep_collector.processors.capture import CaptureConfig, CaptureProcessor  # noqa: E402
from aep_collector.processors.mapping import MappingProcessor  # noqa: E402
from aep_collector.processors.runs import RunsProcessor  # noqa: E402
from result import emit  # noqa: E402

TARGET = 100_000
FLOOR_RATIO_TARGET = 5.0


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
        stamped = []
        start = time.perf_counter()
        cpu0 = time.process_time()
        for i in range(0, events, batch):
            stamped.append(await pipe.consume(work[i:i + batch]))
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        await jsonl.shutdown()
        floor = floor_seconds(stamped, Path(tmp) / "floor.jsonl")
    return {"events": events, "wall_s": wall, "cpu_s": cpu, "events_per_s": events / wall, "floor_s": floor}


def floor_seconds(batches: list[list[dict]], path: Path) -> float:
    """The same events, orjson-serialized and appended to one file a batch at a time: nothing else."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        start = time.perf_counter()
        for events in batches:
            os.write(fd, b"".join(orjson.dumps(e) + b"\n" for e in events))
        return time.perf_counter() - start
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--sessions", type=int, default=100)
    args = ap.parse_args()
    rows = []
    print(f"{'batch':>6} {'events':>8} {'wall s':>8} {'events/s':>10} {'vs target':>10} "
          f"{'µs/event':>9} {'floor µs':>9} {'x floor':>8}")
    for b in sorted({1, 100, args.batch}):
        r = asyncio.run(run(args.events, b, args.sessions))
        us = r["wall_s"] / r["events"] * 1e6
        floor_us = r["floor_s"] / r["events"] * 1e6
        ratio = us / floor_us
        verdict = "PASS" if ratio <= FLOOR_RATIO_TARGET else "MISS"
        print(f"{b:>6} {r['events']:>8} {r['wall_s']:>8.2f} {r['events_per_s']:>10.0f} "
              f"{r['events_per_s'] / TARGET:>9.2f}x {us:>9.2f} {floor_us:>9.2f} {ratio:>7.1f}x  "
              f"{verdict} (target <= {FLOOR_RATIO_TARGET:.0f}x floor)")
        rows.append({"batch": b, "events": r["events"], "events_per_s": r["events_per_s"], "us_per_event": us,
                     "floor_us": floor_us, "x_floor": ratio})
    emit("pipeline", rows=rows, floor_target=FLOOR_RATIO_TARGET)


if __name__ == "__main__":
    main()
