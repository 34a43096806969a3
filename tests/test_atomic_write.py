"""``atomic_write``: every state and config file the collector rewrites (the tail cursor, the relay
discovery file, the vendor configs ``hooks --install`` edits, the shim copy and its table, the
epoch files) is replaced whole, even with writers racing, and a failed write changes nothing."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from aep_collector.pipeline import atomic, operator_cli
from aep_collector.pipeline.atomic import atomic_write
from aep_collector.receivers import wiring

from tests.helpers import race


def test_concurrent_writers_never_leave_a_partial_or_empty_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    versions = [bytes([65 + i]) * (1 << 20) for i in range(4)]
    assert race(target, versions, lambda data: atomic_write(target, data)) == []
    assert target.read_bytes() in versions
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left behind


def test_concurrent_tail_cursor_saves_keep_a_whole_cursor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ``tail`` commands save the cursor at once (it was one fixed ``tail.cursor.tmp``)."""
    monkeypatch.setenv("AEP_STATE_DIR", str(tmp_path))
    cursors = [{f"s{i}-{n}": (i, n) for n in range(2000)} for i in range(4)]
    versions = [json.dumps([{"session": s, "epoch": e, "seq": q} for s, (e, q) in c.items()][-500:]).encode()
                for c in cursors]
    seen = race(operator_cli.cursor_path(), versions, lambda data: operator_cli.save_cursor(cursors[versions.index(data)]), rounds=100)
    assert seen == []
    assert operator_cli.load_cursor()[-1]["seq"] == 1999
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tail.cursor.json"]


def test_concurrent_installs_write_a_whole_vendor_config(tmp_path: Path) -> None:
    """``hooks --install`` run twice at once (it was one fixed ``<file>.aep-tmp``)."""
    target = tmp_path / "settings.json"
    versions = [json.dumps({"hooks": str(i) * 100_000}).encode() for i in range(4)]
    assert race(target, versions, lambda data: wiring._write(target, data.decode(), None)) == []
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "epoch.json"
    target.write_text("old")

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        atomic_write(target, "new", durable=True)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["epoch.json"]


def test_modes_an_existing_file_keeps_its_own_a_new_one_follows_the_umask(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.write_text("x")
    os.chmod(kept, 0o640)
    atomic_write(kept, "y")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "new", "z")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o640
    atomic_write(tmp_path / "given", "z", mode=0o600)
    assert stat.S_IMODE((tmp_path / "given").stat().st_mode) == 0o600
