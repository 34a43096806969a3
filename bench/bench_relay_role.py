"""The relay role under fan-out: ingest-to-subscriber events/s and p99 delivery latency with 1, 10
and 100 SSE or WebSocket subscribers, and the collector's RSS with 100 subscribers attached.

    python bench/bench_relay_role.py                  # 20000 events per run
    python bench/bench_relay_role.py --events 2000    # a quick smoke run

The collector runs as its own process (relay role on a free port); this process posts NDJSON
batches of 100 events to ``POST /events`` as fast as they are accepted and runs every subscriber
(aiohttp clients on one event loop, so at 100 subscribers the client side shares the 2 cores).
Each event carries its send time in an extension attribute (``benchsent``, microseconds); latency
is receive time minus that, over every (event, subscriber) pair. Throughput is events posted
divided by the time until the last subscriber had every event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml
from result import emit

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-relay-role-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def start_collector(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    cfg = {
        "receivers": {"claude_code": {"endpoint": "127.0.0.1:0"}},
        "processors": {"mapping": None, "runs": None, "capture": None},
        "exporters": {"jsonl": {"directory": str(tmp / "logs"), "fsync": "never"},
                      "relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN}},
        "service": {"state_dir": str(tmp / "state"), "telemetry": {"logs": {"level": "warning"}},
                    "pipelines": {"agents": {"receivers": ["claude_code"], "processors": ["mapping", "runs", "capture"],
                                             "exporters": ["jsonl", "relay_server"]}}},
    }
    path = tmp / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"relay role on (http://\S+?);", line)
        if m:
            return proc, m.group(1)
    raise SystemExit("the collector did not start")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Sub:
    def __init__(self, total: int) -> None:
        self.total, self.got, self.lat = total, 0, []  # type: ignore[var-annotated]
        self.done = asyncio.Event()

    def take(self, text: str) -> None:
        at = text.find('"benchsent":')
        if at < 0:
            return
        now = time.time() * 1e6
        self.lat.append(now - int(text[at + 12:text.index("}", at)].split(",")[0]))
        self.got += 1
        if self.got >= self.total:
            self.done.set()


async def sse_sub(http: aiohttp.ClientSession, url: str, session: str, sub: Sub, ready: asyncio.Event) -> None:
    params = {"filter": json.dumps({"session": session})}
    async with http.get(f"{url}/stream", params=params, headers=AUTH) as r:
        ready.set()
        async for raw in r.content:
            if raw.startswith(b"data:"):
                sub.take(raw[5:].decode())
                if sub.done.is_set():
                    return


async def ws_sub(http: aiohttp.ClientSession, url: str, session: str, sub: Sub, ready: asyncio.Event) -> None:
    async with http.ws_connect(f"{url}/socket", headers=AUTH, max_msg_size=0) as ws:
        await ws.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer", "identity": {"agent": "bench"}})
        await ws.send_json({"type": "subscribe", "id": "s", "filter": {"session": session}})
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                return
            if '"subscribed"' in msg.data:
                ready.set()
                continue
            sub.take(msg.data)
            if sub.done.is_set():
                return


async def one_run(url: str, pid: int, kind: str, n: int, events: int) -> dict[str, float]:
    session = f"bench-{kind}-{n}-{time.monotonic_ns()}"
    subs = [Sub(events) for _ in range(n)]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as http:
        readies = [asyncio.Event() for _ in subs]
        fn = sse_sub if kind == "sse" else ws_sub
        tasks = [asyncio.create_task(fn(http, url, session, s, r)) for s, r in zip(subs, readies, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
        await asyncio.sleep(0.2)  # SSE: the relay registers the stream just after the headers go out
        src = f"aep://bench/agent/bench/session/{session}"
        t0 = time.perf_counter()
        for start in range(0, events, 100):
            lines = []
            now = int(time.time() * 1e6)
            for seq in range(start, min(start + 100, events)):
                lines.append(json.dumps({"aep": "0.1", "id": f"b{seq}", "type": "progress.status",
                                         "time": "2026-12-03T00:00:00.000Z", "source": src, "agent": "bench",
                                         "session": session, "seq": seq, "benchsent": now},
                                        separators=(",", ":")))
            async with http.post(f"{url}/events", data="\n".join(lines) + "\n",
                                 headers={**AUTH, "AEP-Version": "0.1",
                                          "Content-Type": "application/x-ndjson"}) as r:
                assert r.status == 202, r.status
        await asyncio.wait_for(asyncio.gather(*(s.done.wait() for s in subs)), 600)
        elapsed = time.perf_counter() - t0
        rss = rss_kib(pid)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    lat = sorted(x for s in subs for x in s.lat)
    return {"eps": events / elapsed, "deliveries": events * n / elapsed,
            "p50_ms": statistics.median(lat) / 1000, "p99_ms": lat[int(len(lat) * 0.99) - 1] / 1000,
            "rss_mib": rss / 1024}


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_collector(Path(tmp))
        try:
            idle = rss_kib(proc.pid) / 1024
            print(f"collector pid {proc.pid}, relay role {url}, idle RSS {idle:.1f} MiB; {args.events} events per run")
            print(f"{'binding':<6} {'subs':>5} {'events/s':>10} {'deliveries/s':>13} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'RSS MiB':>8}")
            rows = []
            for kind in ("sse", "ws"):
                for n in (1, 10, 100):
                    r = await one_run(url, proc.pid, kind, n, args.events)
                    rows.append({"binding": kind, "subscribers": n, **r})
                    print(f"{kind:<6} {n:>5} {r['eps']:>10.0f} {r['deliveries']:>13.0f} {r['p50_ms']:>8.2f} "
                          f"{r['p99_ms']:>8.2f} {r['rss_mib']:>8.1f}", flush=True)
            emit("relay_role", events=args.events, idle_rss_mib=idle, rows=rows)
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20000, help="events posted per run")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
