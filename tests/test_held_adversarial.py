"""Held requests against an unusual vendor and a demanding operator.

A real collector runs in-process with its relay role; the official SDK's ``ControlClient`` is the
operator; hooks arrive over real HTTP with the bodies the real vendor CLIs send.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.pipeline.control import RESPOND
from aep_sdk.aio import ControlClient
from aep_sdk.control import NackError

from tests.helpers import ROOT, base_config, held_requests, operator_console, read_jsonl, running

TOKEN = "held-adversarial-token"
SID = "held-adv"


def config(tmp_path: Path) -> dict[str, Any]:
    cfg = base_config(tmp_path, ceiling="full", extra_exporters={
        "relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN, "max_capture": "full"}})
    cfg["receivers"]["claude_code"]["attention_timeout"] = 30.0
    return cfg


class Stack:
    def __init__(self, service: Any, tmp_path: Path) -> None:
        self.service, self.tmp_path = service, tmp_path
        self.router = service.host.control
        self.url = service.exporters["relay_server"].url
        self.hook = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"

    async def post(self, body: dict[str, Any]) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.post(self.hook, json=body) as r:
            raw = await r.read()
            return r.status, json.loads(raw) if raw else None

    def events(self) -> list[dict[str, Any]]:
        return read_jsonl(self.tmp_path / "logs" / "claude-code" / f"{SID}.jsonl")


@pytest.fixture
async def stack(tmp_path: Path) -> Any:
    async with running(config(tmp_path)) as service:
        yield Stack(service, tmp_path)


@pytest.fixture
async def operator(stack: Stack) -> Any:
    async with operator_console(stack.url, TOKEN) as client:
        yield client


# Claude Code 2.1.328 builds the PermissionRequest hook input from the common fields, tool_name,
# tool_input and permission_suggestions: no tool_use_id (its PostToolUse, PostToolUseFailure and
# PermissionDenied inputs do carry one).
PERMISSION = {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "Bash",
              "tool_input": {"command": "touch x", "description": "make x"}, "permission_mode": "default",
              "permission_suggestions": []}


@pytest.mark.parametrize("after", ["PostToolUse", "PostToolUseFailure", "PermissionDenied"])
async def test_a_claude_code_card_is_stood_down_when_its_call_goes_on_without_it(
        stack: Stack, operator: ControlClient, after: str) -> None:
    # The user answered in Claude Code's own dialog (it runs the hook side by side): the call went
    # on. The operator's card is moot; it must not stay pending, nor take an allow as "accepted".
    hook = asyncio.create_task(stack.post(PERMISSION))
    (rid,) = await held_requests(stack.router)
    report = {"session_id": SID, "hook_event_name": after, "tool_name": "Bash",
              "tool_input": PERMISSION["tool_input"], "tool_use_id": "toolu_01"}
    assert await stack.post(report) == (200, {})
    assert await asyncio.wait_for(hook, 10) == (200, {})
    assert stack.router.holds == {}
    with pytest.raises(NackError) as info:
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"option": "allow"}}, retries=0)
    assert info.value.reason == "refused"
    assert [e["data"] for e in stack.events() if e["type"] == "attention.resolved"] == [{"resolution": "dismissed"}]


ELICITATION = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "deploy", "elicitation_id": "e1",
               "mode": "form", "message": "How many replicas?", "requested_schema": {
                   "type": "object", "required": ["replicas"],
                   "properties": {"replicas": {"type": "integer", "minimum": 1, "title": "Replicas"}}}}


@pytest.mark.parametrize("answer", [{"values": {"replicas": 2.5}}, {"text": "2.5"}])
async def test_an_integer_the_mcp_server_asks_for_is_never_answered_with_a_fraction(
        stack: Stack, operator: ControlClient, answer: dict[str, Any]) -> None:
    # The form field is a `number` (AEP-0006 has no integer type), but the MCP server validates
    # the content against its own schema: 2.5 accepted here would be refused there, after the
    # operator was told the answer went through.
    hook = asyncio.create_task(stack.post(ELICITATION))
    (rid,) = await held_requests(stack.router)
    with pytest.raises(NackError) as info:
        await operator.send(RESPOND, SID, subject=rid, data={"answer": answer}, retries=0)
    assert info.value.reason == "invalid" and "whole number" in str(info.value)
    assert not hook.done()
    ack = await operator.send(RESPOND, SID, subject=rid, data={"answer": {"values": {"replicas": 3}}})
    assert ack["type"] == "control.accepted"
    status, reply = await asyncio.wait_for(hook, 10)
    assert (status, reply["hookSpecificOutput"]["content"]) == (200, {"replicas": 3})


# MCP elicitation multi-selects (the schema Claude Code 2.1.328 takes): the untitled one lists its
# values in `items.enum`, the titled one its `{const, title}` pairs in `items.anyOf`.
MULTI = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "deploy", "elicitation_id": "e2",
         "mode": "form", "message": "Where?", "requested_schema": {"type": "object", "required": ["regions"], "properties": {
             "regions": {"type": "array", "title": "Regions", "items": {"anyOf": [
                 {"const": "use1", "title": "US East"}, {"const": "euw1", "title": "EU West"}]}},
             "tiers": {"type": "array", "items": {"type": "string", "enum": ["gold", "silver"]}}}}}


async def test_an_mcp_multi_select_is_offered_as_its_choices_and_answered_with_an_array(
        stack: Stack, operator: ControlClient) -> None:
    hook = asyncio.create_task(stack.post(MULTI))
    (rid,) = await held_requests(stack.router)
    (request,) = [e for e in stack.events() if e["type"] == "attention.requested"]
    assert request["data"]["fields"] == [
        {"id": "regions", "type": "select", "multi": True, "label": "Regions", "required": True,
         "choices": [{"id": "use1", "label": "US East"}, {"id": "euw1", "label": "EU West"}]},
        {"id": "tiers", "type": "select", "multi": True, "label": "tiers", "required": False,
         "choices": [{"id": "gold", "label": "gold"}, {"id": "silver", "label": "silver"}]}]
    with pytest.raises(NackError) as info:  # closed: a value the server does not offer is refused
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"values": {"regions": ["mars"]}}}, retries=0)
    assert info.value.reason == "invalid"
    # One choice given bare is still a selection: the server reads an array.
    await operator.send(RESPOND, SID, subject=rid, data={"answer": {"values": {"regions": "euw1", "tiers": "gold"}}})
    status, reply = await asyncio.wait_for(hook, 10)
    assert (status, reply["hookSpecificOutput"]["content"]) == (200, {"regions": ["euw1"], "tiers": ["gold"]})


BOUNDED = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "deploy", "elicitation_id": "e3",
           "mode": "form", "message": "Release", "requested_schema": {"type": "object", "required": ["tag"], "properties": {
               "tag": {"type": "string", "minLength": 2, "maxLength": 8},
               "regions": {"type": "array", "minItems": 1, "maxItems": 2,
                           "items": {"type": "string", "enum": ["use1", "euw1", "aps1"]}}}}}


@pytest.mark.parametrize("values,problem", [
    ({"tag": "v"}, "at least 2 characters"),
    ({"tag": "v1.2.3-rc.1"}, "at most 8 characters"),
    ({"tag": "v1", "regions": ["use1", "euw1", "aps1"]}, "at most 2 choices"),
])
async def test_an_answer_outside_the_mcp_schemas_bounds_is_nacked_not_sent(
        stack: Stack, operator: ControlClient, values: dict[str, Any], problem: str) -> None:
    # The MCP server checks the content against the schema it sent: an answer it would refuse is
    # invalid here (the request stays pending), not accepted and then lost.
    hook = asyncio.create_task(stack.post(BOUNDED))
    (rid,) = await held_requests(stack.router)
    with pytest.raises(NackError) as info:
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"values": values}}, retries=0)
    assert info.value.reason == "invalid" and problem in str(info.value)
    await operator.send(RESPOND, SID, subject=rid, data={"answer": {"values": {"tag": "v1", "regions": ["aps1"]}}})
    status, reply = await asyncio.wait_for(hook, 10)
    assert (status, reply["hookSpecificOutput"]["content"]) == (200, {"tag": "v1", "regions": ["aps1"]})


ASK = {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "AskUserQuestion",
       "permission_mode": "default", "tool_input": {"questions": [
           {"question": "Which database?", "header": "DB", "multiSelect": False,
            "options": [{"label": "Postgres"}, {"label": "SQLite"}]}]}}


async def test_a_question_answered_in_claude_codes_own_dialog_stands_the_operators_form_down(
        stack: Stack, operator: ControlClient) -> None:
    # The tool runs with the user's answers added to its input: its PostToolUse names the same
    # questions, not the same input.
    hook = asyncio.create_task(stack.post(ASK))
    (rid,) = await held_requests(stack.router)
    ran = {**ASK["tool_input"], "answers": {"Which database?": "SQLite"}}
    report = {"session_id": SID, "hook_event_name": "PostToolUse", "tool_name": "AskUserQuestion",
              "tool_input": ran, "tool_response": {}, "tool_use_id": "toolu_02"}
    assert await stack.post(report) == (200, {})
    assert await asyncio.wait_for(hook, 10) == (200, {})
    with pytest.raises(NackError) as info:
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"values": {"1": "1"}}}, retries=0)
    assert info.value.reason == "refused"
    assert [e["data"] for e in stack.events() if e["type"] == "attention.resolved"] == [{"resolution": "dismissed"}]


URL_ELICITATION = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "github",
                   "elicitation_id": "e-url", "mode": "url", "message": "Sign in to GitHub",
                   "url": "https://github.com/login/oauth/authorize?state=abc"}


async def test_a_url_elicitation_is_left_to_the_user_it_sends_to_a_url(stack: Stack, operator: ControlClient) -> None:
    # Claude Code 2.1.328 hands a hook's accept straight to the MCP server and never shows the URL:
    # an operator's accept would claim a sign-in nobody made. Only the user can open it: not held.
    assert await asyncio.wait_for(stack.post(URL_ELICITATION), 10) == (200, {})
    assert stack.router.holds == {}
    (request,) = [e for e in stack.events() if e["type"] == "attention.requested"]
    assert request["data"]["respond_via"] == ["oob"] and "expires_at" not in request["data"]
    result = {"session_id": SID, "hook_event_name": "ElicitationResult", "mcp_server_name": "github",
              "elicitation_id": "e-url", "mode": "url", "action": "accept"}
    assert await stack.post(result) == (200, {})
    legs = [(e["type"], e["data"].get("via") or e["data"].get("resolution")) for e in stack.events()
            if e.get("subject") == request["id"]]
    assert legs == [("attention.answered", "oob"), ("attention.resolved", "answered")]


OPTIONAL = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "deploy", "elicitation_id": "e4",
            "mode": "form", "message": "Deploy", "requested_schema": {"type": "object", "required": ["env"], "properties": {
                "env": {"type": "string", "enum": ["stg", "prd"]},
                "replicas": {"type": "integer"}, "reason": {"type": "string"}, "dry": {"type": "boolean"},
                "regions": {"type": "array", "minItems": 1, "items": {"type": "string", "enum": ["use1", "euw1"]}}}}}


async def test_optional_fields_left_blank_are_left_out_of_the_content(stack: Stack, operator: ControlClient) -> None:
    # A console that sends every field, blank ones as null, "" or []: the form takes that as "no
    # answer" for an optional field, and so must the MCP server, which refuses null for a string,
    # "" for an integer and [] below minItems. Left out, the property is simply not answered.
    hook = asyncio.create_task(stack.post(OPTIONAL))
    (rid,) = await held_requests(stack.router)
    values = {"env": "prd", "replicas": "", "reason": None, "dry": False, "regions": []}
    ack = await operator.send(RESPOND, SID, subject=rid, data={"answer": {"values": values}})
    assert ack["type"] == "control.accepted"
    status, reply = await asyncio.wait_for(hook, 10)
    assert (status, reply["hookSpecificOutput"]["content"]) == (200, {"env": "prd", "dry": False})


# -- Codex: through the real shim, as Codex runs it per hook firing -----------------------------------


async def shim(port: int, vendor: str, event: str, body: dict[str, Any]) -> tuple[int, bytes]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aep_collector.pipeline.shim", vendor, event, "--url", f"http://127.0.0.1:{port}",
        cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate(json.dumps(body).encode())
    return proc.returncode or 0, out


CODEX_PERMISSION = {"hook_event_name": "PermissionRequest", "session_id": SID, "turn_id": "t1", "cwd": "/w",
                    "model": "m", "permission_mode": "default", "transcript_path": None, "tool_name": "Bash",
                    "tool_input": {"command": "rm -rf build"}}


async def test_a_codex_session_ending_while_a_card_is_held_closes_it_before_session_ended(tmp_path: Path) -> None:
    # Codex 0.169 fires SessionEnd (mapped to session.ended): nothing may be left open at it
    # (AEP-0002 §7.1), and the held hook is freed with no decision.
    async with running(base_config(tmp_path, receivers={"codex": {"endpoint": "127.0.0.1:0"}})) as service:
        service.host.control.set_route("codex", True)
        port = service.receivers["codex"].port
        held = asyncio.create_task(shim(port, "codex", "PermissionRequest", CODEX_PERMISSION))
        (rid,) = await held_requests(service.host.control)
        end = {"hook_event_name": "SessionEnd", "session_id": SID, "cwd": "/w", "reason": "exit"}
        assert await asyncio.wait_for(shim(port, "codex", "SessionEnd", end), 15) == (0, b"{}")
        assert await asyncio.wait_for(held, 15) == (0, b"{}")
        assert service.host.control.holds == {}
    events = read_jsonl(tmp_path / "logs" / "codex" / f"{SID}.jsonl")
    assert [(e["type"], e.get("subject")) for e in events] == [
        ("attention.requested", "Bash"), ("attention.resolved", rid), ("session.ended", None)]


TOKEN_ASK = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "vault", "elicitation_id": "e5",
             "mode": "form", "message": "Which token?", "requested_schema": {
                 "type": "object", "required": ["token"], "properties": {"token": {"type": "string"}}}}
ONE_QUESTION = {**ASK, "tool_input": {"questions": [{**ASK["tool_input"]["questions"][0]}]}}


@pytest.mark.parametrize("body", [TOKEN_ASK, ONE_QUESTION], ids=["elicitation", "ask-user-question"])
async def test_a_permission_answer_sent_to_a_question_is_nacked_not_taken_as_its_answer(
        stack: Stack, operator: ControlClient, body: dict[str, Any]) -> None:
    # `respond --allow` on the wrong request: option "allow" names none of this form's choices.
    # Taken as free text, the agent was told the user answered "allow" (or that the token is
    # "allow"). An option must be one the request offers; words go as text.
    hook = asyncio.create_task(stack.post(body))
    (rid,) = await held_requests(stack.router)
    with pytest.raises(NackError) as info:
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"option": "allow"}}, retries=0)
    assert info.value.reason == "invalid"
    assert not hook.done()
    await operator.send(RESPOND, SID, subject=rid, data={"answer": {"text": "hunter2"}})
    status, reply = await asyncio.wait_for(hook, 10)
    out = reply["hookSpecificOutput"]
    assert status == 200 and (out.get("content") or out["decision"]["updatedInput"]["answers"]) in (
        {"token": "hunter2"}, {"Which database?": "hunter2"})
