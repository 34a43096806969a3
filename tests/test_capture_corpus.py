"""The capture corpus: capture-gating, downlevel and redaction cases, every one of them."""

from __future__ import annotations

import copy
import json

import pytest
from aep_collector.processors.capture import Redactor, cap_form_values, downlevel

from tests.conftest import corpus

GATING = corpus("capture-gating/cases.json")["cases"]
DOWNLEVEL = corpus("downlevel/cases.json")["cases"]
REDACTION = corpus("redaction/cases.json")
# run.py's harness pins a home that cannot exist, so no case depends on the machine's user.
HARNESS_HOME = "/nonexistent-home"


def redactor_for(opts: dict) -> Redactor:
    known = {"home", "pii", "secretValues"}
    assert set(opts) <= known, f"case uses options this harness does not read: {set(opts) - known}"
    return Redactor(
        secret_values=opts.get("secretValues", ()),
        pii=opts.get("pii", True),
        home=opts.get("home", HARNESS_HOME),
    )


def assert_substrings(out: str, case: dict) -> None:
    for needle in case.get("must_not_contain", []):
        assert needle not in out, f"{needle!r} leaked: {out!r}"
    for needle in case.get("must_contain", []):
        assert needle in out, f"{needle!r} missing: {out!r}"


@pytest.mark.parametrize("case", GATING, ids=[c["name"] for c in GATING])
def test_cap_form_values(case: dict) -> None:
    assert cap_form_values(case["fields"], case["values"], case["ceiling"]) == case["expect"]


@pytest.mark.parametrize("case", DOWNLEVEL, ids=[c["event"]["id"] for c in DOWNLEVEL])
def test_downlevel(case: dict) -> None:
    event = copy.deepcopy(case["event"])
    out = downlevel(event, case["ceiling"])
    assert event == case["event"], "downlevel mutated its input"
    assert out["capture"] == case["expect_capture"]
    if case["expect_data"] is None:
        assert "data" not in out
    else:
        assert out["data"] == case["expect_data"]
    envelope = {k: v for k, v in out.items() if k not in ("data", "capture")}
    assert envelope == {k: v for k, v in case["event"].items() if k not in ("data", "capture")}


@pytest.mark.parametrize("case", REDACTION["text_cases"], ids=[c["name"] for c in REDACTION["text_cases"]])
def test_redact_text(case: dict) -> None:
    assert_substrings(redactor_for(case.get("opts", {})).text(case["input"]), case)


@pytest.mark.parametrize("case", REDACTION["value_cases"], ids=[c["name"] for c in REDACTION["value_cases"]])
def test_redact_value(case: dict) -> None:
    original = copy.deepcopy(case["input"])
    out = redactor_for(case.get("opts", {})).value(case["input"])
    assert case["input"] == original, "value() mutated its input"
    assert_substrings(json.dumps(out, ensure_ascii=False), case)


@pytest.mark.parametrize("values", [None, "text", ["a"]])
def test_cap_form_values_on_a_non_object_keeps_nothing(values: object) -> None:
    assert cap_form_values([{"id": "a", "type": "string", "label": "A"}], values, "full") == {}  # type: ignore[arg-type]
