"""Codex and Qwen Code held permission cards through a relay, with the official SDK as operator.

The collector runs in-process with its real relay exporter; ``tests.relay_double`` is the relay;
``aep_sdk.aio.ControlClient`` is the operator. Codex hooks come through the real shim process,
Qwen Code's over HTTP. The hellos show ``control.accepts`` exactly as each receiver's gates are.
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
from aep_collector.pipeline.validate import StreamValidator, envelope_errors
from aep_collector.receivers.hook_vendors import codex, qwen_code

from tests.helpers import ROOT, base_config, read_jsonl, running, timed_out_and_late_answer_refused
from tests.hook_vendors_support import AGENTS, POSTURES
from tests.relay_double import RelayDouble, wait_until

TOKEN = "hook-vendors-token"
SID = "relay-sess-1"
START = {"codex": {"hook_event_name": "SessionStart", "session_id": SID, "source": "startup", "model": "gpt-5"},
         "qwen_code": {"hook_event_name": "SessionStart", "session_id": SID, "source": "startup"}}
PERMISSION = {
    "codex": {"hook_event_name": "PermissionRequest", "session_id": SID, "turn_id": "t1", "tool_name": "shell",
              "tool_input": {"command": "rm -rf build", "description": "clean build dir"}},
    "qwen_code": {"hook_event_name": "PermissionRequest", "session_id": SID, "tool_name": "Bash",
                  "tool_input": {"command": "rm -rf build"}, "permission_mode": "default"},
}
REPLY = {"codex": codex.permission_reply, "qwen_code": qwen_code.permission_reply}


class Stack:
    def __init__(self, service: Any, relay: RelayDouble, tmp_path: Path, rtype: str) -> None:
        self.service, self.relay, self.tmp_path, self.rtype = service, relay, tmp_path, rtype
        self.agent = AGENTS[rtype]
        self.base = f"http://127.0.0.1:{service.receivers[rtype].port}"

    async def hook(self, body: dict[str, Any]) -> Any:
        """Deliver one hook the way the vendor does: the shim for Codex, HTTP for Qwen Code."""
        if self.rtype == "codex":
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "aep_collector.pipeline.shim", "codex", body["hook_event_name"], "--url", self.base,
                cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate(json.dumps(body).encode())
            assert proc.returncode == 0
            return json.loads(out)
        async with aiohttp.ClientSession() as s, s.post(self.base + "/hook", json=body) as r:
            assert r.status == 200
            return await r.json()

    async def request_id(self) -> str:
        def found() -> str | None:
            reqs = [e for e in self.relay.store_for(SID) if e["type"] == "attention.requested"]
            return reqs[0]["id"] if reqs and self.service.host.control.holds else None
        return await wait_until(found, "the attention request to reach the relay and be held")

    def jsonl(self) -> list[dict[str, Any]]:
        return read_jsonl(self.tmp_path / "logs" / self.agent / f"{SID}.jsonl")


async def open_stack(tmp_path: Path, relay: RelayDouble, rtype: str, **cfg: Any) -> Any:
    config = base_config(tmp_path, receivers={rtype: {"endpoint": "127.0.0.1:0", **cfg}},
                         extra_exporters={"relay": {"endpoint": relay.ws_url, "token": TOKEN,
                                                    "backoff_initial": 0.05, "backoff_max": 0.2}})
    return running(config)


async def started(service: Any, relay: RelayDouble, tmp_path: Path, rtype: str) -> Stack:
    st = Stack(service, relay, tmp_path, rtype)
    # The relay routes a command only to the connection that claimed the session.
    assert await st.hook(START[rtype]) == {}
    await wait_until(lambda: service.health.snapshot()["relay"], "the relay hello to complete")
    await wait_until(lambda: relay.store_for(SID), "the session claim")
    return st


def check_stream(events: list[dict[str, Any]]) -> None:
    v = StreamValidator()
    for e in events:
        assert envelope_errors(e) == [], e
        assert v.feed(e) == [], e


@pytest.mark.parametrize("rtype", ["codex", "qwen_code"])
async def test_allow_through_the_relay(tmp_path: Path, relay: RelayDouble, operator: Any, rtype: str) -> None:
    async with await open_stack(tmp_path, relay, rtype) as service:
        st = await started(service, relay, tmp_path, rtype)
        hook = asyncio.create_task(st.hook(PERMISSION[rtype]))
        rid = await st.request_id()
        ack = await operator.send(RESPOND, SID, subject=rid, data={"answer": {"option": "allow"}})
        assert await asyncio.wait_for(hook, 15) == REPLY[rtype]("allow")
    assert ack["type"] == "control.accepted"
    events = st.jsonl()
    assert [e["type"] for e in events] == ["session.started", "attention.requested", "control.accepted",
                                           "attention.answered", "attention.resolved"]
    _, req, acc, ans, res = events
    assert req["id"] == rid and req["data"]["respond_via"] == ["control"]
    assert acc["id"] == ack["id"] and ans["cause"] == ack["cause"] and res["cause"] == ans["id"]
    assert ans["data"] == {"answer": {"option": "allow"}, "via": "control"}
    check_stream(events)


@pytest.mark.parametrize("rtype", ["codex", "qwen_code"])
async def test_timeout_through_the_relay(tmp_path: Path, relay: RelayDouble, operator: Any, rtype: str) -> None:
    async with await open_stack(tmp_path, relay, rtype, attention_timeout=0.4) as service:
        st = await started(service, relay, tmp_path, rtype)
        assert await asyncio.wait_for(st.hook(PERMISSION[rtype]), 15) == {}
        await timed_out_and_late_answer_refused(st.jsonl(), operator, SID)
    check_stream(st.jsonl())


@pytest.mark.parametrize("rtype,cfg,declared", POSTURES)
async def test_the_hello_declares_exactly_the_gates_that_are_on(tmp_path: Path, relay: RelayDouble, rtype: str,
                                                                cfg: dict[str, Any],
                                                                declared: list[str] | None) -> None:
    body = {"hook_event_name": "SessionStart", "session_id": SID, "source": "startup",
            "conversationId": SID, "stepIdx": 0, "toolCall": {"name": "view_file", "args": {}}}
    hook = "?hook=PreToolUse" if rtype == "antigravity" else ""
    async with await open_stack(tmp_path, relay, rtype, **cfg) as service:
        url = f"http://127.0.0.1:{service.receivers[rtype].port}/hook{hook}"
        async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
            assert r.status == 200
        hellos = await wait_until(lambda: relay.hellos(AGENTS[rtype]), "the agent's hello")
    control = hellos[0]["capabilities"].get("control")
    if declared is None:
        assert control is None  # observe-only: no control block at all
    else:
        assert control["accepts"] == declared
