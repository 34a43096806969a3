"""End to end: the real collector binary, a realistic Claude Code session over HTTP, the JSONL file."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests.helpers import base_config, collector, read_jsonl

SID = "5f1d0c1e-2b7a-4c1e-9d1e-1a2b3c4d5e6f"
SECRET = "password=hunter2-very-secret"


def post(port: int, body: object, path: str = "/hook") -> tuple[int, object]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(port: int, path: str) -> object:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            body = json.loads(resp.read())
            status = resp.status
    except urllib.error.HTTPError as exc:
        body, status = json.loads(exc.read()), exc.code
    if path == "/healthz":  # probes read the status: 503 exactly while ok is false
        assert status == (200 if body["ok"] else 503), (status, body)
    return body


def common(name: str) -> dict:
    return {"session_id": SID, "transcript_path": f"/home/dev/.claude/projects/x/{SID}.jsonl",
            "cwd": "/home/dev/project", "permission_mode": "default", "hook_event_name": name}


def session() -> list[dict]:
    bash = {"command": "pytest -q", "description": "run the tests"}
    return [
        {**common("SessionStart"), "source": "startup", "model": "claude-sonnet-4-5"},
        {**common("UserPromptSubmit"), "prompt": f"fix the build, {SECRET}"},
        {**common("PreToolUse"), "tool_name": "Read", "tool_input": {"file_path": "/home/dev/project/a.py"},
         "tool_use_id": "toolu_01"},
        {**common("PostToolUse"), "tool_name": "Read", "tool_input": {"file_path": "/home/dev/project/a.py"},
         "tool_response": {"content": "print('hi')"}, "tool_use_id": "toolu_01"},
        {**common("PreToolUse"), "tool_name": "Edit", "tool_input": {"file_path": "a.py", "old_string": "hi",
                                                                      "new_string": "ho"}, "tool_use_id": "toolu_02"},
        {**common("PostToolUse"), "tool_name": "Edit", "tool_input": {"file_path": "a.py"},
         "tool_response": {"success": True}, "tool_use_id": "toolu_02"},
        {**common("PreToolUse"), "tool_name": "Bash", "tool_input": bash, "tool_use_id": "toolu_03"},
        {**common("PostToolUseFailure"), "tool_name": "Bash", "tool_input": bash, "tool_use_id": "toolu_03",
         "error": "Exit code 1: 2 failed", "is_interrupt": False},
        {**common("Notification"), "message": "Claude is waiting for your input", "notification_type": "idle_prompt"},
        {**common("PreCompact"), "trigger": "auto", "custom_instructions": ""},
        {**common("PostCompact"), "trigger": "auto"},
        {**common("Stop"), "stop_hook_active": False},
        {**common("SessionEnd"), "reason": "exit"},
    ]


EXPECTED_TYPES = [
    "session.started", "run.started", "tool.requested", "tool.completed", "tool.requested", "tool.completed",
    "tool.requested", "tool.failed", "progress.status", "session.compacted", "run.finished", "session.ended",
]


def test_claude_code_session_end_to_end(tmp_path):
    from aep_collector.pipeline.validate import StreamValidator, envelope_errors

    cfg = base_config(tmp_path)
    with collector(cfg, tmp_path) as c:
        port = c.ports["receiver/claude_code"]
        assert get(port, "/healthz") == {"ok": True, "relay": False}
        for body in session():
            status, reply = post(port, body)
            assert status == 200 and reply == {}, (body["hook_event_name"], status, reply)
        assert c.stop() == 0
    path = tmp_path / "logs" / "claude-code" / f"{SID}.jsonl"
    events = read_jsonl(path)
    assert [e["type"] for e in events] == EXPECTED_TYPES
    assert [(e["epoch"], e["seq"]) for e in events] == sorted((e["epoch"], e["seq"]) for e in events)
    assert [e["seq"] for e in events] == list(range(len(events)))
    stream = StreamValidator()
    for e in events:
        assert envelope_errors(e) == [], e
        assert stream.feed(e) == [], e
    assert stream.finish() == []
    run = events[1]["run"]
    assert all(e.get("run") == run for e in events[1:11])
    assert "run" not in events[0] and "run" not in events[11]
    failed = events[7]
    assert failed["data"]["tool"] == {"name": "Bash", "call_id": "toolu_03"}
    raw = path.read_text()
    assert "hunter2" not in raw and "fix the build" not in raw and "/home/dev" not in raw  # metadata ceiling
    assert all(e.get("capture", "metadata") == "metadata" for e in events)

    # A restart bumps the epoch; seq starts again under it.
    with collector(cfg, tmp_path) as c:
        post(c.ports["receiver/claude_code"], {**common("UserPromptSubmit"), "prompt": "again"})
        c.stop()
    after = read_jsonl(path)[len(events):]
    assert [(e["type"], e["epoch"], e["seq"]) for e in after] == [("run.started", events[0]["epoch"] + 1, 0)]


def test_bad_requests_get_clear_errors_and_the_daemon_keeps_serving(tmp_path):
    cfg = base_config(tmp_path)
    cfg["receivers"]["claude_code"].update(max_body_bytes=2048, max_slim_bytes=0)  # no slimming: 413
    with collector(cfg, tmp_path) as c:
        port = c.ports["receiver/claude_code"]
        status, body = post(port, b"{not json")
        assert status == 400 and body["error"] == "invalid-json" and "line 1" in body["detail"]
        status, body = post(port, b"[1, 2]")
        assert status == 400 and body["error"] == "invalid-payload"
        status, body = post(port, b"\xff\xfe")
        assert status == 400 and body["error"] == "invalid-json"
        status, body = post(port, {"session_id": "s"})
        assert status == 400 and "hook_event_name" in body["detail"]
        status, body = post(port, {**common("UserPromptSubmit"), "prompt": "x" * 5000})
        assert status == 413 and body == {"error": "payload-too-large", "detail": "body over 2048 bytes",
                                          "max_bytes": 2048}
        status, body = post(port, {"x": 1}, path="/nope")
        assert status == 404 and body["error"] == "not-found"
        status, body = post(port, {**common("SessionStart"), "source": "startup"}, path="/")
        assert status == 200 and body == {}
        assert get(port, "/healthz")["ok"] is True
        assert c.stop() == 0


def test_unwritable_log_directory_still_answers_hooks_and_shows_in_healthz(tmp_path):
    cfg = base_config(tmp_path)
    (tmp_path / "logs").write_text("a file where the log directory should be")
    with collector(cfg, tmp_path) as c:
        port = c.ports["receiver/claude_code"]
        for _ in range(3):
            assert post(port, {**common("UserPromptSubmit"), "prompt": "hi"}) == (200, {})
        health = get(port, "/healthz")
        assert health["ok"] is False and "exporter/jsonl" in health["problems"]
        assert health["dropped"]["exporter/jsonl"] == 3
        assert c.stop() == 0
    lines = "".join(c.log).splitlines()
    errors = [line.split("exporter/jsonl: ", 1)[1].split(":", 1)[0] for line in lines
              if "ERROR aep.health: exporter/jsonl" in line]
    assert errors and len(errors) == len(set(errors)), errors  # once per cause, not once per event


def test_validate_events_command(tmp_path):
    import subprocess
    import sys

    from tests.helpers import ROOT

    good = tmp_path / "good.jsonl"
    cfg = base_config(tmp_path)
    with collector(cfg, tmp_path) as c:
        post(c.ports["receiver/claude_code"], {**common("SessionStart"), "source": "startup"})
        c.stop()
    good.write_bytes((tmp_path / "logs" / "claude-code" / f"{SID}.jsonl").read_bytes())
    ok = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "validate-events", str(good)], cwd=ROOT,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"aep":"0.1","type":"run.started"}\n')
    res = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "validate-events", str(bad)], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 1 and "required" in res.stdout


def test_nan_and_infinity_are_not_json(tmp_path):
    with collector(base_config(tmp_path), tmp_path) as c:
        port = c.ports["receiver/claude_code"]
        for literal in (b"NaN", b"Infinity", b"-Infinity"):
            status, body = post(port, b'{"hook_event_name": "Stop", "session_id": "s", "x": ' + literal + b"}")
            assert status == 400 and body["error"] == "invalid-json" and "not a JSON value" in body["detail"]
        c.stop()


def test_a_permission_nobody_could_answer_is_closed_before_session_ended(tmp_path):
    # Live tier (issue 11): with no relay the hook gets {} at once; claude -p then refuses the call
    # without another hook, so only the session's end can close the card.
    from aep_collector.pipeline.validate import validate_file

    with collector(base_config(tmp_path), tmp_path) as c:
        port = c.ports["receiver/claude_code"]
        for body in ({**common("UserPromptSubmit"), "prompt": "go"},
                     {**common("PermissionRequest"), "tool_name": "Bash", "tool_input": {"command": "touch x"}},
                     {**common("Stop")}, {**common("SessionEnd"), "reason": "other"}):
            assert post(port, body) == (200, {})
        c.stop()
    path = tmp_path / "logs" / "claude-code" / f"{SID}.jsonl"
    events = read_jsonl(path)
    assert [e["type"] for e in events] == ["run.started", "attention.requested", "run.finished",
                                           "attention.resolved", "session.ended"]
    req, res = events[1], events[3]
    assert req["data"]["respond_via"] == ["oob"]
    assert res["subject"] == req["id"] and res["data"]["resolution"] == "dismissed"
    assert validate_file(str(path)).ok


def test_sighup_drains_and_stops_like_sigterm(tmp_path):
    """A closed terminal sends SIGHUP: before, its default action killed the collector mid-stream."""
    import signal

    cfg = base_config(tmp_path)
    with collector(cfg, tmp_path) as c:
        assert post(c.ports["receiver/claude_code"], {**common("UserPromptSubmit"), "prompt": "hi"}) == (200, {})
        assert c.proc is not None
        c.proc.send_signal(signal.SIGHUP)
        out, _ = c.proc.communicate(timeout=15)
    assert c.proc.returncode == 0, out
    assert "aep-collector stopped" in out
