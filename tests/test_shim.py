"""The fail-open command shim: its replies, its failure paths, and what it imports.

Every process test runs the real shim (``python -m aep_collector.pipeline.shim``) with real stdin, against a
live receiver, a scripted HTTP server, or a closed port.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline import shim
from aep_collector.pipeline.registry import build_registry
from aep_collector.processors.mapping import antigravity as antigravity_mapping
from aep_collector.receivers.hook_vendors import (
    antigravity,
    codex,
    gemini_cli,
    kimi_code,
    qwen_code,
    surface,
    vscode,
)
from aep_collector.receivers.registration import TABLE_FILE, declarations, ensure_shim, shim_entries
from aiohttp import web

from tests.helpers import ROOT, base_config, read_jsonl, running, serve

RECEIVERS = {"codex": codex, "gemini-cli": gemini_cli, "qwen-code": qwen_code, "vscode": vscode,
            "kimi-code": kimi_code, "antigravity": antigravity}
CONFIGS = {vendor: module.DECLARATION.config_class for vendor, module in RECEIVERS.items()}
PINNED = {"PreToolUse": b'{"decision": ""}', "Stop": b'{"decision": ""}', "PostToolUse": b"{}",
          "PreInvocation": b"{}", "PostInvocation": b"{}"}


def expected_neutral(vendor: str, event: str | None) -> bytes:
    if vendor == "antigravity":
        return json.dumps(antigravity.neutral_reply(event or "")).encode()
    if vendor == "kimi-code" and event in kimi_code.SILENT_HOOKS:
        return b""
    return json.dumps(RECEIVERS[vendor].DECLARATION.neutral_reply).encode()


def table() -> dict[str, shim.Vendor]:
    """The shim's vendor table as ``ensure_shim`` writes it: generated from the declarations."""
    return {name: shim.Vendor(**entry) for name, entry in shim_entries().items()}


@pytest.fixture(autouse=True)
def shim_copy(hook_dir: Path) -> Path:
    """The shim's copy and its vendor table in this test's hook folder (the ``-m`` runs read that table)."""
    return ensure_shim()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_shim(args: list[str], stdin: bytes, env: dict[str, str] | None = None) -> tuple[int, bytes]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aep_collector.pipeline.shim", *args, cwd=ROOT, env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(stdin), 60)
    return proc.returncode or 0, out


# --- the table ------------------------------------------------------------------------------------


@pytest.mark.parametrize("vendor", sorted(RECEIVERS))
def test_neutral_literals_equal_the_receiver_constants(vendor: str) -> None:
    v = table()[vendor]
    assert v.neutral == json.dumps(RECEIVERS[vendor].DECLARATION.neutral_reply).encode()
    for hook in (*antigravity_mapping.HOOKS, "SomeFutureHook", "pretooluse", "STOP", "UserPromptSubmit"):
        assert shim.neutral(v, hook) == expected_neutral(vendor, hook), hook


def test_antigravity_pinned_bytes() -> None:
    for hook, raw in PINNED.items():
        assert shim.neutral(table()["antigravity"], hook) == raw


@pytest.mark.parametrize("vendor", sorted(RECEIVERS))
def test_ports_and_waits_follow_the_receivers(vendor: str) -> None:
    v, cfg = table()[vendor], CONFIGS[vendor]()
    assert cfg.endpoint == f"127.0.0.1:{v.port}"
    if v.held:
        assert v.wait == surface.hold_wait(cfg.attention_timeout)
        assert cfg.attention_timeout < v.wait < surface.vendor_timeout(cfg.attention_timeout)
    else:
        assert not hasattr(cfg, "attention_timeout")  # observe-only: nothing is ever held


def test_env_names() -> None:
    assert [shim.env_name(v) for v in sorted(RECEIVERS)] == [
        "AEP_ANTIGRAVITY_URL", "AEP_CODEX_URL", "AEP_GEMINI_CLI_URL", "AEP_KIMI_CODE_URL", "AEP_QWEN_CODE_URL",
        "AEP_VSCODE_URL"]


@pytest.mark.parametrize("url,parsed", [
    ("http://127.0.0.1:8378", ("127.0.0.1", 8378, "/hook")),
    ("http://127.0.0.1:8378/", ("127.0.0.1", 8378, "/hook")),
    ("http://localhost:9/x/hook", ("localhost", 9, "/x/hook")),
    ("http://[::1]:8395", ("::1", 8395, "/hook")),
])
def test_parse_url(url: str, parsed: tuple[str, int, str]) -> None:
    assert shim.parse_url(url) == parsed


@pytest.mark.parametrize("url", ["https://127.0.0.1:1", "http://127.0.0.1", "http://:80", "http://[::1:80",
                                 "127.0.0.1:80", "http://h:port"])
def test_parse_url_refuses(url: str) -> None:
    with pytest.raises(shim.Failed):
        shim.parse_url(url)


@pytest.mark.parametrize("vendor", ["cline", "hermes"])
def test_the_plugin_vendors_entries_follow_their_receivers(vendor: str) -> None:
    from aep_collector.pipeline.component import Kind

    registry, _ = build_registry(load_plugins=False)
    receiver = importlib.import_module(f"aep_collector.receivers.plugin_vendors.{vendor}")
    cfg = registry.get(Kind.RECEIVER, vendor).default_config()
    v = table()[vendor]
    assert v.neutral == json.dumps(receiver.NEUTRAL_REPLY).encode()
    assert cfg.endpoint == f"127.0.0.1:{v.port}"
    if v.held:
        assert v.wait == cfg.attention_timeout + 5


def test_the_table_is_every_declaration_and_names_no_vendor_in_the_shim() -> None:
    assert set(table()) == set(declarations())
    assert not any(f'"{name}"' in Path(shim.__file__).read_text() for name in declarations())


def test_a_table_entry_needs_only_a_port() -> None:
    v = shim.Vendor(8392)
    assert (v.neutral, v.by_event, v.held, v.needs_event) == (b"{}", {}, (), False)
    assert shim.neutral(shim.Vendor(8393, neutral=None), "x") == b""


# --- what it imports --------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [[], ["-S", "-I"]], ids=["site", "registered"])
def test_importing_the_shim_loads_nothing_heavy(flags: list[str]) -> None:
    # "registered" is how the registration blocks start it: no site, no environment, the root on sys.path.
    root = json.dumps(str(ROOT / "pipeline"))
    code = (f"import sys; sys.path[:0] = [{root}]; before = set(sys.modules); import shim; "
            "after = sorted(set(sys.modules) - before); import json; print(json.dumps(after))")
    out = subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert loaded <= {"shim", "_socket"}, loaded


def test_a_whole_invocation_loads_nothing_heavy_either(shim_copy: Path) -> None:
    # The copy as registered, its table included: reading stdin, the env lookup, resolving, a
    # refused connect and the debug check.
    root = json.dumps(str(shim_copy.parent))
    code = (f"import sys; sys.path[:0] = [{root}]; before = set(sys.modules); import aep_collector_hook as s; "
            f"s.main(['codex', 'PermissionRequest', '--url', 'http://localhost:{closed_port()}']); "
            "sys.stderr.write(repr(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-S", "-I", "-c", code], input=PAYLOAD, capture_output=True, check=True,
                         env={**os.environ, "AEP_HOOK_DEBUG": "1"})
    assert out.stdout == b"{}"
    loaded = set(ast.literal_eval(out.stderr.decode().rsplit("\n", 1)[-1]))
    assert loaded <= {"aep_collector_hook", "aep_collector_hook_vendors", "_socket"}, loaded
    assert "aep_collector_hook_vendors" in loaded  # the vendor was known: the table was read


# --- failure paths: every one prints the neutral reply and exits 0 ---------------------------------------


def vendor_events() -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [(v, None) for v in sorted(RECEIVERS) if v != "antigravity"]
    out += [("antigravity", h) for h in (*antigravity_mapping.HOOKS, "SomeFutureHook")]
    out += [("codex", "PermissionRequest"), ("vscode", "PreToolUse"), ("kimi-code", "PreToolUse"),
            ("kimi-code", "UserPromptSubmit")]
    return out


CASES = vendor_events()
IDS = [f"{v}:{e}" for v, e in CASES]
PAYLOAD = json.dumps({"hook_event_name": "SessionStart", "session_id": "s-shim", "conversationId": "c-shim"}).encode()


@pytest.mark.parametrize("vendor,event", CASES, ids=IDS)
async def test_daemon_down_prints_the_neutral_reply(vendor: str, event: str | None) -> None:
    args = [vendor] + ([event] if event else []) + ["--url", f"http://127.0.0.1:{closed_port()}"]
    assert await run_shim(args, PAYLOAD) == (0, expected_neutral(vendor, event))


@pytest.mark.parametrize("vendor,event", CASES, ids=IDS)
async def test_daemon_down_on_the_default_port_or_env_url(vendor: str, event: str | None) -> None:
    # The env override is how a user points the shim elsewhere; here it points at nothing.
    env = {shim.env_name(vendor): f"http://127.0.0.1:{closed_port()}"}
    assert await run_shim([vendor] + ([event] if event else []), PAYLOAD, env) == (0, expected_neutral(vendor, event))


@pytest.mark.parametrize("args", [[], ["no-such-vendor"], ["antigravity"]], ids=["no-args", "unknown", "no-event"])
async def test_bad_arguments_still_exit_zero(args: list[str]) -> None:
    rc, out = await run_shim(args + ["--url", f"http://127.0.0.1:{closed_port()}"], PAYLOAD)
    assert rc == 0 and out == b"{}"


class Scripted:
    """A scripted HTTP server: the replies a receiver must never give, and an echo."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> Scripted:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/status/{code}", self.status)
        app.router.add_post("/html", self.reply(b"<html>hi</html>", "text/html"))
        app.router.add_post("/array", self.reply(b"[1, 2]", "application/json"))
        app.router.add_post("/brace", self.reply(b"{not json", "application/json"))
        app.router.add_post("/slow", self.slow)
        app.router.add_post("/echo", self.reply(b'{"echo":true}', "application/json"))
        app.router.add_post("/empty", self.reply(b"", "application/json"))
        app.router.add_post("/compact", self.reply(b'{"decision":""}', "application/json"))
        app.router.add_post("/hold", self.hold)
        self.runner, self.port = await serve(app)
        return self

    def reply(self, raw: bytes, ctype: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            self.seen.append((request.path_qs, await request.read()))
            return web.Response(body=raw, content_type=ctype)

        return handler

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response({"error": "x"}, status=int(request.match_info["code"]))

    release = asyncio.Event()

    async def hold(self, request: web.Request) -> web.Response:
        """Records the request, then answers only once the test releases it."""
        self.seen.append((request.path_qs, await request.read()))
        await self.release.wait()
        return web.json_response({"late": True})

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({"late": True})

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
async def scripted() -> Any:
    server = await Scripted().start()
    yield server
    assert server.runner is not None
    await server.runner.cleanup()


@pytest.mark.parametrize("path", ["/status/500", "/status/404", "/status/413", "/html", "/array", "/brace"])
@pytest.mark.parametrize("vendor,event", [("codex", None), ("antigravity", "PreToolUse"), ("antigravity", "Stop"),
                                          ("antigravity", "PostToolUse"), ("kimi-code", None)])
async def test_bad_replies_are_replaced_by_the_neutral_reply(scripted: Scripted, path: str, vendor: str,
                                                             event: str | None) -> None:
    args = [vendor] + ([event] if event else []) + ["--url", scripted.url(path)]
    assert await run_shim(args, PAYLOAD) == (0, expected_neutral(vendor, event))


async def test_a_slow_daemon_times_out_into_the_neutral_reply(scripted: Scripted) -> None:
    rc, out = await run_shim(["antigravity", "Stop", "--url", scripted.url("/slow"), "--wait", "0.3"], PAYLOAD)
    assert (rc, out) == (0, b'{"decision": ""}')


async def test_the_reply_is_printed_and_the_request_is_what_the_vendor_sent(scripted: Scripted) -> None:
    assert await run_shim(["gemini-cli", "BeforeTool", "--url", scripted.url("/echo")], PAYLOAD) == (0, b'{"echo":true}')
    assert scripted.seen == [("/echo?hook=BeforeTool", PAYLOAD)]


@pytest.mark.parametrize("event", ["PostToolUse", "PostToolUseFailure"])
async def test_kimi_fire_and_forget_hooks_answer_at_once_and_deliver_from_a_detached_child(
        scripted: Scripted, event: str) -> None:
    # Kimi Code 2.1.0 does not wait for PostToolUse and kills the hook when the tool call's signal
    # ends: live, the payload was lost before a Python shim had posted it.
    scripted.release = asyncio.Event()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aep_collector.pipeline.shim", "kimi-code", event, "--url", scripted.url("/hold"), "--wait", "600", cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True)
    out, _ = await asyncio.wait_for(proc.communicate(PAYLOAD), 30)
    # Answered while the receiver still holds the POST (inline, the shim would wait its 600 s).
    assert (proc.returncode, out) == (0, b"{}")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what the vendor does to the hook's group
    for _ in range(3000):
        if scripted.seen:
            break
        await asyncio.sleep(0.01)
    scripted.release.set()
    assert scripted.seen == [(f"/hold?hook={event}", PAYLOAD)]


async def test_the_env_url_is_honoured(scripted: Scripted) -> None:
    rc, out = await run_shim(["vscode"], PAYLOAD, {"AEP_VSCODE_URL": scripted.url("/echo")})
    assert (rc, out) == (0, b'{"echo":true}') and scripted.seen[0][0] == "/echo"


async def test_an_empty_reply_prints_nothing(scripted: Scripted) -> None:
    assert await run_shim(["codex", "--url", scripted.url("/empty")], PAYLOAD) == (0, b"")


async def test_the_compact_pinned_reply_is_restored_byte_exact(scripted: Scripted) -> None:
    assert await run_shim(["antigravity", "PreToolUse", "--url", scripted.url("/compact")], PAYLOAD) == (
        0, b'{"decision": ""}')


@pytest.mark.parametrize("stdin", [b"", b"   \n", b"garbage", b"[1, 2]", b"\xff\xfe\x00", b"null"],
                         ids=["empty", "blank", "garbage", "array", "binary", "null"])
@pytest.mark.parametrize("vendor,event", [("codex", None), ("antigravity", "PreToolUse"), ("antigravity", "Stop"),
                                          ("qwen-code", None), ("vscode", None)])
async def test_bad_stdin_is_neutral_without_a_round_trip(scripted: Scripted, stdin: bytes, vendor: str,
                                                         event: str | None) -> None:
    args = [vendor] + ([event] if event else []) + ["--url", scripted.url("/echo")]
    assert await run_shim(args, stdin) == (0, expected_neutral(vendor, event))
    assert scripted.seen == []


async def test_huge_stdin_is_neutral_and_drained(scripted: Scripted) -> None:
    huge = b'{"x": "' + b"a" * (shim.MAX_STDIN + 10) + b'"}'
    assert await run_shim(["antigravity", "PreToolUse", "--url", scripted.url("/echo")], huge) == (
        0, b'{"decision": ""}')
    assert scripted.seen == []


# --- against a live receiver ---------------------------------------------------------------------------


@pytest.fixture
async def live(tmp_path: Path) -> Any:
    registry, _ = build_registry(load_plugins=False)
    cfg = base_config(tmp_path, receivers={"antigravity": {"endpoint": "127.0.0.1:0", "max_body_bytes": 4096,
                                                           "max_slim_bytes": 0},  # the shim slims
                                           "codex": {"endpoint": "127.0.0.1:0"}})
    async with running(cfg, registry) as service:
        yield service, tmp_path


async def test_live_antigravity_replies_byte_exact(live: Any) -> None:
    service, tmp_path = live
    url = f"http://127.0.0.1:{service.receivers['antigravity'].port}"
    body = json.dumps({"conversationId": "conv-live", "stepIdx": 3,
                       "toolCall": {"name": "view_file", "args": {"AbsolutePath": "/w/a.py"}}}).encode()
    for hook, raw in PINNED.items():
        assert await run_shim(["antigravity", hook, "--url", url], body) == (0, raw), hook
    types = [e["type"] for e in read_jsonl(tmp_path / "logs" / "antigravity" / "conv-live.jsonl")]
    assert types[:3] == ["session.started", "tool.requested", "run.finished"]


async def test_live_oversized_payload_is_sent_again_without_its_bulk(live: Any) -> None:
    service, tmp_path = live
    url = f"http://127.0.0.1:{service.receivers['antigravity'].port}"
    body = json.dumps({"conversationId": "conv-big", "pad": "x" * 10_000}).encode()  # over max_body_bytes: 413
    assert await run_shim(["antigravity", "Stop", "--url", url], body) == (0, b'{"decision": ""}')
    # The 413 named the limit; the payload went again without "pad" and the hook was recorded.
    types = [e["type"] for e in read_jsonl(tmp_path / "logs" / "antigravity" / "conv-big.jsonl")]
    assert "run.finished" in types
    assert "pad" not in (tmp_path / "logs" / "antigravity" / "conv-big.jsonl").read_text()


async def test_live_a_tool_output_over_the_body_limit_still_completes_the_tool(tmp_path: Path) -> None:
    """A PostToolUse over ``max_body_bytes`` was refused whole: the stream kept the tool's request
    and never its completion. Sent again without the output, it completes, with no result digest
    (a digest of a cut output would be wrong)."""
    registry, _ = build_registry(load_plugins=False)
    cfg = base_config(tmp_path, receivers={"codex": {"endpoint": "127.0.0.1:0", "max_body_bytes": 65536,
                                                     "max_slim_bytes": 0}})  # the shim slims
    async with running(cfg, registry) as service:
        url = f"http://127.0.0.1:{service.receivers['codex'].port}"
        call = {"session_id": "s-big", "turn_id": "t1", "tool_name": "shell", "tool_use_id": "call_1"}
        pre = {"hook_event_name": "PreToolUse", **call, "tool_input": {"command": "cat big.log"}}
        post = {"hook_event_name": "PostToolUse", **call,
                "tool_response": {"output": "y" * 200_000, "exit_code": 0}}
        for payload in (pre, post):
            assert await run_shim(["codex", "--url", url], json.dumps(payload).encode()) == (0, b"{}")
        events = read_jsonl(tmp_path / "logs" / "codex" / "s-big.jsonl")
    done = [e for e in events if e["type"] == "tool.completed"]
    assert len(done) == 1 and done[0]["data"]["tool"] == {"name": "shell", "call_id": "call_1"}
    assert "result_digest" not in done[0]["data"]
    assert service.health.request_errors  # the first, refused attempt is still counted


def test_slim_drops_the_bulkiest_values_first_and_keeps_what_it_keeps_whole() -> None:
    body = json.dumps({"id": "a" * 600, "small": {"k": 1}, "big": ["z" * 5000], "name": "n", "n": 3}).encode()
    out = json.loads(shim.slim(body, 1000))
    assert out == {"id": "a" * 600, "small": {"k": 1}, "name": "n", "n": 3}  # only "big" had to go
    assert json.loads(shim.slim(body, 200)) == {"small": {"k": 1}, "name": "n", "n": 3}
    with pytest.raises(shim.Failed):
        shim.slim(body, 10)  # even the scalars do not fit


async def test_live_payload_without_a_hook_name_is_refused_and_neutral(live: Any) -> None:
    service, _ = live
    url = f"http://127.0.0.1:{service.receivers['codex'].port}"
    assert await run_shim(["codex", "--url", url], b'{"session_id": "s"}') == (0, b"{}")  # receiver 400


def test_the_console_script_is_the_same_program() -> None:
    script = Path(sys.executable).parent / "aep-collector-hook"
    if not script.exists():
        pytest.fail(f"console script missing: {script} (pip install -e . declares it)")
    out = subprocess.run([str(script), "antigravity", "Stop", "--url", f"http://127.0.0.1:{closed_port()}"],
                         input=PAYLOAD, capture_output=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, b'{"decision": ""}')


def test_the_console_script_writes_the_table_it_had_to_build(tmp_path: Path) -> None:
    """Run from the package with no table in the hook folder, the shim builds the table from the
    declarations (slow: it imports the collector) and leaves it there, so the next hook is fast."""
    script = Path(sys.executable).parent / "aep-collector-hook"
    hook_home = tmp_path / "aep"
    env = {**os.environ, "AEP_HOOK_DIR": str(hook_home)}
    args = [str(script), "antigravity", "Stop", "--url", f"http://127.0.0.1:{closed_port()}"]
    assert not (hook_home / "bin" / TABLE_FILE).exists()
    first = subprocess.run(args, input=PAYLOAD, capture_output=True, timeout=60, env=env)
    assert (first.returncode, first.stdout) == (0, b'{"decision": ""}')
    assert (hook_home / "bin" / TABLE_FILE).is_file()
    second = subprocess.run(args, input=PAYLOAD, capture_output=True, timeout=60, env=env)
    assert (second.returncode, second.stdout) == (0, b'{"decision": ""}')


# --- the vendor table missing or broken: every vendor is answered neutrally ---------------------------


def run_copy(copy: Path, args: list[str], stdin: bytes) -> tuple[int, bytes]:
    """The copy exactly as the registered command starts it (no site, no environment)."""
    code = "import sys;sys.path[:0]=[sys.argv.pop(1)];import aep_collector_hook as s;sys.exit(s.main())"
    out = subprocess.run([sys.executable, "-S", "-I", "-c", code, str(copy.parent), *args], input=stdin,
                         capture_output=True, timeout=60)
    return out.returncode, out.stdout


@pytest.mark.parametrize("table_text", [None, "VENDORS = {", "VENDORS = {'codex': {'port': 'x', 'colour': 1}}",
                                        "raise SystemExit(3)"], ids=["missing", "syntax", "bad-entry", "exits"])
@pytest.mark.parametrize("vendor,event", [("codex", None), ("kimi-code", "UserPromptSubmit"),
                                          ("antigravity", "PreToolUse")])
def test_a_missing_or_broken_table_answers_neutral_and_exits_zero(shim_copy: Path, table_text: str | None,
                                                                  vendor: str, event: str | None) -> None:
    table_file = shim_copy.with_name(TABLE_FILE)
    table_file.unlink()
    if table_text is not None:
        table_file.write_text(table_text + "\n")
    args = [vendor, *([event] if event else []), "--url", f"http://127.0.0.1:{closed_port()}"]
    assert run_copy(shim_copy, args, PAYLOAD) == (0, b"{}")


def test_the_copy_reads_its_table_for_the_pinned_neutral_bytes(shim_copy: Path) -> None:
    # With the table the vendors are known: their pinned bytes, not the unknown vendor's `{}`.
    assert run_copy(shim_copy, ["antigravity", "Stop", "--url", f"http://127.0.0.1:{closed_port()}"],
                    PAYLOAD) == (0, b'{"decision": ""}')
    assert run_copy(shim_copy, ["kimi-code", "UserPromptSubmit", "--url", f"http://127.0.0.1:{closed_port()}"],
                    PAYLOAD) == (0, b"")
