"""Claude Code hook mapping: the two pinned form mappings, every Annex A.1 hook, odd shapes (replies: test_hook_replies.py).

The fixture holds raw hook inputs; only the receiver decodes a question into its form
(``Signal.form``), so every case here maps the Signal the receiver builds (``tests.received``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aep_collector.pipeline.canonical import digest
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.mapping import MappingProcessor
from aep_collector.processors.mapping import claude_code as cc
from aep_collector.receivers.claude_code import forms

from tests.conftest import corpus
from tests.received import received

FIXTURE = corpus("mappings/claude-code.json")
ENTRIES = [k for k in FIXTURE if not k.startswith("$")]
FORMS = {"ask_user_question": forms.ask_user_question_form, "elicitation": forms.elicitation_form}
CEILINGS = [("redacted", "expected_data", True), ("metadata", "expected_data_metadata", False)]


def hook(name: str, **fields: Any) -> dict[str, Any]:
    return {"hook_event_name": name, "session_id": "s_cc", **fields}


def run(payload: Any, state: cc.ClaudeCodeState | None = None, name: str = "hook") -> list[dict[str, Any]]:
    return cc.map_signal(received(cc.AGENT, name, payload), cc.new_state() if state is None else state)


def only(payload: Any) -> dict[str, Any]:
    drafts = run(payload)
    assert len(drafts) == 1, drafts
    return drafts[0]


def form_payload(entry: str) -> dict[str, Any]:
    """The hook payload that carries a fixture entry's input."""
    data = copy.deepcopy(FIXTURE[entry]["input"])
    if entry == "ask_user_question":
        return hook("PermissionRequest", tool_name="AskUserQuestion", tool_input=data)
    return hook("Elicitation", mcp_server_name="deploy", elicitation_id="el_1", **data)


def projected(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in ("type", "data", "subject") if k in d}


# --- the fixture ---------------------------------------------------------------------------


def test_fixture_has_both_pins() -> None:
    assert sorted(ENTRIES) == sorted(FORMS)


@pytest.mark.parametrize("ceiling,expected_key,content_ok", CEILINGS, ids=[c[0] for c in CEILINGS])
@pytest.mark.parametrize("entry", ENTRIES)
def test_pure_form_mapping_matches_the_pin(entry: str, ceiling: str, expected_key: str, content_ok: bool) -> None:
    mapped = FORMS[entry](FIXTURE[entry]["input"], content_ok)
    assert set(mapped) == {"prompt", "fields"}
    assert {"kind": "form", **mapped, "respond_via": ["control"]} == FIXTURE[entry][expected_key]


@pytest.mark.parametrize("ceiling,expected_key,content_ok", CEILINGS, ids=[c[0] for c in CEILINGS])
@pytest.mark.parametrize("entry", ENTRIES)
def test_gated_draft_matches_the_pin(entry: str, ceiling: str, expected_key: str, content_ok: bool) -> None:
    [d] = run(form_payload(entry))
    assert d["type"] == "attention.requested"
    gated = cap_draft(d, CapturePolicy(overrides={"attention": ceiling}))
    assert gated["data"] == FIXTURE[entry][expected_key]
    assert gated["capture"] == ceiling


def test_form_drafts_carry_their_field_specs_and_subjects() -> None:
    [ask] = run(form_payload("ask_user_question"))
    assert ask["subject"] == "AskUserQuestion"
    assert ask["_fields"] == FIXTURE["ask_user_question"]["expected_data"]["fields"]
    assert ask["_structural"] == {"prompt": "claude-code asks 2 questions"}
    [eli] = run(form_payload("elicitation"))
    assert eli["subject"] == "el_1"
    assert eli["_fields"] == FIXTURE["elicitation"]["expected_data"]["fields"]
    assert eli["_structural"] == {"prompt": "claude-code requests input (4 fields)"}


def test_elicitation_reads_the_hook_payloads_snake_case_schema() -> None:
    data = FIXTURE["elicitation"]["input"]
    payload = {"message": data["message"], "requested_schema": data["requestedSchema"]}
    assert forms.elicitation_form(payload, True)["fields"] == FIXTURE["elicitation"]["expected_data"]["fields"]


def test_form_shapes_beyond_the_pins() -> None:
    one = forms.ask_user_question_form({"questions": [{"question": "Go?", "options": ["yes", {"x": 1}]}]}, True)
    assert one["prompt"] == "claude-code asks 1 question"
    assert one["fields"][0]["label"] == "Go?"  # no header: the question alone
    assert [c["label"] for c in one["fields"][0]["choices"]] == ["yes", "2"]
    schema = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 9},
        "tier": {"type": "string", "oneOf": [{"const": "a", "title": "Tier A"}]},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}},
    }}
    fields = forms.elicitation_form({"requestedSchema": schema}, True)["fields"]
    assert fields[0] == {"id": "n", "type": "number", "min": 1, "max": 9, "label": "n", "required": False}
    assert fields[1]["choices"] == [{"id": "a", "label": "Tier A"}]
    assert fields[2]["multi"] is True and [c["id"] for c in fields[2]["choices"]] == ["x", "y"]
    assert forms.elicitation_form({"requestedSchema": schema}, True)["prompt"] == "claude-code requests input (3 fields)"


# --- every hook ----------------------------------------------------------------------------

TOOL_INPUT = {"command": "rm -rf build", "description": "clean build dir"}
TOOL_RESPONSE = {"stdout": "", "exit_code": 0}

# (case id, payload, expected {type, data, subject?} at full content)
HOOK_CASES: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("SessionStart", hook("SessionStart", source="startup", model="claude-sonnet-4-6", cwd="/home/u/p"),
     {"type": "session.started", "data": {"client": {"name": "claude-code"}, "trigger": "startup",
                                          "gen_ai.request.model": "claude-sonnet-4-6", "cwd": "/home/u/p"}}),
    ("SessionEnd", hook("SessionEnd", reason="prompt_input_exit"),
     {"type": "session.ended", "data": {"reason": "normal"}}),
    ("UserPromptSubmit", hook("UserPromptSubmit", prompt="fix it"),
     {"type": "run.started", "data": {"trigger": "user", "prompt": "fix it"}}),
    ("Stop", hook("Stop", stop_hook_active=False, last_assistant_message="done"),
     {"type": "run.finished", "data": {}}),
    ("StopFailure", hook("StopFailure", error="rate_limit", error_details="429 Too Many Requests"),
     {"type": "run.failed", "data": {"reason": "rate_limit", "error_details": "429 Too Many Requests"}}),
    ("PreToolUse", hook("PreToolUse", tool_name="Bash", tool_use_id="toolu_1", tool_input=TOOL_INPUT),
     {"type": "tool.requested", "subject": "Bash",
      "data": {"tool": {"name": "Bash", "call_id": "toolu_1"}, "args_digest": digest(TOOL_INPUT), "args": TOOL_INPUT}}),
    ("PostToolUse", hook("PostToolUse", tool_name="Bash", tool_use_id="toolu_1", tool_input=TOOL_INPUT,
                         tool_response=TOOL_RESPONSE),
     {"type": "tool.completed", "subject": "Bash",
      "data": {"tool": {"name": "Bash", "call_id": "toolu_1"}, "result_digest": digest(TOOL_RESPONSE),
               "result": TOOL_RESPONSE}}),
    ("PostToolUseFailure", hook("PostToolUseFailure", tool_name="Bash", tool_use_id="toolu_2",
                                error="exit 1", is_interrupt=False),
     {"type": "tool.failed", "subject": "Bash",
      "data": {"tool": {"name": "Bash", "call_id": "toolu_2"}, "error": {"type": "tool_error", "message": "exit 1"}}}),
    ("PostToolUseFailure-interrupt", hook("PostToolUseFailure", tool_name="Bash", error="stopped", is_interrupt=True),
     {"type": "tool.failed", "subject": "Bash",
      "data": {"tool": {"name": "Bash"}, "error": {"type": "interrupt", "message": "stopped"}}}),
    ("PermissionDenied", hook("PermissionDenied", tool_name="Bash", tool_use_id="toolu_3", reason="outside project"),
     {"type": "tool.denied", "subject": "Bash",
      "data": {"tool": {"name": "Bash", "call_id": "toolu_3"}, "by": "policy", "reason": "outside project"}}),
    ("PermissionDenied-rule", hook("PermissionDenied", tool_name="Bash", by="user_setting", rule="deny Bash(rm:*)"),
     {"type": "tool.denied", "subject": "Bash",
      "data": {"tool": {"name": "Bash"}, "by": "user_setting", "rule": "deny Bash(rm:*)"}}),
    ("PermissionDenied-bad-by", hook("PermissionDenied", tool_name="Bash", by="user"),
     {"type": "tool.denied", "subject": "Bash", "data": {"tool": {"name": "Bash"}, "by": "policy"}}),
    ("PermissionRequest", hook("PermissionRequest", tool_name="Bash", tool_input=TOOL_INPUT),
     {"type": "attention.requested", "subject": "Bash",
      "data": {"kind": "permission", "prompt": "Permission requested: Bash \u2014 rm -rf build (clean build dir)",
               "options": [{"id": "allow", "label": "Allow"}, {"id": "deny", "label": "Deny"}],
               "respond_via": ["control"]}}),
    ("PermissionRequest-file", hook("PermissionRequest", tool_name="Write", tool_input={"file_path": "/w/a.ts"}),
     {"type": "attention.requested", "subject": "Write",
      "data": {"kind": "permission", "prompt": "Permission requested: Write \u2014 /w/a.ts",
               "options": [{"id": "allow", "label": "Allow"}, {"id": "deny", "label": "Deny"}],
               "respond_via": ["control"]}}),
    ("SubagentStart", hook("SubagentStart", agent_id="agent-1", agent_type="Explore"),
     {"type": "delegation.subagent.started", "subject": "agent-1", "data": {"agent_type": "Explore"}}),
    ("SubagentStop", hook("SubagentStop", agent_id="agent-1", agent_type="Explore", stop_hook_active=False,
                          last_assistant_message="found 3"),
     {"type": "delegation.subagent.stopped", "subject": "agent-1", "data": {"agent_type": "Explore"}}),
    ("PreCompact", hook("PreCompact", trigger="auto", custom_instructions=""), None),
    ("PostCompact", hook("PostCompact", trigger="manual", compact_summary="squeezed"),
     {"type": "session.compacted", "data": {"trigger": "manual", "compact_summary": "squeezed"}}),
    ("TaskCreated", hook("TaskCreated", task_id="task-1", task_subject="Add login", task_description="endpoints"),
     {"type": "progress.task.planned", "subject": "task-1",
      "data": {"task": {"id": "task-1", "title": "Add login", "description": "endpoints"}}}),
    ("TaskCompleted", hook("TaskCompleted", task_id="task-1", task_subject="Add login"),
     {"type": "progress.task.completed", "subject": "task-1", "data": {"task": {"id": "task-1", "title": "Add login"}}}),
    ("Notification", hook("Notification", notification_type="idle_prompt", message="waiting", title="Idle"),
     {"type": "progress.status", "subject": "idle_prompt", "data": {"message": "waiting", "title": "Idle"}}),
    ("Notification-permission", hook("Notification", notification_type="permission_prompt", message="needs Bash"), None),
    ("Notification-elicitation", hook("Notification", notification_type="elicitation_dialog", message="form"), None),
    ("TeammateIdle", hook("TeammateIdle", teammate_name="researcher", team_name="proj"),
     {"type": "agent.idle", "subject": "researcher", "data": {}}),
    ("ConfigChange", hook("ConfigChange", source="project_settings", file_path="/p/.claude/settings.json"),
     {"type": "x.claude-code.session.config_change", "data": {}}),
    ("SomeFutureHook", hook("SomeFutureHook", anything=1),
     {"type": "x.claude-code.session.some_future_hook", "data": {}}),
]


@pytest.mark.parametrize("payload,expected", [c[1:] for c in HOOK_CASES], ids=[c[0] for c in HOOK_CASES])
def test_every_hook(payload: dict[str, Any], expected: dict[str, Any] | None) -> None:
    drafts = run(payload)
    if expected is None:
        assert drafts == []
        return
    [d] = drafts
    assert projected(d) == expected
    if d["type"].startswith("agent."):
        assert "session" not in d and "run" not in d  # agent-scoped
    else:
        assert d["session"] == "s_cc"
    assert "run" not in d  # Claude Code names no run: the runs processor synthesizes it


def test_every_hook_of_the_table_has_a_case() -> None:
    covered = {c[1]["hook_event_name"] for c in HOOK_CASES}
    assert set(cc.HOOKS) <= covered | {"Elicitation", "ElicitationResult"}


# What survives the default posture (metadata; attention.* redacted) for the free-text carriers.
DEFAULT_GATED = {
    "SessionStart": {"client": {"name": "claude-code"}, "trigger": "startup", "gen_ai.request.model": "claude-sonnet-4-6"},
    "UserPromptSubmit": {"trigger": "user"},
    "StopFailure": {"reason": "rate_limit"},
    "PreToolUse": {"tool": {"name": "Bash", "call_id": "toolu_1"}, "args_digest": digest(TOOL_INPUT)},
    "PostToolUse": {"tool": {"name": "Bash", "call_id": "toolu_1"}, "result_digest": digest(TOOL_RESPONSE)},
    "PostToolUseFailure": {"tool": {"name": "Bash", "call_id": "toolu_2"}, "error": {"type": "tool_error"}},
    "PermissionDenied": {"tool": {"name": "Bash", "call_id": "toolu_3"}, "by": "policy"},
    "PostCompact": {"trigger": "manual"},
    "TaskCreated": {"task": {"id": "task-1"}},
    "Notification": {},
}


@pytest.mark.parametrize("case", sorted(DEFAULT_GATED))
def test_free_text_is_gated_at_the_default_posture(case: str) -> None:
    payload = next(c[1] for c in HOOK_CASES if c[0] == case)
    assert cap_draft(only(payload), CapturePolicy())["data"] == DEFAULT_GATED[case]


def test_permission_prompt_degrades_to_the_structural_synthesis_at_metadata() -> None:
    proc = MappingProcessor()
    [d] = proc([Signal(cc.AGENT, "PermissionRequest", hook("PermissionRequest", tool_name="Bash",
                                                              tool_input=TOOL_INPUT))])
    assert d["agent"] == "claude-code"
    gated = cap_draft(d, CapturePolicy(overrides={"attention": "metadata"}))
    assert gated["data"]["prompt"] == "claude-code requests permission: Bash"
    assert [o["label"] for o in gated["data"]["options"]] == ["allow", "deny"]


def test_the_payload_names_its_hook_and_the_signal_name_is_the_fallback() -> None:
    assert run(hook("Stop"), name="PreToolUse")[0]["type"] == "run.finished"
    assert run({"session_id": "s"}, name="Stop")[0]["type"] == "run.finished"
    assert run({"hook_event_name": 7, "session_id": "s"}, name="SessionEnd")[0]["type"] == "session.ended"


# --- elicitation pairing -------------------------------------------------------------------


def test_elicitation_result_answers_the_pending_request() -> None:
    state = cc.new_state()
    [req] = run(form_payload("elicitation"), state)
    content = {"environment": "staging", "replicas": 2, "reason": "launch", "confirm": True}
    answered, resolved = run(hook("ElicitationResult", mcp_server_name="deploy", elicitation_id="el_1",
                                  action="accept", content=content), state)
    assert projected(answered) == {"type": "attention.answered", "subject": "el_1",
                                   "data": {"answer": {"values": content}, "via": "oob"}}
    assert answered["_fields"] == req["_fields"]
    assert projected(resolved) == {"type": "attention.resolved", "subject": "el_1",
                                   "data": {"resolution": "answered"}}
    # The answer values are gated against the request's field specs: text drops at metadata.
    gated = cap_draft(answered, CapturePolicy(overrides={"attention": "metadata"}))
    assert gated["data"]["answer"]["values"] == {"environment": "staging", "replicas": 2, "confirm": True}
    # Settled: a repeated result is an orphan.
    assert run(hook("ElicitationResult", elicitation_id="el_1", action="accept", content={}), state) == []


def test_orphan_elicitation_result_emits_nothing() -> None:
    assert run(hook("ElicitationResult", elicitation_id="nope", action="accept", content={"a": 1})) == []


def test_elicitation_result_pairs_by_server_when_ids_are_missing() -> None:
    state = cc.new_state()
    run(hook("Elicitation", mcp_server_name="srv", message="m", requested_schema={"properties": {}}), state)
    drafts = run(hook("ElicitationResult", mcp_server_name="srv", action="accept", content={}), state)
    assert [d["type"] for d in drafts] == ["attention.answered", "attention.resolved"]
    assert {d["subject"] for d in drafts} == {"srv"}


def test_declined_elicitation_is_dismissed_without_an_answer() -> None:
    state = cc.new_state()
    run(form_payload("elicitation"), state)
    [d] = run(hook("ElicitationResult", elicitation_id="el_1", mcp_server_name="deploy", action="decline"), state)
    assert projected(d) == {"type": "attention.resolved", "subject": "el_1", "data": {"resolution": "dismissed"}}


def test_pending_is_per_session_and_forgettable() -> None:
    state = cc.new_state()
    run(form_payload("elicitation"), state)
    other = {**hook("ElicitationResult", elicitation_id="el_1", action="accept"), "session_id": "other"}
    assert run(other, state) == []
    state.forget("s_cc", "el_1")  # the control plane answered it: the vendor echo is not a second answer
    assert run(hook("ElicitationResult", elicitation_id="el_1", action="accept"), state) == []


# --- digests and copies --------------------------------------------------------------------


def test_digests_are_over_the_original_values_and_the_payload_is_untouched() -> None:
    secret_input = {"command": "curl -H 'Authorization: Bearer sk-abcdefghijklmnopqrstuvwx' x"}
    payload = hook("PreToolUse", tool_name="Bash", tool_input=secret_input)
    before = copy.deepcopy(payload)
    d = only(payload)
    assert d["data"]["args_digest"] == digest(before["tool_input"])
    d["data"]["args"]["command"] = "mutated"
    assert payload == before
    gated = cap_draft(d, CapturePolicy(ceiling="redacted"))
    assert gated["data"]["args_digest"] == digest(before["tool_input"])
    assert "sk-abcdefghijklmnopqrstuvwx" not in str(gated["data"])


def test_string_tool_input_and_response_are_digested_as_json_strings() -> None:
    d = only(hook("PreToolUse", tool_name="Bash", tool_input="ls -la"))
    assert d["data"] == {"tool": {"name": "Bash"}, "args_digest": digest("ls -la")}  # `args` is object-only
    c = only(hook("PostToolUse", tool_name="Bash", tool_response="ok"))
    assert c["data"]["result_digest"] == digest("ok") and c["data"]["result"] == "ok"
    lst = only(hook("PostToolUse", tool_name="Bash", tool_response=[1, 2]))
    assert lst["data"] == {"tool": {"name": "Bash"}, "result_digest": digest([1, 2])}


# --- odd shapes never crash ------------------------------------------------------------------

ODD_VALUES: list[Any] = [None, "text", 7, True, [], ["x"], {"nested": {"deep": [1]}}]


@pytest.mark.parametrize("name", sorted(set(cc.HOOKS) | {"Unknown"}))
@pytest.mark.parametrize("odd", ODD_VALUES, ids=lambda v: type(v).__name__)
def test_odd_field_types_degrade(name: str, odd: Any) -> None:
    payload = {"hook_event_name": name, "session_id": odd}
    for key in ("tool_name", "tool_use_id", "tool_input", "tool_response", "questions", "requested_schema",
                "requestedSchema", "message", "notification_type", "agent_id", "task_id", "error", "content",
                "action", "elicitation_id", "mcp_server_name", "trigger", "prompt", "source", "model"):
        payload[key] = odd
    state = cc.new_state()
    for d in run(payload, state) + run({**payload, "hook_event_name": "ElicitationResult"}, state):
        assert isinstance(d["type"], str) and isinstance(d["data"], dict)
        assert d.get("session") in (None, odd) and (d.get("session") is None or isinstance(d["session"], str))
        cap_draft(d, CapturePolicy())  # the capture ceiling accepts whatever the mapping produced


@pytest.mark.parametrize("payload", [None, "string", 42, ["list"]], ids=repr)
def test_a_payload_that_is_not_an_object_degrades(payload: Any) -> None:
    drafts = run(payload, name="PreToolUse")
    assert projected(drafts[0]) == {"type": "tool.requested", "subject": "unknown", "data": {"tool": {"name": "unknown"}}}
    assert drafts[0]["session"] is None


def test_missing_session_goes_to_the_unknown_lane() -> None:
    assert only({"hook_event_name": "Stop"})["session"] is None


def test_ask_user_question_with_broken_questions_still_forms() -> None:
    d = only(hook("PermissionRequest", tool_name="AskUserQuestion", tool_input={"questions": "nope"}))
    assert d["data"]["kind"] == "form" and d["data"]["fields"] == []
    assert d["data"]["prompt"] == "claude-code asks 0 questions"


@pytest.mark.parametrize("content", [
    {},  # accept with nothing for the required environment and confirm
    {"environment": "staging"},  # confirm (required) missing
    {"environment": "qa", "confirm": True},  # not one of the closed choices
    {"environment": "staging", "confirm": "yes"},  # a string in a boolean field
])
@pytest.mark.parametrize("ceiling", ["metadata", "redacted", "full"])
def test_an_accept_that_does_not_satisfy_the_form_closes_it_as_dismissed(tmp_path, content, ceiling) -> None:
    """AEP-0006: a form is answered whole; values that break its specs are no attention.answered."""
    from aep_collector.pipeline.validate import StreamValidator, envelope_errors, payload_errors

    from tests.chain import Chain

    chain = Chain(tmp_path, ceiling=ceiling)
    events = chain.feed("claude-code", "Elicitation", form_payload("elicitation"))
    events += chain.feed("claude-code", "ElicitationResult", hook(
        "ElicitationResult", mcp_server_name="deploy", elicitation_id="el_1", action="accept", content=content))
    assert [(e["type"], e.get("data", {}).get("resolution")) for e in events] == [
        ("attention.requested", None), ("attention.resolved", "dismissed")]
    assert events[1]["subject"] == events[0]["id"]
    assert chain.processors[0].attention.invalid == 1
    stream = StreamValidator()
    for e in events:
        assert envelope_errors(e) + payload_errors(e) + stream.feed(e) == [], e


def test_a_valid_accept_is_still_answered_through_the_chain(tmp_path) -> None:
    from tests.chain import Chain

    chain = Chain(tmp_path, ceiling="full")
    chain.feed("claude-code", "Elicitation", form_payload("elicitation"))
    events = chain.feed("claude-code", "ElicitationResult", hook(
        "ElicitationResult", mcp_server_name="deploy", elicitation_id="el_1", action="accept",
        content={"environment": "production", "confirm": False}))
    assert [e["type"] for e in events] == ["attention.answered", "attention.resolved"]
    assert events[1]["data"]["resolution"] == "answered"
