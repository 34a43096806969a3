"""Live: a real Claude Code session watched and answered through the collector's own relay role,
with the operator commands as a user runs them (no relay anywhere else, no SDK).

The fake model asks for ``touch``, which Claude Code does not allow by itself: its
PermissionRequest hook fires, the collector holds it because ``aep-collector tail`` is watching,
``aep-collector pending`` lists it and ``aep-collector respond --allow`` lets the tool run.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT
from tests.live.fakemodel import shell, text
from tests.live.harness import SPECS, Live
from tests.test_operator_cli import Lines, wait_for_subscriber


def operator(live: Live, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=operator_env(live))


def operator_env(live: Live) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("AEP_")},
            "AEP_STATE_DIR": str(live.root / "state"), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}


async def test_claude_code_watched_with_tail_and_allowed_with_respond(tmp_path: Path) -> None:
    with Live(SPECS["claude_code"], tmp_path, [shell("touch via-role.txt"), text("done")],
              exporters={"relay_server": {"endpoint": "127.0.0.1:0"}}) as live:
        tail = subprocess.Popen([sys.executable, "-m", "aep_collector.pipeline.cli", "tail", "--agent", "claude-code"], cwd=ROOT,
                                env=operator_env(live), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines = Lines(tail)
            await asyncio.to_thread(wait_for_subscriber, live.root / "state")
            run = asyncio.create_task(live.arun("make the file"))
            await asyncio.to_thread(lines.wait_for, r"attention\.requested", 120)
            pending = operator(live, "pending", "--json")
            assert pending.returncode == 0, pending.stderr
            (req,) = [json.loads(x) for x in pending.stdout.splitlines()]
            assert req["data"]["kind"] == "permission" and req["data"]["respond_via"] == ["control"]
            answered = operator(live, "respond", req["id"], "--allow")
            assert answered.returncode == 0 and "accepted" in answered.stdout, answered.stdout + answered.stderr
            await run
            await asyncio.to_thread(lines.wait_for, r"tool\.completed", 60)
        finally:
            tail.terminate()
            tail.wait(timeout=15)
    assert (live.work / "via-role.txt").exists()  # the tool really ran
    events = live.check()
    assert [e["data"]["answer"] for e in events if e["type"] == "attention.answered"] == [{"option": "allow"}]
