"""The relay role's in-process entry (``RelayServer.export``) against events with a mistyped envelope
attribute, which a plug-in receiver or processor can hand on (the stamper keeps a stamped-looking
event as it is): only that event is left out, counted and named in ``/healthz``, logged once per
cause; the rest of its batch reaches subscribers (the official ``aep_sdk``) and its session keeps
buffering and replaying. Each test runs a real relay role on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.exporters.relay_server import RelayServer, RelayServerConfig
from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.registry import build_registry
from aep_sdk.aio import subscribe

from tests.helpers import read_jsonl, running
from tests.relay_double import wait_until
from tests.test_relay_server import TOKEN, config

SID = "rs-bad-1"
BAD_ID = "01RSBADEVENT0000000000000X"


def stamped(n: int, **over: Any) -> dict[str, Any]:
    ev = {"aep": "0.1", "id": f"01RSGOOD{n:018d}", "type": "progress.status",
          "time": "2026-01-01T00:00:00.000Z", "source": f"aep://test-host/agent/plug/session/{SID}",
          "agent": "plug", "session": SID, "seq": n, "epoch": 0, "capture": "metadata",
          "data": {"message": f"step {n}"}}
    ev.update(over)
    return ev


@contextlib.asynccontextmanager
async def relay_role(tmp_path: Path) -> AsyncIterator[RelayServer]:
    cfg = RelayServerConfig(endpoint="127.0.0.1:0", token=TOKEN)
    relay = RelayServer(CreateSettings(id="relay_server"), cfg)
    await relay.start(Host(state_dir=tmp_path))
    try:
        yield relay
    finally:
        await relay.shutdown()


async def received(sub: Any, until: str) -> list[dict[str, Any]]:
    """Every event the subscription yields up to and including the one with id ``until``."""
    out = []
    async for ev in sub:
        out.append(ev)
        if ev.get("id") == until:
            return out
    raise AssertionError(f"the stream ended before {until}")


# Each wrong-typed attribute the relay reads, and a word its health detail must name.
CASES = [
    ("seq", "5", "seq"), ("seq", True, "seq"), ("epoch", "0", "epoch"), ("session", 7, "session"),
    ("id", ["x"], "id"), ("type", 9, "type"), ("time", 5, "time"), ("agent", 3, "agent"),
    ("source", {}, "source"), ("severity", ["info"], "severity"), ("capture", ["full"], "capture"),
]


@pytest.mark.parametrize("field, value, named", CASES, ids=[f"{f}={v!r}" for f, v, _ in CASES])
async def test_one_mistyped_event_is_left_out_and_the_rest_of_its_batch_is_served(
        tmp_path: Path, field: str, value: Any, named: str) -> None:
    async with relay_role(tmp_path) as relay:
        sub = await subscribe(relay.url, token=TOKEN)
        try:
            await wait_until(lambda: relay.consumers == 1, "the subscriber to attach")
            bad = stamped(1, id=BAD_ID)
            bad[field] = value
            # The bad event first in a fresh session, then behind a good one: neither may break the
            # batch or the session's buffer for the events after it.
            await relay.export([bad, stamped(0), stamped(2)])
            await relay.export([stamped(3), dict(bad), stamped(4)])
            got = await asyncio.wait_for(received(sub, stamped(4)["id"]), 10)
            assert [e["id"] for e in got] == [stamped(n)["id"] for n in (0, 2, 3, 4)]
        finally:
            sub.close()
        # The session's buffer still orders and replays what was served.
        history = await subscribe(relay.url, token=TOKEN, from_="all", live=False)
        replayed = await asyncio.wait_for(received(history, stamped(4)["id"]), 10)
        assert [e["seq"] for e in replayed] == [0, 2, 3, 4]
        health = relay.host.health
        assert health.counters[(relay.id, "dropped")] == 2
        assert (relay.id, "failed") not in health.counters
        detail = health.snapshot()["problems"][relay.id]["invalid-event"]
        assert named in detail and "not served" in detail
        if field != "id":
            assert BAD_ID in detail


async def test_an_event_that_cannot_be_encoded_costs_only_itself(tmp_path: Path) -> None:
    async with relay_role(tmp_path) as relay:
        sub = await subscribe(relay.url, token=TOKEN)
        try:
            await wait_until(lambda: relay.consumers == 1, "the subscriber to attach")
            await relay.export([stamped(0), stamped(1, id=BAD_ID, data={"tags": {"a", "b"}}), stamped(2)])
            got = await asyncio.wait_for(received(sub, stamped(2)["id"]), 10)
            assert [e["seq"] for e in got] == [0, 2]
        finally:
            sub.close()
        detail = relay.host.health.snapshot()["problems"][relay.id]["unservable-event"]
        assert BAD_ID in detail and "TypeError" in detail


async def test_a_recurring_bad_event_is_logged_once_and_counted_every_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with relay_role(tmp_path) as relay:
        with caplog.at_level(logging.WARNING):
            for n in range(5):
                await relay.export([stamped(n, id=f"{BAD_ID[:-1]}{n}", seq=str(n))])
        lines = [r for r in caplog.records if "invalid-event" in r.getMessage()]
        assert len(lines) == 1 and "seq" in lines[0].getMessage()
        assert relay.host.health.counters[(relay.id, "dropped")] == 5


@dataclass
class NoConfig:
    pass


class InjectBadSeq:
    """A plug-in processor's bug: before each ``session.started`` draft it passes on a stamped-looking
    event whose ``seq`` is a string, which the stamper keeps as it is."""

    def __call__(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = []
        for item in batch:
            if not isinstance(item, Signal) and item.get("type") == "session.started":
                out.append({"aep": "0.1", "id": BAD_ID, "type": "progress.status",
                            "time": "2026-01-01T00:00:00.000Z",
                            "source": f"aep://test-host/agent/plug/session/{SID}",
                            "agent": "claude-code", "session": item["session"], "seq": "5", "epoch": 0,
                            "capture": "metadata", "data": {}})
            out.append(item)
        return out


async def started_twice(sub: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async for ev in sub:
        out.append(ev)
        if sum(e["type"] == "session.started" for e in out) == 2:
            return out
    raise AssertionError("the stream ended before two session.started")


async def test_through_the_pipeline_the_good_events_arrive_and_no_export_fails(tmp_path: Path) -> None:
    registry, _ = build_registry(load_plugins=False)
    registry.register(Factory(kind=Kind.PROCESSOR, type="inject", config_class=NoConfig,
                              create=lambda settings, cfg: InjectBadSeq()), "plug-in inject")
    raw = config(tmp_path)
    raw["processors"]["inject"] = None
    raw["service"]["pipelines"]["agents"]["processors"].insert(1, "inject")  # after mapping: drafts
    async with running(raw, registry) as service:
        relay = service.exporters["relay_server"]
        hook = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"
        sub = await subscribe(relay.url, token=TOKEN, filter={"session": SID})
        try:
            await wait_until(lambda: relay.consumers == 1, "the subscriber to attach")
            async with aiohttp.ClientSession() as http:
                for _ in range(2):  # two batches: the first must not spoil the session for the second
                    async with http.post(hook, json={"session_id": SID, "hook_event_name": "SessionStart",
                                                     "source": "startup"}) as r:
                        assert r.status == 200
            got = await asyncio.wait_for(started_twice(sub), 10)
            assert BAD_ID not in [e["id"] for e in got]
        finally:
            sub.close()
        health = service.host.health
        await wait_until(lambda: health.counters.get((relay.id, "dropped")) == 2, "both bad events counted")
        problems = health.snapshot().get("problems", {})
        assert "export-failed" not in problems.get(relay.id, {})
        assert "invalid-event" in problems[relay.id]
        # The durable record still holds what subscribers were not served.
        assert BAD_ID in [e["id"] for e in read_jsonl(tmp_path / "logs" / "claude-code" / f"{SID}.jsonl")]
