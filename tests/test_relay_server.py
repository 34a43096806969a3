"""The relay role in-process, with the official SDK (``aep_sdk``) as the consumer and operator and no
other relay anywhere: subscribe, see the held Claude Code permission, answer it. Then what live.js
does not probe: holding only while someone watches, the token file, HTTP-posted commands,
forwarding to a WebSocket emitter, ambiguous claims, slow-consumer shedding, the external relay
exporter switched off.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aep_collector.exporters.relay_server.server import Conn, Outlet
from aep_sdk.aio import ControlClient, subscribe
from aep_sdk.control import NackError

from tests.helpers import base_config, running
from tests.relay_double import RelayDouble, wait_until

SID = "rs-sdk-1"
TOKEN = "relay-server-test-token"


def permission(tool_use_id: str = "toolu_1") -> dict:
    return {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "Bash",
            "tool_input": {"command": "rm -rf build"}, "tool_use_id": tool_use_id}


def config(tmp_path: Path, token: str | None = TOKEN, **relay: object) -> dict:
    rs: dict = {"endpoint": "127.0.0.1:0", **relay}
    if token is not None:
        rs["token"] = token
    return base_config(tmp_path, extra_exporters={"relay_server": rs, "relay": {"endpoint": ""}})


class Stack:
    def __init__(self, service) -> None:
        self.service = service
        self.relay = service.exporters["relay_server"]
        self.url = self.relay.url
        self.hook = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"

    async def post(self, body: dict) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as s, s.post(self.hook, json=body) as r:
            return r.status, await r.json()


async def next_of(sub, type_: str) -> dict:
    async for ev in sub:
        if ev.get("type") == type_:
            return ev
    raise AssertionError(f"the stream ended before a {type_}")


async def test_the_official_sdk_watches_and_answers_a_held_hook_through_the_role(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        sub = await subscribe(st.url, filter={"session": SID}, token=TOKEN)
        operator = ControlClient(st.url, agent="aep-console", host="ops-host", token=TOKEN)
        await operator.connect()
        try:
            assert await st.post({"session_id": SID, "hook_event_name": "SessionStart", "source": "startup"}) \
                == (200, {})
            assert (await asyncio.wait_for(next_of(sub, "session.started"), 10))["session"] == SID
            hook = asyncio.create_task(st.post(permission()))
            req = await asyncio.wait_for(next_of(sub, "attention.requested"), 10)
            assert req["data"]["respond_via"] == ["control"]
            ack = await operator.send("control.attention.respond", SID, subject=req["id"],
                                      data={"answer": {"option": "allow"}})
            assert ack["type"] == "control.accepted" and ack["cause"]
            status, reply = await asyncio.wait_for(hook, 10)
            assert reply == {"hookSpecificOutput": {"hookEventName": "PermissionRequest",
                                                    "decision": {"behavior": "allow"}}}
            answered = await asyncio.wait_for(next_of(sub, "attention.answered"), 10)
            assert answered["subject"] == req["id"] and answered["data"]["via"] == "control"
            with pytest.raises(NackError) as info:  # the request is closed: nothing more is granted
                await operator.send("control.attention.respond", SID, subject=req["id"],
                                    data={"answer": {"option": "allow"}}, retries=0)
            assert info.value.reason == "refused"
        finally:
            await operator.close()
            closing = sub.close()
            if asyncio.iscoroutine(closing):
                await closing


async def test_nothing_is_held_while_nobody_watches(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        assert await asyncio.wait_for(st.post(permission()), 10) == (200, {})
        assert not service.host.control.holds and st.relay.consumers == 0


async def test_the_token_file_is_created_private_and_every_stream_needs_it(tmp_path: Path) -> None:
    async with running(config(tmp_path, token=None)) as service:
        st = Stack(service)
        path = tmp_path / "state" / "relay.token"
        assert path.stat().st_mode & 0o777 == 0o600
        token = path.read_text().strip()
        assert len(token) >= 32
        doc = json.loads((tmp_path / "state" / "relay.json").read_text())
        assert doc["endpoint"] == st.url and doc["token_file"] == str(path)
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {token}x"}):
                async with http.get(f"{st.url}/stream", headers=headers) as r:
                    assert r.status == 401 and (await r.json())["error"] == "unauthorized"
                async with http.get(f"{st.url}/socket", headers=headers) as r:
                    assert r.status == 401
            async with http.get(f"{st.url}/healthz") as r:
                assert await r.json() == {"ok": True}  # unauthenticated: no counts, no health detail
            async with http.get(f"{st.url}/healthz", headers={"Authorization": f"Bearer {token}"}) as r:
                body = await r.json()
                assert body["collector"]["ok"] is True and body["consumers"] == 0
    assert not (tmp_path / "state" / "relay.json").exists()  # a stopped collector is not advertised
    async with running(config(tmp_path, token=None)):
        assert path.read_text().strip() == token  # kept across restarts


async def test_commands_never_flow_over_http_and_reach_exactly_one_claimant(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        cmd = {"aep": "0.1", "id": "01CMD0000000000000000000001", "type": "control.pause",
               "time": "2026-12-03T08:00:00.000Z", "source": "aep://ops/agent/op", "agent": "op",
               "session": "ws-owned"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{st.url}/events", json=cmd, headers={**auth, "AEP-Version": "0.1"}) as r:
                assert r.status == 403 and "WebSocket" in (await r.json())["detail"]
            emitter = await http.ws_connect(f"{st.url}/socket", headers=auth)
            await emitter.send_json({"type": "hello", "versions": ["0.1"], "role": "emitter",
                                     "identity": {"agent": "other-agent"},
                                     "capabilities": {"control": {"accepts": ["control.pause"]}}})
            assert (await emitter.receive_json(timeout=5))["type"] == "hello"
            started = {"aep": "0.1", "id": "E1", "type": "session.started", "time": "2026-12-03T08:00:00.000Z",
                       "source": "aep://h/agent/other-agent/session/ws-owned", "agent": "other-agent",
                       "session": "ws-owned", "seq": 0}
            await emitter.send_str(json.dumps(started))
            sender = await http.ws_connect(f"{st.url}/socket", headers=auth)
            await sender.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer",
                                    "identity": {"agent": "op"}})
            assert (await sender.receive_json(timeout=5))["type"] == "hello"
            await asyncio.sleep(0.05)  # the emitter's claim is registered on receipt
            raw = json.dumps(cmd, separators=(", ", ": "))  # odd spacing: forwarding keeps the bytes
            await sender.send_str(raw)
            assert await emitter.receive_str(timeout=5) == raw
            # The collector's own Claude Code session under the same id: two claimants, no guess.
            await emitter.send_str(json.dumps(dict(started, id="E2", session=SID, seq=1,
                                                   source=f"aep://h/agent/other-agent/session/{SID}")))
            await st.post({"session_id": SID, "hook_event_name": "SessionStart", "source": "startup"})
            for _ in range(200):
                if st.relay.owners_of(SID):
                    break
                await asyncio.sleep(0.01)
            await sender.send_str(json.dumps(dict(cmd, id="01CMD0000000000000000000002", session=SID)))
            refusal = await sender.receive_json(timeout=5)
            assert refusal["type"] == "error" and refusal["code"] == "ambiguous"
            assert refusal["cause"] == "01CMD0000000000000000000002"
            await sender.send_str(json.dumps(dict(cmd, id="01CMD0000000000000000000003", session="nobody")))
            assert (await sender.receive_json(timeout=5))["code"] == "no-route"
            await emitter.close()
            await sender.close()


def test_a_slow_subscriber_loses_debug_and_info_first_then_the_connection() -> None:
    outlet = Outlet(soft=100, hard=300)
    assert outlet.put("x" * 90, "info") and outlet.put("x" * 90, "debug")  # under the soft limit
    assert not outlet.put("x" * 50, "info") and not outlet.put("x" * 50, "debug") and outlet.shed == 2
    assert outlet.put("x" * 100, "warning") and outlet.put("x" * 10, None)  # notice+ and frames are kept
    assert outlet.put("x" * 20, "critical") and outlet.pending == 310 and not outlet.closed
    assert not outlet.put("x", "critical") and outlet.closed  # past the hard limit: disconnected
    items = [outlet.queue.get_nowait() for _ in range(outlet.queue.qsize())]
    assert items[-1] == ("end", "backpressure")


async def test_a_switched_off_external_relay_exporter_is_silent(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        await st.post({"session_id": SID, "hook_event_name": "SessionStart", "source": "startup"})
        snap = service.health.snapshot()
        assert snap["ok"] is True and snap["relay"] is True, snap  # the role serves; nothing unreachable
    assert not (tmp_path / "state" / "queue" / "exporter" / "relay").exists()


async def test_no_subscriber_gets_more_content_than_max_capture(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        sub = await subscribe(st.url, filter={"session": "foreign"}, token=TOKEN)  # asks for no ceiling
        try:
            ev = {"aep": "0.1", "id": "F1", "type": "run.started", "time": "2026-12-03T08:00:00.000Z",
                  "source": "aep://h/agent/x/session/foreign", "agent": "x", "session": "foreign", "seq": 0,
                  "run": "r1", "capture": "full", "data": {"trigger": "user", "prompt": "FULL-CONTENT-CANARY"}}
            async with aiohttp.ClientSession() as http, http.post(
                    f"{st.url}/events", json=ev, headers={"Authorization": f"Bearer {TOKEN}", "AEP-Version": "0.1"}) as r:
                assert r.status == 202
            got = await asyncio.wait_for(next_of(sub, "run.started"), 10)
            # redacted is the role's ceiling; a mechanical hop from full can only reach metadata (§8.2e)
            assert got["capture"] == "metadata" and "prompt" not in got["data"] and got["data"]["trigger"] == "user"
        finally:
            closing = sub.close()
            if asyncio.iscoroutine(closing):
                await closing


async def test_the_role_and_the_external_relay_exporter_run_together(tmp_path: Path) -> None:
    relay = RelayDouble(token="ext-relay-token")
    await relay.start()
    cfg = config(tmp_path)
    cfg["exporters"]["relay"] = {"endpoint": relay.ws_url, "token": "ext-relay-token",
                                 "backoff_initial": 0.05, "backoff_max": 0.2}
    try:
        async with running(cfg) as service:
            st = Stack(service)
            sub = await subscribe(st.url, filter={"session": SID}, token=TOKEN)
            try:
                await st.post({"session_id": SID, "hook_event_name": "SessionStart", "source": "startup"})
                local = await asyncio.wait_for(next_of(sub, "session.started"), 10)
                (remote,) = await wait_until(lambda: relay.store_for(SID), "the event at the external relay")
                assert local == remote  # the same stamped event, served here and forwarded there
            finally:
                closing = sub.close()
                if asyncio.iscoroutine(closing):
                    await closing
    finally:
        await relay.stop()


async def test_subscription_cap_is_in_band_and_shutdown_tells_every_stream(tmp_path: Path) -> None:
    async with running(config(tmp_path, max_subscriptions=2)) as service:
        st = Stack(service)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{st.url}/socket", headers=auth)
            await ws.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer", "identity": {"agent": "t"}})
            for sid in ("a", "b", "c", "a"):
                await ws.send_json({"type": "subscribe", "id": sid, "filter": {}})
            frames = [await ws.receive_json(timeout=5) for _ in range(5)]
            assert [(f["type"], f.get("id"), f.get("code")) for f in frames[1:]] == [
                ("subscribed", "a", None), ("subscribed", "b", None), ("error", "c", "limit-exceeded"),
                ("subscribed", "a", None)]  # re-subscribing an id replaces it; the connection survives
            sse = await http.get(f"{st.url}/stream", headers=auth)
            for _ in range(200):
                if st.relay.surface.streams:
                    break
                await asyncio.sleep(0.01)
            await st.relay.shutdown()
            assert b": shutting-down" in await asyncio.wait_for(sse.content.read(), 10)
            closed = await ws.receive(timeout=5)
            assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1001  # going away
            sse.release()


async def test_two_of_the_collectors_own_agents_in_one_session_are_ambiguous_not_a_guess(tmp_path: Path) -> None:
    """Session ids are unique per agent only (AEP-0001 §5.2): two agents emitting the same id are two
    claimants, so a command for it is refused ``ambiguous`` (AEP-0004 §4), not sent to the latest."""
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        auth = {"Authorization": f"Bearer {TOKEN}"}

        def started(agent: str, seq: int) -> dict:
            return {"aep": "0.1", "id": f"{agent}-{seq}", "type": "session.started",
                    "time": "2026-12-03T08:00:00.000Z", "source": f"aep://h/agent/{agent}/session/shared",
                    "agent": agent, "session": "shared", "seq": seq}

        assert await st.relay.export([started("claude-code", 0), started("codex", 0)]) == 0
        async with aiohttp.ClientSession() as http:
            sender = await http.ws_connect(f"{st.url}/socket", headers=auth)
            await sender.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer",
                                    "identity": {"agent": "op"}})
            assert (await sender.receive_json(timeout=5))["type"] == "hello"
            await sender.send_json({"type": "roster", "id": "r"})
            roster = await sender.receive_json(timeout=5)
            assert sorted(e["agent"] for e in roster["entries"] if e["session"] == "shared") == ["claude-code", "codex"]
            await sender.send_json({"type": "subscribe", "id": "acks", "filter": {"session": "shared"}})
            assert (await sender.receive_json(timeout=5))["type"] == "subscribed"
            cmd = {"aep": "0.1", "id": "01CMDSHARED0000000000000001", "type": "control.cancel",
                   "time": "2026-12-03T08:00:00.000Z", "source": "aep://ops/agent/op", "agent": "op",
                   "session": "shared", "data": {"scope": "session"}}
            await sender.send_json(cmd)
            answer = await sender.receive_json(timeout=5)
            assert answer == {"type": "error", "code": "ambiguous", "cause": cmd["id"],
                              "detail": answer.get("detail")}, answer
            # One agent's session alone is still routed to it.
            assert await st.relay.export([dict(started("claude-code", 1), session="mine", id="m")]) == 0
            await sender.send_json({"type": "subscribe", "id": "mine", "filter": {"session": "mine"}})
            assert (await sender.receive_json(timeout=5))["type"] == "subscribed"
            await sender.send_json(dict(cmd, id="01CMDSHARED0000000000000002", session="mine"))
            while (frame := await sender.receive_json(timeout=5)).get("cause") != "01CMDSHARED0000000000000002":
                pass
            assert frame["type"] == "control.rejected" and frame["agent"] == "claude-code", frame  # its decision
            await sender.close()


async def test_a_command_for_an_emitter_being_disconnected_is_refused_not_lost(tmp_path: Path) -> None:
    """The only claimant's outlet is closing (it fell past hard_limit and is being cut off): the
    command cannot reach it, so its sender gets ``no-route`` now instead of silence."""
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        closing = Conn(ws=None, outlet=Outlet(soft=10, hard=10),  # type: ignore[arg-type]
                       hello={"type": "hello", "role": "emitter", "identity": {"agent": "slow"}},
                       claims={"cut-off": None})
        closing.outlet.overflow()
        st.relay.surface.conns.append(closing)
        async with aiohttp.ClientSession() as http:
            sender = await http.ws_connect(f"{st.url}/socket", headers=auth)
            await sender.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer",
                                    "identity": {"agent": "op"}})
            assert (await sender.receive_json(timeout=5))["type"] == "hello"
            cmd = {"aep": "0.1", "id": "01CMDCUTOFF0000000000000001", "type": "control.pause",
                   "time": "2026-12-03T08:00:00.000Z", "source": "aep://ops/agent/op", "agent": "op",
                   "session": "cut-off"}
            await sender.send_json(cmd)
            refusal = await sender.receive_json(timeout=5)
            assert refusal["type"] == "error" and refusal["code"] == "no-route" and refusal["cause"] == cmd["id"]
            await sender.close()
        st.relay.surface.conns.remove(closing)
