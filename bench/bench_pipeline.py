"""Events per second through the pipeline in-process: mapping + runs + capture + stamping + JSONL.

Usage: python bench/bench_pipeline.py [--events N] [--batch B] [--sessions S] [--stages]
(batches 1, 100 and B). Prints figures, the ratio to the 100,000 events/s target, and the µs per
event against a floor measured in the same run: the same stamped events serialized with orjson
and appended to a file (one write per batch), nothing else (the median of five passes). Issue 16's target is at most 5x the
floor; the floor is also the machine's raw speed, for comparing runs across machines. One core:
everything runs on one thread, as in the collector. ``--stages`` adds µs per event of each step.

What is timed is the pipeline and nothing of the benchmark's own keeping, as a collector runs it:
- The timed loop keeps none of its output. The floor's events are the lines the loop wrote,
  read back from the session files after timing. Until 2026-12-03 the loop kept every stamped
  event in a list for the floor: the growing heap made the cyclic garbage collector's passes
  scan more and more objects during the loop (at batch 100: 457 generation-0, 41 generation-1
  and 3 full collections, 7 µs an event of collection CPU time; 9 µs at batch 1), which no
  collector pays. Now: one generation-0 collection, no collection time to speak of.
- Each batch size runs in a fresh process that, after building its signals and warming up,
  calls the collector's own ``freeze_startup_heap`` (what ``Service.run_until_signalled`` does
  after start-up): the start-up heap, here with the 100,000 prebuilt signals in it, is out of
  the cyclic collector's scans, as a collector's start-up heap is. Without it, at batch 1000
  (where a batch in flight holds enough objects to trigger collections) the full collections
  walked the prebuilt signals: 9.6 µs an event of collection time, 0.9 µs frozen.
- It then raises the young generation's threshold as the collector does (``raise_young_threshold``):
  at batch 1000 the ~1,000 generation-0 passes per 100k events (0.6-0.8 µs an event, scanning the
  batch in flight) are gone; batches 1 and 100 saw about one collection anyway.
The ``GC 0/1/2`` column counts the collections of each generation during the timed loop.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
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
from aep_collector.pipeline.service import freeze_startup_heap, raise_young_threshold  # noqa: E402
from aep_collector.pipeline.wire import dumps_line  # noqa: E402
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
        logs = Path(tmp) / "logs"
        jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(logs), fsync="never"))
        await jsonl.start(host)
        procs = [MappingProcessor(), RunsProcessor(), CaptureProcessor(CaptureConfig())]
        pipe = Pipeline("bench", procs, Stamper(Path(tmp), "bench"), host.health, [("exporter/jsonl", jsonl)], [])
        work = signals(events, sessions)
        # Warm-up: imports, first file opens.
        for i in range(0, min(2000, events), batch):
            await pipe.consume(work[i:i + batch])
        # The timed loop keeps nothing it produces (a collector does not either): what it wrote is
        # what each session file holds past its size now, read back for the floor after timing.
        warm = {p: p.stat().st_size for p in logs.rglob("*.jsonl")}
        freeze_startup_heap()  # as the collector does once started (see the module docstring)
        raise_young_threshold()
        sizes = []  # events out per batch: small ints, which the cyclic collector never tracks
        gc0 = [g["collections"] for g in gc.get_stats()]
        start = time.perf_counter()
        cpu0 = time.process_time()
        for i in range(0, events, batch):
            sizes.append(len(await pipe.consume(work[i:i + batch])))
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        collections = [g["collections"] - c for g, c in zip(gc.get_stats(), gc0, strict=True)]
        await jsonl.shutdown()
        del work
        floor = floor_seconds(written(logs, warm, sizes), Path(tmp) / "floor.jsonl")
    return {"events": events, "wall_s": wall, "cpu_s": cpu, "events_per_s": events / wall, "floor_s": floor,
            "gc": collections}


def written(logs: Path, warm: dict[Path, int], sizes: list[int]) -> list[list[dict]]:
    """The events the timed loop wrote, in stamping order (ULIDs sort by creation), cut into its batches."""
    events = []
    for path in logs.rglob("*.jsonl"):
        with path.open("rb") as f:
            f.seek(warm.get(path, 0))
            events.extend(orjson.loads(line) for line in f)
    if len(events) != sum(sizes):
        raise SystemExit(f"read back {len(events)} events, the timed loop stamped {sum(sizes)}")
    events.sort(key=lambda e: e["id"])
    batches, at = [], 0
    for n in sizes:
        batches.append(events[at:at + n])
        at += n
    return batches


FLOOR_PASSES = 5


def floor_seconds(batches: list[list[dict]], path: Path) -> float:
    """The same events, orjson-serialized and appended to one file a batch at a time: nothing else.

    The median of ``FLOOR_PASSES`` passes, each into the file emptied. One pass takes about a tenth of
    the pipeline's timed loop, so a single scheduling hiccup moved it a lot: 1.57-3.22 µs an event
    at batch 1000 in three runs minutes apart on an idle machine, the ratio 3.6x-7.5x with it. The
    median keeps neither a lucky nor an unlucky pass.
    """
    times = []
    for _ in range(FLOOR_PASSES):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            start = time.perf_counter()
            for events in batches:
                os.write(fd, b"".join(orjson.dumps(e) + b"\n" for e in events))
            times.append(time.perf_counter() - start)
        finally:
            os.close(fd)
    return statistics.median(times)


STAGES = ("mapping", "runs", "capture", "stamping", "serialization", "write")


async def stages(events: int, batch: int, sessions: int) -> dict[str, float]:
    """µs per event of each of the pipeline's steps, each timed around its own call.

    The steps of ``Pipeline.consume`` done one by one, as it does them: the three processors,
    stamping, the lines serialized (``dumps_line``), then the JSONL exporter's ``export_now``
    with those lines (grouping by session file, one ``os.write`` per file in the batch). Seven
    clock reads per batch cost about 0.3 µs an event at batch 1 (spread over the stages), nothing
    at larger batches. ``writes`` is ``os.write`` calls per event.
    """
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(state_dir=Path(tmp))
        jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=f"{tmp}/logs", fsync="never"))
        await jsonl.start(host)
        mapping, runs, capture = MappingProcessor(), RunsProcessor(), CaptureProcessor(CaptureConfig())
        stamper = Stamper(Path(tmp), "bench")
        work = signals(events, sessions)
        spent = [0.0] * len(STAGES)
        writes = 0
        clock = time.perf_counter
        for timed in (False, True):  # the first pass over 2,000 events is the warm-up
            if timed:
                freeze_startup_heap()
                raise_young_threshold()
            for i in range(0, events if timed else min(2000, events), batch):
                t0 = clock()
                drafts = mapping(work[i:i + batch])
                t1 = clock()
                drafts = runs(drafts)
                t2 = clock()
                drafts = capture(drafts)
                t3 = clock()
                stamped = [stamper.stamp(d) for d in drafts if isinstance(d, dict)]
                t4 = clock()
                lines = [dumps_line(e) for e in stamped]
                t5 = clock()
                jsonl.export_now(stamped, lines)
                t6 = clock()
                if timed:
                    for k, (a, b) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6))):
                        spent[k] += b - a
                    writes += len({jsonl._file(e) for e in stamped})
        await jsonl.shutdown()
    out = {name: spent[k] / events * 1e6 for k, name in enumerate(STAGES)}
    out["writes"] = writes / events
    return out


def in_child(what: str, events: int, batch: int, sessions: int) -> dict:
    """Run ``what`` (``run`` or ``stages``) for one batch size in a fresh interpreter.

    The start-up heap is frozen once per process (``freeze_startup_heap``), as in the collector:
    each batch size gets its own process, so each has its own signals frozen and nothing left
    over from another.
    """
    out = subprocess.run([sys.executable, __file__, "--child", what, "--events", str(events), "--batch", str(batch),
                          "--sessions", str(sessions)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench_pipeline child ({what}, batch {batch}) failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--stages", action="store_true", help="also µs per event of each pipeline step, per batch")
    ap.add_argument("--child", choices=("run", "stages"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        job = run if args.child == "run" else stages
        print(json.dumps(asyncio.run(job(args.events, args.batch, args.sessions))))
        return
    rows = []
    print(f"{'batch':>6} {'events':>8} {'wall s':>8} {'events/s':>10} {'vs target':>10} "
          f"{'µs/event':>9} {'floor µs':>9} {'x floor':>8} {'GC 0/1/2':>9}")
    for b in sorted({1, 100, args.batch}):
        r = in_child("run", args.events, b, args.sessions)
        us = r["wall_s"] / r["events"] * 1e6
        floor_us = r["floor_s"] / r["events"] * 1e6
        ratio = us / floor_us
        verdict = "PASS" if ratio <= FLOOR_RATIO_TARGET else "MISS"
        print(f"{b:>6} {r['events']:>8} {r['wall_s']:>8.2f} {r['events_per_s']:>10.0f} "
              f"{r['events_per_s'] / TARGET:>9.2f}x {us:>9.2f} {floor_us:>9.2f} {ratio:>7.1f}x "
              f"{'/'.join(map(str, r['gc'])):>9}  {verdict} (target <= {FLOOR_RATIO_TARGET:.0f}x floor)")
        rows.append({"batch": b, "events": r["events"], "events_per_s": r["events_per_s"], "us_per_event": us,
                     "floor_us": floor_us, "x_floor": ratio, "gc_collections": r["gc"]})
    stage_rows = []
    if args.stages:
        print(f"\n{'batch':>6} " + " ".join(f"{n:>13}" for n in STAGES) + f" {'sum':>7} {'writes/ev':>9}   (µs/event)")
        for b in sorted({1, 100, args.batch}):
            st = in_child("stages", args.events, b, args.sessions)
            print(f"{b:>6} " + " ".join(f"{st[n]:>13.2f}" for n in STAGES)
                  + f" {sum(st[n] for n in STAGES):>7.2f} {st['writes']:>9.2f}")
            stage_rows.append({"batch": b, **st})
    emit("pipeline", rows=rows, floor_target=FLOOR_RATIO_TARGET, stages=stage_rows)


if __name__ == "__main__":
    main()
