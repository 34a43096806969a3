"""Live control: a real Claude Code asks permission, an operator answers through the collector.

The operator is the official SDK (``aep_sdk.aio.ControlClient``) connected to the collector's own
relay role (``relay_server``) with its token: the control path a deployment uses. The
fake model asks for a shell command Claude Code does not allow by itself (``touch``), so its
PermissionRequest hook fires and the collector holds it for the operator.

- allow: the tool runs (the file exists, ``tool.completed``), the request is answered and resolved;
- deny with guidance: the model's next request carries the operator's text as the tool result;
- no operator (no relay): the hook gets the neutral reply at once, ``respond_via: ["oob"]``, and
  the request is closed before ``session.ended``. Claude Code ``-p`` then refuses the call without
  firing any hook, so that ``tool.requested`` stays open: no hook tells the collector;
- AskUserQuestion answered with values: Claude Code 2.1.328 offers the tool only with a permission
  prompt host (``--permission-prompt-tool stdio``, stream-json I/O); the model receives the labels.

- Qwen Code PermissionRequest answered allow, and deny with guidance: ``qwen -p`` offers no shell
  tool unless ``--yolo`` (which never asks), so the test drives Qwen's SDK mode (stream-json I/O,
  ``initialize`` first, ``--approval-mode default``), where the hook fires and decides before the
  SDK host is asked. Left unanswered, the card times out and Qwen then asks its host
  (``can_use_tool``), where the user allows: Qwen 0.24.4 runs the hook first and its own prompt
  only after, never both at once.

- Codex PermissionRequest (through the command shim): plain ``codex exec`` forces approval
  "never", but ``exec --approve-for-me`` runs with approval "on-request" and routes approvals to
  Codex's automatic reviewer, and the PermissionRequest hook runs before that reviewer. A shell call
  with ``sandbox_permissions: "require_escalated"`` asks: allow runs it outside the sandbox, deny
  with guidance reaches the model as ``Rejected("<text>")``, and when the hold window passes the
  card times out and the reviewer (a side call the fake answers from its schema) lets it run.
  Codex 0.169 waits for every PermissionRequest hook before it runs the tool, so a held card is
  always settled (answered, timed out or hung up) before the PostToolUse that pairs with it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aep_collector.pipeline.control import RESPOND
from aep_sdk.aio import ControlClient

from tests.live.fakemodel import shell, text, tool
from tests.live.harness import SPECS, Live, types
from tests.relay_double import wait_until

TOKEN = "live-control-token"


@contextlib.asynccontextmanager
async def operated(live: Live) -> AsyncIterator[ControlClient]:
    """The operator console: the official SDK on the collector's own relay role, authenticated."""
    assert live.collector is not None
    client = ControlClient(f"http://127.0.0.1:{live.collector.ports['relay_server']}", agent="aep-console",
                           host="ops-host", token=TOKEN)
    await client.connect()
    try:
        await wait_until(lambda: live.healthz().get("relay"), "the relay role to count the operator", timeout=20)
        yield client
    finally:
        await client.close()


RELAY_ROLE = {"relay_server": {"endpoint": "127.0.0.1:0", "token": TOKEN}}


@contextlib.asynccontextmanager
async def controlled(tmp_path: Path, turns: list[Any],
                     vendor: str = "claude_code") -> AsyncIterator[tuple[Live, ControlClient]]:
    """A live session whose collector runs the relay role, with the operator attached."""
    with Live(SPECS[vendor], tmp_path, turns, exporters=RELAY_ROLE) as live:
        async with operated(live) as operator:
            yield live, operator


async def requested(live: Live) -> dict[str, Any]:
    """The first attention request, once written (durably, before the hook is held)."""
    def found() -> dict[str, Any] | None:
        return next((e for e in live.events() if e.get("type") == "attention.requested"), None)
    return await wait_until(found, "the attention request", timeout=60)


def closed_once(events: list[dict[str, Any]], rid: str) -> list[dict[str, Any]]:
    legs = [e for e in events if e.get("subject") == rid and e["type"] in ("attention.resolved", "attention.timeout")]
    assert len(legs) == 1, types(events)
    return legs


async def test_claude_code_permission_allow(tmp_path: Path) -> None:
    async with controlled(tmp_path, [shell("touch allowed.txt"), text("done")]) as (live, operator):
        run = asyncio.create_task(live.arun("make the file"))
        req = await requested(live)
        assert req["data"]["kind"] == "permission" and req["data"]["respond_via"] == ["control"]
        ack = await operator.send(RESPOND, req["session"], subject=req["id"], data={"answer": {"option": "allow"}})
        assert ack["type"] == "control.accepted"
        await run
    assert (live.work / "allowed.txt").exists()  # the tool really ran
    events = live.check()
    answered = [e for e in events if e["type"] == "attention.answered"]
    assert [a["data"]["answer"] for a in answered] == [{"option": "allow"}]
    assert closed_once(events, req["id"])[0]["data"]["resolution"] == "answered"


async def test_claude_code_permission_deny_with_guidance(tmp_path: Path) -> None:
    guidance = "not that file; write notes.md instead"
    async with controlled(tmp_path, [shell("touch denied.txt"), text("ok")]) as (live, operator):
        run = asyncio.create_task(live.arun("make the file"))
        req = await requested(live)
        await operator.send(RESPOND, req["session"], subject=req["id"], data={"answer": {"text": guidance}})
        await run
    assert not (live.work / "denied.txt").exists()
    [result] = live.model.tool_results()
    assert guidance in result, result  # the operator's words reached the model as the tool result
    events = live.check(tools=0, tools_closed=False)
    [answered] = [e for e in events if e["type"] == "attention.answered"]
    assert answered["data"]["answer"]["option"] == "deny"
    closed_once(events, req["id"])


async def test_claude_code_permission_without_operator(tmp_path: Path) -> None:
    with Live(SPECS["claude_code"], tmp_path, [shell("touch nobody.txt"), text("ok")]) as live:
        assert live.healthz()["relay"] is False
        await live.arun("make the file")
    assert not (live.work / "nobody.txt").exists()  # -p with nobody to ask: Claude Code refuses
    events = live.check(tools=0, tools_closed=False)
    [req] = [e for e in events if e["type"] == "attention.requested"]
    assert req["data"]["respond_via"] == ["oob"]
    [leg] = closed_once(events, req["id"])
    assert leg["data"]["resolution"] == "dismissed"
    assert types(events).index(leg["type"]) < types(events).index("session.ended")


async def test_claude_code_ask_user_question_answered(tmp_path: Path) -> None:
    question = {"question": "Which colour should the button be?", "header": "Colour", "multiSelect": False,
                "options": [{"label": "Red", "description": "warm"}, {"label": "Teal", "description": "cool"}]}
    async with controlled(tmp_path, [tool("AskUserQuestion", questions=[question]), text("done")]) as (live, operator):
        driver = asyncio.create_task(live.stream_json("ask me", "-p", "--verbose", "--permission-prompt-tool", "stdio"))
        req = await requested(live)
        assert req["data"]["kind"] == "form"
        ack = await operator.send(RESPOND, req["session"], subject=req["id"],
                                  data={"answer": {"values": {"1": "2"}}})
        assert ack["type"] == "control.accepted"
        prompts = await driver
    # Claude Code asks its host and runs the hook side by side; the hook's answer won and the
    # host's prompt was cancelled (the host in this test never answers).
    assert [(p["type"], p["request_id"]) for p in prompts] == [
        ("control_request", prompts[0]["request_id"]), ("control_cancel_request", prompts[0]["request_id"])]
    [result] = live.model.tool_results()
    assert "Teal" in result and "Red" not in result, result
    events = live.check(tools=1)
    closed_once(events, req["id"])


async def test_qwen_code_permission_request_allow(tmp_path: Path) -> None:
    # Qwen Code 0.24.4 offers its shell without --yolo only in SDK mode (stream-json I/O after an
    # initialize request); there the PermissionRequest hook fires beside the host's can_use_tool.
    async with controlled(tmp_path, [shell("touch qwen-allowed.txt"), text("done")], "qwen_code") as (live, op):
        driver = asyncio.create_task(live.stream_json("make the file", "--approval-mode", "default",
                                                      initialize=True))
        req = await requested(live)
        assert req["data"]["kind"] == "permission" and req["data"]["respond_via"] == ["control"]
        ack = await op.send(RESPOND, req["session"], subject=req["id"], data={"answer": {"option": "allow"}})
        assert ack["type"] == "control.accepted"
        prompts = await driver
    assert prompts == []  # the hook decided first: Qwen Code never asked its SDK host
    assert (live.work / "qwen-allowed.txt").exists()
    events = live.check(ended=False)  # no SessionEnd from a Qwen run that is not interactive
    assert closed_once(events, req["id"])[0]["data"]["resolution"] == "answered"


async def test_qwen_code_permission_request_deny_with_guidance(tmp_path: Path) -> None:
    guidance = "not that file; write notes.md instead"
    async with controlled(tmp_path, [shell("touch qwen-denied.txt"), text("ok")], "qwen_code") as (live, op):
        driver = asyncio.create_task(live.stream_json("make the file", "--approval-mode", "default",
                                                      initialize=True))
        req = await requested(live)
        await op.send(RESPOND, req["session"], subject=req["id"], data={"answer": {"text": guidance}})
        prompts = await driver
    assert prompts == []  # the hook's deny decided: the SDK host was never asked
    assert not (live.work / "qwen-denied.txt").exists()
    assert any(guidance in r for r in live.model.tool_results()), live.describe()
    events = live.check(ended=False, tools=0)
    [answered] = [e for e in events if e["type"] == "attention.answered"]
    assert answered["data"]["answer"]["option"] == "deny"
    closed_once(events, req["id"])


async def test_qwen_code_permission_request_left_to_the_user(tmp_path: Path) -> None:
    # Nobody answers the card: after the hold window the hook frees Qwen with no decision, Qwen
    # asks its own prompt (the SDK host's can_use_tool) and the user there allows the call.
    def user(request: dict[str, Any]) -> dict[str, Any] | None:
        return {"behavior": "allow", "updatedInput": request.get("input")} \
            if request.get("subtype") == "can_use_tool" else None

    with Live(SPECS["qwen_code"], tmp_path, [shell("touch qwen-user.txt"), text("done")],
              receiver={"attention_timeout": 2}, exporters=RELAY_ROLE) as live:
        async with operated(live):
            prompts = await live.stream_json("make the file", "--approval-mode", "default", initialize=True,
                                             host=user)
    assert [p["request"]["subtype"] for p in prompts if p["type"] == "control_request"] == ["can_use_tool"]
    assert (live.work / "qwen-user.txt").exists()
    events = live.check(ended=False)
    [req] = [e for e in events if e["type"] == "attention.requested"]
    assert req["data"]["respond_via"] == ["control"]
    assert closed_once(events, req["id"])[0]["type"] == "attention.timeout"
    seen = types(events)
    assert seen.index("attention.timeout") < seen.index("tool.completed"), seen

# -- Codex: PermissionRequest through the command shim ----------------------------------------------


def escalated(command: str) -> Any:
    """Codex's shell call asking to leave the sandbox: the one call ``exec --approve-for-me`` reviews."""
    return tool("exec_command", cmd=command, sandbox_permissions="require_escalated", justification="write the file")


async def test_codex_permission_allow(tmp_path: Path) -> None:
    async with controlled(tmp_path, [escalated("touch codex-allowed.txt"), text("done")], "codex") as (live, op):
        run = asyncio.create_task(live.arun("make the file", "--approve-for-me"))
        req = await requested(live)
        assert req["data"]["kind"] == "permission" and req["data"]["respond_via"] == ["control"]
        ack = await op.send(RESPOND, req["session"], subject=req["id"], data={"answer": {"option": "allow"}})
        assert ack["type"] == "control.accepted"
        await run
    assert (live.work / "codex-allowed.txt").exists()  # escalated out of the sandbox: the hook's allow did it
    events = live.check()
    assert closed_once(events, req["id"])[0]["data"]["resolution"] == "answered"


async def test_codex_permission_deny_with_guidance(tmp_path: Path) -> None:
    guidance = "not that file; write notes.md instead"
    async with controlled(tmp_path, [escalated("touch codex-denied.txt"), text("ok")], "codex") as (live, op):
        run = asyncio.create_task(live.arun("make the file", "--approve-for-me"))
        req = await requested(live)
        await op.send(RESPOND, req["session"], subject=req["id"], data={"answer": {"text": guidance}})
        await run
    assert not (live.work / "codex-denied.txt").exists()
    [result] = live.model.tool_results()
    assert guidance in result, result  # Codex: exec_command failed ... Rejected("<guidance>")
    # Codex fires no hook for the call it rejected: its tool.requested stays open (as Claude Code's).
    events = live.check(tools=0, tools_closed=False)
    [answered] = [e for e in events if e["type"] == "attention.answered"]
    assert answered["data"]["answer"]["option"] == "deny"
    closed_once(events, req["id"])


async def test_codex_permission_hold_window_passes(tmp_path: Path) -> None:
    # Nobody answers: after the hold window the hook frees Codex with no decision, Codex's own
    # reviewer decides (the fake answers its schema with "allow") and the tool runs.
    with Live(SPECS["codex"], tmp_path, [escalated("touch codex-late.txt"), text("done")],
              receiver={"attention_timeout": 2}, exporters=RELAY_ROLE) as live:
        async with operated(live):
            await live.arun("make the file", "--approve-for-me")
    assert (live.work / "codex-late.txt").exists()
    events = live.check()
    [req] = [e for e in events if e["type"] == "attention.requested"]
    assert req["data"]["respond_via"] == ["control"]
    assert closed_once(events, req["id"])[0]["type"] == "attention.timeout"
    seen = types(events)
    assert seen.index("attention.timeout") < seen.index("tool.completed"), seen
