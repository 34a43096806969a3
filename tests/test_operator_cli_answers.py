"""``respond`` with an answer the agent's receiver refuses as ``invalid``, against the collector's own
relay role and a held Claude Code question, in real processes. The ack's ``detail`` is gated
``redacted`` (AEP-0004 §3) and the default ceiling is ``metadata``, so it never reaches the
operator: the CLI says itself what the request takes, from the request it already read. Then
``respond`` against a relay that sends frames that are no JSON object, or goes away mid-command.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.helpers import running, serve
from tests.relay_double import wait_until
from tests.test_relay_server import TOKEN, config

EXE = Path(sys.executable).with_name("aep-collector")
SID = "cli-answers-1"
FORM = {"session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "AskUserQuestion",
        "tool_use_id": "toolu_q", "tool_input": {"questions": [
            {"question": "Which DB?", "header": "DB", "multiSelect": False,
             "options": [{"label": "Postgres"}, {"label": "SQLite"}]},
            {"question": "Which region?", "header": "Region", "multiSelect": False,
             "options": [{"label": "eu"}, {"label": "us"}]}]}}


async def cli(url: str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(EXE), *args, "--url", url, "--token", TOKEN, "--retries", "0",
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_an_answer_refused_invalid_says_what_the_request_takes(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        hook = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"
        async with aiohttp.ClientSession() as http:
            watching = await http.get(f"{url}/stream", headers={"Authorization": f"Bearer {TOKEN}"})
            await http.post(hook, json={"session_id": SID, "hook_event_name": "SessionStart", "source": "startup"})
            held = asyncio.create_task(http.post(hook, json=FORM))
            await wait_until(lambda: service.host.control.holds, "the question to be held", 30)
            (rid,) = {h.ids[0] for h in service.host.control.holds.values()}

            code, _, err = await cli(url, tmp_path, "respond", rid, "--allow")
            assert code == 1 and err.startswith("rejected: invalid"), err
            assert "--values" in err, err  # a form is answered with --values, not an option
            code, _, err = await cli(url, tmp_path, "respond", rid, "--values", '{"1": "2"}')
            assert code == 1 and err.startswith("rejected: invalid"), err
            assert "2" in err.split("rejected: invalid", 1)[1] and "required" in err, err  # names the field left out
            code, out, err = await cli(url, tmp_path, "respond", rid, "--values", '{"1": "2", "2": "1"}')
            assert code == 0 and out.startswith("accepted"), err
            reply = await (await asyncio.wait_for(held, 30)).json()
            assert reply["hookSpecificOutput"]["decision"]["updatedInput"]["answers"] == {
                "Which DB?": "SQLite", "Which region?": "eu"}
            watching.close()


class OddRelay:
    """A relay that answers respond's handshake, then does ``then`` with the command it is sent."""

    def __init__(self, then: str) -> None:
        self.then, self.commands = then, 0

    async def socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            frame = json.loads(msg.data)
            if frame["type"] == "hello":
                await ws.send_json({"type": "hello", "versions": ["0.1"], "role": "both"})
            elif frame["type"] == "subscribe":
                await ws.send_json({"type": "subscribed", "id": frame["id"]})
            elif frame["type"] == "roster":
                await ws.send_json({"type": "roster", "id": frame["id"], "entries": []})
            elif frame["type"].startswith("control."):
                self.commands += 1
                if self.then == "garbage":  # what no AEP frame is, then the ack
                    for junk in ("not json", "[1, 2]", "null", '"text"', "{"):
                        await ws.send_str(junk)
                    await ws.send_json({"aep": "0.1", "id": "ack", "type": "control.accepted", "cause": frame["id"],
                                        "session": frame["session"], "seq": 1})
                else:  # it goes away before any ack
                    await ws.close(code=1001, message=b"collector stopping")
        return ws

    async def stream(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        request_ev = {"aep": "0.1", "id": "01ODDREQUEST", "type": "attention.requested", "session": "odd",
                      "seq": 0, "time": "2026-12-07T08:00:00.000Z", "data": {"kind": "permission"}}
        await resp.write(f"event: attention.requested\ndata: {json.dumps(request_ev)}\n\n: replay-complete\n\n".encode())
        await resp.write_eof()
        return resp


@pytest.mark.parametrize("then", ["garbage", "gone"])
async def test_respond_against_a_relay_that_sends_garbage_or_goes_away_mid_command(tmp_path: Path, then: str) -> None:
    relay = OddRelay(then)
    app = web.Application()
    app.router.add_get("/socket", relay.socket)
    app.router.add_get("/stream", relay.stream)
    runner, port = await serve(app)
    try:
        code, out, err = await cli(f"http://127.0.0.1:{port}", tmp_path, "respond", "01ODDREQUEST", "--allow")
    finally:
        await runner.cleanup()
    assert relay.commands == 1 and "Traceback" not in err
    if then == "garbage":  # frames that are no JSON object are not a refusal (exit 1): they are skipped
        assert code == 0 and out.startswith("accepted"), (code, out, err)
    else:  # unreachable, and the operator is told the command was sent but not answered
        assert code == 4 and err.startswith("error: "), err
        assert "1001" in err and "sent" in err and "unknown" in err, err


async def test_respond_still_works_once_the_collector_remembers_many_sessions(tmp_path: Path) -> None:
    """The roster respond reads its ack window from names every session the collector remembers (up
    to 100,000): past ~25,000 it is larger than a WebSocket client's default 4 MiB frame limit."""
    async with running(config(tmp_path)) as service:
        relay = service.exporters["relay_server"]
        hook = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"
        earlier = [{"aep": "0.1", "id": f"old-{i}", "type": "session.started", "time": "2026-12-07T08:00:00.000Z",
                    "source": "aep://h/agent/claude-code", "agent": "claude-code",
                    "session": f"0197f3a2-7c1e-7b4d-9a51-{i:012d}", "seq": 0} for i in range(30_000)]
        assert await relay.export(earlier) == 0
        async with aiohttp.ClientSession() as http:
            watching = await http.get(f"{relay.url}/stream", headers={"Authorization": f"Bearer {TOKEN}"})
            await http.post(hook, json={"session_id": SID, "hook_event_name": "SessionStart", "source": "startup"})
            held = asyncio.create_task(http.post(hook, json={
                "session_id": SID, "hook_event_name": "PermissionRequest", "tool_name": "Bash",
                "tool_input": {"command": "make"}, "tool_use_id": "toolu_many"}))
            await wait_until(lambda: service.host.control.holds, "the permission to be held", 30)
            (rid,) = {h.ids[0] for h in service.host.control.holds.values()}
            code, out, err = await cli(relay.url, tmp_path, "respond", rid, "--allow")
            assert code == 0 and out.startswith("accepted"), err
            reply = await (await asyncio.wait_for(held, 30)).json()
            assert reply["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
            watching.close()
