"""The stamper's lane fast path against the stamper it replaced (``tests/stamp_reference.py``).

Both stamp the same drafts at the same instants: the corpus hook inputs mapped, run-tracked and
gated (what a hook delivers), and drafts for every branch the fast path leaves to the general one
(agent-scoped and command types, optionals, extensions, minted ids, odd types, evictions, ends).
Envelopes must match key for key and in key order (the JSONL bytes); ``id`` is the one field each
draws itself, so it is compared as a shape and for order instead.
"""

from __future__ import annotations

import json
import re

import orjson
import pytest
from aep_collector.pipeline.envelope import Stamper, StampError
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CaptureConfig, CaptureProcessor
from aep_collector.processors.mapping import MappingProcessor
from aep_collector.processors.runs import RunsProcessor

from tests.conftest import FIXTURES
from tests.stamp_reference import ReferenceStamper

ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
HOOK_VENDORS = ("codex", "qwen-code", "gemini-cli", "vscode")


def corpus_drafts(sessions: int = 5) -> list[dict]:
    """Every pinned hook input of the hook vendors, cycled over a few sessions, as gated drafts."""
    procs = [MappingProcessor(), RunsProcessor(), CaptureProcessor(CaptureConfig())]
    drafts = []
    for round_ in range(3):
        for agent in HOOK_VENDORS:
            fx = json.loads((FIXTURES / "mappings" / f"{agent}.json").read_text())
            for i, key in enumerate(sorted(fx["hooks"])):
                inp = fx["hooks"][key]["input"]
                if not isinstance(inp, dict):
                    continue
                payload = dict(inp)
                if "session_id" in payload:
                    payload["session_id"] = f"s-{(i + round_) % sessions}"
                batch: list = [Signal(agent, str(payload.get("hook_event_name", "hook")), payload)]
                for p in procs:
                    batch = p(batch)
                drafts.extend(d for d in batch if isinstance(d, dict))
    assert len(drafts) > 100
    return drafts


ODD_DRAFTS = [
    {"type": "run.started", "agent": "a", "session": "s"},  # no data, no capture
    {"type": "tool.requested", "agent": "a", "session": "s", "subject": 7, "run": 3, "data": {}},
    {"type": "tool.requested", "agent": "a", "session": "s", "subject": "", "run": "", "capture": "", "data": None},
    {"type": "tool.requested", "agent": "a", "session": 42, "data": {}},
    {"type": "tool.requested", "agent": "a", "session": "", "data": {}},
    {"type": "tool.requested", "agent": "a", "session": None, "subject": "x", "data": {}},
    {"type": "tool.requested", "agent": "a", "session": "s", "id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "data": {}},
    {"type": "tool.requested", "agent": "a", "session": "s", "id": "", "data": {}},
    {"type": "tool.requested", "agent": "a", "session": "s", "id": 5, "data": {}},
    {"type": "agent.idle", "agent": "a", "session": "s", "run": "r", "step": "1", "data": {}},
    {"type": "attention.routed", "agent": "a", "session": "s", "run": "r", "data": {}},
    {"type": "control.accepted", "agent": "a", "session": "s", "cause": "c1", "severity": "notice", "data": {}},
    {"type": "run.started", "agent": "a", "session": "s", "step": "2", "traceparent": "00-x", "acmeregion": "eu",
     "acmeratio": 1.5, "Bad": "x", "_hold": "h", "capture": "metadata", "data": {"k": 1}},
    {"type": "x.acme.thing.done", "agent": "b", "session": "s2", "data": {}},
    {"type": "session.ended", "agent": "a", "session": "s", "data": {}},
    {"type": "tool.completed", "agent": "a", "session": "s", "data": {}},  # resumes above the released counter
    {"type": "session.ended", "agent": "a", "session": "s", "subject": "bye", "run": "r", "capture": "full", "data": {}},
    {"type": "tool.completed", "agent": "a", "session": "s", "run": "r", "data": {}},
]


def stamp_both(drafts: list[dict], max_sessions: int = 100_000, tmp_path=None) -> None:
    new = Stamper(tmp_path / "new", "Host.Example", max_sessions=max_sessions)
    ref = ReferenceStamper(tmp_path / "ref", "Host.Example", max_sessions=max_sessions)
    ids = []
    for i, draft in enumerate(drafts):
        # Instants on the same and on new milliseconds and seconds, fixed for both stampers.
        now = 1_764_770_000.0 + i * 0.0007
        got, want = new.stamp(dict(draft), now=now), ref.stamp(dict(draft), now=now)
        assert list(got) == list(want), draft
        pre = draft.get("id")
        if isinstance(pre, str) and pre:
            assert got["id"] == want["id"] == pre
        else:
            assert ULID.match(got["id"])
            ids.append(got["id"])
            got, want = dict(got, id=""), dict(want, id="")
        assert orjson.dumps(got) == orjson.dumps(want), draft
        assert new.sessions == ref.sessions
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_corpus_drafts_stamp_as_before(tmp_path):
    stamp_both(corpus_drafts(), tmp_path=tmp_path)


def test_odd_drafts_stamp_as_before(tmp_path):
    stamp_both(ODD_DRAFTS * 3, tmp_path=tmp_path)


@pytest.mark.parametrize("max_sessions", [1, 2, 3])
def test_evictions_resume_as_before(tmp_path, max_sessions):
    """A small bound evicts on nearly every draft: resumed counters must land where they did."""
    drafts = corpus_drafts(sessions=7) + ODD_DRAFTS
    stamp_both(drafts, max_sessions=max_sessions, tmp_path=tmp_path)


REFUSED = [{"type": "Bad", "agent": "a", "session": "s"},
           {"type": "run.started", "session": "s"},
           {"type": "run.started", "agent": "", "session": "s"},
           {"type": "run.started", "agent": 3, "session": "s"},
           {"type": "run.started", "agent": ["a"], "session": "s"}]


@pytest.mark.parametrize("draft", REFUSED + [dict(d, capture="metadata", data={}) for d in REFUSED])
def test_refusals_as_before(tmp_path, draft):
    new, ref = Stamper(tmp_path / "n", "h"), ReferenceStamper(tmp_path / "r", "h")
    for s in (new, ref):
        s.stamp({"type": "run.started", "agent": "a", "session": "s"})  # the type's kind is cached
        with pytest.raises(StampError):
            s.stamp(dict(draft))
