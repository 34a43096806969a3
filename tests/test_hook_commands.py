"""The registered hook command survives what happens to an installation, and never fails the agent.

Each case runs the command exactly as a vendor does (``sh -c COMMAND``, or shlex-split without a
shell as Hermes does) in a real subprocess against a real collector: after a reinstall, a moved
(deleted) checkout, a new (deleted) venv, a shadowing ``PYTHONPATH``; and with nothing left to run
(no shim copy, no interpreter, an interpreter that fails to start, a dead port), where it must
still exit 0 with the vendor's neutral reply. Claude Code's SessionStart, which it fires only for
command hooks, goes through the same command to the ``claude_code`` receiver.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline import shim
from aep_collector.receivers import registration
from aep_collector.receivers.registration import render, using_home

from tests.helpers import ROOT, base_config, collector, race, read_jsonl

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}  # what a vendor's child might get


def session_start(sid: str) -> bytes:
    return json.dumps({"hook_event_name": "SessionStart", "session_id": sid, "source": "startup",
                       "cwd": "/tmp", "transcript_path": f"/tmp/{sid}.jsonl", "model": "m"}).encode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    tmp = tmp_path_factory.mktemp("hook-commands")
    cfg = base_config(tmp, receivers={"codex": {"endpoint": "127.0.0.1:0"},
                                      "claude_code": {"endpoint": "127.0.0.1:0"}})
    with collector(cfg, tmp) as c:
        yield c, tmp


def url(stack: tuple[Any, Path], rtype: str = "codex") -> str:
    return f"http://127.0.0.1:{stack[0].ports[f'receiver/{rtype}']}"


def run(command: str, payload: bytes, cwd: Path, shell: bool = True,
        env: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Run a registered command as the vendor does; the timeout only bounds a hung test."""
    argv: Any = command if shell else shlex.split(command)
    out = subprocess.run(argv, shell=shell, input=payload, capture_output=True, cwd=cwd,
                         env={**ENV, **(env or {})}, timeout=60)
    return out.returncode, out.stdout


def codex_command(home: Path, event: str = "SessionStart") -> str:
    hooks = json.loads((home / ".codex" / "hooks.json").read_text())["hooks"]
    return hooks[event][0]["hooks"][0]["command"]


def install(python: str, home: Path, receiver: str, cwd: Path = ROOT, **env: str) -> None:
    subprocess.run([python, "-m", "aep_collector.pipeline.cli", "hooks", "codex", "--install", "--url", receiver,
                    "--home", str(home)], cwd=cwd, check=True, capture_output=True, timeout=120,
                   env={**os.environ, **env})


def delivered(stack: tuple[Any, Path], sid: str, vendor: str = "codex") -> list[str]:
    path = stack[1] / "logs" / vendor / f"{sid}.jsonl"
    return [e["type"] for e in read_jsonl(path)] if path.exists() else []


def test_the_command_reaches_the_receiver_with_a_bare_environment(stack: Any, tmp_path: Path) -> None:
    install(sys.executable, tmp_path, url(stack))
    command = codex_command(tmp_path)
    assert str(ROOT) not in command and sys.prefix not in command  # names neither checkout nor venv
    assert run(command, session_start("cmd-bare"), tmp_path) == (0, b"{}")
    assert delivered(stack, "cmd-bare") == ["session.started"]
    assert run(command, session_start("cmd-noshell"), tmp_path, shell=False) == (0, b"{}")  # Hermes' way
    assert delivered(stack, "cmd-noshell") == ["session.started"]


def test_a_reinstall_keeps_the_command_and_repairs_the_copy(stack: Any, tmp_path: Path) -> None:
    install(sys.executable, tmp_path, url(stack))
    hooks_json = (tmp_path / ".codex" / "hooks.json").read_bytes()
    copy = tmp_path / ".aep" / "bin" / registration.HOOK_FILE
    copy.unlink()  # an installation gone wrong: the command still answers, neutrally
    assert run(codex_command(tmp_path), session_start("cmd-gone"), tmp_path) == (0, b"{}")
    assert delivered(stack, "cmd-gone") == []
    install(sys.executable, tmp_path, url(stack))
    assert (tmp_path / ".codex" / "hooks.json").read_bytes() == hooks_json  # same bytes: Codex trust kept
    assert copy.read_bytes() == Path(shim.__file__).read_bytes()
    assert run(codex_command(tmp_path), session_start("cmd-reinstalled"), tmp_path) == (0, b"{}")
    assert delivered(stack, "cmd-reinstalled") == ["session.started"]


def test_a_moved_checkout_leaves_the_command_working(stack: Any, tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(".venv", ".git", "tests", "__pycache__", "bench"))
    home = tmp_path / "home"
    install(sys.executable, home, url(stack), cwd=checkout, PYTHONPATH=str(checkout))
    command = codex_command(home)
    assert str(checkout) not in command
    shutil.rmtree(checkout)  # moved away (or deleted) after the install
    assert run(command, session_start("cmd-moved"), tmp_path) == (0, b"{}")
    assert delivered(stack, "cmd-moved") == ["session.started"]


def test_a_new_venv_leaves_the_command_working(stack: Any, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # The throwaway venv sees this checkout and this venv's packages, as `pip install -e` would give it.
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "aep.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    home = tmp_path / "home"
    install(str(venv / "bin" / "python"), home, url(stack))
    command = codex_command(home)
    assert str(venv) not in command
    shutil.rmtree(venv)  # replaced by a new one
    assert run(command, session_start("cmd-venv"), tmp_path) == (0, b"{}")
    assert delivered(stack, "cmd-venv") == ["session.started"]


def test_a_shadowing_pythonpath_is_ignored(stack: Any, tmp_path: Path) -> None:
    install(sys.executable, tmp_path, url(stack))
    fake = tmp_path / "shadow"
    (fake / "pipeline").mkdir(parents=True)
    (fake / "pipeline" / "__init__.py").write_text("raise SystemExit(3)\n")
    (fake / "aep_collector_hook.py").write_text("raise SystemExit(3)\n")
    env = {"PYTHONPATH": str(fake), "PYTHONHOME": str(fake / "nowhere")}
    assert run(codex_command(tmp_path), session_start("cmd-shadow"), tmp_path, env=env) == (0, b"{}")
    assert delivered(stack, "cmd-shadow") == ["session.started"]


def chain_with(monkeypatch: pytest.MonkeyPatch, pythons: list[str], home: Path, vendor: str = "antigravity",
               receiver: str | None = None) -> dict[str, str]:
    """Registered commands whose interpreter candidates are ``pythons`` (what the machine has left)."""
    monkeypatch.setattr(registration, "pythons", lambda: pythons)
    with using_home(home):
        block = json.loads(render(vendor, url=receiver))
    events = block["aep-collector"] if vendor == "antigravity" else block["hooks"]
    return {e: (items[0]["hooks"] if "hooks" in items[0] else items)[0]["command"] for e, items in events.items()}


def test_an_interpreter_that_fails_to_start_falls_through_to_the_next(stack: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "python-broken"
    broken.write_text("#!/bin/sh\necho 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    broken.chmod(0o755)
    real = os.path.realpath(sys.executable)
    commands = chain_with(monkeypatch, [str(broken), real], tmp_path, "codex", url(stack))
    assert run(commands["SessionStart"], session_start("cmd-broken"), tmp_path) == (0, b"{}")
    assert delivered(stack, "cmd-broken") == ["session.started"]


@pytest.mark.parametrize(("event", "neutral"), [("PreToolUse", b'{"decision": ""}'), ("PostToolUse", b"{}")])
def test_no_interpreter_at_all_still_exits_zero_with_the_neutral_reply(event: str, neutral: bytes, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    commands = chain_with(monkeypatch, [str(tmp_path / "gone" / "python3"), "no-such-python3"], tmp_path)
    payload = b'{"tool_name": "x", "padding": "' + b"a" * (1 << 18) + b'"}'  # above a pipe's buffer
    for path in ("/usr/bin:/bin", str(tmp_path)):  # with cat, and with no cat either
        for shell in (True, False):
            proc = subprocess.Popen(commands[event] if shell else shlex.split(commands[event]), shell=shell,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**ENV, "PATH": path})
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(payload)  # BrokenPipeError here if the command left stdin unread
            proc.stdin.close()
            assert (proc.wait(timeout=60), proc.stdout.read()) == (0, neutral)
            proc.stdout.close()


def test_a_dead_port_exits_zero_with_the_neutral_reply(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with using_home(tmp_path):
        block = json.loads(render("antigravity", url=f"http://127.0.0.1:{port}"))["aep-collector"]
    assert run(block["PreToolUse"][0]["hooks"][0]["command"], b"{}", tmp_path) == (0, b'{"decision": ""}')
    assert run(block["PreInvocation"][0]["command"], b"{}", tmp_path) == (0, b"{}")


def test_claude_code_session_start_goes_through_the_command_shim(stack: Any, tmp_path: Path) -> None:
    receiver = url(stack, "claude_code")
    with using_home(tmp_path):
        hooks = json.loads(render("claude-code", url=receiver))["hooks"]
    (handler,) = hooks["SessionStart"][0]["hooks"]
    assert handler["type"] == "command"  # Claude Code never fires SessionStart for http hooks
    assert all(h["type"] == "http" and h["url"] == receiver + "/hook"
               for name, entries in hooks.items() if name != "SessionStart" for h in entries[0]["hooks"])
    sid = "cc-shim-start"
    assert run(handler["command"], session_start(sid), tmp_path) == (0, b"{}")
    assert delivered(stack, sid, "claude-code") == ["session.started"]


def test_the_off_posix_command_runs_the_copy_with_no_site_and_answers(stack: Any, tmp_path: Path) -> None:
    """Off POSIX (cmd.exe, PowerShell) the command is ``shim_argv`` joined by ``list2cmdline``: its
    ``python -S -I`` form must import what it names with no site-packages (no editable finder), and
    survive the checkout and venv like the POSIX chain. Run here as the argv that text stands for."""
    with using_home(tmp_path):
        registration.ensure_shim()
        text = registration.shim_command("codex", "SessionStart", url=url(stack), posix=False)
        argv = registration.shim_argv("codex", "SessionStart", url=url(stack))
    assert text == subprocess.list2cmdline(argv)
    assert str(ROOT) not in text and sys.prefix not in text  # names neither checkout nor venv
    assert str(tmp_path / ".aep" / "bin") in argv[4] and argv[1:3] == ["-S", "-I"]
    out = subprocess.run(argv, input=session_start("cmd-nt"), capture_output=True, cwd=tmp_path, env=ENV, timeout=60)
    assert (out.returncode, out.stdout) == (0, b"{}"), out.stderr
    assert delivered(stack, "cmd-nt") == ["session.started"]
    with using_home(tmp_path):
        down = registration.shim_argv("antigravity", "PreToolUse", url=f"http://127.0.0.1:{closed_port()}")
    out = subprocess.run(down, input=b"{}", capture_output=True, cwd=tmp_path, env=ENV, timeout=60)
    assert (out.returncode, out.stdout) == (0, b'{"decision": ""}'), out.stderr


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_concurrent_writers_of_the_copy_never_leave_a_partial_file(tmp_path: Path) -> None:
    """Hooks run from the package write the table on first use, so a burst of them (and a `hooks
    --install` beside them) write it at once: the file is always one writer's whole bytes, never a
    temp file another writer was still filling (a torn table answers every vendor with {})."""
    target = tmp_path / "bin" / registration.TABLE_FILE
    versions = [bytes([65 + i]) * (1 << 20) for i in range(4)]  # distinct, so every write replaces
    seen = race(target, versions, lambda data: registration._write(target, data))
    assert seen == [] and target.read_bytes() in versions
    assert [p.name for p in target.parent.iterdir() if p.name != "__pycache__"] == [target.name]  # no temp left
