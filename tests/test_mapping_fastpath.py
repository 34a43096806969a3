"""The mapping and run-synthesis fast paths give what the general paths give (issue 16).

Each fast path skips work only when the skipped work would change nothing; each test runs the
corpus hook inputs through the fast path and through the general path it shortcuts, and holds
the two outputs equal draft for draft.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from aep_collector.pipeline.model import Signal
from aep_collector.processors import runs as runs_module
from aep_collector.processors.mapping import MappingProcessor, codex, qwen_code
from aep_collector.processors.mapping import hook_vendors as hf
from aep_collector.processors.runs import RunsProcessor

from tests.conftest import corpus
from tests.received import received

AGENTS = ("codex", "qwen-code", "gemini-cli", "vscode")


def hook_inputs() -> list[tuple[str, dict[str, Any]]]:
    """(agent, hook input) of every pinned hook entry of the four hook vendors, in a fixed order."""
    out = []
    for agent in AGENTS:
        hooks = corpus(f"mappings/{agent}.json")["hooks"]
        out += [(agent, hooks[key]["input"]) for key in sorted(hooks) if isinstance(hooks[key]["input"], dict)]
    return out


class Counter:
    """Deterministic ids for the attention book, so two books mint the same ones."""

    def __init__(self) -> None:
        self.n = itertools.count()

    def new(self) -> str:
        return f"id{next(self.n)}"


def workload(rounds: int = 3) -> list[Signal]:
    """The corpus inputs over a few sessions, some held (hold, respond_via, expires_at set)."""
    out = []
    for i, (agent, inp) in enumerate(hook_inputs() * rounds):
        payload = dict(inp)
        if "session_id" in payload:
            payload["session_id"] = f"s{i % 3}"
        sig = received(agent, str(payload.get("hook_event_name", "hook")), payload, received_ns=i)
        if i % 4 == 0:
            sig.hold = f"h{i}"
            sig.respond_via = ["control"] if i % 8 == 0 else ["oob"]
            sig.expires_at = "2026-12-03T15:00:00Z"
        out.append(sig)
    return out


def processor() -> MappingProcessor:
    proc = MappingProcessor()
    proc.attention.ids = Counter()  # type: ignore[assignment]
    return proc


def through_the_book(proc: MappingProcessor, batch: list[Any]) -> list[Any]:
    """The general path written out: every draft through the attention book, then the rest."""
    drafts, rest = [], []
    for item in batch:
        if isinstance(item, Signal):
            drafts.extend(proc.map_one(item))
        elif isinstance(item, dict):
            drafts.append(item)
        else:
            rest.append(item)
    return proc.attention.apply(drafts) + rest


def test_single_signal_batches_equal_the_general_path():
    """A hook's one-signal batch skips the attention book when no draft is for it; the general
    path walks the book with every draft."""
    fast, general = processor(), processor()
    marker = object()
    skipped = 0
    for sig in workload():
        a = fast([sig])
        b = through_the_book(general, [sig, marker])
        assert b[-1] is marker
        assert a == b[:-1], sig.name
        skipped += not any("_attention_key" in d or d["type"] == "session.ended" for d in a)
    assert skipped  # the fast path was taken
    assert fast.attention.open.keys() == general.attention.open.keys() and fast.attention.open
    assert (fast.attention.orphans, fast.attention.invalid) == (general.attention.orphans, general.attention.invalid)


def test_batches_equal_the_general_path():
    """A batch of several signals (and drafts, and items it does not map) skips the attention book
    when no draft is for it, and walks it otherwise, as the general path does."""
    fast, general = processor(), processor()
    rng = random.Random(16)
    signals, marker = workload(), object()
    skipped = walked = 0
    at = 0
    while at < len(signals):
        n = rng.randint(1, 6)
        batch: list[Any] = list(signals[at:at + n])
        at += n
        if rng.random() < 0.3:
            batch.append(marker)
        if rng.random() < 0.2:  # a lifecycle leg a held control loop emits, booked or not
            ended = rng.random() < 0.5
            batch.insert(0, {"type": "session.ended" if ended else "progress.note", "agent": "codex",
                             "session": "s1", "data": {}})
        want = through_the_book(general, [dict(i) if isinstance(i, dict) else i for i in batch])
        got = fast(batch)
        assert got == want
        booked = any("_attention_key" in d or d["type"] == "session.ended" for d in got if isinstance(d, dict))
        skipped += not booked
        walked += booked
    assert skipped and walked
    assert fast.attention.open.keys() == general.attention.open.keys()
    assert (fast.attention.orphans, fast.attention.invalid) == (general.attention.orphans, general.attention.invalid)


def test_keyed_table_dispatch_equals_keying_after_it():
    """``map_table(keyed=signal)`` tags permission cards as ``key_permissions`` did after it."""
    keyed = 0
    for sig in workload(1):
        if sig.agent == "codex":
            old = hf.key_permissions(codex.map_hook(*hf.hook_call(sig)), sig)
            new = codex.map_signal(sig, None)
        elif sig.agent == "qwen-code":
            old = hf.key_permissions(qwen_code.map_hook(*hf.hook_call(sig)), sig)
            new = qwen_code.map_signal(sig, None)
        else:
            continue
        assert new == old
        assert [list(d) for d in new] == [list(d) for d in old]  # same key order too
        keyed += sum("_attention_key" in d for d in new)
    assert keyed  # permission cards were among them


@pytest.fixture
def run_ids(monkeypatch):
    """Deterministic run ids: two run processors fed in lockstep mint the same ones."""
    counter = itertools.count()
    monkeypatch.setattr(runs_module, "mint_run_id", lambda: f"r{next(counter) // 2}")


def test_session_end_without_lanes_equals_the_scan(run_ids):
    """With no laned run open, a session end closes its one lane-less key; forcing the scan of
    every open run (what a laned run triggers) gives the same output and the same state."""
    mapping = MappingProcessor()
    drafts = [d for sig in workload() for d in mapping([sig])]
    rng = random.Random(16)
    # Nested loops share sessions: some drafts in a lane, as Cline subagents are.
    laned = [dict(d, _lane=f"sub{rng.randrange(2)}") if rng.random() < 0.2 else d for d in drafts]
    for batch in (drafts, laned):
        fast, scan = RunsProcessor(), RunsProcessor()
        scan.state.laned.add(("never", "open", "lane"))  # a laned key is open: every end scans
        for d in batch:
            a = fast([dict(d)])
            b = scan([dict(d)])
            assert a == b
            assert fast.state.open == scan.state.open
            assert fast.state.laned == scan.state.laned - {("never", "open", "lane")}
        assert fast.state.finished == scan.state.finished and fast.state.ended == scan.state.ended


def test_laned_keys_follow_eviction_and_close(run_ids):
    """``laned`` holds exactly the open keys that name a lane, through eviction and closing."""
    p = RunsProcessor(state=runs_module.RunState(max_sessions=3))
    for i in range(6):
        p([{"type": "run.started", "agent": "a", "session": f"s{i}", "data": {}, "_lane": "sub" if i % 2 else ""}])
        assert p.state.laned == {k for k in p.state.open if k[2]}
    p([{"type": "session.ended", "agent": "a", "session": "s5", "data": {}}])
    assert p.state.laned == {k for k in p.state.open if k[2]} and ("a", "s5", "sub") not in p.state.open
    p([{"type": "run.finished", "agent": "a", "session": "s3", "data": {}, "_lane": "sub"}])
    assert p.state.laned == set()


_SCALARS = (str, int, float, bool, type(None))


def json_copy_reference(value: Any) -> Any:
    """``drafting.json_copy`` as it was before plain dicts were copied in one call (the oracle)."""
    if isinstance(value, dict):
        return {k: v if isinstance(v, _SCALARS) else json_copy_reference(v) for k, v in value.items()}
    if isinstance(value, list):
        return [v if isinstance(v, _SCALARS) else json_copy_reference(v) for v in value]
    if isinstance(value, _SCALARS):
        return value
    import copy

    return copy.deepcopy(value)


def same_copy(got: Any, want: Any, original: Any) -> None:
    """Equal with the same types and key order all the way down, sharing no container with ``original``."""
    assert type(got) is type(want), (got, want)
    if isinstance(want, dict):
        assert got is not original and list(got) == list(want)
        for k in want:
            same_copy(got[k], want[k], original[k])
    elif isinstance(want, list):
        assert got is not original and len(got) == len(want)
        for g, w, o in zip(got, want, original, strict=True):
            same_copy(g, w, o)
    else:
        assert got == want or (got != got and want != want)  # NaN


class _Tagged(dict):  # a dict subclass: copied by the comprehension, as before
    pass


def test_json_copy_copies_as_before() -> None:
    from aep_collector.processors.mapping.drafting import json_copy

    values: list[Any] = [payload for _, payload in hook_inputs()]
    rng = random.Random(3)

    def gen(depth: int = 0) -> Any:
        roll = rng.random()
        if depth < 4 and roll < 0.25:
            return {f"k{i}": gen(depth + 1) for i in range(rng.randint(0, 4))}
        if depth < 4 and roll < 0.4:
            return [gen(depth + 1) for _ in range(rng.randint(0, 4))]
        return rng.choice(["s", 1, 1.5, float("nan"), True, None, (1, [2]), {1, 2}, _Tagged(a=[1]), b"x"])

    values += [gen() for _ in range(3_000)]
    values += [{"a": _Tagged(b={"c": [1, {"d": 2}]})}, _Tagged(x=[{"y": 1}]), {1: [2], None: {"z": 3}}]
    for value in values:
        same_copy(json_copy(value), json_copy_reference(value), value)


def tool_requested_reference(payload: dict[str, Any], call_ids: bool = True) -> dict[str, Any]:
    """``hook_vendors.tool_requested`` as it was, through ``draft`` (the oracle)."""
    tool = hf.tool_of(payload, call_ids)
    data: dict[str, Any] = {"tool": tool}
    if payload.get("tool_input") is not None:
        raw = payload["tool_input"]
        data["args_digest"] = hf.digest(raw)
        if isinstance(raw, dict):
            data["args"] = hf.json_copy(raw)
    return hf.draft("tool.requested", data, tool["name"])


def tool_completed_reference(payload: dict[str, Any], call_ids: bool = True) -> dict[str, Any]:
    """``hook_vendors.tool_completed`` as it was, through ``draft`` (the oracle)."""
    tool = hf.tool_of(payload, call_ids)
    data: dict[str, Any] = {"tool": tool}
    if payload.get("tool_response") is not None:
        raw = payload["tool_response"]
        data["result_digest"] = hf.digest(raw)
        if isinstance(raw, (dict, str)):
            data["result"] = hf.json_copy(raw)
    hf._duration(payload, data)
    return hf.draft("tool.completed", data, tool["name"])


class _Name(str):  # a str subclass tool name: the subject becomes a plain str, as draft() makes it
    pass


def test_tool_drafts_as_through_draft() -> None:
    payloads = [payload for _, payload in hook_inputs()]
    payloads += [{"tool_name": _Name("Bash"), "tool_use_id": "c1", "tool_input": {"a": 1}, "tool_response": "ok"},
                 {"tool_name": "", "tool_input": "x", "tool_response": [1]}, {"tool_name": 3, "tool_response": {}},
                 {"tool_input": None, "tool_response": None, "duration_ms": 12.5}, {}]
    for payload in payloads:
        for call_ids in (True, False):
            for got, want in ((hf.tool_requested(payload, call_ids=call_ids),
                               tool_requested_reference(payload, call_ids)),
                              (hf.tool_completed(payload, call_ids=call_ids),
                               tool_completed_reference(payload, call_ids))):
                assert got == want and list(got) == list(want), payload
                assert type(got["subject"]) is str
