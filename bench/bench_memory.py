"""Resident memory of the collector with many live sessions, and after they end.

Starts the collector binary (Claude Code receiver, full processor chain, JSONL exporter), reads
its RSS idle, drives ``--sessions`` concurrent sessions of ``--events`` hooks each over HTTP,
reads RSS with all of them live, ends them all (SessionEnd), and reads RSS again.
Targets: <= 150 MB with 1,000 live sessions; back within 10 % of idle after they end.

Usage: python bench/bench_memory.py [--sessions 1000] [--events 100] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import gc  # noqa: F401  (documented: the collector process collects on its own)
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_hooks import start  # noqa: E402
from result import emit  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def hooks(session: str, n: int) -> list[dict]:
    out = [{"session_id": session, "hook_event_name": "SessionStart", "source": "startup", "model": "m"},
           {"session_id": session, "hook_event_name": "UserPromptSubmit", "prompt": "do the thing " * 20}]
    i = 0
    while len(out) < n:
        kind = "PreToolUse" if i % 2 == 0 else "PostToolUse"
        out.append({"session_id": session, "hook_event_name": kind, "tool_name": "Bash",
                    "tool_input": {"command": f"echo {i}"}, "tool_response": {"stdout": "x" * 200},
                    "tool_use_id": f"toolu_{session}_{i // 2}"})
        i += 1
    return out


async def drive(port: int, bodies: list[dict], concurrency: int) -> None:
    url = f"http://127.0.0.1:{port}/hook"
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                async with s.post(url, data=json.dumps(body)) as r:
                    await r.read()
        await asyncio.gather(*(worker() for _ in range(concurrency)))


def interleave(sessions: int, events: int) -> list[dict]:
    per = [hooks(f"mem-{i:05d}", events) for i in range(sessions)]
    # Round-robin, so every session is live at once (not one after another).
    return [per[s][k] for k in range(events) for s in range(sessions)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--events", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"receivers": {"claude_code": {"endpoint": "127.0.0.1:0"}},
               "processors": {"mapping": None, "runs": None, "capture": None},
               "exporters": {"jsonl": {"directory": f"{tmp}/logs"}},
               "service": {"state_dir": f"{tmp}/state", "pipelines": {"p": {
                   "receivers": ["claude_code"], "processors": ["mapping", "runs", "capture"],
                   "exporters": ["jsonl"]}}}}
        path = Path(tmp) / "mem.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc, port = start([sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(path)],
                           r"receiver/claude_code listening on \S+:(\d+)")
        try:
            # Warm up the code paths once so idle includes what every run needs anyway.
            asyncio.run(drive(port, hooks("warm", 10) + [{"session_id": "warm", "hook_event_name": "SessionEnd"}], 4))
            time.sleep(0.5)
            idle = rss_mb(proc.pid)
            t0 = time.perf_counter()
            asyncio.run(drive(port, interleave(args.sessions, args.events), args.concurrency))
            took = time.perf_counter() - t0
            live = rss_mb(proc.pid)
            ends = [{"session_id": f"mem-{i:05d}", "hook_event_name": "SessionEnd", "reason": "exit"}
                    for i in range(args.sessions)]
            asyncio.run(drive(port, ends, args.concurrency))
            time.sleep(1.0)
            after = rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(15)
    n = args.sessions * args.events
    print(f"{'measure':<34} {'value':>10}")
    print(f"{'hooks driven':<34} {n:>10} ({n / took:.0f}/s over HTTP)")
    print(f"{'RSS idle (MB)':<34} {idle:>10.1f}")
    print(f"{'RSS with ' + str(args.sessions) + ' live sessions (MB)':<34} {live:>10.1f}   target <= 150")
    print(f"{'RSS after they ended (MB)':<34} {after:>10.1f}   target <= {idle * 1.1:.1f} (idle + 10 %)")
    print(f"{'after / idle':<34} {after / idle:>10.2f}x")
    emit("memory", sessions=args.sessions, events=args.events, idle_mb=idle, live_mb=live, after_mb=after)


if __name__ == "__main__":
    main()
