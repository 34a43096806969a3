"""The control router and Claude Code's held loops, driven as a duplex exporter would drive them.

Commands are built by the official SDK's envelope builder; hooks arrive over real HTTP. (The
same loops through a real relay and the SDK's ControlClient are in test_control_relay.py.)
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aep_collector.pipeline.registry import build_registry
from aep_sdk.control import ControlSender

from tests import memory_exporter
from tests.helpers import base_config, read_jsonl, running

SID = "sess-1"
BUILDER = ControlSender(lambda _c: None, agent="operator", host="ops")


def cmd(type_, subject=None, data=None, session=SID):
    kwargs = {"data": data} if data is not None else {}
    if subject is not None:
        kwargs["subject"] = subject
    return BUILDER.build(type_, session, **kwargs)


def respond(subject, **answer):
    return cmd("control.attention.respond", subject, {"answer": answer})


def permission(tool_use_id="toolu_1", name="Bash", command="rm -rf build"):
    return {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": name,
            "tool_input": {"command": command, "description": "clean"}, "tool_use_id": tool_use_id,
            "cwd": "/work", "permission_mode": "default"}


ASK = {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "AskUserQuestion",
       "tool_use_id": "toolu_q", "tool_input": {"questions": [
           {"question": "Which database?", "header": "DB", "multiSelect": False,
            "options": [{"label": "Postgres"}, {"label": "SQLite"}]},
           {"question": "Which regions?", "header": "Regions", "multiSelect": True,
            "options": [{"label": "us"}, {"label": "eu"}, {"label": "ap"}]}]}}


@pytest.fixture
def registry():
    reg, _ = build_registry(load_plugins=False)
    reg.register(memory_exporter.FACTORY, "test")
    return reg


class Env:
    def __init__(self, service, tmp_path, sink):
        self.service, self.tmp_path, self.sink = service, tmp_path, sink
        self.router = service.host.control
        rec = service.receivers["claude_code"]
        self.url = f"http://127.0.0.1:{rec.port}/hook"

    async def post(self, body):
        async with aiohttp.ClientSession() as s, s.post(self.url, json=body) as r:
            return r.status, await r.json()

    async def held(self, n=1):
        for _ in range(500):
            if len(self.router.holds) >= n:
                return list(self.router.holds)
            await asyncio.sleep(0.01)
        raise AssertionError("no held request appeared")

    def jsonl(self):
        return read_jsonl(self.tmp_path / "logs" / "claude-code" / f"{SID}.jsonl")

    def types(self):
        return [e["type"] for e in self.jsonl()]


@pytest.fixture
async def env(tmp_path, registry, request):
    name = request.node.name
    memory_exporter.SINKS.pop(name, None)
    cfg = base_config(tmp_path, extra_exporters={"memory": {"name": name}})
    cfg["receivers"]["claude_code"]["attention_timeout"] = getattr(request, "param", 30.0)
    async with running(cfg, registry) as service:
        e = Env(service, tmp_path, memory_exporter.SINKS[name])
        e.router.set_route("claude-code", True)
        yield e


async def hold_and_answer(env, body, command_for):
    task = asyncio.create_task(env.post(body))
    (rid,) = await env.held()
    c = command_for(rid)
    await env.router.submit(c, "claude-code")
    status, reply = await asyncio.wait_for(task, 10)
    assert status == 200
    return rid, c, reply


def lifecycle(env, rid):
    return [(e["type"], e.get("data")) for e in env.jsonl() if e.get("subject") == rid or e.get("id") == rid]


async def test_allow(env):
    rid, c, reply = await hold_and_answer(env, permission(), lambda rid: respond(rid, option="allow"))
    assert reply == {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}}
    events = env.jsonl()
    req = next(e for e in events if e["id"] == rid)
    assert req["data"]["respond_via"] == ["control"] and req["subject"] == "Bash"
    assert req["data"]["prompt"] == "Permission requested: Bash \u2014 rm -rf build (clean)"
    ack = next(e for e in events if e["type"] == "control.accepted")
    answered = next(e for e in events if e["type"] == "attention.answered")
    resolved = next(e for e in events if e["type"] == "attention.resolved")
    assert ack["cause"] == c["id"] and "seq" in ack
    assert answered["data"] == {"answer": {"option": "allow"}, "via": "control"}
    assert answered["cause"] == c["id"] and answered["subject"] == rid
    assert resolved["cause"] == answered["id"] and resolved["data"]["resolution"] == "answered"
    assert isinstance(resolved["data"]["latency_ms"], int)
    order = [e["type"] for e in events]
    assert order.index("control.accepted") < order.index("attention.answered") < order.index("attention.resolved")


async def test_deny_uses_the_canned_message(env):
    _, _, reply = await hold_and_answer(env, permission(), lambda rid: respond(rid, option="deny"))
    assert reply["hookSpecificOutput"]["decision"] == {"behavior": "deny", "message": "Denied via AEP attention loop"}


async def test_free_text_denies_with_the_text_as_guidance(env):
    rid, _, reply = await hold_and_answer(env, permission(), lambda rid: respond(rid, text="use make clean instead"))
    assert reply["hookSpecificOutput"]["decision"] == {"behavior": "deny", "message": "use make clean instead"}
    answered = next(e for e in env.jsonl() if e["type"] == "attention.answered")
    assert answered["data"]["answer"] == {"option": "deny", "text": "use make clean instead"}
    assert answered["capture"] == "redacted"


@pytest.mark.parametrize("word", ["allow", " ALLOW ", "Allow"])
async def test_text_equal_to_an_option_is_that_option(env, word):
    _, _, reply = await hold_and_answer(env, permission(), lambda rid: respond(rid, text=word))
    assert reply["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
    answered = next(e for e in env.jsonl() if e["type"] == "attention.answered")
    assert answered["data"]["answer"] == {"option": "allow"}


@pytest.mark.parametrize("answer", [{}, {"text": ""}, {"text": "   "}])
async def test_empty_answer_is_a_plain_deny(env, answer):
    _, _, reply = await hold_and_answer(env, permission(), lambda rid: respond(rid, **answer))
    assert reply["hookSpecificOutput"]["decision"]["behavior"] == "deny"


async def test_unrecognised_text_never_grants(env):
    _, _, reply = await hold_and_answer(env, permission(), lambda rid: respond(rid, text="yes please, allow it"))
    assert reply["hookSpecificOutput"]["decision"]["behavior"] == "deny"


@pytest.mark.parametrize("env", [0.3], indirect=True)
async def test_timeout_frees_the_hook_with_no_decision(env):
    status, reply = await env.post(permission())
    assert (status, reply) == (200, {})
    events = env.jsonl()
    rid = next(e["id"] for e in events if e["type"] == "attention.requested")
    timeout = next(e for e in events if e["type"] == "attention.timeout")
    assert timeout["subject"] == rid and timeout["cause"] == rid and timeout["data"]["after_ms"] >= 250
    assert env.router.holds == {}
    # An answer after the timeout is refused, and nothing is granted.
    late = respond(rid, option="allow")
    await env.router.submit(late, "claude-code")
    nack = [e for e in env.jsonl() if e["type"] == "control.rejected"]
    assert nack[-1]["cause"] == late["id"] and nack[-1]["data"]["reason"] == "refused"


async def test_post_tool_use_dismisses_the_held_request(env):
    task = asyncio.create_task(env.post(permission("toolu_9")))
    (rid,) = await env.held()
    status, reply = await env.post({"session_id": SID, "hook_event_name": "PostToolUse", "tool_name": "Bash",
                                    "tool_input": {"command": "rm -rf build"}, "tool_response": {},
                                    "tool_use_id": "toolu_9"})
    assert await asyncio.wait_for(task, 10) == (200, {})
    dismissed = [e for e in env.jsonl() if e["type"] == "attention.resolved"]
    assert len(dismissed) == 1 and dismissed[0]["subject"] == rid
    assert dismissed[0]["data"] == {"resolution": "dismissed"}


async def test_session_end_sweeps_pending_requests_first(env):
    task = asyncio.create_task(env.post(permission("toolu_5")))
    (rid,) = await env.held()
    await env.post({"session_id": SID, "hook_event_name": "SessionEnd", "reason": "exit"})
    assert await asyncio.wait_for(task, 10) == (200, {})
    t = env.types()
    assert t.index("attention.resolved") < t.index("session.ended")


async def test_duplicate_command_gets_the_recorded_ack_byte_identically(env):
    rid, c, _ = await hold_and_answer(env, permission(), lambda rid: respond(rid, option="allow"))
    await env.router.submit(dict(c), "claude-code")
    for _ in range(300):  # the memory sink sits behind the sending queue
        acks = [e for e in env.sink if e["type"].startswith("control.")]
        if len(acks) >= 2:
            break
        await asyncio.sleep(0.01)
    assert len(acks) == 2
    assert json.dumps(acks[0]) == json.dumps(acks[1])
    assert [e["type"] for e in env.jsonl()].count("control.accepted") == 1  # history holds it once


async def test_unknown_subject_is_refused(env):
    c = respond("01NOTAREQUEST", option="allow")
    await env.router.submit(c, "claude-code")
    (nack,) = [e for e in env.jsonl() if e["type"] == "control.rejected"]
    assert nack["cause"] == c["id"] and nack["data"] == {"reason": "refused"}  # detail gated at metadata


async def test_undeclared_command_is_unsupported(env):
    c = cmd("control.pause", data={})
    await env.router.submit(c, "claude-code")
    (nack,) = [e for e in env.jsonl() if e["type"] == "control.rejected"]
    assert nack["data"]["reason"] == "unsupported"


async def test_foreign_option_is_invalid_and_the_request_stays_pending(env):
    task = asyncio.create_task(env.post(permission()))
    (rid,) = await env.held()
    bad = respond(rid, option="maybe")
    await env.router.submit(bad, "claude-code")
    assert not task.done() and rid in env.router.holds
    await env.router.submit(respond(rid, option="allow"), "claude-code")
    status, reply = await asyncio.wait_for(task, 10)
    assert reply["hookSpecificOutput"]["decision"]["behavior"] == "allow"
    reasons = [e["data"].get("reason") for e in env.jsonl() if e["type"].startswith("control.")]
    assert reasons == ["invalid", None]


async def test_ask_user_question_form_validation_then_answer(env):
    task = asyncio.create_task(env.post(ASK))
    (rid,) = await env.held()
    req = next(e for e in env.jsonl() if e["id"] == rid)
    assert req["data"]["kind"] == "form" and req["data"]["prompt"] == "claude-code asks 2 questions"
    missing = respond(rid, values={"1": "1"})
    await env.router.submit(missing, "claude-code")
    assert not task.done()
    ok = respond(rid, values={"1": "2", "2": ["1", "3"]})
    await env.router.submit(ok, "claude-code")
    status, reply = await asyncio.wait_for(task, 10)
    decision = reply["hookSpecificOutput"]["decision"]
    assert decision["behavior"] == "allow"
    assert decision["updatedInput"]["answers"] == {"Which database?": "SQLite", "Which regions?": "us, ap"}
    assert decision["updatedInput"]["questions"] == ASK["tool_input"]["questions"]
    reasons = [e["data"].get("reason") for e in env.jsonl() if e["type"].startswith("control.")]
    assert reasons == ["invalid", None]
    answered = next(e for e in env.jsonl() if e["type"] == "attention.answered")
    assert answered["data"]["answer"]["values"] == {"1": "2", "2": ["1", "3"]}


async def test_ask_user_question_dismissed_by_post_tool_use(env):
    task = asyncio.create_task(env.post(ASK))
    (rid,) = await env.held()
    await env.post({"session_id": SID, "hook_event_name": "PostToolUse", "tool_name": "AskUserQuestion",
                    "tool_input": ASK["tool_input"], "tool_response": {}, "tool_use_id": "toolu_q"})
    assert await asyncio.wait_for(task, 10) == (200, {})
    assert [e["data"] for e in env.jsonl() if e["type"] == "attention.resolved"] == [{"resolution": "dismissed"}]


ELICIT = {"session_id": SID, "hook_event_name": "Elicitation", "mcp_server_name": "deploy",
          "message": "Deploy settings", "requested_schema": {
              "type": "object", "required": ["env"],
              "properties": {"env": {"type": "string", "enum": ["stg", "prd"], "enumNames": ["Staging", "Prod"]},
                             "replicas": {"type": "integer"}, "dry": {"type": "boolean"}}}}


async def test_elicitation_answer_accepts_with_content(env):
    task = asyncio.create_task(env.post(ELICIT))
    (rid,) = await env.held()
    await env.router.submit(respond(rid, values={"env": "qa"}), "claude-code")  # not a choice of a closed enum
    assert not task.done()
    await env.router.submit(respond(rid, values={"env": "prd", "replicas": 3, "dry": False}), "claude-code")
    status, reply = await asyncio.wait_for(task, 10)
    assert reply == {"hookSpecificOutput": {"hookEventName": "Elicitation", "action": "accept",
                                            "content": {"env": "prd", "replicas": 3, "dry": False}}}
    # Claude Code's own ElicitationResult afterwards is an echo: nothing more is emitted, and the
    # two legs it would have produced are counted as orphans (dropped by rule, not silently).
    await env.post({"session_id": SID, "hook_event_name": "ElicitationResult", "mcp_server_name": "deploy",
                    "action": "accept", "content": {"env": "prd"}})
    assert [e["type"] for e in env.jsonl()].count("attention.answered") == 1
    assert env.service.health.counters[("processor/mapping", "orphaned")] == 2


async def test_elicitation_result_while_pending_is_answered_oob(env):
    task = asyncio.create_task(env.post(ELICIT))
    (rid,) = await env.held()
    await env.post({"session_id": SID, "hook_event_name": "ElicitationResult", "mcp_server_name": "deploy",
                    "action": "accept", "content": {"env": "stg", "replicas": 1}})
    assert await asyncio.wait_for(task, 10) == (200, {})
    answered = next(e for e in env.jsonl() if e["type"] == "attention.answered")
    resolved = next(e for e in env.jsonl() if e["type"] == "attention.resolved")
    assert answered["subject"] == rid and answered["data"]["via"] == "oob"
    assert resolved["subject"] == rid and resolved["cause"] == answered["id"]
    assert env.router.holds == {}


async def test_orphan_elicitation_result_emits_nothing(env):
    await env.post({"session_id": SID, "hook_event_name": "ElicitationResult", "mcp_server_name": "ghost",
                    "action": "accept", "content": {}})
    assert not (env.tmp_path / "logs" / "claude-code" / f"{SID}.jsonl").exists() or env.types() == []


async def test_without_a_live_route_nothing_is_held(env):
    env.router.set_route("claude-code", False)
    assert await asyncio.wait_for(env.post(permission()), 5) == (200, {})
    req = next(e for e in env.jsonl() if e["type"] == "attention.requested")
    assert req["data"]["respond_via"] == ["oob"]
    assert env.router.holds == {}


ONE_Q = {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "AskUserQuestion",
         "tool_use_id": "toolu_one", "tool_input": {"questions": [
             {"question": "Ship it?", "header": "Ship", "multiSelect": False,
              "options": [{"label": "Yes"}, {"label": "Not yet"}]}]}}


@pytest.mark.parametrize(("answer", "label"), [({"option": "2"}, "Not yet"), ({"text": "yes"}, "Yes"),
                                               ({"text": "after lunch"}, "after lunch")])
async def test_single_question_accepts_legacy_option_and_text(env, answer, label):
    _, _, reply = await hold_and_answer(env, ONE_Q, lambda rid: respond(rid, **answer))
    assert reply["hookSpecificOutput"]["decision"]["updatedInput"]["answers"] == {"Ship it?": label}


async def test_multi_question_form_refuses_legacy_answers(env):
    task = asyncio.create_task(env.post(ASK))
    (rid,) = await env.held()
    await env.router.submit(respond(rid, option="1"), "claude-code")
    assert not task.done()
    (nack,) = [e for e in env.jsonl() if e["type"] == "control.rejected"]
    assert nack["data"]["reason"] == "invalid"
    await env.router.submit(respond(rid, values={"1": "1", "2": ["2"]}), "claude-code")
    assert (await asyncio.wait_for(task, 10))[1]["hookSpecificOutput"]["decision"]["behavior"] == "allow"


@pytest.mark.parametrize("env", [0.3], indirect=True)
async def test_a_form_times_out_whole(env):
    assert await asyncio.wait_for(env.post(ASK), 10) == (200, {})
    assert [e["type"] for e in env.jsonl()].count("attention.timeout") == 1
    assert "attention.answered" not in env.types()


async def test_the_held_request_bound_is_explicit_and_honest(tmp_path, registry):
    cfg = base_config(tmp_path)
    cfg["service"]["limits"] = {"max_held_requests": 1}
    async with running(cfg, registry) as service:
        e = Env(service, tmp_path, [])
        e.router.set_route("claude-code", True)
        first = asyncio.create_task(e.post(permission("toolu_a")))
        (rid,) = await e.held()
        # The bound is reached: the next request is not held, and says so in respond_via.
        assert await asyncio.wait_for(e.post(permission("toolu_b")), 5) == (200, {})
        reqs = [ev for ev in e.jsonl() if ev["type"] == "attention.requested"]
        assert [r["data"]["respond_via"] for r in reqs] == [["control"], ["oob"]]
        assert "holds-full" in service.health.snapshot()["problems"]["control"]
        await e.router.submit(respond(rid, option="allow"), "claude-code")
        assert (await asyncio.wait_for(first, 10))[1]["hookSpecificOutput"]["decision"]["behavior"] == "allow"
        assert "control" not in service.health.snapshot().get("problems", {})


async def test_the_concurrent_request_bound_answers_503(tmp_path, registry):
    cfg = base_config(tmp_path)
    cfg["receivers"]["claude_code"]["max_concurrent_requests"] = 1
    async with running(cfg, registry) as service:
        e = Env(service, tmp_path, [])
        e.router.set_route("claude-code", True)
        first = asyncio.create_task(e.post(permission("toolu_a")))
        (rid,) = await e.held()
        status, body = await e.post(permission("toolu_b"))
        assert status == 503 and body["error"] == "busy"
        assert "overloaded" in service.health.snapshot()["problems"]["receiver/claude_code"]
        await e.router.submit(respond(rid, option="allow"), "claude-code")
        await asyncio.wait_for(first, 10)
        assert service.health.snapshot()["ok"] is True  # recovered once the load is gone


async def test_a_flood_of_commands_grants_nothing_and_leaks_no_state(env):
    task = asyncio.create_task(env.post(permission()))
    (rid,) = await env.held()
    # Unknown sessions, foreign subjects, undeclared types, garbage answers, replays: all refused.
    junk = [respond(rid, option="allow") | {"session": "someone-else"} for _ in range(50)]
    junk += [respond(f"01FAKE{i:020d}", option="allow") for i in range(50)]
    junk += [cmd("control.cancel", data={"scope": "run"}) for _ in range(50)]
    junk += [cmd("control.attention.respond", rid, {"answer": "allow"}) for _ in range(50)]
    junk += [respond(rid, option="sure") for _ in range(50)]
    for c in junk:
        await env.router.submit(c, "claude-code")
    for c in junk[:20]:
        await env.router.submit(c, "claude-code")  # replays get their recorded nack, nothing more
    assert not task.done() and list(env.router.holds) == [rid]
    other = read_jsonl(env.tmp_path / "logs" / "claude-code" / "someone-else.jsonl")
    rejected = [e for e in env.jsonl() + other if e["type"] == "control.rejected"]
    assert len(rejected) == len(junk)  # one decision each, replays not re-recorded in history
    assert {e["session"] for e in other} == {"someone-else"}  # each nack on its command's own lane
    assert not [e for e in env.jsonl() if e["type"] in ("control.accepted", "attention.answered")]
    await env.router.submit(respond(rid, option="deny"), "claude-code")
    assert (await asyncio.wait_for(task, 10))[1]["hookSpecificOutput"]["decision"]["behavior"] == "deny"
    assert env.router.holds == {} and len(env.router.decisions) == len(junk) + 1


def cancel(run, scope="run", session=SID):
    c = cmd("control.cancel", data={"scope": scope, "reason": "operator stop"}, session=session)
    if run is not None:
        c["run"] = run
    return c


async def started_run(env):
    await env.post({"session_id": SID, "hook_event_name": "UserPromptSubmit", "prompt": "go"})
    (run,) = {e["run"] for e in env.jsonl() if e["type"] == "run.started"}
    return run


async def test_cancel_of_a_live_run_acks_then_one_cancelled_outcome_and_frees_the_held_hook(env):
    run = await started_run(env)
    task = asyncio.create_task(env.post(permission()))
    (rid,) = await env.held()
    c = cancel(run)
    await env.router.submit(c, "claude-code")
    status, reply = await asyncio.wait_for(task, 10)
    decision = reply["hookSpecificOutput"]["decision"]
    assert status == 200 and decision["behavior"] == "deny" and decision["interrupt"] is True
    events = env.jsonl()
    (ack,) = [e for e in events if e.get("cause") == c["id"] and e["type"].startswith("control.")]
    (outcome,) = [e for e in events if e["type"] == "run.cancelled"]
    assert ack["type"] == "control.accepted"
    assert outcome["run"] == run and outcome["cause"] == c["id"] and outcome["data"]["by"] == "control"
    assert events.index(ack) < events.index(outcome)
    assert ("attention.resolved", {"resolution": "dismissed"}) in lifecycle(env, rid)
    # The run is over: a second cancel is refused, and a retransmit of the first re-acks only.
    again = cancel(run)
    await env.router.submit(again, "claude-code")
    await env.router.submit(c, "claude-code")
    acks = [e for e in env.jsonl() if e["type"].startswith("control.") and e.get("cause") in (c["id"], again["id"])]
    assert [(e["type"], e["data"].get("reason")) for e in acks] == [("control.accepted", None),
                                                                     ("control.rejected", "refused")]
    assert len([e for e in env.jsonl() if e["type"] == "run.cancelled"]) == 1


async def test_after_a_cancel_without_a_held_hook_the_next_hook_is_told_to_stop_once(env):
    run = await started_run(env)
    await env.router.submit(cancel(run), "claude-code")
    pre = {"session_id": SID, "hook_event_name": "PreToolUse", "tool_name": "Read",
           "tool_input": {"file_path": "a"}, "tool_use_id": "toolu_9"}
    assert (await env.post(pre))[1] == {"continue": False, "stopReason": "Run cancelled via AEP control"}
    assert (await env.post(pre | {"tool_use_id": "toolu_10"}))[1] == {}


@pytest.mark.parametrize("run,scope,reason", [(None, "run", "invalid"), ("r_nope", "run", "refused"),
                                              ("r_x", "everything", "invalid")])
async def test_cancel_that_cannot_apply_is_nacked_with_the_reason(env, run, scope, reason):
    await started_run(env)
    c = cancel(run, scope)
    await env.router.submit(c, "claude-code")
    (nack,) = [e for e in env.jsonl() if e.get("cause") == c["id"]]
    assert nack["type"] == "control.rejected" and nack["data"]["reason"] == reason
    assert not [e for e in env.jsonl() if e["type"] == "run.cancelled"]


async def test_one_command_id_from_two_senders_gets_one_decision_in_the_session(env):
    from aep_collector.pipeline.validate import StreamValidator

    rid, first, _ = await hold_and_answer(env, permission(), lambda rid: respond(rid, option="allow"))
    other = ControlSender(lambda _c: None, agent="pager", host="elsewhere")
    clash = {**other.build("control.attention.respond", SID, subject=rid, data={"answer": {"option": "deny"}}),
             "id": first["id"]}
    assert clash["source"] != first["source"]
    await env.router.submit(clash, "claude-code")
    events = env.jsonl()
    acks = [e for e in events if e["type"] in ("control.accepted", "control.rejected")]
    assert [a["cause"] for a in acks] == [first["id"]]  # one ack for the bare id in this session's view
    stream = StreamValidator()
    assert [p for e in events for p in stream.feed(e)] == []
    health = env.service.health.snapshot()
    assert "command-id-collision" in health["problems"]["control"]
    assert env.service.health.counters[("control", "collided")] == 1
    # The same id in another session is another view: decided on its own.
    elsewhere = {**other.build("control.attention.respond", "sess-2", subject="nope",
                               data={"answer": {"option": "deny"}}), "id": first["id"]}
    await env.router.submit(elsewhere, "claude-code")
    other_file = read_jsonl(env.tmp_path / "logs" / "claude-code" / "sess-2.jsonl")
    assert [(e["type"], e["cause"]) for e in other_file] == [("control.rejected", first["id"])]


async def test_busy_answers_once_now_and_forgets_so_a_retry_is_decided_afresh(env):
    """``ControlRouter.busy``: what a transport whose command queue is full calls."""
    rid_task = asyncio.create_task(env.post(permission()))
    (rid,) = await env.held()
    c = respond(rid, option="allow")
    outcome, lanes = await env.router.busy(c, "claude-code")
    assert outcome == "busy"
    (ack,) = [e for _, events in lanes for e in events]
    assert ack["type"] == "control.rejected" and ack["cause"] == c["id"] and ack["data"]["reason"] == "busy"
    assert (c["source"], c["id"]) not in env.router.decisions  # not remembered: the retry is decided
    await env.router.submit(dict(c), "claude-code")
    status, _ = await asyncio.wait_for(rid_task, 10)
    assert status == 200
    # Decided now: a copy arriving while a queue is full gets the recorded ack, no second decision.
    assert await env.router.busy(dict(c), "claude-code") == ("known", None)
    types = [e["type"] for e in env.jsonl() if e.get("cause") == c["id"]]
    assert types.count("control.rejected") == 1 and types.count("control.accepted") == 1
    # A second sender reusing that id in the session, and a command with no session, get no ack.
    other = dict(c, source="aep://elsewhere/operator")
    outcome, lanes = await env.router.busy(other, "claude-code")
    assert lanes is None and "another sender" in outcome
    outcome, lanes = await env.router.busy({k: v for k, v in c.items() if k != "session"}, "claude-code")
    assert lanes is None and "no id, source or session" in outcome


class Claimant:
    """A collector claiming a session, as a gateway reaches it: forwards commands, answers probes."""

    def __init__(self, alive=True):
        self.alive, self.commands = alive, []

    async def __call__(self, command, agent):
        self.commands.append(command["id"])
        return []

    async def probe(self):
        return self.alive


async def test_a_session_two_collectors_claim_goes_to_neither_until_one_is_gone(env):
    """AEP-0004 §4: never guess, never both. A transport that cannot refuse ``ambiguous`` on the
    sender's connection gets ``busy``, not remembered, so the retry reaches the one left."""
    a, b = Claimant(), Claimant()
    env.router.remote("claude-code", SID, a, "aep.control.edge-a")
    env.router.remote("claude-code", SID, b, "aep.control.edge-b")
    c = respond("01JNOSUCH", option="allow")
    (ack,) = await env.router.submit(c, "claude-code")
    assert ack["type"] == "control.rejected" and ack["data"]["reason"] == "busy"
    assert a.commands == b.commands == []
    assert "ambiguous-session" in env.service.health.snapshot()["problems"]["control"]
    a.alive = False  # edge A's collector no longer answers its control subject
    assert await env.router.submit(dict(c), "claude-code") == []
    assert a.commands == [] and b.commands == [c["id"]]
    assert env.router.claimants("claude-code", SID) == ["aep.control.edge-b"]
