"""Control postures driven through the control router as a duplex exporter would drive it.

OpenCode and Kilo Code hold ``permission.ask`` (allow, deny, text, invalid, timeout, dismissal,
hang-up); Kilo >=7.4.6 bus asks are answered over a stand-in Kilo server's reply routes; the
Hermes and pi gates on and off. Commands are built by the official SDK's envelope builder.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import aiohttp
import pytest
from aep_collector.pipeline.control import RESPOND
from aep_collector.receivers.held import GONE_POLL

from tests.conftest import corpus
from tests.helpers import running
from tests.plugin_vendors_support import Env, KiloServer, config, headers, respond

OPENCODE = corpus("mappings/opencode.json")["moments"]
KILO = corpus("mappings/kilocode.json")["moments"]
HERMES = corpus("mappings/hermes.json")["hooks"]
PI = corpus("mappings/pi.json")["moments"]
SID = "s_fix_1"


def ask(vendor: str = "opencode", pid: str = "perm_1") -> dict[str, Any]:
    body = copy.deepcopy(OPENCODE["permission_ask"]["input"])
    body["permission"]["id"] = pid
    return body


@pytest.fixture
async def env(tmp_path, request):
    overrides = getattr(request, "param", {})
    async with running(config(tmp_path, **overrides)) as service:
        e = Env(service, tmp_path)
        for agent in ("opencode", "kilocode", "hermes", "pi"):
            e.router.set_route(agent, True)
        yield e


async def answer_held(env: Env, vendor: str, body: Any, **answer: Any) -> tuple[str, dict[str, Any], Any]:
    task = asyncio.create_task(env.post(vendor, body))
    (rid,) = await env.held()
    command = respond(rid, SID, **answer)
    await env.router.submit(command, vendor)
    status, reply = await asyncio.wait_for(task, 10)
    assert status == 200
    return rid, command, reply


def legs(env: Env, agent: str, rid: str) -> list[tuple[str, Any]]:
    return [(e["type"], e["data"]) for e in env.session(agent, SID) if e.get("subject") == rid]


# --- OpenCode and Kilo <=7.4.5: the held permission.ask -----------------------------------------------


@pytest.mark.parametrize("vendor", ["opencode", "kilocode"])
async def test_allow_sets_the_status_and_records_the_loop(env: Env, vendor: str) -> None:
    rid, command, reply = await answer_held(env, vendor, ask(), option="allow")
    assert reply == {"status": "allow"}
    events = env.session(vendor, SID)
    request = next(e for e in events if e["id"] == rid)
    expected = copy.deepcopy(OPENCODE["permission_ask"]["expected"]["data"])  # respond_via control: a live route
    data = dict(request["data"])
    assert isinstance(data.pop("expires_at"), str)  # a held request says when the hold gives up
    assert data == expected and request["subject"] == "bash" and request["severity"] == "notice"
    types = [e["type"] for e in events]
    assert types == ["attention.requested", "control.accepted", "attention.answered", "attention.resolved"]
    answered = events[2]
    assert answered["data"] == {"answer": {"option": "allow"}, "via": "control"} and answered["cause"] == command["id"]
    assert events[3]["cause"] == answered["id"] and events[3]["data"]["resolution"] == "answered"
    assert env.router.holds == {}


@pytest.mark.parametrize("vendor", ["opencode", "kilocode"])
@pytest.mark.parametrize(("answer", "status", "recorded"), [
    ({"option": "deny"}, "deny", {"option": "deny"}),
    ({"text": " ALLOW "}, "allow", {"option": "allow"}),
    ({"text": "Deny"}, "deny", {"option": "deny"}),
    ({"text": "yes please, allow it"}, "deny", {"option": "deny", "text": "yes please, allow it"}),
    ({}, "deny", {"option": "deny"}),
], ids=["deny", "allow-word", "deny-label", "free-text-never-grants", "empty"])
async def test_answers_follow_aep_0008(env: Env, vendor: str, answer: dict[str, Any], status: str,
                                       recorded: dict[str, Any]) -> None:
    rid, _, reply = await answer_held(env, vendor, ask(), **answer)
    assert reply == {"status": status}
    (answered,) = [e for e in env.session(vendor, SID) if e["type"] == "attention.answered"]
    assert answered["data"]["answer"] == recorded


async def test_a_foreign_option_is_invalid_and_the_ask_stays_held(env: Env) -> None:
    task = asyncio.create_task(env.post("opencode", ask()))
    (rid,) = await env.held()
    bad = respond(rid, SID, option="always")
    await env.router.submit(bad, "opencode")
    (nack,) = [e for e in env.session("opencode", SID) if e["type"] == "control.rejected"]
    assert nack["cause"] == bad["id"] and nack["data"]["reason"] == "invalid"
    assert not task.done() and rid in env.router.holds
    await env.router.submit(respond(rid, SID, option="allow"), "opencode")
    assert await asyncio.wait_for(task, 10) == (200, {"status": "allow"})


@pytest.mark.parametrize("env", [{"opencode": {"attention_timeout": 0.3}}], indirect=True)
async def test_timeout_leaves_the_output_untouched(env: Env) -> None:
    assert await env.post("opencode", ask()) == (200, {})
    events = env.session("opencode", SID)
    rid = next(e["id"] for e in events if e["type"] == "attention.requested")
    (timeout,) = [e for e in events if e["type"] == "attention.timeout"]
    assert timeout["subject"] == rid and timeout["cause"] == rid
    late = respond(rid, SID, option="allow")
    await env.router.submit(late, "opencode")
    assert env.session("opencode", SID)[-1]["data"]["reason"] == "refused"


async def test_without_a_route_nothing_is_held_and_the_card_says_oob(env: Env) -> None:
    env.router.set_route("opencode", False)
    assert await env.post("opencode", ask()) == (200, {})
    (request,) = env.session("opencode", SID)
    assert request["data"]["respond_via"] == ["oob"] and env.router.holds == {}


async def test_session_deleted_dismisses_the_held_ask_before_session_ended(env: Env) -> None:
    task = asyncio.create_task(env.post("opencode", ask()))
    (rid,) = await env.held()
    deleted = OPENCODE["session_deleted"]["input"]
    assert await env.post("opencode", deleted) == (200, {})
    assert await asyncio.wait_for(task, 10) == (200, {})
    types = [(e["type"], e.get("subject")) for e in env.session("opencode", SID)]
    assert types == [("attention.requested", "bash"), ("attention.resolved", rid), ("session.ended", None)]


async def test_a_plugin_that_hangs_up_dismisses_the_ask(env: Env) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as s:
        with pytest.raises(TimeoutError):
            await s.post(env.url("opencode"), json=ask())
    for _ in range(500):
        if not env.router.holds:
            break
        await asyncio.sleep(0.01)
    assert env.router.holds == {}
    request, resolved = env.session("opencode", SID)
    assert resolved["type"] == "attention.resolved" and resolved["data"] == {"resolution": "dismissed"}
    late = respond(request["id"], SID, option="allow")
    await env.router.submit(late, "opencode")
    assert env.session("opencode", SID)[-1]["data"]["reason"] == "refused"


async def test_the_vendor_echo_of_an_answered_ask_is_dropped(env: Env) -> None:
    rid, _, _ = await answer_held(env, "opencode", ask(), option="deny")
    before = len(env.session("opencode", SID))
    replied = OPENCODE["permission_replied"]["input"]
    assert await env.post("opencode", replied) == (200, {})
    assert len(env.session("opencode", SID)) == before


# --- Kilo >=7.4.6: bus asks answered over the vendor's reply routes --------------------------------------


async def route_answer(env: Env, server: KiloServer, moment: str, vendor: str = "kilocode",
                       **answer: Any) -> tuple[str, Any]:
    status, reply = await env.post(vendor, KILO[moment]["input"], headers=headers(server))
    assert (status, reply) == (200, {})  # the plugin's event hook is answered at once
    (rid,) = await env.held()
    await env.router.submit(respond(rid, SID, **answer), vendor)
    return rid, reply


async def test_opencode_bus_ask_is_answered_over_the_same_route(env: Env) -> None:
    # OpenCode 1.18.33 asks on the bus and takes the answer on Kilo's route (tried by hand, live).
    async with KiloServer() as server:
        rid, _ = await route_answer(env, server, "permission_asked", vendor="opencode", option="once")
        await server.called()
    assert server.calls == [("/permission/perm_1/reply", {"reply": "once"},
                             "%2Fhome%2Fuser%2Fproj%20%C3%BC")]
    request = next(e for e in env.session("opencode", SID) if e["id"] == rid)
    assert request["data"]["respond_via"] == ["control", "oob"]


@pytest.mark.parametrize(("answer", "body", "recorded"), [
    ({"option": "once"}, {"reply": "once"}, {"option": "once"}),
    ({"text": "always"}, {"reply": "always"}, {"option": "always"}),
    ({"text": "not in prod"}, {"reply": "reject", "message": "not in prod"},
     {"option": "reject", "text": "not in prod"}),
], ids=["once", "option-word", "free-text-rejects-with-the-message"])
async def test_kilo_permission_asked_is_answered_over_the_reply_route(env: Env, answer: dict[str, Any],
                                                                      body: dict[str, Any], recorded: Any) -> None:
    async with KiloServer() as server:
        rid, _ = await route_answer(env, server, "permission_asked", **answer)
        await server.called()
        for _ in range(500):
            if not env.router.holds and any(e["type"] == "attention.resolved" for e in env.session("kilocode", SID)):
                break
            await asyncio.sleep(0.01)
    assert server.calls == [("/permission/perm_1/reply", body, "%2Fhome%2Fuser%2Fproj%20%C3%BC")]
    events = env.session("kilocode", SID)
    request = next(e for e in events if e["id"] == rid)
    assert request["data"]["options"] == KILO["permission_asked"]["expected"]["data"]["options"]
    assert request["data"]["respond_via"] == ["control", "oob"]  # Kilo shows its own prompt meanwhile
    assert legs(env, "kilocode", rid)[-2:] == [("attention.answered", {"answer": recorded, "via": "control"}),
                                               ("attention.resolved", legs(env, "kilocode", rid)[-1][1])]
    # Kilo publishes permission.replied after our POST: the echo adds nothing.
    before = len(env.session("kilocode", SID))
    await env.post("kilocode", KILO["permission_replied"]["input"])
    assert len(env.session("kilocode", SID)) == before


async def test_kilo_background_hold_outlives_the_plugins_closed_post(env: Env) -> None:
    # The plugin's event POST is answered at once and its connection closes; the answer goes to
    # Kilo's own server, so that closed connection is not the vendor hanging up.
    async with KiloServer() as server:
        assert await env.post("kilocode", KILO["permission_asked"]["input"], headers=headers(server)) == (200, {})
        (rid,) = await env.held()
        await asyncio.sleep(3 * GONE_POLL)  # several hang-up checks after the plugin's connection closed
        assert list(env.router.holds) == [rid]
        await env.router.submit(respond(rid, SID, option="once"), "kilocode")
        await server.called()
    assert server.calls[0][1] == {"reply": "once"}


async def test_kilo_question_answer_goes_back_with_the_original_labels(env: Env) -> None:
    async with KiloServer() as server:
        rid, _ = await route_answer(env, server, "question_asked", values={"1": "2"})
        await server.called()
    assert server.calls[0][:2] == ("/question/que_1/reply", {"answers": [["SQLite"]]})
    for _ in range(500):
        if legs(env, "kilocode", rid)[-1:] and legs(env, "kilocode", rid)[-1][0] == "attention.resolved":
            break
        await asyncio.sleep(0.01)
    assert [t for t, _ in legs(env, "kilocode", rid)] == ["attention.answered", "attention.resolved"]


async def test_kilo_answered_in_its_own_prompt_stands_the_card_down(env: Env) -> None:
    async with KiloServer() as server:
        await env.post("kilocode", KILO["permission_asked"]["input"], headers=headers(server))
        (rid,) = await env.held()
        await env.post("kilocode", KILO["permission_replied"]["input"])
        for _ in range(500):
            if not env.router.holds:
                break
            await asyncio.sleep(0.01)
        assert env.router.holds == {} and server.calls == []
    assert legs(env, "kilocode", rid) == [("attention.resolved", {"resolution": "answered"})]
    late = respond(rid, SID, option="once")
    await env.router.submit(late, "kilocode")
    assert env.session("kilocode", SID)[-1]["data"]["reason"] == "refused"


async def test_kilo_route_failure_is_not_claimed_as_an_answer(env: Env) -> None:
    async with KiloServer(status=500) as server:
        rid, _ = await route_answer(env, server, "permission_asked", option="once")
        await server.called()
        for _ in range(500):
            if legs(env, "kilocode", rid):
                break
            await asyncio.sleep(0.01)
    assert legs(env, "kilocode", rid) == [("attention.resolved", {"resolution": "dismissed"})]
    health = await env.get("kilocode", "/healthz")
    assert health["ok"] is False and "reply-route" in health["problems"]["receiver/kilocode"]


@pytest.mark.parametrize("header", [None, "http://10.1.2.3:4096", "not a url"], ids=["absent", "remote", "garbage"])
async def test_kilo_ask_without_a_loopback_server_is_informational(env: Env, header: str | None) -> None:
    hdrs = {"X-AEP-Server-Url": header} if header else None
    assert await env.post("kilocode", KILO["permission_asked"]["input"], headers=hdrs) == (200, {})
    (request,) = env.session("kilocode", SID)
    assert request["data"]["respond_via"] == ["oob"] and env.router.holds == {}


@pytest.mark.parametrize("env", [{"kilocode": {"reply_routes": False}}], indirect=True)
async def test_kilo_reply_routes_can_be_switched_off(env: Env) -> None:
    async with KiloServer() as server:
        assert await env.post("kilocode", KILO["permission_asked"]["input"], headers=headers(server)) == (200, {})
    (request,) = env.session("kilocode", SID)
    assert request["data"]["respond_via"] == ["oob"] and env.router.holds == {}


# --- the Hermes and pi gates ---------------------------------------------------------------------------


def pre_tool(tool: str = "terminal", call: str = "tc_1") -> dict[str, Any]:
    body = copy.deepcopy(HERMES["pre_tool_call"]["input"])
    body["tool_name"], body["extra"]["tool_call_id"] = tool, call
    return body


def tool_call(tool: str = "bash", call: str = "call_1") -> dict[str, Any]:
    session = copy.deepcopy(PI["tool_execution_start"]["input"]["session"])
    return {"session": session, "event": {"type": "tool_call", "toolCallId": call, "toolName": tool,
                                          "input": {"command": "npm test"}}}


GATES = {"hermes": (pre_tool, {}, {"action": "block", "message": "Denied by the operator (AEP)."}),
         "pi": (tool_call, None, {"block": True, "reason": "Denied by the operator (AEP)."})}
GATE_ON = {"hermes": {"control": True}, "pi": {"control": True}}


@pytest.mark.parametrize("vendor", ["hermes", "pi"])
async def test_gate_off_holds_nothing_even_with_a_route(env: Env, vendor: str) -> None:
    body, neutral, _ = GATES[vendor]
    assert await env.post(vendor, body()) == (200, neutral)
    assert env.router.holds == {}
    assert [e["type"] for e in env.session(vendor, SID)] == ([] if vendor == "pi" else ["tool.requested"])


@pytest.mark.parametrize("env", [GATE_ON], indirect=True)
@pytest.mark.parametrize("vendor", ["hermes", "pi"])
async def test_gate_allow_lets_the_call_proceed(env: Env, vendor: str) -> None:
    body, neutral, _ = GATES[vendor]
    rid, command, reply = await answer_held(env, vendor, body(), option="allow")
    assert reply == neutral
    events = env.session(vendor, SID)
    request = next(e for e in events if e["id"] == rid)
    assert request["data"]["options"] == [{"id": "allow", "label": "Allow"}, {"id": "deny", "label": "Deny"}]
    assert request["data"]["respond_via"] == ["control"] and request["data"]["expires_at"].endswith("Z")
    assert request["data"]["expires_at"] > request["time"]
    tail = [e["type"] for e in events][-4:]
    assert tail == ["attention.requested", "control.accepted", "attention.answered", "attention.resolved"]
    if vendor == "hermes":
        assert events[0]["type"] == "tool.requested" and request["run"] == HERMES["pre_tool_call"]["input"]["extra"][
            "turn_id"]


@pytest.mark.parametrize("env", [GATE_ON], indirect=True)
@pytest.mark.parametrize("vendor", ["hermes", "pi"])
@pytest.mark.parametrize(("answer", "reason"), [
    ({"option": "deny"}, None), ({"text": "run the tests first"}, "run the tests first"), ({"text": "DENY"}, None),
], ids=["deny", "text-is-the-reason", "deny-word"])
async def test_gate_deny_rides_the_vendors_block_directive(env: Env, vendor: str, answer: dict[str, Any],
                                                           reason: str | None) -> None:
    body, _, default_deny = GATES[vendor]
    _, _, reply = await answer_held(env, vendor, body(), **answer)
    if reason is None:
        assert reply == default_deny
    else:
        key = "message" if vendor == "hermes" else "reason"
        assert reply == {**default_deny, key: reason}
    (answered,) = [e for e in env.session(vendor, SID) if e["type"] == "attention.answered"]
    assert answered["data"]["answer"]["option"] == "deny"


@pytest.mark.parametrize("env", [GATE_ON], indirect=True)
@pytest.mark.parametrize("vendor", ["hermes", "pi"])
async def test_gate_refuses_empty_values_and_foreign_options(env: Env, vendor: str) -> None:
    body, neutral, _ = GATES[vendor]
    task = asyncio.create_task(env.post(vendor, body()))
    (rid,) = await env.held()
    for bad in ({}, {"text": "   "}, {"values": {"1": "x"}}, {"option": "once"}):
        await env.router.submit(respond(rid, SID, **bad), vendor)
    nacks = [e["data"]["reason"] for e in env.session(vendor, SID) if e["type"] == "control.rejected"]
    assert nacks == ["invalid"] * 4 and not task.done()
    await env.router.submit(respond(rid, SID, text="allow"), vendor)
    assert await asyncio.wait_for(task, 10) == (200, neutral)


@pytest.mark.parametrize("env", [{"hermes": {"control": True, "gate_tools": "^(terminal|shell)$"},
                                  "pi": {"control": True, "gate_tools": "bash"}}], indirect=True)
@pytest.mark.parametrize(("vendor", "tool", "held"), [
    ("hermes", "terminal", True), ("hermes", "read_file", False), ("hermes", "terminal2", False),
    ("pi", "bash", True), ("pi", "read", False), ("pi", "run_bash_bg", True)])
async def test_gate_tools_is_searched_and_anchors_give_exact_names(env: Env, vendor: str, tool: str,
                                                                   held: bool) -> None:
    body, neutral, _ = GATES[vendor]
    task = asyncio.create_task(env.post(vendor, body(tool)))
    if held:
        (rid,) = await env.held()
        await env.router.submit(respond(rid, SID, option="allow"), vendor)
    assert await asyncio.wait_for(task, 10) == (200, neutral)
    requested = [e for e in env.session(vendor, SID) if e["type"] == "attention.requested"]
    assert len(requested) == (1 if held else 0)


@pytest.mark.parametrize("env", [{"hermes": {"control": True, "attention_timeout": 0.3},
                                  "pi": {"control": True, "attention_timeout": 0.3}}], indirect=True)
@pytest.mark.parametrize("vendor", ["hermes", "pi"])
async def test_gate_timeout_decides_nothing(env: Env, vendor: str) -> None:
    body, neutral, _ = GATES[vendor]
    assert await env.post(vendor, body()) == (200, neutral)
    types = [e["type"] for e in env.session(vendor, SID)]
    assert types[-2:] == ["attention.requested", "attention.timeout"]


@pytest.mark.parametrize("env", [GATE_ON], indirect=True)
@pytest.mark.parametrize("vendor", ["hermes", "pi"])
async def test_gate_without_a_route_holds_nothing(env: Env, vendor: str) -> None:
    env.router.set_route(vendor, False)
    body, neutral, _ = GATES[vendor]
    assert await env.post(vendor, body()) == (200, neutral)
    assert not [e for e in env.session(vendor, SID) if e["type"].startswith("attention.")]


@pytest.mark.parametrize("env", [GATE_ON], indirect=True)
@pytest.mark.parametrize(("vendor", "ender"), [("hermes", HERMES["on_session_finalize"]["input"]),
                                               ("pi", PI["session_shutdown"]["input"])])
async def test_session_end_sweeps_a_held_gate_first(env: Env, vendor: str, ender: dict[str, Any]) -> None:
    body, neutral, _ = GATES[vendor]
    task = asyncio.create_task(env.post(vendor, body()))
    (rid,) = await env.held()
    await env.post(vendor, ender)
    assert await asyncio.wait_for(task, 10) == (200, neutral)
    types = [(e["type"], e.get("subject")) for e in env.session(vendor, SID)][-2:]
    assert types == [("attention.resolved", rid), ("session.ended", None)]


@pytest.mark.parametrize("env", [GATE_ON], indirect=True)
async def test_a_hung_up_shim_dismisses_the_gate(env: Env) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as s:
        with pytest.raises(TimeoutError):
            await s.post(env.url("hermes"), json=pre_tool())
    for _ in range(500):
        if not env.router.holds:
            break
        await asyncio.sleep(0.01)
    last = env.session("hermes", SID)[-1]
    assert last["type"] == "attention.resolved" and last["data"] == {"resolution": "dismissed"}
    assert env.router.accepts("hermes") == [RESPOND]


async def test_kilo_background_hold_is_closed_at_shutdown(tmp_path) -> None:
    async with KiloServer() as server:
        async with running(config(tmp_path)) as service:
            e = Env(service, tmp_path)
            e.router.set_route("kilocode", True)
            await e.post("kilocode", KILO["permission_asked"]["input"], headers=headers(server))
            (rid,) = await e.held()
        assert server.calls == []
    assert legs(e, "kilocode", rid) == [("attention.resolved", {"resolution": "dismissed"})]
