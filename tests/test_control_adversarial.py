"""The control plane under attack: odd commands, hostile request text, shutdown races.

A real collector runs in-process with its relay role; the official SDK's ``ControlClient`` is the
operator and ``aep-collector`` the operator CLI (a real process); hooks arrive over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.pipeline.control import PERMISSION_OPTIONS, RESPOND, ControlRouter
from aep_collector.pipeline.host import Health
from aep_collector.receivers.held import permission_validator
from aep_collector.receivers.tool_gate import gate_validator
from aep_sdk.aio import ControlClient
from aep_sdk.control import NackError

from tests.helpers import base_config, operator_console, read_jsonl, running

TOKEN = "control-adversarial-token"
SID = "adv-control"
EXE = Path(sys.executable).with_name("aep-collector")
# What a hostile tool input would use on the operator's terminal: erase the line and return, so
# `rm -rf ~` is overwritten by a harmless-looking command; set the window title; a C1 CSI; a
# right-to-left override.
HOSTILE = "rm -rf ~ \x1b[2K\r\x1b[1Als -la\x1b]0;pwned\x07 \x9b31m \u202eexe.txt"
RAW_CONTROLS = ("\x1b", "\r", "\x07", "\x9b", "\u202e")


def config(tmp_path: Path, timeout: float = 30.0) -> dict[str, Any]:
    cfg = base_config(tmp_path, ceiling="full", extra_exporters={
        "relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN, "max_capture": "full"}})
    cfg["receivers"]["claude_code"]["attention_timeout"] = timeout
    return cfg


class Stack:
    def __init__(self, service: Any) -> None:
        self.service = service
        self.router = service.host.control
        self.url = service.exporters["relay_server"].url
        self.hook = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"

    async def post(self, body: dict[str, Any]) -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as s, s.post(self.hook, json=body) as r:
            return r.status, await r.read()

    async def held(self, n: int = 1) -> list[str]:
        for _ in range(2000):
            if len(self.router.holds) >= n:
                return list(self.router.holds)
            await asyncio.sleep(0.01)
        raise AssertionError("no held request appeared")

    async def cli(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            str(EXE), *args, "--url", self.url, "--token", TOKEN,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode("utf-8"), err.decode("utf-8")


@pytest.fixture
async def stack(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    async with running(config(tmp_path, getattr(request, "param", 30.0))) as service:
        yield Stack(service)


@pytest.fixture
async def operator(stack: Stack) -> Any:
    async with operator_console(stack.url, TOKEN) as client:
        yield client


def permission(command: str = "ls", tool_use_id: str = "toolu_1") -> dict[str, Any]:
    return {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "Bash",
            "tool_input": {"command": command}, "tool_use_id": tool_use_id}


def strict_json(raw: bytes) -> Any:
    """What a vendor's parser accepts (RFC 8259): no NaN, no Infinity."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")
    return json.loads(raw, parse_constant=refuse)


# -- the operator CLI never lets request text drive the terminal ---------------------------------


async def test_pending_and_timeline_print_hostile_request_text_inert(stack: Stack, operator: ControlClient) -> None:
    hook = asyncio.create_task(stack.post(permission(HOSTILE)))
    (rid,) = await stack.held()
    code, out, err = await stack.cli("pending")
    assert code == 0, err
    assert rid in out and "option allow" in out
    assert not [c for c in RAW_CONTROLS if c in out], out
    # Shown, escaped, so the operator sees what the command really is.
    assert "rm -rf ~ \\x1b[2K\\x0d\\x1b[1Als -la" in out and "\\u202e" in out
    code, out, err = await stack.cli("pending", "--json")
    assert code == 0, err
    assert not [c for c in RAW_CONTROLS if c in out], out
    (request,) = [json.loads(line) for line in out.splitlines()]
    assert HOSTILE in request["data"]["prompt"]  # the same JSON value, only written inert
    await operator.send(RESPOND, SID, subject=rid, data={"answer": {"option": "deny", "text": "no\x1b[31m"}})
    await asyncio.wait_for(hook, 10)
    code, out, err = await stack.cli("timeline", SID)
    assert code == 0, err
    assert not [c for c in RAW_CONTROLS if c in out], out
    assert "\\x1b[2K" in out
    code, out, err = await stack.cli("timeline", SID, "--dag")
    assert code == 0 and not [c for c in RAW_CONTROLS if c in out], out


async def test_pending_lists_every_request_whatever_another_emitter_sent(stack: Stack, operator: ControlClient) -> None:
    # Any authenticated emitter can post a request with an odd payload; it must not hide the rest.
    odd = [{"kind": "permission", "prompt": "p", "options": "allow"},
           {"kind": "form", "prompt": "p", "fields": [1, "x", {"id": "a", "type": "select", "choices": "nope"}]},
           {"kind": "permission", "prompt": ["x"], "respond_via": "control", "expires_at": "2026-01-01T00:00:00"}]
    async with aiohttp.ClientSession() as http:
        for i, data in enumerate(odd, start=1):
            ev = {"aep": "0.1", "id": f"01JXODD0000000000000000{i:03d}", "type": "attention.requested",
                  "time": "2026-12-07T00:00:00.000Z", "source": "aep://h/agent/other/session/s9", "agent": "other",
                  "session": "s9", "seq": i, "epoch": 0, "data": data}
            async with http.post(f"{stack.url}/events", json=ev,
                                 headers={"Authorization": f"Bearer {TOKEN}", "AEP-Version": "0.1"}) as r:
                assert r.status == 202, await r.text()
    ask = {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "AskUserQuestion",
           "tool_use_id": "toolu_q", "tool_input": {"questions": [
               {"question": "Which database?", "header": "DB", "multiSelect": False,
                "options": [{"label": "Postgres"}, {"label": "SQLite"}]}]}}
    hook = asyncio.create_task(stack.post(ask))
    (rid,) = await stack.held()
    code, out, err = await stack.cli("pending")
    assert code == 0, err
    for i in range(1, 4):
        assert f"01JXODD0000000000000000{i:03d}" in out
    # A select field is answered with its choice ids: the operator has to see them (and the question).
    assert rid in out and "field 1: select (required) DB: Which database?; one of 1 (Postgres), 2 (SQLite)" in out
    code, out, err = await stack.cli("respond", rid, "--values", '{"1": "2"}')
    assert code == 0, err
    status, reply = await asyncio.wait_for(hook, 10)
    assert strict_json(reply)["hookSpecificOutput"]["decision"]["updatedInput"]["answers"] == {
        "Which database?": "SQLite"}


# -- every command gets exactly one decision ------------------------------------------------------


@pytest.mark.parametrize("option", [["allow"], {"id": "allow"}])
async def test_an_option_of_the_wrong_type_is_nacked_invalid_and_the_request_stays_pending(
        stack: Stack, operator: ControlClient, option: Any) -> None:
    hook = asyncio.create_task(stack.post(permission()))
    (rid,) = await stack.held()
    with pytest.raises(NackError) as info:
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"option": option}}, retries=0)
    assert info.value.reason == "invalid"  # a decision within the window, not a sender timeout
    ack = await operator.send(RESPOND, SID, subject=rid, data={"answer": {"option": "allow"}})
    assert ack["type"] == "control.accepted"
    status, reply = await asyncio.wait_for(hook, 10)
    assert strict_json(reply)["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
    assert "submit-error" not in json.dumps(stack.service.health.snapshot())


@pytest.mark.parametrize("option", [["allow"], {"id": "allow"}, 1])
def test_the_permission_validators_name_an_option_of_the_wrong_type(option: Any) -> None:
    # Every held permission and every tool gate checks answers with these; they say why, never raise.
    assert permission_validator(PERMISSION_OPTIONS)({"option": option}) == "option must be one of ['allow', 'deny']"
    assert gate_validator(PERMISSION_OPTIONS)({"option": option}) == "option must be one of ['allow', 'deny']"


class _Consumer:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def consume_each(self, batch: list[Any]) -> list[tuple[Any, list[Any]]]:
        self.events.extend(batch)
        return [(self, batch)]

    def deliver(self, events: list[Any], redelivery: bool = False) -> None:
        self.events.extend(events)


async def test_a_validator_that_raises_still_gets_a_decision_and_bad_ids_never_raise() -> None:
    router = ControlRouter(Health())
    consumer = _Consumer()
    router.register("agent-x", [RESPOND], consumer)
    pipeline = _Pipeline()

    def choke(answer: dict[str, Any]) -> str | None:
        raise TypeError("unhashable type: 'list'")

    hold = router.open("agent-x", "s1", [(pipeline, {"id": "req-1", "session": "s1"})], choke)
    assert hold is not None
    command = {"aep": "0.1", "id": "c1", "type": RESPOND, "source": "aep://ops/agent/op", "agent": "op",
               "session": "s1", "subject": "req-1", "data": {"answer": {"option": "allow"}}}
    (ack,) = await router.submit(command, "agent-x")
    assert ack["type"] == "control.rejected" and ack["data"]["reason"] == "invalid" and ack["cause"] == "c1"
    assert not hold.settled
    # Ids of the wrong type are a malformed command (counted), never an exception out of submit.
    for bad in ({**command, "id": ["c2"]}, {**command, "source": {"a": 1}}, {**command, "id": "c3", "session": ["s1"]}):
        assert await router.submit(bad, "agent-x") == []
    assert "submit-error" not in json.dumps(router.health.snapshot())


async def test_a_decision_that_failed_half_way_is_made_again_on_retransmission() -> None:
    router = ControlRouter(Health())
    consumer = _Consumer()
    router.register("agent-x", [RESPOND], consumer)
    failing = consumer.consume_each

    async def broken(batch: list[Any]) -> list[tuple[Any, list[Any]]]:
        consumer.consume_each = failing  # type: ignore[method-assign]  # fails once, then works
        raise OSError("disk full")

    consumer.consume_each = broken  # type: ignore[method-assign]
    command = {"aep": "0.1", "id": "c1", "type": RESPOND, "source": "aep://ops/agent/op", "agent": "op",
               "session": "s1", "subject": "gone", "data": {"answer": {"option": "allow"}}}
    assert await router.submit(command, "agent-x") == []  # never raises; shown in health
    # Not stuck as "still deciding": the sender's retry (same id) gets the one decision.
    (ack,) = await router.submit(command, "agent-x")
    assert ack["type"] == "control.rejected" and ack["data"]["reason"] == "refused" and ack["cause"] == "c1"
    assert await router.submit(command, "agent-x") == [ack]  # recorded: the same ack again


class _Pipeline:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def consume(self, batch: list[Any]) -> list[Any]:
        self.events.extend(batch)
        return batch


# -- what the vendor gets back is always JSON -----------------------------------------------------


@pytest.mark.parametrize("text", ["1e999", "nan", "-inf"])
async def test_an_answer_that_is_no_json_number_is_nacked_and_never_reaches_the_vendor(
        stack: Stack, operator: ControlClient, text: str) -> None:
    # "1e999" read as a number is infinite: it was acked accepted and reached Claude Code as
    # {"content":{"n":Infinity}}, which its parser refuses. It is no number (AEP-0006: invalid,
    # the request stays pending); a real one then answers it.
    elicitation = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "srv",
                   "elicitation_id": "e1", "message": "How many?",
                   "requested_schema": {"type": "object", "properties": {"n": {"type": "number"}}}}
    hook = asyncio.create_task(stack.post(elicitation))
    (rid,) = await stack.held()
    with pytest.raises(NackError) as info:
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"text": text}}, retries=0)
    assert info.value.reason == "invalid"
    ack = await operator.send(RESPOND, SID, subject=rid, data={"answer": {"text": "3"}})
    assert ack["type"] == "control.accepted"
    status, reply = await asyncio.wait_for(hook, 10)
    assert status == 200 and strict_json(reply)["hookSpecificOutput"]["content"] == {"n": 3}


def test_a_reply_holding_a_non_finite_number_is_refused_not_sent() -> None:
    # The last guard (a plug-in surface's reply, say): json_response never writes NaN/Infinity;
    # the hook server answers the neutral reply instead, with a reply-not-json incident.
    from aep_collector.receivers.hook_http import json_response

    with pytest.raises(ValueError):
        json_response({"content": {"n": float("inf")}})


# -- shutdown -------------------------------------------------------------------------------------


async def test_a_hook_that_arrives_once_shutdown_began_is_answered_at_once_not_held(
        stack: Stack, operator: ControlClient, tmp_path: Path) -> None:
    # The service frees every hold first, then stops the receivers one by one: a hook reaching a
    # receiver in between must not be held past its receiver's end (cut off, its request left open).
    assert stack.router.route_live("claude-code")
    await stack.router.shutdown()
    status, reply = await asyncio.wait_for(stack.post(permission(tool_use_id="toolu_late")), 10)
    assert (status, strict_json(reply)) == (200, {})
    assert not stack.router.holds
    (request,) = [e for e in read_jsonl(tmp_path / "logs" / "claude-code" / f"{SID}.jsonl")
                  if e["type"] == "attention.requested"]
    assert request["data"]["respond_via"] == ["oob"]  # honest: nobody can answer it over control now


# -- control.cancel stops a run whatever its held hook asks ---------------------------------------

ASK = {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "AskUserQuestion", "tool_use_id": "q1",
       "tool_input": {"questions": [{"question": "Which?", "options": [{"label": "a"}, {"label": "b"}]}]}}
ELICITATION = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "srv", "elicitation_id": "e1",
               "message": "Token?", "requested_schema": {"type": "object", "properties": {"t": {"type": "string"}}}}
STOP = {"continue": False, "stopReason": "Run cancelled via AEP control"}


@pytest.mark.parametrize("body,expected", [
    (ASK, {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {
        "behavior": "deny", "message": "Run cancelled via AEP control", "interrupt": True}}}),
    (ELICITATION, {**STOP, "hookSpecificOutput": {"hookEventName": "Elicitation", "action": "cancel"}}),
])
async def test_a_cancelled_run_held_on_a_question_is_stopped_not_handed_to_the_agents_dialog(
        stack: Stack, operator: ControlClient, tmp_path: Path, body: dict[str, Any], expected: dict[str, Any]) -> None:
    # Handing the question to Claude Code's own dialog ({}) would leave the run waiting for a human
    # the operator just said is not coming; a held permission is denied with interrupt, so are these.
    await stack.post({"session_id": SID, "hook_event_name": "UserPromptSubmit", "prompt": "go"})
    (run,) = {e["run"] for e in read_jsonl(tmp_path / "logs" / "claude-code" / f"{SID}.jsonl")
              if e["type"] == "run.started"}
    hook = asyncio.create_task(stack.post(body))
    (rid,) = await stack.held()
    ack = await operator.send("control.cancel", SID, run=run, data={"scope": "run"})
    assert ack["type"] == "control.accepted"
    status, reply = await asyncio.wait_for(hook, 10)
    assert (status, strict_json(reply)) == (200, expected)
    # This reply was the stop: the next hook runs normally.
    status, reply = await stack.post({"session_id": SID, "hook_event_name": "Notification", "message": "m"})
    assert strict_json(reply) == {}
    events = read_jsonl(tmp_path / "logs" / "claude-code" / f"{SID}.jsonl")
    assert [e["data"] for e in events if e["type"] == "attention.resolved" and e["subject"] == rid] == [
        {"resolution": "dismissed"}]
    assert len([e for e in events if e["type"] == "run.cancelled"]) == 1


async def test_a_refused_cancel_of_a_run_that_never_was_names_no_run(
        stack: Stack, operator: ControlClient, tmp_path: Path) -> None:
    # An ack carrying the command's run would put a run that never started into the session's log
    # (the ack may still carry the session's open run: run synthesis gives it to every event).
    await stack.post({"session_id": SID, "hook_event_name": "UserPromptSubmit", "prompt": "go"})
    with pytest.raises(NackError):
        await operator.send("control.cancel", SID, run="r_never_started", data={"scope": "run"}, retries=0)
    events = read_jsonl(tmp_path / "logs" / "claude-code" / f"{SID}.jsonl")
    (nack,) = [e for e in events if e["type"] == "control.rejected"]
    assert nack["cause"] and not any(e.get("run") == "r_never_started" for e in events)
