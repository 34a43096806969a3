"""The Claude-Code hook family: every fixture entry of Codex, Qwen Code, Gemini CLI and VS Code,
their identity pins and stated absences, the shared pieces, replies and odd shapes."""

from __future__ import annotations

import copy
import re
from types import ModuleType
from typing import Any

import pytest
from aep_collector.pipeline.canonical import digest
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.mapping import (
    MappingProcessor,
    claude_code,
    codex,
    gemini_cli,
    load_vendor,
    qwen_code,
    vscode,
)
from aep_collector.processors.mapping import hook_vendors as hf
from aep_collector.processors.mapping.drafting import draft, snake_case

from tests.conftest import corpus

VENDORS: dict[str, ModuleType] = {"codex": codex, "qwen-code": qwen_code, "gemini-cli": gemini_cli, "vscode": vscode}
FIXTURES = {agent: corpus(f"mappings/{agent}.json") for agent in VENDORS}
TYPE_RE = re.compile(
    r"^((agent|session|run|progress|tool|delegation|attention|resource|error|state|assessment|message|control)"
    r"(\.[a-z0-9_]+)+|x\.[a-z0-9_-]+\.[a-z0-9_]+(\.[a-z0-9_]+)+)$"
)


def entries() -> list[tuple[str, str, dict[str, Any]]]:
    """(agent, entry key, entry) for every `hooks` entry and the `fallback` of every fixture."""
    out = []
    for agent, fx in FIXTURES.items():
        out += [(agent, key, entry) for key, entry in fx["hooks"].items()]
        out.append((agent, "fallback", fx["fallback"]))
    return out


ENTRIES = entries()
IDS = [f"{agent}:{key}" for agent, key, _ in ENTRIES]


def mapped(agent: str, payload: Any, name: str = "hook") -> list[dict[str, Any]]:
    mod = VENDORS[agent]
    return mod.map_signal(Signal(agent, name, payload), mod.new_state())


def projected(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in ("type", "data", "subject") if k in d}


def strip(expected: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in expected.items() if k != "$comment"}


# --- the fixtures, entry by entry -----------------------------------------------------------


@pytest.mark.parametrize("agent,key,entry", ENTRIES, ids=IDS)
def test_fixture_entry(agent: str, key: str, entry: dict[str, Any]) -> None:
    # The entry key is only a test id: the input names its own hook.
    drafts = [cap_draft(d, CapturePolicy()) for d in mapped(agent, entry["input"], name="ignored")]
    if entry["expected"] is None:
        assert drafts == []
    else:
        assert [projected(d) for d in drafts] == [strip(entry["expected"])]
        assert TYPE_RE.match(drafts[0]["type"])


@pytest.mark.parametrize("agent,key,entry", ENTRIES, ids=IDS)
def test_identity_pins(agent: str, key: str, entry: dict[str, Any]) -> None:
    identity = FIXTURES[agent]["identity"]
    assert identity["session_from"] == "session_id"
    for d in mapped(agent, entry["input"]):
        assert d["session"] == entry["input"].get(identity["session_from"])
        if identity["run_from"]:  # Codex: turn_id is a real run id
            assert d.get("run") == entry["input"].get(identity["run_from"])
        else:  # runs are synthesized downstream, never invented here
            assert "run" not in d


@pytest.mark.parametrize("agent,key,entry", ENTRIES, ids=IDS)
def test_digests_are_over_the_original_values(agent: str, key: str, entry: dict[str, Any]) -> None:
    payload = copy.deepcopy(entry["input"])
    for d in mapped(agent, payload):
        if "args_digest" in d["data"]:
            assert d["data"]["args_digest"] == digest(entry["input"]["tool_input"])
            assert d["data"]["args"] == entry["input"]["tool_input"]  # full content for the capture processor
        if "result_digest" in d["data"]:
            assert d["data"]["result_digest"] == digest(entry["input"]["tool_response"])
            assert d["data"]["result"] == entry["input"]["tool_response"]
    assert payload == entry["input"]  # the vendor payload is never mutated


def test_fixture_sizes() -> None:
    assert {a: len(fx["hooks"]) for a, fx in FIXTURES.items()} == {
        "codex": 10, "qwen-code": 19, "gemini-cli": 12, "vscode": 8}


# --- vendor-specific pins and stated absences ------------------------------------------------


def test_codex_run_started_drains_a_stale_run() -> None:
    [d] = mapped("codex", FIXTURES["codex"]["hooks"]["UserPromptSubmit"]["input"])
    assert d["_drain"] == "cancelled" and d["run"] == "t_fix_1"
    for agent in ("qwen-code", "gemini-cli", "vscode"):
        name = "BeforeAgent" if agent == "gemini-cli" else "UserPromptSubmit"
        [d] = mapped(agent, {"hook_event_name": name, "session_id": "s"})
        assert "_drain" not in d


@pytest.mark.parametrize("response", [{"output": "boom", "exit_code": 2}, {"error": "denied"}, "fatal: nope"],
                         ids=["exit-2", "error-key", "string"])
def test_codex_post_tool_use_is_always_completed(response: Any) -> None:
    [d] = mapped("codex", {"hook_event_name": "PostToolUse", "session_id": "s", "turn_id": "t",
                           "tool_name": "shell", "tool_use_id": "c", "tool_response": response})
    assert d["type"] == "tool.completed" and d["data"]["result_digest"] == digest(response)


def test_codex_session_end_ends_the_session() -> None:
    # Codex 0.169 fires SessionEnd (the live tier saw it; the fixture predates it).
    [d] = mapped("codex", {"hook_event_name": "SessionEnd", "session_id": "s", "turn_id": "t", "reason": "exit"})
    assert d["type"] == "session.ended" and "run" not in d


@pytest.mark.parametrize("kind", ["ToolPermission", "permission_prompt", "elicitation_dialog", None])
def test_gemini_notification_is_never_attention(kind: str | None) -> None:
    [d] = mapped("gemini-cli", {"hook_event_name": "Notification", "session_id": "s", "notification_type": kind,
                                "message": "write_file wants to modify x"})
    assert d["type"] == "progress.status"
    assert d.get("subject") == kind


def test_gemini_emits_no_attention_and_no_call_ids() -> None:
    for key, entry in FIXTURES["gemini-cli"]["hooks"].items():
        payload = {**entry["input"], "tool_use_id": "would-be-id"}
        for d in mapped("gemini-cli", payload):
            assert not d["type"].startswith("attention."), key
            assert "call_id" not in d["data"].get("tool", {}), key


def test_gemini_after_model_is_debug_and_after_tool_errors_fail_honestly() -> None:
    [d] = mapped("gemini-cli", FIXTURES["gemini-cli"]["hooks"]["AfterModel"]["input"])
    assert d["severity"] == "debug"
    [f] = mapped("gemini-cli", {"hook_event_name": "AfterTool", "session_id": "s", "tool_name": "t",
                                "tool_response": {"error": "disk full"}})
    assert projected(f) == {"type": "tool.failed", "subject": "t",
                            "data": {"tool": {"name": "t"}, "error": {"type": "tool_error", "message": "disk full"}}}
    [e] = mapped("gemini-cli", FIXTURES["gemini-cli"]["hooks"]["AfterTool-error"]["input"])
    assert e["data"]["error"]["message"] == "no such file: /home/user/missing.txt"  # full content for the capture processor


@pytest.mark.parametrize("phase,emits", [("validation", False), ("postWrite", True), (None, True), ("later", True)])
@pytest.mark.parametrize("name", ["TodoCreated", "TodoCompleted"])
def test_qwen_todo_double_fire(name: str, phase: str | None, emits: bool) -> None:
    payload = {"hook_event_name": name, "session_id": "s", "todo_id": "todo_9", "todo_content": "write docs"}
    if phase is not None:
        payload["phase"] = phase
    drafts = mapped("qwen-code", payload)
    assert (len(drafts) == 1) is emits
    if emits:
        assert drafts[0]["subject"] == "todo_9" and drafts[0]["data"] == {"todo_content": "write docs"}
        assert cap_draft(drafts[0], CapturePolicy(ceiling="redacted"))["data"] == {"todo_content": "write docs"}


@pytest.mark.parametrize("kind,emits", [("permission_prompt", False), ("elicitation_dialog", False),
                                        ("idle_prompt", True), ("auth_success", True)])
def test_qwen_notification_dedupe(kind: str, emits: bool) -> None:
    drafts = mapped("qwen-code", {"hook_event_name": "Notification", "session_id": "s", "notification_type": kind})
    assert [d["type"] for d in drafts] == (["progress.status"] if emits else [])


def test_qwen_usage_is_an_integer_only() -> None:
    for tokens in ("1200", True, 1.5, None):
        [d] = mapped("qwen-code", {"hook_event_name": "Stop", "session_id": "s", "input_tokens": tokens})
        assert d["data"] == {}


def test_vscode_hooks_are_exactly_the_eight_pinned_events() -> None:
    assert set(vscode.HOOKS) == set(FIXTURES["vscode"]["hooks"])


@pytest.mark.parametrize("name", ["SessionEnd", "StopFailure", "PostToolUseFailure", "ErrorOccurred"])
def test_vscode_never_emits_the_absent_terminals(name: str) -> None:
    [d] = mapped("vscode", {"hook_event_name": name, "session_id": "s", "tool_name": "t", "error": "x"})
    assert d["type"] == f"x.vscode.session.{snake_case(name)}" and d["data"] == {}


def test_vscode_absent_terminals_across_every_fixture_input() -> None:
    types = {d["type"] for _, entry in FIXTURES["vscode"]["hooks"].items() for d in mapped("vscode", entry["input"])}
    assert not types & {"session.ended", "run.failed", "tool.failed"}


def test_vscode_session_is_optional_and_transcript_path_never_rides() -> None:
    payload = {k: v for k, v in FIXTURES["vscode"]["hooks"]["SessionStart"]["input"].items() if k != "session_id"}
    [d] = mapped("vscode", payload)
    assert d["session"] is None
    assert "/home/user/.vscode" not in repr(d) and "timestamp" not in d["data"]


# --- full content before capture ---------------------------------------------------------------------


def test_drafts_carry_full_content_and_mark_vendor_free_text() -> None:
    qwen = FIXTURES["qwen-code"]["hooks"]
    [prompt] = mapped("qwen-code", qwen["UserPromptSubmit"]["input"])
    assert prompt["data"]["prompt"] == "refactor the auth module"
    [fail] = mapped("qwen-code", qwen["StopFailure"]["input"])
    assert fail["data"] == {"reason": "rate_limit", "error_details": "retry after 60s"}
    assert fail["_capture"] == {"error_details": "redacted"}
    [compact] = mapped("qwen-code", qwen["PostCompact"]["input"])
    assert compact["_capture"] == {"compact_summary": "redacted"}
    at_redacted = cap_draft(compact, CapturePolicy(ceiling="redacted"))["data"]
    assert at_redacted == {"trigger": "auto", "compact_summary": "squeezed the transcript"}
    [start] = mapped("codex", FIXTURES["codex"]["hooks"]["SessionStart"]["input"])
    assert start["data"]["cwd"] == "/home/user/proj"
    [vs] = mapped("vscode", FIXTURES["vscode"]["hooks"]["PreCompact"]["input"])
    assert vs["_capture"] == {"custom_instructions": "redacted"}


@pytest.mark.parametrize("agent", ["codex", "qwen-code"])
def test_permission_prompt_degrades_at_a_metadata_attention_ceiling(agent: str) -> None:
    entry = FIXTURES[agent]["hooks"]["PermissionRequest"]
    [d] = MappingProcessor()([Signal(agent, "PermissionRequest", entry["input"])])
    gated = cap_draft(d, CapturePolicy(overrides={"attention": "metadata"}))
    assert gated["data"]["prompt"] == f"{agent} requests permission: {entry['expected']['subject']}"


# --- fallback, dispatch, odd shapes --------------------------------------------------------------

ALL = {**VENDORS, "claude-code": claude_code}


@pytest.mark.parametrize("name,segment", [("SomeFutureHook", "some_future_hook"), ("weird-Name 2", "weird_name_2"),
                                          ("ALLCAPS", "allcaps"), ("", "unnamed")])
@pytest.mark.parametrize("agent", sorted(ALL))
def test_unknown_hook_falls_back_per_vendor(agent: str, name: str, segment: str) -> None:
    mod = ALL[agent]
    [d] = mod.map_signal(Signal(agent, "other", {"hook_event_name": name, "session_id": "s"}), mod.new_state())
    if name == "":  # an empty hook_event_name is not a name: the receiver's name is used
        assert d["type"] == f"x.{agent}.session.other"
    else:
        assert d["type"] == f"x.{agent}.session.{segment}"
    assert d["data"] == {} and TYPE_RE.match(d["type"]) and d["session"] == "s"


@pytest.mark.parametrize("agent", sorted(ALL))
def test_the_mapping_processor_dispatches_each_vendor(agent: str) -> None:
    out = MappingProcessor()([Signal(agent, "Stop", {"hook_event_name": "Stop", "session_id": "s"})])
    assert len(out) == 1 and out[0]["agent"] == agent and out[0]["type"].startswith(("run.", "x."))


ODD_VALUES: list[Any] = [None, "text", 0, False, [], [{"a": 1}], {"deep": {"er": []}}]
ODD_KEYS = ("session_id", "turn_id", "tool_name", "tool_use_id", "tool_input", "tool_response", "source", "model",
            "prompt", "error", "error_details", "is_interrupt", "agent_id", "agent_type", "trigger",
            "notification_type", "message", "todo_id", "todo_content", "phase", "llm_request", "input_tokens",
            "permission_mode", "compact_summary", "custom_instructions")


def odd_cases() -> list[tuple[str, str]]:
    cases = []
    for agent, mod in VENDORS.items():
        names = set(mod.HOOKS) | {e["input"]["hook_event_name"] for e in FIXTURES[agent]["hooks"].values()}
        cases += [(agent, name) for name in sorted(names)]
    return cases


@pytest.mark.parametrize("odd", ODD_VALUES, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("agent,name", odd_cases(), ids=[f"{a}:{n}" for a, n in odd_cases()])
def test_odd_field_types_degrade(agent: str, name: str, odd: Any) -> None:
    payload = {"hook_event_name": name, **{k: odd for k in ODD_KEYS}}
    for d in mapped(agent, payload):
        assert TYPE_RE.match(d["type"]) and isinstance(d["data"], dict)
        assert d["session"] is None or isinstance(d["session"], str)
        assert isinstance(d.get("run", ""), str)
        cap_draft(d, CapturePolicy())


@pytest.mark.parametrize("agent", sorted(VENDORS))
@pytest.mark.parametrize("payload", [None, "text", 3, ["x"]], ids=repr)
def test_a_payload_that_is_not_an_object_degrades(agent: str, payload: Any) -> None:
    [d] = mapped(agent, payload, name="SomeFutureHook")
    assert d == {"type": f"x.{agent}.session.some_future_hook", "data": {}, "session": None}


def test_a_string_tool_input_is_digest_only() -> None:
    [d] = mapped("qwen-code", {"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash",
                               "tool_use_id": "t", "tool_input": "rm -rf /"})
    assert d["data"] == {"tool": {"name": "Bash", "call_id": "t"}, "args_digest": digest("rm -rf /")}
    [p] = mapped("qwen-code", {"hook_event_name": "PermissionRequest", "session_id": "s", "tool_name": "Bash",
                               "tool_input": "rm -rf /"})
    assert p["data"]["prompt"] == "Permission requested: Bash"


# --- the shared pieces ---------------------------------------------------------------------------


@pytest.mark.parametrize("tool_input,expected", [
    ({"command": "ls", "description": "list"}, ("ls", "list")),
    ({"file_path": "/a", "command": "x"}, ("x", None)),
    ({"url": "https://e.x"}, ("https://e.x", None)),
    ({"description": "only why"}, (None, "only why")),
    ({"command": 5}, (None, None)),
    ("rm", (None, None)),
    (None, (None, None)),
])
def test_permission_detail(tool_input: Any, expected: tuple[str | None, str | None]) -> None:
    assert hf.permission_detail(tool_input) == expected


def test_map_table_keeps_agent_scoped_drafts_out_of_sessions_and_runs() -> None:
    table: dict[str, hf.Handler] = {"Idle": lambda p, s: draft("agent.idle", {}),
                                    "Two": lambda p, s: [draft("run.finished"), draft("progress.status")]}
    [idle] = hf.map_table("v", table, "Idle", {"session_id": "s"}, run="r")
    assert idle == {"type": "agent.idle", "data": {}}
    assert [(d["session"], d["run"]) for d in hf.map_table("v", table, "Two", {"session_id": "s"}, run="r")] == [
        ("s", "r"), ("s", "r")]


def test_merge_capture_marks_only_present_fields() -> None:
    d = hf.merge_capture(draft("run.failed", {"reason": "x", "a": {"b": "t"}}), **{"a.b": "redacted", "zz": "redacted"})
    assert d["_capture"] == {"a.b": "redacted"}
    assert "_capture" not in hf.merge_capture(draft("run.failed", {"reason": "x"}), zz="redacted")


def test_the_vendors_reuse_the_shared_handlers() -> None:
    for mod in (claude_code, codex, qwen_code, vscode):
        assert mod.HOOKS["PreToolUse"] is hf.tool_requested
        assert mod.HOOKS["PostToolUse"] is hf.tool_completed
    for mod in (codex, qwen_code):
        assert mod.HOOKS["PermissionRequest"] is hf.permission_request
    assert qwen_code.HOOKS["PostToolUseFailure"] is claude_code.HOOKS["PostToolUseFailure"] is hf.tool_use_failure


def test_qwen_repeated_prompt_submit_continues_the_open_run() -> None:
    # Qwen Code 0.24.4 (live tier): after a tool result it fires UserPromptSubmit again with
    # prompt "" and the same prompt_id; that is the open run continuing, not a second run.
    state = qwen_code.new_state()

    def fire(name: str, **kw: Any) -> list[str]:
        body = {"hook_event_name": name, "session_id": "s", **kw}
        return [d["type"] for d in qwen_code.map_signal(Signal("qwen-code", name, body), state)]

    assert fire("UserPromptSubmit", prompt="go", prompt_id="s####0") == ["run.started"]
    assert fire("PostToolUse", tool_name="x", tool_use_id="c") == ["tool.completed"]
    assert fire("UserPromptSubmit", prompt="", prompt_id="s####0") == []
    assert fire("Stop") == ["run.finished"]
    # After Stop the same id opens a run again; a new prompt id always does.
    assert fire("UserPromptSubmit", prompt="", prompt_id="s####0") == ["run.started"]
    assert fire("UserPromptSubmit", prompt="next", prompt_id="s####1") == ["run.started"]
    assert fire("UserPromptSubmit", prompt="no id") == ["run.started"]
    assert fire("UserPromptSubmit", prompt="no id") == ["run.started"]


@pytest.mark.parametrize("agent", ["claude-code", "qwen-code"])
def test_post_tool_use_keeps_duration_ms(agent: str) -> None:
    # Claude Code 2.1.328 and Qwen Code 0.24.4 send duration_ms on PostToolUse (live tier).
    body = {"hook_event_name": "PostToolUse", "session_id": "s", "tool_name": "Bash", "tool_use_id": "c",
            "tool_response": {"stdout": "hi"}, "duration_ms": 72}
    mod = {"claude-code": claude_code, "qwen-code": qwen_code}[agent]

    def one(payload: dict[str, Any]) -> dict[str, Any]:
        [d] = mod.map_signal(Signal(agent, "PostToolUse", payload), mod.new_state())
        return d

    d = one(body)
    assert d["type"] == "tool.completed" and d["data"]["duration_ms"] == 72
    assert "duration_ms" not in one({**body, "duration_ms": -1})["data"]
    assert "duration_ms" not in one({**body, "duration_ms": True})["data"]


@pytest.mark.parametrize("agent", ["vscode", "kimi-code"])
def test_a_held_pretooluse_card_takes_the_receivers_key_and_options(agent: str) -> None:
    # The gate is the receiver's: it holds the card under its key and applies the answer against
    # its options, so both reach the mapping on the held Signal.
    mod = load_vendor(agent)
    options = [{"id": "go", "label": "Go"}, {"id": "stop", "label": "Stop"}]
    payload = {"hook_event_name": "PreToolUse", "session_id": "s1", "tool_name": "Bash",
               "tool_input": {"command": "ls"}, "tool_use_id": "c1", "tool_call_id": "c1"}
    held = Signal(agent, "PreToolUse", payload, hold="gate:c1@1", options=options)
    (card,) = [d for d in mod.map_signal(held, mod.new_state()) if d["type"] == "attention.requested"]
    assert card["_attention_key"] == "gate:c1@1" and card["data"]["options"] == options
    assert card["data"]["respond_via"] == ["control"] and card["session"] == "s1"
    unheld = Signal(agent, "PreToolUse", payload)
    assert not [d for d in mod.map_signal(unheld, mod.new_state()) if d["type"] == "attention.requested"]
