"""The event validator: golden events pass, every invalid case fails for its own stated rule."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline.validate import (
    RULES,
    Problem,
    StreamValidator,
    envelope_errors,
    event_errors,
    main_validate_events,
    validate_file,
    validate_lines,
)

from tests.conftest import FIXTURES, corpus

GOLDEN_PATH = FIXTURES / "golden" / "golden.jsonl"
if not GOLDEN_PATH.exists():
    raise FileNotFoundError(f"AEP golden corpus not found at {GOLDEN_PATH}; set AEP_CONFORMANCE_DIR")
GOLDEN_LINES = GOLDEN_PATH.read_text(encoding="utf-8").splitlines()
GOLDEN: list[dict[str, Any]] = [json.loads(line) for line in GOLDEN_LINES]
CASES: list[dict[str, Any]] = corpus("invalid/cases.json")["cases"]  # type: ignore[index]

# The rule token each invalid case must be rejected for, read from the case's name and `rule`.
EXPECTED = {
    "session-scoped without session": "scope",
    "session-scoped without seq": "scope",
    "agent-scoped with session": "scope",
    "agent-scoped with seq": "scope",
    "command with seq": "scope",
    "attention.routed with seq": "scope",
    "single-segment type": "type",
    "unknown category": "category",
    "uppercase in type": "type",
    "vendor type too short (x.vendor.verb)": "type",
    "extension attribute name over 20 chars": "extension-name",
    "extension attribute with object value": "extension-value",
    "extension attribute name with illegal charset": "extension-name",
    "unknown severity": "severity",
    "malformed traceparent": "traceparent",
    "unsupported envelope version": "version",
    "negative seq": "attribute",
    "form select field without choices": "payload",
    "form answered with a non-choice string for a select without other:true": "form-values",
    "second run terminal (finished then cancelled)": "run-terminal",
    "run terminal repeated (failed twice, distinct events)": "run-terminal",
    "session ends with a dangling attention request": "attention-dangling",
    "id collision within one emitter (same (source,id), different content)": "id-collision",
    "seq regression without an epoch bump": "seq-regression",
    "epoch regression": "epoch-regression",
    "second ack for one command (accepted twice, distinct events)": "ack-decision",
    "conflicting ack decisions for one command (accepted then rejected)": "ack-decision",
    "second session.ended for one session (distinct events)": "session-ended",
    "agent.presence with an unregistered state": "payload",
    "agent.presence missing the required state": "payload",
    "agent.health with an unregistered status": "payload",
    "session.compacted with a non-integer token count": "payload",
    "state.delta with a non-array delta": "payload",
    "run.finished cost missing the required currency": "payload",
    "tool.completed cost total is a string (amounts are numbers, not bare-float strings)": "payload",
}


def _refs(text: str) -> set[tuple[str, str | None]]:
    """Spec references in a citation: ``AEP-0002 §4.2/§5 (AEP-0006)`` -> {(0002,4.2),(0002,5),(0006,None)}."""
    refs: set[tuple[str, str | None]] = set()
    for chunk in text.split("AEP-")[1:]:
        doc = chunk[:4]
        sections = re.findall(r"§([0-9]+(?:\.[0-9]+)*)", chunk)
        refs.update((doc, s) for s in sections) if sections else refs.add((doc, None))
    return refs


def _same_section(ours: str, theirs: str) -> bool:
    """True when two citations share a document and one section contains the other."""
    for doc, mine in _refs(ours):
        for other_doc, other in _refs(theirs):
            if doc != other_doc:
                continue
            if mine is None or other is None or mine == other:
                return True
            if other.startswith(mine + ".") or mine.startswith(other + "."):
                return True
    return False


def _stream(events: list[dict[str, Any]]) -> list[Problem]:
    validator = StreamValidator()
    problems = [p for ev in events for p in validator.feed(ev)]
    return problems + validator.finish()


def _golden(event_id: str) -> dict[str, Any]:
    return copy.deepcopy(next(ev for ev in GOLDEN if ev["id"] == event_id))


def _first(etype: str) -> dict[str, Any]:
    return copy.deepcopy(next(ev for ev in GOLDEN if ev["type"] == etype))


# --------------------------------------------------------------------------------- golden corpus


def test_golden_corpus_has_its_64_events() -> None:
    assert len(GOLDEN) == 64


@pytest.mark.parametrize("event", GOLDEN, ids=[f"{i}-{ev['type']}" for i, ev in enumerate(GOLDEN)])
def test_golden_event_is_valid(event: dict[str, Any]) -> None:
    assert event_errors(event) == []


def test_golden_stream_is_valid() -> None:
    assert _stream(GOLDEN) == []


def test_golden_file_is_valid() -> None:
    report = validate_file(GOLDEN_PATH)
    assert report.ok and report.count == 64 and report.problems == []
    assert report.render().endswith("64 lines, valid")


def test_golden_traps_pass_only_because_state_is_keyed_by_source() -> None:
    # The golden stream deliberately reuses an id and a session name across two emitters, and
    # restarts a seq counter under a new epoch: legal, but exactly what bare-id or bare-session
    # keying would flag. Moving the second of each pair onto the first's source must be caught.
    dup_a, dup_b = (ev for ev in GOLDEN if ev["id"] == "01JX9YBXDUPID000000000GOLD")
    assert dup_a["source"] != dup_b["source"]
    assert [p.rule for p in _stream([dup_a, {**dup_b, "source": dup_a["source"]}])] == ["id-collision"]

    shared_a, shared_b = (ev for ev in GOLDEN if ev.get("session") == "s_shared")
    assert shared_a["source"] != shared_b["source"] and shared_a["seq"] == shared_b["seq"] == 0
    assert [p.rule for p in _stream([shared_a, {**shared_b, "source": shared_a["source"]}])] == [
        "seq-regression"
    ]

    epochs = [ev for ev in GOLDEN if ev.get("session") == "s_epoch"]
    assert [(ev.get("epoch"), ev["seq"]) for ev in epochs] == [(0, 0), (0, 1), (1, 0)]
    assert [p.rule for p in _stream([*epochs[:2], {**epochs[2], "epoch": 0}])] == ["seq-regression"]


# --------------------------------------------------------------------------------- invalid corpus


def test_expected_table_names_every_invalid_case() -> None:
    assert sorted(EXPECTED) == sorted(c["name"] for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_invalid_case_is_rejected_for_its_stated_rule(case: dict[str, Any]) -> None:
    expected = EXPECTED[case["name"]]
    assert _same_section(RULES[expected], case["rule"]), (RULES[expected], case["rule"])
    if "event" in case:
        problems = event_errors(case["event"])
    else:
        # A stream case: every event is valid alone, only the sequence breaks the rule.
        assert [event_errors(ev) for ev in case["events"]] == [[] for _ in case["events"]]
        problems = _stream(case["events"])
    assert {p.rule for p in problems} == {expected}, problems


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_invalid_case_is_rejected_as_jsonl(case: dict[str, Any]) -> None:
    events = case.get("events") or [case["event"]]
    report = validate_lines(json.dumps(ev) + "\n" for ev in events)
    assert not report.ok and report.count == len(events)
    assert {f.problem.rule for f in report.problems} == {EXPECTED[case["name"]]}
    # Stream problems land on the line that breaks the rule: the last event of each case.
    assert {f.line for f in report.problems} == {len(events)}


# --------------------------------------------------------------------------------- mutations


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda ev: ev.pop(key)


def _put(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda ev: ev.__setitem__(key, value)


def _put_data(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(ev: dict[str, Any]) -> None:
        *parents, leaf = path.split("/")
        node = ev["data"]
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value

    return mutate


_DELETE = object()
TC = "01JX9YB3P4T90000000000GOLD"  # tool.completed, every optional attribute set
CANCEL = "01JX9YBSCCL00000000000GOLD"  # control.cancel
ROUTED = "01JX9YB5RT000000000000GOLD"  # attention.routed
ACK = "01JX9YB7ACK00000000000GOLD"  # control.accepted
PRESENCE = "01JX9YBCPRS0000000000GOLD1"  # agent.presence
REQUEST = "01JX9YB4RQ000000000000GOLD"  # attention.requested (permission)
CITE = "01JX9YCSRESRCCITEGOLD"  # resource.citation.recorded

# (name, golden event id, mutation, expected [(rule, path)]; [] means the mutation stays valid)
MUTATIONS: list[tuple[str, str, Callable[[dict[str, Any]], None], list[tuple[str, str]]]] = [
    ("no aep", TC, _drop("aep"), [("required", "/aep")]),
    ("no id", TC, _drop("id"), [("required", "/id")]),
    ("no time", TC, _drop("time"), [("required", "/time")]),
    ("no source", TC, _drop("source"), [("required", "/source")]),
    ("no agent", TC, _drop("agent"), [("required", "/agent")]),
    ("aep 0.1.0", TC, _put("aep", "0.1.0"), [("version", "/aep")]),
    ("aep as a number", TC, _put("aep", 0.1), [("version", "/aep")]),
    ("empty id", TC, _put("id", ""), [("attribute", "/id")]),
    ("numeric agent", TC, _put("agent", 7), [("attribute", "/agent")]),
    ("empty run", TC, _put("run", ""), [("attribute", "/run")]),
    ("null subject", TC, _put("subject", None), [("null", "/subject")]),
    ("null extension", TC, _put("acmeregion", None), [("null", "/acmeregion")]),
    ("type with a trailing newline", TC, _put("type", "tool.completed\n"), [("type", "/type")]),
    ("type with an empty segment", TC, _put("type", "tool..completed"), [("type", "/type")]),
    ("type not a string", TC, _put("type", ["tool.completed"]), [("type", "/type")]),
    ("vendor type with uppercase vendor", TC, _put("type", "x.Acme.tool.ran"), [("type", "/type")]),
    ("unknown category", TC, _put("type", "banana.split"), [("category", "/type")]),
    ("unregistered member of a known category", TC, _put("type", "tool.some_future_member"), []),
    ("legal vendor type", TC, _put("type", "x.acme-co.tool.ran"), []),
    ("time without offset", TC, _put("time", "2026-07-03T10:15:04.221"), [("time", "/time")]),
    ("time with a space", TC, _put("time", "2026-07-03 10:15:04Z"), [("time", "/time")]),
    ("time on a day that does not exist", TC, _put("time", "2026-02-29T00:00:00Z"), [("time", "/time")]),
    ("time at hour 24", TC, _put("time", "2026-07-03T24:00:00Z"), [("time", "/time")]),
    ("time with a colonless offset", TC, _put("time", "2026-07-03T10:15:04+0100"), [("time", "/time")]),
    ("time with non-ASCII digits", TC, _put("time", "\u0662026-07-03T10:15:04Z"), [("time", "/time")]),
    ("time as epoch seconds", TC, _put("time", 1751537704), [("time", "/time")]),
    ("time with an offset", TC, _put("time", "2026-07-03T15:45:04.221+05:30"), []),
    ("time lowercase t and z, leap day", TC, _put("time", "2028-02-29t10:15:04z"), []),
    ("time at a leap second", TC, _put("time", "2016-12-31T23:59:60Z"), []),
    ("relative source", TC, _put("source", "host-a/agent/claude-code"), [("source", "/source")]),
    ("source with a space", TC, _put("source", "aep://host a/agent/x"), [("source", "/source")]),
    ("source with a bad escape", TC, _put("source", "aep://h/agent/%zz"), [("source", "/source")]),
    ("source with two fragments", TC, _put("source", "aep://h/a#b#c"), [("source", "/source")]),
    ("empty source", TC, _put("source", ""), [("source", "/source")]),
    ("urn source", TC, _put("source", "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66"), []),
    ("source with an IPv6 host", TC, _put("source", "aep://[::1]:4318/agent/x"), []),
    ("negative seq", TC, _put("seq", -1), [("attribute", "/seq")]),
    ("boolean seq", TC, _put("seq", True), [("attribute", "/seq")]),
    ("float seq", TC, _put("seq", 3.0), [("attribute", "/seq")]),
    ("string seq", TC, _put("seq", "3"), [("attribute", "/seq")]),
    ("negative epoch", TC, _put("epoch", -1), [("attribute", "/epoch")]),
    ("unknown severity", TC, _put("severity", "INFO"), [("severity", "/severity")]),
    ("unknown capture", TC, _put("capture", "all"), [("capture", "/capture")]),
    (
        "uppercase traceparent",
        TC,
        _put("traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"),
        [("traceparent", "/traceparent")],
    ),
    ("data an array", TC, _put("data", []), [("attribute", "/data")]),
    ("extension with an underscore", TC, _put("acme_region", "eu"), [("extension-name", "/acme_region")]),
    ("internal hint leaked", TC, _put("_hold", "h1"), [("extension-name", "/_hold")]),
    ("extension of 21 chars", TC, _put("a" * 21, "v"), [("extension-name", "/" + "a" * 21)]),
    ("float extension", TC, _put("acmeratio", 1.5), [("extension-value", "/acmeratio")]),
    ("array extension", TC, _put("acmelist", [1]), [("extension-value", "/acmelist")]),
    ("boolean and integer extensions", TC, lambda ev: ev.update(acmeflag=True, acmecount=3), []),
    ("agent event with run", PRESENCE, _put("run", "r1"), [("scope", "/run")]),
    ("agent event with step", PRESENCE, _put("step", "s1"), [("scope", "/step")]),
    ("session event without session", TC, _drop("session"), [("scope", "/session")]),
    ("ack without seq", ACK, _drop("seq"), [("scope", "/seq")]),
    ("command without session", CANCEL, _drop("session"), [("scope", "/session")]),
    ("routed without session", ROUTED, _drop("session"), [("scope", "/session")]),
    ("routed with seq", ROUTED, _put("seq", 0), [("scope", "/seq")]),
    ("vendor command without seq", CANCEL, _put("type", "x.acme.control.halt"), []),
    ("vendor session event without seq", CANCEL, _put("type", "x.acme.session.noted"), [("scope", "/seq")]),
    ("tool without tool", TC, _put_data("tool", _DELETE), [("payload", "/data/tool")]),
    ("tool name not a string", TC, _put_data("tool/name", 1), [("payload", "/data/tool/name")]),
    ("negative duration", TC, _put_data("duration_ms", -5), [("payload", "/data/duration_ms")]),
    (
        "boolean token count",
        TC,
        _put_data("gen_ai.usage.input_tokens", True),
        [("payload", "/data/gen_ai.usage.input_tokens")],
    ),
    ("unknown attention kind", REQUEST, _put_data("kind", "nag"), [("payload", "/data/kind")]),
    (
        "option without label",
        REQUEST,
        _put_data("options/0/label", _DELETE),
        [("payload", "/data/options/0/label")],
    ),
    (
        "respond_via unknown channel",
        REQUEST,
        _put_data("respond_via", ["email"]),
        [("payload", "/data/respond_via/0")],
    ),
    ("presence detail is open", PRESENCE, _put_data("detail", "up"), []),
    (
        "citation with two offset variants",
        CITE,
        _put_data("citations/0/offset/char", {"start": 0}),
        [("payload", "/data/citations/0/offset")],
    ),
    (
        "citation without source",
        CITE,
        _put_data("citations/1/source", _DELETE),
        [("payload", "/data/citations/1/source")],
    ),
]


@pytest.mark.parametrize(
    ("event_id", "mutate", "expected"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_mutated_golden_event(
    event_id: str, mutate: Callable[[dict[str, Any]], None], expected: list[tuple[str, str]]
) -> None:
    event = _golden(event_id)
    assert event_errors(event) == []
    mutate(event)
    assert [(p.rule, p.path) for p in event_errors(event)] == expected


def test_cost_currency_must_be_an_iso_code() -> None:
    event = _golden("01JX9YCMOPTCOSTFULL0GOLD")
    event["data"]["cost"]["currency"] = "usd"
    assert [(p.rule, p.path) for p in event_errors(event)] == [("payload", "/data/cost/currency")]


def test_envelope_errors_ignores_payloads_and_rejects_non_objects() -> None:
    presence = _golden(PRESENCE)
    presence["data"]["state"] = "sleeping"
    assert envelope_errors(presence) == [] and [p.rule for p in event_errors(presence)] == ["payload"]
    assert [p.rule for p in envelope_errors(["not", "an", "object"])] == ["object"]


def test_every_rule_token_cites_the_spec() -> None:
    assert all(_refs(cite) or cite.startswith("RFC") for cite in RULES.values())
    assert Problem("scope", "/seq", "x").cite == RULES["scope"]


# --------------------------------------------------------------------------------- stream mutations


def _session(name: str) -> list[dict[str, Any]]:
    return [copy.deepcopy(ev) for ev in GOLDEN if ev.get("session") == name]


def test_byte_identical_redelivery_is_not_a_second_decision() -> None:
    main = _session("s_8f2c")
    ack, ended = _golden(ACK), _golden("01JX9YBWSND00000000000GOLD")
    # A re-ack and a redelivered session.ended are the same Events again: deduped, never judged twice.
    assert _stream([*main, ack, ended]) == []


def test_redelivered_id_with_other_content_collides() -> None:
    ack = _golden(ACK)
    changed = {**ack, "time": "2026-07-03T10:15:09.999Z"}
    assert [(p.rule, p.path) for p in _stream([ack, changed])] == [("id-collision", "/id")]


def test_same_id_json_with_other_key_order_is_the_same_event() -> None:
    ack = _golden(ACK)
    reordered = dict(reversed(list(ack.items())))
    assert _stream([ack, reordered]) == []
    # ...but 5 and 5.0 are different content on the wire.
    assert [p.rule for p in _stream([ack, {**ack, "seq": 5.0}])] == ["id-collision"]


def test_second_ack_decision_under_a_new_id() -> None:
    events = _session("s_8f2c")[:8]
    reack = {**_golden(ACK), "id": "REACK", "seq": 50, "type": "control.rejected", "data": {"reason": "busy"}}
    assert [(p.rule, p.path) for p in _stream([*events, reack])] == [("ack-decision", "/cause")]


def test_acks_are_per_session() -> None:
    ack = _golden(ACK)
    other = {
        **ack,
        "id": "ACK-ELSEWHERE",
        "session": "s_other",
        "source": "aep://host-a/agent/claude-code/session/s_other",
    }
    assert _stream([ack, other]) == []


def test_second_session_ended_under_a_new_id() -> None:
    events = _session("s_opt")
    again = {**events[-1], "id": "SECOND-END", "seq": 99}
    assert [p.rule for p in _stream([*events, again])] == ["session-ended"]


def test_run_terminal_repeated_across_epochs() -> None:
    events = _session("s_epoch")
    late = {**events[-1], "id": "LATE-CANCEL", "type": "run.cancelled", "seq": 1, "data": {"by": "user"}}
    assert [p.rule for p in _stream([*events, late])] == ["run-terminal"]


def test_position_reuse_is_a_seq_regression() -> None:
    first, second = _session("s_opt")[:2]
    twin = {**second, "id": "TWIN"}
    problems = _stream([first, second, twin])
    assert [p.rule for p in problems] == ["seq-regression"] and "reuses the position" in problems[0].message


def test_gaps_are_legal() -> None:
    first, second = _session("s_opt")[:2]
    assert _stream([first, {**second, "seq": 40}]) == []


def test_attention_left_pending_at_session_end() -> None:
    timeout = "01JX9YBRATO00000000000GOLD"
    events = [ev for ev in _session("s_8f2c") if ev["id"] != timeout]
    problems = _stream(events)
    assert [(p.rule, p.path) for p in problems] == [("attention-dangling", "/type")]
    assert "01JX9YBQARQ20000000000GOLD" in problems[0].message


def _form_answer(values: dict[str, Any], capture: str = "redacted") -> list[Problem]:
    request, answered = _session("s_form")[:2]
    answered["data"]["answer"]["values"] = values
    answered["capture"] = capture
    assert event_errors(answered) == []
    return _stream([request, answered])


def test_form_answers_against_the_request_fields() -> None:
    good = {"name": "billing-api", "staged": True, "regions": ["1", "3"], "db": "MariaDB"}
    assert _form_answer(good) == []
    cases = {
        "regions": ({**good, "regions": ["1", "9"]}, "/data/answer/values/regions"),  # not a choice id
        "regions-shape": ({**good, "regions": "1"}, "/data/answer/values/regions"),  # multi takes an array
        "staged": ({**good, "staged": "yes"}, "/data/answer/values/staged"),
        "name": ({k: v for k, v in good.items() if k != "name"}, "/data/answer/values/name"),  # required
    }
    for label, (values, path) in cases.items():
        assert [(p.rule, p.path) for p in _form_answer(values)] == [("form-values", path)], label


def test_form_required_text_may_be_gated_out_below_redacted() -> None:
    # AEP-0002 §5.3: a string field's value needs redacted+, so a metadata answer legitimately lacks it.
    assert _form_answer({"staged": True, "regions": ["1"]}, capture="metadata") == []


def test_foreign_events_do_not_touch_the_owners_positions() -> None:
    events = _session("s_8f2c")
    assert any(ev["source"] != events[0]["source"] for ev in events)
    assert _stream(events) == []


# --------------------------------------------------------------------------------- files and CLI


def _write(tmp_path: Path, lines: list[str | bytes]) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines))
    return path


def test_file_with_a_torn_line_and_a_bad_event(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = json.loads(GOLDEN_LINES[2])
    bad["seq"] = -1
    path = _write(tmp_path, [GOLDEN_LINES[0], GOLDEN_LINES[1][:70], json.dumps(bad), GOLDEN_LINES[3]])

    report = validate_file(path)
    assert not report.ok and report.count == 4
    assert [(f.line, f.problem.rule, f.problem.path) for f in report.problems] == [
        (2, "json", ""),
        (3, "attribute", "/seq"),
    ]
    assert "torn" in report.problems[0].problem.message

    assert main_validate_events([str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2: [json]" in out and f"{path}:3: [attribute] /seq:" in out
    assert out.rstrip().endswith("invalid")


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_validate_events([str(GOLDEN_PATH)]) == 0
    assert capsys.readouterr().out.strip().endswith("64 lines, valid")
    assert main_validate_events([str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main_validate_events([str(tmp_path)]) == 2  # a directory is unreadable as a file
    assert main_validate_events([]) == 2  # usage error


def test_lines_that_are_not_events(tmp_path: Path) -> None:
    good = GOLDEN_LINES[0]
    lines: list[str | bytes] = [
        good,
        "",
        b"\xff\xfe not utf-8",
        '{"aep":"0.1","aep":"0.2"}',
        '{"seq": NaN}',
        "[1, 2]",
        "\t",
    ]
    report = validate_file(_write(tmp_path, lines))
    assert [(f.line, f.problem.rule) for f in report.problems] == [
        (2, "jsonl"),
        (3, "jsonl"),
        (4, "json"),
        (5, "json"),
        (6, "object"),
        (7, "jsonl"),
    ]
    assert "appears twice" in report.problems[2].problem.message


def test_validate_lines_accepts_str_lines_without_newlines() -> None:
    report = validate_lines(GOLDEN_LINES, name="golden")
    assert report.ok and report.count == 64 and report.render() == "golden: 64 lines, valid"
