"""The live tier's wall time, and the per-hook overhead the collector adds to a real CLI session.

Per-hook overhead: the same one-shell-call session of a real CLI (``tests/live``: scripted fake
model, scratch HOME, the vendor wired by ``aep-collector hooks``) is run in three arms, interleaved:

- ``collector``: hooks go to the running collector (mapping, runs, capture, JSONL);
- ``no-op``: the same hook registration, with the receiver's address pointed at a loopback HTTP
  server that answers ``{}`` at once (so an ``http`` hook, or the command shim, still runs);
- ``no hooks``: the registration removed.

The CLI's wall time per arm is the median over ``--runs``; the hook count is what the no-op
server received per session. ``(collector - no-op) / hooks`` is the collector's cost per hook as
the CLI sees it, ``(no-op - no hooks) / hooks`` what the hook mechanism itself costs (an http
request, or the shim's start-up). Nothing is asserted.

    .venv/bin/python bench/bench_live.py [--runs 5] [--vendors claude_code,codex] [--tier]

``--tier`` also times ``pytest -m live`` (the whole tier) once.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.live import clis  # noqa: E402
from tests.live.fakemodel import shell, text  # noqa: E402
from tests.live.harness import SPECS, Live  # noqa: E402


class NoopHooks:
    """A loopback server answering every hook ``{}`` at once; counts what it received."""

    def __init__(self) -> None:
        outer = self
        self.count = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.count += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def hook_files(live: Live) -> list[Path]:
    """The vendor config files that name the receiver (what the wiring wrote)."""
    needle = f"127.0.0.1:{live.port}"
    out = []
    for path in list(live.home.rglob("*")) + list(live.work.rglob("*")):
        if path.is_file() and path.stat().st_size < 1 << 20:
            try:
                if needle in path.read_text():
                    out.append(path)
            except (UnicodeDecodeError, OSError):
                continue
    return out


def timed_run(live: Live) -> float:
    t0 = time.perf_counter()
    live.run("run echo bench")
    return (time.perf_counter() - t0) * 1000


def bench_vendor(vendor: str, runs: int) -> dict[str, float]:
    noop = NoopHooks()
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-live-{vendor}-"))
    try:
        with Live(SPECS[vendor], tmp, [shell("echo bench"), text("done")]) as live:
            files = hook_files(live)
            if not files:
                raise SystemExit(f"{vendor}: no hook registration names the receiver")
            wired = {p: p.read_text() for p in files}
            to_noop = {p: t.replace(f"127.0.0.1:{live.port}", noop.address) for p, t in wired.items()}
            arms: dict[str, list[float]] = {"collector": [], "no-op": [], "no hooks": []}
            hooks: list[int] = []
            timed_run(live)  # warm-up: first-run caches of the CLI
            for _ in range(runs):
                for p, t in wired.items():
                    p.write_text(t)
                arms["collector"].append(timed_run(live))
                for p, t in to_noop.items():
                    p.write_text(t)
                before = noop.count
                arms["no-op"].append(timed_run(live))
                hooks.append(noop.count - before)
                for p in files:
                    p.write_text(unhooked(p, wired[p], live.port))
                arms["no hooks"].append(timed_run(live))
    finally:
        noop.close()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in arms.items()}
    med["hooks"] = statistics.median(hooks)
    return med


def unhooked(path: Path, text_: str, port: int) -> str:
    """The file without the registration: JSON ``hooks`` emptied, TOML hook tables dropped."""
    if path.suffix == ".json":
        import json

        data = json.loads(text_)
        data.pop("hooks", None)
        return json.dumps(data)
    keep, skipping = [], False
    for line in text_.splitlines():
        if line.startswith("[[hooks") or line.startswith("[hooks"):
            skipping = True
        elif line.startswith("[") and skipping:
            skipping = False
        if not skipping:
            keep.append(line)
    return "\n".join(keep) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--vendors", default="claude_code,codex")
    ap.add_argument("--tier", action="store_true", help="also time the whole live tier (pytest -m live)")
    args = ap.parse_args()
    if args.tier:
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "live", "-p", "no:cacheprovider"],
                             cwd=ROOT, capture_output=True, text=True)
        tail = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-200:]
        print(f"live tier: {time.perf_counter() - t0:.1f} s wall ({tail})")
    print(f"{'vendor':<12} {'version':<9} {'hooks':>5} {'no hooks':>10} {'no-op':>10} {'collector':>10} "
          f"{'mech/hook':>10} {'coll/hook':>10} {'coll/no-op':>10}")
    for vendor in args.vendors.split(","):
        try:
            clis.argv(vendor)
        except clis.Missing as exc:
            print(f"{vendor:<12} skipped: {exc}")
            continue
        m = bench_vendor(vendor, args.runs)
        n = max(m["hooks"], 1)
        print(f"{vendor:<12} {clis.version(vendor):<9} {m['hooks']:>5.0f} {m['no hooks']:>8.0f}ms "
              f"{m['no-op']:>8.0f}ms {m['collector']:>8.0f}ms {(m['no-op'] - m['no hooks']) / n:>8.1f}ms "
              f"{(m['collector'] - m['no-op']) / n:>8.1f}ms {m['collector'] / m['no-op']:>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
