"""End to end: the real collector binary, a realistic session per hook-family vendor, the JSONL file.

Command-hook vendors are driven exactly as the vendor drives them: the registration block that
``aep-collector hooks VENDOR --url ...`` prints is parsed, and for every firing the command it
registers for that event is run through the shell with the payload on stdin. Qwen Code's hooks
are native HTTP, so they are POSTed to the URL its block registers. Every reply is the vendor's
contract; every event is a valid envelope and a valid stream.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline.validate import StreamValidator, envelope_errors
from aep_collector.receivers.registration import render

from tests.helpers import base_config, collector, read_jsonl
from tests.test_hook_vendors_registration import registered

RECEIVERS = ["codex", "gemini_cli", "qwen_code", "vscode", "antigravity", "kimi_code"]
VENDOR = {"codex": "codex", "gemini_cli": "gemini-cli", "qwen_code": "qwen-code", "vscode": "vscode",
          "antigravity": "antigravity", "kimi_code": "kimi-code"}


def fire(vendor: str, hooks: dict[str, list[dict[str, Any]]], event: str, body: dict[str, Any]) -> bytes:
    """One hook firing as the vendor performs it; returns what the vendor reads back."""
    (handler,) = hooks[event]
    raw = json.dumps(body).encode()
    if "url" in handler:  # native http hook
        req = urllib.request.Request(handler["url"], data=raw, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=handler["timeout"]) as resp:
            assert resp.status == 200
            return resp.read()
    done = subprocess.run(handler["command"], shell=True, input=raw, capture_output=True,
                          timeout=handler["timeout"])
    assert done.returncode == 0, (vendor, event, done.stderr)
    return done.stdout


# --- the sessions -------------------------------------------------------------------------------------

CODEX_SID = "019a1f0e-codex-thread"


def codex_session() -> list[tuple[str, dict[str, Any]]]:
    def c(name: str, turn: str | None = None, **kw: Any) -> tuple[str, dict[str, Any]]:
        body = {"hook_event_name": name, "session_id": CODEX_SID, "cwd": "/home/dev/proj", "model": "gpt-5-codex",
                "transcript_path": "/home/dev/.codex/sessions/x.jsonl", **kw}
        if turn:
            body["turn_id"] = turn
        return name, body

    ls = {"command": "ls -la"}
    rm = {"command": "rm -rf build", "description": "clean build dir"}
    return [
        c("SessionStart", source="startup"),
        c("UserPromptSubmit", "t1", prompt="fix the tests, password=hunter2"),
        c("PreToolUse", "t1", tool_name="shell", tool_use_id="call_1", tool_input=ls),
        c("PostToolUse", "t1", tool_name="shell", tool_use_id="call_1", tool_input=ls,
          tool_response={"output": "total 0", "exit_code": 0}),
        c("PermissionRequest", "t1", tool_name="shell", tool_input=rm),
        c("PreToolUse", "t1", tool_name="shell", tool_use_id="call_2", tool_input=rm),
        c("PostToolUse", "t1", tool_name="shell", tool_use_id="call_2", tool_input=rm,
          tool_response={"output": "rm: denied", "exit_code": 1}),
        c("SubagentStart", "t1", agent_id="sub-1", agent_type="explorer"),
        c("SubagentStop", "t1", agent_id="sub-1", agent_type="explorer"),
        c("PreCompact", "t1", trigger="auto"),
        c("PostCompact", "t1", trigger="auto"),
        c("Stop", "t1"),
        c("UserPromptSubmit", "t2", prompt="and the docs"),  # interrupted: never stopped
        c("UserPromptSubmit", "t3", prompt="never mind"),
        c("Stop", "t3"),
    ]


CODEX_TYPES = ["session.started", "run.started", "tool.requested", "tool.completed", "attention.requested",
               "tool.requested", "tool.completed", "delegation.subagent.started", "delegation.subagent.stopped",
               "session.compacted", "run.finished", "run.started", "run.cancelled", "run.started", "run.finished"]

GEMINI_SID = "gem-5b1f"


def gemini_session() -> list[tuple[str, dict[str, Any]]]:
    def g(name: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        return name, {"hook_event_name": name, "session_id": GEMINI_SID, "cwd": "/w", "timestamp": "2026-01-01T00:00:00Z",
                      "transcript_path": "/w/.gemini/t.json", **kw}

    req = {"model": "gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}
    return [
        g("SessionStart", source="startup"),
        g("BeforeAgent", prompt="list the files"),
        g("BeforeModel", llm_request=req),
        g("BeforeToolSelection", llm_request=req),
        g("BeforeTool", tool_name="list_directory", tool_input={"path": "."}),
        g("AfterTool", tool_name="list_directory", tool_input={"path": "."},
          tool_response={"llmContent": "a.py", "returnDisplay": "a.py"}),
        g("BeforeTool", tool_name="run_shell_command", tool_input={"command": "make"}),
        g("AfterTool", tool_name="run_shell_command", tool_input={"command": "make"},
          tool_response={"llmContent": "", "error": {"type": "EXECUTION_FAILED", "message": "exit 2"}}),
        g("Notification", notification_type="ToolPermission", message="Allow make?", details={}),
        g("PreCompress", trigger="auto"),
        g("AfterAgent", prompt="list the files", prompt_response="done"),
        g("SessionEnd", reason="exit"),
    ]


GEMINI_TYPES = ["session.started", "run.started", "x.gemini-cli.session.before_model",
                "x.gemini-cli.session.before_tool_selection", "tool.requested", "tool.completed", "tool.requested",
                "tool.failed", "progress.status", "session.compacted", "run.finished", "session.ended"]

QWEN_SID = "qwen-7c2d"


def qwen_session() -> list[tuple[str, dict[str, Any]]]:
    def q(name: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        return name, {"hook_event_name": name, "session_id": QWEN_SID, "cwd": "/w", "permission_mode": "default",
                      **kw}

    write = {"file_path": "/w/src/app.ts", "content": "x = 1"}
    rm = {"command": "rm -rf dist"}
    return [
        q("SessionStart", source="startup", model="qwen3-coder-plus"),
        q("UserPromptSubmit", prompt="ship it"),
        q("PreToolUse", tool_name="WriteFile", tool_input=write, tool_use_id="toolu_1"),
        q("PostToolUse", tool_name="WriteFile", tool_input=write, tool_response={"output": "ok"}, tool_use_id="toolu_1"),
        q("PermissionRequest", tool_name="Bash", tool_input=rm),  # no operator route: the TUI decides
        q("Notification", notification_type="permission_prompt", message="Qwen needs your permission"),
        q("TodoCreated", phase="validation", todo_id="1", todo_content="write docs"),
        q("TodoCreated", phase="postWrite", todo_id="1", todo_content="write docs"),
        q("PreToolUse", tool_name="Bash", tool_input=rm, tool_use_id="toolu_2"),
        q("PostToolUseFailure", tool_name="Bash", tool_input=rm, tool_use_id="toolu_2", error="EACCES",
          is_interrupt=False),
        q("TodoCompleted", phase="postWrite", todo_id="1", todo_content="write docs"),
        q("Stop", input_tokens=1200),
        q("SessionEnd", reason="exit"),
    ]


QWEN_TYPES = ["session.started", "run.started", "tool.requested", "tool.completed", "attention.requested",
              "progress.task.planned", "tool.requested", "tool.failed", "progress.task.completed", "run.finished",
              "attention.resolved", "session.ended"]

VSCODE_SID = "vsc-8e1a"


def vscode_session() -> list[tuple[str, dict[str, Any]]]:
    def v(name: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        return name, {"hook_event_name": name, "session_id": VSCODE_SID, "cwd": "/w",
                      "timestamp": "2026-01-01T00:00:00Z", "transcript_path": "/w/t.json", **kw}

    edit = {"files": ["src/main.ts"]}
    return [
        v("SessionStart", source="new", model="gpt-4.1", agent_type="agent"),
        v("UserPromptSubmit", prompt="refactor main"),
        v("PreToolUse", tool_name="editFiles", tool_input=edit, tool_use_id="tool-1"),
        v("PostToolUse", tool_name="editFiles", tool_input=edit, tool_response="File edited", tool_use_id="tool-1"),
        v("SubagentStart", agent_id="sub-a", agent_type="Plan"),
        v("SubagentStop", agent_id="sub-a", agent_type="Plan", stop_hook_active=False),
        v("PreCompact", trigger="auto"),
        v("Stop", stop_hook_active=False),
    ]


VSCODE_TYPES = ["session.started", "run.started", "tool.requested", "tool.completed", "delegation.subagent.started",
                "delegation.subagent.stopped", "session.compacted", "run.finished"]

KIMI_SID = "session_k1"


def kimi_session() -> list[tuple[str, dict[str, Any]]]:
    def k(name: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        return name, {"hook_event_name": name, "session_id": KIMI_SID, "cwd": "/w", **kw}

    sh = {"command": "rm -rf build"}
    return [
        k("SessionStart", source="startup"),
        k("UserPromptSubmit", prompt=[{"type": "text", "text": "clean up"}]),
        k("PreToolUse", tool_name="Bash", tool_input=sh, tool_call_id="call_1"),
        k("PermissionRequest", tool_name="Bash", tool_input=sh, tool_call_id="call_1", display="Run `rm -rf build`?"),
        k("PermissionResult", tool_name="Bash", tool_call_id="call_1", decision="approved",
          selected_label="Approve once"),
        k("PostToolUse", tool_name="Bash", tool_input=sh, tool_call_id="call_1", tool_output="removed"),
        k("PreToolUse", tool_name="Bash", tool_input={"command": "make"}, tool_call_id="call_2"),
        k("PostToolUseFailure", tool_name="Bash", tool_call_id="call_2", error={"name": "ShellError", "message": "2"}),
        k("Notification", notification_type="task.completed", title="done", body="bg task", severity="info"),
        k("PreCompact", trigger="auto", token_count=90000),
        k("PostCompact", trigger="auto", estimated_token_count=12000),
        k("Stop", stop_hook_active=False),
        k("UserPromptSubmit", prompt="one more thing"),  # left open: drained at SessionEnd
        k("SessionEnd", reason="exit"),
    ]


KIMI_TYPES = ["session.started", "run.started", "tool.requested", "attention.requested", "attention.answered",
              "attention.resolved", "tool.completed", "tool.requested", "tool.failed", "progress.status",
              "x.kimi-code.session.pre_compact", "session.compacted", "run.finished", "run.started", "run.cancelled",
              "session.ended"]

AG_SID = "ec33ebf9-0cba-4100-8142-c61503f6c587"


def antigravity_session() -> list[tuple[str, dict[str, Any]]]:
    common = {"conversationId": AG_SID, "workspacePaths": ["/workspace/project"],
              "transcriptPath": f"~/.gemini/antigravity-cli/brain/{AG_SID}/.system_generated/logs/transcript.jsonl",
              "artifactDirectoryPath": f"~/.gemini/antigravity-cli/brain/{AG_SID}"}

    def a(name: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        return name, {**common, **kw}

    return [
        a("PreInvocation", invocationNum=0, initialNumSteps=3),
        a("PreToolUse", stepIdx=1, toolCall={"name": "view_file", "args": {"AbsolutePath": "/workspace/project/a.py"}}),
        a("PostToolUse", stepIdx=1, error=""),
        a("PreToolUse", stepIdx=2, toolCall={"name": "run_command", "args": {"CommandLine": "npm test"}}),
        a("PostToolUse", stepIdx=2, error="exit status 1"),
        a("PostToolUse", stepIdx=7, error=""),  # never joined: no name is invented
        a("PostInvocation", invocationNum=0),
        a("PreInvocation", invocationNum=1),
        a("PostInvocation", invocationNum=1),
        a("Stop", terminationReason="model_stop", executionNum=1, fullyIdle=True, error=""),
    ]


AG_TYPES = ["session.started", "run.started", "run.step.started", "tool.requested", "tool.completed", "tool.requested",
            "tool.failed", "x.antigravity.step.completed", "run.step.finished", "run.step.started",
            "run.step.finished", "run.finished"]

SESSIONS = {
    "codex": (codex_session, CODEX_SID, CODEX_TYPES),
    "gemini_cli": (gemini_session, GEMINI_SID, GEMINI_TYPES),
    "qwen_code": (qwen_session, QWEN_SID, QWEN_TYPES),
    "vscode": (vscode_session, VSCODE_SID, VSCODE_TYPES),
    "kimi_code": (kimi_session, KIMI_SID, KIMI_TYPES),
    "antigravity": (antigravity_session, AG_SID, AG_TYPES),
}
PINNED = {"PreToolUse": b'{"decision": ""}', "Stop": b'{"decision": ""}'}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("hook-vendors-e2e")
    cfg = base_config(tmp, receivers={r: {"endpoint": "127.0.0.1:0"} for r in RECEIVERS})
    with collector(cfg, tmp) as c:
        yield c, tmp


@pytest.mark.parametrize("rtype", RECEIVERS)
def test_session_end_to_end(stack: Any, rtype: str) -> None:
    c, tmp = stack
    vendor = VENDOR[rtype]
    make, sid, expected = SESSIONS[rtype]
    port = c.ports[f"receiver/{rtype}"]
    hooks = registered(vendor, render(vendor, url=f"http://127.0.0.1:{port}"))
    for event, body in make():
        out = fire(vendor, hooks, event, body)
        if rtype == "antigravity":
            assert out == PINNED.get(event, b"{}"), (event, out)  # byte-exact, as the vendor reads it
        elif rtype == "kimi_code" and event == "UserPromptSubmit":
            assert out == b"", out  # Kimi would put any stdout, `{}` too, into the model's context
        else:
            assert json.loads(out) == {}, (event, out)
    path: Path = tmp / "logs" / vendor / f"{sid}.jsonl"
    events = read_jsonl(path)
    assert [e["type"] for e in events] == expected
    assert [e["seq"] for e in events] == list(range(len(events)))
    stream = StreamValidator()
    for e in events:
        assert envelope_errors(e) == [], e
        assert stream.feed(e) == [], e
    raw = path.read_text()
    assert "hunter2" not in raw and "/home/dev" not in raw and "/workspace/project" not in raw  # metadata ceiling


def test_codex_turns_are_the_runs(stack: Any) -> None:
    _, tmp = stack
    events = read_jsonl(tmp / "logs" / "codex" / f"{CODEX_SID}.jsonl")
    assert {e.get("run") for e in events[1:11]} == {"t1"}
    cancelled = next(e for e in events if e["type"] == "run.cancelled")
    assert cancelled["run"] == "t2"  # the interrupted turn drains at the next prompt
    req = next(e for e in events if e["type"] == "attention.requested")
    assert req["data"]["respond_via"] == ["oob"]  # no operator route: Codex's own prompt decides


def test_qwen_unanswered_card_is_swept_before_session_end(stack: Any) -> None:
    _, tmp = stack
    events = read_jsonl(tmp / "logs" / "qwen-code" / f"{QWEN_SID}.jsonl")
    req = next(e for e in events if e["type"] == "attention.requested")
    resolved = next(e for e in events if e["type"] == "attention.resolved")
    assert resolved["subject"] == req["id"] and resolved["data"] == {"resolution": "dismissed"}


def test_antigravity_joins_and_steps(stack: Any) -> None:
    _, tmp = stack
    events = read_jsonl(tmp / "logs" / "antigravity" / f"{AG_SID}.jsonl")
    completed = next(e for e in events if e["type"] == "tool.completed")
    failed = next(e for e in events if e["type"] == "tool.failed")
    assert completed["subject"] == "view_file" and failed["subject"] == "run_command"
    assert completed["step"] == "0" and failed["data"]["error"]["type"] == "tool_error"
    step = next(e for e in events if e["type"] == "x.antigravity.step.completed")
    assert "subject" not in step and step["data"] == {"failed": False, "step_idx": 7}
    assert events[0]["data"]["client"] == {"name": "antigravity-cli"}


def test_kimi_permission_pair_and_drain(stack: Any) -> None:
    _, tmp = stack
    events = read_jsonl(tmp / "logs" / "kimi-code" / f"{KIMI_SID}.jsonl")
    req = next(e for e in events if e["type"] == "attention.requested")
    answered = next(e for e in events if e["type"] == "attention.answered")
    assert req["data"]["respond_via"] == ["oob"] and answered["subject"] == req["id"]
    assert answered["data"]["answer"] == {"option": "approved"} and answered["data"]["via"] == "oob"
    runs = [e["run"] for e in events if e["type"].startswith("run.")]
    assert runs[-2] == runs[-1] != runs[0]  # the stale second run is the one cancelled
