"""Kimi Code's detached PostToolUse racing its Stop: consumers see a run's tool events before its end.

Kimi fires PostToolUse fire-and-forget and the shim posts it from a detached child, so under load
the Stop can reach the collector first (seen live at load 11). These tests POST the hooks in that
order to a real collector on loopback and read the JSONL consumers get. The grace is a config value:
long where the test must not depend on it, short where it is what the test is about. A held Stop
is answered once its run.finished is recorded (the durable record before the reply, like every
hook), so the tests POST it from a thread and read ``held_run_ends`` off ``/healthz``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from aep_collector.receivers.hook_vendors import kimi_code

from tests.helpers import base_config, collector, read_jsonl

SID = "session_order"
LONG = 5.0  # the most allowed; never reached in a passing test: only the hooks' order decides


def post(port: int, name: str, **kw: Any) -> Any:
    body = {"hook_event_name": name, "session_id": SID, "cwd": "/w", **kw}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/hook", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        raw = resp.read()
    return json.loads(raw) if raw else None


def types_once(path: Path, last: str, timeout: float = 20.0) -> list[str]:
    """The session's types once ``last`` is among them (waits for the pipeline, asserts no timing)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = [e["type"] for e in read_jsonl(path)] if path.exists() else []
        if last in seen or time.monotonic() > deadline:
            return seen
        time.sleep(0.02)


def held_stop(port: int, path: Path) -> tuple[threading.Thread, dict[str, Any]]:
    """POST Stop from a thread; return once the receiver holds it. ``out``: its reply and whether
    run.finished was in the JSONL when the reply came."""
    out: dict[str, Any] = {}

    def send() -> None:
        out["reply"] = post(port, "Stop", stop_hook_active=False)
        out["recorded"] = path.exists() and "run.finished" in [e["type"] for e in read_jsonl(path)]

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            if json.loads(resp.read()).get("held_run_ends") == 1:
                return thread, out
        time.sleep(0.02)
    raise AssertionError(f"the Stop was never held: {out}")


def kimi(tmp: Path, grace: float) -> Any:
    return collector(base_config(tmp, receivers={"kimi_code": {"endpoint": "127.0.0.1:0", "detached_grace": grace}}),
                     tmp)


def stop_released_by(port: int, path: Path, hook: str, **fields: Any) -> dict[str, Any]:
    """A Stop the receiver holds, then ``hook`` posted: the Stop's outcome (``held_stop``) once it is let go."""
    thread, out = held_stop(port, path)
    post(port, hook, **fields)
    thread.join(20)
    return out


def call(port: int) -> None:
    post(port, "SessionStart", source="startup")
    post(port, "UserPromptSubmit", prompt="run echo")
    post(port, "PreToolUse", tool_name="Bash", tool_input={"command": "echo"}, tool_call_id="call_1")


def test_stop_before_the_detached_post_tool_use_still_ends_the_run_last(tmp_path: Path) -> None:
    with kimi(tmp_path, LONG) as c:
        port = c.ports["receiver/kimi_code"]
        call(port)
        path = tmp_path / "logs" / "kimi-code" / f"{SID}.jsonl"
        out = stop_released_by(port, path, "PostToolUse", tool_name="Bash", tool_call_id="call_1", tool_output="hi")
        assert out == {"reply": {}, "recorded": True}, out  # neutral, and only once run.finished is in
        seen = types_once(path, "run.finished")
    assert seen == ["session.started", "run.started", "tool.requested", "tool.completed", "run.finished"], seen
    events = read_jsonl(path)
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert len({e["run"] for e in events[1:]}) == 1  # the tool's events are inside the run


def test_a_lost_post_tool_use_holds_run_finished_only_for_the_grace(tmp_path: Path) -> None:
    with kimi(tmp_path, 0.05) as c:
        port = c.ports["receiver/kimi_code"]
        call(port)
        path = tmp_path / "logs" / "kimi-code" / f"{SID}.jsonl"
        assert post(port, "Stop", stop_hook_active=False) == {}  # after the grace, with run.finished in
        assert [e["type"] for e in read_jsonl(path)][-1] == "run.finished"
        # Very late after all: still recorded (never lose an accepted event), outside the ended run.
        post(port, "PostToolUse", tool_name="Bash", tool_call_id="call_1", tool_output="hi")
        seen = types_once(path, "tool.completed")
    assert seen == ["session.started", "run.started", "tool.requested", "run.finished", "tool.completed"], seen
    assert "run" not in read_jsonl(path)[-1]


def test_the_next_hook_of_the_session_lets_the_held_stop_go_first(tmp_path: Path) -> None:
    with kimi(tmp_path, LONG) as c:
        port = c.ports["receiver/kimi_code"]
        call(port)
        path = tmp_path / "logs" / "kimi-code" / f"{SID}.jsonl"
        # The run is over for Kimi: never wait for the grace.
        out = stop_released_by(port, path, "UserPromptSubmit", prompt="next")
        assert out == {"reply": {}, "recorded": True}, out
        seen = types_once(path, "run.started")
    assert seen == ["session.started", "run.started", "tool.requested", "run.finished", "run.started"], seen


def test_shutdown_delivers_a_held_stop(tmp_path: Path) -> None:
    with kimi(tmp_path, LONG) as c:
        port = c.ports["receiver/kimi_code"]
        call(port)
        thread, out = held_stop(port, tmp_path / "logs" / "kimi-code" / f"{SID}.jsonl")
        c.stop()
        thread.join(20)
    seen = [e["type"] for e in read_jsonl(tmp_path / "logs" / "kimi-code" / f"{SID}.jsonl")]
    assert seen[-1] == "run.finished", seen


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        return json.loads(resp.read())


def test_a_call_never_reported_holds_one_stop_then_is_forgotten_and_said(tmp_path: Path) -> None:
    """Kimi fires PreToolUse and the PostToolUse never comes (the tool was killed): the run's Stop
    waits the grace once; the call then holds no later Stop of the session, and it is counted in
    /healthz and logged. A report that still comes lands outside the runs."""
    with kimi(tmp_path, 1.0) as c:
        port = c.ports["receiver/kimi_code"]
        call(port)
        path = tmp_path / "logs" / "kimi-code" / f"{SID}.jsonl"
        assert post(port, "Stop", stop_hook_active=False) == {}  # the full grace: nothing else of the session came
        assert healthz(port)["unreported_tool_calls"] == 1
        for turn in range(2):  # later turns, with no tool or with a tool reported in time
            post(port, "UserPromptSubmit", prompt=f"turn {turn}")
            if turn:
                post(port, "PreToolUse", tool_name="Bash", tool_input={"command": "ls"}, tool_call_id="call_2")
                post(port, "PostToolUse", tool_name="Bash", tool_call_id="call_2", tool_output="ok")
            stop = threading.Thread(target=post, args=(port, "Stop"), kwargs={"stop_hook_active": False})
            stop.start()
            held = 0
            while stop.is_alive():  # were it held, it would be for a whole second: seen here
                held = max(held, healthz(port).get("held_run_ends", 0))
            stop.join()
            assert held == 0, f"turn {turn}: the Stop waited for the forgotten call"
        post(port, "PostToolUse", tool_name="Bash", tool_call_id="call_1", tool_output="late")
        assert healthz(port)["unreported_tool_calls"] == 1
    seen = [e["type"] for e in read_jsonl(path)]  # stopped: everything accepted is in
    assert seen.count("run.finished") == 3 and seen[-1] == "tool.completed", seen
    assert "run" not in read_jsonl(path)[-1]  # the very late report: recorded, outside every run
    log = "".join(c.log)
    assert "call_1" in log and "never reported" in log, log


def test_detached_grace_is_checked() -> None:
    kimi_code.DECLARATION.config_class(detached_grace=0).validate()  # 0: no holding at all
    for bad in (-1.0, float("nan"), 5.5):
        try:
            kimi_code.DECLARATION.config_class(detached_grace=bad).validate()
        except ValueError:
            continue
        raise AssertionError(f"detached_grace={bad} accepted")
