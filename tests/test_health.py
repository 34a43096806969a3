"""Health semantics: conditions last while their cause does, incidents for a window; 503 while not ok."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import aiohttp
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.config import parse
from aep_collector.pipeline.control import ControlRouter
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.registry import build_registry

from tests.helpers import base_config, running


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_incident_clears_after_its_window_and_a_repeat_extends_it():
    clock = Clock()
    h = Health(window=60, clock=clock)
    h.incident("receiver/x", "hook-error", "KeyError: 'a'")
    snap = h.snapshot()
    assert snap["ok"] is False and snap["problems"] == {"receiver/x": {"hook-error": "KeyError: 'a'"}}
    assert snap["incidents"] == {"receiver/x": {"hook-error": 60.0}}
    clock.now += 50
    h.incident("receiver/x", "hook-error", "KeyError: 'b'")  # seen again: shown 60 s from now
    clock.now += 50
    assert h.snapshot()["problems"]["receiver/x"]["hook-error"] == "KeyError: 'b'"
    clock.now += 10
    assert h.snapshot() == {"ok": True, "relay": False}


def test_a_condition_stays_until_recovered_or_its_cause_is_gone():
    clock = Clock()
    h = Health(window=1, clock=clock)
    h.fail("exporter/a", "eacces", "no write permission")
    clock.now += 3600
    assert h.snapshot()["problems"] == {"exporter/a": {"eacces": "no write permission"}}
    assert "incidents" not in h.snapshot()
    h.recover("exporter/a", "eacces")
    assert h.snapshot()["ok"] is True
    gone = {"value": False}
    h.fail("exporter/b", "enospc", "disk full", clears=lambda: gone["value"])
    assert h.snapshot()["ok"] is False
    gone["value"] = True
    assert h.snapshot()["ok"] is True  # cleared by the probe, no write needed


def test_recover_drops_only_the_named_cause_of_its_own_component(caplog: Any) -> None:
    """``recover`` returns at once for a component with no problem (a hook's and a delivery's usual
    call) and otherwise drops exactly the cause named, or every cause without one."""
    caplog.set_level("WARNING", "aep.health")
    h = Health()
    h.recover("receiver/x", "overloaded")  # nothing to recover: nothing changes, nothing logged
    assert h.snapshot() == {"ok": True, "relay": False} and not caplog.records
    h.fail("exporter/a", "eacces")
    h.fail("exporter/a", "enospc")
    h.incident("exporter/b", "bad")
    h.recover("exporter/c")
    h.recover("exporter/a", "export-failed")
    assert h.snapshot()["problems"] == {"exporter/a": {"eacces": "eacces", "enospc": "enospc"},
                                        "exporter/b": {"bad": "bad"}}
    h.recover("exporter/a", "eacces")
    assert h.snapshot()["problems"] == {"exporter/a": {"enospc": "enospc"}, "exporter/b": {"bad": "bad"}}
    h.recover("exporter/a")
    h.recover("exporter/b")
    assert h.snapshot() == {"ok": True, "relay": False}
    assert [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()] == [
        "exporter/a: recovered from eacces", "exporter/a: recovered from enospc", "exporter/b: recovered from bad"]


def test_a_condition_reported_again_is_not_turned_into_an_incident():
    clock = Clock()
    h = Health(window=1, clock=clock)
    h.incident("c", "x")
    h.fail("c", "x", "now a state")
    clock.now += 10
    assert h.snapshot()["problems"] == {"c": {"x": "now a state"}}


async def test_a_malformed_command_is_an_incident():
    clock = Clock()
    h = Health(window=60, clock=clock)
    router = ControlRouter(h)
    await router.submit({"type": "control.attention.respond"}, "claude-code")
    assert "malformed-command" in h.snapshot()["problems"]["control"]
    clock.now += 61
    assert h.snapshot()["ok"] is True


# A processor that breaks on one prompt: the pipeline fails for that hook only.
@dataclass
class BoomConfig:
    word: str = "boom"


class Boom:
    def __init__(self, cfg: BoomConfig) -> None:
        self.word = cfg.word

    def __call__(self, batch: list[Any]) -> list[Any]:
        for item in batch:
            if isinstance(item, dict) and (item.get("data") or {}).get("prompt") == self.word:
                raise RuntimeError("boom")
        return batch


BOOM = Factory(kind=Kind.PROCESSOR, type="boom", config_class=BoomConfig, create=lambda s, c: Boom(c))


async def test_healthz_is_503_while_a_hook_error_is_shown_and_200_once_its_window_passed(tmp_path):
    registry, _ = build_registry(load_plugins=False)
    registry.register(BOOM, "test")
    cfg = base_config(tmp_path, ceiling="full")
    cfg["processors"]["boom"] = None
    cfg["service"]["pipelines"]["agents"]["processors"] = ["mapping", "runs", "boom", "capture"]
    cfg["service"]["telemetry"] = {"health": {"window": 5}}
    clock = Clock()
    async with running(cfg, registry) as service:
        assert service.health.window == 5
        service.health.clock = clock
        url = f"http://127.0.0.1:{service.receivers['claude_code'].port}"
        hook = {"session_id": "s", "hook_event_name": "UserPromptSubmit", "cwd": "/w"}
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/healthz") as r:
                assert (r.status, (await r.json())["ok"]) == (200, True)
            async with s.post(url + "/hook", json={**hook, "prompt": "boom"}) as r:
                assert (r.status, await r.json()) == (200, {})  # fail open
            async with s.get(url + "/healthz") as r:
                body = await r.json()
                assert r.status == 503 and body["ok"] is False
                assert "pipeline-error" in body["problems"]["receiver/claude_code"]
                assert body["incidents"]["receiver/claude_code"]["pipeline-error"] <= 5
                # ... and which step lost the batch, by its config id
                assert body["problems"]["processor/boom"] == {"processor-failed": "RuntimeError: boom"}
            async with s.post(url + "/hook", json={**hook, "prompt": "fine"}) as r:
                assert r.status == 200
            clock.now += 5
            async with s.get(url + "/healthz") as r:
                assert (r.status, await r.json()) == (200, {"ok": True, "relay": False})


def test_the_window_is_configured_and_checked(tmp_path):
    registry, _ = build_registry(load_plugins=False)
    cfg = base_config(tmp_path)
    assert parse(cfg, registry).telemetry.health_window == 60.0
    cfg["service"]["telemetry"] = {"health": {"window": 0}}
    try:
        parse(cfg, registry)
    except ValueError as exc:
        assert "service.telemetry.health.window" in str(exc)
    else:
        raise AssertionError("a zero window was accepted")


async def test_a_full_disk_is_a_state_not_the_last_write(tmp_path):
    root = tmp_path / "logs"
    (root / "claude-code").mkdir(parents=True)
    # /dev/full: every write fails with ENOSPC, as on a full disk, while other files still fit.
    os.symlink("/dev/full", root / "claude-code" / "full.jsonl")
    exporter = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(root), fsync="never",
                                                                      min_free_bytes=1 << 62))
    host = Host(health=Health())
    await exporter.start(host)
    ev = {"agent": "claude-code", "type": "run.started", "data": {}}
    exporter.export_now([{**ev, "session": "full"}])
    assert "enospc" in host.health.snapshot()["problems"]["exporter/jsonl"]
    exporter.export_now([{**ev, "session": "small"}])  # this write fits; the disk is still "full"
    assert (root / "claude-code" / "small.jsonl").read_text()
    assert "enospc" in host.health.snapshot()["problems"]["exporter/jsonl"]
    exporter.config.min_free_bytes = 0  # space is back (as the filesystem reports it)
    assert host.health.snapshot()["ok"] is True  # cleared without waiting for a write
    await exporter.shutdown()


async def test_an_unwritable_directory_clears_on_the_next_write_that_succeeds(tmp_path):
    root = tmp_path / "logs"
    root.write_text("a file where the log directory should be")
    exporter = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(root), fsync="never"))
    host = Host(health=Health())
    await exporter.start(host)
    ev = {"agent": "claude-code", "session": "s", "type": "run.started", "data": {}}
    exporter.export_now([ev])
    assert host.health.snapshot()["ok"] is False
    root.unlink()
    exporter.export_now([ev])
    assert host.health.snapshot()["ok"] is True
    await exporter.shutdown()


def test_a_quiet_condition_is_unhealthy_but_logged_as_information(caplog) -> None:
    """A start-up state (NATS not yet connected) must make /healthz 503 without an ERROR line on
    every normal start; a real failure of the same component still logs as one."""
    import logging

    h = Health()
    with caplog.at_level(logging.INFO, logger="aep.health"):
        h.fail("exporter/nats", "connecting", "not yet connected", quiet=True)
        assert h.snapshot()["ok"] is False
        h.fail("exporter/nats", "nats-down", "refused")
        h.recover("exporter/nats", "connecting")
        h.recover("exporter/nats", "nats-down")
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [("INFO", "exporter/nats: connecting: not yet connected"),
                      ("ERROR", "exporter/nats: nats-down: refused"),
                      ("INFO", "exporter/nats: no longer connecting"),
                      ("WARNING", "exporter/nats: recovered from nats-down")]
    assert h.snapshot()["ok"] is True
