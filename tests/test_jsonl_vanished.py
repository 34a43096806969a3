"""A session file deleted or moved away while the JSONL exporter holds it open.

Without a check, every later event of that session goes into the unlinked file (or the moved one)
until the file is closed. The exporter checks its open files about once a second (not per write)
and closes one that is gone, so the next event re-creates the file at its path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.exporters import jsonl as jsonl_module
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host

from tests.helpers import base_config, read_jsonl, running
from tests.relay_double import wait_until


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    # A tenth of the default second: the tests wait on conditions, this only makes them quicker.
    monkeypatch.setattr(JsonlExporter, "check_interval", 0.1)


def ev(session: str, seq: int) -> dict[str, Any]:
    return {"aep": "0.1", "id": f"id{session}{seq}", "type": "run.started", "time": "2026-01-01T00:00:00.000Z",
            "source": "aep://h/agent/a/session/s", "agent": "claude-code", "session": session, "seq": seq}


async def make(tmp_path: Path, **cfg: Any) -> tuple[JsonlExporter, Host]:
    exp = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"), **cfg))
    host = Host(state_dir=tmp_path)
    await exp.start(host)
    return exp, host


def seqs(path: Path) -> list[int]:
    return [json.loads(line)["seq"] for line in path.read_text().splitlines()] if path.exists() else []


def vanished(host: Host) -> str | None:
    """The ``file-vanished`` incident's detail in ``/healthz``, if it is shown."""
    return host.health.snapshot().get("problems", {}).get("exporter/jsonl", {}).get("file-vanished")


async def test_a_deleted_session_file_is_reported_and_the_next_hook_recreates_it(tmp_path, caplog):
    caplog.set_level(logging.INFO, "aep.exporter.jsonl")
    cfg = base_config(tmp_path)  # fsync "never": no interval thread, the check runs all the same
    file = tmp_path / "logs" / "claude-code" / "s.jsonl"
    async with running(cfg) as service:
        url = f"http://127.0.0.1:{service.receivers['claude_code'].port}"
        hook = {"session_id": "s", "hook_event_name": "UserPromptSubmit", "cwd": "/w"}
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/hook", json={**hook, "prompt": "one"}) as r:
                assert r.status == 200
            before = read_jsonl(file)
            assert before
            file.unlink()  # a user's rm, or a cleanup tool's, while the session goes on

            async def incident() -> dict[str, Any] | None:
                async with http.get(url + "/healthz") as r:
                    body = await r.json()
                    return body if r.status == 503 and "file-vanished" in body.get(
                        "problems", {}).get("exporter/jsonl", {}) else None

            body = None
            for _ in range(1000):  # a condition, not a time: the check runs about every 0.1 s here
                body = await incident()
                if body:
                    break
                await asyncio.sleep(0.01)
            assert body, "/healthz never reported the deleted file"
            detail = body["problems"]["exporter/jsonl"]["file-vanished"]
            assert detail.startswith("claude-code/s.jsonl: deleted while open")  # relative to the log directory
            assert "file-vanished" in body["incidents"]["exporter/jsonl"]
            async with http.post(url + "/hook", json={**hook, "prompt": "two"}) as r:
                assert r.status == 200
        after = read_jsonl(file)  # re-created at its path, not written into the deleted file
        assert after and {e["id"] for e in after}.isdisjoint(e["id"] for e in before)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("claude-code/s.jsonl was deleted while open" in m for m in warnings), warnings


@pytest.mark.parametrize("fsync", ["always", "interval"])
async def test_a_deleted_file_is_recreated_whatever_the_fsync_policy(tmp_path, fsync):
    exp, host = await make(tmp_path, fsync=fsync, fsync_interval=0.01)
    file = exp.path_for(ev("s", 0))
    exp.export_now([ev("s", 0)])
    file.unlink()
    detail = await wait_until(lambda: vanished(host), "the deletion reported")
    assert detail.startswith("claude-code/s.jsonl: deleted while open; the events written to it since")
    exp.export_now([ev("s", 1)])
    assert seqs(file) == [1]
    assert host.health.counters[("exporter/jsonl", "files_vanished")] == 1
    await exp.shutdown()


async def test_a_moved_file_keeps_what_it_got_and_the_session_starts_afresh_at_its_path(tmp_path, caplog):
    caplog.set_level(logging.INFO, "aep.exporter.jsonl")
    exp, host = await make(tmp_path, fsync="interval", fsync_interval=0.01)
    file = exp.path_for(ev("s", 0))
    exp.export_now([ev("s", 0)])
    moved = tmp_path / "kept.jsonl"
    os.rename(file, moved)  # a user's mv (or logrotate's) while the session goes on
    written = [1]
    exp.export_now([ev("s", 1)])

    def one_more() -> bool:
        # Events until the check closes the moved file: they go to it until then, none is lost.
        if file.exists():
            return True
        written.append(written[-1] + 1)
        exp.export_now([ev("s", written[-1])])
        return False

    await wait_until(one_more, "a new file at the session's path")
    assert seqs(moved) + seqs(file) == [0, *written]
    assert seqs(file)  # the session writes at its path again
    assert vanished(host) is None  # nothing was lost: not a health problem
    assert host.health.counters[("exporter/jsonl", "files_moved")] == 1
    assert any("claude-code/s.jsonl was moved away" in r.getMessage() for r in caplog.records)
    await exp.shutdown()


async def test_with_rotation_a_deleted_file_is_noticed_before_the_next_write(tmp_path):
    # Rotation stats the file on every write anyway: no event goes into the deleted file at all.
    exp, host = await make(tmp_path, fsync="never", rotate_bytes=1 << 20)
    file = exp.path_for(ev("s", 0))
    exp.export_now([ev("s", 0)])
    file.unlink()
    exp.export_now([ev("s", 1)])  # at once, before any check could run
    assert seqs(file) == [1]
    assert vanished(host) == "claude-code/s.jsonl: deleted while open; no event was written to it since"
    await exp.shutdown()


def count_rounds(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many rounds of the check have started; one starting means the one before it is done."""
    rounds = {"n": 0}
    real = jsonl_module._vanished_of

    def counted(files: list[tuple[str, int]]) -> list[tuple[str, int]]:
        rounds["n"] += 1
        return real(files)

    monkeypatch.setattr(jsonl_module, "_vanished_of", counted)
    return rounds


async def test_files_still_in_place_are_left_open(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, "aep.exporter.jsonl")
    rounds = count_rounds(monkeypatch)
    exp, host = await make(tmp_path, fsync="interval", fsync_interval=0.01)
    file = exp.path_for(ev("s", 0))
    exp.export_now([ev("s", 0)])
    fd = exp._fds[str(file)]
    os.link(file, tmp_path / "second-name.jsonl")  # another name for the same file: not moved
    await wait_until(lambda: rounds["n"] >= 3, "three rounds of the check")
    exp.export_now([ev("s", 1)])
    assert exp._fds[str(file)] == fd and seqs(file) == [0, 1]
    assert not [r for r in caplog.records if r.name == "aep.exporter.jsonl"]
    assert host.health.snapshot()["ok"] is True
    await exp.shutdown()


async def test_deletions_while_many_sessions_write_lose_only_what_went_into_the_void(tmp_path):
    """The writer (the loop), the interval fsync thread and the check's thread at once: files still
    in place keep every event; a deleted one is re-created and holds an unbroken run to the end."""
    exp, host = await make(tmp_path, fsync="interval", fsync_interval=0.01)
    sessions = [f"s{i}" for i in range(12)]
    files = {s: exp.path_for(ev(s, 0)) for s in sessions}
    doomed = sessions[::2]
    seq = {"n": 0}

    def round_of_writes() -> None:
        assert exp.export_now([ev(s, seq["n"]) for s in sessions]) == []
        seq["n"] += 1

    round_of_writes()
    for s in doomed:
        files[s].unlink()

    def recreated() -> bool:
        round_of_writes()
        return all(files[s].exists() for s in doomed)

    await wait_until(recreated, "every deleted file re-created")
    for _ in range(5):
        round_of_writes()
        await asyncio.sleep(0.01)
    await exp.shutdown()
    last = seq["n"] - 1
    for s in sessions:
        got = seqs(files[s])
        if s in doomed:  # what went into the deleted file between deletion and check is gone
            assert got and got == list(range(got[0], last + 1)), (s, got)
        else:
            assert got == list(range(last + 1)), s
    assert host.health.counters[("exporter/jsonl", "files_vanished")] == len(doomed)
    assert vanished(host)


async def test_a_stale_finding_of_the_check_never_closes_the_file_reopened_at_that_path(tmp_path, monkeypatch):
    """The check's thread looks at a copy of the open files; meanwhile the loop may close a file
    and reopen its path under the same descriptor number. The finding is confirmed on the loop."""
    exp, host = await make(tmp_path, fsync="never", max_open_files=1)
    a, b = exp.path_for(ev("a", 0)), exp.path_for(ev("b", 0))
    held, release = threading.Event(), threading.Event()
    real = jsonl_module._whereabouts

    def slow(path: str, fd: int) -> Any:
        found = real(path, fd)
        if found and threading.current_thread() is not threading.main_thread() and not held.is_set():
            held.set()
            release.wait(10)
        return found

    monkeypatch.setattr(jsonl_module, "_whereabouts", slow)
    rounds = count_rounds(monkeypatch)
    exp.export_now([ev("a", 0)])
    fd = exp._fds[str(a)]
    a.unlink()
    await asyncio.to_thread(held.wait, 10)  # the thread found a's file deleted, and waits
    exp.export_now([ev("b", 0)])  # one open file at most: a's closed, b's opened with its number
    exp.export_now([ev("a", 1)])  # b's closed, a re-created at its path, again with that number
    assert exp._fds[str(a)] == fd
    held_round = rounds["n"]
    release.set()
    await wait_until(lambda: rounds["n"] > held_round, "the held round acted on, a next one started")
    exp.export_now([ev("a", 2)])
    assert exp._fds.get(str(a)) == fd and seqs(a) == [1, 2] and seqs(b) == [0]
    assert vanished(host) is None  # the LRU's reopen re-created it: no event went into the void
    await exp.shutdown()
