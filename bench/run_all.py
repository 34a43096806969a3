"""Run every benchmark once, print their tables, then issue 16's verdicts from that one run.

    python bench/run_all.py                      # the full set (sized for ~15 min on an idle 2-core machine)
    python bench/run_all.py --quick              # shorter runs, same shape (a smoke check)
    python bench/run_all.py --markdown README.md # also write the README performance table
    python bench/run_all.py --only pipeline,otlp # a subset (the verdicts of what ran)

Each benchmark prints its own tables and, last, one ``RESULT {json}`` line (``bench/result.py``);
this script collects those lines, prints every "Done when" figure of issue 16 with its target and
PASS/MISS, and with ``--markdown FILE`` writes the performance table from the same figures:
between the ``<!-- perf-table:begin -->`` / ``<!-- perf-table:end -->`` markers when FILE has
them (the README does), else as the whole file. Ratios are taken within the run, so steady load
cancels, but bursts do not: run on an otherwise idle machine. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from result import parse, stolen_ms

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
BEGIN, END = "<!-- perf-table:begin -->", "<!-- perf-table:end -->"

# Issue 16's targets.
FLOOR_X = 5.0  # in-process µs/event <= 5x the orjson+append floor
OTLP_X = 0.8  # OTLP records/s >= 0.8x in-process events/s, same batch size
P50_X, P99_X = 1.3, 2.0  # hook round trip vs the echo floor
BATCHES = (100, 1000)  # batch sizes the OTLP ratio is taken at (batch 1 is one gRPC/HTTP request per record)


def plan(quick: bool, stages: bool) -> list[tuple[str, str, list[str]]]:
    q = quick
    return [
        ("hooks", "hook round trip, JSONL + relay exporters (open loop)",
         ["bench_hooks.py", "--rates", "100,1000", "--duration", "5" if q else "30", "--relay"]),
        ("shim", "command shim start-up", ["bench_shim.py", "--runs", "10" if q else "40"]),
        ("instructions", "instructions per event in-process (callgrind, N vs 2N events)",
         ["bench_instructions.py", "--events", "500" if q else "2000", *(["--stages"] if stages else [])]),
        ("pipeline", "pipeline throughput in-process (one core)",
         ["bench_pipeline.py", "--events", "20000" if q else "100000", "--batch", "1000"]),
        ("otlp", "OTLP LogRecords through the whole pipeline",
         ["bench_otlp.py", "--records", "5000" if q else "40000"]),
        ("relay_role", "relay role fan-out to SSE/WebSocket subscribers",
         ["bench_relay_role.py", "--events", "2000" if q else "10000"]),
        ("queue", "persistent sending queue, peer down, batches of 100",
         ["bench_queue.py", "--events", "20000" if q else "100000", "--batch", "100"]),
        ("queue1", "persistent sending queue, peer down, one event at a time",
         ["bench_queue.py", "--events", "20000" if q else "100000", "--batch", "1"]),
        ("held", "held PermissionRequests timing out at once, relay live",
         ["bench_held.py", "--holds", "500" if q else "2000", "--hold", "5"]),
        ("nats", "fleet on NATS JetStream: events/s in, hook -> gateway subscriber latency",
         ["bench_nats.py", "--events", "10000" if q else "50000", "--duration", "5" if q else "20"]),
        ("memory", "memory with live sessions", ["bench_memory.py", "--sessions", "200" if q else "1000",
                                                 "--events", "20" if q else "100"]),
    ]


def run_one(cmd: list[str]) -> tuple[int, dict[str, Any] | None]:
    """Run one benchmark, echoing its output; its exit code and its RESULT figures."""
    proc = subprocess.Popen([sys.executable, str(BENCH / cmd[0]), *cmd[1:]], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    found = None
    for line in proc.stdout:
        figures = parse(line)
        if figures is not None:
            found = figures
            continue
        print(line, end="", flush=True)
    return proc.wait(), found


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def by_batch(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(r["batch"]): r for r in rows}


def checks(res: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, bool]]:
    """Issue 16's "Done when" figures: (what, measured, target, met)."""
    out: list[tuple[str, str, str, bool]] = []
    ins = res.get("instructions")
    if ins:
        total, base = ins["instructions_per_event"], ins["baseline"]
        out.append(("instructions/event, in-process path",
                    f"{total:,.0f} ({total / base:.2f}x the {base:,} of {ins['baseline_commit']})",
                    f"<= {ins['target']:,} (half)", total <= ins["target"]))
    pipe = by_batch(res["pipeline"]["rows"]) if res.get("pipeline") else {}
    for b, r in sorted(pipe.items()):
        out.append((f"in-process µs/event vs floor, batch {b}",
                    f"{r['us_per_event']:.2f} µs vs {r['floor_us']:.2f} µs = {r['x_floor']:.1f}x",
                    f"<= {FLOOR_X:g}x", r["x_floor"] <= FLOOR_X))
    otlp = res.get("otlp")
    if otlp and pipe:
        for r in otlp["rows"]:
            b = int(r["batch"])
            if b not in BATCHES or b not in pipe:
                continue
            ratio = r["records_per_s"] / pipe[b]["events_per_s"]
            out.append((f"OTLP {r['transport']} records/s vs in-process events/s, batch {b}",
                        f"{r['records_per_s']:,.0f} vs {pipe[b]['events_per_s']:,.0f} = {ratio:.2f}x",
                        f">= {OTLP_X:g}x", ratio >= OTLP_X))
    hooks = res.get("hooks")
    if hooks:
        for r in hooks["rows"]:
            out.append((f"hook round trip p50 vs echo, {r['rate']}/s",
                        f"{r['p50_ms']:.2f} ms vs {r['echo_p50_ms']:.2f} ms = {r['p50_ratio']:.2f}x",
                        f"<= {P50_X:g}x", r["p50_ratio"] <= P50_X))
            out.append((f"hook round trip p99 vs echo, {r['rate']}/s",
                        f"{r['p99_ms']:.2f} ms vs {r['echo_p99_ms']:.2f} ms = {r['p99_ratio']:.2f}x",
                        f"<= {P99_X:g}x", r["p99_ratio"] <= P99_X))
    return out


def raw_speed(res: dict[str, dict[str, Any]]) -> str | None:
    pipe = by_batch(res["pipeline"]["rows"]) if res.get("pipeline") else {}
    if 100 not in pipe:
        return None
    return (f"floor {pipe[100]['floor_us']:.2f} µs/event (the run's stamped events serialized with orjson and "
            f"appended to a file, batches of 100, the median of five passes)")


def commit() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    rev = r.stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return f"{rev}{' + local changes' if dirty else ''}"


def load_average() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def stolen(steal: dict[str, float]) -> str:
    """The hypervisor's steal over the run, in all and by the benchmarks it fell in."""
    some = [f"{key} {ms:,.0f}" for key, ms in steal.items() if ms >= 1]
    return f"{sum(steal.values()):,.0f} ms" + (f" ({', '.join(some)})" if some else "")


def markdown(res: dict[str, dict[str, Any]], when: str, rev: str, load_before: str, minutes: float,
             how: str = "python bench/run_all.py", steal: str | None = None) -> str:
    """The README table block, every figure from ``res`` (one run)."""
    pipe = by_batch(res["pipeline"]["rows"]) if res.get("pipeline") else {}
    speed = raw_speed(res) or "not measured (bench_pipeline did not run)"
    lines = [
        BEGIN,
        f"Run of `{how}` on {when} at commit `{rev}` ({platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} cores, load average {load_before} before the run, "
        f"{minutes:.0f} min{'' if steal is None else f'; CPU time the hypervisor took from the machine: {steal}'}). "
        f"Machine raw speed: {speed}. Every figure below is from this one run.",
        "",
        "| what | measured | target | |",
        "|---|---|---|---|",
    ]

    def row(what: str, measured: str, target: str = "none set", met: bool | None = None) -> None:
        mark = "—" if met is None else ("met" if met else "**missed**")
        lines.append(f"| {what} | {measured} | {target} | {mark} |")

    hooks = res.get("hooks")
    for r in (hooks or {}).get("rows", []):
        ok = r["p50_ratio"] <= P50_X and r["p99_ratio"] <= P99_X
        relay = ", JSONL + relay on" if hooks and hooks.get("relay") else ", JSONL on"
        row(f"hook round trip at {r['rate']}/s{relay} ({hooks['duration_s']:g} s, open loop; `bench_hooks.py`)",
            f"p50 {r['p50_ms']:.2f} ms ({r['p50_ratio']:.2f}x echo {r['echo_p50_ms']:.2f} ms), p99 {r['p99_ms']:.2f} ms "
            f"({r['p99_ratio']:.2f}x echo {r['echo_p99_ms']:.2f} ms), max {r['max_ms']:.0f} ms; collector CPU "
            f"{r.get('cpu_us', float('nan')):.0f} µs/hook (echo {r.get('echo_cpu_us', float('nan')):.0f})"
            + (f"; hypervisor steal {r['stolen_ms']:.0f} ms (echo's run {r['echo_stolen_ms']:.0f} ms)"
               if "stolen_ms" in r else ""),
            f"p50 <= {P50_X:g}x, p99 <= {P99_X:g}x", ok)
    shim = res.get("shim")
    if shim:
        reg = next((r for r in shim["rows"] if r["invocation"].startswith("registered") and
                    r["invocation"].endswith(", live")), None)
        if reg:
            x = reg["median_ms"] / shim["floor_ms"]
            row("command shim, registered form, live daemon (`bench_shim.py`)",
                f"{reg['median_ms']:.1f} ms median ({x:.2f}x `python3 -S -I -c pass`, "
                f"{reg['median_ms'] / shim['bare_ms']:.2f}x `python3 -c pass`)", "<= 1.5x", x <= 1.5)
    for b, r in sorted(pipe.items()):
        row(f"pipeline in-process, mapping + runs + capture + stamping + JSONL, one core, batch {b} "
            "(`bench_pipeline.py`)",
            f"{r['events_per_s']:,.0f} events/s, {r['us_per_event']:.2f} µs/event = {r['x_floor']:.1f}x the floor "
            f"({r['floor_us']:.2f} µs)", f"<= {FLOOR_X:g}x floor", r["x_floor"] <= FLOOR_X)
    ins = res.get("instructions")
    if ins:
        total = ins["instructions_per_event"]
        row(f"instructions per event, in-process path (`bench_instructions.py`: callgrind, {ins['events']:,} vs "
            f"{2 * ins['events']:,} of the corpus' pinned hook inputs, batch 1, start-up differenced out)",
            f"{total:,.0f} ({total / ins['baseline']:.2f}x the baseline {ins['baseline']:,} at "
            f"`{ins['baseline_commit']}`)", f"<= {ins['target']:,} (half the baseline)", total <= ins["target"])
    otlp = res.get("otlp")
    if otlp:
        for b in BATCHES:
            got = [r for r in otlp["rows"] if int(r["batch"]) == b]
            if not got or b not in pipe:
                continue
            eps = pipe[b]["events_per_s"]
            parts = [f"{r['records_per_s']:,.0f}/s {r['transport']} ({r['records_per_s'] / eps:.2f}x)" for r in got]
            ok = all(r["records_per_s"] / eps >= OTLP_X for r in got)
            row(f"OTLP copilot_chat LogRecords, whole pipeline, batch {b} (`bench_otlp.py`; x in-process events/s "
                f"at batch {b}, {eps:,.0f}/s)", ", ".join(parts), f">= {OTLP_X:g}x in-process", ok)
    q100, q1 = res.get("queue"), res.get("queue1")
    if q100 or q1:
        parts = []
        for q in (q100, q1):
            if q:
                parts.append(f"append {q['put_us']:.1f} µs/event in batches of {q['batch']} "
                             f"({q['put_us'] / q['jsonl_us']:.2f}x the JSONL write of the same events)")
        q = q100 or q1
        assert q is not None
        parts.append(f"drain to a peer that takes everything {q['drain_us']:.1f} µs/event; "
                     f"{q['bytes_per_event']:.0f} bytes/event on disk")
        row(f"persistent sending queue with its peer down (`bench_queue.py`, {q['events']:,} events, fsync "
            f"`{q['fsync']}`)", "; ".join(parts))
    rr = res.get("relay_role")
    if rr:
        parts = [f"{r['binding'].upper() if r['binding'] == 'sse' else 'WebSocket'} to {r['subscribers']}: "
                 f"{r['eps']:,.0f} events/s ({r['deliveries']:,.0f} deliveries/s, p99 {r['p99_ms']:.0f} ms)"
                 for r in rr["rows"]]
        row(f"relay role fan-out (`bench_relay_role.py`, {rr['events']:,} events POSTed as NDJSON)", "; ".join(parts))
        worst = max(r["rss_mib"] for r in rr["rows"])
        row("RSS of the relay-role collector with up to 100 subscribers attached",
            f"{worst:.0f} MiB (idle {rr['idle_rss_mib']:.0f} MiB)")
    held = res.get("held")
    if held:
        row(f"{held['holds']:,} held PermissionRequests timing out at once (`bench_held.py`, hold {held['hold_s']:g} s, "
            "relay live)", f"neutral reply p50 {held['late_p50_ms']:.0f} ms, p99 {held['late_p99_ms']:.0f} ms after its "
            f"deadline, {held['cpu_s']:.2f} s of collector CPU for the round; {held['retained_mb']:.1f} MB still "
            "allocated once they are gone")
    nats = res.get("nats")
    if nats:
        row("NATS JetStream (`bench_nats.py`, single file-backed node on the same machine)",
            f"into the stream: {nats['batch_eps']:,.0f} events/s in batches of {nats['batch']}, "
            f"{nats['per_event_eps']:,.0f}/s one event per call; hook -> gateway subscriber at {nats['rate']:g}/s: "
            f"p50 {nats['p50_ms']:.1f} ms, p99 {nats['p99_ms']:.1f} ms")
    mem = res.get("memory")
    if mem:
        row(f"RSS, {mem['sessions']:,} live sessions x {mem['events']} hooks (`bench_memory.py`)",
            f"{mem['live_mb']:.1f} MB (idle {mem['idle_mb']:.1f} MB)", "<= 150 MB", mem["live_mb"] <= 150)
        row("RSS after those sessions end", f"{mem['after_mb']:.1f} MB ({mem['after_mb'] / mem['idle_mb']:.2f}x idle)",
            "within 10 % of idle", mem["after_mb"] <= mem["idle_mb"] * 1.1)
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, block: str) -> None:
    if path.exists():
        text = path.read_text(encoding="utf-8")
        start, end = text.find(BEGIN), text.find(END)
        if start != -1 and end > start:
            path.write_text(text[:start] + block + text[end + len(END) + 1:], encoding="utf-8")
            return
    path.write_text(block, encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--stages", action="store_true", help="instruction count per pipeline stage too (slower)")
    ap.add_argument("--only", help="comma-separated subset: " + ", ".join(k for k, _, _ in plan(False, False)))
    ap.add_argument("--markdown", type=Path, help="write the README performance table from this run")
    args = ap.parse_args()
    runs = plan(args.quick, args.stages)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {k for k, _, _ in runs}
        if unknown:
            ap.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
        runs = [r for r in runs if r[0] in wanted]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rev, load_before = commit(), load_average()
    results: dict[str, dict[str, Any]] = {}
    failed = []
    steal: dict[str, float] = {}  # ms the hypervisor took from the machine during each benchmark
    t_all = time.perf_counter()
    for key, title, cmd in runs:
        print(f"\n== {title}\n$ python bench/{' '.join(cmd)}", flush=True)
        t0, s0 = time.perf_counter(), stolen_ms()
        rc, figures = run_one(cmd)
        steal[key] = stolen_ms() - s0
        print(f"({time.perf_counter() - t0:.0f} s, hypervisor steal {steal[key]:.0f} ms"
              f"{'' if rc == 0 else f', exit {rc}'})", flush=True)
        if rc != 0 or figures is None:
            failed.append(key)
        if figures is not None:
            results[key] = figures
    minutes = (time.perf_counter() - t_all) / 60
    print(f"\n== issue 16, Done when (one run: {when}, commit {rev}, {minutes:.1f} min, load average "
          f"{load_before} before, {load_average()} after)")
    print(f"hypervisor steal during the run: {stolen(steal)}")
    speed = raw_speed(results)
    if speed:
        print(f"machine raw speed: {speed}")
    rows = checks(results)
    width = max((len(w) for w, _, _, _ in rows), default=0)
    for what, measured, target, ok in rows:
        print(f"{what:<{width}}  {measured:<44} target {target:<16} {verdict(ok)}")
    if failed:
        print(f"no figures from: {', '.join(failed)}")
    if args.markdown:
        how = " ".join(["python bench/run_all.py", *(["--quick"] if args.quick else []),
                        *(["--only", args.only] if args.only else [])])
        write_markdown(args.markdown, markdown(results, when, rev, load_before, minutes, how, stolen(steal)))
        print(f"performance table written to {args.markdown}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
