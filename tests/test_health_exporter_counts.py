"""``/healthz`` counters say what became of each event an exporter is handed: ``exported`` counts
only what the peer took; an event the exporter left out is ``dropped`` (once, however often its
batch is retried), records the peer rejected are ``rejected``. Real peers on loopback throughout:
an OTLP/HTTP server, nats-server, the JSONL record on disk."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter
from aep_collector.exporters.otlp import OtlpExporter, OtlpExporterConfig
from aep_collector.exporters.otlp.wire import records_of
from aep_collector.exporters.relay import RelayConfig, RelayExporter
from aep_collector.exporters.relay_server import RelayServer, RelayServerConfig
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.pipeline import Pipeline, QueuedExporter
from aep_collector.pipeline.sending_queue import SendingQueue, SendingQueueConfig, left_out
from aiohttp import web
from nats.js import api
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from tests.conftest import FIXTURES
from tests.helpers import serve
from tests.nats_support import free_port, stream_with_max_msg_size
from tests.relay_double import RelayDouble, wait_until
from tests.test_nats_adversarial import padded
from tests.test_nats_exporter import events, make_exporter, stored

GOLDEN = [json.loads(line) for line in (FIXTURES / "golden" / "golden.jsonl").read_text().splitlines() if line.strip()]
OTLP = "exporter/otlp"


def queue(tmp_path: Path, cid: str, deliver: Any, health: Health) -> SendingQueue:
    config = SendingQueueConfig(backoff_initial=0.01, backoff_max=0.02, fsync="never")
    return SendingQueue(cid, tmp_path / "q", config, deliver, health)


def counts(health: Health, cid: str) -> dict[str, int]:
    return {what: n for (c, what), n in health.counters.items() if c == cid}


def no_agent(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "agent"}


# -- otlp: a real OTLP/HTTP server -----------------------------------------------------------


@pytest.fixture
async def otlp_http():
    """``/v1/logs`` on 127.0.0.1: takes each request, or answers what ``answers`` holds first;
    ``rejected`` makes a 2xx a partial success."""
    state: dict[str, Any] = {"requests": [], "answers": [], "rejected": 0}

    async def v1_logs(request: web.Request) -> web.Response:
        if state["answers"]:
            return web.Response(status=state["answers"].pop(0))
        state["requests"].append(ExportLogsServiceRequest.FromString(await request.read()))
        answer = ExportLogsServiceResponse()
        if state["rejected"]:
            answer.partial_success.CopyFrom(ExportLogsPartialSuccess(rejected_log_records=state["rejected"],
                                                                     error_message="too old"))
        return web.Response(body=answer.SerializeToString(), content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/logs", v1_logs)
    runner, port = await serve(app)
    state["url"] = f"http://127.0.0.1:{port}/v1/logs"
    yield state
    await runner.cleanup()


async def otlp_exporter(url: str) -> tuple[OtlpExporter, Host]:
    exp = OtlpExporter(CreateSettings(id="otlp"), OtlpExporterConfig(protocol="http", endpoint=url))
    host = Host()
    await exp.start(host)
    return exp, host


def sent_ids(server: dict[str, Any]) -> list[str]:
    return [r["attributes"]["aep.event_id"] for req in server["requests"] for r in records_of(req)]


async def test_otlp_behind_the_sending_queue_counts_what_it_left_out_as_dropped_not_exported(tmp_path, otlp_http):
    exp, host = await otlp_exporter(otlp_http["url"])
    q = queue(tmp_path, OTLP, exp.deliver, host.health)
    q.start()
    try:
        bad_time = {**GOLDEN[5], "time": "yesterday"}
        q.put([GOLDEN[3], no_agent(GOLDEN[4]), GOLDEN[13], bad_time, GOLDEN[24]])
        await wait_until(lambda: not q.pending_events, "the batch delivered")
    finally:
        await q.drain(1)
        await exp.shutdown()
    assert sent_ids(otlp_http) == [GOLDEN[3]["id"], GOLDEN[13]["id"], GOLDEN[24]["id"]]
    assert counts(host.health, OTLP) == {"exported": 3, "dropped": 2}
    health = host.health.snapshot()
    assert health["dropped"] == {OTLP: 2}
    assert "unprojectable" in health["problems"][OTLP]


async def test_otlp_counts_a_left_out_event_once_when_its_batch_is_retried(tmp_path, otlp_http):
    otlp_http["answers"] = [503, 503]
    exp, host = await otlp_exporter(otlp_http["url"])
    q = queue(tmp_path, OTLP, exp.deliver, host.health)
    q.start()
    try:
        q.put([GOLDEN[3], no_agent(GOLDEN[4])])
        await wait_until(lambda: not q.pending_events, "the batch delivered after two 503s")
    finally:
        await q.drain(1)
        await exp.shutdown()
    assert not otlp_http["answers"] and sent_ids(otlp_http) == [GOLDEN[3]["id"]]
    assert counts(host.health, OTLP) == {"retried": 4, "exported": 1, "dropped": 1}


async def test_otlp_records_the_receiver_rejected_are_not_counted_exported(tmp_path, otlp_http):
    otlp_http["rejected"] = 1
    exp, host = await otlp_exporter(otlp_http["url"])
    q = queue(tmp_path, OTLP, exp.deliver, host.health)
    q.start()
    try:
        q.put([GOLDEN[3], GOLDEN[13], GOLDEN[24]])
        await wait_until(lambda: not q.pending_events, "the batch delivered")
    finally:
        await q.drain(1)
        await exp.shutdown()
    assert len(sent_ids(otlp_http)) == 3
    assert counts(host.health, OTLP) == {"exported": 2, "rejected": 1}


async def test_otlp_a_batch_with_nothing_to_send_exports_nothing(tmp_path, otlp_http):
    exp, host = await otlp_exporter(otlp_http["url"])
    q = queue(tmp_path, OTLP, exp.deliver, host.health)
    q.start()
    try:
        q.put([no_agent(GOLDEN[3]), no_agent(GOLDEN[4])])
        await wait_until(lambda: not q.pending_events, "the batch settled")
        q.put([GOLDEN[13]])
        await wait_until(lambda: not q.pending_events, "the next batch delivered")
    finally:
        await q.drain(1)
        await exp.shutdown()
    assert sent_ids(otlp_http) == [GOLDEN[13]["id"]]
    assert counts(host.health, OTLP) == {"dropped": 2, "exported": 1}


async def test_otlp_behind_the_memory_queue_counts_the_same(otlp_http):
    exp, host = await otlp_exporter(otlp_http["url"])
    q = QueuedExporter(OTLP, exp, host.health)
    q.start()
    try:
        q.put([GOLDEN[3], no_agent(GOLDEN[4]), GOLDEN[13]])
    finally:
        await q.drain(5)
        await exp.shutdown()
    assert sent_ids(otlp_http) == [GOLDEN[3]["id"], GOLDEN[13]["id"]]
    assert counts(host.health, OTLP) == {"exported": 2, "dropped": 1}


# -- nats: a real nats-server ----------------------------------------------------------------


@pytest.mark.parametrize("in_flight", [1, 512])
async def test_nats_events_above_max_payload_are_dropped_not_exported(small_node, tmp_path, in_flight):
    exp, host = make_exporter(small_node.url, tmp_path, max_in_flight=in_flight)
    await exp.start(host)
    q = queue(tmp_path, exp.id, exp.deliver, host.health)
    q.start()
    try:
        stamper = Stamper(tmp_path / "st", "h")
        before, after = events(stamper, "s", 2), events(stamper, "s", 2)
        q.put(before + [padded(stamper, "s", 4096 - 20), padded(stamper, "s", 20_000)] + after)
        await wait_until(lambda: not q.pending_events, "the batch delivered", timeout=30)
        assert [m.headers["Nats-Msg-Id"] for m in await stored(small_node.url)] == [e["id"] for e in before + after]
    finally:
        await q.drain(1)
        await exp.shutdown()
    assert counts(host.health, exp.id) == {"exported": 4, "dropped": 2}
    assert host.health.snapshot()["dropped"] == {exp.id: 2}


async def test_nats_counts_a_too_large_event_once_when_its_batch_is_retried(small_node, tmp_path):
    nc = await nats.connect(small_node.url)
    js = nc.jetstream()
    # A full stream that refuses new messages: the batch's stored event fails until it is purged.
    await js.add_stream(api.StreamConfig(name="AEP_EVENTS", subjects=["aep.events.>"], max_msgs=1,
                                         discard=api.DiscardPolicy.NEW))
    await js.publish("aep.events.other.x", b"{}")
    exp, host = make_exporter(small_node.url, tmp_path, max_in_flight=1, publish_timeout=2.0)
    await exp.start(host)
    q = queue(tmp_path, exp.id, exp.deliver, host.health)
    q.start()
    try:
        stamper = Stamper(tmp_path / "st", "h")
        batch = [padded(stamper, "s", 20_000), *events(stamper, "s", 1)]
        q.put(batch)
        await wait_until(lambda: host.health.counters.get((exp.id, "retried"), 0) >= 4, "two attempts refused",
                         timeout=30)
        await js.purge_stream("AEP_EVENTS")
        await wait_until(lambda: not q.pending_events, "the batch delivered", timeout=30)
        assert [m.headers["Nats-Msg-Id"] for m in await stored(small_node.url)] == [batch[1]["id"]]
    finally:
        await nc.close()
        await q.drain(1)
        await exp.shutdown()
    got = counts(host.health, exp.id)
    assert (got["exported"], got["dropped"]) == (1, 1)


@pytest.mark.parametrize("in_flight", [1, 512])
async def test_nats_an_event_above_the_streams_max_msg_size_is_dropped_not_exported(node, tmp_path, in_flight):
    await stream_with_max_msg_size(node.url, 2000)
    exp, host = make_exporter(node.url, tmp_path, max_in_flight=in_flight, publish_timeout=2.0)
    await exp.start(host)
    q = queue(tmp_path, exp.id, exp.deliver, host.health)
    q.start()
    try:
        stamper = Stamper(tmp_path / "st", "h")
        batch = [*events(stamper, "s", 1), padded(stamper, "s", 5000), *events(stamper, "t", 1)]
        q.put(batch)
        await wait_until(lambda: not q.pending_events, "the batch delivered", timeout=30)
        assert [m.headers["Nats-Msg-Id"] for m in await stored(node.url)] == [batch[0]["id"], batch[2]["id"]]
    finally:
        await q.drain(1)
        await exp.shutdown()
    assert counts(host.health, exp.id) == {"exported": 2, "dropped": 1}


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


# -- relay: the relay double on loopback -----------------------------------------------------

RELAY = "exporter/relay"
RELAY_TOKEN = "relay-token"


async def relay_exporter(endpoint: str, **overrides: Any) -> tuple[RelayExporter, Host]:
    options = {"token": RELAY_TOKEN, "backoff_initial": 0.02, "backoff_max": 0.1, "instance": "test/1", **overrides}
    exp = RelayExporter(CreateSettings(id="relay"), RelayConfig(endpoint=endpoint, **options))
    host = Host()
    await exp.start(host)
    return exp, host


def relay_ids(relay: RelayDouble) -> list[str]:
    return [e["id"] for e in relay.received]


async def through_memory_queue(cid: str, exporter: Any, health: Health, events: list[dict[str, Any]]) -> None:
    """``events`` through the memory queue to ``exporter``, drained."""
    q = QueuedExporter(cid, exporter, health)
    q.start()
    q.put(events)
    await q.drain(5)


async def test_relay_behind_the_memory_queue_counts_an_event_without_agent_dropped_not_exported():
    relay = RelayDouble(RELAY_TOKEN)
    await relay.start()
    exp, host = await relay_exporter(relay.ws_url)
    q = QueuedExporter(RELAY, exp, host.health)
    q.start()
    try:
        q.put([GOLDEN[3], no_agent(GOLDEN[4]), GOLDEN[13]])
        await wait_until(lambda: len(relay.received) == 2, "both events with an agent at the relay")
    finally:
        await q.drain(5)
        await exp.shutdown()
        await relay.stop()
    assert relay_ids(relay) == [GOLDEN[3]["id"], GOLDEN[13]["id"]]
    assert counts(host.health, RELAY) == {"exported": 2, "dropped": 1}
    assert "no-agent" in host.health.snapshot()["problems"][RELAY]


async def test_relay_behind_the_sending_queue_counts_an_event_without_agent_dropped_not_exported(tmp_path):
    relay = RelayDouble(RELAY_TOKEN)
    await relay.start()
    exp, host = await relay_exporter(relay.ws_url)
    q = queue(tmp_path, RELAY, exp.deliver, host.health)
    q.start()
    try:
        q.put([GOLDEN[3], no_agent(GOLDEN[4]), GOLDEN[13]])
        await wait_until(lambda: not q.pending_events, "the batch delivered")
    finally:
        await q.drain(1)
        await exp.shutdown()
        await relay.stop()
    assert relay_ids(relay) == [GOLDEN[3]["id"], GOLDEN[13]["id"]]
    assert counts(host.health, RELAY) == {"exported": 2, "dropped": 1}


async def test_relay_counts_an_event_without_agent_once_when_its_batch_is_retried(tmp_path):
    """The relay is away and the agent's outbox is full of events ``export`` queued: the delivered
    batch's event is pushed out of it (``drop_newest``), so the batch is retried until the relay is
    back. Neither that event (its batch waits on disk) nor the one without an agent is counted
    dropped on every attempt."""
    relay = RelayDouble(RELAY_TOKEN, port=free_port())
    exp, host = await relay_exporter(relay.ws_url, outbox_size=2, overflow="drop_newest")
    q = queue(tmp_path, RELAY, exp.deliver, host.health)
    try:
        await exp.export([GOLDEN[3], GOLDEN[13]])  # fills the outbox while the relay is away
        q.start()
        q.put([GOLDEN[24], no_agent(GOLDEN[4])])
        await wait_until(lambda: host.health.counters.get((RELAY, "retried"), 0) >= 2, "the batch retried")
        await relay.start()
        await wait_until(lambda: not q.pending_events, "the batch delivered once the relay is back")
    finally:
        await q.drain(1)
        await exp.shutdown()
        await relay.stop()
    assert GOLDEN[24]["id"] in relay_ids(relay)
    got = counts(host.health, RELAY)
    assert got.pop("retried") >= 2
    assert got == {"exported": 1, "dropped": 1}


async def test_relay_events_exported_after_shutdown_are_dropped_not_exported():
    relay = RelayDouble(RELAY_TOKEN)
    await relay.start()
    exp, host = await relay_exporter(relay.ws_url)
    await exp.shutdown()
    try:
        await through_memory_queue(RELAY, exp, host.health, [GOLDEN[3], no_agent(GOLDEN[4])])
    finally:
        await relay.stop()
    assert relay.received == []
    assert counts(host.health, RELAY) == {"dropped": 2}


async def test_relay_switched_off_counts_nothing_exported():
    exp, host = await relay_exporter("")
    try:
        await through_memory_queue(RELAY, exp, host.health, [GOLDEN[3], no_agent(GOLDEN[4])])
    finally:
        await exp.shutdown()
    assert counts(host.health, RELAY) == {}
    assert "dropped" not in host.health.snapshot()


# -- relay_server: the relay role on loopback ------------------------------------------------


async def test_relay_role_events_it_cannot_serve_are_dropped_not_exported(tmp_path):
    """One mistyped event (``invalid-event``) and one it cannot encode (``unservable-event``) go
    through the memory queue with good ones: only the good ones count as exported."""
    cfg = RelayServerConfig(endpoint="127.0.0.1:0", token=RELAY_TOKEN)
    role = RelayServer(CreateSettings(id="relay_server"), cfg)
    host = Host(state_dir=tmp_path)
    await role.start(host)
    mistyped = {**GOLDEN[4], "seq": "5"}
    unencodable = {**GOLDEN[5], "data": {"tags": {"a", "b"}}}
    try:
        await through_memory_queue(role.id, role, host.health, [GOLDEN[3], mistyped, GOLDEN[13], unencodable])
    finally:
        await role.shutdown()
    assert counts(host.health, role.id) == {"exported": 2, "dropped": 2}
    assert {"invalid-event", "unservable-event"} <= set(host.health.snapshot()["problems"][role.id])


async def test_relay_a_delivered_batch_larger_than_the_outbox_goes_through(tmp_path):
    """A sending-queue batch of one agent larger than ``outbox_size`` overflowed the agent's outbox
    on its own, so it was retried for good and nothing after it was delivered."""
    relay = RelayDouble(RELAY_TOKEN)
    await relay.start()
    exp, host = await relay_exporter(relay.ws_url, outbox_size=3)
    q = queue(tmp_path, RELAY, exp.deliver, host.health)
    batch = [{**GOLDEN[3], "id": f"01RELAYBIGBATCH{n:011d}", "seq": n} for n in range(8)]
    q.start()
    try:
        q.put(batch)
        await wait_until(lambda: not q.pending_events, "the batch delivered", timeout=10)
    finally:
        await q.drain(1)
        await exp.shutdown()
        await relay.stop()
    assert relay_ids(relay) == [e["id"] for e in batch]
    assert counts(host.health, RELAY) == {"exported": 8}
