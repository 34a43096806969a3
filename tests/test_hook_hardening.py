"""The hook path under hostile input and partial failure, with real parts throughout.

- A body nested as deep as the decoder accepts is recorded by every hook receiver; one level
  deeper is a 400 naming the problem. Nothing in between is answered and then lost.
- ``digest`` (card keys, argument digests) gives the canonical digest at any depth and never
  raises ``RecursionError``.
- Health conditions last exactly while their cause does: one agent's unwritable log directory is
  not cleared by another agent's writes (and is logged once), ``overloaded`` and ``holds-full``
  clear as soon as a slot is free again.
- The command shim never prints a reply that is not one JSON object, and never waits forever on a
  vendor that leaves stdin open.
- HTTP that aiohttp cannot parse is refused with a JSON body naming the problem, like every refusal.

In-process collectors on loopback free ports, raw sockets for malformed HTTP, the shim as a real
subprocess.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.pipeline import canonical, control, shim, wire
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Health, Host
from aep_collector.receivers.registration import ensure_shim
from aep_sdk.control import ControlSender
from aiohttp import web

from tests.helpers import ROOT, base_config, http_responses, read_jsonl, running, serve
from tests.relay_double import wait_until

MAX = wire.MAX_DEPTH


def nested(depth: int, leaf: str = "1") -> str:
    """JSON text nesting ``depth`` levels, objects and arrays in turn (``depth`` 0 is ``leaf``)."""
    opened = "".join('{"a":' if level % 2 == 0 else "[" for level in range(depth))
    closed = "".join("}" if level % 2 == 0 else "]" for level in reversed(range(depth)))
    return opened + leaf + closed


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, dict | list):
        value = value["a"] if isinstance(value, dict) else value[0]
        depth += 1
    return depth


# --- 1. one depth limit the whole path handles ------------------------------------------------------


@pytest.mark.parametrize("decode", [wire.loads, wire.loads_exact], ids=["loads", "loads_exact"])
def test_the_decoder_takes_its_depth_limit_and_refuses_one_level_more(decode: Any) -> None:
    assert depth_of(decode(nested(MAX).encode())) == MAX
    assert depth_of(decode(nested(MAX))) == MAX  # a text frame
    for deeper in (MAX + 1, 1000, 1100, 5000):
        with pytest.raises(wire.DecodeError, match=f"nesting deeper than {MAX} levels"):
            decode(nested(deeper).encode())


def test_every_path_through_loads_refuses_alike() -> None:
    # A 19-digit integer sends a body to the exact decoder; text with a lone surrogate stays text.
    for leaf in ("1234567890123456789", '"\\ud800"'):
        assert depth_of(wire.loads(nested(MAX, leaf).encode())) == MAX
        with pytest.raises(wire.DecodeError, match="nesting deeper"):
            wire.loads(nested(MAX + 1, leaf).encode())
    with pytest.raises(wire.DecodeError, match="nesting deeper"):
        wire.loads(nested(MAX + 1, '"\ud800"'))


def test_brackets_inside_strings_are_not_nesting() -> None:
    # Enough brackets to make the decoder look (a Write tool's code is full of them): still accepted.
    text = "[{" * 5000
    assert wire.loads(json.dumps({"a": text, "b": [[text]]}).encode()) == {"a": text, "b": [[text]]}


def hook_body(vendor_hook: str, session: str, depth: int) -> bytes:
    """A tool hook whose whole body nests ``depth`` levels (its tool_input two less the value inside)."""
    head = json.dumps({"hook_event_name": vendor_hook, "session_id": session, "tool_name": "Bash",
                       "tool_use_id": "t1", "tool_call_id": "t1"})[:-1]
    return f'{head}, "tool_input": {{"command": "ls", "x": {nested(depth - 2)}}}}}'.encode()


DEEP_CASES = [("claude_code", "claude-code", "PermissionRequest"), ("claude_code", "claude-code", "PostToolUse"),
              ("codex", "codex", "PermissionRequest"), ("codex", "codex", "PostToolUse"),
              ("qwen_code", "qwen-code", "PermissionRequest"), ("gemini_cli", "gemini-cli", "BeforeTool")]


async def test_a_hook_at_the_depth_limit_is_recorded_and_one_level_deeper_is_refused(tmp_path: Path) -> None:
    receivers = {r: {"endpoint": "127.0.0.1:0"} for r in dict.fromkeys(r for r, _, _ in DEEP_CASES)}
    async with running(base_config(tmp_path, receivers)) as service, aiohttp.ClientSession() as http:
        for receiver, agent, hook in DEEP_CASES:
            url = f"http://127.0.0.1:{service.receivers[receiver].port}/hook"
            ok, deep = f"{hook}-ok", f"{hook}-deep"
            async with http.post(url, data=hook_body(hook, ok, MAX), headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, (receiver, hook, await r.text())
            async with http.post(url, data=hook_body(hook, deep, MAX + 1),
                                 headers={"Content-Type": "application/json"}) as r:
                assert r.status == 400
                assert await r.json() == {"error": "invalid-json", "detail": f"nesting deeper than {MAX} levels"}
            logs = tmp_path / "logs" / agent
            assert read_jsonl(logs / f"{ok}.jsonl"), (receiver, hook)  # accepted: recorded
            assert not (logs / f"{deep}.jsonl").exists()  # refused, and said so
        health = service.health.snapshot()
        assert health["ok"] is True, health  # no hook-error: nothing failed after acceptance


def reference_digest(value: Any) -> str:
    """SHA-256 of the canonical JSON by the standard encoder, given the recursion it needs."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 50_000))
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    finally:
        sys.setrecursionlimit(limit)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def plain_value(depth: int) -> Any:
    """``nested(depth)`` decoded, built without the recursion decoding it would need."""
    value: Any = 1
    for level in reversed(range(depth)):
        value = {"a": value} if level % 2 == 0 else [value]
    return value


def deep_value(depth: int) -> Any:
    value: Any = {"z": "é\u2028", "n": None, "f": 1.5}
    for level in range(depth - 1):
        value = {"b": value, "a": [level, True, "x"]} if level % 2 else [value, {"y": 2, "x": 1}]
    return value


@pytest.mark.parametrize("depth", [253, 254, 255, 256, 1500, 5000])
def test_digest_is_the_canonical_one_at_any_depth(depth: int) -> None:
    # Either side of orjson's 254 levels (the fast path's edge), and far past Python's recursion limit.
    value = deep_value(depth)
    assert canonical.digest(value) == reference_digest(value)
    plain = plain_value(depth)  # no float: the orjson fast path's kind of value
    assert canonical.digest(plain) == reference_digest(plain)


def test_card_keys_of_a_deep_tool_input_never_raise() -> None:
    deep = plain_value(3000)
    assert control.permission_key("Bash", deep) == control.permission_key("Bash", plain_value(3000))
    assert control.permission_key("Bash", deep) != control.permission_key("Bash", plain_value(2999))
    assert control.card_key("Bash", deep, 1).startswith("card:")


def test_a_value_containing_itself_is_refused_not_walked_forever() -> None:
    loop: list[Any] = []
    loop.append({"a": loop})
    with pytest.raises(ValueError, match="Circular"):
        canonical.digest(loop)


# --- 2. an unwritable agent directory stays reported while another agent writes ----------------------


def event(agent: str, session: str, seq: int) -> dict[str, Any]:
    return {"aep": "0.1", "id": f"{agent}-{seq}", "type": "run.started", "time": "2026-01-01T00:00:00.000Z",
            "source": f"aep://h/agent/{agent}/session/{session}", "agent": agent, "session": session, "seq": seq,
            "data": {}}


async def exporter_on(root: Path) -> tuple[JsonlExporter, Health]:
    exporter = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(root), fsync="never"))
    host = Host(health=Health())
    await exporter.start(host)
    return exporter, host.health


def health_lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aep.health"]


async def test_one_agents_unwritable_directory_is_not_cleared_by_another_agents_writes(
        tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="aep.health")
    root = tmp_path / "logs"
    root.mkdir()
    blocker = root / "claude-code"
    blocker.write_text("a file where the agent's directory should be")  # unwritable, whoever runs the test
    exporter, health = await exporter_on(root)
    for seq in range(3):
        exporter.export_now([event("claude-code", "c1", seq)])
        exporter.export_now([event("codex", "x1", seq)])  # another agent's write succeeds
        snap = health.snapshot()
        assert snap["ok"] is False and "exporter/jsonl" in snap["problems"], snap
    exporter.export_now([event("claude-code", "c1", 3), event("codex", "x1", 3)])  # one batch, both agents
    snap = health.snapshot()
    assert snap["ok"] is False and snap["dropped"] == {"exporter/jsonl": 4}
    assert [e["seq"] for e in read_jsonl(root / "codex" / "x1.jsonl")] == [0, 1, 2, 3]
    (cause,) = snap["problems"]["exporter/jsonl"]
    assert health_lines(caplog) == [f"exporter/jsonl: {cause}: {blocker / 'c1.jsonl'}: "
                                    f"{snap['problems']['exporter/jsonl'][cause].split(': ', 1)[1]}"]
    blocker.unlink()  # fixed: the next write there clears it, said once
    exporter.export_now([event("claude-code", "c1", 4)])
    assert health.snapshot()["ok"] is True
    assert health_lines(caplog)[1:] == [f"exporter/jsonl: recovered from {cause}"]
    assert [e["seq"] for e in read_jsonl(blocker / "c1.jsonl")] == [4]
    await exporter.shutdown()


async def test_a_fixed_directory_clears_on_a_health_read_even_if_never_written_again(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    blocker = root / "claude-code"
    blocker.write_text("a file where the agent's directory should be")
    exporter, health = await exporter_on(root)
    exporter.export_now([event("claude-code", "ended", 0)])  # that session never writes again
    assert health.snapshot()["ok"] is False
    exporter.export_now([event("codex", "x1", 0)])
    assert health.snapshot()["ok"] is False  # still unwritable: the probe says so too
    blocker.unlink()
    assert health.snapshot()["ok"] is True  # the cause is gone: no write needed to show it
    await exporter.shutdown()


async def test_a_retention_failure_clears_when_that_step_works_again(tmp_path: Path, monkeypatch: Any) -> None:
    import errno

    real_fsync = os.fsync

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    exporter = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"),
                                                                     fsync="never", rotate_bytes=1024))
    host = Host(health=Health())
    await exporter.start(host)
    pad = "x" * 300
    monkeypatch.setattr(os, "fsync", disk_full)  # fsync="never": only the compressor syncs
    for seq in range(8):
        exporter.export_now([{**event("claude-code", "s", seq), "data": {"pad": pad}}])
    await wait_until(lambda: "retention-failed" in host.health.snapshot().get("problems", {}).get(
        "exporter/jsonl", {}), "the compression failure to show")
    exporter.export_now([event("codex", "x", 0)])  # a write elsewhere proves nothing about compressing
    assert "retention-failed" in host.health.snapshot()["problems"]["exporter/jsonl"]
    monkeypatch.setattr(os, "fsync", real_fsync)
    for seq in range(8, 16):
        exporter.export_now([{**event("claude-code", "s", seq), "data": {"pad": pad}}])
    await wait_until(lambda: host.health.snapshot()["ok"], "compressing to work again")
    await exporter.shutdown()


# --- 3, 4. overloaded and holds-full clear as soon as a slot is free ------------------------------------

SID = "sess-slots"
SENDER = ControlSender(lambda _c: None, agent="operator", host="ops")


def permission(tool_use_id: str) -> dict[str, Any]:
    return {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "Bash",
            "tool_input": {"command": f"ls {tool_use_id}"}, "tool_use_id": tool_use_id, "cwd": "/w"}


def allow(rid: str) -> Any:
    return SENDER.build("control.attention.respond", SID, subject=rid, data={"answer": {"option": "allow"}})


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.json()


async def held(router: Any, n: int) -> list[str]:
    return await wait_until(lambda: list(router.holds) if len(router.holds) >= n else None, f"{n} held requests")


async def two_held(service: Any) -> tuple[Any, str, asyncio.Task[Any], asyncio.Task[Any], str]:
    """Two Claude Code permission requests held open: (router, hook URL, their tasks, the first's id)."""
    router, url = service.host.control, f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"
    router.set_route("claude-code", True)
    first = asyncio.create_task(post(url, permission("t1")))
    second = asyncio.create_task(post(url, permission("t2")))
    rid1, _ = await held(router, 2)
    return router, url, first, second, rid1


async def test_overloaded_clears_once_a_request_slot_is_free(tmp_path: Path) -> None:
    cfg = base_config(tmp_path)
    cfg["receivers"]["claude_code"].update(max_concurrent_requests=2, attention_timeout=30)
    async with running(cfg) as service:
        router, url, first, second, rid1 = await two_held(service)
        status, body = await post(url, permission("t3"))
        assert status == 503 and body["error"] == "busy"
        assert "overloaded" in service.health.snapshot()["problems"]["receiver/claude_code"]
        await router.submit(allow(rid1), "claude-code")
        assert (await asyncio.wait_for(first, 10))[0] == 200
        # One of two slots is in use: a request now is served, so the receiver is not overloaded.
        assert not second.done()
        assert "receiver/claude_code" not in service.health.snapshot().get("problems", {})
        assert await post(url, {"session_id": SID, "hook_event_name": "Notification", "message": "m"}) == (200, {})
        second.cancel()


async def test_holds_full_clears_once_a_hold_is_free(tmp_path: Path) -> None:
    cfg = base_config(tmp_path)
    cfg["receivers"]["claude_code"]["attention_timeout"] = 30
    cfg["service"]["limits"] = {"max_held_requests": 2}
    async with running(cfg) as service:
        router, url, first, second, rid1 = await two_held(service)
        assert await post(url, permission("t3")) == (200, {})  # over the bound: not held
        assert "holds-full" in service.health.snapshot()["problems"]["control"]
        await router.submit(allow(rid1), "claude-code")
        await asyncio.wait_for(first, 10)
        assert len(router.holds) == 1 and not second.done()
        assert "control" not in service.health.snapshot().get("problems", {})  # one of two in use
        third = asyncio.create_task(post(url, permission("t4")))
        await held(router, 2)  # and the next request is held again
        second.cancel()
        third.cancel()


# --- 5, 6. the shim: no garbage passed on, no endless wait on stdin ------------------------------------------


class Receiver:
    """A scripted receiver on a free loopback port: answers each hook with the next scripted body."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies = list(replies)
        self.seen: list[bytes] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self.hook)
        self.runner, self.port = await serve(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def hook(self, request: web.Request) -> web.Response:
        self.seen.append(await request.read())
        return web.Response(body=self.replies.pop(0) if self.replies else b"{}", content_type="application/json")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


ANTIGRAVITY_STOP_NEUTRAL = b'{"decision": ""}'
PAYLOAD = b'{"hook_event_name":"Stop","session_id":"s-shim"}'


@pytest.fixture
def shim_copy() -> Path:
    return ensure_shim()  # the shim's vendor table, in this test's hook folder


async def run_shim(args: list[str], stdin: bytes) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aep_collector.pipeline.shim", *args, cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode == 0
    return out


GARBAGE = [b"{this is not json}", b'{"decision":"block"} {"x":1}', b'{"a":1,}', b'{"a":NaN}', b'{"a":"\x01"}',
           b'{"a":"\xff"}', b"{" + b'"a":[' * 3000 + b"]" * 3000 + b"}", b"{}}", b"{ }x"]


@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
async def test_a_reply_that_is_not_one_json_object_becomes_the_neutral_reply(shim_copy: Path, garbage: bytes) -> None:
    async with Receiver([garbage]) as receiver:
        out = await run_shim(["antigravity", "Stop", "--url", receiver.url], PAYLOAD)
    assert receiver.seen == [PAYLOAD]  # it was asked; its answer was not passed on
    assert out == ANTIGRAVITY_STOP_NEUTRAL


@pytest.mark.parametrize("reply", [b'{"decision":"block","reason":"r\\u00e9"}', b' {"a": [1, {"b": null}]}\n',
                                   b"{}"])
async def test_a_json_object_reply_is_passed_on(shim_copy: Path, reply: bytes) -> None:
    async with Receiver([reply]) as receiver:
        assert await run_shim(["antigravity", "Stop", "--url", receiver.url], PAYLOAD) == reply.strip()


async def test_checking_a_reply_imports_neither_json_nor_re(shim_copy: Path) -> None:
    # The copy as registered (no site): a reply other than {} is scanned by _json alone.
    async with Receiver([b'{"decision":"block"}']) as receiver:
        code = (f"import sys; sys.path[:0] = [{str(shim_copy.parent)!r}]; before = set(sys.modules); "
                f"import aep_collector_hook as s; s.main(['antigravity', 'Stop', '--url', {receiver.url!r}]); "
                "sys.stderr.write(repr(sorted(set(sys.modules) - before)))")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-S", "-I", "-c", code, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(PAYLOAD), 60)
    assert out == b'{"decision":"block"}'
    loaded = set(ast.literal_eval(err.decode().rsplit("\n", 1)[-1]))
    assert loaded <= {"aep_collector_hook", "aep_collector_hook_vendors", "_socket", "_json"}, loaded


class OpenStdin:
    """The shim as a vendor runs it, whose stdin the vendor writes to and does not close."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aep_collector.pipeline.shim", "antigravity", "Stop", "--url", url], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.started = time.monotonic()

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    async def reply(self) -> tuple[bytes, float]:
        """The shim's stdout and when it exited (seconds from its start), stdin still open throughout."""
        try:
            await wait_until(lambda: self.proc.poll() is not None, "the shim to exit", timeout=20)
            assert self.proc.stdout is not None and self.proc.returncode == 0
            return self.proc.stdout.read(), time.monotonic() - self.started
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            assert self.proc.stdin is not None
            self.proc.stdin.close()


# The documented bound of a hook that is never held: connecting, then the reply (stdin included).
BOUND = shim.CONNECT_WAIT + shim.SHORT_WAIT


async def test_a_whole_payload_on_stdin_left_open_is_forwarded(shim_copy: Path) -> None:
    async with Receiver([b'{"decision":"block"}']) as receiver:
        vendor = OpenStdin(receiver.url)
        vendor.write(PAYLOAD + b"\n")
        out, took = await vendor.reply()
    assert (out, receiver.seen) == (b'{"decision":"block"}', [PAYLOAD + b"\n"])
    assert took < shim.STDIN_WAIT + 3  # answered once stdin fell quiet, not at any deadline


async def test_a_payload_written_in_pieces_is_forwarded_whole(shim_copy: Path) -> None:
    async with Receiver([b'{"decision":"block"}']) as receiver:
        vendor = OpenStdin(receiver.url)
        vendor.write(PAYLOAD[:20])  # not yet one object: the quiet that follows must not cut it here
        await asyncio.sleep(shim.STDIN_QUIET * 4)
        vendor.write(PAYLOAD[20:])
        out, _ = await vendor.reply()
    assert (out, receiver.seen) == (b'{"decision":"block"}', [PAYLOAD])


@pytest.mark.parametrize("written", [b"", PAYLOAD[:20]], ids=["nothing", "half"])
async def test_no_whole_payload_on_an_open_stdin_is_neutral_within_the_bound(shim_copy: Path, written: bytes) -> None:
    async with Receiver([]) as receiver:
        vendor = OpenStdin(receiver.url)
        vendor.write(written)
        out, took = await vendor.reply()
    assert out == ANTIGRAVITY_STOP_NEUTRAL and receiver.seen == []
    assert shim.STDIN_WAIT <= took < BOUND


# --- 7. malformed HTTP is refused with a JSON body ------------------------------------------------------------

MALFORMED = {
    "bad chunk size": b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "over-long query": b"POST /hook?hook=" + b"A" * 9000 + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    "negative Content-Length": b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}",
    "over-long header": b"POST /hook HTTP/1.1\r\nHost: x\r\nX-A: " + b"b" * 9000 + b"\r\nContent-Length: 2\r\n\r\n{}",
    "not HTTP": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03 hello\r\n\r\n",
    "bad method": b"P@ST /hook HTTP/1.1\r\nHost: x\r\n\r\n",
}


def exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


async def assert_json_refusals(where: str, port: int) -> None:
    """Every ``MALFORMED`` request to ``port`` gets 400 ``{"error": "bad-http", "detail": ...}``
    (also used for OTLP/HTTP and the relay role, tests/test_http_refusals.py)."""
    for name, raw in MALFORMED.items():
        answers = http_responses(await asyncio.to_thread(exchange, port, raw))
        assert answers, (where, name)
        for status, headers, body in answers:
            assert status == 400, (where, name, status, body)
            assert headers["content-type"].startswith("application/json"), (where, name, headers)
            refusal = json.loads(body)
            assert refusal["error"] == "bad-http", (where, name, refusal)
            assert refusal["detail"].startswith("malformed HTTP request: ") and len(refusal["detail"]) > 24


async def test_http_aiohttp_cannot_parse_is_refused_with_a_json_body(tmp_path: Path) -> None:
    receivers = {"claude_code": {"endpoint": "127.0.0.1:0"}, "codex": {"endpoint": "127.0.0.1:0"}}
    async with running(base_config(tmp_path, receivers)) as service:
        for receiver in receivers:
            await assert_json_refusals(receiver, service.receivers[receiver].port)
        # Still serving, and a bad request says nothing about the collector's health.
        status, _ = await post(f"http://127.0.0.1:{service.receivers['codex'].port}/hook",
                               {"hook_event_name": "SessionStart", "session_id": "alive"})
        assert status == 200 and service.health.snapshot()["ok"] is True
        counted = {cause for (component, cause) in service.health.request_errors if component.startswith("receiver/")}
        assert "bad-http" in counted



@pytest.mark.skipif(os.name == "nt", reason="the /bin/sh chain is the POSIX registration")
@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
def test_the_registered_chain_answers_when_no_python_runs_and_stdin_stays_open(shell: str) -> None:
    """With no interpreter to run the shim, the chain drains stdin itself: for a vendor that leaves
    stdin open that drain must end, so the hook still gets its neutral reply, on time, silently."""
    import subprocess
    import time as _time

    from aep_collector.receivers import registration

    if not Path(shell).exists():
        pytest.skip(f"{shell} is not installed")
    chain = registration._CHAIN.format(pythons="/nonexistent/python3", file=registration.HOOK_FILE,
                                       module=registration.HOOK_FILE[:-3], drain=registration.DRAIN_WAIT)
    for close_stdin in (True, False):
        started = _time.monotonic()
        proc = subprocess.Popen([shell, "-c", chain, "aep-collector-hook", "/nonexistent", '{"continue":true}'],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            proc.stdin.write(b'{"session_id": "s"}' * 5000)  # more than a pipe holds: the drain reads it
            proc.stdin.flush()
            if close_stdin:
                proc.stdin.close()
            out = proc.stdout.read()  # to EOF: nothing the chain leaves behind holds stdout open
            assert proc.wait(10) == 0 and out == b'{"continue":true}' and proc.stderr.read() == b""
            took = _time.monotonic() - started
            assert took < registration.DRAIN_WAIT + 2 if not close_stdin else took < registration.DRAIN_WAIT
        finally:
            if not close_stdin and proc.stdin is not None:
                proc.stdin.close()
            proc.kill()
