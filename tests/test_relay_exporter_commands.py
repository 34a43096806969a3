"""The relay exporter's inbound command queue is bounded; what it cannot take is answered ``busy``.

The collector runs whole (hook receiver, pipeline, real control router, relay exporter) against the
relay double on loopback. Its router is made slow the way a gateway's is: the session is held on
another collector (``ControlRouter.remote``), and that collector does not answer until the test
lets it. Commands the relay sends meanwhile queue up to ``command_queue``; each one more gets a
``control.rejected`` ``busy`` from the collector (AEP-0004 §3, §7), nothing is dropped unanswered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.exporters.relay import RelayConfig
from aep_collector.pipeline.model import Event

from tests.helpers import base_config, running
from tests.relay_double import RelayDouble, wait_until

TOKEN = "relay-token"
CC = "claude-code"
EXPORTER = "exporter/relay"
RESPOND = "control.attention.respond"
SESSION = "held-elsewhere"
QUEUE = 2


def command(n: int) -> dict[str, Any]:
    return {"aep": "0.1", "id": f"01JCMD{n:020d}", "type": RESPOND, "time": "2026-12-07T10:00:00.000Z",
            "source": "aep://ops/agent/operator", "agent": "operator", "session": SESSION, "subject": "01JREQ",
            "cause": "01JREQ", "capture": "metadata", "data": {"answer": {"option": "allow"}}}


def rejected(relay: RelayDouble) -> list[dict[str, Any]]:
    """Every ``control.rejected`` the collector sent, copies included, in arrival order."""
    return [e for e in relay.received if e.get("type") == "control.rejected" and e.get("session") == SESSION]


async def test_commands_past_the_queue_are_answered_busy_and_the_queued_ones_still_reach_the_router(
        relay: RelayDouble, tmp_path: Path) -> None:
    cfg = base_config(tmp_path, extra_exporters={"relay": {
        "endpoint": relay.ws_url, "token": TOKEN, "backoff_initial": 0.02, "backoff_max": 0.1,
        "command_queue": QUEUE}})
    async with running(cfg) as service:
        port = service.receivers["claude_code"].port
        hook = {"session_id": SESSION, "hook_event_name": "SessionStart", "source": "startup", "cwd": "/w"}
        async with aiohttp.ClientSession() as http, http.post(f"http://127.0.0.1:{port}/hook", json=hook) as r:
            assert r.status == 200
        await wait_until(lambda: relay.store_for(SESSION), "the session at the relay", 30)
        router = service.host.control
        assert router is not None

        gate = asyncio.Event()
        forwarded: list[str] = []

        async def edge(cmd: Event, agent: str) -> list[Event]:
            forwarded.append(cmd["id"])
            await gate.wait()  # the collector holding the session answers only when the test says
            return []

        router.remote(CC, SESSION, edge)
        relay.send(CC, command(0))
        await wait_until(lambda: forwarded == [command(0)["id"]], "the first command at the slow edge", 30)

        # The router is busy with command 0: 1 and 2 fill the queue, 3 to 5 find it full. A copy of
        # the queued command 1 is answered by 1's own decision, not by a second one.
        for n in (1, 2, 1, 3, 4, 5):
            assert relay.send(CC, command(n)) == 1
        busy = {command(n)["id"] for n in (3, 4, 5)}
        await wait_until(lambda: {e["cause"] for e in rejected(relay)} == busy, "a busy answer to 3, 4 and 5", 30)
        acks = rejected(relay)
        assert len(acks) == 3 and all(e["data"]["reason"] == "busy" and e["agent"] == CC for e in acks), acks
        snapshot = service.health.snapshot()
        assert "command-overflow" in snapshot["problems"][EXPORTER], snapshot
        assert service.health.counters[(EXPORTER, "commands-busy")] == 3

        # A retransmission of 4 while the queue is still full: the same ack again, not a second decision.
        relay.send(CC, command(4))
        await wait_until(lambda: len(rejected(relay)) == 4, "the re-sent busy ack", 30)
        again = rejected(relay)[-1]
        assert again == next(e for e in acks if e["cause"] == command(4)["id"])
        assert service.health.counters[(EXPORTER, "commands-busy")] == 3

        gate.set()  # the edge answers: the queued commands reach the router in order, none lost
        await wait_until(lambda: forwarded == [command(n)["id"] for n in (0, 1, 2)], "the queued commands", 30)

        # Once the queue has drained, busy is forgotten: a retry of 3 with the same id is decided afresh.
        relay.send(CC, command(3))
        await wait_until(lambda: forwarded[-1:] == [command(3)["id"]], "the retried command at the edge", 30)
        assert forwarded == [command(n)["id"] for n in (0, 1, 2, 3)]
        assert len(rejected(relay)) == 4


def test_command_queue_must_hold_at_least_one() -> None:
    assert RelayConfig().command_queue == 100
    with pytest.raises(ValueError, match="command_queue must be at least 1"):
        RelayConfig(command_queue=0).validate()
