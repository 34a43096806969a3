"""Instructions an isolated hook costs the running collector, and the echo floor, counted by callgrind.

The collector (``bench_hooks.py``'s config: Claude Code's receiver, the three processors, JSONL;
``--relay`` adds the relay exporter against the test double) and the echo floor each run whole
under ``valgrind --tool=callgrind``. After ``--warmup`` hooks the process's counters are zeroed
(``callgrind_control -z``), ``--hooks`` hooks are sent at ``--rate`` a second, one at a time, and
the counters are dumped (``callgrind_control -d``): instructions / hooks. Everything the process
does in that window counts, as a hook's CPU does: aiohttp, the pipeline, what the relay exporter
does behind the reply (delivery, pong, cursor, linger), timers and the interval fsync threads. At
the default 10/s every hook is alone even under callgrind's ~50x slowdown: this is the 100/s case
without its noise (a time on a shared machine moves with everything else; this count moves by a
fraction of a percent between runs). ``bench_hooks.py`` times the same requests.

Usage: python bench/bench_hook_instructions.py [--relay] [--hooks 100] [--rate 10] [--warmup 20]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_hooks import reply_status, requests_for, start, start_relay, write_config
from result import emit

READY_WAIT = 300.0
"""Seconds a process under callgrind may take to start listening."""


def count(cmd: list[str], pattern: str, ready: str, hooks: int, rate: float, warmup: int) -> float:
    """Instructions per hook of the process ``cmd`` starts, between a zero and a dump of its counters."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        proc, port = start(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-line=no", *cmd],
                           pattern, ready=ready, wait=READY_WAIT)
        try:
            # One keep-alive connection, opened before the counters are zeroed: what is counted is
            # hooks, not a connection's accept and teardown (each costs the server about as much as
            # 5-20 hooks, which a pool of connections opened per run spread over the count).
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _send(sock, requests_for(port, 0, warmup), rate)  # first-call caches, the relay connection
                time.sleep(1)
                subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
                _send(sock, requests_for(port, warmup, hooks), rate)
                subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
                total = _dumped(Path(tmp))
        finally:
            proc.terminate()
            proc.wait(60)
        return total / hooks


def _send(sock: socket.socket, requests: list[bytes], rate: float) -> None:
    """Each request at its time (``rate`` a second), its whole reply read before the next goes."""
    t0 = time.monotonic()
    for i, request in enumerate(requests):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sock.sendall(request)
        reply = b""
        status = None
        while status is None:
            chunk = sock.recv(65536)
            if not chunk:
                raise SystemExit("the server closed the connection")
            reply += chunk
            status = reply_status(reply)
        if status != 200:
            raise SystemExit(f"a reply other than 200: {reply[:200]!r}")


def _dumped(folder: Path) -> int:
    """The instruction total of the dump ``callgrind_control -d`` asked for (``cg.out.1``)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for path in folder.glob("cg.out.*"):
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        time.sleep(0.5)
    raise SystemExit("callgrind wrote no dump")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relay", action="store_true", help="also export to the relay test double")
    ap.add_argument("--hooks", type=int, default=100, help="hooks counted")
    ap.add_argument("--rate", type=float, default=10.0, help="hooks a second")
    ap.add_argument("--warmup", type=int, default=20, help="hooks before the counters are zeroed")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind not found: instruction counts need valgrind --tool=callgrind")
    floor = count([sys.executable, "bench/echo_server.py"], r"echo listening on \S+:(\d+)", "echo listening",
                  args.hooks, args.rate, args.warmup)
    with tempfile.TemporaryDirectory() as tmp:
        relay = start_relay() if args.relay else None
        try:
            config = write_config(tmp, relay[1] if relay else None)
            collector = count([sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(config)],
                              r"receiver/claude_code listening on \S+:(\d+)", "aep-collector started",
                              args.hooks, args.rate, args.warmup)
        finally:
            if relay is not None:
                relay[0].terminate()
                relay[0].wait(10)
    what = "JSONL + relay" if args.relay else "JSONL"
    print(f"instructions per isolated hook ({args.hooks} at {args.rate:g}/s after {args.warmup}):")
    print(f"  echo floor            {floor:>12,.0f}")
    print(f"  collector ({what}) {collector:>12,.0f}  ({collector / floor:.2f}x the floor)")
    emit("hook_instructions", relay=args.relay, hooks=args.hooks, rate=args.rate, echo=round(floor),
         collector=round(collector))


if __name__ == "__main__":
    main()
