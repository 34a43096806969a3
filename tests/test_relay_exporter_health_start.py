"""``/healthz`` of the relay exporter before a connection's first hello: never ok until it is answered.

The relay double's ``fault_hello("hold")`` is a relay that completes the WebSocket upgrade, takes
the hello and does not answer it (until ``release_hellos``). With ``hello_timeout`` far away, that
first attempt never ends by itself in a test; before the fix ``/healthz`` read ok all along.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.exporters.relay import RelayConfig, RelayExporter
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host

from tests.helpers import base_config, running
from tests.relay_double import RelayDouble, wait_until

TOKEN = "relay-token"
CC = "claude-code"
EXPORTER = "exporter/relay"
NEVER = 600.0
"""hello_timeout: the held hello is never given up on during a test."""


def connecting(health: Any) -> str | None:
    return health.snapshot().get("problems", {}).get(EXPORTER, {}).get("connecting")


async def healthz(service: Any) -> tuple[int, dict[str, Any]]:
    port = service.receivers["claude_code"].port
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz") as r:
        return r.status, await r.json()


async def hook(service: Any, body: dict[str, Any]) -> int:
    port = service.receivers["claude_code"].port
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/hook", json=body) as r:
        return r.status


async def test_a_relay_that_never_answers_the_hello_leaves_the_collector_unhealthy_and_loses_nothing(
        relay: RelayDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aep.health")
    relay.fault_hello("hold")
    cfg = base_config(tmp_path, extra_exporters={"relay": {
        "endpoint": relay.ws_url, "token": TOKEN, "backoff_initial": 0.02, "backoff_max": 0.1,
        "hello_timeout": NEVER}})
    session = "held-hello"
    async with running(cfg) as service:
        for i in range(3):  # hooks are answered meanwhile
            assert await hook(service, {"session_id": session, "hook_event_name": "UserPromptSubmit",
                                        "prompt": f"step {i}"}) == 200
        await wait_until(lambda: relay.hellos(CC), "the hello to reach the silent relay", 30)
        status, body = await healthz(service)
        assert status == 503 and body["ok"] is False, body
        assert body["problems"][EXPORTER]["connecting"] == \
            f"not yet connected to the relay at {relay.ws_url} for {CC}"
        assert relay.stored == []

        relay.release_hellos()
        await wait_until(lambda: service.health.snapshot()["ok"], "the exporter healthy once the hello is answered", 30)
        status, body = await healthz(service)
        assert status == 200 and "problems" not in body and body["relay"] is True, body
        await wait_until(lambda: len(relay.store_for(session)) >= 3, "the events that waited in the outbox", 30)
    # An expected start-up state: logged at INFO when it appears and clears, never as an error.
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if "connecting" in r.getMessage()]
    assert lines == [("INFO", f"{EXPORTER}: connecting: not yet connected to the relay at {relay.ws_url} for {CC}"),
                     ("INFO", f"{EXPORTER}: no longer connecting")]


@pytest.fixture
async def exporter(relay: RelayDouble) -> AsyncIterator[tuple[RelayExporter, Host]]:
    made = RelayExporter(CreateSettings(id="relay"), RelayConfig(
        endpoint=relay.ws_url, token=TOKEN, backoff_initial=0.02, backoff_max=0.1, hello_timeout=NEVER,
        instance="test/1"))
    host = Host()
    await made.start(host)
    try:
        yield made, host
    finally:
        await asyncio.wait_for(made.shutdown(), 10)


async def test_each_agent_connection_is_connecting_until_its_own_first_hello(
        relay: RelayDouble, exporter: tuple[RelayExporter, Host]) -> None:
    exp, host = exporter
    # No agent yet: no connection to make and nothing waiting, so nothing to report.
    assert host.health.snapshot()["ok"] is True

    relay.fault_hello("hold")  # the first hello (claude-code's) is held; the next is answered
    exp.open(CC)
    assert connecting(host.health) == f"not yet connected to the relay at {relay.ws_url} for {CC}"
    await wait_until(lambda: relay.hellos(CC), "claude-code's hello at the relay")
    exp.open("codex")
    assert connecting(host.health) == f"not yet connected to the relay at {relay.ws_url} for {CC}, codex"
    await wait_until(lambda: exp.links["codex"].live, "codex's connection")
    # codex is up, claude-code's events have still reached nothing: not healthy, and only it is named.
    assert connecting(host.health) == f"not yet connected to the relay at {relay.ws_url} for {CC}"
    assert host.health.snapshot()["ok"] is False and host.health.snapshot()["relay"] is True

    relay.release_hellos()
    await wait_until(lambda: host.health.snapshot()["ok"], "both connections up")

    # A connection lost later is not "connecting" again: the relay's restart shows as the relay flag.
    await relay.stop()
    await wait_until(lambda: not host.health.snapshot()["relay"], "both connections down")
    assert connecting(host.health) is None
