"""The capture fast paths decide as the steps they skip would (issue 16).

``apply_cap`` keeps, per route, whether the type's annotations declare any ``_redacted`` twin and
skips the twin walk when none is declared; the walk would have returned an equal copy. Routes of
drafts with neither a hint nor a declared level are kept under the type alone. Over every corpus
payload (``tests.test_capture_plan.PAYLOADS``) both are held to the general path.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aep_collector.processors.capture import ceiling
from aep_collector.processors.capture.redact import Redactor

from tests.test_capture_plan import HOME, PAYLOADS


def test_no_declared_twin_means_the_twin_walk_changes_nothing() -> None:
    make = Redactor(home=HOME).value
    skipped = walked = 0
    for event_type, hint, data in PAYLOADS:
        ann, _plan = ceiling._merged(event_type, hint, data)
        twinned = ceiling._twins(copy.deepcopy(data), "", ann, make)
        if ceiling._declares_twins(ann):
            walked += 1
        else:
            assert twinned == data, event_type
            skipped += 1
    assert skipped and walked  # both sides of the switch are exercised by the corpus


@pytest.mark.parametrize("level", range(len(ceiling.LEVELS)), ids=ceiling.LEVELS)
def test_routes_kept_under_the_type_equal_deciding_anew(level: int) -> None:
    """A route table shared by hinted, declared and plain drafts of the same types caps each as
    ``cap_draft`` does with no routes, and keeps the plain drafts' routes under the bare type."""
    policy = ceiling.CapturePolicy(ceiling=ceiling.LEVELS[level], overrides={"attention": "redacted"})
    detector = Redactor(home=HOME)
    routes: dict[Any, Any] = {}
    for _ in range(2):
        for event_type, hint, data in PAYLOADS:
            for declared, with_hint in ((None, False), (None, True), ("metadata", False)):
                draft: dict[str, Any] = {"type": event_type, "agent": "codex", "session": "s1", "data": copy.deepcopy(data)}
                if with_hint and hint is not None:
                    draft["_capture"] = dict(hint)
                if declared is not None:
                    draft["capture"] = declared
                want = ceiling.cap_draft(copy.deepcopy(draft), policy, detector)
                assert ceiling.apply_cap(draft, policy, detector, routes) == want, (event_type, declared, with_hint)
    plain = {t for t, _, _ in PAYLOADS if not t.startswith("message.")}
    assert plain <= set(routes)
