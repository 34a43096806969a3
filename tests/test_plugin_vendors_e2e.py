"""End to end: the real collector binary, a realistic session per vendor through its real vendor side.

OpenCode, Kilo Code and pi through their JavaScript files under Node; Cline through the hook files
``aep-collector hooks cline`` writes, Hermes through the ``hooks:`` commands it prints, both of
which run the real shim. Every event in the JSONL passes the envelope and stream validators.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from aep_collector.pipeline.validate import StreamValidator, envelope_errors

from tests.conftest import corpus
from tests.helpers import ROOT, base_config, collector, read_jsonl
from tests.plugin_vendors_support import NODE, PLUGINS, VENDORS, closed_port, node, receivers, scenario, step

OPENCODE = corpus("mappings/opencode.json")["moments"]
KILO = corpus("mappings/kilocode.json")["moments"]
CLINE = corpus("mappings/cline.json")["hooks"]
HERMES = corpus("mappings/hermes.json")["hooks"]
PI = corpus("mappings/pi.json")["moments"]
SECRET = "password=hunter2-very-secret"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plugin-vendors-e2e")
    with collector(base_config(tmp, receivers=receivers()), tmp) as c:
        yield c, tmp
        assert c.stop() == 0


def url(c: Any, vendor: str) -> str:
    return f"http://127.0.0.1:{c.ports[f'receiver/{vendor}']}/hook"


def checked(path: Path) -> list[dict[str, Any]]:
    events = read_jsonl(path)
    stream = StreamValidator()
    for e in events:
        assert envelope_errors(e) == [], e
        assert stream.feed(e) == [], e
    assert [e["seq"] for e in events] == list(range(len(events)))
    return events


def with_secret(moment: dict[str, Any]) -> dict[str, Any]:
    m = copy.deepcopy(moment)
    m["output"]["args"] = {"command": f"deploy --{SECRET}"}
    return m


BUS_SESSION = ["session_created", "message_user", "tool_before", "tool_after", "permission_ask", "permission_replied",
               "todo_updated", "message_assistant", "command_executed", "session_idle", "session_deleted"]
BUS_TYPES = ["session.started", "run.started", "tool.requested", "tool.completed", "attention.requested",
             "attention.resolved", "progress.task.planned", "x.{v}.message.updated", "x.{v}.command.executed",
             "run.finished", "session.ended"]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
@pytest.mark.parametrize("vendor", list(PLUGINS))
async def test_bus_vendor_session_through_the_plugin_file(stack: Any, vendor: str) -> None:
    c, tmp = stack
    moments = OPENCODE if vendor == "opencode" else KILO
    ask = OPENCODE["permission_ask"]["input"]  # Kilo <=7.4.5 has the same hook
    steps = [step(ask if n == "permission_ask" else moments[n]["input"]) for n in BUS_SESSION]
    steps[2] = step(with_secret(moments["tool_before"]["input"]))
    report = await node(PLUGINS[vendor], scenario(vendor, steps, url(c, vendor)))
    assert [s["threw"] for s in report["steps"]] == [False] * len(steps)
    assert report["steps"][4]["args"][1] == {"status": "ask"}  # no operator: the vendor prompts
    path = tmp / "logs" / vendor / "s_fix_1.jsonl"
    events = checked(path)
    assert [e["type"] for e in events] == [t.format(v=vendor) for t in BUS_TYPES]
    run = events[1]["run"]
    assert all(e["run"] == run for e in events[1:10]) and "run" not in events[10]
    request, resolved = events[4], events[5]
    assert request["data"]["respond_via"] == ["oob"] and resolved["subject"] == request["id"]
    assert SECRET not in path.read_text() and "hunter2" not in path.read_text()


@pytest.mark.skipif(NODE is None, reason="node is not installed")
async def test_pi_session_through_the_extension_file(stack: Any) -> None:
    c, tmp = stack
    names = ["session_start", "agent_start", "turn_start", "message_start_user", "message_update",
             "tool_execution_start", "tool_execution_update", "tool_execution_end_ok", "message_end_assistant",
             "turn_end", "agent_end_stop", "agent_settled", "model_select", "session_shutdown"]
    steps = []
    for n in names:
        m = copy.deepcopy(PI[n]["input"])
        steps.append({"emit": m["event"]["type"], "event": m["event"], "session": m["session"]})
    report = await node("pi-extension.js", {"host": "pi", "steps": steps}, env={"AEP_PI_URL": url(c, "pi")})
    # message_update and tool_execution_update are not even subscribed by default.
    assert [len(s["handlers"]) for s in report["steps"]] == [0 if "update" in n else 1 for n in names]
    events = checked(tmp / "logs" / "pi" / "s_fix_1.jsonl")
    assert [e["type"] for e in events] == [
        "session.started", "run.started", "run.step.started", "x.pi.message.submitted", "tool.requested",
        "tool.completed", "x.pi.message.replied", "run.step.finished", "run.finished", "x.pi.agent.settled",
        "x.pi.model.select", "session.ended"]
    assert "fix the flaky test" not in (tmp / "logs" / "pi" / "s_fix_1.jsonl").read_text()


def render(vendor: str, receiver_url: str) -> str:
    out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "hooks", vendor, "--url", receiver_url],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def run_hook(argv: list[str], payload: dict[str, Any], cwd: Path) -> tuple[int, str]:
    out = subprocess.run(argv, input=json.dumps(payload), cwd=cwd, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("AEP_")})
    return out.returncode, out.stdout


def cline(name: str, **changes: Any) -> dict[str, Any]:
    p = copy.deepcopy(CLINE[name]["input"])
    p.update(changes)
    return p


CLINE_SESSION = [  # (hook file Cline runs, payload)
    ("TaskStart", cline("agent_start")),
    ("UserPromptSubmit", cline("prompt_submit", userPromptSubmit={"prompt": f"ship it, {SECRET}"})),
    ("PreToolUse", cline("tool_call")),
    ("PostToolUse", cline("tool_result_ok")),
    ("TaskStart", cline("agent_start_parented")),
    ("PreToolUse", cline("tool_call", agent_id="agent_child", parent_agent_id="agent_root", iteration=1,
                         tool_call={"id": "call_c", "name": "read_file", "input": {"path": "a.ts"}})),
    ("PostToolUse", cline("tool_result_error", agent_id="agent_child", parent_agent_id="agent_root")),
    ("TaskComplete", cline("agent_end_parented")),
    ("PreToolUse", cline("tool_call", tool_call={"id": "call_3", "name": "write_to_file", "input": {}})),
    ("TaskComplete", cline("agent_end")),
    ("SessionShutdown", cline("session_shutdown")),
]


def install_cline(receiver: str, home: Path) -> None:
    """Cline's hook files, as a user installs them: ``aep-collector hooks cline --install``."""
    subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "hooks", "cline", "--install", "--url", receiver,
                    "--home", str(home)], cwd=ROOT, check=True, timeout=60, capture_output=True)


def test_cline_session_through_the_installed_hook_files(stack: Any, tmp_path: Path) -> None:
    c, tmp = stack
    install_cline(url(c, "cline"), tmp_path)
    hooks = tmp_path / ".cline" / "hooks"
    assert sorted(p.name for p in hooks.iterdir()) == sorted(
        ["TaskStart", "TaskResume", "TaskCancel", "TaskComplete", "TaskError", "PreToolUse", "PostToolUse",
         "UserPromptSubmit", "SessionShutdown"])
    for name, payload in CLINE_SESSION:
        assert os.access(hooks / name, os.X_OK)
        assert run_hook([str(hooks / name)], payload, tmp_path) == (0, "{}"), name
    path = tmp / "logs" / "cline" / "task_fix_1.jsonl"
    events = checked(path)
    assert [e["type"] for e in events] == [
        "run.started", "x.cline.prompt.submitted", "tool.requested", "tool.completed",
        "delegation.subagent.started", "run.started", "tool.requested", "tool.failed", "run.finished",
        "delegation.subagent.stopped", "tool.requested", "run.finished", "session.ended"]
    parent, child = events[0]["run"], events[5]["run"]
    assert parent != child
    assert [e.get("run") for e in events] == [parent] * 5 + [child] * 4 + [parent] * 3 + [None]
    assert SECRET not in path.read_text()


def hermes(name: str, **extra: Any) -> dict[str, Any]:
    p = copy.deepcopy(HERMES[name]["input"])
    p["extra"].update(extra)
    return p


HERMES_SESSION = [
    hermes("on_session_start"), hermes("pre_llm_call", user_message=f"fix it, {SECRET}"), hermes("pre_tool_call"),
    hermes("post_tool_call_ok"),
    hermes("pre_tool_call (clarify: the form overlay, vendor choice normalization)"),
    hermes("post_tool_call (clarify: a picked choice is its structural id)"),
    hermes("pre_approval_request"), hermes("post_approval_response_deny"),
    hermes("subagent_start"), hermes("subagent_stop"), hermes("api_request_error", turn_id="s_fix_1:t1:aaaa1111"),
    hermes("on_session_end_completed"), hermes("on_session_finalize"),
]


def test_hermes_session_through_the_printed_hook_commands(stack: Any, tmp_path: Path) -> None:
    c, tmp = stack
    block = yaml.safe_load(render("hermes", url(c, "hermes")))["hooks"]
    for payload in HERMES_SESSION:
        (entry,) = block[payload["hook_event_name"]]
        assert entry["timeout"] >= 10
        assert run_hook(shlex.split(entry["command"]), payload, tmp_path) == (0, "{}")
    path = tmp / "logs" / "hermes" / "s_fix_1.jsonl"
    events = checked(path)
    assert [e["type"] for e in events] == [
        "session.started", "run.started", "tool.requested", "tool.completed", "tool.requested",
        "attention.requested", "tool.completed", "attention.answered", "attention.resolved",
        "attention.requested", "attention.answered", "attention.resolved", "delegation.subagent.started",
        "delegation.subagent.stopped", "x.hermes.api.error", "run.finished", "session.ended"]
    turn = HERMES["pre_llm_call"]["input"]["extra"]["turn_id"]
    assert all(e["run"] == turn for e in events[1:16])
    assert SECRET not in path.read_text()


def test_daemon_down_every_vendor_side_fails_open(tmp_path: Path) -> None:
    # Nothing listens on these ports: each shell-hook side gives its neutral reply and exits 0
    # (the JavaScript halves' closed-port behaviour is in test_plugin_vendors_js.py).
    dead = {v: f"http://127.0.0.1:{closed_port()}/hook" for v in VENDORS}
    install_cline(dead["cline"], tmp_path)
    assert run_hook([str(tmp_path / ".cline" / "hooks" / "PreToolUse")], cline("tool_call"), tmp_path) == (0, "{}")
    block = yaml.safe_load(render("hermes", dead["hermes"]))["hooks"]
    for hook in ("pre_tool_call", "on_session_start"):
        assert run_hook(shlex.split(block[hook][0]["command"]), hermes(hook), tmp_path) == (0, "{}")


def test_every_config_renders(tmp_path: Path) -> None:
    cfg = base_config(tmp_path, receivers={**receivers(), "hermes": {"endpoint": "127.0.0.1:9393",
                                                                     "attention_timeout": 100.0}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "hooks", "hermes", "--config", str(path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    block = yaml.safe_load(out.stdout)["hooks"]
    assert "--url http://127.0.0.1:9393/hook" in block["pre_tool_call"][0]["command"]
    assert "--wait 105" in block["pre_tool_call"][0]["command"] and block["pre_tool_call"][0]["timeout"] == 130
