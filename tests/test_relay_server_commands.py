"""The relay role's inbound commands are bounded; what finds the bound reached is answered ``busy``.

The collector runs whole (hook receiver, pipeline, real control router, relay role) on loopback, and
a WebSocket consumer sends commands. The router is made slow the way a gateway's is: the session is
held on another collector (``ControlRouter.remote``) that does not answer until the test lets it.
Up to ``command_queue`` commands wait for the router; each one more gets a ``control.rejected``
``busy`` from the collector at once (AEP-0004 §3, §7), nothing is dropped unanswered.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.exporters.relay_server import RelayServerConfig
from aep_collector.pipeline.model import Event

from tests.helpers import running
from tests.relay_double import wait_until
from tests.test_relay_exporter_commands import CC, QUEUE, SESSION, command
from tests.test_relay_server import TOKEN, config

EXPORTER = "exporter/relay_server"


class SlowEdge:
    """The collector holding the session: records each command forwarded to it, answers once opened."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.forwarded: list[str] = []

    async def __call__(self, cmd: Event, agent: str) -> list[Event]:
        self.forwarded.append(cmd["id"])
        await self.opened.wait()
        return []


async def test_commands_past_the_bound_are_answered_busy_and_the_waiting_ones_still_reach_the_router(
        tmp_path: Path) -> None:
    async with running(config(tmp_path, command_queue=QUEUE)) as service:
        role = service.exporters["relay_server"]
        port = service.receivers["claude_code"].port
        hook = {"session_id": SESSION, "hook_event_name": "SessionStart", "source": "startup", "cwd": "/w"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{port}/hook", json=hook) as r:
                assert r.status == 200
            await wait_until(lambda: role.owners_of(SESSION) == [CC], "the session owned by the role", 30)
            edge = SlowEdge()
            forwarded = edge.forwarded
            service.host.control.remote(CC, SESSION, edge)
            ws = await http.ws_connect(f"{role.url}/socket", headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer",
                                "identity": {"agent": "operator"}})
            assert (await ws.receive_json(timeout=5))["type"] == "hello"
            await ws.send_json({"type": "subscribe", "id": "acks", "filter": {"session": SESSION}})
            rejected: list[dict[str, Any]] = []

            async def read() -> None:
                async for msg in ws:
                    frame = json.loads(msg.data)
                    if frame.get("type") == "control.rejected":
                        rejected.append(frame)

            reader = asyncio.create_task(read())
            try:
                for n in (0, 1):  # both wait at the slow edge: the bound is reached
                    await ws.send_str(json.dumps(command(n)))
                await wait_until(lambda: forwarded == [command(0)["id"], command(1)["id"]], "0 and 1 at the edge", 30)

                # 2 to 4 find the bound reached. A copy of the waiting command 1 is answered by 1's own
                # decision, not by a second one.
                for n in (1, 2, 3, 4):
                    await ws.send_str(json.dumps(command(n)))
                busy = {command(n)["id"] for n in (2, 3, 4)}
                await wait_until(lambda: {e["cause"] for e in rejected} == busy, "a busy answer to 2, 3 and 4", 30)
                assert len(rejected) == 3
                assert all(e["data"]["reason"] == "busy" and e["agent"] == CC for e in rejected), rejected
                snapshot = service.health.snapshot()
                assert "command-overflow" in snapshot["problems"][EXPORTER], snapshot
                assert service.health.counters[(EXPORTER, "commands-busy")] == 3

                # A retransmission of 3 while the bound is still reached: the same ack, no second decision.
                await ws.send_str(json.dumps(command(3)))
                await wait_until(lambda: len(rejected) == 4, "the re-sent busy ack", 30)
                assert rejected[-1] == next(e for e in rejected if e["cause"] == command(3)["id"])
                assert service.health.counters[(EXPORTER, "commands-busy")] == 3

                edge.opened.set()  # the edge answers: the waiting commands are decided, none lost
                await wait_until(lambda: not role._tasks, "the waiting commands decided", 30)

                # Once nothing waits, busy is forgotten: a retry of 2 with the same id is decided afresh.
                await ws.send_str(json.dumps(command(2)))
                await wait_until(lambda: forwarded[-1:] == [command(2)["id"]], "the retried command at the edge", 30)
                assert forwarded == [command(n)["id"] for n in (0, 1, 2)]
                assert len(rejected) == 4
            finally:
                reader.cancel()
                await ws.close()


def test_command_queue_must_hold_at_least_one() -> None:
    assert RelayServerConfig().command_queue == 100
    with pytest.raises(ValueError, match="command_queue must be at least 1"):
        RelayServerConfig(command_queue=0).validate()
