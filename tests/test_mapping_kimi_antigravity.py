"""Kimi Code and Antigravity mappings: every hook fixture entry, the stateful runtime, odd shapes.

Kimi's `ws_modes` (the kap-server web channel) are not pinned: no receiver speaks that WebSocket,
so its mapping was removed rather than kept untested in practice."""

from __future__ import annotations

from typing import Any

import pytest
from aep_collector.pipeline.envelope import TYPE_GRAMMAR
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.mapping import antigravity, kimi_code, load_vendor

from tests.conftest import corpus

KIMI = corpus("mappings/kimi-code.json")
AG = corpus("mappings/antigravity.json")


def project(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The fixture comparison projection of a gated draft."""
    return {k: d[k] for k in keys if k in d}


def expected_of(e: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in e.items() if k != "$comment"}


# --- Kimi Code: fixture `hooks` + `fallback` ----------------------------------------------------------

KIMI_CASES = {**KIMI["hooks"], "fallback": KIMI["fallback"]}


@pytest.mark.parametrize("entry", KIMI_CASES.values(), ids=list(KIMI_CASES))
def test_kimi_hook_fixture(entry: dict[str, Any]) -> None:
    payload = entry["input"]
    d = kimi_code.map_hook(payload["hook_event_name"], payload)
    if entry["expected"] is None:
        assert d is None
        return
    got = project(cap_draft(d, CapturePolicy()), ("type", "data", "subject"))
    assert got == expected_of(entry["expected"])
    assert TYPE_GRAMMAR.match(d["type"])
    assert d["session"] == payload.get("session_id")


ODD_PAYLOADS: list[Any] = [None, "text", 7, [], {}, {"session_id": 5, "tool_name": ["x"], "tool_input": "s",
                                                      "prompt": {"a": 1}, "error": 3, "decision": 1,
                                                      "is_steer": "yes", "token_count": True,
                                                      "agent_name": {}, "notification_type": None}]
KIMI_NAMES = [*KIMI["hooks"].keys(), "PermissionResult", "", "Weird Name!"]


@pytest.mark.parametrize("payload", ODD_PAYLOADS, ids=range(len(ODD_PAYLOADS)))
def test_kimi_odd_shapes_never_crash(payload: Any) -> None:
    state = kimi_code.new_state()
    for name in KIMI_NAMES:
        hook = name.split("_")[0]
        for d in kimi_code.map_signal(Signal("kimi-code", hook, payload), state):
            assert TYPE_GRAMMAR.match(d["type"]), d["type"]
            cap_draft(d, CapturePolicy())


def test_kimi_module_contract() -> None:
    mod = load_vendor("kimi-code")
    assert mod is kimi_code and mod.AGENT == "kimi-code"


# --- Antigravity: fixture `hooks` + `fallback` --------------------------------------------------------

AG_CASES = {**AG["hooks"], "fallback": AG["fallback"]}


@pytest.mark.parametrize("entry", AG_CASES.values(), ids=list(AG_CASES))
def test_antigravity_hook_fixture(entry: dict[str, Any]) -> None:
    drafts = antigravity.map_hook(entry["hook"], entry["input"], join=entry.get("join"))
    got = [project(cap_draft(d, CapturePolicy()), ("type", "data", "subject", "step")) for d in drafts]
    assert got == [expected_of(e) for e in entry["expected"]]
    assert all(TYPE_GRAMMAR.match(d["type"]) for d in drafts)


# --- Antigravity: runtime state through map_signal ----------------------------------------------------

CONV = AG["hooks"]["pre_tool_use"]["input"]["conversationId"]


def ag(hook: str, state: antigravity.AntigravityState, conv: str | None = CONV,
       **payload: Any) -> list[dict[str, Any]]:
    body = dict(payload)
    if conv is not None:
        body["conversationId"] = conv
    return antigravity.map_signal(Signal("antigravity", hook, body), state)


def types(drafts: list[dict[str, Any]]) -> list[str]:
    return [d["type"] for d in drafts]


def test_antigravity_first_sight_session_started_once() -> None:
    state = antigravity.new_state()
    first = antigravity.map_signal(Signal("antigravity", "PreInvocation", AG["hooks"]["pre_invocation"]["input"]),
                                   state)
    assert types(first) == ["session.started", "run.started", "run.step.started"]
    started = first[0]
    assert started["data"] == {"client": {"name": "antigravity-cli"}, "cwd": "/workspace/project"}
    assert cap_draft(started, CapturePolicy())["data"] == {"client": {"name": "antigravity-cli"}}
    assert all(d["session"] == CONV for d in first)
    again = ag("PostInvocation", state, invocationNum=3)
    assert types(again) == ["run.step.finished"]
    other = ag("PostInvocation", state, conv="other-conv", invocationNum=0)
    assert types(other) == ["session.started", "run.step.finished"]


def test_antigravity_never_ends_a_session() -> None:
    state = antigravity.new_state()
    seen = []
    for hook in ("PreInvocation", "PreToolUse", "PostToolUse", "PostInvocation", "Stop"):
        seen += types(ag(hook, state, invocationNum=0, stepIdx=1, toolCall={"name": "t"},
                         terminationReason="model_stop"))
    assert "session.ended" not in seen
    assert seen == ["session.started", "run.started", "run.step.started", "tool.requested", "tool.completed",
                    "run.step.finished", "run.finished"]


def test_antigravity_pre_then_post_joins() -> None:
    state = antigravity.new_state()
    ag("PreInvocation", state, invocationNum=2)
    (req,) = ag("PreToolUse", state, stepIdx=19, toolCall={"name": "run_command", "args": {"CommandLine": "ls"}})
    assert req["type"] == "tool.requested" and req["step"] == "2"
    assert state.joins == {(CONV, 19): "run_command"}
    (done,) = ag("PostToolUse", state, stepIdx=19, error="")
    assert (done["type"], done["subject"], done["step"]) == ("tool.completed", "run_command", "2")
    assert done["data"] == {"tool": {"name": "run_command"}, "step_idx": 19}
    assert state.joins == {}  # cleared on join
    (again,) = ag("PostToolUse", state, stepIdx=19, error="")
    assert again["type"] == "x.antigravity.step.completed"  # a join is used once


def test_antigravity_joined_failure() -> None:
    state = antigravity.new_state()
    ag("PreToolUse", state, stepIdx=5, toolCall={"name": "run_command"})
    (failed,) = ag("PostToolUse", state, stepIdx=5, error="exit status 1")
    assert failed["type"] == "tool.failed"
    assert failed["data"]["error"] == {"type": "tool_error", "message": "exit status 1"}
    assert cap_draft(failed, CapturePolicy())["data"]["error"] == {"type": "tool_error"}


def test_antigravity_unjoined_never_invents_a_tool() -> None:
    state = antigravity.new_state()
    ag("PreToolUse", state, stepIdx=4, toolCall={"name": "view_file"})
    ag("PreToolUse", state, conv="another", stepIdx=5, toolCall={"name": "view_file"})
    drafts = ag("PostToolUse", state, stepIdx=5, error="exit status 127")
    (d,) = drafts
    assert d["type"] == "x.antigravity.step.completed" and "subject" not in d and "tool" not in d["data"]
    assert cap_draft(d, CapturePolicy())["data"] == {"failed": True, "step_idx": 5}
    assert cap_draft(d, CapturePolicy(ceiling="redacted"))["data"]["error"] == "exit status 127"


def test_antigravity_dangling_pre_tool_use_synthesizes_nothing_and_stop_clears() -> None:
    state = antigravity.new_state()
    ag("PreInvocation", state, invocationNum=0)
    ag("PreToolUse", state, stepIdx=7, toolCall={"name": "run_command"})
    ag("PreToolUse", state, conv="keep", stepIdx=7, toolCall={"name": "view_file"})
    stop = ag("Stop", state, executionNum=1, terminationReason="model_stop", error="", fullyIdle=True)
    assert types(stop) == ["run.finished"]  # no tool terminal for the dangling request
    assert "step" not in stop[0]
    assert state.joins == {("keep", 7): "view_file"}
    (late,) = ag("PostToolUse", state, stepIdx=7, error="")
    assert late["type"] == "x.antigravity.step.completed" and "step" not in late


def test_antigravity_run_synthesis() -> None:
    state = antigravity.new_state()
    first = ag("PreInvocation", state, invocationNum=0, initialNumSteps=0)
    assert types(first) == ["session.started", "run.started", "run.step.started"]
    assert first[1]["_drain"] == "cancelled" and first[2]["step"] == "0"
    assert types(ag("PreInvocation", state, invocationNum=1)) == ["run.step.started"]
    stop = ag("Stop", state, executionNum=1, terminationReason="error", error="backend down", fullyIdle=True)
    assert types(stop) == ["run.failed"]
    assert cap_draft(stop[0], CapturePolicy())["data"] == {
        "reason": "error", "error": {"type": "error"}, "execution_num": 1, "fully_idle": True}
    # A mid-execution attach (invocationNum > 0 with no open run) still opens one.
    assert types(ag("PreInvocation", state, invocationNum=4)) == ["run.started", "run.step.started"]
    # invocationNum 0 with a run open: a new execution whose Stop was missed.
    assert types(ag("PreInvocation", state, invocationNum=0)) == ["run.started", "run.step.started"]


def test_antigravity_hook_name_any_case_and_fallback() -> None:
    state = antigravity.new_state()
    assert types(ag("pretooluse", state, stepIdx=1, toolCall={"name": "x"})) == ["session.started",
                                                                                  "tool.requested"]
    (d,) = ag("Some-Future Hook", state)
    assert d["type"] == "x.antigravity.hook.some_future_hook" and d["data"] == {}


def test_antigravity_join_table_bounded() -> None:
    state = antigravity.AntigravityState(max_joins=3)
    for i in range(10):
        ag("PreToolUse", state, stepIdx=i, toolCall={"name": f"t{i}"})
    assert list(state.joins) == [(CONV, 7), (CONV, 8), (CONV, 9)]
    (d,) = ag("PostToolUse", state, stepIdx=0, error="")
    assert d["type"] == "x.antigravity.step.completed"  # evicted: honest absence, no invented name


def test_antigravity_conversations_bounded() -> None:
    state = antigravity.AntigravityState(max_conversations=2)
    for conv in ("a", "b", "c"):
        ag("PostInvocation", state, conv=conv)
    assert list(state.conversations) == ["b", "c"]


def test_antigravity_missing_conversation_is_none() -> None:
    state = antigravity.new_state()
    drafts = ag("PreToolUse", state, conv=None, stepIdx=2, toolCall={"name": "x"})
    assert types(drafts) == ["tool.requested"]  # no session to start
    assert drafts[0]["session"] is None


AG_ODD: list[Any] = [None, "text", 3, [], {}, {"conversationId": 9, "stepIdx": "1", "toolCall": "run",
                                             "error": {"x": 1}, "invocationNum": True, "initialNumSteps": -1,
                                             "terminationReason": 5, "fullyIdle": "no", "executionNum": 1.5,
                                             "workspacePaths": "/p", "transcriptPath": 1},
                     {"conversationId": "c", "stepIdx": 1, "toolCall": {"name": 3, "args": "s"}, "error": 0}]


@pytest.mark.parametrize("payload", AG_ODD, ids=range(len(AG_ODD)))
def test_antigravity_odd_shapes_never_crash(payload: Any) -> None:
    state = antigravity.new_state()
    for hook in (*antigravity.HOOKS, "", "Odd", None):
        for d in antigravity.map_signal(Signal("antigravity", hook, payload), state):  # type: ignore[arg-type]
            assert TYPE_GRAMMAR.match(d["type"]), d["type"]
            assert "step" not in d or isinstance(d["step"], str)
            cap_draft(d, CapturePolicy())
        antigravity.map_hook(hook, payload, join={"name": 5})  # type: ignore[arg-type]
        antigravity.map_hook(hook, payload, join="run")  # type: ignore[arg-type]


def test_antigravity_module_contract() -> None:
    mod = load_vendor("antigravity")
    assert mod is antigravity and mod.AGENT == "antigravity"
