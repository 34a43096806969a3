"""``aep-collector hooks VENDOR`` for the hook-family vendors: each block parses in the vendor's own
format, registers every mapped hook, points at the receiver and gives held hooks room above the hold."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from aep_collector.pipeline import shim
from aep_collector.processors.mapping import load_vendor
from aep_collector.receivers.hook_vendors import antigravity, codex, gemini_cli, kimi_code, qwen_code, vscode
from aep_collector.receivers.registration import declaration, render

from tests.helpers import ROOT

MODULES = {"codex": codex, "gemini-cli": gemini_cli, "qwen-code": qwen_code, "vscode": vscode,
           "kimi-code": kimi_code, "antigravity": antigravity}


def registered(vendor: str, text: str) -> dict[str, list[dict[str, Any]]]:
    """Event -> handlers ({command|url, timeout (seconds), matcher?}) as the vendor would read them."""
    out: dict[str, list[dict[str, Any]]] = {}
    if vendor == "kimi-code":
        for table in tomllib.loads(text)["hooks"]:
            assert set(table) <= {"event", "matcher", "command", "timeout"}  # any other key breaks Kimi's config
            out.setdefault(table["event"], []).append(table)
        return out
    block = json.loads(text)  # the printed text is the file itself: strict JSON, no comment lines
    if vendor == "antigravity":
        (events,) = block.values()
        for event, items in events.items():
            for item in items:
                handlers = item["hooks"] if "hooks" in item else [item]
                out.setdefault(event, []).extend({**h, "matcher": item.get("matcher")} for h in handlers)
        return out
    for event, items in block["hooks"].items():
        for item in items:
            handlers = item["hooks"] if "hooks" in item else [item]  # VS Code lists handlers flat
            for h in handlers:
                h = dict(h, matcher=item.get("matcher"))
                if vendor == "gemini-cli":
                    h["timeout"] = h["timeout"] / 1000  # Gemini counts milliseconds
                out.setdefault(event, []).append(h)
    return out


def argv(command: str) -> list[str]:
    """The registered command as argv, past the new-session prefix of Kimi's fire-and-forget hooks."""
    parts = shlex.split(command)
    return parts[4:] if parts[3:4] == ["aep-new-session"] else parts


def shim_args(command: str) -> list[str]:
    """The shim's own arguments inside the registered ``/bin/sh -c`` chain (VENDOR, EVENT, flags)."""
    parts = argv(command)
    assert parts[:2] == ["/bin/sh", "-c"] and parts[3] == "aep-collector-hook"
    return parts[6:]


@pytest.mark.parametrize("vendor", sorted(MODULES))
def test_every_mapped_hook_is_registered_once(vendor: str) -> None:
    hooks = registered(vendor, render(vendor))
    left_out = getattr(MODULES[vendor], "UNREGISTERED", frozenset())
    assert sorted(hooks) == sorted(h for h in load_vendor(vendor).HOOKS if h not in left_out)
    assert all(len(handlers) == 1 for handlers in hooks.values())


def test_gemini_leaves_the_per_chunk_hook_out() -> None:
    assert "AfterModel" not in registered("gemini-cli", render("gemini-cli"))


def test_kimi_registers_exactly_its_sixteen_events() -> None:
    assert len(registered("kimi-code", render("kimi-code"))) == 16


@pytest.mark.parametrize("vendor", ["codex", "gemini-cli", "vscode", "kimi-code", "antigravity"])
def test_commands_run_the_shim_copy_for_the_vendor_and_event(vendor: str, hook_dir: Path) -> None:
    for event, (handler,) in registered(vendor, render(vendor)).items():
        parts = argv(handler["command"])
        assert parts[4] == str(hook_dir / "bin")  # the stable copy, not the checkout
        assert (hook_dir / "bin" / "aep_collector_hook.py").read_bytes() == Path(shim.__file__).read_bytes()
        assert parts[5].encode() == declaration(vendor).neutral_bytes(event)  # printed if nothing can run
        assert shim_args(handler["command"])[:2] == [vendor, event]
        assert "--url" not in parts  # the default receiver address needs no flag
        assert str(ROOT) not in handler["command"] and sys.prefix not in handler["command"]


def test_kimi_fire_and_forget_hooks_start_in_a_new_session_and_still_fail_open() -> None:
    hooks = registered("kimi-code", render("kimi-code", url="http://127.0.0.1:9"))
    prefixed = {e for e, (h,) in hooks.items() if shlex.split(h["command"])[3:4] == ["aep-new-session"]}
    assert prefixed == {"PostToolUse", "PostToolUseFailure"}
    (handler,) = hooks["PostToolUse"]
    out = subprocess.run(handler["command"], shell=True, input=b'{"hook_event_name": "PostToolUse"}',
                         capture_output=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, b"{}")


def test_the_registered_command_is_the_shim() -> None:
    (handler,) = registered("antigravity", render("antigravity", url="http://127.0.0.1:9"))["Stop"]
    out = subprocess.run(handler["command"], shell=True, input=b"{}", capture_output=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, b'{"decision": ""}')  # closed port: the pinned neutral reply


def test_qwen_uses_native_http_hooks() -> None:
    for _event, (handler,) in registered("qwen-code", render("qwen-code")).items():
        assert handler["type"] == "http" and handler["url"] == "http://127.0.0.1:8380/hook"


HELD = {"codex": ("PermissionRequest", 55.0), "qwen-code": ("PermissionRequest", 55.0),
        "vscode": ("PreToolUse", 25.0), "kimi-code": ("PreToolUse", 50.0)}


@pytest.mark.parametrize("vendor", sorted(HELD))
def test_held_hooks_get_a_vendor_timeout_above_the_hold_window(vendor: str) -> None:
    event, hold = HELD[vendor]
    hooks = registered(vendor, render(vendor))
    (held,) = hooks[event]
    assert held["timeout"] > hold
    if "command" in held:
        assert held["timeout"] > declaration(vendor).hold_wait > hold  # the shim answers before the vendor gives up
    for name, (h,) in hooks.items():
        if name != event:
            assert shim.SHORT_WAIT < h["timeout"] < hold


def test_registered_timeouts_match_the_reference_windows() -> None:
    assert registered("kimi-code", render("kimi-code"))["PreToolUse"][0]["timeout"] == 60  # 50 s hold + 10
    assert registered("vscode", render("vscode"))["PreToolUse"][0]["timeout"] == 35


def test_tool_matchers() -> None:
    assert registered("antigravity", render("antigravity"))["PreToolUse"][0]["matcher"] == "*"
    assert registered("antigravity", render("antigravity"))["Stop"][0]["matcher"] is None
    assert registered("qwen-code", render("qwen-code"))["PermissionRequest"][0]["matcher"] == "*"
    assert all(h[0]["matcher"] is None for h in registered("codex", render("codex")).values())  # every tool


def test_a_config_moves_the_url_and_the_waits(tmp_path: Path) -> None:
    cfg = {"receivers": {"codex": {"endpoint": "127.0.0.1:9378", "attention_timeout": 100},
                         "kimi_code": {"endpoint": "127.0.0.1:8398", "attention_timeout": 120, "control": True},
                         "qwen_code": {"endpoint": "127.0.0.1:9380", "attention_timeout": 90}},
           "processors": {"mapping": None},
           "exporters": {"jsonl": {"directory": str(tmp_path / "logs")}},
           "service": {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
               "receivers": ["codex", "kimi_code", "qwen_code"], "processors": ["mapping"], "exporters": ["jsonl"]}}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    from aep_collector.pipeline.registry import build_registry

    reg, _ = build_registry(load_plugins=False)
    cx = registered("codex", render("codex", config_path=str(path), registry=reg))
    parts = shim_args(cx["PermissionRequest"][0]["command"])
    assert parts[parts.index("--url") + 1] == "http://127.0.0.1:9378"
    assert parts[parts.index("--wait") + 1] == "105" and cx["PermissionRequest"][0]["timeout"] == 110
    assert "--wait" not in shim_args(cx["Stop"][0]["command"])
    kimi = registered("kimi-code", render("kimi-code", config_path=str(path), registry=reg))
    assert "--url" not in shim_args(kimi["PreToolUse"][0]["command"])  # default port: no flag
    assert kimi["PreToolUse"][0]["timeout"] == 130
    qw = registered("qwen-code", render("qwen-code", config_path=str(path), registry=reg))
    assert qw["PermissionRequest"][0]["url"] == "http://127.0.0.1:9380/hook"
    assert qw["PermissionRequest"][0]["timeout"] == 100


def test_url_flag_reaches_every_command() -> None:
    hooks = registered("antigravity", render("antigravity", url="http://127.0.0.1:7000"))
    for (h,) in hooks.values():
        parts = shim_args(h["command"])
        assert parts[parts.index("--url") + 1] == "http://127.0.0.1:7000"


@pytest.mark.parametrize("vendor", sorted(MODULES))
def test_the_cli_prints_the_block(vendor: str) -> None:
    out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "hooks", vendor.replace("-", "_")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert registered(vendor, out.stdout)  # stdout is the file; advice went to stderr
    assert out.stderr.startswith("# ")
