"""Control postures of the hook-family receivers, driven as a duplex exporter drives the router.

Codex hooks arrive through the real shim process, Qwen Code over HTTP (its hooks are native
http); VS Code and Kimi gates are tried off and on; Gemini CLI and Antigravity declare nothing.
Commands are built by the official SDK's envelope builder.
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
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.validate import StreamValidator, envelope_errors
from aep_collector.receivers.hook_vendors import codex, kimi_code, qwen_code, vscode
from aep_sdk.control import ControlSender

from tests.helpers import ROOT, base_config, held_requests, read_jsonl, running
from tests.hook_vendors_support import AGENTS, POSTURES

SID = "sess-ctl"
BUILDER = ControlSender(lambda _c: None, agent="operator", host="ops")


def respond(subject: str, **answer: Any) -> dict[str, Any]:
    return BUILDER.build(RESPOND, SID, subject=subject, data={"answer": answer})


class Env:
    """One running collector with one hook-family receiver and a live (or dead) control route."""

    def __init__(self, service: Any, tmp_path: Path, rtype: str) -> None:
        self.service, self.tmp_path, self.rtype = service, tmp_path, rtype
        self.agent = AGENTS[rtype]
        self.router = service.host.control
        self.receiver = service.receivers[rtype]
        self.base = f"http://127.0.0.1:{self.receiver.port}"

    async def post(self, body: Any, hook: str | None = None) -> tuple[int, Any]:
        url = self.base + "/hook" + (f"?hook={hook}" if hook else "")
        async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
            raw = await r.read()
            return r.status, json.loads(raw) if raw else None

    async def shim(self, body: Any, event: str) -> tuple[int, bytes]:
        """The real shim process, as the vendor runs it per hook firing."""
        vendor = self.agent
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aep_collector.pipeline.shim", vendor, event, "--url", self.base, cwd=ROOT,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate(json.dumps(body).encode())
        return proc.returncode or 0, out

    async def held(self, n: int = 1) -> list[str]:
        return await held_requests(self.router, n)

    def events(self, session: str = SID) -> list[dict[str, Any]]:
        path = self.tmp_path / "logs" / self.agent / f"{session}.jsonl"
        return read_jsonl(path) if path.exists() else []

    def types(self, session: str = SID) -> list[str]:
        return [e["type"] for e in self.events(session)]

    def valid(self, session: str = SID) -> None:
        stream = StreamValidator()
        for e in self.events(session):
            assert envelope_errors(e) == [], e
            assert stream.feed(e) == [], e


@pytest.fixture
def registry() -> Any:
    reg, _ = build_registry(load_plugins=False)
    return reg


async def start(tmp_path: Path, registry: Any, rtype: str, route: bool = True, **cfg: Any) -> Any:
    config = base_config(tmp_path, receivers={rtype: {"endpoint": "127.0.0.1:0", **cfg}})
    ctx = running(config, registry)
    service = await ctx.__aenter__()
    env = Env(service, tmp_path, rtype)
    env.ctx = ctx  # type: ignore[attr-defined]
    if route:
        env.router.set_route(env.agent, True)
    return env


@pytest.fixture
async def make(tmp_path: Path, registry: Any) -> Any:
    envs: list[Env] = []

    async def factory(rtype: str, route: bool = True, **cfg: Any) -> Env:
        env = await start(tmp_path, registry, rtype, route, **cfg)
        envs.append(env)
        return env

    yield factory
    for env in envs:
        await env.ctx.__aexit__(None, None, None)  # type: ignore[attr-defined]


async def answer(env: Env, task: asyncio.Task[Any], **ans: Any) -> Any:
    (rid,) = await env.held()
    await env.router.submit(respond(rid, **ans), env.agent)
    return rid, await asyncio.wait_for(task, 15)


# --- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize("rtype,cfg,accepts", POSTURES)
async def test_control_accepts_reflects_exactly_the_gates_that_are_on(make: Any, rtype: str, cfg: dict[str, Any],
                                                                      accepts: list[str] | None) -> None:
    env = await make(rtype, **cfg)
    assert env.router.accepts(env.agent) == accepts


@pytest.mark.parametrize("rtype,cfg,flag", [
    ("vscode", {}, False), ("vscode", {"control": True}, True), ("kimi_code", {"control": True}, True),
])
async def test_healthz_reports_the_gate_as_honoured(make: Any, rtype: str, cfg: dict[str, Any], flag: bool) -> None:
    env = await make(rtype, **cfg)
    async with aiohttp.ClientSession() as s, s.get(env.base + "/healthz") as r:
        assert (await r.json())["control"] is flag
    env.router.set_route(env.agent, False)
    async with aiohttp.ClientSession() as s, s.get(env.base + "/healthz") as r:
        assert (await r.json())["control"] is False  # not honoured without a route


async def test_observe_only_vendors_have_no_control_flag(make: Any) -> None:
    env = await make("gemini_cli")
    async with aiohttp.ClientSession() as s, s.get(env.base + "/healthz") as r:
        assert "control" not in await r.json()


# --- Codex: the permission card through the real shim ---------------------------------------------

CODEX_PERMISSION = {"hook_event_name": "PermissionRequest", "session_id": SID, "turn_id": "t1", "tool_name": "shell",
                    "tool_input": {"command": "rm -rf build", "description": "clean build dir"}}


async def test_codex_allow_through_the_shim(make: Any) -> None:
    env = await make("codex")
    rid, (rc, out) = await answer(env, asyncio.create_task(env.shim(CODEX_PERMISSION, "PermissionRequest")),
                                  option="allow")
    assert rc == 0 and json.loads(out) == codex.permission_reply("allow")
    events = env.events()
    req = next(e for e in events if e["id"] == rid)
    assert req["data"]["respond_via"] == ["control"] and req["run"] == "t1"
    answered = next(e for e in events if e["type"] == "attention.answered")
    resolved = next(e for e in events if e["type"] == "attention.resolved")
    assert answered["data"] == {"answer": {"option": "allow"}, "via": "control"} and answered["subject"] == rid
    assert resolved["cause"] == answered["id"] and resolved["data"]["resolution"] == "answered"
    assert env.types().index("control.accepted") < env.types().index("attention.answered")
    env.valid()


async def test_codex_timeout_through_the_shim_frees_the_hook_with_no_decision(make: Any) -> None:
    env = await make("codex", attention_timeout=0.3)
    rc, out = await asyncio.wait_for(env.shim(CODEX_PERMISSION, "PermissionRequest"), 15)
    assert (rc, out) == (0, b"{}")
    rid = next(e["id"] for e in env.events() if e["type"] == "attention.requested")
    timeout = next(e for e in env.events() if e["type"] == "attention.timeout")
    assert timeout["subject"] == rid and timeout["cause"] == rid
    assert env.router.holds == {}
    late = respond(rid, option="allow")
    await env.router.submit(late, env.agent)
    assert next(e for e in env.events() if e["type"] == "control.rejected")["data"]["reason"] == "refused"
    env.valid()


@pytest.mark.parametrize("ans,decision", [
    ({"option": "deny"}, {"behavior": "deny", "message": "Denied via AEP attention loop"}),
    ({"text": "use make clean instead"}, {"behavior": "deny", "message": "use make clean instead"}),
    ({"text": " ALLOW "}, {"behavior": "allow"}),
    ({}, {"behavior": "deny", "message": "Denied via AEP attention loop"}),
], ids=["deny", "guidance", "text-is-option", "empty"])
async def test_codex_answer_shapes(make: Any, ans: dict[str, Any], decision: dict[str, Any]) -> None:
    env = await make("codex")
    _, (rc, out) = await answer(env, asyncio.create_task(env.shim(CODEX_PERMISSION, "PermissionRequest")), **ans)
    assert json.loads(out)["hookSpecificOutput"] == {"hookEventName": "PermissionRequest", "decision": decision}


async def test_codex_post_tool_use_dismisses_the_held_card(make: Any) -> None:
    env = await make("codex")
    task = asyncio.create_task(env.shim(CODEX_PERMISSION, "PermissionRequest"))
    (rid,) = await env.held()
    post = {"hook_event_name": "PostToolUse", "session_id": SID, "turn_id": "t1", "tool_name": "shell",
            "tool_input": CODEX_PERMISSION["tool_input"], "tool_use_id": "c9", "tool_response": {"exit_code": 0}}
    assert await env.post(post) == (200, {})
    assert await asyncio.wait_for(task, 15) == (0, b"{}")
    (resolved,) = [e for e in env.events() if e["type"] == "attention.resolved"]
    assert resolved["subject"] == rid and resolved["data"] == {"resolution": "dismissed"}
    env.valid()


async def test_codex_without_a_route_nothing_is_held(make: Any) -> None:
    env = await make("codex", route=False)
    assert await asyncio.wait_for(env.shim(CODEX_PERMISSION, "PermissionRequest"), 15) == (0, b"{}")
    (req,) = [e for e in env.events() if e["type"] == "attention.requested"]
    assert req["data"]["respond_via"] == ["oob"] and env.router.holds == {}


# --- Qwen Code: the same loop over native http -------------------------------------------------------

QWEN_PERMISSION = {"hook_event_name": "PermissionRequest", "session_id": SID, "tool_name": "Bash",
                   "tool_input": {"command": "rm -rf build"}, "permission_mode": "default"}


async def test_qwen_allow(make: Any) -> None:
    env = await make("qwen_code")
    _, (status, reply) = await answer(env, asyncio.create_task(env.post(QWEN_PERMISSION)), option="allow")
    assert (status, reply) == (200, qwen_code.permission_reply("allow"))
    assert env.types()[-3:] == ["control.accepted", "attention.answered", "attention.resolved"]
    env.valid()


async def test_qwen_timeout(make: Any) -> None:
    env = await make("qwen_code", attention_timeout=0.3)
    assert await asyncio.wait_for(env.post(QWEN_PERMISSION), 15) == (200, {})
    assert env.types() == ["attention.requested", "attention.timeout"]
    env.valid()


async def test_qwen_guidance_text_denies_with_the_text(make: Any) -> None:
    env = await make("qwen_code")
    _, (_, reply) = await answer(env, asyncio.create_task(env.post(QWEN_PERMISSION)), text="not on main")
    assert reply == qwen_code.permission_reply("deny", "not on main")
    answered = next(e for e in env.events() if e["type"] == "attention.answered")
    assert answered["data"]["answer"] == {"option": "deny", "text": "not on main"} and answered["capture"] == "redacted"


async def test_qwen_session_end_dismisses_a_held_card_before_session_ended(make: Any) -> None:
    env = await make("qwen_code")
    task = asyncio.create_task(env.post(QWEN_PERMISSION))
    (rid,) = await env.held()
    assert await env.post({"hook_event_name": "SessionEnd", "session_id": SID, "reason": "exit"}) == (200, {})
    assert await asyncio.wait_for(task, 15) == (200, {})
    assert env.types() == ["attention.requested", "attention.resolved", "session.ended"]
    env.valid()


async def test_qwen_unheld_card_is_swept_before_session_ended(make: Any) -> None:
    env = await make("qwen_code", route=False)
    assert await env.post(QWEN_PERMISSION) == (200, {})
    assert await env.post({"hook_event_name": "SessionEnd", "session_id": SID, "reason": "exit"}) == (200, {})
    events = env.events()
    assert [e["type"] for e in events] == ["attention.requested", "attention.resolved", "session.ended"]
    assert events[1]["subject"] == events[0]["id"] and events[1]["data"] == {"resolution": "dismissed"}
    env.valid()


# --- VS Code agent: the opt-in gate --------------------------------------------------------------------


def vs_pre(tool: str = "runInTerminal", call: str = "call_1") -> dict[str, Any]:
    return {"hook_event_name": "PreToolUse", "session_id": SID, "tool_name": tool,
            "tool_input": {"command": "rm -rf build"}, "tool_use_id": call}


async def test_vscode_gate_off_holds_nothing_even_with_a_route(make: Any) -> None:
    env = await make("vscode")
    assert await asyncio.wait_for(env.post(vs_pre()), 5) == (200, {})
    assert env.types() == ["tool.requested"] and env.router.holds == {}


async def test_vscode_gate_on_allow(make: Any) -> None:
    env = await make("vscode", control=True)
    rid, (status, reply) = await answer(env, asyncio.create_task(env.post(vs_pre())), option="allow")
    assert reply == vscode.pretool_reply("allow")
    req = next(e for e in env.events() if e["id"] == rid)
    assert [o["id"] for o in req["data"]["options"]] == ["allow", "deny", "ask"]
    assert req["data"]["respond_via"] == ["control"] and req["subject"] == "runInTerminal"
    assert env.types() == ["tool.requested", "attention.requested", "control.accepted", "attention.answered",
                           "attention.resolved"]
    env.valid()


@pytest.mark.parametrize("ans,reason", [({"option": "deny"}, "Denied via AEP attention loop"),
                                         ({"text": "use the staging db"}, "use the staging db")],
                         ids=["deny", "free-text"])
async def test_vscode_commanded_deny_lands_tool_denied(make: Any, ans: dict[str, Any], reason: str) -> None:
    env = await make("vscode", control=True)
    _, (_, reply) = await answer(env, asyncio.create_task(env.post(vs_pre())), **ans)
    assert reply == vscode.pretool_reply("deny", reason)
    events = env.events()
    answered = next(e for e in events if e["type"] == "attention.answered")
    denied = next(e for e in events if e["type"] == "tool.denied")
    assert denied["data"] == {"tool": {"name": "runInTerminal", "call_id": "call_1"}, "by": "policy"}  # reason gated
    assert denied["cause"] == answered["id"] and denied["subject"] == "runInTerminal"
    assert [e["type"] for e in events][-2:] == ["attention.resolved", "tool.denied"]
    env.valid()


async def test_vscode_ask_escalates_without_a_denial(make: Any) -> None:
    env = await make("vscode", control=True)
    _, (_, reply) = await answer(env, asyncio.create_task(env.post(vs_pre())), text="Ask")
    assert reply == vscode.pretool_reply("ask")
    assert "tool.denied" not in env.types()


async def test_vscode_unanswered_frees_the_hook_with_no_decision(make: Any) -> None:
    env = await make("vscode", control=True, attention_timeout=0.3)
    assert await asyncio.wait_for(env.post(vs_pre()), 15) == (200, {})
    assert env.types() == ["tool.requested", "attention.requested", "attention.timeout"]
    env.valid()


async def test_vscode_gate_scope_and_route(make: Any) -> None:
    env = await make("vscode", control=True, gate_tools="^(runInTerminal|editFiles)$")
    assert await asyncio.wait_for(env.post(vs_pre("readFile")), 5) == (200, {})  # out of scope: not held
    env.router.set_route("vscode", False)
    assert await asyncio.wait_for(env.post(vs_pre("runInTerminal", "call_2")), 5) == (200, {})  # no route
    assert env.types() == ["tool.requested", "tool.requested"] and env.router.holds == {}


# --- Kimi Code: the opt-in binary gate -----------------------------------------------------------------


def kimi_pre(call: str = "call_k1") -> dict[str, Any]:
    return {"hook_event_name": "PreToolUse", "session_id": SID, "tool_name": "Bash",
            "tool_input": {"command": "git push --force"}, "tool_call_id": call}


async def test_kimi_gate_off_holds_nothing(make: Any) -> None:
    env = await make("kimi_code")
    assert await asyncio.wait_for(env.post(kimi_pre()), 5) == (200, {})
    assert env.types() == ["tool.requested"] and env.router.holds == {}


@pytest.mark.parametrize("option", ["allow", "allow_session"])
async def test_kimi_gate_allow_is_no_objection(make: Any, option: str) -> None:
    env = await make("kimi_code", control=True)
    rid, (_, reply) = await answer(env, asyncio.create_task(env.post(kimi_pre())), option=option)
    assert reply == {}
    req = next(e for e in env.events() if e["id"] == rid)
    assert [o["id"] for o in req["data"]["options"]] == ["allow", "allow_session", "deny", "cancel"]
    assert "tool.denied" not in env.types()
    env.valid()


@pytest.mark.parametrize("ans,reason", [({"option": "deny"}, "Denied via AEP attention loop"),
                                         ({"option": "cancel"}, "Denied via AEP attention loop"),
                                         ({"text": "not on a shared branch"}, "not on a shared branch")],
                         ids=["deny", "cancel", "free-text"])
async def test_kimi_gate_deny_carries_the_reason_and_lands_tool_denied(make: Any, ans: dict[str, Any],
                                                                       reason: str) -> None:
    env = await make("kimi_code", control=True)
    _, (_, reply) = await answer(env, asyncio.create_task(env.post(kimi_pre())), **ans)
    assert reply == kimi_code.pretool_reply("deny", reason)
    denied = next(e for e in env.events() if e["type"] == "tool.denied")
    answered = next(e for e in env.events() if e["type"] == "attention.answered")
    assert denied["data"]["by"] == "policy" and denied["cause"] == answered["id"]
    assert denied["data"]["tool"] == {"name": "Bash", "call_id": "call_k1"}
    env.valid()


async def test_kimi_reports_the_denied_call_as_a_failure_which_stays_off_the_tool_lifecycle(make: Any) -> None:
    # Kimi Code 2.1.0, live: after a hook deny it still fires PostToolUseFailure for the blocked call.
    env = await make("kimi_code", control=True)
    await answer(env, asyncio.create_task(env.post(kimi_pre())), option="deny")
    failure = {"hook_event_name": "PostToolUseFailure", "session_id": SID, "tool_name": "Bash",
               "tool_input": {"command": "git push --force"}, "tool_call_id": "call_k1",
               "error": {"message": "Denied via AEP attention loop"}}
    assert await env.post(failure) == (200, {})
    types = env.types()
    assert "tool.failed" not in types and types[-2:] == ["tool.denied", "x.kimi-code.tool.blocked"], types
    # Another call of the same session fails as usual.
    assert await env.post({**failure, "tool_call_id": "call_k2"}) == (200, {})
    assert env.types()[-1] == "tool.failed"


async def test_kimi_gate_timeout(make: Any) -> None:
    env = await make("kimi_code", control=True, attention_timeout=0.3)
    assert await asyncio.wait_for(env.post(kimi_pre()), 15) == (200, {})
    assert env.types() == ["tool.requested", "attention.requested", "attention.timeout"]
    env.valid()


async def test_kimi_session_end_dismisses_a_held_gate(make: Any) -> None:
    env = await make("kimi_code", control=True)
    task = asyncio.create_task(env.post(kimi_pre()))
    await env.held()
    await env.post({"hook_event_name": "SessionEnd", "session_id": SID, "reason": "exit"})
    assert await asyncio.wait_for(task, 15) == (200, {})
    assert env.types() == ["tool.requested", "attention.requested", "attention.resolved", "session.ended"]
    env.valid()


async def test_kimi_observed_permission_pair_is_paired_by_the_attention_book(make: Any) -> None:
    env = await make("kimi_code", route=False)
    base = {"session_id": SID, "tool_name": "Bash", "tool_call_id": "c7"}
    await env.post({**base, "hook_event_name": "PermissionRequest", "display": "Run `ls`?"})
    await env.post({**base, "hook_event_name": "PermissionResult", "decision": "rejected", "feedback": "no"})
    events = env.events()
    assert [e["type"] for e in events] == ["attention.requested", "attention.answered", "attention.resolved",
                                           "tool.denied"]
    req, answered, resolved, _ = events
    assert answered["subject"] == resolved["subject"] == req["id"]
    assert answered["cause"] == req["id"] and resolved["cause"] == answered["id"]
    env.valid()


# --- observe-only vendors and the Antigravity hook parameter -------------------------------------------


async def test_gemini_never_holds(make: Any) -> None:
    env = await make("gemini_cli")
    body = {"hook_event_name": "Notification", "session_id": SID, "notification_type": "ToolPermission",
            "message": "Allow run_shell_command?"}
    assert await asyncio.wait_for(env.post(body), 5) == (200, {})
    assert env.types() == ["progress.status"]


async def test_antigravity_needs_the_hook_parameter(make: Any) -> None:
    env = await make("antigravity")
    body = {"conversationId": "conv-1", "stepIdx": 1, "toolCall": {"name": "view_file", "args": {}}}
    status, reply = await env.post(body)
    assert status == 400 and reply["error"] == "missing-hook" and "?hook=" in reply["detail"]
    status, reply = await env.post(body, hook="Pre%20Tool")
    assert status == 400 and reply["error"] == "invalid-hook"
    assert await env.post(body, hook="pretooluse") == (200, {"decision": ""})  # any case
    assert await env.post(body, hook="SomeFutureHook") == (200, {})
    types = env.types("conv-1")
    assert types == ["session.started", "tool.requested", "x.antigravity.hook.somefuturehook"]


# --- the same question asked twice: two cards, never one overwriting the other -----------------------


async def test_qwen_the_same_unheld_card_twice_is_two_cards_both_swept(make: Any) -> None:
    env = await make("qwen_code", route=False)
    assert await env.post(QWEN_PERMISSION) == (200, {})
    assert await env.post(QWEN_PERMISSION) == (200, {})
    await env.post({"hook_event_name": "SessionEnd", "session_id": SID, "reason": "exit"})
    events = env.events()
    assert [e["type"] for e in events] == ["attention.requested", "attention.requested", "attention.resolved",
                                           "attention.resolved", "session.ended"]
    assert {e["subject"] for e in events[2:4]} == {events[0]["id"], events[1]["id"]}
    env.valid()


async def test_codex_two_held_cards_for_the_same_command_are_answered_apart(make: Any) -> None:
    env = await make("codex")
    first = asyncio.create_task(env.shim(CODEX_PERMISSION, "PermissionRequest"))
    await env.held(1)
    second = asyncio.create_task(env.shim(CODEX_PERMISSION, "PermissionRequest"))
    rids = await env.held(2)
    await env.router.submit(respond(rids[1], option="deny"), env.agent)
    await env.router.submit(respond(rids[0], option="allow"), env.agent)
    assert json.loads((await asyncio.wait_for(first, 15))[1]) == codex.permission_reply("allow")
    assert json.loads((await asyncio.wait_for(second, 15))[1])["hookSpecificOutput"]["decision"]["behavior"] == "deny"
    answered = {e["subject"]: e["data"]["answer"]["option"] for e in env.events() if e["type"] == "attention.answered"}
    assert answered == {rids[0]: "allow", rids[1]: "deny"}
    env.valid()


async def test_kimi_a_re_asked_call_supersedes_its_earlier_card(make: Any) -> None:
    env = await make("kimi_code", route=False)
    base = {"session_id": SID, "tool_name": "Bash", "tool_call_id": "c8"}
    await env.post({**base, "hook_event_name": "PermissionRequest"})
    await env.post({**base, "hook_event_name": "PermissionRequest"})
    await env.post({**base, "hook_event_name": "PermissionResult", "decision": "approved"})
    events = env.events()
    assert [e["type"] for e in events] == ["attention.requested", "attention.resolved", "attention.requested",
                                           "attention.answered", "attention.resolved"]
    first, superseded, second, answered, resolved = events
    assert superseded["subject"] == first["id"] and superseded["data"]["resolution"] == "dismissed"
    assert answered["subject"] == resolved["subject"] == second["id"]
    env.valid()


async def test_kimi_cards_without_a_call_id_are_never_paired_and_are_swept(make: Any) -> None:
    env = await make("kimi_code", route=False)
    await env.post({"session_id": SID, "tool_name": "Bash", "hook_event_name": "PermissionRequest"})
    await env.post({"session_id": SID, "tool_name": "Bash", "hook_event_name": "PermissionRequest"})
    await env.post({"session_id": SID, "tool_name": "Bash", "hook_event_name": "PermissionResult",
                    "decision": "approved"})  # names no call: joins never invent, the leg is dropped
    await env.post({"session_id": SID, "hook_event_name": "SessionEnd", "reason": "exit"})
    assert env.types() == ["attention.requested", "attention.requested", "attention.resolved", "attention.resolved",
                           "session.ended"]
    env.valid()


async def test_vscode_two_held_gates_for_one_call_id_are_answered_apart(make: Any) -> None:
    env = await make("vscode", control=True)
    first = asyncio.create_task(env.post(vs_pre()))
    await env.held(1)
    second = asyncio.create_task(env.post(vs_pre()))
    rids = await env.held(2)
    await env.router.submit(respond(rids[0], option="allow"), env.agent)
    await env.router.submit(respond(rids[1], option="ask"), env.agent)
    assert (await asyncio.wait_for(first, 15))[1] == vscode.pretool_reply("allow")
    assert (await asyncio.wait_for(second, 15))[1] == vscode.pretool_reply("ask")
    resolved = [e["subject"] for e in env.events() if e["type"] == "attention.resolved"]
    assert sorted(resolved) == sorted(rids)
    env.valid()
