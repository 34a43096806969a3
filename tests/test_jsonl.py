"""The JSONL exporter: one file per session, whole lines only, no escape from the log directory."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter, repair_torn_tail
from aep_collector.exporters.jsonl.paths import encode_name
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host

from tests.relay_double import wait_until


def ev(session, seq=0, agent="claude-code", **kw):
    out = {"aep": "0.1", "id": f"id{seq}", "type": "run.started", "time": "2026-01-01T00:00:00.000Z",
           "source": "aep://h/agent/a/session/s", "agent": agent, "seq": seq, **kw}
    if session is not None:
        out["session"] = session
    return out


async def make(tmp_path, **cfg):
    exp = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"), **cfg))
    host = Host(state_dir=tmp_path)
    await exp.start(host)
    return exp, host


def lines(path: Path):
    return [json.loads(x) for x in path.read_text().splitlines()]


async def test_one_line_per_event_per_session_file(tmp_path):
    exp, _ = await make(tmp_path, fsync="always")
    exp.export_now([ev("s1", 0), ev("s2", 0), ev("s1", 1)])
    await exp.shutdown()
    root = tmp_path / "logs" / "claude-code"
    assert [e["seq"] for e in lines(root / "s1.jsonl")] == [0, 1]
    assert [e["seq"] for e in lines(root / "s2.jsonl")] == [0]
    assert (root / "s1.jsonl").read_bytes().endswith(b"\n")


async def test_agent_scoped_events_have_their_own_file(tmp_path):
    exp, _ = await make(tmp_path)
    exp.export_now([ev(None, type="agent.idle")])
    await exp.shutdown()
    assert (tmp_path / "logs" / "claude-code" / "_agent.jsonl").exists()


@pytest.mark.parametrize("session", ["../../x", "/etc/passwd", "a\x00b", "..", ".", ".bashrc", "a/../../b",
                                     "_agent", "%2e%2e", "x" * 600, "con", "ü/é"])
async def test_hostile_session_ids_stay_inside_the_directory(tmp_path, session):
    exp, _ = await make(tmp_path)
    exp.export_now([ev(session)])
    await exp.shutdown()
    root = (tmp_path / "logs" / "claude-code").resolve()
    files = [p for p in tmp_path.rglob("*") if p.is_file() and "epochs" not in p.parts]
    assert len(files) == 1
    (f,) = files
    assert f.resolve().parent == root
    assert not f.name.startswith(".") and f.name != "_agent.jsonl"
    assert lines(f)[0]["session"] == session


def test_encoding_is_injective_on_tricky_names():
    names = ["a/b", "a%2Fb", "a%252Fb", ".x", "%2Ex", "x.", "x%2E", "_agent", "%5Fagent", "", "%", "..", "."]
    encoded = [encode_name(n) for n in names]
    assert len(set(encoded)) == len(names)
    for e in encoded:
        assert "/" not in e and "\x00" not in e and e not in (".", "..") and not e.startswith(".")


def test_plain_names_pass_unchanged():
    assert encode_name("0f8e-4b2a_s.1") == "0f8e-4b2a_s.1"


async def test_torn_last_line_is_repaired_at_start(tmp_path):
    root = tmp_path / "logs" / "claude-code"
    root.mkdir(parents=True)
    path = root / "s1.jsonl"
    path.write_bytes(json.dumps(ev("s1", 0)).encode() + b"\n" + b'{"aep":"0.1","id":"to')
    exp, _ = await make(tmp_path)
    exp.export_now([ev("s1", 1)])
    await exp.shutdown()
    assert [e["seq"] for e in lines(path)] == [0, 1]
    kept = list(root.glob("s1.jsonl.torn-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b'{"aep":"0.1","id":"to'


def test_repair_leaves_whole_files_alone(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a":1}\n')
    assert repair_torn_tail(path) is False and path.read_bytes() == b'{"a":1}\n'
    path.write_bytes(b'no newline at all')
    assert repair_torn_tail(path) is True and path.read_bytes() == b""




async def test_write_failure_is_reported_in_health_and_recovers(tmp_path):
    exp, host = await make(tmp_path)
    blocker = tmp_path / "logs" / "claude-code"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the agent directory should be")
    exp.export_now([ev("s1", 0)])
    exp.export_now([ev("s1", 1)])
    snap = host.health.snapshot()
    assert snap["ok"] is False
    assert "exporter/jsonl" in snap["problems"]
    assert snap["dropped"]["exporter/jsonl"] == 2
    blocker.unlink()
    exp.export_now([ev("s1", 2)])
    assert host.health.snapshot()["ok"] is True
    await exp.shutdown()
    assert [e["seq"] for e in lines(blocker / "s1.jsonl")] == [2]


async def test_disk_full_never_leaves_a_torn_line(tmp_path, monkeypatch):
    exp, host = await make(tmp_path)
    exp.export_now([ev("s1", 0)])
    real_write = os.write

    def short_write(fd, data):
        return real_write(fd, data[: len(data) // 2])  # the disk fills mid-line

    monkeypatch.setattr(os, "write", short_write)
    exp.export_now([ev("s1", 1)])
    monkeypatch.setattr(os, "write", real_write)
    exp.export_now([ev("s1", 2)])
    await exp.shutdown()
    path = tmp_path / "logs" / "claude-code" / "s1.jsonl"
    assert [e["seq"] for e in lines(path)] == [0, 2]


async def test_open_files_are_bounded(tmp_path):
    exp, _ = await make(tmp_path, max_open_files=2)
    exp.export_now([ev(f"s{i}", i) for i in range(5)])
    assert len(exp._fds) == 2
    exp.export_now([ev("s0", 9)])
    await exp.shutdown()
    assert [e["seq"] for e in lines(tmp_path / "logs" / "claude-code" / "s0.jsonl")] == [0, 9]


async def test_unicode_line_separators_never_split_an_event(tmp_path):
    exp, _ = await make(tmp_path)
    exp.export_now([ev("s1", 0, subject="a\u2028b\u2029c\x85d\x0be")])
    await exp.shutdown()
    text = (tmp_path / "logs" / "claude-code" / "s1.jsonl").read_text()
    assert len(text.splitlines()) == 1  # even str.splitlines() sees one line
    assert json.loads(text)["subject"] == "a\u2028b\u2029c\x85d\x0be"


async def test_a_batch_for_one_session_is_one_write_of_whole_lines(tmp_path, monkeypatch):
    exp, _ = await make(tmp_path)
    writes = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(data) or real_write(fd, data))
    exp.export_now([ev("s1", i) for i in range(5)] + [ev("s2", 0)])
    monkeypatch.setattr(os, "write", real_write)
    await exp.shutdown()
    assert len(writes) == 2 and all(w.endswith(b"\n") for w in writes)
    assert [e["seq"] for e in lines(tmp_path / "logs" / "claude-code" / "s1.jsonl")] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("other_open", [True, False], ids=["other-has-it-open", "other-opens-it-then"])
async def test_short_write_never_cuts_another_appenders_record(tmp_path, monkeypatch, other_open):
    """Two exporters append to one session file (two pipelines' exporters on one directory, or two
    collectors): a short write of one must leave the other's record whole, on its own line, whether
    the other had the file open already or opens it (repairing the torn tail) after the short write."""
    mine, host = await make(tmp_path)
    other, _ = await make(tmp_path)
    mine.export_now([ev("s1", 0)])
    if other_open:
        other.export_now([ev("s1", 98)])
    real_write = os.write
    state = {"armed": True}

    def short_write(fd, data):
        if not state["armed"]:
            return real_write(fd, data)
        state["armed"] = False
        written = real_write(fd, data[: len(data) // 2])  # the disk fills mid-line...
        other.export_now([ev("s1", 99, agent="claude-code")])  # ...and another appender lands after it
        return written

    monkeypatch.setattr(os, "write", short_write)
    mine.export_now([ev("s1", 1)])
    monkeypatch.setattr(os, "write", real_write)
    mine.export_now([ev("s1", 2)])
    await mine.shutdown()
    await other.shutdown()
    text = (tmp_path / "logs" / "claude-code" / "s1.jsonl").read_text()
    assert [json.loads(x)["seq"] for x in text.splitlines() if x.strip()] == [0] + [98] * other_open + [99, 2]
    assert host.health.snapshot()["dropped"]["exporter/jsonl"] == 1


async def test_short_write_keeps_the_whole_lines_it_wrote(tmp_path, monkeypatch):
    """A batch's lines go out in one write: the lines a short write completed are on disk and are
    not taken back (an accepted event is never lost for want of the next one's room)."""
    exp, host = await make(tmp_path)
    real_write = os.write
    first = len(json.dumps(ev("s1", 1), separators=(",", ":")).encode()) + 1

    def short_write(fd, data):
        return real_write(fd, data[: first + 7])  # line 1 whole, line 2 torn

    monkeypatch.setattr(os, "write", short_write)
    exp.export_now([ev("s1", 1), ev("s1", 2)])
    monkeypatch.setattr(os, "write", real_write)
    exp.export_now([ev("s1", 3)])
    await exp.shutdown()
    assert [e["seq"] for e in lines(tmp_path / "logs" / "claude-code" / "s1.jsonl")] == [1, 3]
    assert host.health.snapshot()["dropped"]["exporter/jsonl"] == 1


def hold_one_fsync(monkeypatch, when):
    """Patch ``os.fsync`` to record every fd it syncs and to block the first call made while
    ``when()`` is true until ``release`` is set; ``held`` is set once that call is blocked."""
    synced: list[int] = []
    held, release = threading.Event(), threading.Event()
    real = os.fsync

    def fsync(fd):
        if when() and not held.is_set():
            held.set()
            release.wait(10)
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced, held, release


async def test_interval_fsync_keeps_a_file_written_while_its_thread_syncs_for_the_next_round(
        tmp_path, monkeypatch):
    hold_next = threading.Event()
    synced, held, release = hold_one_fsync(monkeypatch, hold_next.is_set)
    exp, _ = await make(tmp_path, fsync="interval", fsync_interval=0.01)
    exp.export_now([ev("a", 0), ev("b", 0)])
    fd_a, fd_b = (exp._fds[str(exp.path_for(ev(s)))] for s in "ab")
    await wait_until(lambda: {fd_a, fd_b} <= set(synced), "the first round")
    hold_next.set()
    exp.export_now([ev("a", 1)])  # only a is due next round; its fsync is held in the thread
    await asyncio.to_thread(held.wait, 10)
    exp.export_now([ev("b", 1)])  # written while the thread syncs a
    synced.clear()
    release.set()
    await wait_until(lambda: fd_b in synced, "b synced in a later round")
    await exp.shutdown()


async def test_a_shutdown_while_the_interval_thread_syncs_still_syncs_every_file_it_closes(
        tmp_path, monkeypatch):
    synced, held, release = hold_one_fsync(
        monkeypatch, lambda: threading.current_thread() is not threading.main_thread())
    exp, _ = await make(tmp_path, fsync="interval", fsync_interval=0.01)
    exp.export_now([ev("a", 0), ev("b", 0)])
    fds = set(exp._fds.values())
    await asyncio.to_thread(held.wait, 10)  # the thread holds its first fsync; the other waits
    try:
        await exp.shutdown()  # cancels the round: closing each file syncs it on the loop
        assert fds <= set(synced)
    finally:
        release.set()


async def test_with_fsync_always_a_new_session_file_is_synced_into_its_directory(tmp_path, monkeypatch):
    """`always` syncs each batch before the hook is answered, but a new session file's name (and
    its new agent folder's) was never synced: a power loss could lose the whole file, its synced
    lines with it (POSIX: a new file's entry lasts once its directory is synced)."""
    real, seen = os.fsync, []

    def fsync(fd):
        seen.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    exp, _ = await make(tmp_path, fsync="always")
    try:
        exp.export_now([ev("s1", 0)])
        agent_dir, root = tmp_path / "logs" / "claude-code", tmp_path / "logs"
        assert agent_dir.stat().st_ino in seen and root.stat().st_ino in seen
        seen.clear()
        exp.export_now([ev("s1", 1)])  # the file is there: its data only, one fsync as before
        assert seen == [(agent_dir / "s1.jsonl").stat().st_ino]
    finally:
        await exp.shutdown()


@pytest.mark.parametrize("policy", ["always", "interval"])
async def test_a_failed_fsync_is_reported_not_swallowed(tmp_path, monkeypatch, caplog, policy):
    """A write can go through and its sync fail: EIO from a failing disk, or ENOSPC / EDQUOT that
    NFS reports only at fsync. Every fsync's error was suppressed, so the lines since the last
    good sync could be lost with nothing in the log or /healthz."""
    import errno

    def fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    exp, host = await make(tmp_path, fsync=policy, fsync_interval=0.01)
    try:
        monkeypatch.setattr(os, "fsync", fsync)
        exp.export_now([ev("s1", 0)])
        exp.export_now([ev("s1", 1), ev("s2", 0)])
        await wait_until(lambda: "fsync-failed" in str(host.health.snapshot()), "the failed sync shown")
        detail = host.health.problems["exporter/jsonl"]["fsync-failed"]
        assert "s1.jsonl" in detail or "s2.jsonl" in detail
        assert any("fsync-failed" in r.getMessage() for r in caplog.records if r.levelno >= 40)
        assert len(lines(tmp_path / "logs" / "claude-code" / "s1.jsonl")) == 2  # the lines were written
    finally:
        monkeypatch.undo()
        await exp.shutdown()


def test_a_torn_tail_that_cannot_be_kept_leaves_no_partial_copy_per_event(tmp_path):
    """The torn fragment is copied beside the file before it is cut. When the copy failed (a full
    disk; here the file size limit), the part-written copy stayed, and every later event of the
    session tried again: one more partial `.torn-` file per event while the disk stays full."""
    import subprocess
    import sys

    d = tmp_path / "logs" / "claude-code"
    d.mkdir(parents=True)
    whole = json.dumps(ev("s1", 0)) + "\n"
    (d / "s1.jsonl").write_bytes(whole.encode() + b'{"torn":"' + b"x" * 20000)
    script = f"""
import asyncio, resource, json
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the copy cannot be written whole
async def main():
    exp = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory={str(tmp_path / "logs")!r}, fsync="never"))
    await exp.start(Host(state_dir={str(tmp_path)!r}))
    for seq in range(1, 4):
        exp.export_now([{{"aep": "0.1", "id": f"id{{seq}}", "type": "run.started", "agent": "claude-code",
                         "session": "s1", "seq": seq}}])
    print(json.dumps(exp.health.snapshot()))
    await exp.shutdown()
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "exporter/jsonl: efbig" in out.stderr and '"exporter/jsonl": 3' in out.stdout  # said, counted
    assert not list(d.glob("s1.jsonl.torn-*"))
    assert (d / "s1.jsonl").read_bytes().startswith(whole.encode() + b'{"torn":')  # kept, not cut blind


def health_across_a_file_size_limit(tmp_path, limit: int, writes: int, **cfg) -> tuple[dict, dict]:
    """A JSONL exporter on ``tmp_path / "logs"`` (``cfg`` added to its config) writes one event
    (session s1, id "x") ``writes`` times under an RLIMIT_FSIZE of ``limit`` bytes, then once more
    with the limit lifted: its health snapshots after the limited writes and after the last one.
    It runs in a child process, since the limit is the whole process's."""
    import subprocess
    import sys

    options = "".join(f", {name}={value!r}" for name, value in cfg.items())
    script = f"""
import asyncio, resource, json
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host
async def main():
    exp = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory={str(tmp_path / "logs")!r},
                        fsync="never"{options}))
    await exp.start(Host(state_dir={str(tmp_path)!r}))
    event = {{"aep": "0.1", "id": "x", "type": "run.started", "agent": "claude-code", "session": "s1", "seq": 1}}
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
    for _ in range({writes}):
        exp.export_now([event])
    failing = exp.health.snapshot()
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    exp.export_now([event])
    print(json.dumps([failing, exp.health.snapshot()]))
    await exp.shutdown()
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    failing, after = json.loads(out.stdout)
    return failing, after


def test_a_write_failure_the_probe_cannot_judge_stands_until_a_write_goes_through(tmp_path):
    """/healthz re-checks a failed place on every read, by file permissions (or free space for a
    full disk). For a cause permissions do not show (EFBIG here; EIO, EMFILE) that probe said
    "writable" at once: the condition cleared at the first read, so /healthz said ok while every
    event of the session was being dropped."""
    d = tmp_path / "logs" / "claude-code"
    d.mkdir(parents=True)
    (d / "s1.jsonl").write_text((json.dumps(ev("s1", 0)) + "\n") * 100)  # past the limit below
    failing, after = health_across_a_file_size_limit(tmp_path, 4096, writes=1)
    assert not failing["ok"] and "efbig" in failing["problems"]["exporter/jsonl"]
    assert "problems" not in after  # cleared by the write that went through


def test_writes_cut_short_with_the_disk_not_full_stay_shown_while_events_are_dropped(tmp_path):
    """Near a quota or a file size limit every write is cut short: room for part of a line, not a
    whole one (the part is cut back, so the next write is short again). Each was reported as a
    full disk, which /healthz clears once the filesystem has room, and it had: ok while every
    event was dropped. Here the limit is RLIMIT_FSIZE, in a child process."""
    d = tmp_path / "logs" / "claude-code"
    d.mkdir(parents=True)
    line = json.dumps(ev("s1", 0)) + "\n"
    (d / "s1.jsonl").write_text(line * 40)
    limit = (d / "s1.jsonl").stat().st_size + len(line) // 2  # room for half a line
    failing, after = health_across_a_file_size_limit(tmp_path, limit, writes=3, min_free_bytes=0)
    assert failing["dropped"]["exporter/jsonl"] == 3
    assert not failing["ok"] and "exporter/jsonl" in failing["problems"], failing
    assert "problems" not in after  # cleared by the write that went through
    assert [e["id"] for e in lines(d / "s1.jsonl")] == ["id0"] * 40 + ["x"]  # whole lines only


async def test_a_quota_is_not_judged_by_the_disk_free_space(tmp_path, monkeypatch):
    """EDQUOT was probed as a full disk is, by the filesystem's free space, which a per-user quota
    does not change: cleared at the next /healthz read while the quota still refused every write."""
    import errno

    exp, host = await make(tmp_path, min_free_bytes=0)
    real = os.write

    def over_quota(fd, data):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    try:
        monkeypatch.setattr(os, "write", over_quota)
        exp.export_now([ev("s1", 0)])
        assert "edquot" in host.health.snapshot()["problems"]["exporter/jsonl"]
        assert "edquot" in host.health.snapshot()["problems"]["exporter/jsonl"]  # a second read too
        monkeypatch.setattr(os, "write", real)
        exp.export_now([ev("s1", 1)])
        assert host.health.snapshot()["ok"]
    finally:
        monkeypatch.undo()
        await exp.shutdown()
