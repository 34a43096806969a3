"""The runs processor in isolation: drafts in, drafts out."""

from __future__ import annotations

from pipeline.model import Signal
from processors.runs import RunsConfig, RunsProcessor, RunState


def d(type_, **kw):
    return {"type": type_, "agent": "claude-code", "session": "s", "data": {}, **kw}


def test_run_opens_stamps_and_closes():
    p = RunsProcessor()
    out = p([d("run.started"), d("tool.requested"), d("run.finished"), d("tool.completed")])
    run = out[0]["run"]
    assert run.startswith("r_")
    assert out[1]["run"] == run and out[2]["run"] == run
    assert "run" not in out[3]  # after the terminal, no run is open


def test_real_run_ids_are_kept():
    out = RunsProcessor()([d("run.started", run="turn-1"), d("tool.requested")])
    assert out[0]["run"] == "turn-1" and out[1]["run"] == "turn-1"


def test_drain_emits_run_cancelled_for_a_stale_run():
    p = RunsProcessor()
    first = p([d("run.started", _drain="cancelled")])[0]["run"]
    out = p([d("run.started", _drain="cancelled")])
    assert [e["type"] for e in out] == ["run.cancelled", "run.started"]
    assert out[0]["run"] == first and out[1]["run"] != first


def test_no_drain_without_the_hint():
    p = RunsProcessor()
    p([d("run.started")])
    assert [e["type"] for e in p([d("run.started")])] == ["run.started"]


def test_sessions_and_agents_are_separate():
    p = RunsProcessor()
    a = p([d("run.started")])[0]["run"]
    out = p([d("tool.requested", session="other"), {**d("tool.requested"), "agent": "codex"}])
    assert "run" not in out[0] and "run" not in out[1]
    assert p([d("tool.requested")])[0]["run"] == a


def test_opt_out_agent_scoped_and_signals_pass_untouched():
    p = RunsProcessor()
    p([d("run.started")])
    sig = Signal(agent="claude-code", name="Stop", payload={})
    out = p([d("tool.requested", _runs="none"), {"type": "agent.idle", "agent": "claude-code"}, sig])
    assert "run" not in out[0] and "run" not in out[1] and out[2] is sig


def test_session_ended_forgets_the_session():
    state = RunState()
    p = RunsProcessor(state=state)
    p([d("run.started"), d("session.ended")])
    assert state.open == {}


def test_state_is_bounded():
    p = RunsProcessor(RunsConfig(max_sessions=3))
    for i in range(10):
        p([d("run.started", session=f"s{i}")])
    assert len(p.state.open) == 3


def test_a_nested_lane_keeps_the_parent_run_open():
    p = RunsProcessor()
    parent = p([d("run.started")])[0]["run"]
    child = p([d("run.started", _lane="sub-1")])[0]["run"]
    assert child != parent
    assert p([d("tool.requested", _lane="sub-1")])[0]["run"] == child
    assert p([d("run.finished", _lane="sub-1")])[0]["run"] == child
    assert p([d("run.finished")])[0]["run"] == parent


def test_session_ended_closes_every_lane():
    p = RunsProcessor()
    p([d("run.started"), d("run.started", _lane="x")])
    p([d("session.ended")])
    assert p.state.open == {}


def test_a_second_session_end_is_degraded_not_duplicated():
    p = RunsProcessor()
    first = p([d("session.ended")])[0]
    again = p([d("session.ended", data={"reason": "normal"})])[0]
    assert first["type"] == "session.ended"
    assert again["type"] == "x.claude-code.session.ended_again" and again["data"] == {"reason": "normal"}
    assert p([{**d("session.ended"), "session": "other"}])[0]["type"] == "session.ended"
