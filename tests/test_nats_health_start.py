"""``/healthz`` of a NATS component before its first connection: never ok until it is up.

A host that accepts TCP and never speaks (a local server that never sends NATS's INFO) holds the
client's first attempt for ``connect_timeout``, as a host that drops packets does. Until then
nothing has reached NATS, so a deployment check polling ``/healthz`` right after start must not
read ok; events taken in meanwhile wait in the edge's sending queue and all arrive once NATS is up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
from nats.js.errors import NotFoundError

from tests.helpers import running
from tests.nats_support import NatsNode
from tests.relay_double import wait_until
from tests.test_nats_fleet import edge, gateway, history, post

EXPORTER = "exporter/nats"
RECEIVER = "receiver/nats"
NEVER = 600.0
"""connect_timeout: the first attempt against the silent host never ends by itself in a test."""


class Silent:
    """A TCP server on 127.0.0.1 that accepts and never writes a byte."""

    def __init__(self) -> None:
        self.accepted: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> Silent:
        self.server = await asyncio.start_server(self._hold, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted.append(writer)
        await reader.read()  # until the client hangs up; never answers

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for writer in self.accepted:
            writer.transport.abort()


@contextlib.asynccontextmanager
async def silent_then_nats(tmp_path: Path) -> AsyncIterator[tuple[Silent, NatsNode]]:
    """A silent host on a port a real nats-server takes over later (``Silent.close`` then ``node.start``)."""
    silent = await Silent().start()
    node = NatsNode(tmp_path)
    node.port = silent.port
    try:
        yield silent, node
    finally:
        await silent.close()
        node.kill()


async def healthz(service: Any) -> tuple[int, dict[str, Any]]:
    port = service.receivers["claude_code"].port
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz") as r:
        return r.status, await r.json()


async def stored_ids(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info("AEP_EVENTS")
        except NotFoundError:  # the stream is created by the edge's first delivery
            return []
        return [(await js.get_msg("AEP_EVENTS", seq)).headers["Nats-Msg-Id"]
                for seq in range(info.state.first_seq, info.state.last_seq + 1)] if info.state.messages else []
    finally:
        await nc.close()


async def test_an_edge_whose_first_connect_is_in_flight_is_not_healthy_and_loses_nothing(tmp_path: Path) -> None:
    async with silent_then_nats(tmp_path) as (silent, node):
        cfg = edge(tmp_path / "edge", [node.url], "edge-s")
        cfg["exporters"]["nats"]["connection"]["connect_timeout"] = NEVER
        async with running(cfg) as service:
            await wait_until(lambda: silent.accepted, "the client's first attempt to reach the silent host", 30)
            status, body = await healthz(service)
            assert status == 503 and body["ok"] is False, body
            assert "not yet connected to NATS" in body["problems"][EXPORTER]["connecting"]

            # Hooks are answered meanwhile; what they produce waits in the sending queue on disk.
            for i in range(5):
                status, _ = await post(service, {"session_id": "s1", "hook_event_name": "UserPromptSubmit",
                                                 "prompt": f"step {i}"})
                assert status == 200
            assert (await healthz(service))[0] == 503

            await silent.close()  # the attempt fails; the client retries until NATS listens there
            await asyncio.to_thread(node.start)
            await wait_until(lambda: service.health.snapshot()["ok"], "the edge to be healthy once connected", 60)
            status, body = await healthz(service)
            assert status == 200 and "problems" not in body, body
            accepted = [e["id"] for e in history(tmp_path / "edge")]
            assert len(accepted) >= 5
            deadline = asyncio.get_running_loop().time() + 60
            while not set(accepted) <= set(got := await stored_ids(node.url)):
                assert asyncio.get_running_loop().time() < deadline, f"stored {len(got)} of {len(accepted)}"
                await asyncio.sleep(0.1)
            assert len(got) == len(set(got)), "an event stored twice"


async def test_a_gateway_whose_first_connect_is_in_flight_is_not_healthy_until_it_connects(tmp_path: Path) -> None:
    async with silent_then_nats(tmp_path) as (silent, node):
        cfg = gateway(tmp_path / "gw", [node.url])
        cfg["receivers"]["nats"]["connection"]["connect_timeout"] = NEVER
        async with running(cfg) as gw:
            await wait_until(lambda: silent.accepted, "the client's first attempt to reach the silent host", 30)
            snapshot = gw.health.snapshot()
            assert snapshot["ok"] is False
            assert "not yet connected to NATS" in snapshot["problems"][RECEIVER]["connecting"]

            await silent.close()
            await asyncio.to_thread(node.start)
            await wait_until(lambda: gw.health.snapshot()["ok"], "the gateway to be healthy once connected", 60)


async def test_a_normal_start_against_a_reachable_server_leaves_no_connecting_behind(tmp_path: Path) -> None:
    node = NatsNode(tmp_path).start()
    try:
        async with running(edge(tmp_path / "edge", [node.url], "edge-n")) as service, \
                running(gateway(tmp_path / "gw", [node.url])) as gw:
            await wait_until(lambda: service.exporters["nats"].link.ready.is_set()
                             and gw.receivers["nats"].link.ready.is_set(), "both links up", 30)
            await wait_until(lambda: service.health.snapshot()["ok"] and gw.health.snapshot()["ok"],
                             "edge and gateway healthy", 30)
            status, body = await post(service, {"session_id": "s1", "hook_event_name": "UserPromptSubmit",
                                                "prompt": "hello"})
            assert status == 200
            await wait_until(lambda: gw.health.counters.get((RECEIVER, "accepted"), 0) >= 1,
                             "the event at the gateway", 30)
            for health in (service.health, gw.health):
                assert all("connecting" not in causes for causes in health.problems.values()), health.problems
            status, body = await healthz(service)
            assert status == 200 and body["ok"] is True, body
    finally:
        node.kill()
