"""The held loops through a relay, with the official SDK as operator and the real vendor-side halves.

The collector runs in-process with its relay exporter; ``tests.relay_double`` is the relay;
``aep_sdk.aio.ControlClient`` is the operator. OpenCode and Kilo Code moments come from the real
plugin files under Node, pi's from the real extension, Hermes' through the real shim process.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline.control import RESPOND
from aep_collector.pipeline.validate import StreamValidator, envelope_errors

from tests.conftest import corpus
from tests.helpers import ROOT, running, timed_out_and_late_answer_refused
from tests.plugin_vendors_support import NODE, PLUGINS, KiloServer, config, node, scenario, step
from tests.relay_double import RelayDouble, wait_until

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

TOKEN = "plugin-vendors-token"
SID = "s_fix_1"
OPENCODE = corpus("mappings/opencode.json")["moments"]
KILO = corpus("mappings/kilocode.json")["moments"]
HERMES = corpus("mappings/hermes.json")["hooks"]
PI = corpus("mappings/pi.json")["moments"]


def stack(tmp_path: Path, relay: RelayDouble, **overrides: dict[str, Any]) -> Any:
    return running(config(tmp_path, extra_exporters={"relay": {"endpoint": relay.ws_url, "token": TOKEN,
                                                               "backoff_initial": 0.05, "backoff_max": 0.2}},
                          **overrides))


async def claimed(service: Any, relay: RelayDouble) -> None:
    await wait_until(lambda: service.health.snapshot()["relay"], "the relay hello to complete")
    await wait_until(lambda: relay.store_for(SID), "the session claim")


async def request_id(service: Any, relay: RelayDouble) -> str:
    def found() -> str | None:
        reqs = [e for e in relay.store_for(SID) if e["type"] == "attention.requested"]
        return reqs[-1]["id"] if reqs and service.host.control.holds else None
    return await wait_until(found, "the attention request to reach the relay and be held")


def jsonl(tmp_path: Path, agent: str) -> list[dict[str, Any]]:
    path = tmp_path / "logs" / agent / f"{SID}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_stream(events: list[dict[str, Any]]) -> None:
    v = StreamValidator()
    for e in events:
        assert envelope_errors(e) == [], e
        assert v.feed(e) == [], e


def plugin_run(service: Any, vendor: str, *names: str, **options: Any) -> Any:
    url = f"http://127.0.0.1:{service.receivers[vendor].port}/hook"
    moments = OPENCODE if vendor == "opencode" else KILO
    return node(PLUGINS[vendor], scenario(vendor, [step(moments[n]["input"]) for n in names], url, **options))


@pytest.mark.parametrize("vendor", list(PLUGINS))
@pytest.mark.parametrize(("answer", "status"), [({"option": "allow"}, "allow"), ({"option": "deny"}, "deny")])
async def test_permission_ask_answered_through_the_relay(tmp_path: Path, relay: RelayDouble, operator: Any,
                                                         vendor: str, answer: dict[str, Any], status: str) -> None:
    async with stack(tmp_path, relay) as service:
        await plugin_run(service, vendor, "session_created")
        await claimed(service, relay)
        held = asyncio.create_task(plugin_run(service, vendor, "permission_ask"))
        rid = await request_id(service, relay)
        ack = await operator.send(RESPOND, SID, subject=rid, data={"answer": answer})
        (done,) = (await asyncio.wait_for(held, 30))["steps"]
    assert ack["type"] == "control.accepted"
    assert done["threw"] is False and done["args"][1] == {"status": status}
    events = jsonl(tmp_path, vendor)
    assert [e["type"] for e in events] == ["session.started", "attention.requested", "control.accepted",
                                           "attention.answered", "attention.resolved"]
    _, req, acc, ans, res = events
    assert req["id"] == rid and req["data"]["respond_via"] == ["control"]
    assert acc["id"] == ack["id"] and ans["data"] == {"answer": answer, "via": "control"} and res["cause"] == ans["id"]
    check_stream(events)


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_permission_ask_timeout_through_the_relay(tmp_path: Path, relay: RelayDouble, operator: Any,
                                                        vendor: str) -> None:
    async with stack(tmp_path, relay, **{vendor: {"attention_timeout": 0.4}}) as service:
        await plugin_run(service, vendor, "session_created")
        await claimed(service, relay)
        (done,) = (await plugin_run(service, vendor, "permission_ask"))["steps"]
        assert done["args"][1] == {"status": "ask"}  # untouched: the vendor asks the user itself
        await timed_out_and_late_answer_refused(jsonl(tmp_path, vendor), operator, SID)
    check_stream(jsonl(tmp_path, vendor))


async def test_kilo_bus_ask_answered_through_the_relay_reaches_kilos_server(tmp_path: Path, relay: RelayDouble,
                                                                            operator: Any) -> None:
    async with KiloServer() as kilo, stack(tmp_path, relay) as service:
        plugin_input = {"serverUrl": kilo.url + "/", "directory": "/home/user/proj"}
        await plugin_run(service, "kilocode", "session_created", input=plugin_input)
        await claimed(service, relay)
        report = await plugin_run(service, "kilocode", "permission_asked", input=plugin_input)
        assert report["steps"][0]["threw"] is False  # the event hook is not held
        rid = await request_id(service, relay)
        ack = await operator.send(RESPOND, SID, subject=rid, data={"answer": {"text": "not on main"}})
        await kilo.called()
        await wait_until(lambda: [e for e in jsonl(tmp_path, "kilocode") if e["type"] == "attention.resolved"] or None,
                         "the answer's legs")
    assert ack["type"] == "control.accepted"
    assert kilo.calls == [("/permission/perm_1/reply", {"reply": "reject", "message": "not on main"},
                           "%2Fhome%2Fuser%2Fproj")]
    check_stream(jsonl(tmp_path, "kilocode"))


async def shim(base: str, body: dict[str, Any]) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aep_collector.pipeline.shim", "hermes", "--url", base, cwd=ROOT, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate(json.dumps(body).encode())
    assert proc.returncode == 0
    return json.loads(out)


async def test_hermes_gate_deny_through_the_relay_and_the_shim(tmp_path: Path, relay: RelayDouble,
                                                               operator: Any) -> None:
    async with stack(tmp_path, relay, hermes={"control": True}) as service:
        base = f"http://127.0.0.1:{service.receivers['hermes'].port}"
        assert await shim(base, HERMES["on_session_start"]["input"]) == {}
        await claimed(service, relay)
        held = asyncio.create_task(shim(base, HERMES["pre_tool_call"]["input"]))
        rid = await request_id(service, relay)
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"text": "run it in the sandbox"}})
        assert await asyncio.wait_for(held, 30) == {"action": "block", "message": "run it in the sandbox"}
        # Hermes then reports the blocked call: tool.denied by policy.
        assert await shim(base, HERMES["post_tool_call_blocked"]["input"] | {"extra": {
            **HERMES["post_tool_call_blocked"]["input"]["extra"], "tool_call_id": "tc_1"}}) == {}
    events = jsonl(tmp_path, "hermes")
    assert [e["type"] for e in events] == ["session.started", "tool.requested", "attention.requested",
                                           "control.accepted", "attention.answered", "attention.resolved",
                                           "tool.denied"]
    assert events[4]["data"]["answer"] == {"option": "deny", "text": "run it in the sandbox"}
    check_stream(events)


async def test_pi_gate_through_the_relay_and_the_extension(tmp_path: Path, relay: RelayDouble, operator: Any) -> None:
    env = {"AEP_PI_CONTROL": "1"}
    call = {"emit": "tool_call", "session": PI["tool_execution_start"]["input"]["session"],
            "event": {"type": "tool_call", "toolCallId": "call_1", "toolName": "bash", "input": {"command": "npm test"}}}
    async with stack(tmp_path, relay, pi={"control": True}) as service:
        env["AEP_PI_URL"] = f"http://127.0.0.1:{service.receivers['pi'].port}/hook"
        start = copy.deepcopy(PI["session_start"]["input"])
        await node("pi-extension.js", {"host": "pi", "steps": [{"emit": "session_start", "event": start["event"],
                                                                  "session": start["session"]}]}, env=env)
        await claimed(service, relay)
        held = asyncio.create_task(node("pi-extension.js", {"host": "pi", "steps": [call]}, env=env))
        rid = await request_id(service, relay)
        await operator.send(RESPOND, SID, subject=rid, data={"answer": {"option": "deny"}})
        (handler,) = (await asyncio.wait_for(held, 30))["steps"][0]["handlers"]
    assert handler["returned"] == {"block": True, "reason": "Denied by the operator (AEP)."}
    check_stream(jsonl(tmp_path, "pi"))


@pytest.mark.parametrize(("vendor", "overrides", "declared"), [
    ("opencode", {}, [RESPOND]), ("kilocode", {}, [RESPOND]), ("cline", {}, []),
    ("hermes", {}, []), ("hermes", {"control": True}, [RESPOND]),
    ("pi", {}, []), ("pi", {"control": True}, [RESPOND]),
], ids=["opencode", "kilocode", "cline", "hermes-off", "hermes-on", "pi-off", "pi-on"])
async def test_the_hello_declares_exactly_what_is_honoured(tmp_path: Path, relay: RelayDouble, vendor: str,
                                                           overrides: dict[str, Any], declared: list[str]) -> None:
    first = {"opencode": OPENCODE["session_created"]["input"], "kilocode": KILO["session_created"]["input"],
             "cline": corpus("mappings/cline.json")["hooks"]["agent_start"]["input"],
             "hermes": HERMES["on_session_start"]["input"], "pi": PI["session_start"]["input"]}[vendor]
    async with stack(tmp_path, relay, **{vendor: overrides}) as service:
        import aiohttp

        url = f"http://127.0.0.1:{service.receivers[vendor].port}/hook"
        async with aiohttp.ClientSession() as s, s.post(url, json=first) as r:
            assert r.status == 200
        hellos = await wait_until(lambda: relay.hellos(vendor), "the agent's hello")
    assert hellos[0]["capabilities"]["control"]["accepts"] == declared
