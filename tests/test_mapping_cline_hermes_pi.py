"""Cline, Hermes and pi mappings: every fixture entry, the stateful runtime, replies, odd shapes."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline.envelope import SEVERITIES, TYPE_GRAMMAR, Stamper
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.validate import payload_errors
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.mapping import (
    MappingProcessor,
    cline,
    hermes,
    load_vendor,
    pi,
    plugin_vendors,
)
from aep_collector.processors.runs import RunsProcessor
from aep_sdk.gen import PAYLOAD_MODELS
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import corpus

CLINE = corpus("mappings/cline.json")
HERMES = corpus("mappings/hermes.json")
PI = corpus("mappings/pi.json")

CLINE_CASES = {**CLINE["hooks"], "fallback": CLINE["fallback"]}
HERMES_CASES = {**HERMES["hooks"], "fallback": HERMES["fallback"]}
PI_CASES = {**PI["moments"], "fallback": PI["fallback"]}
WITH_STEP = ("type", "data", "subject", "step")
NO_STEP = ("type", "data", "subject")


def project(d: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The fixture comparison projection of a draft gated at the pinned default posture."""
    gated = cap_draft(d, CapturePolicy())
    return {k: gated[k] for k in keys if k in gated}


def expected_of(e: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in e.items() if k != "$comment"}


def inp(cases: dict[str, Any], name: str) -> dict[str, Any]:
    return copy.deepcopy(cases[name]["input"])


def gated(d: dict[str, Any], ceiling: str) -> dict[str, Any]:
    return cap_draft(d, CapturePolicy(ceiling=ceiling, overrides={}))["data"]


def types(drafts: list[dict[str, Any]]) -> list[str]:
    return [d["type"] for d in drafts]


# --- fixtures: every entry + fallback, exactly ---------------------------------------------------------


@pytest.mark.parametrize("entry", CLINE_CASES.values(), ids=list(CLINE_CASES))
def test_cline_fixture(entry: dict[str, Any]) -> None:
    drafts = cline.map_hook(entry["input"])
    assert [project(d, WITH_STEP) for d in drafts] == [expected_of(e) for e in entry["expected"]]
    for d in drafts:
        assert TYPE_GRAMMAR.match(d["type"])
        assert d["session"] == entry["input"]["taskId"]  # identity: taskId -> session
        assert "run" not in d  # no run id rides the payload: the runs processor mints it


@pytest.mark.parametrize("entry", HERMES_CASES.values(), ids=list(HERMES_CASES))
def test_hermes_fixture(entry: dict[str, Any]) -> None:
    payload = entry["input"]
    assert payload["extra"]["telemetry_schema_version"] == hermes.SCHEMA_VERSION  # the drift sentinel
    drafts = hermes.map_hook(payload)
    assert [project(d, NO_STEP) for d in drafts] == [expected_of(e) for e in entry["expected"]]
    extra = payload["extra"]
    for d in drafts:
        assert TYPE_GRAMMAR.match(d["type"])
        assert "step" not in d
        assert d.get("run") == (extra.get("turn_id") or extra.get("parent_turn_id"))  # verbatim, never minted
        if payload["session_id"]:
            assert d["session"] == payload["session_id"]
        else:
            assert "session" not in d  # approvals: never a lane from session_key without a join


PI_RUNS = [(name, False) for name in PI_CASES] + [(name, True) for name in PI_CASES]


@pytest.mark.parametrize(("name", "deltas"), PI_RUNS, ids=[f"{n}-{'deltas' if d else 'default'}" for n, d in PI_RUNS])
def test_pi_fixture(name: str, deltas: bool) -> None:
    entry = PI_CASES[name]
    # Without a deltas fork the opt-in changes nothing; with one it yields the pinned stream event.
    want = entry.get("deltas_expected", entry["expected"]) if deltas else entry["expected"]
    d = pi.map_event(entry["input"], deltas)
    if want is None:
        assert d is None
        return
    assert d is not None
    assert project(d, WITH_STEP) == expected_of(want)
    assert TYPE_GRAMMAR.match(d["type"])
    assert d["session"] == entry["input"]["session"]["id"]


def test_pi_deltas_forks_are_exactly_the_stream_updates() -> None:
    forks = {n for n, e in PI_CASES.items() if "deltas_expected" in e}
    assert forks == {"message_update", "tool_execution_update"}
    assert all(PI_CASES[n]["expected"] is None for n in forks)


def test_fallbacks_use_each_vendors_spelling() -> None:
    assert cline.map_hook(CLINE["fallback"]["input"])[0]["type"] == "x.cline.some.future.hook"
    assert hermes.map_hook(HERMES["fallback"]["input"])[0]["type"] == "x.hermes.pre.verify"
    assert pi.map_event(PI["fallback"]["input"])["type"] == "x.pi.event.wholly_novel_event"


@pytest.mark.parametrize(("name", "want"), [
    ("some_future_hook", "x.cline.some.future.hook"),
    ("single", "x.cline.single.event"),
    ("", "x.cline.unnamed.event"),
    ("Weird-Name.v2", "x.cline.weird.name.v2"),
    ("SomeCamelHook", "x.cline.some.camel.hook"),
])
def test_dotted_fallback_always_fits_the_type_grammar(name: str, want: str) -> None:
    assert plugin_vendors.dotted_fallback("cline", name) == want
    assert TYPE_GRAMMAR.match(want)


def test_step_is_a_string_and_zero_survives() -> None:
    assert plugin_vendors.step_of(0) == "0"
    assert plugin_vendors.step_of(3) == "3"
    assert plugin_vendors.step_of(True) is None
    assert plugin_vendors.step_of(None) is None
    assert plugin_vendors.step_of(2.0) == "2"


# --- the dispatch contract and the Signal shape ---------------------------------------------------------


@pytest.mark.parametrize("module", [cline, hermes, pi], ids=["cline", "hermes", "pi"])
def test_module_is_the_builtin_vendor(module: Any) -> None:
    from aep_collector.pipeline.registry import declared_vendors

    assert declared_vendors()[module.AGENT].mapping == module.__name__
    assert load_vendor(module.AGENT) is module
    assert callable(module.new_state) and callable(module.map_signal)


@pytest.mark.parametrize("name", list(CLINE_CASES), ids=list(CLINE_CASES))
def test_cline_signal_of_the_fixture_input_maps_like_the_pure_function(name: str) -> None:
    payload = inp(CLINE_CASES, name)
    got = cline.map_signal(Signal("cline", payload["hookName"], payload), cline.new_state())
    assert got == cline.map_hook(payload)


@pytest.mark.parametrize("name", list(HERMES_CASES), ids=list(HERMES_CASES))
def test_hermes_signal_of_the_fixture_input_maps_like_the_pure_function(name: str) -> None:
    # The pins stop at the answer; at runtime every observed answer is followed by resolved{answered}.
    payload = inp(HERMES_CASES, name)
    got = hermes.map_signal(Signal("hermes", payload["hook_event_name"], payload), hermes.new_state())
    want = []
    for d in hermes.map_hook(payload):
        want.append(d)
        if d["type"] == "attention.answered":
            want.append({"type": "attention.resolved", "data": {"resolution": "answered"}, "subject": d["subject"],
                         "run": d["run"], "_attention_key": d["_attention_key"],
                         **({"session": d["session"]} if "session" in d else {})})
    assert got == want


@pytest.mark.parametrize("name", list(PI_CASES), ids=list(PI_CASES))
def test_pi_signal_of_the_fixture_input_maps_like_the_pure_function(name: str) -> None:
    payload = inp(PI_CASES, name)
    state = pi.new_state(deltas=False)
    if payload["event"]["type"] == "agent_end":  # an end only closes a loop that is open
        pi.map_signal(Signal("pi", "agent_start", {"session": payload["session"], "event": {"type": "agent_start"}}),
                      state)
    got = pi.map_signal(Signal("pi", payload["event"]["type"], payload), state)
    pure = pi.map_event(payload)
    assert got == ([] if pure is None else [pure])


def test_pi_shutdown_with_the_agent_loop_open_ends_the_run_first() -> None:
    # pi quitting mid-turn (no agent_end) must not leave the run open past session.ended.
    state = pi.new_state(deltas=False)
    session = {"id": "s1"}
    pi.map_signal(Signal("pi", "agent_start", {"session": session, "event": {"type": "agent_start"}}), state)
    got = pi.map_signal(Signal("pi", "session_shutdown", {"session": session, "event": {
        "type": "session_shutdown", "reason": "quit"}}), state)
    assert types(got) == ["run.cancelled", "session.ended"] and got[0]["data"] == {"by": "shutdown"}
    # With the loop closed by agent_end, shutdown is the session's end alone.
    pi.map_signal(Signal("pi", "agent_start", {"session": session, "event": {"type": "agent_start"}}), state)
    pi.map_signal(Signal("pi", "agent_end", {"session": session, "event": {"type": "agent_end"}}), state)
    assert types(pi.map_signal(Signal("pi", "session_shutdown", {"session": session, "event": {
        "type": "session_shutdown"}}), state)) == ["session.ended"]


def test_signal_name_fills_a_payload_without_its_own_name() -> None:
    payload = inp(CLINE_CASES, "prompt_submit")
    del payload["hookName"]
    assert types(cline.map_signal(Signal("cline", "prompt_submit", payload), cline.new_state())) == [
        "x.cline.prompt.submitted"]
    h = inp(HERMES_CASES, "on_session_finalize")
    del h["hook_event_name"]
    assert types(hermes.map_signal(Signal("hermes", "on_session_finalize", h), hermes.new_state())) == [
        "session.ended"]
    p = inp(PI_CASES, "session_tree")
    del p["event"]["type"]
    assert types(pi.map_signal(Signal("pi", "session_tree", p), pi.new_state(deltas=False))) == [
        "x.pi.session.tree"]


# --- content at its schema field, for the capture processor -------------------------------------------------


def test_cline_content_rides_at_schema_fields() -> None:
    call = cline.map_hook(inp(CLINE_CASES, "tool_call"))[0]
    assert gated(call, "full")["args"] == {"command": "npm test"}
    assert gated(call, "redacted")["args_redacted"] == {"command": "npm test"}
    assert gated(cline.map_hook(inp(CLINE_CASES, "tool_result_ok"))[0], "full")["result"] == "ok 42 tests"
    failed = gated(cline.map_hook(inp(CLINE_CASES, "tool_result_error"))[0], "redacted")
    assert failed["error"] == {"type": "tool_error", "message": "EACCES: permission denied"}
    assert gated(cline.map_hook(inp(CLINE_CASES, "agent_abort"))[0], "redacted")["reason"] == "user pressed escape"
    assert gated(cline.map_hook(inp(CLINE_CASES, "agent_error"))[0], "redacted")["error"]["message"] == "rate limited"
    compact = gated(cline.map_hook(inp(CLINE_CASES, "pre_compact"))[0], "redacted")
    assert compact["context_json_path"] == "/tmp/ctx.json" and compact["context_raw_path"] == "/tmp/ctx.raw"
    payload = inp(CLINE_CASES, "prompt_submit") | {"userPromptSubmit": {"prompt": "fix the build"}}
    prompt = cline.map_hook(payload)[0]
    assert gated(prompt, "redacted") == {"prompt": "fix the build"}
    assert gated(prompt, "metadata") == {}


def test_hermes_content_rides_at_schema_fields() -> None:
    started = gated(hermes.map_hook(inp(HERMES_CASES, "pre_llm_call"))[0], "redacted")
    assert started["prompt"] == "fix the failing build"
    assert gated(hermes.map_hook(inp(HERMES_CASES, "on_session_start"))[0], "redacted")["cwd"] == "~/proj"
    denied = gated(hermes.map_hook(inp(HERMES_CASES, "post_tool_call_blocked"))[0], "redacted")
    assert denied["rule"] == "blocked by policy hook"
    failed = gated(hermes.map_hook(inp(HERMES_CASES, "post_tool_call_error"))[0], "redacted")
    assert failed["error"] == {"type": "FileNotFound", "message": "no such file"}
    goal = gated(hermes.map_hook(inp(HERMES_CASES, "subagent_start"))[0], "redacted")
    assert goal["goal"] == "find the flaky test"
    api = gated(hermes.map_hook(inp(HERMES_CASES, "api_request_error"))[0], "redacted")
    assert api["error"] == {"type": "RateLimit", "message": "slow down"}
    card = hermes.map_hook(inp(HERMES_CASES, "pre_approval_request"))[0]
    # At a metadata attention ceiling the command text gives way to the structural synthesis.
    low = cap_draft({**card, "agent": "hermes"}, CapturePolicy(ceiling="metadata", overrides={}))["data"]
    assert low["prompt"] == "hermes requests permission: terminal:sudo"
    assert [o["label"] for o in low["options"]] == ["once", "session", "always", "deny"]


def test_hermes_clarify_answers_are_gated_by_the_field_type() -> None:
    picked = hermes.map_hook(inp(HERMES_CASES, "post_tool_call (clarify: a picked choice is its structural id)"))
    other = hermes.map_hook(inp(HERMES_CASES, "post_tool_call (clarify: the Other path is free text, redacted-gated)"))
    # A picked choice id is structural (kept at metadata); Other free text needs redacted+.
    assert gated(picked[1], "metadata")["answer"]["values"] == {"1": "3"}
    assert gated(other[1], "metadata")["answer"]["values"] == {}
    assert gated(other[1], "redacted")["answer"]["values"] == {"1": "ship them both"}
    card = hermes.map_hook(inp(HERMES_CASES, "pre_tool_call (clarify: the form overlay, vendor choice normalization)"))
    low = cap_draft({**card[1], "agent": "hermes"}, CapturePolicy(ceiling="metadata", overrides={}))["data"]
    assert low["prompt"] == hermes.CLARIFY_PROMPT
    assert low["fields"][0]["label"] == "1" and [c["label"] for c in low["fields"][0]["choices"]] == ["1", "2", "3", "4"]


def test_hermes_clarify_choice_normalization_is_the_vendors() -> None:
    raw = [" staging ", {"description": "production"}, "", "staging-eu", "extra-5th", "extra-6th"]
    assert hermes.clarify_choices(raw) == ["staging", "production", "staging-eu", "extra-5th"]
    assert hermes.clarify_choices([{"label": " a ", "text": "b"}, {"name": "x"}, ["c", "d"], None, 7]) == [
        "a", "c d", "7"]
    assert hermes.clarify_choices("not a list") == []
    assert hermes.clarify_fields("  ", ["a"]) is None


def test_pi_content_rides_at_schema_fields() -> None:
    started = gated(pi.map_event(inp(PI_CASES, "session_start")), "redacted")
    assert started["cwd"] == "~/proj" and started["session_file"].endswith("20260712_s_fix_1.jsonl")
    resumed = gated(pi.map_event(inp(PI_CASES, "session_start_resume")), "redacted")
    assert resumed["previous_session_file"].endswith("20260701_old.jsonl")
    finished = gated(pi.map_event(inp(PI_CASES, "agent_end_stop")), "redacted")
    assert finished["summary"] == "Done — the suite is green."
    failed = gated(pi.map_event(inp(PI_CASES, "agent_end_error")), "redacted")
    assert failed["error"] == {"type": "error", "message": "rate limited"}
    replied = gated(pi.map_event(inp(PI_CASES, "message_end_assistant")), "redacted")
    assert replied["content"] == "Done — the suite is green."
    assert gated(pi.map_event(inp(PI_CASES, "message_start_user")), "redacted")["content"] == "fix the flaky test"
    assert gated(pi.map_event(inp(PI_CASES, "tool_execution_start")), "full")["args"] == {"command": "npm test"}
    err = gated(pi.map_event(inp(PI_CASES, "tool_execution_end_error")), "redacted")
    assert err["error"] == {"type": "error", "message": "EACCES: permission denied"}
    info = pi.map_event(inp(PI_CASES, "session_info_changed"))
    assert gated(info, "redacted") == {"name": "flaky-test fix"} and gated(info, "metadata") == {}


def test_pi_assistant_digest_is_over_the_joined_text_not_the_parts() -> None:
    payload = inp(PI_CASES, "message_end_assistant")
    payload["event"]["message"]["content"] = [
        {"type": "text", "text": "Done — "}, {"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "green."}]
    d = pi.map_event(payload)
    assert d["data"]["content_digest"] == plugin_vendors.digest("Done — green.")
    user = inp(PI_CASES, "message_start_user")
    user["event"]["message"]["content"] = [{"type": "text", "text": "fix the flaky test"}]
    assert pi.map_event(user)["data"]["content_digest"] == PI_CASES["message_start_user"]["expected"]["data"][
        "content_digest"]


ALL_DRAFTS = (
    [("cline", d) for e in CLINE_CASES.values() for d in cline.map_hook(e["input"])]
    + [("hermes", d) for e in HERMES_CASES.values() for d in hermes.map_hook(e["input"])]
    + [("pi", d) for e in PI_CASES.values() for deltas in (False, True) for d in [pi.map_event(e["input"], deltas)]
       if d]
)


@pytest.mark.parametrize("ceiling", ["none", "metadata", "redacted", "full"])
def test_every_output_stamps_and_validates(ceiling: str, tmp_path: Path) -> None:
    stamper = Stamper(tmp_path, host="test")
    for agent, d in ALL_DRAFTS:
        ev = stamper.stamp(cap_draft({"agent": agent, **d}, CapturePolicy(ceiling=ceiling, overrides={})))
        assert ev.get("severity", "info") in SEVERITIES
        assert payload_errors(ev) == [], (d["type"], payload_errors(ev))
        model = PAYLOAD_MODELS.get(ev["type"])
        if model is not None and "data" in ev:
            model.model_validate(ev["data"])


# --- stateful sequences through map_signal -------------------------------------------------------------


def chain(agent: str, payloads: list[tuple[str, dict[str, Any]]], mapping: MappingProcessor | None = None,
          ) -> list[dict[str, Any]]:
    """Signals through the real mapping and runs processors, as the pipeline runs them."""
    mapping = mapping or MappingProcessor()
    runs = RunsProcessor()
    return runs(mapping([Signal(agent, name, p) for name, p in payloads]))


def cline_hook(name: str, **fields: Any) -> dict[str, Any]:
    base = inp(CLINE_CASES, "agent_start")
    base.update(hookName=name, **fields)
    return base


def test_cline_start_tool_end_runs() -> None:
    seq = [
        cline_hook("agent_start"),
        cline_hook("prompt_submit"),
        cline_hook("tool_call", iteration=1, tool_call={"id": "c1", "name": "execute_command", "input": {"command": "ls"}}),
        # A thin record without a name still names its tool: the runtime join by call id.
        cline_hook("tool_result", iteration=1, tool_result={"id": "c1", "output": "a b", "durationMs": 5}),
        cline_hook("agent_end", iteration=1),
        cline_hook("agent_resume"),
        cline_hook("agent_abort", reason="esc"),
        cline_hook("session_shutdown"),
    ]
    out = chain("cline", [(p["hookName"], p) for p in seq])
    assert types(out) == ["run.started", "x.cline.prompt.submitted", "tool.requested", "tool.completed",
                          "run.finished", "run.started", "run.cancelled", "session.ended"]
    assert {d["session"] for d in out} == {"task_fix_1"} and {d["agent"] for d in out} == {"cline"}
    first, second = out[0]["run"], out[5]["run"]
    assert first != second  # agent_resume opens a NEW run; the id is minted by the runs processor
    assert [d.get("run") for d in out[:5]] == [first] * 5
    assert out[6]["run"] == second and "run" not in out[7]
    assert out[3]["data"]["tool"] == {"name": "execute_command", "call_id": "c1"} and out[3]["step"] == "1"
    assert out[6]["data"]["by"] == "user"


def test_cline_error_and_abort_stay_distinct_terminals() -> None:
    err = cline.map_hook(cline_hook("agent_error", error={"name": "TypeError", "message": "x"}))[0]
    abort = cline.map_hook(cline_hook("agent_abort"))[0]
    assert (err["type"], err["data"]["reason"]) == ("run.failed", "TypeError")
    assert abort["type"] == "run.cancelled"
    assert cline.map_hook(cline_hook("agent_error", error="boom"))[0]["data"] == {
        "reason": "error", "error": {"type": "error", "message": "boom"}}


def hermes_hook(name: str, session: str = "s1", **extra: Any) -> dict[str, Any]:
    return {"hook_event_name": name, "tool_name": extra.pop("tool_name", None),
            "tool_input": extra.pop("tool_input", None), "session_id": session, "cwd": "/w",
            "extra": {"telemetry_schema_version": hermes.SCHEMA_VERSION, **extra}}


def approval(name: str, key: str, pattern: str, **extra: Any) -> dict[str, Any]:
    return hermes_hook(name, session="", session_key=key, pattern_key=pattern, command="sudo x", surface="cli",
                       turn_id="s1:t1", **extra)


def run_hermes(state: hermes.HermesState, *payloads: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [hermes.map_signal(Signal("hermes", p["hook_event_name"], p), state) for p in payloads]


def test_hermes_approval_pair_joins_the_seen_session() -> None:
    state = hermes.new_state()
    _, req, ans = run_hermes(state, hermes_hook("on_session_start"),
                             approval("pre_approval_request", "s1", "terminal:sudo"),
                             approval("post_approval_response", "s1", "terminal:sudo", choice="once"))
    assert types(req) == ["attention.requested"] and req[0]["session"] == "s1" and req[0]["run"] == "s1:t1"
    assert req[0]["data"]["respond_via"] == ["oob"] and req[0]["subject"] == "terminal:sudo"
    assert types(ans) == ["attention.answered", "attention.resolved"]
    assert ans[0]["data"] == {"answer": {"option": "once"}, "via": "oob"}
    assert ans[1]["data"] == {"resolution": "answered"} and ans[1]["subject"] == "terminal:sudo"
    assert all(d["session"] == "s1" for d in ans)
    assert state.approval_lanes == {}


def test_hermes_approval_pair_through_the_attention_book() -> None:
    proc = MappingProcessor()
    out = proc([Signal("hermes", p["hook_event_name"], p) for p in (
        hermes_hook("on_session_start"),
        approval("pre_approval_request", "s1", "terminal:sudo"),
        approval("post_approval_response", "s1", "terminal:sudo", choice="deny"))])
    req, answered, resolved = out[1:]
    assert types(out[1:]) == ["attention.requested", "attention.answered", "attention.resolved"]
    # Lifecycle legs carry the request's event id as subject (AEP-0002 §7.1), cause-linked in order.
    assert answered["subject"] == resolved["subject"] == req["id"]
    assert answered["cause"] == req["id"] and resolved["cause"] == answered["id"]


def test_hermes_cards_and_legs_share_one_attention_key() -> None:
    # The key the attention book pairs on (the pins' subjects differ per card kind; the key never does).
    state = hermes.new_state()
    req, ans = run_hermes(state, approval("pre_approval_request", "s1", "terminal:sudo"),
                          approval("post_approval_response", "s1", "terminal:sudo", choice="deny"))
    assert {d["_attention_key"] for d in req + ans} == {"approval:s1|terminal:sudo"}
    other = approval("pre_approval_request", "s2", "terminal:sudo")
    assert hermes.map_hook(other)[0]["_attention_key"] != req[0]["_attention_key"]
    pre, post = run_hermes(
        state,
        hermes_hook("pre_tool_call", tool_name="clarify", tool_input={"question": "Q?"}, tool_call_id="c1"),
        hermes_hook("post_tool_call", tool_name="clarify", tool_call_id="c1", status="blocked"),
    )
    assert pre[1]["_attention_key"] == post[1]["_attention_key"] == "clarify:c1"
    assert "_attention_key" not in pre[0] and "_attention_key" not in post[0]  # the tool trio is no card


def test_hermes_paired_response_stays_on_its_requests_lane() -> None:
    state = hermes.new_state()
    # The request arrives before any hook named s1 (unknown lane); the answer must land beside it.
    req, _, ans = run_hermes(state, approval("pre_approval_request", "s1", "p"), hermes_hook("on_session_start"),
                             approval("post_approval_response", "s1", "p", choice="session"))
    assert "session" not in req[0] and all("session" not in d for d in ans)
    assert types(ans) == ["attention.answered", "attention.resolved"]


def test_hermes_gateway_key_never_mints_a_lane() -> None:
    state = hermes.new_state()
    req, ans = run_hermes(state, approval("pre_approval_request", "agent:main:telegram:dm:42", "terminal:rm"),
                          approval("post_approval_response", "agent:main:telegram:dm:42", "terminal:rm",
                                   choice="timeout"))
    assert "session" not in req[0] and "session" not in ans[0]  # the unknown lane
    assert types(ans) == ["attention.timeout"]  # a terminal of its own: no resolved after it
    assert state.sessions == {} and state.approval_lanes == {}


def test_hermes_unpaired_legs_never_invent_a_card() -> None:
    proc = MappingProcessor()
    out = proc([Signal("hermes", p["hook_event_name"], p) for p in (
        approval("post_approval_response", "s1", "p", choice="deny"),
        hermes_hook("pre_tool_call", tool_name="clarify", tool_input={}, tool_call_id="c3"),  # no question: no card
        hermes_hook("post_tool_call", tool_name="clarify", tool_call_id="c3", status="ok",
                    result='{"question":"","choices_offered":[],"user_response":"x"}'))])
    assert types(out) == ["tool.requested", "tool.completed"]
    assert proc.attention.orphans == 4


def test_hermes_clarify_pair_closes_the_card_it_raised() -> None:
    state = hermes.new_state()
    pre, post = run_hermes(
        state,
        hermes_hook("pre_tool_call", tool_name="clarify", tool_input={"question": "Ship?", "choices": ["yes", "no"]},
                    tool_call_id="c9", turn_id="s1:t1"),
        hermes_hook("post_tool_call", tool_name="clarify", tool_call_id="c9", turn_id="s1:t1", status="ok",
                    result='{"question":"Ship?","choices_offered":["yes","no"],"user_response":"no"}'),
    )
    assert types(pre) == ["tool.requested", "attention.requested"]
    assert types(post) == ["tool.completed", "attention.answered", "attention.resolved"]
    # The values gate gets the same field the card raised (rebuilt from what the vendor offered).
    assert post[1]["data"]["answer"]["values"] == {"1": "2"} and post[1]["_fields"] == pre[1]["data"]["fields"]
    assert post[2]["subject"] == "c9" and post[2]["run"] == "s1:t1"


def test_hermes_multi_select_clarify_answers_with_choice_ids() -> None:
    pre = hermes.map_hook(hermes_hook("pre_tool_call", tool_name="clarify", tool_call_id="m1", tool_input={
        "question": "Which?", "choices": ["a", "b", "c"], "multi_select": True}))
    assert pre[1]["data"]["fields"][0]["multi"] is True
    post = hermes.map_hook(hermes_hook("post_tool_call", tool_name="clarify", tool_call_id="m1", status="ok",
                                       result={"choices_offered": ["a", "b", "c"], "user_response": ["c", "a"]}))
    assert post[1]["data"]["answer"]["values"] == {"1": ["3", "1"]}
    assert gated(post[1], "metadata")["answer"]["values"] == {"1": ["3", "1"]}


def test_hermes_unparseable_clarify_result_makes_no_lifecycle_claim() -> None:
    payload = hermes_hook("post_tool_call", tool_name="clarify", tool_call_id="c1", status="ok", result="not json")
    assert types(hermes.map_hook(payload)) == ["tool.completed"]
    payload["extra"]["status"] = "error"
    assert types(hermes.map_hook(payload)) == ["tool.failed", "attention.resolved"]


def test_hermes_finalize_closes_open_cards_before_the_session_ends() -> None:
    proc = MappingProcessor()
    out = proc([Signal("hermes", p["hook_event_name"], p) for p in (
        hermes_hook("on_session_start"),
        approval("pre_approval_request", "s1", "terminal:sudo"),
        hermes_hook("pre_tool_call", tool_name="clarify", tool_input={"question": "Q?"}, tool_call_id="c1"),
        hermes_hook("on_session_finalize", reason="shutdown"))])
    requests = [d["id"] for d in out if d["type"] == "attention.requested"]
    assert types(out[-3:]) == ["attention.resolved", "attention.resolved", "session.ended"]
    assert sorted(d["subject"] for d in out[-3:-1]) == sorted(requests)
    assert all(d["data"] == {"resolution": "dismissed"} and d["session"] == "s1" for d in out[-3:-1])
    assert proc.states["hermes"].approval_lanes == {}


def test_hermes_turn_ids_are_the_runs_and_session_end_closes_only_the_turn() -> None:
    seq = [hermes_hook("on_session_start"),
           hermes_hook("pre_llm_call", turn_id="s1:t1", user_message="hi"),
           hermes_hook("pre_tool_call", tool_name="terminal", tool_input={"command": "ls"}, tool_call_id="a",
                       turn_id="s1:t1"),
           hermes_hook("on_session_end", turn_id="s1:t1", completed=True, interrupted=False),
           hermes_hook("pre_llm_call", turn_id="s1:t2", user_message="again"),
           hermes_hook("on_session_end", turn_id="s1:t2", completed=False, interrupted=True),
           hermes_hook("on_session_reset", session="s2", reason="new_session"),
           hermes_hook("on_session_finalize", reason="shutdown")]
    out = chain("hermes", [(p["hook_event_name"], p) for p in seq])
    assert types(out) == ["session.started", "run.started", "tool.requested", "run.finished", "run.started",
                          "run.cancelled", "x.hermes.session.reset", "session.ended"]
    assert [d.get("run") for d in out] == [None, "s1:t1", "s1:t1", "s1:t1", "s1:t2", "s1:t2", None, None]
    assert out[5]["data"] == {"by": "user"} and out[6]["session"] == "s2"


def test_hermes_session_end_that_neither_completed_nor_interrupted_is_a_failure() -> None:
    d = hermes.map_hook(hermes_hook("on_session_end", turn_id="t", completed=False, interrupted=False))[0]
    assert (d["type"], d["data"]) == ("run.failed", {"reason": "incomplete"})


def test_hermes_drift_sentinel_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    state = hermes.new_state()
    payload = hermes_hook("on_session_start")
    payload["extra"]["telemetry_schema_version"] = "hermes.observer.v2"
    with caplog.at_level(logging.WARNING, logger="aep.mapping.hermes"):
        run_hermes(state, payload, payload)
    assert sum("hermes.observer.v2" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aep.mapping.hermes"):
        run_hermes(state, hermes_hook("on_session_start"))
    assert caplog.records == []


def pi_moment(event: dict[str, Any], session: str = "s_fix_1") -> tuple[str, dict[str, Any]]:
    return event["type"], {"session": {"id": session, "file": "/f", "cwd": "/w"}, "event": event}


def test_pi_agent_loop_with_turns() -> None:
    end_ok = inp(PI_CASES, "agent_end_stop")["event"]
    end_err = inp(PI_CASES, "agent_end_error")["event"]
    seq = [pi_moment({"type": "session_start", "reason": "startup"}),
           pi_moment({"type": "agent_start"}),
           pi_moment({"type": "agent_start"}),  # a duplicate open keeps the live run
           pi_moment({"type": "turn_start", "turnIndex": 0}),
           pi_moment({"type": "tool_execution_start", "toolCallId": "t1", "toolName": "bash", "args": {"c": 1}}),
           pi_moment({"type": "tool_execution_update", "toolCallId": "t1", "toolName": "bash", "partialResult": "."}),
           pi_moment({"type": "tool_execution_end", "toolCallId": "t1", "toolName": "bash", "result": {}, "isError": False}),
           pi_moment({"type": "turn_end", "turnIndex": 0}),
           pi_moment({"type": "turn_start", "turnIndex": 1}),
           pi_moment({"type": "turn_end", "turnIndex": 1}),
           pi_moment(end_err),
           pi_moment({"type": "agent_end", "messages": []}),  # no loop open: dropped
           pi_moment({"type": "agent_start"}),  # the retried loop is a NEW run
           pi_moment(end_ok),
           pi_moment({"type": "agent_settled"}),
           pi_moment({"type": "session_shutdown", "reason": "quit"})]
    out = chain("pi", seq)
    assert types(out) == ["session.started", "run.started", "run.step.started", "tool.requested", "tool.completed",
                          "run.step.finished", "run.step.started", "run.step.finished", "run.failed", "run.started",
                          "run.finished", "x.pi.agent.settled", "session.ended"]
    assert [d.get("step") for d in out if d["type"].startswith("run.step.")] == ["0", "0", "1", "1"]
    first, retried = out[1]["run"], out[9]["run"]
    assert first != retried
    assert [d["run"] for d in out[1:9]] == [first] * 8 and out[10]["run"] == retried
    assert "run" not in out[11] and "run" not in out[12]  # after the loop closed: no run


def test_pi_deltas_opt_in_from_state_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    update = inp(PI_CASES, "message_update")
    assert pi.map_signal(Signal("pi", "message_update", update), pi.new_state(deltas=False)) == []
    assert types(pi.map_signal(Signal("pi", "message_update", update), pi.new_state(deltas=True))) == [
        "x.pi.message.delta"]
    monkeypatch.setenv(pi.DELTAS_ENV, "1")
    assert pi.new_state().deltas is True
    monkeypatch.setenv(pi.DELTAS_ENV, "0")
    assert pi.new_state().deltas is False


# --- odd shapes never crash ------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
CLINE_NAMES = st.sampled_from([*{e["input"]["hookName"] for e in CLINE_CASES.values()}, "x"])
HERMES_NAMES = st.sampled_from([*{e["input"]["hook_event_name"] for e in HERMES_CASES.values()}, "x"])
PI_NAMES = st.sampled_from([*{e["input"]["event"]["type"] for e in PI_CASES.values()}, "x"])
TOOLS = st.sampled_from(["clarify", "terminal", None])


def check_drafts(drafts: list[dict[str, Any]]) -> None:
    for d in drafts:
        assert TYPE_GRAMMAR.match(d["type"]) and isinstance(d["data"], dict)
        cap_draft({"agent": "a", **d}, CapturePolicy())
        if "step" in d:
            assert isinstance(d["step"], str)


@settings(max_examples=150, deadline=None)
@given(name=CLINE_NAMES, fields=st.dictionaries(st.sampled_from(
    ["taskId", "iteration", "tool_call", "tool_result", "error", "parent_agent_id", "agent_id", "preCompact",
     "reason", "turn", "userPromptSubmit", "preToolUse", "postToolUse"]), JSON, max_size=6))
def test_cline_odd_shapes_never_crash(name: str, fields: dict[str, Any]) -> None:
    payload = {"hookName": name, **fields}
    check_drafts(cline.map_hook(payload))
    check_drafts(cline.map_signal(Signal("cline", name, payload), cline.new_state()))


@settings(max_examples=150, deadline=None)
@given(name=HERMES_NAMES, tool=TOOLS, tool_input=JSON, extra=st.dictionaries(st.sampled_from(
    ["turn_id", "tool_call_id", "status", "result", "choice", "session_key", "pattern_key", "command",
     "user_message", "child_session_id", "completed", "interrupted", "error", "duration_ms", "reason"]),
    JSON, max_size=6))
def test_hermes_odd_shapes_never_crash(name: str, tool: Any, tool_input: Any, extra: dict[str, Any]) -> None:
    payload = {"hook_event_name": name, "tool_name": tool, "tool_input": tool_input, "session_id": "s",
               "extra": extra}
    check_drafts(hermes.map_hook(payload))
    state = hermes.new_state()
    for _ in range(2):  # twice: the second call meets whatever the first left in the state
        check_drafts(hermes.map_signal(Signal("hermes", name, payload), state))


@settings(max_examples=150, deadline=None)
@given(name=PI_NAMES, event=st.dictionaries(st.sampled_from(
    ["messages", "message", "turnIndex", "toolCallId", "toolName", "args", "result", "isError", "partialResult",
     "assistantMessageEvent", "model", "reason", "level", "willRetry"]), JSON, max_size=6), session=JSON)
def test_pi_odd_shapes_never_crash(name: str, event: dict[str, Any], session: Any) -> None:
    payload = {"session": session, "event": {"type": name, **event}}
    for deltas in (False, True):
        d = pi.map_event(payload, deltas)
        check_drafts([] if d is None else [d])
    state = pi.new_state(deltas=True)
    for _ in range(2):
        check_drafts(pi.map_signal(Signal("pi", name, payload), state))


@pytest.mark.parametrize("payload", [None, "text", 7, [], {"hookName": 3}, {"event": "x"}, {"extra": "x"}])
@pytest.mark.parametrize("module", [cline, hermes, pi], ids=["cline", "hermes", "pi"])
def test_non_object_payloads_degrade(module: Any, payload: Any) -> None:
    drafts = module.map_signal(Signal(module.AGENT, "mystery", payload), module.new_state())
    check_drafts(drafts)
    assert len(drafts) == 1 and drafts[0]["type"].startswith(f"x.{module.AGENT}.")


def test_mapping_processor_fills_agent_for_all_three() -> None:
    proc = MappingProcessor()
    out = proc([Signal("cline", "agent_start", inp(CLINE_CASES, "agent_start")),
                Signal("hermes", "on_session_start", inp(HERMES_CASES, "on_session_start")),
                Signal("pi", "session_tree", inp(PI_CASES, "session_tree"))])
    assert [d["agent"] for d in out] == ["cline", "hermes", "pi"] and proc.failures == 0
