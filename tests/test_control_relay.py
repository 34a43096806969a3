"""Claude Code's held loops end to end through a relay, with the official SDK as the operator.

The collector runs in-process with its real relay exporter; ``tests.relay_double`` is the relay;
``aep_sdk.aio.ControlClient`` is the operator's console. Each case checks the exact hook reply
and the exact events in the JSONL history.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aep_collector.pipeline.validate import StreamValidator, envelope_errors
from aep_sdk.aio import ControlClient, open_duplex
from aep_sdk.control import ControlSender, NackError

from tests.helpers import base_config, read_jsonl, running
from tests.relay_double import RelayDouble, wait_until

TOKEN = "s3cret-token"
SID = "cc-relay-1"


def permission(tool_use_id="toolu_1"):
    return {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "Bash",
            "tool_input": {"command": "rm -rf build"}, "tool_use_id": tool_use_id}


class Stack:
    def __init__(self, service, relay, tmp_path):
        self.service, self.relay, self.tmp_path = service, relay, tmp_path
        self.port = service.receivers["claude_code"].port

    async def post(self, body):
        async with aiohttp.ClientSession() as s, \
                s.post(f"http://127.0.0.1:{self.port}/hook", json=body) as r:
            return r.status, await r.json()

    async def request_id(self, n=1):
        """The id of the n-th held attention request, once the relay has it."""
        def found():
            reqs = [e for e in self.relay.store_for(SID) if e["type"] == "attention.requested"]
            return reqs[n - 1]["id"] if len(reqs) >= n and self.service.host.control.holds else None
        return await wait_until(found, "the attention request to reach the relay and be held")

    def jsonl(self):
        return read_jsonl(self.tmp_path / "logs" / "claude-code" / f"{SID}.jsonl")

    def of(self, type_):
        return [e for e in self.jsonl() if e["type"] == type_]


@pytest.fixture
async def stack(tmp_path, request):
    relay = RelayDouble(token=TOKEN)
    await relay.start()
    cfg = base_config(tmp_path, extra_exporters={"relay": {"endpoint": relay.ws_url, "token": TOKEN,
                                                           "backoff_initial": 0.05, "backoff_max": 0.2}})
    cfg["receivers"]["claude_code"]["attention_timeout"] = getattr(request, "param", 20.0)
    try:
        async with running(cfg) as service:
            st = Stack(service, relay, tmp_path)
            # The relay routes a command only to a connection that claimed the session.
            await st.post({"session_id": SID, "hook_event_name": "SessionStart", "source": "startup"})
            await wait_until(lambda: service.health.snapshot()["relay"], "the relay hello to complete")
            await wait_until(lambda: relay.store_for(SID), "the session claim")
            yield st
    finally:
        await relay.stop()


@pytest.fixture
async def operator(stack):
    client = ControlClient(stack.relay.url, agent="aep-console", host="ops-host", token=TOKEN)
    await client.connect()
    yield client
    await client.close()


async def answer(stack, operator, body, **answer_kw):
    hook = asyncio.create_task(stack.post(body))
    rid = await stack.request_id()
    ack = await operator.send("control.attention.respond", SID, subject=rid, data={"answer": answer_kw})
    status, reply = await asyncio.wait_for(hook, 10)
    assert status == 200
    return rid, ack, reply


def check_stream(events):
    v = StreamValidator()
    for e in events:
        assert envelope_errors(e) == [], e
        assert v.feed(e) == [], e


async def test_healthz_reports_the_live_relay(stack):
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{stack.port}/healthz") as r:
        assert await r.json() == {"ok": True, "relay": True}


async def test_allow_through_the_relay(stack, operator):
    rid, ack, reply = await answer(stack, operator, permission(), option="allow")
    assert reply == {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}}
    assert ack["type"] == "control.accepted"
    events = stack.jsonl()
    types = [e["type"] for e in events]
    assert types == ["session.started", "attention.requested", "control.accepted", "attention.answered",
                     "attention.resolved"]
    req, acc, ans, res = events[1:]
    assert req["data"]["respond_via"] == ["control"] and req["data"]["kind"] == "permission"
    assert acc["id"] == ack["id"] and acc["cause"] == ack["cause"]
    assert ans["data"] == {"answer": {"option": "allow"}, "via": "control"} and ans["cause"] == ack["cause"]
    assert res["subject"] == rid and res["cause"] == ans["id"]
    check_stream(events)


async def test_deny_through_the_relay(stack, operator):
    _, _, reply = await answer(stack, operator, permission(), option="deny")
    assert reply["hookSpecificOutput"]["decision"] == {"behavior": "deny", "message": "Denied via AEP attention loop"}
    assert stack.of("attention.answered")[0]["data"]["answer"] == {"option": "deny"}


async def test_text_guidance_through_the_relay(stack, operator):
    _, _, reply = await answer(stack, operator, permission(), text="run make clean instead")
    assert reply["hookSpecificOutput"]["decision"] == {"behavior": "deny", "message": "run make clean instead"}
    assert stack.of("attention.answered")[0]["data"]["answer"] == {"option": "deny", "text": "run make clean instead"}


async def test_option_word_text_through_the_relay(stack, operator):
    _, _, reply = await answer(stack, operator, permission(), text="  Allow ")
    assert reply["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
    assert stack.of("attention.answered")[0]["data"]["answer"] == {"option": "allow"}


async def test_empty_answer_through_the_relay_is_a_plain_deny(stack, operator):
    _, _, reply = await answer(stack, operator, permission())
    assert reply["hookSpecificOutput"]["decision"] == {"behavior": "deny", "message": "Denied via AEP attention loop"}


@pytest.mark.parametrize("stack", [0.4], indirect=True)
async def test_timeout_through_the_relay(stack, operator):
    assert await asyncio.wait_for(stack.post(permission()), 10) == (200, {})
    (req,) = stack.of("attention.requested")
    (timeout,) = stack.of("attention.timeout")
    assert timeout["subject"] == req["id"]
    with pytest.raises(NackError) as info:  # an answer after the timeout grants nothing
        await operator.send("control.attention.respond", SID, subject=req["id"],
                            data={"answer": {"option": "allow"}}, retries=0)
    assert info.value.reason == "refused"
    check_stream(stack.jsonl())


async def test_dismissal_through_the_relay(stack, operator):
    hook = asyncio.create_task(stack.post(permission("toolu_7")))
    rid = await stack.request_id()
    await stack.post({"session_id": SID, "hook_event_name": "PostToolUse", "tool_name": "Bash",
                      "tool_input": {"command": "rm -rf build"}, "tool_response": {}, "tool_use_id": "toolu_7"})
    assert await asyncio.wait_for(hook, 10) == (200, {})
    (res,) = stack.of("attention.resolved")
    assert res["subject"] == rid and res["data"] == {"resolution": "dismissed"}
    with pytest.raises(NackError) as info:
        await operator.send("control.attention.respond", SID, subject=rid, data={"answer": {"option": "allow"}},
                            retries=0)
    assert info.value.reason == "refused"


async def test_unknown_subject_is_refused_through_the_relay(stack, operator):
    with pytest.raises(NackError) as info:
        await operator.send("control.attention.respond", SID, subject="01NOSUCHREQUEST",
                            data={"answer": {"option": "allow"}}, retries=0)
    assert info.value.reason == "refused"
    (nack,) = stack.of("control.rejected")
    assert nack["data"] == {"reason": "refused"}


async def test_invalid_form_values_are_rejected_and_the_form_stays_pending(stack, operator):
    ask = {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "AskUserQuestion",
           "tool_use_id": "toolu_q", "tool_input": {"questions": [
               {"question": "Which DB?", "header": "DB", "multiSelect": False,
                "options": [{"label": "Postgres"}, {"label": "SQLite"}]}]}}
    hook = asyncio.create_task(stack.post(ask))
    rid = await stack.request_id()
    with pytest.raises(NackError) as info:
        await operator.send("control.attention.respond", SID, subject=rid, data={"answer": {"values": {}}},
                            retries=0)
    assert info.value.reason == "invalid"
    assert not hook.done()
    await operator.send("control.attention.respond", SID, subject=rid, data={"answer": {"values": {"1": "2"}}})
    status, reply = await asyncio.wait_for(hook, 10)
    assert reply["hookSpecificOutput"]["decision"]["updatedInput"]["answers"] == {"Which DB?": "SQLite"}


async def test_duplicate_command_id_gets_a_byte_identical_re_ack(stack):
    """Send the SAME command twice over a raw duplex: both acks arrive, byte for byte the same."""
    hook = asyncio.create_task(stack.post(permission()))
    rid = await stack.request_id()
    duplex = await open_duplex(stack.relay.url, token=TOKEN)
    await duplex.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer",
                            "identity": {"agent": "aep-console"}, "capabilities": {}})
    assert (await duplex.recv_json())["type"] == "hello"
    await duplex.send_json({"type": "subscribe", "id": "s", "filter": {"session": SID}})
    cmd = ControlSender(lambda _c: None, agent="aep-console", host="ops").build(
        "control.attention.respond", SID, subject=rid, data={"answer": {"option": "allow"}})
    acks: list[dict] = []

    async def read_acks(n):
        while len(acks) < n:
            frame = await duplex.recv_json()
            if frame and frame.get("type") in ("control.accepted", "control.rejected") \
                    and frame.get("cause") == cmd["id"]:
                acks.append(frame)

    await duplex.send_json(cmd)
    await asyncio.wait_for(read_acks(1), 10)
    await duplex.send_json(cmd)
    await asyncio.wait_for(read_acks(2), 10)
    await duplex.close()
    assert json.dumps(acks[0], sort_keys=True) == json.dumps(acks[1], sort_keys=True)
    assert acks[0]["id"] == acks[1]["id"] and acks[0]["seq"] == acks[1]["seq"]
    assert (await asyncio.wait_for(hook, 10))[1]["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
    assert len(stack.of("control.accepted")) == 1 and len(stack.of("attention.answered")) == 1


async def test_relay_restart_mid_hold_still_delivers_the_answer(stack):
    hook = asyncio.create_task(stack.post(permission()))
    rid = await stack.request_id()
    await stack.relay.stop()
    await stack.relay.start()
    await wait_until(lambda: stack.service.health.snapshot()["relay"] and stack.relay.connections("claude-code"),
                     "the collector to reconnect")
    client = ControlClient(stack.relay.url, agent="aep-console", host="ops-host", token=TOKEN)
    await client.connect()
    try:
        ack = await client.send("control.attention.respond", SID, subject=rid, data={"answer": {"option": "allow"}})
    finally:
        await client.close()
    assert ack["type"] == "control.accepted"
    assert (await asyncio.wait_for(hook, 10))[1]["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
