"""A fleet on NATS JetStream: two edge collectors, one gateway, real nats-server processes.

Edges: the Claude Code hook receiver, ``jsonl`` and the ``nats`` exporter. Gateway: the ``nats``
receiver, ``jsonl`` and the relay the operators attach to. The official SDK (``aep_sdk``) is the
operator: it sees both edges' sessions and answers a permission held on edge B.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_sdk.aio import ControlClient, open_duplex, subscribe
from aep_sdk.control import ControlSender

from tests.helpers import base_config, read_jsonl, running
from tests.nats_support import NatsNode
from tests.relay_double import RelayDouble, wait_until

TOKEN = "fleet-token"
CC = "claude-code"


def edge(root: Path, servers: list[str], name: str) -> dict[str, Any]:
    cfg = base_config(root, extra_exporters={"nats": {
        "connection": {"servers": servers, "reconnect_wait": 0.2}, "collector": name,
        "stream": {"replicas": 3 if len(servers) == 3 else 1}, "publish_timeout": 2.0}})
    cfg["receivers"]["claude_code"]["attention_timeout"] = 30.0
    return cfg


def gateway(root: Path, servers: list[str], relay_url: str) -> dict[str, Any]:
    return {
        "receivers": {"nats": {"connection": {"servers": servers, "reconnect_wait": 0.2},
                               "stream": {"replicas": 3 if len(servers) == 3 else 1}, "batch": 64}},
        "processors": {"capture": {"ceiling": "metadata"}},
        "exporters": {"jsonl": {"directory": str(root / "logs"), "fsync": "never"},
                      "relay": {"endpoint": relay_url, "token": TOKEN, "backoff_initial": 0.05,
                                "backoff_max": 0.2}},
        "service": {"state_dir": str(root / "state"), "pipelines": {"fleet": {
            "receivers": ["nats"], "processors": ["capture"], "exporters": ["jsonl", "relay"]}}},
    }


async def post(service: Any, body: dict[str, Any]) -> tuple[int, Any]:
    port = service.receivers["claude_code"].port
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/hook", json=body) as r:
        return r.status, await r.json()


def history(root: Path) -> list[dict[str, Any]]:
    return [e for f in sorted((root / "logs").rglob("*.jsonl")) for e in read_jsonl(f)]


def permission(sid: str) -> dict[str, Any]:
    return {"session_id": sid, "hook_event_name": "PermissionRequest", "tool_name": "Bash",
            "tool_input": {"command": "make deploy"}, "tool_use_id": "toolu_b1"}


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path, servers: list[str]):
    relay = RelayDouble(token=TOKEN)
    await relay.start()
    try:
        async with running(edge(tmp_path / "a", servers, "edge-a")) as a, \
                running(edge(tmp_path / "b", servers, "edge-b")) as b, \
                running(gateway(tmp_path / "gw", servers, relay.ws_url)) as gw:
            yield relay, a, b, gw
    finally:
        await relay.stop()


async def test_operator_on_the_gateway_sees_both_edges_and_answers_a_permission_held_on_edge_b(
        tmp_path: Path) -> None:
    node = NatsNode(tmp_path).start()
    try:
        async with fleet(tmp_path, [node.url]) as (relay, a, b, gw):
            await post(a, {"session_id": "sa", "hook_event_name": "SessionStart", "source": "startup"})
            await post(b, {"session_id": "sb", "hook_event_name": "SessionStart", "source": "startup"})
            await wait_until(lambda: relay.store_for("sa") and relay.store_for("sb"),
                             "both edges' sessions at the gateway's relay", 20)
            operator = ControlClient(relay.url, agent="aep-console", host="ops-host", token=TOKEN)
            await operator.connect()
            try:
                roster = await operator.roster()
                assert {"sa", "sb"} <= {r["session"] for r in roster}
                sub = await subscribe(relay.url, from_="all", live=False, token=TOKEN)
                seen = [e async for e in sub]
                assert {e["session"] for e in seen if e.get("session")} >= {"sa", "sb"}

                hook = asyncio.create_task(post(b, permission("sb")))

                def held() -> str | None:
                    reqs = [e for e in relay.store_for("sb") if e["type"] == "attention.requested"]
                    return reqs[0]["id"] if reqs and b.host.control.holds else None

                rid = await wait_until(held, "edge B's permission request at the gateway, held", 20)
                req = next(e for e in relay.store_for("sb") if e["id"] == rid)
                assert req["data"]["respond_via"] == ["control"]
                ack = await operator.send("control.attention.respond", "sb", subject=rid,
                                          data={"answer": {"option": "allow"}})
                status, reply = await asyncio.wait_for(hook, 10)
            finally:
                await operator.close()
            assert ack["type"] == "control.accepted" and status == 200
            assert reply["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
            edge_b = history(tmp_path / "b")
            assert [e["id"] for e in edge_b if e["type"] == "control.accepted"] == [ack["id"]]
            assert not a.host.control.holds  # edge A never saw the command
            want = {e["id"] for e in history(tmp_path / "a") + edge_b}
            await wait_until(lambda: want <= {e["id"] for e in history(tmp_path / "gw")},
                             "every edge event in the gateway's history", 20)
            counts = Counter(e["id"] for e in history(tmp_path / "gw"))
            assert max(counts.values()) == 1
            by_id = {e["id"]: e for e in history(tmp_path / "a") + edge_b}
            assert all(by_id[e["id"]] == e for e in history(tmp_path / "gw"))  # unchanged on the way
    finally:
        node.kill()


async def test_a_retransmitted_command_gets_the_byte_identical_ack_end_to_end(tmp_path: Path) -> None:
    node = NatsNode(tmp_path).start()
    try:
        async with fleet(tmp_path, [node.url]) as (relay, _a, b, _gw):
            await post(b, {"session_id": "sb", "hook_event_name": "SessionStart", "source": "startup"})
            await wait_until(lambda: relay.store_for("sb"), "edge B's session at the relay", 20)
            hook = asyncio.create_task(post(b, permission("sb")))

            def held() -> str | None:
                reqs = [e for e in relay.store_for("sb") if e["type"] == "attention.requested"]
                return reqs[0]["id"] if reqs and b.host.control.holds else None

            rid = await wait_until(held, "the held request at the relay", 20)
            duplex = await open_duplex(relay.url, token=TOKEN)
            await duplex.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer",
                                    "identity": {"agent": "aep-console"}, "capabilities": {}})
            assert (await duplex.recv_json())["type"] == "hello"
            await duplex.send_json({"type": "subscribe", "id": "s", "filter": {"session": "sb"}})
            cmd = ControlSender(lambda _c: None, agent="aep-console", host="ops").build(
                "control.attention.respond", "sb", subject=rid, data={"answer": {"option": "deny"}})
            acks: list[dict[str, Any]] = []

            async def read_acks(n: int) -> None:
                while len(acks) < n:
                    frame = await duplex.recv_json()
                    if frame and frame.get("type") in ("control.accepted", "control.rejected") \
                            and frame.get("cause") == cmd["id"]:
                        acks.append(frame)

            await duplex.send_json(cmd)
            await asyncio.wait_for(read_acks(1), 10)
            await duplex.send_json(cmd)
            await asyncio.wait_for(read_acks(2), 10)
            with pytest.raises(TimeoutError):  # and no third copy (the stream's is deduped)
                await asyncio.wait_for(read_acks(3), 1.0)
            await duplex.close()
            assert json.dumps(acks[0], sort_keys=True) == json.dumps(acks[1], sort_keys=True)
            assert (await asyncio.wait_for(hook, 10))[1]["hookSpecificOutput"]["decision"]["behavior"] == "deny"
            assert [e["type"] for e in history(tmp_path / "b")].count("control.accepted") == 1
            await wait_until(lambda: [e["id"] for e in history(tmp_path / "gw")
                                      if e["type"] == "control.accepted"] == [acks[0]["id"]],
                             "the ack recorded once at the gateway", 10)
    finally:
        node.kill()


async def test_an_unreachable_edge_is_nacked_busy_and_a_retry_reaches_it_when_back(tmp_path: Path) -> None:
    node = NatsNode(tmp_path).start()
    try:
        async with fleet(tmp_path, [node.url]) as (relay, _a, b, gw):
            await post(b, {"session_id": "sb", "hook_event_name": "SessionStart", "source": "startup"})
            await wait_until(lambda: relay.store_for("sb"), "edge B's session at the relay", 20)
            await wait_until(lambda: gw.host.control.accepts(CC), "the gateway to learn what edge B accepts")
            exporter = b.exporters["nats"]
            await exporter._sub.unsubscribe()  # edge B stops answering its control subject
            operator = ControlClient(relay.url, agent="aep-console", host="ops-host", token=TOKEN)
            await operator.connect()
            try:
                from aep_sdk.control import NackError

                with pytest.raises(NackError) as err:
                    await operator.send("control.attention.respond", "sb", subject="01JNOSUCH",
                                        data={"answer": {"option": "allow"}})
                assert err.value.reason == "busy"
                exporter._sub = await exporter.link.nc.subscribe(exporter.control_subject,
                                                                 cb=exporter._on_command)
                with pytest.raises(NackError) as err:
                    await operator.send("control.attention.respond", "sb", subject="01JNOSUCH",
                                        data={"answer": {"option": "allow"}})
                assert err.value.reason == "refused"  # edge B decided: no such pending request
            finally:
                await operator.close()
    finally:
        node.kill()


def test_the_readme_fleet_configs_are_valid(tmp_path: Path) -> None:
    import re

    import yaml

    from pipeline.config import parse
    from pipeline.registry import build_registry
    from tests.helpers import ROOT

    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Fleet on NATS JetStream", 1)[1]
    blocks = re.findall(r"```yaml\n(.*?)```", section.split("\n## ", 1)[0], re.S)

    def load(text: str) -> Any:  # the named files exist here (the config checks they do)
        def local(m: re.Match[str]) -> str:
            (tmp_path / m.group(2)).write_text("x")
            return f"{m.group(1)}{tmp_path / m.group(2)}"
        return yaml.safe_load(re.sub(r"((?:creds|tls_ca): )[^\s,}]*/([^\s,}]+)", local, text))

    registry, _ = build_registry(load_plugins=False)
    edge_doc, gateway_doc = load(blocks[0]), load(blocks[1])
    edge_doc.update({"receivers": {"claude_code": None}, "processors": {"mapping": None},
                     "service": {"pipelines": {"a": {"receivers": ["claude_code"], "processors": ["mapping"],
                                                     "exporters": ["nats"]}}}})
    exporter = parse(edge_doc, registry, "README.md").exporters["nats"][1]
    assert exporter.stream.replicas == 3 and exporter.connection.creds.endswith("edge.creds")
    assert exporter.connection.tls_ca.endswith("nats-ca.pem")
    receiver = parse(gateway_doc, registry, "README.md", env={"AEP_TOKEN": "t"}).receivers["nats"][1]
    assert receiver.connection.creds.endswith("gateway.creds") and receiver.durable == "aep-gateway"
