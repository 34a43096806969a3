"""``tail`` as a long-running operator process against the collector's relay role, in real processes:
what it says when the collector no longer holds what it resumes from, when the collector stops, and
where it resumes after being ended by a signal other than Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.helpers import running, serve
from tests.relay_double import wait_until
from tests.test_relay_server import TOKEN, config
from tests.test_relay_server_hardening import ev, ndjson, post

EXE = Path(sys.executable).with_name("aep-collector")


def env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1",
            "AEP_STATE_DIR": str(tmp_path / "operator")}


async def tail(url: str, tmp_path: Path, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        str(EXE), "tail", "--json", "--url", url, "--token", TOKEN, *extra, env=env(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def lines(proc: asyncio.subprocess.Process, n: int) -> list[dict[str, Any]]:
    assert proc.stdout is not None
    return [json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)) for _ in range(n)]


def cursor(tmp_path: Path) -> list[dict[str, Any]]:
    return json.loads((tmp_path / "operator" / "tail.cursor.json").read_text())


async def test_a_resume_past_what_the_collector_still_holds_is_told_not_skipped_silently(tmp_path: Path) -> None:
    async with running(config(tmp_path, buffer=5)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            assert (await post(http, url, ndjson([ev("evict", i) for i in range(3)])))[0] == 202
            first = await tail(url, tmp_path, "--all")
            assert [e["seq"] for e in await lines(first, 3)] == [0, 1, 2]
            first.send_signal(signal.SIGINT)
            await first.wait()
            assert cursor(tmp_path) == [{"session": "evict", "epoch": 0, "seq": 2}]
            # Seq 3-14 come and go while nobody tails: the buffer of 5 keeps 15-19.
            assert (await post(http, url, ndjson([ev("evict", i) for i in range(3, 20)])))[0] == 202
            again = await tail(url, tmp_path)
            assert [e["seq"] for e in await lines(again, 5)] == [15, 16, 17, 18, 19]
            again.send_signal(signal.SIGINT)
            _, err = await again.communicate()
    warning = err.decode()
    assert "evict" in warning and "0:15" in warning, warning
    assert "Traceback" not in warning


async def test_a_collector_that_stops_under_a_tail_ends_it_with_an_error(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        proc = await tail(url, tmp_path, "--no-resume")
        async with aiohttp.ClientSession() as http:
            await wait_until(lambda: service.exporters["relay_server"].surface.streams, "the tail to attach", 30)
            assert (await post(http, url, ndjson([ev("stop", 0)])))[0] == 202
            assert [e["id"] for e in await lines(proc, 1)] == ["stop-0"]
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 4, err
    message = err.decode()
    assert message.startswith("error: ") and "stopping" in message and "Traceback" not in message



async def test_a_stream_the_relay_ends_without_saying_why_is_not_taken_for_success(tmp_path: Path) -> None:
    """A relay that ends a live stream (it dropped a consumer that fell behind) or a replay before its
    ``: replay-complete`` (it went away mid-replay): what was printed is not all there is."""
    one = ev("cut", 0)

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for junk in ("[1, 2]", "null", "not json"):  # no event: skipped, not a crash
            await resp.write(f"event: x\ndata: {junk}\n\n".encode())
        await resp.write(f"event: {one['type']}\ndata: {json.dumps(one)}\nid: cut:0:0\n\n".encode())
        await resp.write_eof()  # a clean end, no marker
        return resp

    app = web.Application()
    app.router.add_get("/stream", stream)
    runner, port = await serve(app)
    try:
        url = f"http://127.0.0.1:{port}"
        proc = await tail(url, tmp_path, "--no-resume")
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert [json.loads(x)["id"] for x in out.decode().splitlines()] == ["cut-0"]
        assert proc.returncode == 4 and err.decode().startswith("error: ") and "ended the stream" in err.decode()
        timeline = await asyncio.create_subprocess_exec(
            str(EXE), "timeline", "cut", "--url", url, "--token", TOKEN, env=env(tmp_path),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = await asyncio.wait_for(timeline.communicate(), 30)
        assert timeline.returncode == 4 and "before it was complete" in err.decode(), err
    finally:
        await runner.cleanup()


async def test_a_tail_ended_by_sigterm_or_sighup_keeps_its_cursor(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            for k, sig in enumerate((signal.SIGTERM, signal.SIGHUP)):
                assert (await post(http, url, ndjson([ev("term", k)])))[0] == 202
                proc = await tail(url, tmp_path, "--all" if k == 0 else "--session=term")
                assert [e["seq"] for e in await lines(proc, 1)] == [k]
                proc.send_signal(sig)
                await asyncio.wait_for(proc.wait(), 30)
                assert proc.returncode == 128 + sig
                assert cursor(tmp_path) == [{"session": "term", "epoch": 0, "seq": k}]
