"""Held requests under load: how late the neutral reply of a timed-out hold is, and what stays allocated.

Runs the collector in-process (Claude Code receiver, full processor chain, JSONL exporter, relay
exporter against the test relay double in its own process, so a control route is live and
requests are held); a load generator on its own thread and event loop sends ``--holds``
PermissionRequests at once, lets every hold time out after ``--hold`` seconds, and
prints the lateness of each neutral reply (reply time minus send time minus the hold) as
percentiles. A second round runs under ``tracemalloc`` and prints what is still allocated once
every reply is in and the requests are closed (the first round's numbers are not slowed by it).

Usage: python bench/bench_held.py [--holds 2000] [--hold 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import datetime
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from result import emit  # noqa: E402

from tests.helpers import base_config, running  # noqa: E402


def permission(n: int, round_: int) -> dict:
    return {"hook_event_name": "PermissionRequest", "session_id": f"held-{round_}-{n % 50}",
            "tool_name": "Bash", "tool_use_id": f"call-{round_}-{n}", "tool_input": {"command": f"echo {n}"}}


def one_round(port: int, holds: int, round_: int) -> tuple[list[float], list[int]]:
    """The load, on this thread's own event loop (the collector's loop only serves)."""
    return asyncio.run(_round(port, holds, round_))


async def _round(port: int, holds: int, round_: int) -> tuple[list[float], list[int]]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as s:
        async def one(n: int) -> tuple[float, int]:
            async with s.post(f"http://127.0.0.1:{port}/hook", json=permission(n, round_)) as r:
                await r.read()
                return time.time(), r.status
        results = await asyncio.gather(*(one(n) for n in range(holds)))
    return [t for t, _ in results], [st for _, st in results]


def requested_times(tmp: Path, round_: int) -> dict[int, float]:
    """n -> wall time of the ``attention.requested`` of request n (its hold starts then)."""
    out: dict[int, float] = {}
    for path in (tmp / "logs").rglob(f"held-{round_}-*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            ev = json.loads(line)
            if ev["type"] == "attention.requested":
                n = int(ev["data"]["prompt"].rsplit(" ", 1)[1])
                out[n] = datetime.fromisoformat(ev["time"].replace("Z", "+00:00")).timestamp()
    return out


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--holds", type=int, default=2000)
    ap.add_argument("--hold", type=float, default=5.0)
    args = ap.parse_args()
    relay = subprocess.Popen([sys.executable, "-m", "tests.relay_double"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert relay.stdout is not None
    relay_port = int(re.search(r":(\d+)", relay.stdout.readline()).group(1))
    tmp = Path(tempfile.mkdtemp(prefix="bench-held-"))
    cfg = base_config(tmp, {"claude_code": {"endpoint": "127.0.0.1:0", "attention_timeout": args.hold,
                                            "max_concurrent_requests": args.holds * 2}},
                      extra_exporters={"relay": {"endpoint": f"ws://127.0.0.1:{relay_port}/socket"}})
    cfg["service"]["limits"] = {"max_held_requests": args.holds * 2}
    try:
        async with running(cfg) as service:
            control = service.host.control
            for _ in range(200):
                if control.route_live("claude-code"):
                    break
                await asyncio.sleep(0.05)
            port = service.receivers["claude_code"].port
            rss_before = rss_mb()
            sent, cpu = time.time(), time.thread_time()
            replied, statuses = await asyncio.to_thread(one_round, port, args.holds, 0)
            cpu = time.thread_time() - cpu
            requested = requested_times(tmp, 0)
            late = [(replied[n] - requested[n] - args.hold) * 1000 for n in range(args.holds)]
            print(f"intake: the last request was held {max(requested.values()) - sent:.1f}s after the first was "
                  f"sent; the collector's thread used {cpu:.2f}s of CPU for the whole round")
            print(f"{args.holds} held PermissionRequests, hold {args.hold:g}s: "
                  f"statuses {sorted(set(statuses))}, still held {len(control.holds)}")
            print("neutral reply lateness (ms): "
                  + ", ".join(f"p{p} {pct(late, p):.0f}" for p in (50, 90, 99))
                  + f", max {max(late):.0f}, mean {statistics.mean(late):.0f}")
            await asyncio.sleep(0.5)
            gc.collect()
            print(f"RSS of the whole process (collector, load generator, relay client): {rss_before:.0f} MB before, "
                  f"{rss_mb():.0f} MB after the round (freed memory pymalloc keeps is not returned)")
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
            _, statuses = await asyncio.to_thread(one_round, port, args.holds, 1)
            await asyncio.sleep(0.5)
            gc.collect()
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            retained = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
            print(f"round 2 (tracemalloc): statuses {sorted(set(statuses))}, still held {len(control.holds)}, "
                  f"retained after the holds are gone: {retained / 1e6:.1f} MB")
            emit("held", holds=args.holds, hold_s=args.hold, cpu_s=cpu, late_p50_ms=pct(late, 50),
                 late_p99_ms=pct(late, 99), late_max_ms=max(late), retained_mb=retained / 1e6)
            top = after.compare_to(before, "lineno")[:5]
            for stat in top:
                print(f"  {stat.size_diff / 1e3:+.0f} kB  {stat.traceback[0].filename.split('/')[-2:]}:"
                      f"{stat.traceback[0].lineno}")
    finally:
        relay.terminate()
        relay.wait()


if __name__ == "__main__":
    asyncio.run(main())
