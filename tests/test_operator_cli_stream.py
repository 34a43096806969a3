"""``tail`` as a long-running operator process against the collector's relay role, in real processes:
what it says when the collector no longer holds what it resumes from.
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

from tests.helpers import running
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

