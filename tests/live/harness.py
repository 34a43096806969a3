"""The live tier's harness: a real agent CLI, a real collector process, a scripted fake model.

One test is one :class:`Live` session::

    from tests.live.fakemodel import shell, text
    from tests.live.harness import Live, SPECS

    def test_codex_shell(tmp_path):
        with Live(SPECS["codex"], tmp_path, [shell("echo hi"), text("done")]) as live:
            live.run("run echo hi")            # the CLI, non-interactively, HOME = live.home
        events = live.check()                  # collector stopped, JSONL validated, lifecycle asserted
        assert live.model.tool_results()       # what the agent sent back to the model

What :class:`Live` does, in order (``__enter__``):

1. makes ``home/`` (the CLI's ``HOME``), ``work/`` (its cwd), ``logs/`` (JSONL) and ``state/`` under
   ``tmp_path``; starts the :class:`~tests.live.fakemodel.FakeModel` with the scripted turns;
2. starts ``aep-collector`` as a real process on a free loopback port with the vendor's receiver
   (``receiver`` overrides its config, ``exporters`` adds exporters, e.g. the relay);
3. ``spec.prepare(live)``: points the CLI at the fake model (env in ``live.env``, config files in
   ``live.home`` / ``live.work``) and sets the vendor's trust flags;
4. wires the hooks exactly as a user does: ``aep-collector hooks VENDOR --install --home HOME``
   with ``--config`` (the collector's own config, for hold windows) and ``--url`` (the receiver's
   real port).

``live.run(prompt, *args)`` runs ``spec.command(live, prompt)`` (+ ``args``) with the CLI prefix from
:mod:`tests.live.clis`; a missing CLI fails under ``CI=true`` and skips loudly elsewhere.
``live.stop()`` (or leaving the ``with``) stops the collector gracefully (it drains). ``live.events()``
reads every JSONL file the agent got, ``live.check(...)`` asserts the tier's contract and returns the
events: ``validate-events`` accepts every file, and per session ``session.started`` (optional),
runs that start once and end once, ``tool.requested``/``tool.completed`` paired on ``call_id`` in
order, every ``attention.requested`` closed exactly once before ``session.ended``, and
``session.ended`` last (when ``ended`` is true).

A vendor is a :class:`Spec`: the four here (Claude Code, Codex, Gemini CLI, Qwen Code) are in
:data:`SPECS`; a test module may build its own ``Spec`` and pass it to :class:`Live` the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aep_collector.pipeline.envelope import UNKNOWN_SESSION

from tests.helpers import ROOT, Collector, read_jsonl
from tests.live import clis
from tests.live.fakemodel import FakeModel, Turn

RUN_TERMINALS = ("run.finished", "run.failed", "run.cancelled")
TOOL_TERMINALS = ("tool.completed", "tool.failed", "tool.denied")
ATTENTION_TERMINALS = ("attention.resolved", "attention.timeout")


@dataclass
class Spec:
    """How the live tier drives one vendor.

    ``vendor``: the name ``aep-collector hooks`` takes; ``receiver``: the receiver type; ``cli``: the
    :mod:`tests.live.clis` key; ``agent``: the JSONL folder; ``hooks_file``: where ``--install``
    registers it, relative to HOME (documentation for readers of a Spec); ``prepare(live)``: model endpoint and
    trust wiring; ``command(live, prompt)``: the CLI's arguments for one non-interactive prompt.
    """

    vendor: str
    receiver: str
    cli: str
    agent: str
    hooks_file: str
    prepare: Callable[[Live], None]
    command: Callable[[Live, str], list[str]]
    timeout: float = 120.0


def _json_file(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def write_json(path: Path, obj: dict[str, Any], merge: bool = True) -> None:
    """Write ``obj`` to ``path``, deep-merged into what is there (a user's existing settings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(deep_merge(_json_file(path), obj) if merge else obj, indent=2))


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class Live:
    """One live session; see the module docstring."""

    def __init__(self, spec: Spec, tmp_path: Path, turns: list[Turn] | None = None, *,
                 receiver: dict[str, Any] | None = None, exporters: dict[str, Any] | None = None,
                 ceiling: str = "metadata") -> None:
        self.spec = spec
        self.root = tmp_path
        self.home = tmp_path / "home"
        self.work = tmp_path / "work"
        self.logs = tmp_path / "logs"
        self.model = FakeModel(turns)
        self.receiver_config = {"endpoint": "127.0.0.1:0", **(receiver or {})}
        self.exporters = exporters or {}
        self.ceiling = ceiling
        self.env: dict[str, str] = {}
        self.collector: Collector | None = None
        self.runs: list[subprocess.CompletedProcess[str]] = []
        self.wiring: str = ""

    # -- lifecycle ---------------------------------------------------------------------------------

    def __enter__(self) -> Live:
        self.prefix = clis.require(self.spec.cli)
        for d in (self.home, self.work, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.model.start()
        try:
            self.collector = Collector(self.config(), self.root).start()
            node = clis.node_bin_dir()
            self.env = {
                "HOME": str(self.home), "PATH": os.pathsep.join(p for p in (node, "/usr/local/bin", "/usr/bin", "/bin")
                                                                if p),
                "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": str(self.root), "NO_COLOR": "1", "CI": "1",
                "NO_UPDATE_NOTIFIER": "1",
            }
            self.spec.prepare(self)
            self.wire()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        self.model.stop()
        self.reap()

    def reap(self) -> None:
        """Kill what a CLI left running in this session's folders (Cline 3 detaches a hub daemon
        per ``--cwd``), so no test outlives its session as a process."""
        marks = [str(self.work).encode(), str(self.home).encode()]
        for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if any(m in cmdline for m in marks):
                    os.kill(int(entry.name), 9)

    def config(self) -> dict[str, Any]:
        exporters = {"jsonl": {"directory": str(self.logs), "fsync": "never"}, **self.exporters}
        return {
            "receivers": {self.spec.receiver: self.receiver_config},
            "processors": {"mapping": None, "runs": None, "capture": {"ceiling": self.ceiling}},
            "exporters": exporters,
            "service": {"state_dir": str(self.root / "state"), "pipelines": {"agents": {
                "receivers": [self.spec.receiver], "processors": ["mapping", "runs", "capture"],
                "exporters": list(exporters)}}},
        }

    @property
    def port(self) -> int:
        assert self.collector is not None
        return self.collector.ports[f"receiver/{self.spec.receiver}"]

    @property
    def hook_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def stop(self) -> None:
        """Stop the collector gracefully (it drains and flushes); idempotent."""
        c = self.collector
        if c is not None and c.proc is not None and c.proc.poll() is None:
            c.stop()

    # -- wiring ------------------------------------------------------------------------------------

    def aep(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``aep-collector ARGS`` as a user runs it (the real console entry point of this checkout)."""
        return subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, env={**os.environ, "HOME": str(self.home)})

    def wire(self) -> None:
        """Register the collector in the vendor's config as a user does: ``hooks VENDOR --install``."""
        assert self.collector is not None
        res = self.aep("hooks", self.spec.vendor, "--config", str(self.collector.path), "--url", self.hook_url,
                       "--install", "--home", str(self.home))
        assert res.returncode == 0, f"hooks --install failed: {res.stdout}{res.stderr}"
        self.wiring = res.stdout + res.stderr

    # -- running -----------------------------------------------------------------------------------

    def run(self, prompt: str, *args: str, timeout: float | None = None, input: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the CLI once on ``prompt``; with ``check`` a non-zero exit fails with its output."""
        argv = [*self.prefix, *self.spec.command(self, prompt), *args]
        try:
            res = subprocess.run(argv, cwd=self.work, env=self.env, capture_output=True, text=True, input=input,
                                 timeout=timeout or self.spec.timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{self.spec.cli} did not finish in {exc.timeout}s:\n{self.describe()}\n"
                                 f"stdout: {exc.stdout!r}\nstderr: {exc.stderr!r}") from None
        self.runs.append(res)
        if check:
            assert res.returncode == 0, f"{self.spec.cli} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
        return res

    async def arun(self, prompt: str, *args: str, timeout: float | None = None,
                   check: bool = True) -> subprocess.CompletedProcess[str]:
        """:meth:`run` for async tests (an operator answering on the same loop while the CLI waits)."""
        argv = [*self.prefix, *self.spec.command(self, prompt), *args]
        proc = await asyncio.create_subprocess_exec(*argv, cwd=self.work, env=self.env,
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout or self.spec.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"{self.spec.cli} did not finish:\n{self.describe()}") from None
        res = subprocess.CompletedProcess(argv, proc.returncode or 0, out.decode(), err.decode())
        self.runs.append(res)
        if check:
            assert res.returncode == 0, f"{self.spec.cli} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
        return res

    async def stream_json(self, prompt: str, *args: str, initialize: bool = False, timeout: float = 90,
                          host: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
                          ) -> list[dict[str, Any]]:
        """Drive the CLI in stream-json I/O (SDK mode) with ``args`` until its ``result`` message.

        The test is the permission-prompt host. By default it never answers: only the hooks (the
        operator) can decide. ``host(request)`` answers instead (the user deciding in the CLI's own
        prompt): it gets each ``control_request``'s ``request`` and returns the success response's
        payload (e.g. ``{"behavior": "allow"}``), or None to leave it unanswered. Returns the
        ``control_request``/``control_cancel_request`` messages the CLI sent its host.
        ``initialize`` sends the SDK's ``initialize`` control request first (Qwen Code).
        """
        argv = [*self.prefix, *args, "--input-format", "stream-json", "--output-format", "stream-json"]
        proc = await asyncio.create_subprocess_exec(*argv, cwd=self.work, env=self.env, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    limit=16 << 20)
        assert proc.stdin is not None and proc.stdout is not None

        def send(obj: dict[str, Any]) -> None:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(obj) + "\n").encode())

        if initialize:
            send({"type": "control_request", "request_id": "init-1", "request": {"subtype": "initialize"}})
        send({"type": "user", "session_id": "", "parent_tool_use_id": None,
              "message": {"role": "user", "content": prompt}})
        prompts: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(timeout):
                while line := await proc.stdout.readline():
                    msg = json.loads(line)
                    if msg.get("type") in ("control_request", "control_cancel_request"):
                        prompts.append(msg)
                        answer = host(msg.get("request") or {}) if host and msg["type"] == "control_request" else None
                        if answer is not None:
                            send({"type": "control_response", "response": {
                                "subtype": "success", "request_id": msg.get("request_id"), "response": answer}})
                            await proc.stdin.drain()
                    elif msg.get("type") == "result":
                        break
        except TimeoutError:
            raise AssertionError(f"{self.spec.cli} gave no result in {timeout}s; host prompts: {prompts}\n"
                                 f"{self.describe()}") from None
        finally:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        return prompts

    def healthz(self) -> dict[str, Any]:
        """The receiver's ``GET /healthz`` (``relay`` is true once a relay hello completed)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as resp:
            return json.loads(resp.read())

    def popen(self, prompt: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
        """Start the CLI without waiting (stdin/stdout pipes), for stream-json style drivers."""
        argv = [*self.prefix, *self.spec.command(self, prompt), *args]
        return subprocess.Popen(argv, cwd=self.work, env=self.env, text=True, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)

    def describe(self) -> str:
        """What a failing test should print: the model requests and the collector log."""
        reqs = "\n".join(f"  {r.method} {r.path} tools={len(r.tools)} tool_turns={r.tool_turns()}"
                         for r in self.model.requests)
        log = "".join(self.collector.log[-40:]) if self.collector else ""
        return f"model requests:\n{reqs}\ncollector log (tail):\n{log}"

    # -- reading and checking ----------------------------------------------------------------------

    def files(self) -> list[Path]:
        """The agent's session JSONL files (``_agent.jsonl`` excluded)."""
        d = self.logs / self.spec.agent
        return sorted(p for p in d.glob("*.jsonl") if p.name != "_agent.jsonl") if d.exists() else []

    def events(self) -> list[dict[str, Any]]:
        """Every event of every session file, file by file in write order."""
        return [e for p in self.files() for e in read_jsonl(p)]

    def check(self, *, started: bool = True, ended: bool = True, tools: int = 1,
              runs: int = 1, tools_closed: bool = True) -> list[dict[str, Any]]:
        """Stop the collector, then assert the tier's contract (module docstring); returns the events.

        ``started``/``ended``: the surface delivers ``session.started``/``session.ended``;
        ``tools``: at least this many ``tool.completed``; ``runs``: at least this many runs;
        ``tools_closed``: every ``tool.requested`` gets a terminal (false where the vendor refuses a
        call without telling its hooks, e.g. Claude Code ``-p`` on an undecided permission).
        """
        self.stop()
        files = self.files()
        assert files, f"no JSONL written for {self.spec.agent}\n{self.describe()}"
        for p in files:
            res = self.aep("validate-events", str(p))
            assert res.returncode == 0, f"validate-events {p.name}:\n{res.stdout}{res.stderr}"
        events = self.events()
        for p in files:
            if p.stem == UNKNOWN_SESSION:
                # Vendor machinery that names no session (OpenCode's plugin.added, catalog.updated at
                # start-up) is written under the collector's "unknown" session: no lifecycle, and
                # nothing that should have had one.
                stray = [t for t in types(read_jsonl(p)) if not t.startswith("x.")]
                assert not stray, f"{p.name}: lifecycle events without a session: {stray}"
                continue
            lifecycle_problems = lifecycle(read_jsonl(p), started=started, ended=ended, tools_closed=tools_closed)
            assert not lifecycle_problems, f"{p.name}: {lifecycle_problems}\n{types(read_jsonl(p))}"
        kinds = Counter(e["type"] for e in events)
        assert kinds["run.started"] >= runs, f"expected >= {runs} runs: {types(events)}"
        assert kinds["tool.completed"] >= tools, f"expected >= {tools} tool.completed: {types(events)}"
        return events


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def lifecycle(events: list[dict[str, Any]], *, started: bool = True, ended: bool = True,
              tools_closed: bool = True) -> list[str]:
    """Problems with one session's lifecycle per Annex A (empty when sound); see :meth:`Live.check`."""
    out: list[str] = []
    seen = types(events)
    if started and "session.started" not in seen:
        out.append("no session.started")
    if started and "session.started" in seen and seen[0] != "session.started":
        out.append(f"session.started is not first ({seen[0]} is)")
    if ended:
        if seen.count("session.ended") != 1:
            out.append(f"{seen.count('session.ended')} session.ended")
        elif seen[-1] != "session.ended":
            out.append(f"events after session.ended: {seen[seen.index('session.ended') + 1:]}")
    open_runs: dict[str, int] = {}
    done_runs: set[str] = set()
    open_tools: dict[str, str] = {}
    open_attention: set[str] = set()
    closed_attention: Counter[str] = Counter()
    for i, e in enumerate(events):
        t, data = e["type"], e.get("data") or {}
        if t == "run.started":
            if e.get("run") in open_runs or e.get("run") in done_runs:
                out.append(f"#{i} run {e.get('run')} started twice")
            open_runs[e.get("run")] = i
        elif t in RUN_TERMINALS:
            if e.get("run") not in open_runs:
                out.append(f"#{i} {t} for a run that is not open ({e.get('run')})")
            open_runs.pop(e.get("run"), None)
            done_runs.add(e.get("run"))
        elif t == "tool.requested":
            call = (data.get("tool") or {}).get("call_id")
            if call in open_tools:
                out.append(f"#{i} tool call {call} requested twice")
            open_tools[call] = e.get("run")
        elif t in TOOL_TERMINALS:
            call = (data.get("tool") or {}).get("call_id")
            if t != "tool.denied" and call not in open_tools:
                out.append(f"#{i} {t} without tool.requested ({call})")
            open_tools.pop(call, None)
        elif t == "attention.requested":
            open_attention.add(e["id"])
        elif t in ATTENTION_TERMINALS:
            closed_attention[e.get("subject")] += 1
            if e.get("subject") not in open_attention:
                out.append(f"#{i} {t} closes {e.get('subject')}, which is not an open request")
            open_attention.discard(e.get("subject"))
        elif t == "session.ended" and open_attention:
            out.append(f"#{i} session.ended with attention open: {sorted(open_attention)}")
    if open_runs:
        out.append(f"runs never ended: {sorted(open_runs)}")
    if open_tools and tools_closed:
        out.append(f"tool calls never closed: {sorted(open_tools)}")
    if open_attention:
        out.append(f"attention never closed: {sorted(open_attention)}")
    out += [f"attention {k} closed {n} times" for k, n in closed_attention.items() if n > 1]
    return out


# ---------------------------------------------------------------------------------------------------
# The four vendors this module drives (other vendors' Specs live with their tests)


def _claude_prepare(live: Live) -> None:
    live.env.update({"ANTHROPIC_BASE_URL": live.model.url, "ANTHROPIC_API_KEY": "sk-fake",
                     "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"})


def _codex_prepare(live: Live) -> None:
    live.env["FAKE_API_KEY"] = "sk-fake"
    cfg = live.home / ".codex" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(
        f'model = "fake-model"\nmodel_provider = "fake"\n\n'
        f'[model_providers.fake]\nname = "fake"\nbase_url = "{live.model.url}/v1"\nenv_key = "FAKE_API_KEY"\n'
        f'wire_api = "responses"\n\n[projects."{live.work}"]\ntrust_level = "trusted"\n')


def _gemini_prepare(live: Live) -> None:
    live.env.update({"GOOGLE_GEMINI_BASE_URL": live.model.url, "GEMINI_API_KEY": "fake"})
    write_json(live.home / ".gemini" / "settings.json", {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "general": {"disableAutoUpdate": True}, "telemetry": {"enabled": False},
        "privacy": {"usageStatisticsEnabled": False}})


def _qwen_prepare(live: Live) -> None:
    live.env.update({"OPENAI_BASE_URL": live.model.url + "/v1", "OPENAI_API_KEY": "sk-fake",
                     "OPENAI_MODEL": "fake-model"})
    write_json(live.home / ".qwen" / "settings.json", {
        "security": {"auth": {"selectedType": "openai"}}, "telemetry": {"enabled": False},
        "privacy": {"usageStatisticsEnabled": False}})


SPECS: dict[str, Spec] = {
    "claude_code": Spec("claude-code", "claude_code", "claude_code", "claude-code", ".claude/settings.json",
                        _claude_prepare, lambda live, prompt: ["-p", prompt]),
    "codex": Spec("codex", "codex", "codex", "codex", ".codex/config.toml", _codex_prepare,
                  lambda live, prompt: ["exec", "--skip-git-repo-check", "--dangerously-bypass-hook-trust", prompt]),
    "gemini_cli": Spec("gemini-cli", "gemini_cli", "gemini_cli", "gemini-cli", ".gemini/settings.json",
                       _gemini_prepare, lambda live, prompt: ["--yolo", "-p", prompt]),
    "qwen_code": Spec("qwen-code", "qwen_code", "qwen_code", "qwen-code", ".qwen/settings.json",
                      _qwen_prepare, lambda live, prompt: ["--yolo", "-p", prompt]),
}
"""The vendors whose live tests are in ``tests/test_live_*.py`` of this harness' author; add yours beside."""

