"""The VS Code and Codex OTel-channel mappings, pinned by the corpus fixtures in both modes."""

from __future__ import annotations

from typing import Any

import pytest
from aep_collector.pipeline.envelope import TYPE_GRAMMAR, Stamper
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.validate import payload_errors
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.mapping import MappingProcessor, codex_otel, vscode_otel
from aep_collector.processors.runs import RunsProcessor
from aep_collector.receivers.otlp.identity import SESSION_FROM, session_of
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import corpus
from tests.received import received

FIXTURES = {"vscode-otel.json": vscode_otel, "codex-otel.json": codex_otel}
MODES = ("companion", "primary")
CORE_SUBSETS = {
    "vscode-otel.json": {"session.started", "tool.completed", "tool.failed"},
    "codex-otel.json": {"session.started", "tool.completed", "tool.failed", "tool.denied"},
}


def entries(fname: str) -> list[tuple[str, dict[str, Any]]]:
    doc = corpus(f"mappings/{fname}")
    return [*doc["records"].items(), ("unknown", doc["unknown"])]


def cases() -> list[Any]:
    return [pytest.param(fname, name, case, mode, id=f"{fname.split('.')[0]}:{name}:{mode}")
            for fname in FIXTURES for name, case in entries(fname) for mode in MODES]


def project(event: dict[str, Any]) -> dict[str, Any]:
    return {k: event[k] for k in ("type", "data", "subject") if k in event}


def expected(pin: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [] if pin is None else [{k: v for k, v in pin.items() if k != "$comment"}]


def pinned_session(fname: str, flat: dict[str, Any]) -> str:
    # The fixture's identity.session_from, read independently of the profile under test.
    rule = corpus(f"mappings/{fname}")["identity"]["session_from"]
    section, key = rule.split(":", 1) if ":" in rule else ("attribute", rule)
    return flat["resource" if section == "resource" else "attributes"][key]


def capped(drafts: list[dict[str, Any]], policy: CapturePolicy | None = None) -> list[dict[str, Any]]:
    return [cap_draft(d, policy or CapturePolicy()) for d in drafts]


@pytest.mark.parametrize("fname,name,case,mode", cases())
def test_fixture_record(fname: str, name: str, case: dict[str, Any], mode: str) -> None:
    mod = FIXTURES[fname]
    drafts = mod.map_signal(received(fname.removesuffix(".json"), "", case["input"], mode=mode))  # session: the receiver's
    out = capped(drafts)
    assert [project(e) for e in out] == expected(case[mode])
    for d, e in zip(drafts, out, strict=True):
        assert d["session"] == pinned_session(fname, case["input"])
        assert d["_runs"] == "none" and "run" not in d  # identity.run_from is null
        assert not payload_errors(e), payload_errors(e)
        if mode == "companion":
            assert d["type"].startswith(f"x.{mod.AGENT}.otel.")  # never a core type
        if fname.startswith("vscode"):
            assert d["type"] not in ("tool.denied", "session.ended")
        # Identity keys never reach data; the unknown fallback's event.name is the pinned exception.
        allowed = {"event.name"} if d["type"].endswith(".otel.unknown") else set()
        assert not (mod.PROFILE.identity_keys - allowed) & set(d["data"])


@pytest.mark.parametrize("fname", list(FIXTURES))
def test_primary_core_subset_is_exactly_the_designed_one(fname: str) -> None:
    mod = FIXTURES[fname]
    core = {d["type"] for _, case in entries(fname) for d in mod.map_record(case["input"], "primary")
            if not d["type"].startswith("x.")}
    assert core == CORE_SUBSETS[fname]


@pytest.mark.parametrize("fname,where", [("vscode-otel.json", ("resource", "session.id")),
                                         ("codex-otel.json", ("attributes", "conversation.id"))])
def test_identity_rule_matches_the_fixture(fname: str, where: tuple[str, str]) -> None:
    identity = corpus(f"mappings/{fname}")["identity"]
    assert identity["run_from"] is None
    # The receiver applies the rule (receivers/otlp/identity.py); its profile is the fixture's vendor.
    assert SESSION_FROM[fname.split("-")[0]][0] == where


def vscode(attrs: dict[str, Any], resource: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"resource": {"session.id": "vs1"} if resource is None else resource, "attributes": attrs, **extra}


def codex(attrs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"resource": {"host.name": "h"}, "attributes": {"conversation.id": "c1", **attrs}, **extra}


def test_vscode_session_falls_back_to_the_record_copy_of_session_id() -> None:
    flat = vscode({"event.name": "copilot_chat.session.start", "session.id": "rec1"}, resource={})
    (d,) = vscode_otel.map_signal(received("vscode-otel", "", flat))
    assert d["session"] == "rec1"
    assert "session.id" not in d["data"]


@pytest.mark.parametrize("mod,flat", [
    (vscode_otel, {"resource": {"service.name": "copilot-chat"},
                   "attributes": {"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "x"}}),
    (codex_otel, {"resource": {}, "attributes": {"event.name": "codex.api_request", "status": "200"}}),
], ids=["vscode", "codex"])
def test_a_record_without_session_maps_sessionless_and_lands_in_the_unknown_lane(mod: Any, flat: Any,
                                                                                tmp_path: Any) -> None:
    (d,) = mod.map_record(flat)
    assert "session" not in d and session_of(SESSION_FROM[mod.AGENT], flat) is None
    event = Stamper(tmp_path, host="h").stamp({**d, "agent": mod.AGENT})
    assert event["session"] == "unknown"


@pytest.mark.parametrize("mod,flat", [
    (vscode_otel, vscode({"gen_ai.tool.name": "x"})),
    (codex_otel, codex({"tool_name": "shell"})),
], ids=["vscode", "codex"])
def test_a_record_without_event_name_is_unknown_with_empty_data(mod: Any, flat: Any) -> None:
    for mode in MODES:
        (d,) = mod.map_record(flat, mode)
        assert (d["type"], d["data"]) == (f"x.{mod.AGENT}.otel.unknown", {})


def test_vscode_failure_without_error_type_synthesizes_tool_error() -> None:
    flat = vscode({"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "runInTerminal",
                   "success": False})
    (d,) = capped(vscode_otel.map_record(flat, "primary"))
    assert project(d) == {"type": "tool.failed", "data": {"tool": {"name": "runInTerminal"},
                                                          "error": {"type": "tool_error"}},
                          "subject": "runInTerminal"}


@pytest.mark.parametrize("attrs", [
    {"event.name": "copilot_chat.tool.call", "success": True},                 # no tool name
    {"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "readFile"},  # no outcome
    {"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "readFile", "success": "maybe"},
], ids=["no-name", "no-success", "odd-success"])
def test_vscode_tool_call_without_a_clear_outcome_stays_in_the_family_in_primary(attrs: dict[str, Any]) -> None:
    (d,) = vscode_otel.map_record(vscode(attrs), "primary")
    assert d["type"] == "x.vscode.otel.tool.call"


def test_vscode_genai_content_attributes_are_gated_at_redacted() -> None:
    flat = vscode({"event.name": "gen_ai.client.inference.operation.details",
                   "gen_ai.output.messages": "[{\"role\":\"assistant\"}]",
                   "gen_ai.system_instructions": "be brief", "gen_ai.usage.input_tokens": 4})
    drafts = vscode_otel.map_record(flat)
    (low,) = capped(drafts)
    assert low["data"] == {"gen_ai.usage.input_tokens": 4}
    (high,) = capped(drafts, CapturePolicy(ceiling="redacted"))
    assert high["data"]["gen_ai.system_instructions"] == "be brief"


def test_codex_prompt_needs_the_vendor_flag_and_a_redacted_ceiling() -> None:
    withheld = codex({"event.name": "codex.user_prompt", "prompt": "[REDACTED]", "prompt_length": "3"})
    for ceiling in ("metadata", "redacted", "full"):
        (d,) = capped(codex_otel.map_record(withheld), CapturePolicy(ceiling=ceiling))
        assert "prompt" not in d["data"]  # the vendor marker is never forwarded as a prompt
    given_prompt = codex({"event.name": "codex.user_prompt", "prompt": "fix the build", "prompt_length": "13"})
    (low,) = capped(codex_otel.map_record(given_prompt))
    assert low["data"] == {"prompt_length": "13"}
    (mid,) = capped(codex_otel.map_record(given_prompt), CapturePolicy(ceiling="redacted"))
    assert mid["data"]["prompt"] == "fix the build"


def test_codex_error_text_rides_as_error_message_above_metadata() -> None:
    flat = codex({"event.name": "codex.tool_result", "tool_name": "shell", "success": "false",
                  "duration_ms": "87", "error": "exit 1"})
    drafts = codex_otel.map_record(flat, "primary")
    (mid,) = capped(drafts, CapturePolicy(ceiling="redacted"))
    assert mid["data"]["error"] == {"type": "tool_error", "message": "exit 1"}
    assert "duration_ms" not in mid["data"]  # fixture tool_result_fail: no duration on codex failures


def test_codex_user_email_only_at_full() -> None:
    flat = codex({"event.name": "codex.api_request", "status": "200", "user.email": "dev@example.com"})
    drafts = codex_otel.map_record(flat)
    assert "user.email" not in capped(drafts, CapturePolicy(ceiling="redacted"))[0]["data"]
    assert capped(drafts, CapturePolicy(ceiling="full"))[0]["data"]["user.email"] == "dev@example.com"


@pytest.mark.parametrize("decision,source,expect", [
    ("deny", "automation", {"type": "tool.denied", "data": {"tool": {"name": "shell"}, "by": "runtime"},
                            "subject": "shell"}),
    ("denied", "config", {"type": "tool.denied", "data": {"tool": {"name": "shell"}, "by": "policy"},
                          "subject": "shell"}),
    ("denied", "user", None),
    ("approved", "config", "x"),
    ("deny", "somebody", "x"),
    ("deny", None, "x"),
])
def test_codex_tool_decision_in_primary(decision: str, source: str | None, expect: Any) -> None:
    attrs = {"event.name": "codex.tool_decision", "tool_name": "shell", "decision": decision}
    if source is not None:
        attrs["source"] = source
    out = [project(d) for d in capped(codex_otel.map_record(codex(attrs), "primary"))]
    if expect is None:
        assert out == []
    elif expect == "x":
        assert [d["type"] for d in out] == ["x.codex.otel.tool_decision"]
    else:
        assert out == [expect]


@pytest.mark.parametrize("duration,expect", [("412", 412), (412, 412), ("4.5", None), ("-3", None),
                                             (True, None), (None, None)])
def test_codex_tool_completed_duration_is_coerced_only_when_it_is_a_count(duration: Any, expect: Any) -> None:
    attrs = {"event.name": "codex.tool_result", "tool_name": "shell", "success": "true"}
    if duration is not None:
        attrs["duration_ms"] = duration
    (d,) = codex_otel.map_record(codex(attrs), "primary")
    assert d["type"] == "tool.completed"
    assert d["data"].get("duration_ms") == expect


@pytest.mark.parametrize("duration", ["\u00b2", "\u0661\u0662", "9" * 5000, "9223372036854775808"],
                         ids=["superscript", "arabic-indic", "5000-digits", "over-int64"])
@pytest.mark.parametrize("agent,attrs", [
    ("codex-otel", {"event.name": "codex.tool_result", "conversation.id": "c1", "tool_name": "shell",
                    "success": "true"}),
    ("vscode-otel", {"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "readFile", "success": True}),
], ids=["codex", "vscode"])
def test_a_duration_that_is_no_int64_count_is_left_out_not_a_mapping_failure(
        agent: str, attrs: dict[str, Any], duration: str) -> None:
    # str.isdigit() takes "\u00b2" (int() refuses it), int() refuses 4300+ digits: the record became
    # an error.raised in the unknown session instead of its tool.completed.
    processor = MappingProcessor()
    flat = {"resource": {"session.id": "s1"}, "attributes": {**attrs, "duration_ms": duration}}
    (d,) = processor([Signal(agent=agent, name=attrs["event.name"], payload=flat, mode="primary", session="s1")])
    assert processor.failures == 0
    assert (d["type"], d["session"]) == ("tool.completed", "s1") and "duration_ms" not in d["data"]


def test_codex_tool_output_is_carried_as_result_with_digest() -> None:
    attrs = {"event.name": "codex.tool_result", "tool_name": "shell", "success": "true", "output": "ok"}
    (d,) = codex_otel.map_record(codex(attrs), "primary")
    (low,) = capped([d])
    assert "result" not in low["data"] and low["data"]["result_digest"] == d["data"]["result_digest"]


def test_severity_and_traceparent_come_from_the_record() -> None:
    flat = vscode({"event.name": "copilot_chat.agent.turn"}, severity_number=17,
                  trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b7", flags=3)
    (d,) = vscode_otel.map_record(flat)
    assert d["severity"] == "error"
    assert d["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03"


@pytest.mark.parametrize("extra", [
    {"severity_number": 9, "trace_id": "0" * 32, "span_id": "00f067aa0ba902b7"},
    {"severity_number": 0, "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"},
    {"severity_number": 99, "trace_id": "xyz", "span_id": "abc"},
], ids=["info-zero-trace", "unset-no-span", "out-of-range-bad-hex"])
def test_default_severity_and_unusable_trace_ids_are_omitted(extra: dict[str, Any]) -> None:
    (d,) = vscode_otel.map_record(vscode({"event.name": "copilot_chat.agent.turn"}, **extra))
    assert "severity" not in d and "traceparent" not in d


@pytest.mark.parametrize("agent,module", [("vscode-otel", "vscode"), ("codex-otel", "codex")])
def test_the_mapping_processor_dispatches_the_receiver_key_to_the_profile(agent: str, module: str) -> None:
    fname = f"{agent}.json"
    name, case = entries(fname)[0]
    processor = MappingProcessor()
    primary = processor([Signal(agent=agent, name=name, payload=case["input"], mode="primary")])
    companion = processor([Signal(agent=agent, name=name, payload=case["input"])])  # default mode
    assert [d["agent"] for d in primary + companion] == [module, module]
    assert primary[0]["type"] == "session.started"
    assert companion[0]["type"].startswith(f"x.{module}.otel.")
    assert processor.failures == 0


def test_an_unrecognised_mode_degrades_to_companion() -> None:
    _, case = entries("codex-otel.json")[0]
    (d,) = codex_otel.map_signal(Signal(agent="codex-otel", name="x", payload=case["input"],
                                        mode="Primary"), codex_otel.new_state())
    assert d["type"] == "x.codex.otel.conversation_starts"


def test_run_synthesis_leaves_otel_drafts_without_a_run() -> None:
    _, case = entries("vscode-otel.json")[0]
    drafts = [{**d, "agent": "vscode"} for d in vscode_otel.map_record(case["input"], "primary")]
    out = RunsProcessor()(drafts)
    assert [d["type"] for d in out] == ["session.started"] and "run" not in out[0]


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                       max_leaves=12)
NAMES = st.sampled_from([*vscode_otel.PROFILE.known, *codex_otel.PROFILE.known, "other", ""]) | st.integers()


@settings(max_examples=300, deadline=None)
@given(name=NAMES, attrs=st.dictionaries(st.sampled_from(["success", "gen_ai.tool.name", "tool_name", "decision",
                                                          "source", "duration_ms", "model", "prompt", "error",
                                                          "conversation.id", "session.id", "output"]), JSONISH),
       resource=JSONISH, mode=st.sampled_from(MODES))
def test_odd_vendor_shapes_never_crash_and_always_yield_valid_types(name: Any, attrs: dict[str, Any],
                                                                    resource: Any, mode: str) -> None:
    flat = {"resource": resource, "attributes": {**attrs, "event.name": name}}
    for mod in FIXTURES.values():
        for d in mod.map_record(flat, mode):
            assert TYPE_GRAMMAR.match(d["type"])
            assert isinstance(d["data"], dict) and d["_runs"] == "none"
            cap_draft(d, CapturePolicy())
    for odd in (None, [], "x", {"attributes": ["not", "a", "dict"]}):
        for mod in FIXTURES.values():
            assert mod.map_record(odd, mode)[0]["type"] == f"x.{mod.AGENT}.otel.unknown"


def test_a_record_time_becomes_the_drafts_time_exactly_or_not_at_all() -> None:
    from aep_collector.processors.mapping.otlp_vendors import time_of

    assert time_of(1_783_073_704_310_000_000) == "2026-07-03T10:15:04.310Z"  # no float: .310 stays .310
    assert time_of(1_783_073_704_999_999_999) == "2026-07-03T10:15:04.999Z"  # cut, never rounded up
    assert time_of(1) == "1970-01-01T00:00:00.000Z"
    assert time_of(253402300799_999_000_000) == "9999-12-31T23:59:59.999Z"
    for odd in (0, -1, 253402300800 * 10**9, True, 1.5e18, "1783073704310000000", None):
        assert time_of(odd) is None, odd  # the stamper's own time then
    flat = {"resource": {"session.id": "s"}, "attributes": {"event.name": "copilot_chat.session.start"},
            "time_unix_nano": 1_783_073_704_221_000_000}
    (d,) = vscode_otel.map_record(flat, "companion")
    assert d["time"] == "2026-07-03T10:15:04.221Z"
    (d,) = vscode_otel.map_record({**flat, "time_unix_nano": 0}, "companion")
    assert "time" not in d
