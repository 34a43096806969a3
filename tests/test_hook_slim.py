"""Hook bodies over ``max_body_bytes``: slimmed on the receiver so the event still arrives.

Claude Code and Qwen Code post their hooks themselves: a 413 fails open on their side and the
event was gone (a tool's ``tool.completed`` never came). The receiver now reads such a body up to
``max_slim_bytes`` and drops its bulkiest top-level values, as the shim does after a 413.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.pipeline.metrics import render
from aep_collector.receivers import hook_http

from tests.helpers import base_config, read_jsonl, running

LIMIT = 4096
CALL = {"session_id": "s-big", "transcript_path": "/t.jsonl", "cwd": "/w", "tool_name": "Read",
        "tool_use_id": "toolu_1"}


def config(tmp_path: Path, **keys: Any) -> dict[str, Any]:
    return base_config(tmp_path, receivers={"claude_code": {"endpoint": "127.0.0.1:0", "max_body_bytes": LIMIT,
                                                            **keys}})


async def post(port: int, body: bytes, chunked: bool = False) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as client:
        data: Any = body
        if chunked:  # no Content-Length: the size is known only once it has arrived
            async def parts() -> Any:
                for at in range(0, len(body), 65536):
                    yield body[at:at + 65536]
            data = parts()
        async with client.post(f"http://127.0.0.1:{port}/hook", data=data,
                               headers={"Content-Type": "application/json"}) as response:
            return response.status, await response.json()


def pre_and_post(output: str) -> list[bytes]:
    pre = {"hook_event_name": "PreToolUse", **CALL, "tool_input": {"file_path": "/w/big.log"}}
    post_ = {"hook_event_name": "PostToolUse", **CALL, "tool_input": {"file_path": "/w/big.log"},
             "tool_response": {"content": output}}
    return [json.dumps(pre).encode(), json.dumps(post_).encode()]


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_tool_output_over_the_limit_still_completes_the_tool(tmp_path: Path, chunked: bool,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    async with running(config(tmp_path)) as service:
        port = service.receivers["claude_code"].port
        for body in pre_and_post("y" * 300_000):
            assert await post(port, body, chunked) == (200, {})
        metrics = render(service)
    events = read_jsonl(tmp_path / "logs" / "claude-code" / "s-big.jsonl")
    done = [e for e in events if e["type"] == "tool.completed"]
    assert len(done) == 1 and done[0]["data"]["tool"] == {"name": "Read", "call_id": "toolu_1"}
    assert "result_digest" not in done[0]["data"]  # a digest of a cut output would be wrong
    assert 'outcome="slimmed"} 1' in metrics
    assert "request_errors_total{" not in metrics  # nothing was refused
    assert "passed on without 'tool_response'" in caplog.text


async def test_the_dropped_keys_are_logged_escaped_cut_and_counted(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    payload = {"hook_event_name": "Stop", "session_id": "s-big",
               **{f"line\nbreak{i}" + "k" * 100: ["v" * 5000] for i in range(10)}}  # all ten must go
    async with running(config(tmp_path)) as service:
        assert await post(service.receivers["claude_code"].port, json.dumps(payload).encode()) == (200, {})
    (line,) = [r.getMessage() for r in caplog.records if "passed on without" in r.getMessage()]
    assert "\n" not in line and "line\\nbreak" in line and "k" * 40 not in line
    assert line.endswith(" and 2 more")


async def test_a_body_over_max_slim_bytes_is_refused_naming_that_cap(tmp_path: Path) -> None:
    async with running(config(tmp_path, max_slim_bytes=100_000)) as service:
        port = service.receivers["claude_code"].port
        status, body = await post(port, pre_and_post("y" * 200_000)[1])
        assert status == 413 and body["error"] == "payload-too-large" and body["max_bytes"] == 100_000
        status, body = await post(port, pre_and_post("y" * 50_000)[1])  # under the cap: slimmed
        assert (status, body) == (200, {})


async def test_max_slim_bytes_0_refuses_every_body_over_the_limit_as_before(tmp_path: Path) -> None:
    async with running(config(tmp_path, max_slim_bytes=0)) as service:
        status, body = await post(service.receivers["claude_code"].port, pre_and_post("y" * 10_000)[1])
    assert (status, body) == (413, {"error": "payload-too-large", "detail": f"body over {LIMIT} bytes",
                                    "max_bytes": LIMIT})


async def test_a_body_whose_scalars_alone_are_over_the_limit_is_refused(tmp_path: Path) -> None:
    # Strings up to 512 characters are never dropped (ids, names, paths): nine of them are over 4 KiB.
    payload = {"hook_event_name": "Stop", "session_id": "s-big", **{f"k{i}": "z" * 500 for i in range(9)}}
    async with running(config(tmp_path)) as service:
        status, body = await post(service.receivers["claude_code"].port, json.dumps(payload).encode())
    assert status == 413 and body["error"] == "payload-too-large" and body["max_bytes"] == LIMIT
    assert "even without its bulk" in body["detail"]


async def test_an_oversized_batch_is_refused_not_emptied(tmp_path: Path) -> None:
    moment = {"kind": "event", "type": "session.idle", "properties": {"sessionID": "ses_1", "pad": "p" * 3000}}
    raw = base_config(tmp_path, receivers={"opencode": {"endpoint": "127.0.0.1:0", "max_body_bytes": LIMIT}})
    async with running(raw) as service:
        status, body = await post(service.receivers["opencode"].port, json.dumps({"batch": [moment] * 3}).encode())
    assert status == 413 and body["error"] == "payload-too-large" and "batch" in body["detail"]


async def test_only_a_few_oversized_bodies_are_read_at_once(tmp_path: Path) -> None:
    """Each may be ``max_slim_bytes``: past ``SLIM_AT_ONCE`` arriving together, one gets the 413 it
    got before, while bodies under the limit are served as ever."""
    async with running(config(tmp_path)) as service:
        server = service.receivers["claude_code"]
        port = server.port
        big = pre_and_post("y" * 50_000)[1]
        stalled = []
        for _ in range(hook_http.SLIM_AT_ONCE):  # headers and half the body; the rest waits
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(big) + big[:len(big) // 2])
            await writer.drain()
            stalled.append((reader, writer))
        for _ in range(200):
            if server.slimming == hook_http.SLIM_AT_ONCE:
                break
            await asyncio.sleep(0.01)
        assert server.slimming == hook_http.SLIM_AT_ONCE
        status, body = await post(port, big)
        assert status == 413 and body["max_bytes"] == LIMIT
        assert await post(port, pre_and_post("small")[0]) == (200, {})
        for reader, writer in stalled:  # the rest of each body arrives: each is slimmed and served
            writer.write(big[len(big) // 2:])
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            writer.close()
        assert server.slimming == 0
