"""The shipped JavaScript halves under Node: module shape, delivery, held answers, fail-open.

``tests/js/drive.mjs`` loads each file as its host does (OpenCode/Kilo: ``default.server(input,
options)`` then the hooks; pi: ``default(pi)`` then the registered handlers) and calls it with the
vendor's event shapes, taken from the fixture inputs, against a running collector or a port
nothing listens on.
"""

from __future__ import annotations

import asyncio
import copy
import re
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import corpus
from tests.helpers import running
from tests.plugin_vendors_support import (
    JS,
    NODE,
    PLUGINS,
    Env,
    closed_port,
    config,
    node,
    respond,
    scenario,
    step,
)

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

OPENCODE = corpus("mappings/opencode.json")["moments"]
KILO = corpus("mappings/kilocode.json")["moments"]
PI = corpus("mappings/pi.json")["moments"]
SID = "s_fix_1"
HOOKS = ["event", "tool.execute.before", "tool.execute.after", "permission.ask"]
FAR = 600000  # ms: a timer this long never fires during a test, so finishing proves nobody waited on one


def pi_step(name: str) -> dict[str, Any]:
    m = copy.deepcopy(PI[name]["input"])
    return {"emit": m["event"]["type"], "event": m["event"], "session": m["session"]}


@pytest.fixture
async def env(tmp_path, request):
    async with running(config(tmp_path, **getattr(request, "param", {}))) as service:
        yield Env(service, tmp_path)


@pytest.mark.parametrize("name", ["opencode-plugin.js", "kilocode-plugin.js", "pi-extension.js"])
def test_the_files_import_nothing(name: str) -> None:
    text = (JS / name).read_text(encoding="utf-8")
    code = re.sub(r"//[^\n]*", "", text)
    assert not re.search(r"^\s*import\b|\bimport\s*\(|\brequire\s*\(", code, re.M), name
    assert "node:" not in code and "Bun." not in code


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_module_shape_and_only_the_four_hooks(vendor: str) -> None:
    report = await node(PLUGINS[vendor], scenario(vendor, [], "http://127.0.0.1:1/hook"))
    assert report["exports"] == ["default"]
    assert report["module"] == {"id": "aep-collector", "server": "function"}
    assert report["registered"] == HOOKS  # never chat.*, shell.env or any other output-rewriting hook


SESSION = ["session_created", "message_user", "tool_before", "tool_after", "todo_updated", "session_status_retry",
           "session_error", "session_idle", "session_deleted"]
SESSION_TYPES = ["session.started", "run.started", "tool.requested", "tool.completed", "progress.task.planned",
                 "progress.status", "x.{v}.session.error", "run.finished", "session.ended"]


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_a_session_through_the_plugin_lands_in_the_jsonl(env: Env, vendor: str) -> None:
    moments = OPENCODE if vendor == "opencode" else KILO
    steps = [step(moments[n]["input"]) for n in SESSION]
    report = await node(PLUGINS[vendor], scenario(vendor, steps, env.url(vendor)))
    assert [s["threw"] for s in report["steps"]] == [False] * len(steps)
    events = env.session(vendor, SID)
    assert [e["type"] for e in events] == [t.format(v=vendor) for t in SESSION_TYPES]
    run = events[1]["run"]
    assert all(e["run"] == run for e in events[1:8]) and "run" not in events[8]
    # callID paired the tool pair; the args digest is the fixture's.
    assert events[2]["data"] == OPENCODE["tool_before"]["expected"]["data"]
    assert events[3]["data"]["tool"] == {"name": "bash", "call_id": "call_1"} and "duration_ms" in events[3]["data"]


@pytest.mark.parametrize("vendor", list(PLUGINS))
@pytest.mark.parametrize(("answer", "status"), [({"option": "allow"}, "allow"), ({"option": "deny"}, "deny"),
                                                ({"text": "not now"}, "deny")])
async def test_a_held_ask_sets_the_status_from_the_answer(env: Env, vendor: str, answer: dict[str, Any],
                                                          status: str) -> None:
    env.router.set_route(vendor, True)
    run = asyncio.create_task(node(PLUGINS[vendor], scenario(vendor, [step(OPENCODE["permission_ask"]["input"])],
                                                             env.url(vendor))))
    (rid,) = await env.held()
    await env.router.submit(respond(rid, SID, **answer), vendor)
    (done,) = (await run)["steps"]
    assert done["threw"] is False and done["args"][1] == {"status": status}
    assert [e["type"] for e in env.session(vendor, SID)][-1] == "attention.resolved"


@pytest.mark.parametrize("env", [{"opencode": {"attention_timeout": 0.3}, "kilocode": {"attention_timeout": 0.3}}],
                         indirect=True)
@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_an_unanswered_ask_leaves_the_output_untouched(env: Env, vendor: str) -> None:
    env.router.set_route(vendor, True)
    report = await node(PLUGINS[vendor], scenario(vendor, [step(OPENCODE["permission_ask"]["input"])],
                                                  env.url(vendor)))
    assert report["steps"][0]["args"][1] == {"status": "ask"}
    assert [e["type"] for e in env.session(vendor, SID)] == ["attention.requested", "attention.timeout"]


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_daemon_down_every_handler_resolves_at_once_and_touches_nothing(vendor: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}/hook"
    steps = [step(OPENCODE[n]["input"]) for n in ("session_created", "tool_before", "permission_ask", "tool_after")]
    report = await node(PLUGINS[vendor], scenario(vendor, steps, url, timeoutMs=FAR, holdMs=FAR, retryMs=FAR))
    for s in report["steps"]:
        assert s["threw"] is False and s["ms"] < FAR / 10, s
    assert report["steps"][2]["args"][1] == {"status": "ask"}
    assert report["steps"][1]["args"][1] == OPENCODE["tool_before"]["input"]["output"]  # args never rewritten


class Scripted:
    """A daemon stand-in that answers every POST with a fixed reply, or never answers at all."""

    def __init__(self, reply: Any = None, hang: bool = False, delay: float = 0.0) -> None:
        self.reply, self.hang, self.delay = reply, hang, delay
        self.bodies: list[Any] = []
        """Every moment received, batches unpacked, in order."""
        self.requests = 0
        self.headers: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _hook(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests += 1
        self.bodies.extend(body["batch"] if isinstance(body, dict) and set(body) == {"batch"} else [body])
        self.headers.append(dict(request.headers))
        if self.hang:
            await asyncio.sleep(3600)
        if self.delay:
            await asyncio.sleep(self.delay)  # a slow collector, so moments pile up behind a POST
        if isinstance(self.reply, (bytes, str)):
            return web.Response(body=self.reply, content_type="application/json")
        return web.json_response(self.reply)

    async def __aenter__(self) -> Scripted:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.mark.parametrize("vendor", list(PLUGINS))
@pytest.mark.parametrize("reply", [{"status": "ask"}, {"status": "ALLOW"}, {"status": True}, [1], b"not json",
                                   b"", {"decision": "allow"}],
                         ids=["ask", "wrong-case", "bool", "array", "garbage", "empty", "foreign"])
async def test_only_an_exact_allow_or_deny_changes_the_output(vendor: str, reply: Any) -> None:
    async with Scripted(reply) as daemon:
        report = await node(PLUGINS[vendor], scenario(vendor, [step(OPENCODE["permission_ask"]["input"])], daemon.url))
    assert report["steps"][0]["threw"] is False and report["steps"][0]["args"][1] == {"status": "ask"}
    assert daemon.bodies == [OPENCODE["permission_ask"]["input"]]  # the moment exactly as the fixture has it


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_every_fixture_moment_is_posted_exactly_as_the_fixture_input(vendor: str) -> None:
    moments = OPENCODE if vendor == "opencode" else KILO
    names = [n for n in moments if not n.startswith("$")]
    async with Scripted({}) as daemon:
        report = await node(PLUGINS[vendor], scenario(vendor, [step(moments[n]["input"]) for n in names], daemon.url))
    assert [s["threw"] for s in report["steps"]] == [False] * len(names)
    assert daemon.bodies == [moments[n]["input"] for n in names]


async def test_every_pi_fixture_moment_is_posted_exactly_as_the_fixture_input() -> None:
    names = [n for n in PI if not n.startswith("$") and n not in ("message_update", "tool_execution_update")]
    async with Scripted(None) as daemon:
        await node("pi-extension.js", {"host": "pi", "steps": [pi_step(n) for n in names]},
                   env={"AEP_PI_URL": daemon.url})
    assert daemon.bodies == [PI[n]["input"] for n in names]


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_a_hung_daemon_is_given_up_on_and_then_skipped(vendor: str) -> None:
    steps = [step(OPENCODE["tool_before"]["input"]), step(OPENCODE["permission_ask"]["input"]),
             step(OPENCODE["tool_after"]["input"])]
    async with Scripted(hang=True) as daemon:
        # timeoutMs leaves a loaded machine time to start Node's fetch and deliver the first POST (the
        # daemon must see it); the ask's own wait is bounded by the same timeoutMs, so the order holds.
        report = await node(PLUGINS[vendor], scenario(vendor, steps, daemon.url, timeoutMs=1500, holdMs=300,
                                                      retryMs=FAR))
    assert [s["threw"] for s in report["steps"]] == [False, False, False]
    assert report["steps"][1]["args"][1] == {"status": "ask"}
    assert len(daemon.bodies) == 1  # after the first timeout the breaker skips the daemon


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_the_plugin_forwards_its_server_address_and_directory(vendor: str) -> None:
    # Both hosts ask on the bus (OpenCode 1.18, Kilo >=7.4.6); the answer goes to this server.
    async with Scripted({}) as daemon:
        await node(PLUGINS[vendor], scenario(vendor, [step(KILO["permission_asked"]["input"])], daemon.url,
                                             input={"serverUrl": "http://127.0.0.1:4096/",
                                                    "directory": "/home/user/my proj"}))
    (h,) = daemon.headers
    assert h["X-AEP-Server-Url"] == "http%3A%2F%2F127.0.0.1%3A4096%2F"
    assert h["X-AEP-Directory"] == "%2Fhome%2Fuser%2Fmy%20proj"


async def test_without_a_server_address_no_vendor_headers_are_sent() -> None:
    async with Scripted({}) as daemon:
        await node("opencode-plugin.js", scenario("opencode", [step(OPENCODE["session_idle"]["input"])], daemon.url))
    assert not any(k.lower().startswith("x-aep") for k in daemon.headers[0])


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_an_oversized_moment_arrives_slimmed_with_its_identity(env: Env, vendor: str) -> None:
    after = copy.deepcopy(OPENCODE["tool_after"]["input"])
    after["output"]["output"] = "x" * 20000
    steps = [step(OPENCODE["tool_before"]["input"]), step(after)]
    report = await node(PLUGINS[vendor], scenario(vendor, steps, env.url(vendor), maxBodyBytes=4000))
    assert [s["threw"] for s in report["steps"]] == [False, False]
    before, done = env.session(vendor, SID)
    assert done["type"] == "tool.completed" and done["data"]["tool"] == {"name": "bash", "call_id": "call_1"}
    assert "result_digest" not in done["data"]  # the bulk was left behind; nothing is invented


async def test_a_cyclic_argument_is_still_forwarded(env: Env) -> None:
    cyclic = {**step(OPENCODE["tool_before"]["input"]), "cycle": [1, "args"]}  # output.args.self = output.args
    report = await node("opencode-plugin.js", scenario("opencode", [cyclic], env.url("opencode")))
    assert report["steps"][0]["threw"] is False
    (event,) = env.session("opencode", SID)
    assert event["type"] == "tool.requested" and event["data"]["tool"] == {"name": "bash", "call_id": "call_1"}
    # Only the back edge is dropped: what remains is the fixture's args, digest and all.
    assert event["data"]["args_digest"] == OPENCODE["tool_before"]["expected"]["data"]["args_digest"]


# --- pi ----------------------------------------------------------------------------------------------------

PI_EVENTS = ["session_start", "session_shutdown", "session_compact", "session_info_changed", "session_tree",
             "agent_start", "agent_end", "agent_settled", "turn_start", "turn_end", "message_start", "message_end",
             "tool_execution_start", "tool_execution_end", "model_select", "thinking_level_select"]


@pytest.mark.parametrize(("env_vars", "extra"), [
    ({}, []), ({"AEP_PI_CONTROL": "1"}, ["tool_call"]),
    ({"AEP_PI_DELTAS": "true"}, ["message_update", "tool_execution_update"]), ({"AEP_PI_CONTROL": "0"}, []),
], ids=["default", "control", "deltas", "control-off"])
async def test_pi_subscribes_only_what_is_switched_on(env_vars: dict[str, str], extra: list[str]) -> None:
    report = await node("pi-extension.js", {"host": "pi", "steps": []},
                        env={"AEP_PI_URL": "http://127.0.0.1:1/hook", **env_vars})
    assert report["exports"] == ["default"] and report["factory"] == {"threw": False, "returned": None}
    assert sorted(report["registered"]) == sorted(PI_EVENTS + extra)


PI_SESSION = ["session_start", "agent_start", "turn_start", "message_start_user", "tool_execution_start",
              "tool_execution_end_ok", "message_end_assistant", "turn_end", "agent_end_stop", "agent_settled",
              "session_shutdown"]
PI_TYPES = ["session.started", "run.started", "run.step.started", "x.pi.message.submitted", "tool.requested",
            "tool.completed", "x.pi.message.replied", "run.step.finished", "run.finished", "x.pi.agent.settled",
            "session.ended"]


async def test_pi_session_through_the_extension(env: Env) -> None:
    steps = [pi_step(n) for n in PI_SESSION]
    report = await node("pi-extension.js", {"host": "pi", "steps": steps}, env={"AEP_PI_URL": env.url("pi")})
    for s in report["steps"]:
        assert [(h["threw"], h["returned"]) for h in s["handlers"]] == [(False, None)], s
    events = env.session("pi", SID)
    assert [e["type"] for e in events] == PI_TYPES
    assert events[2]["step"] == "0" and events[7]["step"] == "0"
    run = events[1]["run"]
    assert all(e["run"] == run for e in events[1:9]) and events[9].get("run") is None


@pytest.mark.parametrize("env", [{"pi": {"control": True}}], indirect=True)
@pytest.mark.parametrize(("answer", "returned"), [
    ({"option": "allow"}, None), ({"option": "deny"}, {"block": True, "reason": "Denied by the operator (AEP)."}),
    ({"text": "use the staging db"}, {"block": True, "reason": "use the staging db"}),
])
async def test_pi_gate_blocks_only_on_deny(env: Env, answer: dict[str, Any], returned: Any) -> None:
    env.router.set_route("pi", True)
    call = {"emit": "tool_call", "session": PI["tool_execution_start"]["input"]["session"],
            "event": {"type": "tool_call", "toolCallId": "call_1", "toolName": "bash", "input": {"command": "npm test"}}}
    run = asyncio.create_task(node("pi-extension.js", {"host": "pi", "steps": [call]},
                                   env={"AEP_PI_URL": env.url("pi"), "AEP_PI_CONTROL": "1"}))
    (rid,) = await env.held()
    await env.router.submit(respond(rid, SID, **answer), "pi")
    (handler,) = (await run)["steps"][0]["handlers"]
    assert handler["threw"] is False and handler["returned"] == returned


async def test_pi_gate_fails_open_when_the_daemon_is_down() -> None:
    call = {"emit": "tool_call", "session": {"id": "s1"}, "event": {"type": "tool_call", "toolName": "bash"}}
    steps = [call, pi_step("agent_start"), pi_step("message_end_assistant")]
    report = await node("pi-extension.js", {"host": "pi", "steps": steps},
                        env={"AEP_PI_URL": f"http://127.0.0.1:{closed_port()}/hook", "AEP_PI_CONTROL": "1",
                             "AEP_PI_TIMEOUT_MS": str(FAR), "AEP_PI_HOLD_MS": str(FAR)})
    for s in report["steps"]:
        (h,) = s["handlers"]
        assert h["threw"] is False and h["returned"] is None and h["ms"] < FAR / 10


@pytest.mark.parametrize("reply", [{"block": "yes"}, {"block": False, "reason": "x"}, {"action": "block"}, b"[]"],
                         ids=["not-true", "false", "foreign", "array"])
async def test_pi_gate_blocks_only_on_an_exact_block_reply(reply: Any) -> None:
    call = {"emit": "tool_call", "session": {"id": "s1"}, "event": {"type": "tool_call", "toolName": "bash"}}
    async with Scripted(reply) as daemon:
        report = await node("pi-extension.js", {"host": "pi", "steps": [call]},
                            env={"AEP_PI_URL": daemon.url, "AEP_PI_CONTROL": "1"})
    assert report["steps"][0]["handlers"][0]["returned"] is None


async def test_pi_moment_shape_and_a_broken_session_manager() -> None:
    steps = [pi_step("tool_execution_start"),
             {"emit": "agent_start", "event": {}, "session": None}]  # no type on the event, no session
    async with Scripted(None) as daemon:
        await node("pi-extension.js", {"host": "pi", "steps": steps}, env={"AEP_PI_URL": daemon.url})
    assert daemon.bodies[0] == PI["tool_execution_start"]["input"]  # exactly the fixture's input shape
    assert daemon.bodies[1] == {"session": {}, "event": {"type": "agent_start"}}


async def test_pi_stream_updates_drop_the_growing_message(env: Env) -> None:
    async with Scripted(None) as daemon:
        await node("pi-extension.js", {"host": "pi", "steps": [pi_step("message_update")]},
                   env={"AEP_PI_URL": daemon.url, "AEP_PI_DELTAS": "1"})
    (body,) = daemon.bodies
    assert "message" not in body["event"] and body["event"]["assistantMessageEvent"]["type"] == "text_delta"


# --- delivery: one template, batches, flush before the host exits ------------------------------------


def test_the_shipped_files_are_the_template_output() -> None:
    from aep_collector.receivers.plugin_vendors.js import build

    assert sorted(build.TARGETS) == sorted([*PLUGINS.values(), "pi-extension.js"])
    for name in build.TARGETS:
        assert (JS / name).read_text(encoding="utf-8") == build.render(name), \
            f"{name}: run python -m aep_collector.receivers.plugin_vendors.js.build"
    assert build.main(["--check"]) == 0


def bus(type_: str, **props: Any) -> dict[str, Any]:
    return {"hook": "event", "args": [{"event": {"type": type_, "properties": props}}], "detached": True}


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_a_start_up_burst_does_not_hold_back_idle_and_idle_is_delivered_before_exit(vendor: str) -> None:
    # OpenCode fires ~48 plugin.added/catalog moments at start-up without awaiting the plugin; one
    # POST per moment left session.idle seconds behind and OpenCode exited first (issue 11).
    burst = [bus("plugin.added", name=f"p{i}") for i in range(60)]
    idle = {**bus("session.idle", sessionID=SID), "detached": False}
    async with Scripted({}, delay=0.05) as daemon:
        await node(PLUGINS[vendor], {**scenario(vendor, [*burst, idle], daemon.url), "exit": True})
    assert [b["event"]["type"] for b in daemon.bodies] == ["plugin.added"] * 60 + ["session.idle"]
    assert [b["event"]["properties"].get("name") for b in daemon.bodies[:60]] == [f"p{i}" for i in range(60)]
    assert daemon.requests <= 3  # batched: the burst costs a request or two, not sixty


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_tool_hooks_return_before_delivery_and_keep_their_order(vendor: str) -> None:
    steps = [step(OPENCODE[n]["input"]) for n in ("session_created", "tool_before", "tool_after")]
    steps.append({**bus("session.idle", sessionID=SID), "detached": False})
    async with Scripted({}, delay=0.05) as daemon:
        await node(PLUGINS[vendor], {**scenario(vendor, steps, daemon.url), "exit": True})
    assert daemon.bodies[:3] == [OPENCODE[n]["input"] for n in ("session_created", "tool_before", "tool_after")]
    assert daemon.bodies[3]["event"]["type"] == "session.idle" and daemon.requests < 4


async def test_pi_delivers_the_whole_queue_before_shutdown_and_exit() -> None:
    # pi 0.73.1 runs agent events through a queue that awaits each handler, and emits
    # session_shutdown beside it, then exits: an extension that awaited the collector in each handler
    # delivered session_shutdown before tool_execution_end and lost turn_end/agent_end (issue 11).
    names = ["session_start", "agent_start", "turn_start", "message_start_user", "tool_execution_start",
             "tool_execution_end_ok", "message_end_assistant", "turn_end", "agent_end_stop"]
    steps = [{**pi_step(n), "queued": n != "session_start"} for n in names] + [pi_step("session_shutdown")]
    async with Scripted(None, delay=0.05) as daemon:
        await node("pi-extension.js", {"host": "pi", "steps": steps, "exit": True}, env={"AEP_PI_URL": daemon.url})
    assert daemon.bodies == [PI[n]["input"] for n in [*names, "session_shutdown"]]
    assert daemon.requests < len(names) + 1


@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_a_batch_lands_in_the_jsonl_in_order(env: Env, vendor: str) -> None:
    names = ["session_created", "tool_before", "tool_after", "session_idle"]
    steps = [{**step(OPENCODE[n]["input"]), "detached": True} for n in names[:-1]]
    steps.append(step(OPENCODE["session_idle"]["input"]))
    await node(PLUGINS[vendor], {**scenario(vendor, steps, env.url(vendor)), "exit": True})
    types = [e["type"] for e in env.session(vendor, SID)]
    assert types[:3] == ["session.started", "tool.requested", "tool.completed"], types
