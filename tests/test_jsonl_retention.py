"""JSONL retention: rotation by size and age, gzip of closed files, the byte cap, and the one reader."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.pipeline.cli import main as cli_main
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.jsonl_files import iter_lines, session_files

from tests.relay_double import wait_until


def ev(seq, session="s1", time="2026-01-01T00:00:00.000Z", pad=0):
    return {"aep": "0.1", "id": f"01J{seq:023d}", "type": "progress.note", "time": time,
            "source": "aep://h/agent/claude-code/session/" + session, "agent": "claude-code", "session": session,
            "seq": seq, "data": {"note": "x" * pad}}


async def make(tmp_path, **cfg):
    exp = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"), fsync="never", **cfg))
    await exp.start(Host(state_dir=tmp_path))
    return exp


def ids(path):
    return [json.loads(line)["id"] for line in iter_lines(path)]


async def test_rotation_by_size_compresses_and_the_reader_sees_every_event_in_order(tmp_path):
    exp = await make(tmp_path, rotate_bytes=4096)
    for seq in range(1, 101):
        exp.export_now([ev(seq, pad=200)])
    await exp.shutdown()  # finishes compressing what was closed
    active = tmp_path / "logs" / "claude-code" / "s1.jsonl"
    files = session_files(active)
    assert len(files) > 3 and files[-1] == active
    assert all(f.name.endswith(".jsonl.gz") and "@" in f.name for f in files[:-1])
    for f in files[:-1]:
        assert f.read_bytes()[:2] == b"\x1f\x8b" and len(gzip.decompress(f.read_bytes())) <= 4096
    assert ids(active) == [ev(s)["id"] for s in range(1, 101)]
    # validate-events reads the same: the whole session, rotated and compressed parts included.
    assert cli_main(["validate-events", str(active)]) == 0
    assert cli_main(["validate-events", str(files[0])]) == 0  # a .gz on its own


async def test_rotation_by_age_counts_from_the_first_event(tmp_path):
    exp = await make(tmp_path, rotate_age=3600, compress=False)
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    exp.export_now([ev(1, time="2020-01-01T00:00:00.000Z")])  # stamped long ago: due at the next write
    exp.export_now([ev(2, time=now)])
    exp.export_now([ev(3, time=now)])
    await exp.shutdown()
    active = tmp_path / "logs" / "claude-code" / "s1.jsonl"
    files = session_files(active)
    assert [f.name.endswith(".jsonl") for f in files] == [True, True]
    assert ids(files[0]) == [ev(1)["id"]] and ids(active) == [ev(1)["id"], ev(2)["id"], ev(3)["id"]]


async def test_a_first_event_timed_in_the_future_does_not_hold_its_file_open_for_good(tmp_path):
    # An OTLP event carries its record's time, whatever the client's clock said.
    exp = await make(tmp_path, rotate_age=0.2, compress=False)
    exp.export_now([ev(1, time="2999-01-01T00:00:00.000Z")])
    for seq in range(2, 12):  # written to all along, so the idle sweep never closes it
        await asyncio.sleep(0.05)
        exp.export_now([ev(seq)])
    await exp.shutdown()
    files = session_files(tmp_path / "logs" / "claude-code" / "s1.jsonl")
    assert len(files) >= 2 and ids(files[0])[0] == ev(1)["id"]  # rotated by age once 0.2 s had passed


async def test_the_byte_cap_deletes_the_oldest_closed_files_never_the_active_one(tmp_path):
    exp = await make(tmp_path, rotate_bytes=2048, compress=False, max_total_bytes=6000)
    for seq in range(1, 61):
        exp.export_now([ev(seq, pad=300)])
        await asyncio.sleep(0)
    await exp.shutdown()
    root = tmp_path / "logs"
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    # Held at each rotation: past it only the file being written grows, by at most rotate_bytes.
    assert total <= 6000 + 2048
    assert exp.health.counters[("exporter/jsonl", "files_deleted")] >= 4  # ~20 KiB written in all
    active = root / "claude-code" / "s1.jsonl"
    assert active.exists()
    kept = ids(active)
    assert kept == [ev(s)["id"] for s in range(61 - len(kept), 61)]  # the newest survive, in order


async def test_a_crash_mid_compression_is_finished_at_the_next_start(tmp_path):
    d = tmp_path / "logs" / "claude-code"
    d.mkdir(parents=True)
    closed = d / "s1@20260101T000000.000000Z.jsonl"
    closed.write_text(json.dumps(ev(1)) + "\n")
    (d / "s1@20260101T000000.000000Z.jsonl.gz.tmp").write_bytes(b"\x1f\x8b partial")
    (d / "s1.jsonl").write_text(json.dumps(ev(2)) + "\n")
    exp = await make(tmp_path, rotate_bytes=1 << 20)
    await wait_until(lambda: not closed.exists(), "the sweep")
    await exp.shutdown()
    assert sorted(os.listdir(d)) == ["s1.jsonl", "s1@20260101T000000.000000Z.jsonl.gz"]
    assert ids(d / "s1.jsonl") == [ev(1)["id"], ev(2)["id"]]


def test_the_reader_keeps_sessions_apart(tmp_path):
    d = tmp_path
    (d / "a.jsonl").write_text(json.dumps(ev(2, "a")) + "\n")
    (d / "a@20260101T000000.000000Z.jsonl").write_text(json.dumps(ev(1, "a")) + "\n")
    (d / "a.b.jsonl").write_text(json.dumps(ev(1, "a.b")) + "\n")  # another session, a prefix of none
    (d / "a.b@20260101T000000.000000Z.jsonl").write_text(json.dumps(ev(9, "a.b")) + "\n")
    assert [f.name for f in session_files(d / "a.jsonl")] == ["a@20260101T000000.000000Z.jsonl", "a.jsonl"]
    assert ids(d / "a.jsonl") == [ev(1)["id"], ev(2)["id"]]


def test_a_cap_without_rotation_is_a_config_error(tmp_path):
    import pytest
    from aep_collector.pipeline.config import ConfigError, parse
    from aep_collector.pipeline.registry import build_registry

    from tests.helpers import base_config

    raw = base_config(tmp_path)
    raw["exporters"]["jsonl"]["max_total_bytes"] = 1 << 30
    with pytest.raises(ConfigError, match="max_total_bytes needs rotate_bytes or rotate_age"):
        parse(raw, build_registry(load_plugins=False)[0], "t.yaml")
    raw["exporters"]["jsonl"]["rotate_bytes"] = 1 << 24
    assert parse(raw, build_registry(load_plugins=False)[0], "t.yaml").exporters["jsonl"][1].retention


async def test_a_file_nobody_writes_is_closed_and_compressed_after_rotate_age(tmp_path):
    exp = await make(tmp_path, rotate_age=0.4)
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    exp.export_now([ev(1, "ended", time=now)])
    d = tmp_path / "logs" / "claude-code"
    await wait_until(lambda: list(d.glob("ended@*.jsonl.gz")), "the idle file closed and compressed")
    await exp.shutdown()
    assert not (d / "ended.jsonl").exists()
    assert ids(d / "ended.jsonl") == [ev(1)["id"]]  # the reader still finds it under the session name


async def test_operator_timeline_and_tail_read_rotated_and_compressed_parts(tmp_path, capsys):
    exp = await make(tmp_path, rotate_bytes=2048)
    for seq in range(1, 31):
        exp.export_now([ev(seq, pad=200)])
    await exp.shutdown()
    active = tmp_path / "logs" / "claude-code" / "s1.jsonl"
    assert any(p.name.endswith(".jsonl.gz") for p in session_files(active))
    capsys.readouterr()
    assert await asyncio.to_thread(cli_main, ["timeline", "s1", "--file", str(active), "--json"]) == 0
    assert [json.loads(x)["id"] for x in capsys.readouterr().out.splitlines()] == [ev(s)["id"] for s in range(1, 31)]
    assert await asyncio.to_thread(cli_main, ["tail", "--file", str(active), "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 30


# Concurrent compressions. A compressor is paused (SIGSTOP) once its temp file holds data, so the
# second one provably runs in the middle of the first: a real interleaving, not a lucky one.

_COMPRESS = "import sys; from pathlib import Path; from aep_collector.exporters.jsonl import _compress; _compress(Path(sys.argv[1]))"


def _closed_file(tmp_path):
    d = tmp_path / "logs" / "claude-code"
    d.mkdir(parents=True)
    closed = d / "s1@20260101T000000.000000Z.jsonl"
    # Incompressible-ish lines: gzip at level 9 takes a good while over 13 MiB.
    lines = [json.dumps(ev(seq, pad=0) | {"data": {"note": os.urandom(96).hex()}}) + "\n" for seq in range(1, 50_001)]
    closed.write_text("".join(lines))
    return d, closed, closed.read_bytes()


def _temps(d):
    return [p for p in d.iterdir() if p.name.endswith(".gz.tmp")]


async def _paused_compressor(d, closed):
    """A compressor process stopped half way through writing its temp file."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _COMPRESS, str(closed)])
    await wait_until(lambda: any(p.stat().st_size for p in _temps(d)), "the first compressor's temp file", 60)
    proc.send_signal(signal.SIGSTOP)
    assert closed.exists() and not closed.with_name(closed.name + ".gz").exists(), "it finished too soon"
    return proc


async def _resume(proc):
    import signal

    proc.send_signal(signal.SIGCONT)
    return await asyncio.to_thread(proc.wait)


async def test_a_second_compressor_never_clobbers_the_first_ones_temp(tmp_path):
    """Two compressors of one closed file at once (two collectors on one log directory): the
    compressed file is whole and the plain one goes only once it is (was: one shared ``.gz.tmp``,
    truncated and renamed under the first, which then wrote its tail into the finished ``.gz``)."""
    from aep_collector.exporters.jsonl import _compress

    d, closed, original = _closed_file(tmp_path)
    first = await _paused_compressor(d, closed)
    try:
        await asyncio.to_thread(_compress, closed)  # the second: it must leave the file to the first
    finally:
        assert await _resume(first) == 0
    assert gzip.decompress((d / (closed.name + ".gz")).read_bytes()) == original
    assert sorted(os.listdir(d)) == [closed.name + ".gz"]


async def test_a_starting_collector_leaves_a_live_compression_alone(tmp_path):
    """A second collector starting on the log directory sweeps temp files of crashed
    compressions: one still being written by a live compressor is not one of them."""
    d, closed, original = _closed_file(tmp_path)
    first = await _paused_compressor(d, closed)
    try:
        other = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"), rotate_bytes=1 << 20))
        await asyncio.to_thread(other._sweep)
    finally:
        assert await _resume(first) == 0
    assert gzip.decompress((d / (closed.name + ".gz")).read_bytes()) == original
    assert sorted(os.listdir(d)) == [closed.name + ".gz"]


async def test_a_killed_compressors_temp_is_swept_and_the_file_compressed(tmp_path):
    import signal

    d, closed, original = _closed_file(tmp_path)
    first = await _paused_compressor(d, closed)
    first.send_signal(signal.SIGKILL)
    await asyncio.to_thread(first.wait)
    assert _temps(d)  # what a crash mid-compression leaves
    exp = await make(tmp_path, rotate_bytes=1 << 20)
    await wait_until(lambda: not closed.exists(), "the sweep", 60)
    await exp.shutdown()
    assert sorted(os.listdir(d)) == [closed.name + ".gz"]
    assert gzip.decompress((d / (closed.name + ".gz")).read_bytes()) == original


async def test_a_file_another_collector_still_appends_to_is_not_compressed_away(tmp_path):
    """Two collectors write one session: one closes the file (renames it) while the other still
    holds it open and appends. Compressing it then would unlink what the other is writing into."""
    rotating = await make(tmp_path, rotate_bytes=4096)
    other = await make(tmp_path)  # no retention: keeps its descriptor on the file it opened
    other.export_now([ev(1, pad=200)])
    for seq in range(2, 40):
        rotating.export_now([ev(seq, pad=200)])
    await rotating.shutdown()  # finishes compressing what it closed
    other.export_now([ev(40, pad=200)])  # into the file the first one closed
    await other.shutdown()
    active = tmp_path / "logs" / "claude-code" / "s1.jsonl"
    assert any(f.name.endswith(".jsonl.gz") for f in session_files(active))  # the others were compressed
    assert sorted(ids(active)) == [ev(s)["id"] for s in range(1, 41)]


async def test_a_writer_refused_its_shared_lock_never_appends_to_the_file_being_compressed(tmp_path, monkeypatch):
    """Another collector closes (renames) a session file and starts compressing it between this
    writer's open and its shared lock: the exclusive lock the compressor holds is what the writer
    sees. What it appended to that file after the compressor's copy would go with the unlink; it
    writes to the file the name holds now instead."""
    import fcntl

    from aep_collector.exporters import jsonl

    d = tmp_path / "logs" / "claude-code"
    d.mkdir(parents=True)
    active = d / "s1.jsonl"
    first = json.dumps(ev(1)) + "\n"
    active.write_text(first)
    closed = d / "s1@20260101T000000.000000Z.jsonl"
    held: list[int] = []
    real_try_lock = jsonl._try_lock

    def compressor_between_open_and_lock(fd, kind):
        if kind == fcntl.LOCK_SH and not held:
            os.rename(active, closed)  # the other collector closes the file ...
            held.append(os.open(closed, os.O_RDONLY))
            fcntl.flock(held[0], fcntl.LOCK_EX)  # ... and its compressor takes it, as _compress does
        return real_try_lock(fd, kind)

    monkeypatch.setattr(jsonl, "_try_lock", compressor_between_open_and_lock)
    exp = await make(tmp_path, compress=False)
    try:
        exp.export_now([ev(2)])
        assert held, "the writer never asked for its shared lock"
        assert closed.read_text() == first  # the file under compression is as the compressor read it
        assert [json.loads(line)["id"] for line in active.read_text().splitlines()] == [ev(2)["id"]]
    finally:
        await exp.shutdown()
        for fd in held:
            os.close(fd)


async def test_the_byte_cap_holds_when_the_disk_is_too_full_to_compress(tmp_path, monkeypatch):
    """A full disk fails every compression (its temp file cannot be synced); the byte cap, which is
    what frees room then, must still delete the oldest closed files, and the failure is shown."""
    import errno

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)  # fsync="never": only the compressor syncs
    exp = await make(tmp_path, rotate_bytes=2048, max_total_bytes=6000)
    for seq in range(1, 61):
        exp.export_now([ev(seq, pad=300)])
        await asyncio.sleep(0)
    await exp.shutdown()
    root = tmp_path / "logs"
    assert not list(root.rglob("*.gz")) and not list(root.rglob("*.gz.tmp"))  # nothing compressed, nothing left over
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert total <= 6000 + 2048
    assert exp.health.counters[("exporter/jsonl", "files_deleted")] >= 4
    assert "retention-failed" in json.dumps(exp.health.snapshot())


async def test_a_closed_file_deleted_by_the_cap_mid_compression_is_no_failure(tmp_path):
    """Another collector's byte cap deletes the oldest closed file while this one compresses it:
    the compressed copy is finished and the file is gone, which is what compressing it means; an
    error (a retention failure on /healthz that stays) would be a false alarm."""
    d, closed, original = _closed_file(tmp_path)
    first = await _paused_compressor(d, closed)
    closed.unlink()  # the cap of another collector on the same directory
    assert await _resume(first) == 0
    assert gzip.decompress((d / (closed.name + ".gz")).read_bytes()) == original
    assert not _temps(d)


@contextlib.contextmanager
def no_renames_in(directory):
    """Files in ``directory`` can be appended to and created, not renamed: an append-only directory
    (``chattr +a``, for root) or one without write permission (for anyone else)."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+a", str(directory)],
                                                            capture_output=True).returncode:
            pytest.skip("needs chattr +a on this filesystem")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-a", str(directory)], check=True)
    else:
        mode = directory.stat().st_mode
        directory.chmod(0o500)
        try:
            yield
        finally:
            directory.chmod(mode)


async def test_a_rotation_that_cannot_rename_keeps_writing_to_the_file_and_says_so(tmp_path):
    """A file due for rotation was closed, then renamed; when the rename failed (an append-only
    log directory) every later event of the session was dropped from the durable record, though
    the file took appends, and /healthz soon said ok again."""
    exp = await make(tmp_path, rotate_bytes=4096, compress=False)
    exp.export_now([ev(0, pad=200)])
    active = tmp_path / "logs" / "claude-code" / "s1.jsonl"
    try:
        with no_renames_in(active.parent):
            unwritten = [e for seq in range(1, 60) for e in exp.export_now([ev(seq, pad=200)])]
            assert not unwritten
            assert ("exporter/jsonl", "dropped") not in exp.health.counters
            assert "retention-failed" in exp.health.snapshot()["problems"]["exporter/jsonl"]
        exp.export_now([ev(60, pad=200)])  # renames work again: rotated, and the condition clears
        assert "problems" not in exp.health.snapshot()
    finally:
        await exp.shutdown()
    assert ids(active) == [f"01J{seq:023d}" for seq in range(61)]
    assert len(session_files(active)) == 2


async def test_the_byte_cap_never_deletes_a_closed_file_another_collector_still_appends_to(tmp_path):
    """Two collectors write one session: one closes the file (renames it) while the other still
    holds it open and appends; the first one's byte cap then deleted it as the oldest closed file,
    and what the other wrote into it until it noticed went with it. A file some writer holds is
    left to a later round, as the compressor leaves it."""
    rotating = await make(tmp_path, rotate_bytes=2048, compress=False, max_total_bytes=4096)
    other = await make(tmp_path)  # no retention: keeps its descriptor on the file it opened
    other.export_now([ev(1, pad=300)])
    for seq in range(2, 40):
        rotating.export_now([ev(seq, pad=300)])
        await asyncio.sleep(0)
    await rotating.shutdown()  # its cap ran at each rotation
    assert rotating.health.counters[("exporter/jsonl", "files_deleted")] >= 1  # the cap did delete
    other.export_now([ev(40, pad=300)])  # into the file the first one closed, if it is still there
    await other.shutdown()
    kept = [line for f in sorted((tmp_path / "logs" / "claude-code").iterdir()) for line in iter_lines(f)]
    assert {ev(1)["id"], ev(40)["id"]} <= {json.loads(line)["id"] for line in kept}


async def test_files_closed_after_the_clock_stepped_back_still_read_in_the_order_they_were_written(
        tmp_path, monkeypatch):
    """A closed file is named after the wall clock, and readers take a session's closed files in
    name order; after an NTP step back, a file closed later got an earlier name, and `tail --file`
    and validate-events read its events before older ones."""
    from aep_collector.exporters import jsonl

    exp = await make(tmp_path, rotate_bytes=2048, compress=False)
    try:
        for seq in range(20):
            exp.export_now([ev(seq, pad=300)])
        stepped = datetime.now(UTC) - timedelta(hours=1)

        class SteppedBack(datetime):
            @classmethod
            def now(cls, tz=None):
                return stepped  # an hour back, and held there

        monkeypatch.setattr(jsonl, "datetime", SteppedBack)
        for seq in range(20, 40):
            exp.export_now([ev(seq, pad=300)])
    finally:
        await exp.shutdown()
    active = tmp_path / "logs" / "claude-code" / "s1.jsonl"
    assert len(session_files(active)) >= 8
    assert ids(active) == [ev(seq)["id"] for seq in range(40)]
