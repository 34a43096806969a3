"""Where the operator commands find the collector and its token: the token file that
``<state_dir>/relay.json`` names is that collector's, and only sent to it. And what a relay that
fails at that URL is: unreachable, not the operator's bad input.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from aiohttp import web

from tests.helpers import serve

EXE = Path(sys.executable).with_name("aep-collector")
LOCAL_TOKEN = "local-collector-token-3f9a1c"


async def test_the_local_token_file_is_never_sent_to_another_url(tmp_path: Path) -> None:
    seen: list[str] = []

    async def stream(request: web.Request) -> web.StreamResponse:  # another relay, not ours
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(status=401)

    app = web.Application()
    app.router.add_get("/stream", stream)
    runner, port = await serve(app)
    state = tmp_path / "state"
    state.mkdir()
    (state / "relay.token").write_text(LOCAL_TOKEN + "\n")
    (state / "relay.json").write_text(json.dumps({"endpoint": "http://127.0.0.1:9", "pid": 1,
                                                  "token_file": str(state / "relay.token")}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AEP_STATE_DIR": str(state)}
    try:
        proc = await asyncio.create_subprocess_exec(
            str(EXE), "timeline", "s1", "--url", f"http://127.0.0.1:{port}", env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await runner.cleanup()
    assert all(LOCAL_TOKEN not in header for header in seen), seen
    assert proc.returncode == 4 and err.decode().startswith("error: ") and "--token" in err.decode(), err


async def test_a_relay_that_fails_is_unreachable_not_bad_input(tmp_path: Path) -> None:
    """Exit 2 is the operator's bad input (a filter the relay refuses with 400); a relay answering 5xx
    or not serving /stream at all is a collector that cannot be reached there (exit 4)."""

    async def stream(request: web.Request) -> web.Response:
        status = 400 if "bad" in request.query.get("filter", "") else 503
        return web.Response(status=status, text="bad filter" if status == 400 else "upstream gone")

    app = web.Application()
    app.router.add_get("/stream", stream)
    runner, port = await serve(app)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AEP_STATE_DIR": str(tmp_path / "none")}
    try:
        codes = {}
        for name, args in {"5xx": ["timeline", "s1"], "400": ["timeline", "bad"]}.items():
            proc = await asyncio.create_subprocess_exec(
                str(EXE), *args, "--url", f"http://127.0.0.1:{port}", "--token", "t" * 8, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
            codes[name] = proc.returncode
            assert err.decode().startswith("error: ") and "Traceback" not in err.decode()
    finally:
        await runner.cleanup()
    assert codes == {"5xx": 4, "400": 2}
