"""``respond``/``cancel`` against a target that is slow to ack: the CLI waits the ack window the
target declares in the roster (AEP-0004 §3), sends the same command again on silence (same id,
so the target still decides once), and says what it waited for before exiting 5.

The relay is the project's relay double on loopback; the target is a plain WebSocket emitter that
declares its window and acks only when the test says so.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.relay_double import RelayDouble, wait_until

EXE = Path(sys.executable).with_name("aep-collector")
TOKEN = "aep-window-5b1c0e7d9a2f"
SID = "window-s1"
SRC = f"aep://h/agent/claude-code/session/{SID}"


def event(seq: int, type_: str, **extra: Any) -> dict[str, Any]:
    return {"aep": "0.1", "id": f"01WINDOW{seq:018d}", "type": type_, "time": "2026-12-07T08:00:00.000Z",
            "source": SRC, "agent": "claude-code", "session": SID, "seq": seq, **extra}


class Target:
    """An emitter holding ``SID`` that records each command it is sent and acks on request."""

    def __init__(self, relay: RelayDouble, window_ms: int | None) -> None:
        self.relay, self.window_ms = relay, window_ms
        self.commands: list[dict[str, Any]] = []
        self.ack_on: int | None = None  # ack the command on this delivery (1-based), else never

    async def __aenter__(self) -> Target:
        control: dict[str, Any] = {"accepts": ["control.attention.respond", "control.cancel"]}
        if self.window_ms is not None:
            control["ack_window_ms"] = self.window_ms
        self.ws = await websockets.connect(self.relay.ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"})
        await self.ws.send(json.dumps({"type": "hello", "versions": ["0.1"], "role": "emitter",
                                       "identity": {"agent": "claude-code", "instance": "t1"},
                                       "capabilities": {"control": control}}))
        assert json.loads(await self.ws.recv())["type"] == "hello"
        await self.ws.send(json.dumps(event(0, "session.started")))
        await self.ws.send(json.dumps(event(1, "attention.requested", data={
            "kind": "permission", "prompt": "Allow Bash?", "respond_via": ["control"]})))
        self.reader = asyncio.create_task(self._read())
        await wait_until(lambda: len(self.relay.store_for(SID)) == 2, "the request in the relay's buffer")
        return self

    async def _read(self) -> None:
        async for text in self.ws:
            frame = json.loads(text)
            if str(frame.get("type", "")).startswith("control."):
                self.commands.append(frame)
                if self.ack_on == len(self.commands):
                    await self.ws.send(json.dumps(event(2, "control.accepted", cause=frame["id"])))

    async def __aexit__(self, *exc: object) -> None:
        self.reader.cancel()
        await self.ws.close()


@pytest.fixture
async def relay() -> Any:
    double = RelayDouble(token=TOKEN)
    await double.start()
    yield double
    await double.stop()


async def respond(relay: RelayDouble, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"}
    request = event(1, "attention.requested")["id"]
    args = [str(EXE), "respond", request, "--allow", "--url", relay.url, "--token", TOKEN, *extra]
    return await asyncio.to_thread(subprocess.run, args, env=env, capture_output=True, text=True, timeout=120)


async def test_silence_past_the_declared_window_resends_the_same_command_then_exits_5(
        relay: RelayDouble, tmp_path: Path) -> None:
    async with Target(relay, window_ms=300) as target:
        done = await respond(relay, tmp_path)
    assert done.returncode == 5, done.stderr
    assert "after 3 send(s), waiting 0.3 s after each" in done.stderr and "Traceback" not in done.stderr
    assert len(target.commands) == 3 and len({c["id"] for c in target.commands}) == 1  # one command, resent


async def test_flags_override_the_window_and_the_retries(relay: RelayDouble, tmp_path: Path) -> None:
    async with Target(relay, window_ms=600_000) as target:  # ten minutes declared: --timeout wins
        done = await respond(relay, tmp_path, "--timeout", "0.2", "--retries", "0")
    assert done.returncode == 5 and "after 1 send(s), waiting 0.2 s after each" in done.stderr, done.stderr
    assert len(target.commands) == 1
    bad = await respond(relay, tmp_path, "--timeout", "0")
    assert bad.returncode == 2 and "between 0 and 3600" in bad.stderr


async def test_an_ack_to_a_resent_command_is_taken(relay: RelayDouble, tmp_path: Path) -> None:
    async with Target(relay, window_ms=300) as target:
        target.ack_on = 2  # the first delivery is lost to silence; the resend is acked
        done = await respond(relay, tmp_path)
    assert done.returncode == 0 and "accepted (control.attention.respond" in done.stdout, done.stderr
    assert len(target.commands) == 2


async def test_a_target_that_declares_no_window_gets_the_default(relay: RelayDouble, tmp_path: Path) -> None:
    async with Target(relay, window_ms=None) as target:
        target.ack_on = 1
        done = await respond(relay, tmp_path, "--retries", "0")
    assert done.returncode == 0, done.stderr
    from aep_collector.pipeline.operator_cli import ACK_WINDOW, declared_window

    assert ACK_WINDOW == 10.0  # AEP-0004's default ack_window_ms
    assert declared_window([{"session": SID, "control": {"accepts": []}}], SID) is None
    assert declared_window([{"session": SID, "control": {"ack_window_ms": True}}], SID) is None
    assert declared_window([{"session": "other", "control": {"ack_window_ms": 5}}], SID) is None
    assert declared_window([{"session": SID, "control": {"ack_window_ms": 10**12}}], SID) == 3600
