"""Start-up cost of one ``aep-collector-hook`` invocation next to a bare interpreter.

Every figure is the median wall time of running a process to completion with a hook payload on
stdin, from this venv's interpreter: bare ``-c pass`` (with site, ``-S``, ``-S -I``), then the
shim against a live receiver (the real collector binary, started here) and against a closed port,
launched five ways: exactly as the registration blocks write it (the ``/bin/sh -c`` chain running
the shim's copy, ``receivers/registration.py``), the off-POSIX form (``python -S -I -c "import
aep_collector_hook ..."`` on that copy, no shell), as a file (``python -S -I .../shim.py``: compiled on every start), as
``python -m aep_collector.pipeline.shim`` and as the ``aep-collector-hook`` console script (both with site).
Ratios are against ``python -S -I -c pass``, the floor. Nothing is asserted, but a form that does
not exit 0 stops the run (its time would be its crash's).

    .venv/bin/python bench/bench_shim.py [--runs 40] [--vendor codex]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aep_collector.receivers.registration import ensure_shim, shim_argv, shim_command, using_home
from result import emit

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "pipeline" / "shim.py"
PAYLOAD = json.dumps({"hook_event_name": "SessionStart", "session_id": "bench-shim", "source": "startup",
                      "cwd": "/tmp", "model": "bench"}).encode()
RECEIVER = {"codex": "codex", "gemini-cli": "gemini_cli", "qwen-code": "qwen_code", "vscode": "vscode",
            "kimi-code": "kimi_code"}


def median_ms(cmd: list[str], runs: int, stdin: bytes = b"") -> float:
    for _ in range(3):  # warm the page cache and the receiver
        out = subprocess.run(cmd, input=stdin, capture_output=True, check=False)
        if out.returncode != 0:  # a form that crashes would time its own failure, not the shim
            raise SystemExit(f"{cmd[:4]} exited {out.returncode}: {out.stderr.decode(errors='replace')[-300:]}")
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, input=stdin, capture_output=True, check=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_collector(tmp: Path, rtype: str) -> tuple[subprocess.Popen[str], int]:
    config = tmp / "bench.yaml"
    config.write_text(json.dumps({  # JSON is YAML
        "receivers": {rtype: {"endpoint": "127.0.0.1:0"}},
        "processors": {"mapping": None, "runs": None, "capture": None},
        "exporters": {"jsonl": {"directory": str(tmp / "logs"), "fsync": "never"}},
        "service": {"state_dir": str(tmp / "state"), "pipelines": {"bench": {
            "receivers": [rtype], "processors": ["mapping", "runs", "capture"], "exporters": ["jsonl"]}}}}))
    proc = subprocess.Popen([sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(config)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    port = None
    for line in proc.stdout:
        m = re.search(r"receiver/\S+ listening on \S+?:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "aep-collector started" in line:
            break
    if port is None:
        proc.kill()
        raise SystemExit("the collector did not start")
    return proc, port


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--vendor", default="codex", choices=sorted(RECEIVER))
    args = p.parse_args(argv)
    py = sys.executable
    script = str(Path(py).parent / "aep-collector-hook")
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_collector(Path(tmp), RECEIVER[args.vendor])
        live, dead = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{closed_port()}"
        hook = [args.vendor, "SessionStart"]
        rows: list[tuple[str, float]] = []
        try:
            rows.append(("python -c pass", median_ms([py, "-c", "pass"], args.runs)))
            rows.append(("python -S -c pass", median_ms([py, "-S", "-c", "pass"], args.runs)))
            rows.append(("python -S -I -c pass", median_ms([py, "-S", "-I", "-c", "pass"], args.runs)))
            for where, url in (("live", live), ("closed port", dead)):
                with using_home(Path(tmp)):  # the shim copy and its chain, in the scratch folder
                    ensure_shim()
                    chain = shlex.split(shim_command(*hook, url=url))
                    off_posix = shim_argv(*hook, url=url)
                launches = {
                    "registered (/bin/sh chain -> copy)": chain,
                    "off-POSIX form (-S -I -c import the copy)": off_posix,
                    "python -S -I shim.py": [py, "-S", "-I", str(SHIM), *hook, "--url", url],
                    "python -m aep_collector.pipeline.shim": [py, "-m", "aep_collector.pipeline.shim", *hook, "--url", url],
                    "aep-collector-hook": [script, *hook, "--url", url],
                }
                for name, cmd in launches.items():
                    rows.append((f"{name}, {where}", median_ms(cmd, args.runs, PAYLOAD)))
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    floor = rows[2][1]
    bare = rows[0][1]
    width = max(len(name) for name, _ in rows)
    print(f"{'invocation':<{width}}  {'median ms':>9}  {'x floor':>7}  {'x -c pass':>9}")
    print(f"{'-' * width}  {'-' * 9}  {'-' * 7}  {'-' * 9}")
    for name, ms in rows:
        print(f"{name:<{width}}  {ms:9.1f}  {ms / floor:7.2f}  {ms / bare:9.2f}")
    print(f"\n{args.runs} runs each, medians; floor = python -S -I -c pass; vendor {args.vendor}; {py}")
    emit("shim", runs=args.runs, vendor=args.vendor, floor_ms=floor, bare_ms=bare,
         rows=[{"invocation": name, "median_ms": ms} for name, ms in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
