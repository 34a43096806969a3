"""The compiled gating plan decides exactly as the reference walk (issue 16).

``cap_draft`` applies a plan compiled once per (type, hint); ``_prune`` walks the annotations
per key. Over every payload the corpus gives (the golden events, the downlevel cases, the drafts
the mapping pins produce) at every level, with and without the structure screen and the §9.4
redactor, the two must give the same data.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from aep_collector.processors.capture import ceiling
from aep_collector.processors.capture.redact import Redactor
from aep_collector.processors.mapping import MappingProcessor

from tests.conftest import FIXTURES, corpus
from tests.received import received

HOOK_VENDORS = ("codex", "qwen-code", "gemini-cli", "vscode")
HOME = "/nonexistent-home"


def payloads() -> list[tuple[str, Any, dict[str, Any]]]:
    """(type, _capture hint, data) of every corpus event and every draft a mapping pin produces."""
    out = []
    for line in (FIXTURES / "golden" / "golden.jsonl").read_text().splitlines():
        if line.strip():
            event = json.loads(line)
            out.append((event["type"], None, event.get("data")))
    for case in corpus("downlevel/cases.json")["cases"]:
        out.append((case["event"]["type"], None, case["event"].get("data")))
    mapping = MappingProcessor()
    for agent in HOOK_VENDORS:
        fixture = corpus(f"mappings/{agent}.json")
        for entry in [*fixture["hooks"].values(), fixture["fallback"]]:
            inp = entry["input"]
            for draft in mapping([received(agent, str(inp.get("hook_event_name", "hook")), copy.deepcopy(inp))]):
                if isinstance(draft, dict):
                    out.append((draft["type"], draft.get("_capture"), draft.get("data")))
    return [p for p in out if isinstance(p[2], dict)]


PAYLOADS = payloads()


def test_the_corpus_gives_enough_payloads_to_compare() -> None:
    assert len(PAYLOADS) >= 60
    assert any(hint is not None for _, hint, _ in PAYLOADS)  # the mapping hints are exercised too
    assert any(t.startswith("x.") for t, _, _ in PAYLOADS)


@pytest.mark.parametrize("level", range(len(ceiling.LEVELS)), ids=ceiling.LEVELS)
def test_plan_equals_reference_walk(level: int) -> None:
    detector = Redactor(home=HOME)
    red = detector.value if level == ceiling.REDACTED else None
    dropped = 0
    for event_type, hint, data in PAYLOADS:
        ann, plan = ceiling._merged(event_type, hint, data)  # cached: later payloads reuse the plan
        for screen in (None, ceiling._screen(level, detector)):
            want = ceiling._prune(data, "", ann, level, ceiling.NONE, red, scrub=level < ceiling.FULL, screen=screen)
            got = ceiling._apply(data, plan, level, red, level < ceiling.FULL, screen)
            assert got == want, (event_type, hint)
            # A fresh plan (nothing cached yet) and one out of budget decide the same.
            assert ceiling._apply(data, ceiling._plan_for(ann), level, red, level < ceiling.FULL, screen) == want
            starved = ceiling._Plan(ann, "", ceiling.NONE, [0])
            assert ceiling._apply(data, starved, level, red, level < ceiling.FULL, screen) == want
            dropped += got != data
    if level < ceiling.FULL:
        assert dropped > 0  # the comparison covers payloads the ceiling really changes


def test_plan_output_shares_no_container_with_the_input() -> None:
    data = {"a": {"b": [{"c": 1}]}, "d": [1, 2]}
    ann, plan = ceiling._merged("x.test.thing.happened", None, data)
    out = ceiling._apply(data, plan, ceiling.FULL, None, False, None)
    assert out == data
    assert out["a"] is not data["a"] and out["a"]["b"] is not data["a"]["b"] and out["d"] is not data["d"]


@pytest.mark.parametrize("level", range(len(ceiling.LEVELS)), ids=ceiling.LEVELS)
def test_the_processors_kept_routes_cap_as_cap_draft(level: int) -> None:
    """``apply_cap`` with a route table (the processor's) equals ``cap_draft`` deciding anew, whether
    the route is new or kept, for every corpus payload, its hint, a declared lower level and none."""
    policy = ceiling.CapturePolicy(ceiling=ceiling.LEVELS[level], overrides={})
    detector = Redactor(home=HOME)
    routes: dict[Any, Any] = {}
    for event_type, hint, data in PAYLOADS:
        for declared in (None, "metadata"):
            draft: dict[str, Any] = {"type": event_type, "agent": "codex", "session": "s1", "subject": "Bash",
                                     "data": copy.deepcopy(data)}
            if hint is not None:
                draft["_capture"] = dict(hint)
            if declared is not None:
                draft["capture"] = declared
            want = ceiling.cap_draft(copy.deepcopy(draft), policy, detector)
            for _ in range(2):  # the first call keeps the route, the second uses it
                assert ceiling.apply_cap(draft, policy, detector, routes) == want, (event_type, hint, declared)
    assert routes  # the routes were kept
