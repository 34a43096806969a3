"""Hook round-trip latency for Claude Code's ``POST /hook`` at a steady open-loop rate.

The collector (JSONL exporter on; ``--relay`` adds the relay exporter against the test double) and
a bare aiohttp echo server (the floor) each run as their own process; this process is the load
generator. Requests are scheduled at fixed intervals and latency is measured from the scheduled
time, so queueing counts (open loop). Prints p50/p99/max and the ratios to the floor.

Usage: python bench/bench_hooks.py [--rates 100,1000] [--duration 10] [--relay]
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
import threading
import time
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from result import emit  # noqa: E402


def start(cmd: list[str], pattern: str, env: dict[str, str] | None = None,
          ready: str = "aep-collector started") -> tuple[subprocess.Popen[str], int]:
    """Start ``cmd``; return it and the port its log names once its ``ready`` line appears."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    port = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(pattern, line)
        if m and port is None:
            port = int(m.group(1))
        if port is not None and re.search(ready, line):
            threading.Thread(target=_drain, args=(proc,), daemon=True).start()  # never block on a full pipe
            return proc, port
    proc.kill()
    raise RuntimeError(f"{cmd} did not start")


def _drain(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for _ in proc.stdout:
        pass


def body(i: int) -> bytes:
    kinds = ("PreToolUse", "PostToolUse")
    return json.dumps({"session_id": f"bench-{i % 50}", "hook_event_name": kinds[i % 2], "tool_name": "Bash",
                       "tool_input": {"command": f"ls {i}"}, "tool_use_id": f"toolu_{i // 2}",
                       "tool_response": {"stdout": "x"}, "cwd": "/tmp"}).encode()


async def load(port: int, rate: int, duration: float) -> list[float]:
    url = f"http://127.0.0.1:{port}/hook"
    n = int(rate * duration)
    interval = 1.0 / rate
    latencies: list[float] = []
    conn = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=conn) as session:
        async def one(i: int, scheduled: float) -> None:
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with session.post(url, data=body(i), headers={"Content-Type": "application/json"}) as r:
                await r.read()
            latencies.append(time.perf_counter() - scheduled)

        t0 = time.perf_counter() + 0.2
        await asyncio.gather(*(one(i, t0 + i * interval) for i in range(n)))
    return latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100,1000")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--relay", action="store_true", help="also export to a relay test double")
    args = ap.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"receivers": {"claude_code": {"endpoint": "127.0.0.1:0"}},
               "processors": {"mapping": None, "runs": None, "capture": None},
               "exporters": {"jsonl": {"directory": f"{tmp}/logs"}},
               "service": {"state_dir": f"{tmp}/state", "telemetry": {"logs": {"level": "info"}},
                           "pipelines": {"p": {"receivers": ["claude_code"], "processors": ["mapping", "runs", "capture"],
                                               "exporters": ["jsonl"]}}}}
        relay = None
        if args.relay:
            # The double stands in for a relay that would run elsewhere: at the lowest CPU priority
            # it competes as little as possible with the collector on a 2-core machine.
            relay = start(["nice", "-n", "19", sys.executable, "-m", "tests.relay_double"],
                          r"listening on \S+:(\d+)", ready="listening")
            cfg["exporters"]["relay"] = {"endpoint": f"ws://127.0.0.1:{relay[1]}/socket"}
            cfg["service"]["pipelines"]["p"]["exporters"].append("relay")
        path = Path(tmp) / "bench.yaml"
        path.write_text(yaml.safe_dump(cfg))
        collector, cport = start([sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(path)],
                                 r"receiver/claude_code listening on \S+:(\d+)")
        echo, eport = start([sys.executable, "bench/echo_server.py"], r"echo listening on \S+:(\d+)",
                            ready="echo listening")
        try:
            print(f"{'target':<10} {'rate/s':>7} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
                  f"{'CPU µs/req':>10}")
            rows, cpu = {}, {}
            for rate in rates:
                for name, proc, port in (("echo", echo, eport), ("collector", collector, cport)):
                    cpu0 = cpu_seconds(proc.pid)
                    lat = asyncio.run(load(port, rate, args.duration))
                    # The server's own CPU per request: latency on a shared machine is noisy, this less so.
                    cpu[(name, rate)] = (cpu_seconds(proc.pid) - cpu0) / len(lat) * 1e6
                    rows[(name, rate)] = lat
                    print(f"{name:<10} {rate:>7} {len(lat):>6} {pct(lat, 50):>8.2f} {pct(lat, 99):>8.2f} "
                          f"{max(lat) * 1000:>8.2f} {cpu[(name, rate)]:>10.0f}")
            print()
            summary = []
            for rate in rates:
                c, e = rows[("collector", rate)], rows[("echo", rate)]
                r50 = statistics.median(c) / statistics.median(e)
                r99 = pct(c, 99) / pct(e, 99)
                print(f"at {rate}/s: p50 ratio {r50:.2f}x (target <= 1.3x), p99 ratio {r99:.2f}x (target <= 2x)")
                summary.append({"rate": rate, "n": len(c), "p50_ms": statistics.median(c) * 1000, "p99_ms": pct(c, 99),
                                "max_ms": max(c) * 1000, "echo_p50_ms": statistics.median(e) * 1000,
                                "echo_p99_ms": pct(e, 99), "echo_max_ms": max(e) * 1000, "p50_ratio": r50,
                                "p99_ratio": r99, "cpu_us": cpu[("collector", rate)],
                                "echo_cpu_us": cpu[("echo", rate)]})
            emit("hooks", relay=args.relay, duration_s=args.duration, rows=summary)
        finally:
            for proc in (collector, echo, *( [relay[0]] if relay else [])):
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
