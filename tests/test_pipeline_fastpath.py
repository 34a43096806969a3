"""The pipeline's per-batch shortcuts give what the plain calls give (issue 16).

``Pipeline.consume`` calls each processor through its class's ``__call__`` bound once, and counts a
durable exporter's ``exported`` events without a ``Health.count`` call. Each test runs the corpus
hook inputs (and processors of every callable kind) both ways and holds the results equal.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from pathlib import Path
from typing import Any

from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.host import Health
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.pipeline import CHUNK, Pipeline, _bound_call
from aep_collector.processors.capture import CaptureProcessor
from aep_collector.processors.mapping import MappingProcessor
from aep_collector.processors.runs import RunsProcessor

from tests.test_serialize_once import signals


class Tag:
    """A processor object whose class defines ``__call__``: marks every draft it sees with an
    extension attribute (scalar, ``[a-z0-9]``: the stamper keeps it), so a skipped step shows."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, batch: list[Any]) -> list[Any]:
        return mark(batch, self.name)


def mark(batch: list[Any], name: str = "fn") -> list[Any]:
    """A processor that is a plain function (and, with ``functools.partial``, a partial)."""
    return [dict(d, **{name: "1"}) if isinstance(d, dict) else d for d in batch]


class Sink:
    """A durable exporter that keeps what it was handed."""

    durable = True

    def __init__(self) -> None:
        self.got: list[list[dict]] = []

    def export_now(self, events: list[dict]) -> None:
        self.got.append([dict(e) for e in events])


class Broken(Sink):
    def export_now(self, events: list[dict]) -> None:
        raise OSError(5, "broken")


def test_bound_call_is_the_processor_call():
    tag = Tag("a")
    assert _bound_call(tag).__func__ is Tag.__call__  # type: ignore[attr-defined]
    assert _bound_call(tag).__self__ is tag  # type: ignore[attr-defined]
    # Anything else callable is called as it is: a function, a partial, a builtin.
    part = functools.partial(mark, name="part")
    assert _bound_call(mark) is mark
    assert _bound_call(part) is part
    assert _bound_call(list) is list


def _run(processors: list[Any], work: list[Signal], tmp: Path, by_hand: bool) -> tuple[list, dict]:
    health = Health()
    sink = Sink()
    stamper = Stamper(tmp, "h")
    pipe = Pipeline("p", processors, stamper, health, [("exporter/sink", sink)], [])

    async def go() -> list:
        out = []
        for sig in work:
            if by_hand:  # the plain path: each processor called as an object, then stamped and delivered
                batch: list[Any] = [sig]
                for p in processors:
                    batch = p(batch)
                events = [stamper.stamp(d) for d in batch]
                if events:
                    sink.export_now(events)
                    health.count("exporter/sink", "exported", len(events))
                out.append(events)
            else:
                out.append(await pipe.consume([sig]))
        return out

    events = asyncio.run(go())
    return [_minted_in_order(events), _minted_in_order(sink.got)], dict(health.counters)


# ULIDs (event ids, minted request ids) and minted run ids (``runs.mint_run_id``).
_MINTED = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b|\br_[0-9a-f]{18,}\b")


def _minted_in_order(batches: list[list[dict]]) -> Any:
    """The batches with times dropped and every minted id (event ids, request ids the events cite,
    run ids) replaced by its order of first appearance: both runs mint their own."""
    text = json.dumps([[{k: v for k, v in e.items() if k != "time"} for e in b] for b in batches])
    seen: dict[str, str] = {}
    return json.loads(_MINTED.sub(lambda m: seen.setdefault(m.group(), f"minted-{len(seen)}"), text))


def test_consume_equals_the_processors_called_one_by_one(tmp_path):
    work = signals() * 2
    chain = lambda: [MappingProcessor(), Tag("taga"), RunsProcessor(),  # noqa: E731
                     functools.partial(mark, name="part"), Tag("tagb"), mark, CaptureProcessor()]
    fast = _run(chain(), work, tmp_path / "fast", by_hand=False)
    plain = _run(chain(), work, tmp_path / "plain", by_hand=True)
    assert fast == plain
    assert all(e["taga"] == e["tagb"] == e["part"] == e["fn"] == "1" for b in fast[0][0] for e in b)
    assert fast[1][("exporter/sink", "exported")] == sum(len(b) for b in fast[0][0])


def test_a_failing_durable_exporter_is_counted_as_before(tmp_path):
    health = Health()
    pipe = Pipeline("p", [MappingProcessor(), RunsProcessor(), CaptureProcessor()], Stamper(tmp_path, "h"), health,
                    [("exporter/broken", Broken()), ("exporter/sink", Sink())], [])
    n = sum(len(asyncio.run(pipe.consume([s]))) for s in signals())
    assert health.counters[("exporter/broken", "failed")] == n
    assert ("exporter/broken", "exported") not in health.counters
    assert health.counters[("exporter/sink", "exported")] == n
    assert "export-failed" in health.problems["exporter/broken"]


class Seen:
    """A processor that records the size of every batch it is handed, and can fail on one."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.sizes: list[int] = []
        self.fail_on = fail_on

    def __call__(self, batch: list[Any]) -> list[Any]:
        self.sizes.append(len(batch))
        if self.fail_on is not None and len(self.sizes) == self.fail_on:
            raise RuntimeError("a processor's bug")
        return batch


def _big_batch() -> list[Signal]:
    """More corpus hook inputs than one chunk holds, not a multiple of it."""
    work = signals() * ((2 * CHUNK + 7) // len(signals()) + 1)
    return work[: 2 * CHUNK + 7]


def test_a_big_batch_equals_its_chunks_consumed_in_one_pass(tmp_path, monkeypatch):
    work = _big_batch()
    chain = lambda: [MappingProcessor(), RunsProcessor(), Tag("taga"), CaptureProcessor()]  # noqa: E731

    def consume(one_pass: bool, where: Path) -> tuple[list, list[list[dict]]]:
        if one_pass:  # the chunk as large as the batch: the path every batch took before chunks
            monkeypatch.setattr("aep_collector.pipeline.pipeline.CHUNK", len(work))
        else:
            monkeypatch.setattr("aep_collector.pipeline.pipeline.CHUNK", CHUNK)
        sink, seen = Sink(), Seen()
        pipe = Pipeline("p", [seen, *chain()], Stamper(where, "h"), Health(), [("exporter/sink", sink)], [])
        events = asyncio.run(pipe.consume(list(work)))
        return [_minted_in_order([events]), _minted_in_order(sink.got)], seen.sizes

    chunked, sizes = consume(False, tmp_path / "chunked")
    whole, whole_sizes = consume(True, tmp_path / "whole")
    assert chunked == whole  # the same events in the same order, and one delivery of all of them
    assert whole_sizes == [len(work)]
    assert sizes == [CHUNK, CHUNK, 7]  # the processors saw it a chunk at a time, in order
    assert len(chunked[1]) == 1 and len(chunked[1][0]) == len(chunked[0][0])


def test_a_processor_failing_in_a_later_chunk_delivers_nothing(tmp_path):
    work = _big_batch()
    sink, seen = Sink(), Seen(fail_on=2)
    pipe = Pipeline("p", [seen, MappingProcessor()], Stamper(tmp_path, "h"), Health(), [("exporter/sink", sink)], [])
    try:
        asyncio.run(pipe.consume(work))
    except RuntimeError:
        pass
    else:
        raise AssertionError("the processor's failure was swallowed")
    assert seen.sizes == [CHUNK, CHUNK]
    assert sink.got == []  # the first chunk's events were not delivered either: the caller may retry all
    # Nor stamped: no seq was spent on them, so a consumer sees no gap when the retry arrives.
    seen.fail_on = None
    again = asyncio.run(pipe.consume([work[0]]))
    assert again and again[0]["seq"] == 0


def test_an_item_that_is_not_a_draft_is_counted_and_the_rest_delivered(tmp_path):
    health, sink = Health(), Sink()

    def stray(batch: list[Any]) -> list[Any]:  # a plug-in processor's bug: it emits a non-dict
        return [*batch, 5, "text"]

    pipe = Pipeline("p", [MappingProcessor(), stray], Stamper(tmp_path, "h"), health, [("exporter/sink", sink)], [])
    events = asyncio.run(pipe.consume([signals()[0]]))
    assert events and all(isinstance(e, dict) for e in events)
    assert sink.got == [events]
    assert health.counters[("pipeline/p", "rejected")] == 2
    assert "not a draft" in json.dumps(health.snapshot())
