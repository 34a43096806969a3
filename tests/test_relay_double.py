"""The relay double against the official SDK and raw clients: the behaviour the relay tests rely on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.pipeline.envelope import Stamper
from aep_sdk.aio import ControlClient, subscribe
from aep_sdk.control import NackError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import corpus
from tests.relay_double import RelayDouble, filter_problem, matches, wait_until

TOKEN = "double-token"
RESPOND = "control.attention.respond"
ATTR_MATCH = corpus("attr-match/cases.json")
assert isinstance(ATTR_MATCH, dict)


@pytest.mark.parametrize("case", ATTR_MATCH["match"], ids=[c["name"] for c in ATTR_MATCH["match"]])
def test_attr_match_corpus_matching(case: dict[str, Any]) -> None:
    assert filter_problem(case["filter"]) is None
    assert matches(case["filter"], case["event"]) is case["match"]


@pytest.mark.parametrize("case", ATTR_MATCH["invalid"], ids=[c["name"] for c in ATTR_MATCH["invalid"]])
def test_attr_match_corpus_invalid_filters_fail_closed(case: dict[str, Any]) -> None:
    assert filter_problem(case["filter"]) is not None


@pytest.fixture
def stamper(tmp_path: Path) -> Stamper:
    return Stamper(tmp_path / "state", host="test-host")


def make(stamper: Stamper, session: str | None, type: str = "progress.status", agent: str = "claude-code",
         **extra: Any) -> dict[str, Any]:
    return stamper.stamp({"type": type, "agent": agent, "session": session, "data": {}, **extra})


def line(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


class Peer:
    """A hand-driven WebSocket client of the double."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, relay: RelayDouble, token: str | None = TOKEN) -> Peer:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return cls(await connect(relay.ws_url, additional_headers=headers, proxy=None))

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self) -> dict[str, Any]:
        frame = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
        assert isinstance(frame, dict)
        return frame

    async def recv_raw(self) -> str:
        text = await asyncio.wait_for(self.ws.recv(), 10)
        assert isinstance(text, str)
        return text

    async def hello(self, agent: str, role: str = "emitter", **caps: Any) -> dict[str, Any]:
        await self.send({"type": "hello", "versions": ["0.1"], "role": role,
                         "identity": {"agent": agent, "instance": f"{agent}/1"}, "capabilities": caps})
        reply = await self.recv()
        assert reply["type"] == "hello", reply
        return reply

    async def closed_with(self) -> int | None:
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(self.ws.recv(), 10)
        return self.ws.close_code


async def post(relay: RelayDouble, body: str, ctype: str = "application/x-ndjson",
               version: str | None = "0.1") -> tuple[int, Any]:
    headers = {"content-type": ctype, "authorization": f"Bearer {TOKEN}"}
    if version is not None:
        headers["AEP-Version"] = version
    async with aiohttp.ClientSession() as http, http.post(f"{relay.url}/events", data=body,
                                                          headers=headers) as resp:
        text = await resp.text()
        return resp.status, json.loads(text) if text else None


async def test_discovery_is_served_at_both_paths(relay: RelayDouble) -> None:
    async with aiohttp.ClientSession() as http:
        docs = []
        for path in ("/events", "/.well-known/aep"):
            async with http.get(relay.url + path) as resp:
                assert resp.status == 200 and resp.content_type == "application/json"
                docs.append(await resp.json())
    assert docs[0] == docs[1]
    assert "0.1" in docs[0]["aep"]
    assert docs[0]["endpoints"] == {"events": "/events", "stream": "/stream", "socket": "/socket"}
    assert docs[0]["capabilities"]["roster"] == {}


async def test_sdk_sse_subscriber_gets_its_session_in_order(relay: RelayDouble, stamper: Stamper) -> None:
    sub = await subscribe(relay.url, filter={"session": "s1"}, token=TOKEN)
    try:
        await wait_until(lambda: relay.subscriber_count == 1, "the SSE subscription to register")
        batch = [make(stamper, "s1", "session.started"), make(stamper, "s2"), make(stamper, "s1")]
        status, _ = await post(relay, "\n".join(map(line, batch)) + "\n")
        assert status == 202
        got = [await asyncio.wait_for(anext(sub), 10) for _ in range(2)]
        assert [e["id"] for e in got] == [batch[0]["id"], batch[2]["id"]]
        assert got == [batch[0], batch[2]]
    finally:
        sub.close()


async def test_sdk_replay_all_without_live_ends_at_replay_complete(relay: RelayDouble, stamper: Stamper) -> None:
    batch = [make(stamper, "s1"), make(stamper, "s1"), make(stamper, "s2")]
    assert (await post(relay, "\n".join(map(line, batch))))[0] == 202
    comments: list[str] = []
    sub = await subscribe(relay.url, from_="all", live=False, token=TOKEN, on_comment=comments.append)
    got = [e async for e in sub]
    assert sorted(e["id"] for e in got) == sorted(e["id"] for e in batch)
    assert [e["seq"] for e in got if e["session"] == "s1"] == [0, 1]
    assert "replay-complete" in comments and not any(c.startswith("replay-exhausted") for c in comments)


async def test_post_ingest_rules(relay: RelayDouble, stamper: Stamper) -> None:
    good, bad = make(stamper, "s1"), make(stamper, "s1")
    del bad["id"]
    assert await post(relay, line(good), version=None) == (426, {"versions": ["0.1"]})
    assert (await post(relay, line(good), version="9.9"))[0] == 426
    assert (await post(relay, line(good), ctype="text/plain"))[0] == 415
    status, body = await post(relay, line(good) + "\n" + line(bad))
    assert status == 400 and body["error"] == "invalid-event" and body["line"] == 1
    assert relay.received == []  # a rejected batch ingests nothing
    command = make(stamper, "s1", RESPOND, subject="req")
    assert (await post(relay, line(command)))[0] == 403
    assert await post(relay, line(good), ctype="application/json") == (202, None)
    assert relay.stored == [good]


async def test_buffer_dedupes_while_live_fan_out_forwards_every_copy(relay: RelayDouble, stamper: Stamper) -> None:
    watcher = await Peer.open(relay)
    await watcher.hello("watcher", role="consumer")
    await watcher.send({"type": "subscribe", "id": "all", "filter": {}})
    assert await watcher.recv() == {"type": "subscribed", "id": "all"}
    sse_lines: list[str] = []

    async def read_sse() -> None:
        async with aiohttp.ClientSession() as http, http.get(
                f"{relay.url}/stream", params={"access_token": TOKEN}) as resp:
            async for raw in resp.content:
                if raw.startswith(b"data: "):
                    sse_lines.append(raw[6:].decode().rstrip("\n"))

    reader = asyncio.create_task(read_sse())
    try:
        await wait_until(lambda: relay.subscriber_count == 2, "both subscribers to register")
        event = make(stamper, "s1", "control.accepted", cause="cmd-1")
        text = line(event)
        for _ in range(2):
            assert (await post(relay, text))[0] == 202
        assert relay.stored == [event]
        assert relay.received == [event, event]
        assert [await watcher.recv_raw(), await watcher.recv_raw()] == [text, text]
        await wait_until(lambda: len(sse_lines) == 2, "two SSE deliveries")
        assert sse_lines == [text, text]
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await watcher.ws.close()


@pytest.mark.parametrize("first", ["event", "garbage"])
async def test_a_first_frame_other_than_hello_is_refused_and_closed(
        relay: RelayDouble, stamper: Stamper, first: str) -> None:
    peer = await Peer.open(relay)
    await peer.send(line(make(stamper, "s1")) if first == "event" else "{not json")
    assert await peer.recv() == {"type": "error", "code": "hello-required"}
    assert await peer.closed_with() == 1002
    assert relay.received == []


async def test_no_shared_version_is_refused_and_closed(relay: RelayDouble) -> None:
    peer = await Peer.open(relay)
    await peer.send({"type": "hello", "versions": ["9.9"], "role": "emitter", "identity": {"agent": "a"}})
    reply = await peer.recv()
    assert reply["code"] == "version-unsupported" and reply["versions"] == ["0.1"]
    assert await peer.closed_with() == 1002


async def test_hello_selects_one_version_and_unknowns_are_ignored(relay: RelayDouble) -> None:
    peer = await Peer.open(relay)
    await peer.send({"type": "hello", "versions": ["0.1"], "role": "consumer", "identity": {"agent": "c"},
                     "capabilities": {"futurecap": {"x": 1}}})
    reply = await peer.recv()
    assert reply["type"] == "hello" and reply["versions"] == ["0.1"]
    await peer.send({"type": "zigzag"})
    await peer.send("{garbage")
    assert await peer.recv() == {"type": "error", "code": "bad-json"}
    await peer.send({"type": "ping", "t": 77})
    assert await peer.recv() == {"type": "pong", "t": 77}
    await peer.send({"type": "subscribe", "id": "bad", "filter": {"seq": 1}})
    refusal = await peer.recv()
    assert (refusal["type"], refusal["id"], refusal["code"]) == ("error", "bad", "invalid-filter")
    await peer.send({"type": "subscribe", "id": "badfrom", "from": {}})
    assert (await peer.recv())["code"] == "invalid-filter"
    await peer.send({"type": "subscribe", "id": "ok", "filter": {"type": "attention.*"}})
    assert await peer.recv() == {"type": "subscribed", "id": "ok"}
    await peer.send({"type": "unsubscribe", "id": "ok"})
    assert await peer.recv() == {"type": "unsubscribed", "id": "ok"}
    await peer.ws.close()


async def test_socket_subscribe_from_replays_strictly_after(relay: RelayDouble, stamper: Stamper) -> None:
    events = [make(stamper, "s1") for _ in range(3)]
    assert (await post(relay, "\n".join(map(line, events))))[0] == 202
    peer = await Peer.open(relay)
    await peer.hello("c", role="consumer")
    await peer.send({"type": "subscribe", "id": "r", "filter": {"session": "s1"},
                     "from": [{"session": "s1", "epoch": events[0]["epoch"], "seq": 0}]})
    assert await peer.recv() == {"type": "subscribed", "id": "r"}
    assert [await peer.recv(), await peer.recv()] == events[1:]
    await peer.ws.close()


async def test_sdk_roster_lists_live_claims_verbatim(relay: RelayDouble, stamper: Stamper) -> None:
    control = {"accepts": [RESPOND], "ack_window_ms": 10000}
    emitter = await Peer.open(relay)
    await emitter.hello("claude-code", control=control, emits=["session"])
    await emitter.send(line(make(stamper, "s1", "session.started")))
    await wait_until(lambda: relay.stored, "the claiming event")
    client = ControlClient(relay.url, agent="operator", host="ops", token=TOKEN)
    await client.connect(connect_timeout_ms=10_000)
    try:
        assert await client.roster() == [{"session": "s1", "agent": "claude-code", "instance": "claude-code/1",
                                          "control": control, "emits": ["session"]}]
    finally:
        await client.close()
    await emitter.send({"type": "roster", "id": "r-1"})
    assert await emitter.recv() == {"type": "error", "id": "r-1", "code": "unauthorized"}
    await emitter.ws.close()


async def test_sdk_command_reaches_the_one_claimant_and_its_acks_return(
        relay: RelayDouble, stamper: Stamper) -> None:
    emitter = await Peer.open(relay)
    await emitter.hello("claude-code", control={"accepts": [RESPOND], "ack_window_ms": 10000})
    await emitter.send(line(make(stamper, "s1", "attention.requested")))
    await wait_until(lambda: relay.stored, "the claiming event")
    watcher = await Peer.open(relay)
    await watcher.hello("watcher", role="consumer")
    await watcher.send({"type": "subscribe", "id": "acks", "filter": {"type": "control.accepted"}})
    assert (await watcher.recv())["type"] == "subscribed"
    client = ControlClient(relay.url, agent="operator", host="ops", token=TOKEN)
    await client.connect(connect_timeout_ms=10_000)
    try:
        sending = asyncio.create_task(client.send(RESPOND, "s1", subject="req-1",
                                                  data={"answer": {"option": "allow"}}, retries=0))
        text = await emitter.recv_raw()
        assert relay.forwarded == [("claude-code", text)]  # byte-identical to what the double routed
        command = json.loads(text)
        assert command["type"] == RESPOND and "seq" not in command
        ack = make(stamper, "s1", "control.accepted", cause=command["id"])
        await emitter.send(line(ack))
        assert await asyncio.wait_for(sending, 10) == ack
        await emitter.send(line(ack))  # a byte-identical re-ack still reaches every subscriber
        assert [await watcher.recv_raw(), await watcher.recv_raw()] == [line(ack), line(ack)]
        assert [e for e in relay.stored if e["type"] == "control.accepted"] == [ack]
    finally:
        await client.close()
        await emitter.ws.close()
        await watcher.ws.close()


async def test_relay_behalf_refusals_reach_the_sender_and_never_history(
        relay: RelayDouble, stamper: Stamper) -> None:
    a, b, quiet = await Peer.open(relay), await Peer.open(relay), await Peer.open(relay)
    await a.hello("agent-a", control={"accepts": [RESPOND], "ack_window_ms": 10000})
    await b.hello("agent-b", control={"accepts": [RESPOND], "ack_window_ms": 10000})
    await quiet.hello("agent-q", control={"accepts": [], "ack_window_ms": 10000})
    await a.send(line(make(stamper, "shared", agent="agent-a")))
    await b.send(line(make(stamper, "shared", agent="agent-b")))
    await quiet.send(line(make(stamper, "q1", agent="agent-q")))
    await wait_until(lambda: len(relay.stored) == 3, "three claims")
    client = ControlClient(relay.url, agent="operator", host="ops", token=TOKEN)
    await client.connect(connect_timeout_ms=10_000)
    try:
        outcomes = {}
        for session in ("nobody", "shared", "q1"):
            with pytest.raises(NackError) as err:
                await client.send(RESPOND, session, subject="r", data={"answer": {"option": "allow"}},
                                  retries=0, ack_window_ms=10_000)
            outcomes[session] = (err.value.reason, err.value.detail or "")
    finally:
        await client.close()
    assert outcomes["nobody"][0] == "invalid" and outcomes["nobody"][1].startswith("no-route")
    assert outcomes["shared"][0] == "invalid" and outcomes["shared"][1].startswith("ambiguous")
    assert outcomes["q1"][0] == "unsupported"
    assert [r["code"] for r in relay.refusals] == ["no-route", "ambiguous", "unsupported"]
    assert relay.forwarded == []
    assert not any(e["type"].startswith("control.") for e in relay.stored)
    for peer in (a, b, quiet):
        await peer.ws.close()


async def test_watch_only_without_a_token_refuses_every_command(stamper: Stamper) -> None:
    relay = RelayDouble()
    await relay.start()
    try:
        emitter = await Peer.open(relay, token=None)
        await emitter.hello("claude-code", control={"accepts": [RESPOND], "ack_window_ms": 10000})
        await emitter.send(line(make(stamper, "s1")))
        await wait_until(lambda: relay.stored, "the claiming event")
        client = ControlClient(relay.url, agent="operator", host="ops")
        await client.connect(connect_timeout_ms=10_000)
        try:
            with pytest.raises(NackError) as err:
                await client.send(RESPOND, "s1", subject="r", data={"answer": {"option": "allow"}}, retries=0)
        finally:
            await client.close()
        assert err.value.reason == "unauthorized"
        assert relay.forwarded == []
        await emitter.ws.close()
    finally:
        await relay.stop()


async def test_a_token_is_required_at_upgrade_and_stream(relay: RelayDouble) -> None:
    with pytest.raises(InvalidStatus) as err:
        await connect(relay.ws_url, proxy=None)
    assert err.value.response.status_code == 401
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{relay.url}/stream") as resp:
            assert resp.status == 401
        async with http.get(f"{relay.url}/stream", params={"access_token": "wrong"}) as resp:
            assert resp.status == 401


async def test_restart_closes_sockets_with_1001_on_the_same_port(relay: RelayDouble, stamper: Stamper) -> None:
    peer = await Peer.open(relay)
    await peer.hello("claude-code")
    event = make(stamper, "s1")
    await peer.send(line(event))
    await wait_until(lambda: relay.stored, "the event")
    port = relay.port
    await relay.stop()
    assert await peer.closed_with() == 1001
    await relay.start()
    assert relay.port == port
    again = await Peer.open(relay)
    await again.hello("claude-code")
    assert relay.connections("claude-code")[0].claims == []  # claims died with the old connection
    await again.send(line(event))
    await wait_until(lambda: len(relay.received) == 2, "the redelivery")
    assert relay.stored == [event]  # the dedupe record outlives the restart
    await again.ws.close()
