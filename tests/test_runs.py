"""The runs processor in isolation: drafts in, drafts out."""

from __future__ import annotations

from aep_collector.pipeline.model import Signal
from aep_collector.processors.runs import RunsConfig, RunsProcessor, RunState


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
    # The opt-out hint is this step's: honoured, then taken off, so the draft reaches the stamper
    # in the usual shape; its other keys are untouched.
    assert out[0] == d("tool.requested")


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


def test_a_repeated_run_end_is_degraded_and_the_run_never_reopens():
    p = RunsProcessor()
    out = p([d("run.started", run="t1"), d("run.finished", run="t1"), d("run.finished", run="t1"),
             d("run.failed", run="t1"), d("run.started", run="t1")])
    assert [e["type"] for e in out] == ["run.started", "run.finished", "x.claude-code.run.finished_again",
                                        "x.claude-code.run.failed_again", "x.claude-code.run.started_again"]
    assert all(e["run"] == "t1" for e in out)
    assert p.state.open == {}  # the degraded start opened nothing


def test_a_run_drained_as_cancelled_is_ended_too():
    p = RunsProcessor()
    p([d("run.started", run="t1", _drain="cancelled")])
    assert [e["type"] for e in p([d("run.started", run="t2", _drain="cancelled")])] == ["run.cancelled", "run.started"]
    assert p([d("run.finished", run="t1")])[0]["type"] == "x.claude-code.run.finished_again"
    assert p([d("run.finished", run="t2")])[0]["type"] == "run.finished"


def test_a_late_event_of_an_ended_run_stays_a_session_event():
    p = RunsProcessor()
    p([d("run.started", run="t1"), d("run.finished", run="t1")])
    late = p([d("tool.requested", run="t1"), d("tool.completed", run="t1")])
    assert [e["type"] for e in late] == ["tool.requested", "tool.completed"]
    assert all("run" not in e for e in late)
    assert p([d("tool.requested", run="t9")])[0]["run"] == "t9"  # a run never seen ending is kept


def test_a_second_start_of_an_open_run_is_degraded():
    p = RunsProcessor()
    out = p([d("run.started", run="t1"), d("run.started", run="t1", _drain="cancelled"), d("run.finished", run="t1")])
    assert [e["type"] for e in out] == ["run.started", "x.claude-code.run.started_again", "run.finished"]


def test_minted_runs_end_once_too():
    p = RunsProcessor()
    out = p([d("run.started"), d("run.finished"), d("run.finished"), d("tool.requested")])
    assert [e["type"] for e in out] == ["run.started", "run.finished", "run.finished", "tool.requested"]
    # With no run open and none named, a terminal names nothing: nothing to repeat, nothing to stamp.
    assert "run" not in out[2] and "run" not in out[3]


def test_ended_runs_are_bounded():
    p = RunsProcessor(RunsConfig(max_sessions=3))
    for i in range(10):
        p([d("run.started", run=f"t{i}"), d("run.finished", run=f"t{i}")])
    assert len(p.state.finished) == 3


def test_codex_repeated_stop_and_late_tool_give_a_valid_stream(tmp_path):
    from aep_collector.pipeline.validate import StreamValidator, envelope_errors, payload_errors

    from tests.chain import Chain

    chain = Chain(tmp_path)
    base = {"session_id": "th-1", "turn_id": "t1", "cwd": "/w", "model": "gpt-5"}
    events = []
    for name, extra in [("UserPromptSubmit", {"prompt": "hi"}), ("Stop", {}), ("Stop", {}),
                        ("PreToolUse", {"tool_name": "Bash", "tool_use_id": "c1", "tool_input": {"command": "ls"}})]:
        events += chain.feed("codex", name, {**base, "hook_event_name": name, **extra})
    types = [e["type"] for e in events]
    assert types == ["run.started", "run.finished", "x.codex.run.finished_again", "tool.requested"]
    assert "run" not in events[3]
    stream = StreamValidator()
    for e in events:
        assert envelope_errors(e) + payload_errors(e) + stream.feed(e) == [], e


def test_drafts_of_impossible_shapes_pass_without_ending_the_batch() -> None:
    """A plug-in can hand on a draft whose type, agent or session is not a string (JSON would never
    make one): it is passed on unplaced, for the stamper to refuse, and the batch goes on."""
    proc = RunsProcessor()
    odd = [{"type": ["tool.completed"], "agent": "a", "session": "s"},
           {"type": 5, "agent": "a", "session": "s"},
           {"type": "run.finished", "agent": 3, "session": "s", "run": "r9"},
           {"type": "tool.completed", "agent": "a", "session": ["s"]},
           {"type": "run.failed", "agent": "a", "session": "s", "run": ["r1"]}]
    good = [{"type": "run.started", "agent": "a", "session": "s"}, {"type": "tool.completed", "agent": "a", "session": "s"}]
    out = proc([odd[0], good[0], *odd[1:], good[1]])
    assert len(out) == 7 and all(any(o is item for o in out) for item in odd)
    started, completed = out[1], out[-1]
    assert isinstance(started["run"], str) and completed["run"] == started["run"]  # the run still synthesized
