"""A fleet on NATS JetStream: two edge collectors, one gateway, real nats-server processes.

Edges: the Claude Code hook receiver, ``jsonl`` and the ``nats`` exporter. Gateway: the ``nats``
receiver, ``jsonl`` and the relay role (``relay_server``) the operators attach to. The official SDK (``aep_sdk``) is the
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
from aep_sdk.aio import open_duplex, subscribe
from aep_sdk.control import ControlSender

from tests.helpers import base_config, operator_console, read_jsonl, running
from tests.nats_support import NatsNode
from tests.relay_double import wait_until

TOKEN = "fleet-token"
CC = "claude-code"


def edge(root: Path, servers: list[str], name: str) -> dict[str, Any]:
    cfg = base_config(root, extra_exporters={"nats": {
        "connection": {"servers": servers, "reconnect_wait": 0.2}, "collector": name,
        "stream": {"replicas": 3 if len(servers) == 3 else 1}, "publish_timeout": 2.0}})
    cfg["receivers"]["claude_code"]["attention_timeout"] = 30.0
    return cfg


def gateway(root: Path, servers: list[str]) -> dict[str, Any]:
    return {
        "receivers": {"nats": {"connection": {"servers": servers, "reconnect_wait": 0.2},
                               "stream": {"replicas": 3 if len(servers) == 3 else 1}, "batch": 64}},
        "processors": {"capture": {"ceiling": "metadata"}},
        "exporters": {"jsonl": {"directory": str(root / "logs"), "fsync": "never"},
                      "relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN}},
        "service": {"state_dir": str(root / "state"), "pipelines": {"fleet": {
            "receivers": ["nats"], "processors": ["capture"], "exporters": ["jsonl", "relay_server"]}}},
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


class Operator:
    """What an operator attached to the gateway's relay role sees: every event, live."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: list[dict[str, Any]] = []
        self.nats_url = ""
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Operator:
        self._sub = await subscribe(self.url, from_="all", token=TOKEN)
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for event in self._sub:
            self.events.append(event)

    def of(self, session: str, type_: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("session") == session and type_ in (None, e["type"])]

    async def close(self) -> None:
        self._sub.close()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path, servers: list[str]):
    async with running(edge(tmp_path / "a", servers, "edge-a")) as a, \
            running(edge(tmp_path / "b", servers, "edge-b")) as b, \
            running(gateway(tmp_path / "gw", servers)) as gw:
        watcher = await Operator(gw.exporters["relay_server"].url).start()
        watcher.nats_url = servers[0]
        try:
            yield watcher, a, b, gw
        finally:
            await watcher.close()


def held_request(watcher: Operator, edge: Any, session: str) -> Any:
    def found() -> str | None:
        reqs = watcher.of(session, "attention.requested")
        return reqs[0]["id"] if reqs and edge.host.control.holds else None
    return found


async def held_permission(watcher: Operator, edge: Any, session: str, what: str) -> tuple[asyncio.Task[Any], str]:
    """``edge``'s hook asks a permission in ``session``: the pending hook call and, once edge holds
    the request and it is at the gateway (``what`` names that wait), the request's id."""
    hook = asyncio.create_task(post(edge, permission(session)))
    return hook, await wait_until(held_request(watcher, edge, session), what, 20)


async def answer_allow(operator: Any, session: str, rid: str) -> dict[str, Any]:
    """The operator answers held request ``rid`` of ``session`` allow: its ack (a nack raises)."""
    return await operator.send("control.attention.respond", session, subject=rid, data={"answer": {"option": "allow"}})


async def assert_a_held_permission_is_answered_allow(watcher: Operator, edge: Any, session: str, what: str) -> None:
    """``edge``'s hook asks a permission in ``session``; once edge holds it and it is at the gateway
    (``what`` names that wait), an operator console on the gateway answers it allow: the command is
    accepted, and the hook's reply is that allow."""
    hook, rid = await held_permission(watcher, edge, session, what)
    async with operator_console(watcher.url, TOKEN) as operator:
        ack = await answer_allow(operator, session, rid)
    assert ack["type"] == "control.accepted"
    assert (await asyncio.wait_for(hook, 10))[1]["hookSpecificOutput"]["decision"] == {"behavior": "allow"}


async def test_operator_on_the_gateway_sees_both_edges_and_answers_a_permission_held_on_edge_b(
        tmp_path: Path) -> None:
    node = NatsNode(tmp_path).start()
    try:
        async with fleet(tmp_path, [node.url]) as (watcher, a, b, gw):
            await post(a, {"session_id": "sa", "hook_event_name": "SessionStart", "source": "startup"})
            await post(b, {"session_id": "sb", "hook_event_name": "SessionStart", "source": "startup"})
            await wait_until(lambda: watcher.of("sa") and watcher.of("sb"),
                             "both edges' sessions at the gateway's relay", 20)
            async with operator_console(watcher.url, TOKEN) as operator:
                roster = await operator.roster()
                assert {"sa", "sb"} <= {r["session"] for r in roster}

                hook, rid = await held_permission(watcher, b, "sb", "edge B's request at the gateway, held")
                req = next(e for e in watcher.of("sb") if e["id"] == rid)
                assert req["data"]["respond_via"] == ["control"]
                ack = await answer_allow(operator, "sb", rid)
                status, reply = await asyncio.wait_for(hook, 10)
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
        async with fleet(tmp_path, [node.url]) as (watcher, _a, b, gw):
            await post(b, {"session_id": "sb", "hook_event_name": "SessionStart", "source": "startup"})
            await wait_until(lambda: watcher.of("sb"), "edge B's session at the relay", 20)
            hook, rid = await held_permission(watcher, b, "sb", "the held request at the gateway")
            duplex = await open_duplex(watcher.url, token=TOKEN)
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
        async with fleet(tmp_path, [node.url]) as (watcher, _a, b, gw):
            await post(b, {"session_id": "sb", "hook_event_name": "SessionStart", "source": "startup"})
            await wait_until(lambda: watcher.of("sb"), "edge B's session at the relay", 20)
            await wait_until(lambda: gw.host.control.accepts(CC), "the gateway to learn what edge B accepts")
            exporter = b.exporters["nats"]
            await exporter._sub.unsubscribe()  # edge B stops answering its control subject
            async with operator_console(watcher.url, TOKEN) as operator:
                from aep_sdk.control import NackError

                with pytest.raises(NackError) as err:
                    await answer_allow(operator, "sb", "01JNOSUCH")
                assert err.value.reason == "busy"
                exporter._sub = await exporter.link.nc.subscribe(exporter.control_subject,
                                                                 cb=exporter._on_command)
                await until_answering(watcher, exporter.control_subject)
                with pytest.raises(NackError) as err:
                    await answer_allow(operator, "sb", "01JNOSUCH")
                assert err.value.reason == "refused"  # edge B decided: no such pending request
    finally:
        node.kill()


async def test_a_session_two_live_edges_claim_is_refused_ambiguous_and_reaches_neither(tmp_path: Path) -> None:
    """AEP-0004 §4: more than one live claimant of a session is ``ambiguous``; never guess, never both."""
    from aep_sdk.control import NackError

    node = NatsNode(tmp_path).start()
    try:
        async with fleet(tmp_path, [node.url]) as (watcher, a, b, gw):
            for edge_ in (a, b):
                await post(edge_, {"session_id": "sx", "hook_event_name": "SessionStart", "source": "startup"})
            await wait_until(lambda: len(watcher.of("sx", "session.started")) == 2,
                             "both edges' session sx at the gateway", 20)
            hook, rid = await held_permission(watcher, b, "sx", "edge B's request at the gateway, held")
            async with operator_console(watcher.url, TOKEN) as operator:
                with pytest.raises(NackError) as err:
                    await answer_allow(operator, "sx", rid)
            assert str(err.value.detail).startswith("ambiguous: 2 emitters claim session 'sx'")  # the wire's code
            assert b.host.control.holds and not hook.done()  # edge B still holds its request
            for root in ("a", "b", "gw"):
                assert not [e for e in history(tmp_path / root) if e["type"].startswith("control.")], root
            hook.cancel()
            with contextlib.suppress(BaseException):
                await hook
    finally:
        node.kill()


async def test_a_session_an_edge_that_is_gone_claimed_goes_to_the_edge_now_holding_it(tmp_path: Path) -> None:
    """A claimant whose collector no longer answers its control subject is no live claimant."""
    node = NatsNode(tmp_path).start()
    try:
        async with running(gateway(tmp_path / "gw", [node.url])) as gw:
            watcher = await Operator(gw.exporters["relay_server"].url).start()
            try:
                async with running(edge(tmp_path / "a", [node.url], "edge-a")) as a:
                    await post(a, {"session_id": "sx", "hook_event_name": "SessionStart", "source": "startup"})
                    await wait_until(lambda: watcher.of("sx"), "edge A's session at the gateway", 20)
                async with running(edge(tmp_path / "b", [node.url], "edge-b")) as b:
                    await post(b, {"session_id": "sx", "hook_event_name": "SessionStart", "source": "resume"})
                    await wait_until(lambda: len(watcher.of("sx", "session.started")) == 2,
                                     "edge B's session at the gateway (edge B connected)", 20)
                    await wait_until(lambda: gw.host.control.claimants(CC, "sx") == ["aep.control.edge-b"],
                                     "edge A, gone, no longer claiming sx", 20)
                    await assert_a_held_permission_is_answered_allow(watcher, b, "sx",
                                                                     "edge B's request at the gateway")
            finally:
                await watcher.close()
    finally:
        node.kill()


async def test_a_session_ended_on_one_live_edge_and_resumed_on_another_goes_to_the_other(tmp_path: Path) -> None:
    """Edge A ended the session before edge B took it up (resumed there): A holds nothing of it."""
    node = NatsNode(tmp_path).start()
    try:
        async with fleet(tmp_path, [node.url]) as (watcher, a, b, gw):
            await post(a, {"session_id": "sx", "hook_event_name": "SessionStart", "source": "startup"})
            await post(a, {"session_id": "sx", "hook_event_name": "SessionEnd", "reason": "exit"})
            await wait_until(lambda: watcher.of("sx", "session.ended"), "edge A's end of sx at the gateway", 20)
            await post(b, {"session_id": "sx", "hook_event_name": "SessionStart", "source": "resume"})
            await wait_until(lambda: len(watcher.of("sx", "session.started")) == 2, "edge B's sx at the gateway", 20)
            await assert_a_held_permission_is_answered_allow(watcher, b, "sx", "edge B's request, held")
            assert not [e for e in history(tmp_path / "a") if e["type"].startswith("control.")]
    finally:
        node.kill()


async def test_a_second_edge_with_a_collector_name_in_use_serves_no_commands_and_says_so(tmp_path: Path) -> None:
    """Two hosts with one hostname and one state_dir path get one default name: a command sent to
    that control subject would reach both collectors' routers, two decisions for one command."""
    node = NatsNode(tmp_path).start()
    try:
        async with running(edge(tmp_path / "a", [node.url], "edge-x")) as a, \
                running(gateway(tmp_path / "gw", [node.url])) as gw:
            watcher = await Operator(gw.exporters["relay_server"].url).start()
            watcher.nats_url = node.url
            try:
                await until_answering(watcher, "aep.control.edge-x")
                async with running(edge(tmp_path / "b", [node.url], "edge-x")) as b:
                    problem = await wait_until(lambda: b.host.health.snapshot().get("problems", {})
                                               .get("exporter/nats", {}).get("control-subject-taken"),
                                               "edge B to say its control subject is taken", 20)
                    assert "aep.control.edge-x" in problem and "collector" in problem
                    await post(b, {"session_id": "sb", "hook_event_name": "SessionStart", "source": "startup"})
                    await post(a, {"session_id": "sa", "hook_event_name": "SessionStart", "source": "startup"})
                    await wait_until(lambda: watcher.of("sa") and watcher.of("sb"), "both sessions at the gateway", 20)
                    await assert_a_held_permission_is_answered_allow(watcher, a, "sa", "edge A's request, held")
                    assert not [e for e in history(tmp_path / "b") if e["type"].startswith("control.")]
            finally:
                await watcher.close()
    finally:
        node.kill()


async def until_answering(watcher: Operator, subject: str) -> None:
    """Until a probe request to ``subject`` finds a responder (edge B is back on its subject)."""
    import nats
    from nats.errors import NoRespondersError

    nc = await nats.connect(watcher.nats_url)
    try:
        for _ in range(200):
            try:
                await nc.request(subject, b"{}", timeout=2, headers={"Aep-Agent": "probe"})
                return
            except NoRespondersError:
                await asyncio.sleep(0.02)
        raise AssertionError(f"nothing answers on {subject}")
    finally:
        await nc.close()


def test_the_readme_fleet_configs_are_valid(tmp_path: Path) -> None:
    import re

    import yaml
    from aep_collector.pipeline.config import parse
    from aep_collector.pipeline.registry import build_registry

    from tests.helpers import ROOT

    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Fleet on NATS JetStream", 1)[1]
    blocks = re.findall(r"```yaml\n(.*?)```", section.split("\n## ", 1)[0], re.S)

    import subprocess

    def load(text: str) -> Any:  # the named files exist here (the config checks they do; TLS loads a CA)
        def local(m: re.Match[str]) -> str:
            path = tmp_path / m.group(2)
            if m.group(1).startswith("tls_ca"):
                subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                                str(tmp_path / "ca.key"), "-out", str(path), "-days", "1", "-subj", "/CN=nats-ca"],
                               check=True, capture_output=True)
            else:
                path.write_text("x")
            return f"{m.group(1)}{path}"
        return yaml.safe_load(re.sub(r"((?:creds|tls_ca): )[^\s,}]*/([^\s,}]+)", local, text))

    registry, _ = build_registry(load_plugins=False)
    edge_doc, gateway_doc = load(blocks[0]), load(blocks[1])
    edge_doc.update({"receivers": {"claude_code": None}, "processors": {"mapping": None},
                     "service": {"pipelines": {"a": {"receivers": ["claude_code"], "processors": ["mapping"],
                                                     "exporters": ["nats"]}}}})
    exporter = parse(edge_doc, registry, "README.md").exporters["nats"][1]
    assert exporter.stream.replicas == 3 and exporter.connection.creds.endswith("edge.creds")
    assert exporter.connection.tls_ca.endswith("nats-ca.pem")
    receiver = parse(gateway_doc, registry, "README.md", env={"AEP_TOKEN": "t0ken-for-the-gateway"}).receivers["nats"][1]
    assert receiver.connection.creds.endswith("gateway.creds") and receiver.durable == "aep-gateway"
