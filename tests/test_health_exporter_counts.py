"""``/healthz`` counters say what became of each event an exporter is handed: ``exported`` counts
only what the peer took; what the exporter left out it counts itself, under its reason."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.pipeline import Pipeline, QueuedExporter
from aep_collector.pipeline.sending_queue import SendingQueue, SendingQueueConfig, left_out

from tests.relay_double import wait_until


def queue(tmp_path: Path, cid: str, deliver: Any, health: Health) -> SendingQueue:
    config = SendingQueueConfig(backoff_initial=0.01, backoff_max=0.02, fsync="never")
    return SendingQueue(cid, tmp_path / "q", config, deliver, health)


def counts(health: Health, cid: str) -> dict[str, int]:
    return {what: n for (c, what), n in health.counters.items() if c == cid}


# -- the pipeline's direct path: the JSONL record on a hook's path ---------------------------


async def test_a_hooks_events_the_jsonl_record_did_not_write_are_not_counted_exported(tmp_path):
    logs = tmp_path / "logs"
    (logs / "claude-code" / "blocked.jsonl").mkdir(parents=True)  # that session's file cannot be opened
    jsonl = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(logs), fsync="never"))
    health = Health()
    await jsonl.start(Host(health=health))
    try:
        pipe = Pipeline("p", [], Stamper(tmp_path / "st", "h"), health, [("exporter/jsonl", jsonl)], [])
        drafts = [{"type": "progress.status", "agent": "claude-code", "session": s, "data": {}}
                  for s in ("ok", "blocked", "ok")]
        assert len(await pipe.consume(drafts)) == 3  # a hook fails open: every event goes on
    finally:
        await jsonl.shutdown()
    assert len((logs / "claude-code" / "ok.jsonl").read_text().splitlines()) == 2
    assert counts(health, "exporter/jsonl") == {"exported": 2, "dropped": 1}


# -- the interface: what a deliver may return -------------------------------------------------


@pytest.mark.parametrize(("returned", "exported"), [
    (None, 4),            # today's interface: everything was taken
    (1, 3),               # how many it left out
    ([{"id": "x"}], 3),   # the events it left out, as export_now returns them
    (9, None),            # never more than the batch
    (-1, 4),
    (True, 4),            # not a count
    ("sent", 4),          # whatever a plug-in happened to return: as before, all taken
])
async def test_what_a_deliver_returns_says_how_many_were_exported(tmp_path, returned, exported):
    health = Health()
    got: list[dict[str, Any]] = []

    async def deliver(batch: list[dict[str, Any]]) -> Any:
        got.extend(batch)
        return returned

    q = queue(tmp_path, "exporter/t", deliver, health)
    q.start()
    try:
        q.put([{"id": f"e{i}", "type": "progress.note"} for i in range(4)])
        await wait_until(lambda: not q.pending_events, "the batch delivered")
    finally:
        await q.drain(1)
    assert len(got) == 4
    assert health.counters.get(("exporter/t", "exported")) == exported
    assert left_out(returned, 4) == 4 - (exported or 0)


async def test_the_memory_queue_reads_an_exports_return_the_same_way():
    health = Health()

    class Plugin:
        async def export(self, events: list[dict[str, Any]]) -> int:
            return 1

    q = QueuedExporter("exporter/p", Plugin(), health)
    q.start()
    q.put([{"id": "a"}, {"id": "b"}])
    await q.drain(5)
    await asyncio.sleep(0)
    assert health.counters == {("exporter/p", "exported"): 1}
