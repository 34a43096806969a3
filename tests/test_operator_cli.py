"""The whole loop with real processes, as a new user runs it: ``aep-collector`` with no flags from
an empty folder (scratch HOME), a Claude Code session posted to it, ``aep-collector tail`` showing it
live in a second process, and ``aep-collector respond`` answering its held permission. Then the
operator commands' errors and exit codes, and ``tail --file`` / ``timeline --file --dag``.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

EXE = Path(sys.executable).with_name("aep-collector")
SID = "cli-loop-1"
RECEIVER_ENV = ("CLAUDE_CODE", "CODEX", "GEMINI_CLI", "QWEN_CODE", "VSCODE", "ANTIGRAVITY", "KIMI_CODE",
                "OPENCODE", "KILOCODE", "CLINE", "HERMES", "PI", "OTLP_GRPC", "OTLP_HTTP")


def scratch_env(home: Path) -> dict[str, str]:
    """A new user's environment: its own HOME; every port free (env overrides, still no flags)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    env.update(HOME=str(home), NO_COLOR="1", PYTHONUNBUFFERED="1",
               **{f"AEP_{name}_ENDPOINT": "127.0.0.1:0" for name in RECEIVER_ENV},
               AEP_RELAY_SERVER_ENDPOINT="127.0.0.1:0")
    return env


class Lines:
    """A process's output lines, read on a thread so a test can wait for one without blocking forever."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.q, self.seen = proc, queue.Queue(), []  # type: ignore[var-annotated]
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.q.put(line)
        self.q.put(None)

    def wait_for(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r}; saw:\n{''.join(self.seen)}")


def cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/hook", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read() or b"{}")


def wait_for_subscriber(state: Path, timeout: float = 30.0) -> None:
    """Until the relay role counts a subscriber (the tail attached), by its authorized /healthz."""
    doc = json.loads((state / "relay.json").read_text())
    req = urllib.request.Request(f"{doc['endpoint']}/healthz", headers={
        "Authorization": f"Bearer {Path(doc['token_file']).read_text().strip()}"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(req, timeout=5) as resp:
            if json.loads(resp.read())["subscribers"] >= 1:
                return
        time.sleep(0.05)
    raise AssertionError("the tail never attached")


def hook(name: str, **extra: Any) -> dict[str, Any]:
    return {"session_id": SID, "cwd": "/home/dev/project", "hook_event_name": name, **extra}


@pytest.fixture
def user(tmp_path: Path) -> tuple[dict[str, str], Path]:
    home, cwd = tmp_path / "home", tmp_path / "somewhere"
    home.mkdir()
    cwd.mkdir()
    return scratch_env(home), cwd


def test_capture_watch_answer_with_real_processes(user: tuple[dict[str, str], Path]) -> None:
    env, cwd = user
    collector = subprocess.Popen([str(EXE)], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
    tail = None
    try:
        out = Lines(collector)
        port = int(out.wait_for(r"receiver/claude_code listening on \S+:(\d+)").group(1))
        out.wait_for(r"aep-collector started")
        state = Path(env["HOME"]) / ".aep"
        token = state / "relay.token"
        assert token.stat().st_mode & 0o777 == 0o600
        assert json.loads((state / "relay.json").read_text())["token_file"] == str(token)
        assert not [line for line in out.seen if "relay unreachable" in line or "WARNING" in line]

        tail = subprocess.Popen([str(EXE), "tail", "--agent", "claude-code"], env=env, cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = Lines(tail)
        wait_for_subscriber(state)
        assert post(port, hook("SessionStart", source="startup")) == {}
        assert post(port, hook("UserPromptSubmit", prompt="build it")) == {}
        lines.wait_for(r"claude-code\s+cli-loop-1\s+session\.started")
        lines.wait_for(r"run\.started")

        replies: queue.Queue[dict[str, Any]] = queue.Queue()
        ask = hook("PermissionRequest", tool_name="Bash", tool_input={"command": "make"}, tool_use_id="toolu_1")
        threading.Thread(target=lambda: replies.put(post(port, ask)), daemon=True).start()
        lines.wait_for(r"attention\.requested")
        pending = cli(env, cwd, "pending", "--json")
        assert pending.returncode == 0, pending.stderr
        (request,) = [json.loads(line) for line in pending.stdout.splitlines()]
        assert request["data"]["respond_via"] == ["control"] and request["session"] == SID
        human = cli(env, cwd, "pending")
        assert request["id"] in human.stdout and "option allow" in human.stdout
        assert re.search(r"\((\d+) s left\)", human.stdout), human.stdout  # the hold's expires_at

        # Bad input: a clear error and its own exit code, never a traceback.
        for args, code in ((["respond", "01NOSUCHREQUEST0000000000", "--allow"], 3),
                           (["respond", request["id"], "--values", "{not json"], 2),
                           (["respond", request["id"]], 2),
                           (["cancel", "r_nosuchrun"], 3),
                           (["timeline", "no-such-session"], 3)):
            bad = cli(env, cwd, *args)
            assert bad.returncode == code, (args, bad.stdout, bad.stderr)
            assert "Traceback" not in bad.stderr and bad.stderr.strip(), args

        answered = cli(env, cwd, "respond", request["id"], "--allow")
        assert answered.returncode == 0, answered.stderr
        assert "accepted" in answered.stdout
        reply = replies.get(timeout=30)
        assert reply["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
        lines.wait_for(r"attention\.answered")
        again = cli(env, cwd, "respond", request["id"], "--deny", "too late")
        assert again.returncode == 3 and "already resolved" in again.stderr

        timeline = cli(env, cwd, "timeline", SID, "--dag")
        assert timeline.returncode == 0, timeline.stderr
        assert re.search(r"attention\.requested .*\n.*└─ control\.|attention\.requested", timeline.stdout)
        assert cli(env, cwd, "hooks", "claude-code", "--install").returncode == 0
        status = cli(env, cwd, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "collector: running" in status.stdout and re.search(r"claude_code\s+127\.0\.0\.1:0\s+", status.stdout)
        assert re.search(r"claude-code\s+\d{4}-\S+ [a-z.]+ \(session cli-loop-1\)", status.stdout)  # its last event
        assert re.search(r"claude-code\s+wired", status.stdout) and re.search(r"codex\s+not wired", status.stdout)
    finally:
        for proc in (tail, collector):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=15)
    assert collector.returncode == 0
    gone = cli(env, cwd, "respond", "01ANYREQUEST000000000000000", "--allow")
    assert gone.returncode == 4 and "no running collector" in gone.stderr and "Traceback" not in gone.stderr
    # A collector killed with -9 leaves its relay.json behind: the port no longer answers.
    (state / "relay.json").write_text(json.dumps({"endpoint": "http://127.0.0.1:9", "token_file": str(token)}))
    stale = cli(env, cwd, "respond", "01ANYREQUEST000000000000000", "--allow")
    assert stale.returncode == 4 and "unreachable" in stale.stderr and "Traceback" not in stale.stderr


def test_tail_and_timeline_read_a_jsonl_log(tmp_path: Path, user: tuple[dict[str, str], Path]) -> None:
    env, cwd = user
    src = f"aep://h/agent/claude-code/session/{SID}"
    base = {"aep": "0.1", "source": src, "agent": "claude-code", "session": SID, "time": "2026-12-03T08:00:00.000Z"}
    events = [dict(base, id="A", type="session.started", seq=0),
              dict(base, id="B", type="run.started", seq=1, run="r1", cause="A"),
              dict(base, id="C", type="tool.completed", seq=2, run="r1", cause="B", severity="debug"),
              dict(base, id="D", type="run.finished", seq=3, run="r1", cause="B")]
    log = tmp_path / f"{SID}.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in [events[0], events[2], events[1], events[3]]) + "junk\n")
    tl = cli(env, cwd, "timeline", SID, "--file", str(log), "--json")
    assert [json.loads(x)["id"] for x in tl.stdout.splitlines()] == ["A", "B", "C", "D"]
    dag = cli(env, cwd, "timeline", SID, "--file", str(log), "--dag").stdout.splitlines()
    assert [line.split(" ")[0].strip("│├└─ ") or line for line in dag][0] == "session.started"
    assert dag[1].startswith("└─ run.started") and "├─ tool.completed" in dag[2] and "└─ run.finished" in dag[3]
    tail = cli(env, cwd, "tail", "--file", str(log), "--type", "run.*", "--json")
    assert [json.loads(x)["id"] for x in tail.stdout.splitlines()] == ["B", "D"]
    quiet = cli(env, cwd, "tail", "--file", str(log), "--severity", "info")
    assert "tool.completed" not in quiet.stdout and "run.finished" in quiet.stdout
    missing = cli(env, cwd, "tail", "--file", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    down = cli(env, cwd, "tail")
    assert down.returncode == 4 and "no running collector" in down.stderr


def test_version_and_help_name_things_as_users_do(user: tuple[dict[str, str], Path]) -> None:
    env, cwd = user
    assert re.fullmatch(r"aep-collector \S+\n", cli(env, cwd, "--version").stdout)
    for command in ("tail", "timeline", "pending", "respond", "cancel", "status"):
        text = cli(env, cwd, command, "--help").stdout
        usage = text.split("\n\n")[0]
        assert not re.search(r"[A-Z]+_[A-Z]+|[a-z]+_[a-z]+", usage), usage  # no RUN_CONFIG, status_config
        assert "{" not in usage and text.count("\n") > 3, text
    assert "{" not in cli(env, cwd, "--help").stdout.split("\n\n")[0]
