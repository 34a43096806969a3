"""Live: OpenCode, Kilo Code, pi, Cline, Hermes and Kimi Code, wired as a user wires them.

Each CLI runs one non-interactive prompt against the fake model, which calls the vendor's shell
tool once (``echo``) and then answers text; the vendor is wired with ``aep-collector hooks VENDOR
--install --home HOME`` (the harness). The collector's JSONL must hold the lifecycle Annex A
promises for that surface (``Live.check``: validate-events clean, runs and tools paired, every
attention request closed exactly once) and the tool's output must have reached the model.

What each surface cannot deliver in a one-shot run, and so is not asserted (seen live):
- OpenCode 1.18.33 / Kilo 7.7.7 ``run`` never deletes its session: no ``session.ended``.
- Cline 3.0.65 one-shot: TaskStart opens the run (Annex A.9 has no session.started); SessionShutdown
  and UserPromptSubmit do not fire.
- Hermes 0.19.0 ``-z``: on_session_end closes the run; on_session_finalize does not fire.
- Kimi Code 2.1.0 ``-p``: no SessionEnd.

Offline preparation a user with a network does not need: OpenCode and Kilo npm-install their
plugin package into every config folder unless it holds ``node_modules`` and a lock naming it;
the tests link the copy ``tests/live/setup`` installed (otherwise each run waits ~75 s for the
registry).

Control, where a CLI reaches it non-interactively (the operator is the official SDK, ``aep_sdk``,
subscribed to and answering through the collector's own relay role, ``relay_server``):
- pi's opt-in ``tool_call`` gate, Hermes' ``pre_tool_call`` gate and Kimi Code's PreToolUse gate:
  an operator's deny with guidance reaches the model as the tool result; allow lets the tool run;
  with nobody answering, the card times out after the hold window and the vendor runs the tool by
  itself (pi: no block; Hermes ``--yolo`` and Kimi ``-p`` approve on their own).
- OpenCode and Kilo permission asks: ``run`` auto-rejects a bus ``permission.asked`` at once
  (``permission.bash: "ask"``; "permission requested: bash (echo hi); auto-rejecting"), before any
  operator could answer, and the ``permission.ask`` plugin hook never fires. So for ``run`` the
  tier asserts what does happen: a card closed once by the vendor's own reply, and ``tool.failed``
  for the rejected call. Under ``opencode serve`` / ``kilo serve`` (prompt sent with
  ``POST /session/{id}/prompt_async``) the ask stays pending and the receiver answers it over the
  server's ``POST /permission/{id}/reply`` (``reply_routes``): allow runs the tool, a reject's
  message reaches the model, and an answer given over the same route by the user stands the
  card down. The deprecated ``POST /session/{id}/permissions/{id}`` both CLIs still serve drops
  the message (its payload is ``{response}`` alone): the receiver used it until this test.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aep_collector.pipeline.control import RESPOND
from aep_sdk.aio import ControlClient, subscribe

from tests.live import clis
from tests.live.fakemodel import shell, text
from tests.live.harness import Live, Spec, types, write_json

MARK = "aep-live-marker-9"


# -- how each vendor is pointed at the fake model ---------------------------------------------------


def _plugin_package(vendor: str, *folders: Path) -> None:
    """Give each config folder the plugin package the vendor would npm-install there (offline here)."""
    src = clis.CACHE / "npm" / vendor
    for d in folders:
        d.mkdir(parents=True, exist_ok=True)
        (d / "node_modules").symlink_to(src / "node_modules", target_is_directory=True)
        for name in ("package.json", "package-lock.json"):
            (d / name).write_text((src / name).read_text())


def _bus_provider(live: Live) -> dict[str, Any]:
    return {"provider": {"fake": {"npm": "@ai-sdk/openai-compatible",
                                  "options": {"baseURL": live.model.url + "/v1", "apiKey": "sk-fake"},
                                  "models": {"fake-model": {"tool_call": True}}}},
            "model": "fake/fake-model", "small_model": "fake/fake-model", "autoupdate": False, "share": "disabled"}


def _opencode_prepare(live: Live) -> None:
    live.env.update({"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"})
    write_json(live.work / "opencode.json", _bus_provider(live))
    _plugin_package("opencode", live.home / ".config" / "opencode")


def _kilo_prepare(live: Live) -> None:
    live.env.update({"KILO_DISABLE_MODELS_FETCH": "1", "KILO_DISABLE_AUTOUPDATE": "1", "KILO_TELEMETRY_LEVEL": "off",
                     "KILO_DISABLE_CODEBASE_INDEXING": "1", "KILO_DISABLE_SESSION_INGEST": "1"})
    write_json(live.work / "kilo.json", _bus_provider(live))
    _plugin_package("kilocode", live.home / ".config" / "kilo")


def _pi_prepare(live: Live) -> None:
    write_json(live.home / ".pi" / "agent" / "models.json", {"providers": {"fake": {
        "baseUrl": live.model.url + "/v1", "api": "openai-completions", "apiKey": "sk-fake",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": "fake-model"}]}}})


def _cline_prepare(live: Live) -> None:
    import subprocess

    res = subprocess.run([*live.prefix, "auth", "-p", "openai-compatible", "-k", "sk-fake", "-m", "fake-model",
                          "-b", live.model.url + "/v1"], cwd=live.work, env=live.env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def _hermes_prepare(live: Live) -> None:
    cfg = live.home / ".hermes" / "config.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f"model:\n  default: fake-model\n  provider: custom\n  base_url: {live.model.url}/v1\n"
                   "  api_key: sk-fake\n")


def _kimi_prepare(live: Live) -> None:
    live.env["KIMI_CLI_NO_AUTO_UPDATE"] = "1"
    cfg = live.home / ".kimi-code" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f'default_model = "fake"\n\n[providers.fake]\ntype = "openai"\nbase_url = "{live.model.url}/v1"\n'
                   'api_key = "sk-fake"\n\n[models.fake]\nprovider = "fake"\nmodel = "fake-model"\n'
                   "max_context_size = 100000\n")


SPECS: dict[str, Spec] = {
    "opencode": Spec("opencode", "opencode", "opencode", "opencode", ".config/opencode/plugins/aep-collector.js",
                     _opencode_prepare, lambda live, prompt: ["run", prompt], timeout=180),
    "kilocode": Spec("kilocode", "kilocode", "kilocode", "kilocode", ".config/kilo/plugins/aep-collector.js",
                     _kilo_prepare, lambda live, prompt: ["run", prompt], timeout=180),
    "pi": Spec("pi", "pi", "pi", "pi", ".pi/agent/settings.json", _pi_prepare,
               lambda live, prompt: ["--model", "fake/fake-model", "-p", prompt]),
    "cline": Spec("cline", "cline", "cline", "cline", ".cline/hooks", _cline_prepare, lambda live, prompt: [prompt]),
    "hermes": Spec("hermes", "hermes", "hermes", "hermes", ".hermes/config.yaml", _hermes_prepare,
                   lambda live, prompt: ["-z", prompt, "--accept-hooks", "--yolo"], timeout=180),
    "kimi_code": Spec("kimi_code", "kimi_code", "kimi_code", "kimi-code", ".kimi-code/config.toml", _kimi_prepare,
                      lambda live, prompt: ["-p", prompt]),
}
"""The six vendors of this module (the harness' own ``SPECS`` holds the other four)."""

LIFECYCLE = {  # vendor -> (session.started, session.ended) the one-shot surface delivers
    "opencode": (True, False), "kilocode": (True, False), "pi": (True, True), "cline": (False, False),
    "hermes": (True, False), "kimi_code": (True, False),
}


def sessions_of(events: list[dict[str, Any]]) -> list[str]:
    return sorted({e["session"] for e in events if e.get("session") and e["type"] == "run.started"})


@pytest.mark.parametrize("vendor", ["pi", "cline", "hermes", "kimi_code"])
def test_one_shell_call_lifecycle(tmp_path: Path, vendor: str) -> None:
    with Live(SPECS[vendor], tmp_path, [shell(f"echo {MARK}"), text("all done")]) as live:
        live.run(f"run echo {MARK}")
    started, ended = LIFECYCLE[vendor]
    events = live.check(started=started, ended=ended)
    results = live.model.tool_results()
    assert len(results) == 1 and MARK in results[0], (results, live.describe())
    assert len(sessions_of(events)) == 1, types(events)
    seen = types(events)
    assert seen.index("tool.requested") < seen.index("tool.completed") < seen.index("run.finished"), seen
    if vendor == "pi":
        # The extension flushes before pi exits: the whole turn, then session.ended last (issue 11).
        assert seen[-2:] == ["run.finished", "session.ended"], seen


@pytest.mark.parametrize("vendor", ["opencode", "kilocode"])
def test_a_run_with_an_allowed_and_an_auto_rejected_call(tmp_path: Path, vendor: str) -> None:
    """One ``run``: ``echo`` is allowed, ``touch`` asks and ``run`` rejects it on its own.

    The bus ``permission.asked`` becomes an informational card closed once by the vendor's reply,
    and the rejected call a ``tool.failed`` (``tool.execute.after`` never fires for it).
    """
    def prepare(live: Live) -> None:
        SPECS[vendor].prepare(live)
        name = "opencode.json" if vendor == "opencode" else "kilo.json"
        write_json(live.work / name, {"permission": {"bash": {"*": "ask", "echo *": "allow"}}})

    spec = Spec(**{**SPECS[vendor].__dict__, "prepare": prepare})
    turns = [shell(f"echo {MARK}"), shell("touch rejected.txt"), text("all done")]
    with Live(spec, tmp_path, turns) as live:
        live.run(f"run echo {MARK}, then touch rejected.txt", check=False)
    events = live.check(started=True, ended=False)
    assert len(sessions_of(events)) == 1, types(events)
    assert not (live.work / "rejected.txt").exists()
    seen = types(events)
    [done] = [e for e in events if e["type"] == "tool.completed"]
    [failed] = [e for e in events if e["type"] == "tool.failed"]
    assert done["data"]["tool"]["name"] == failed["data"]["tool"]["name"] == "bash"
    assert failed["data"]["error"]["type"] == "tool_error"
    [card] = [e for e in events if e["type"] == "attention.requested"]
    assert card["data"]["kind"] == "permission" and card["subject"] == "bash"
    [leg] = [e for e in events if e.get("subject") == card["id"]]
    assert leg["type"] == "attention.resolved"
    assert seen.index("tool.completed") < seen.index("attention.requested") < seen.index(leg["type"]) \
        < seen.index("tool.failed") < seen.index("run.finished"), seen
    assert any(MARK in r for r in live.model.tool_results()), live.describe()


# -- opt-in gates answered by an operator through the collector ------------------------------------

TOKEN = "live-plugins-control-token"
GATES = {  # vendor -> (receiver config, extra CLI env)
    "pi": ({"control": True}, {"AEP_PI_CONTROL": "1"}),
    "hermes": ({"control": True}, {}),
    "kimi_code": ({"control": True}, {}),
}


def relay_base(live: Live) -> str:
    assert live.collector is not None
    return f"http://127.0.0.1:{live.collector.ports['relay_server']}"


@pytest.fixture
async def operator_for() -> AsyncIterator[Any]:
    """Connects the SDK (subscription + control client) to a live collector's relay role."""
    opened: list[Any] = []

    async def connect(live: Live) -> tuple[Any, ControlClient]:
        sub = await subscribe(relay_base(live), token=TOKEN)
        opened.append(sub)
        client = ControlClient(relay_base(live), agent="aep-console", host="ops-host", token=TOKEN)
        await client.connect()
        opened.append(client)
        return sub, client

    yield connect
    for thing in reversed(opened):
        closing = thing.close()
        if inspect.isawaitable(closing):
            await closing


async def first_request(sub: Any) -> dict[str, Any]:
    async with asyncio.timeout(120):
        async for event in sub:
            if event.get("type") == "attention.requested":
                return event
    raise AssertionError("the subscription ended before an attention request")


@pytest.mark.parametrize(("vendor", "answer"), [("pi", "deny"), ("pi", "allow"), ("hermes", "deny"),
                                                ("hermes", "allow"), ("kimi_code", "deny"), ("kimi_code", "allow")])
async def test_gate_answered_by_the_operator(tmp_path: Path, vendor: str, answer: str, operator_for: Any) -> None:
    receiver, env = GATES[vendor]
    guidance = "not that; write notes.md instead"
    exporters = {"relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN}}
    with Live(SPECS[vendor], tmp_path, [shell(f"echo {MARK}"), text("all done")], receiver=receiver,
              exporters=exporters) as live:
        live.env.update(env)
        sub, client = await operator_for(live)
        run = asyncio.create_task(live.arun(f"run echo {MARK}"))
        req = await first_request(sub)
        assert req["data"]["respond_via"] == ["control"], req
        data = {"answer": {"text": guidance}} if answer == "deny" else {"answer": {"option": "allow"}}
        ack = await client.send(RESPOND, req["session"], subject=req["id"], data=data)
        assert ack["type"] == "control.accepted", ack
        await run
    results = live.model.tool_results()
    started, ended = LIFECYCLE[vendor]
    if answer == "deny":
        assert not any(MARK in r for r in results), results
        assert any(guidance in r for r in results), (results, live.describe())
        events = live.check(started=started, ended=ended, tools=0)
    else:
        assert any(MARK in r for r in results), (results, live.describe())
        events = live.check(started=started, ended=ended)
    legs = [e for e in events if e.get("subject") == req["id"] and e["type"].startswith("attention.")]
    assert [e["type"] for e in legs] == ["attention.answered", "attention.resolved"], types(events)



@pytest.mark.parametrize("vendor", ["pi", "hermes", "kimi_code"])
async def test_gate_hold_window_passes(tmp_path: Path, vendor: str, operator_for: Any) -> None:
    """Nobody answers: the card times out and the vendor goes on by itself (the gate fails open)."""
    receiver, env = GATES[vendor]
    exporters = {"relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN}}
    with Live(SPECS[vendor], tmp_path, [shell(f"echo {MARK}"), text("all done")],
              receiver={**receiver, "attention_timeout": 2}, exporters=exporters) as live:
        live.env.update(env)
        sub, _client = await operator_for(live)  # a live route: the gate holds
        run = asyncio.create_task(live.arun(f"run echo {MARK}"))
        req = await first_request(sub)
        assert req["data"]["respond_via"] == ["control"], req
        await run
    assert any(MARK in r for r in live.model.tool_results()), live.describe()  # the tool ran
    started, ended = LIFECYCLE[vendor]
    events = live.check(started=started, ended=ended)
    legs = [e for e in events if e.get("subject") == req["id"] and e["type"].startswith("attention.")]
    assert [e["type"] for e in legs] == ["attention.timeout"], types(events)
    seen = types(events)
    assert seen.index("attention.timeout") < seen.index("tool.completed"), seen


# -- OpenCode / Kilo bus asks under ``serve``, answered over the server's reply route ---------------


async def until(condition: Any, what: str, timeout: float = 120) -> Any:
    """Poll ``condition`` (gently: these reads parse the whole JSONL or call the server) until truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := condition()):
        if loop.time() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        await asyncio.sleep(0.2)
    return value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """``opencode serve`` / ``kilo serve`` on a free loopback port, driven over its HTTP API."""

    def __init__(self, live: Live) -> None:
        self.live = live
        self.base = f"http://127.0.0.1:{_free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "x-kilo-directory": quote(str(self.live.work), safe="")}
        req = urllib.request.Request(self.base + path, method=method, data=data, headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def up(self) -> bool:
        try:
            self.call("GET", "/session")
        except OSError:
            return False
        return True

    async def __aenter__(self) -> Served:
        port = self.base.rsplit(":", 1)[1]
        self.proc = subprocess.Popen([*self.live.prefix, "serve", "--port", port, "--hostname", "127.0.0.1"],
                                     cwd=self.live.work, env=self.live.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await until(self.up, "the server to answer")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def nth_request(live: Live, n: int) -> dict[str, Any]:
    """The ``n``-th attention request (1-based), once written."""
    def found() -> dict[str, Any] | None:
        reqs = [e for e in live.events() if e.get("type") == "attention.requested"]
        return reqs[n - 1] if len(reqs) >= n else None
    return await until(found, f"attention request #{n}")


@pytest.mark.parametrize("vendor", ["opencode", "kilocode"])
async def test_bus_asks_under_serve(tmp_path: Path, vendor: str, operator_for: Any) -> None:
    """Three asks in one served session: the operator allows the first; the second is answered in
    the vendor's own prompt (its reply route, as its UI does), which stands the card down; the
    operator rejects the third with guidance, which reaches the model as the tool's error.

    One session for all three: starting the server (plugins, provider package) is most of the time.
    """
    def prepare(live: Live) -> None:
        SPECS[vendor].prepare(live)
        write_json(live.work / ("opencode.json" if vendor == "opencode" else "kilo.json"),
                   {"permission": {"bash": "ask"}})

    spec = Spec(**{**SPECS[vendor].__dict__, "prepare": prepare})
    guidance = "not that file; write notes.md instead"
    turns = [shell("touch by-operator.txt"), shell("touch by-user.txt"), shell("touch refused.txt"), text("done")]
    exporters = {"relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN}}
    with Live(spec, tmp_path, turns, exporters=exporters) as live:
        _sub, client = await operator_for(live)
        async with Served(live) as served:
            session = served.call("POST", "/session", {})["id"]
            served.call("POST", f"/session/{session}/prompt_async",
                        {"parts": [{"type": "text", "text": "make the three files"}]})
            first = await nth_request(live, 1)
            assert first["data"]["respond_via"] == ["control", "oob"], first
            ack = await client.send(RESPOND, first["session"], subject=first["id"], data={"answer": {"option": "once"}})
            assert ack["type"] == "control.accepted", ack
            second = await nth_request(live, 2)
            [pending] = await until(lambda: served.call("GET", "/permission"), "the pending ask")
            served.call("POST", f"/permission/{pending['id']}/reply", {"reply": "once"})
            third = await nth_request(live, 3)
            ack = await client.send(RESPOND, third["session"], subject=third["id"],
                                    data={"answer": {"text": guidance}})
            assert ack["type"] == "control.accepted", ack
            await until(lambda: "run.finished" in types(live.events()), "the run to finish")
    assert (live.work / "by-operator.txt").exists() and (live.work / "by-user.txt").exists()
    assert not (live.work / "refused.txt").exists()
    # The reject message reached the vendor, which hands it to the model as the tool's error.
    assert any(guidance in r for r in live.model.tool_results()), live.describe()
    events = live.check(started=True, ended=False, tools=2)
    legs = {r["id"]: [e["type"] for e in events if e.get("subject") == r["id"]] for r in (first, second, third)}
    assert legs[first["id"]] == ["attention.answered", "attention.resolved"], types(events)
    assert legs[second["id"]] == ["attention.resolved"], types(events)
    assert legs[third["id"]] == ["attention.answered", "attention.resolved"], types(events)
    [failed] = [e for e in events if e["type"] == "tool.failed"]
    assert failed["data"]["tool"]["name"] == "bash"
