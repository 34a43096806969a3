"""Nothing lost, nothing doubled, across NATS failures: a 3-node JetStream cluster losing its
stream leader mid-stream, and an edge collector killed with ``kill -9`` while NATS is down."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import nats

from tests.helpers import Collector, running
from tests.nats_support import NatsNode, cluster
from tests.relay_double import wait_until
from tests.test_nats_fleet import fleet, gateway, history, post
from tests.test_sending_queue_kill import otlp_body
from tests.test_sending_queue_kill import post as post_otlp

TOTAL = 20_000
PER_REQUEST = 1_000


def ids(root: Path) -> list[str]:
    return [e["id"] for e in history(root)]


async def stream_count(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info("AEP_EVENTS")).state.messages
    finally:
        await nc.close()


async def test_a_cluster_node_killed_mid_stream_every_event_arrives_once(tmp_path: Path) -> None:
    nodes = cluster(tmp_path)
    try:
        async with fleet(tmp_path, [n.url for n in nodes]) as (_watcher, a, b, gw):
            async def burst(start: int, n: int) -> None:
                for i in range(start, start + n):
                    for service, sid in ((a, "sa"), (b, "sb")):
                        status, _ = await post(service, {"session_id": sid, "hook_event_name": "UserPromptSubmit",
                                                         "prompt": f"step {i}"})
                        assert status == 200

            await burst(0, 60)
            nc = await nats.connect(nodes[0].url)
            leader = (await nc.jetstream().stream_info("AEP_EVENTS")).cluster.leader
            await nc.close()
            victim = next(n for n in nodes if n.name == leader)
            rest = [n for n in nodes if n is not victim]
            mid = asyncio.create_task(burst(60, 60))
            await asyncio.sleep(0.2)
            victim.kill()  # the stream leader, with publishes and fetches in flight
            await mid
            await burst(120, 30)
            accepted = ids(tmp_path / "a") + ids(tmp_path / "b")
            assert len(accepted) == len(set(accepted)) >= 2 * 150
            await wait_until(lambda: set(accepted) <= set(ids(tmp_path / "gw")),
                             "every accepted event at the gateway", 90)
            got = Counter(ids(tmp_path / "gw"))
            assert set(got) == set(accepted) and max(got.values()) == 1
            assert await stream_count(rest[0].url) == len(accepted)  # stored once per id, too
            assert gw.health.counters.get(("receiver/nats", "accepted")) == len(accepted)
    finally:
        for n in nodes:
            n.kill()


async def test_kill_9_of_an_edge_while_nats_is_down_then_restart_delivers_everything(tmp_path: Path) -> None:
    node = NatsNode(tmp_path)  # not started: NATS is down
    config: dict[str, Any] = {
        "receivers": {"otlp/vscode": {"profile": "vscode", "mode": "companion", "http": {"endpoint": "127.0.0.1:0"}}},
        "processors": {"mapping": None, "capture": None},
        "exporters": {"jsonl": {"directory": str(tmp_path / "edge" / "logs"), "fsync": "never"},
                      "nats": {"connection": {"servers": [node.url], "reconnect_wait": 0.2},
                               "collector": "edge-k", "publish_timeout": 2.0}},
        "service": {"state_dir": str(tmp_path / "edge" / "state"), "pipelines": {"p": {
            "receivers": ["otlp/vscode"], "processors": ["mapping", "capture"], "exporters": ["jsonl", "nats"]}}},
    }
    first = Collector(config, tmp_path).start()
    try:
        port = first.ports["receiver/otlp/vscode:http"]
        for i in range(TOTAL // PER_REQUEST):
            await asyncio.to_thread(post_otlp, port, otlp_body(f"s{i % 4}", i * PER_REQUEST, PER_REQUEST))
        accepted = ids(tmp_path / "edge")
        assert len(accepted) == TOTAL == len(set(accepted))
        os.kill(first.proc.pid, signal.SIGKILL)  # no drain: only what is on disk survives
        assert first.proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert sum(p.stat().st_size for p in (tmp_path / "edge" / "state" / "queue" / "nats").glob("*.seg")) > 0

    second = await asyncio.to_thread(Collector(config, tmp_path).start)  # restarts with NATS still down
    try:
        await asyncio.sleep(0.5)
        node.start()
        async with running(gateway(tmp_path / "gw", [node.url])) as gw:
            await wait_until(lambda: gw.health.counters.get(("receiver/nats", "accepted"), 0) >= TOTAL,
                             "every accepted event at the gateway", 90)
            got = Counter(ids(tmp_path / "gw"))
            assert set(got) == set(accepted) and max(got.values()) == 1
            assert await stream_count(node.url) == TOTAL
            by_id = {e["id"]: e for e in history(tmp_path / "edge")}
            assert all(json.dumps(by_id[e["id"]]) == json.dumps(e) for e in history(tmp_path / "gw"))
        assert await asyncio.to_thread(second.stop) == 0
    finally:
        if second.proc is not None and second.proc.poll() is None:
            second.proc.kill()
        node.kill()

