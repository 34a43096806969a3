"""One serialization per event for every consumer of its bytes, and the JSONL short path.

``wire.dumps_line`` must be byte for byte ``dumps_bytes(event) + b"\\n"`` (the form every reader
already reads); the pipeline serializes once when both the JSONL record and a sending queue take
the lines, and both then hold exactly those bytes, of the stamped (capture-gated) event.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.pipeline import Pipeline
from aep_collector.pipeline.sending_queue import SendingQueue, SendingQueueConfig
from aep_collector.pipeline.wire import dumps_bytes, dumps_line
from aep_collector.processors.capture import CaptureConfig, CaptureProcessor
from aep_collector.processors.mapping import MappingProcessor
from aep_collector.processors.runs import RunsProcessor

from tests.conftest import FIXTURES
from tests.test_stamp_equivalence import HOOK_VENDORS, corpus_drafts

TRICKY = [
    {"subject": "a\u2028b\u2029c\x85d\x0be", "n": 1},
    {"big": 1 << 70, "s": "\u2028"},  # beyond 64 bits: the standard-library fallback
    {"emoji": "\U0001f600 \u00e9", "nested": [{"x": None}, 1.5, True]},
    {"ctrl": "\x00\x1f\n\r\t", "k\u2029": "v"},
]


def signals() -> list[Signal]:
    out = []
    for agent in HOOK_VENDORS:
        fx = json.loads((FIXTURES / "mappings" / f"{agent}.json").read_text())
        for key in sorted(fx["hooks"]):
            inp = fx["hooks"][key]["input"]
            if isinstance(inp, dict):
                out.append(Signal(agent, str(inp.get("hook_event_name", "hook")), dict(inp)))
    return out


@pytest.mark.parametrize("event", TRICKY)
def test_dumps_line_is_dumps_bytes_and_a_newline(event):
    assert dumps_line(event) == dumps_bytes(event) + b"\n"


def test_dumps_line_on_stamped_corpus_events(tmp_path):
    stamper = Stamper(tmp_path, "h")
    events = [stamper.stamp(d) for d in corpus_drafts()]
    assert all(dumps_line(e) == dumps_bytes(e) + b"\n" for e in events)


class Sink:
    """The exporter behind the queue: keeps what it was handed."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    async def deliver(self, events: list[dict]) -> None:
        self.events.extend(events)


async def test_jsonl_and_queue_hold_the_same_bytes_of_the_gated_event(tmp_path):
    health = Health()
    jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"), fsync="never"))
    await jsonl.start(Host(health=health, state_dir=tmp_path))
    sink = Sink()
    queue = SendingQueue("exporter/sink", tmp_path / "queue", SendingQueueConfig(fsync="never"), sink.deliver, health)
    procs = [MappingProcessor(), RunsProcessor(), CaptureProcessor(CaptureConfig(ceiling="metadata"))]
    pipe = Pipeline("p", procs, Stamper(tmp_path, "h"), health, [("exporter/jsonl", jsonl)], [queue])
    assert pipe._share_lines
    stamped = []
    for signal in signals():
        stamped.extend(await pipe.consume([signal]))
    await jsonl.shutdown()
    assert len(stamped) > 30
    segment = b"".join(p.read_bytes() for p in sorted((tmp_path / "queue").glob("*.seg")))
    assert segment == b"".join(dumps_bytes(e) + b"\n" for e in stamped)
    logs = b"".join(p.read_bytes() for p in sorted((tmp_path / "logs").rglob("*.jsonl")))
    assert sorted(logs.splitlines()) == sorted(segment.splitlines())
    # The queue hands its exporter the very events that were stamped (read back from those bytes).
    queue.start()
    for _ in range(200):
        if len(sink.events) == len(stamped):
            break
        await asyncio.sleep(0.01)
    await queue.drain(1.0)
    assert sink.events == stamped


async def test_a_lone_consumer_serializes_for_itself(tmp_path):
    health = Health()
    jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"), fsync="never"))
    await jsonl.start(Host(health=health, state_dir=tmp_path))
    pipe = Pipeline("p", [MappingProcessor(), RunsProcessor(), CaptureProcessor()], Stamper(tmp_path, "h"), health,
                    [("exporter/jsonl", jsonl)], [])
    assert not pipe._share_lines
    stamped = []
    for signal in signals()[:10]:
        stamped.extend(await pipe.consume([signal]))
    await jsonl.shutdown()
    logs = b"".join(p.read_bytes() for p in sorted((tmp_path / "logs").rglob("*.jsonl")))
    assert sorted(logs.splitlines()) == sorted(dumps_bytes(e) for e in stamped)


async def test_jsonl_short_path_writes_what_the_batch_path_writes(tmp_path):
    """Events one by one (the hook's short path) and as one batch land as the same file bytes."""
    events = [Stamper(tmp_path, "h").stamp(d) for d in corpus_drafts()]
    out = {}
    for mode in ("single", "batch"):
        root = tmp_path / mode
        exp = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(root), fsync="never",
                                                                     max_open_files=3))
        await exp.start(Host(health=Health(), state_dir=tmp_path))
        if mode == "single":
            for e in events:
                exp.export_now([e])
        else:
            exp.export_now(events)
        assert len(exp._fds) <= 3
        await exp.shutdown()
        out[mode] = {p.relative_to(root): p.read_bytes() for p in root.rglob("*.jsonl")}
    assert out["single"] == out["batch"] and len(out["single"]) > 3
    for data in out["single"].values():
        assert data.endswith(b"\n")


async def test_an_event_that_is_not_json_fails_as_it_did_without_sharing(tmp_path):
    """A value no serializer takes (a plug-in's set): JSONL reports the failure, the queue raises, as before."""
    health = Health()
    jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"), fsync="never"))
    await jsonl.start(Host(health=health, state_dir=tmp_path))
    queue = SendingQueue("exporter/sink", tmp_path / "queue", SendingQueueConfig(fsync="never"), Sink().deliver, health)
    pipe = Pipeline("p", [], Stamper(tmp_path, "h"), health, [("exporter/jsonl", jsonl)], [queue])
    assert pipe._share_lines
    event = Stamper(tmp_path / "other", "h").stamp({"type": "run.started", "agent": "a", "session": "s",
                                                    "capture": "metadata", "data": {"odd": {1, 2}}})
    with pytest.raises(TypeError):
        pipe.deliver([event])
    assert health.snapshot()["problems"]["exporter/jsonl"]
    await jsonl.shutdown()
    queue.close()
