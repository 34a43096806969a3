"""End to end: the real OpenTelemetry SDK exporters into the collector binary, JSONL out."""

from __future__ import annotations

import pytest
from aep_collector.pipeline.validate import StreamValidator, envelope_errors
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource

from tests.conftest import corpus
from tests.helpers import collector, read_jsonl


def config(tmp_path, mode):
    return {
        "receivers": {"otlp/vscode": {"profile": "vscode", "mode": mode,
                                      "grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}},
        "processors": {"mapping": None, "runs": None, "capture": None},
        "exporters": {"jsonl": {"directory": str(tmp_path / "logs"), "fsync": "never"}},
        "service": {"state_dir": str(tmp_path / "state"), "pipelines": {"otel": {
            "receivers": ["otlp/vscode"], "processors": ["mapping", "runs", "capture"], "exporters": ["jsonl"]}}},
    }


def emit(exporter, session, records):
    provider = LoggerProvider(resource=Resource.create({"service.name": "copilot-chat", "session.id": session}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = provider.get_logger("copilot-chat")
    for attrs in records:
        logger.emit(event_name=attrs["event.name"], severity_number=SeverityNumber.INFO,
                    attributes={k: v for k, v in attrs.items() if k != "event.name"})
    provider.force_flush()
    provider.shutdown()


@pytest.mark.parametrize("mode", ["companion", "primary"])
def test_vscode_copilot_chat_records_through_grpc_http_and_gzip(tmp_path, mode):
    doc = corpus("mappings/vscode-otel.json")
    entries = [*doc["records"].values(), doc["unknown"]]
    records = [e["input"]["attributes"] for e in entries]
    expected = [e[mode]["type"] for e in entries if e.get(mode)]
    with collector(config(tmp_path, mode), tmp_path) as c:
        grpc_port = c.ports["receiver/otlp/vscode:grpc"]
        http_port = c.ports["receiver/otlp/vscode:http"]
        emit(GrpcLogExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True), "vs-grpc", records)
        emit(HttpLogExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/logs"), "vs-http", records)
        emit(HttpLogExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/logs", compression=Compression.Gzip),
             "vs-gzip", records)
        assert c.stop() == 0
    for session in ("vs-grpc", "vs-http", "vs-gzip"):
        events = read_jsonl(tmp_path / "logs" / "vscode" / f"{session}.jsonl")
        assert [e["type"] for e in events] == expected
        stream = StreamValidator()
        for e in events:
            assert envelope_errors(e) == [] and stream.feed(e) == []
            assert "run" not in e  # the OTel channel never synthesizes runs
        if mode == "companion":
            assert all(e["type"].startswith("x.vscode.otel.") for e in events)


async def test_two_otlp_receivers_side_by_side_share_stamping(tmp_path):
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    from tests.helpers import running

    cfg = config(tmp_path, "primary")
    cfg["receivers"] = {
        "otlp/vscode": {"profile": "vscode", "mode": "primary", "http": {"endpoint": "127.0.0.1:0"}},
        "otlp/codex": {"profile": "codex", "mode": "primary", "http": {"endpoint": "127.0.0.1:0"}},
    }
    cfg["service"]["pipelines"]["otel"]["receivers"] = ["otlp/vscode", "otlp/codex"]
    vs = corpus("mappings/vscode-otel.json")
    cx = corpus("mappings/codex-otel.json")
    async with running(cfg) as service:
        vport = service.receivers["otlp/vscode"].http_port
        cport = service.receivers["otlp/codex"].http_port
        import asyncio
        await asyncio.to_thread(emit, OTLPLogExporter(endpoint=f"http://127.0.0.1:{vport}/v1/logs"), "side-v",
                                [e["input"]["attributes"] for e in vs["records"].values()])
        codex_records = [{**e["input"]["attributes"], "conversation.id": "side-c"} for e in cx["records"].values()]
        await asyncio.to_thread(emit, OTLPLogExporter(endpoint=f"http://127.0.0.1:{cport}/v1/logs"), "unused",
                                codex_records)
    v_events = read_jsonl(tmp_path / "logs" / "vscode" / "side-v.jsonl")
    c_events = read_jsonl(tmp_path / "logs" / "codex" / "side-c.jsonl")
    assert v_events and c_events
    assert [e["seq"] for e in v_events] == list(range(len(v_events)))
    assert [e["seq"] for e in c_events] == list(range(len(c_events)))
    assert {e["agent"] for e in v_events} == {"vscode"} and {e["agent"] for e in c_events} == {"codex"}


async def test_an_event_is_timed_by_its_record_not_by_its_arrival(tmp_path):
    """Exporters batch and retry, so a record reaches the collector seconds (or, after an outage,
    hours) after it happened: its event carries the record's time (bridges digest §1.6), exactly
    to the millisecond; a record with none is timed on arrival."""
    import asyncio
    import time as clock

    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    from tests.helpers import running

    then = 1_783_073_704_310_999_999  # 2026-07-03T10:15:04.310Z and a bit: never rounded up
    doc = corpus("mappings/vscode-otel.json")
    attrs = next(iter(doc["records"].values()))["input"]["attributes"]

    def send(port: int) -> None:
        provider = LoggerProvider(resource=Resource.create({"service.name": "copilot-chat", "session.id": "timed"}))
        provider.add_log_record_processor(SimpleLogRecordProcessor(
            OTLPLogExporter(endpoint=f"http://127.0.0.1:{port}/v1/logs")))
        logger = provider.get_logger("copilot-chat")
        rest = {k: v for k, v in attrs.items() if k != "event.name"}
        logger.emit(event_name=attrs["event.name"], timestamp=then, attributes=rest)
        logger.emit(event_name=attrs["event.name"], attributes=rest)  # the SDK sets the observed time only
        provider.force_flush()
        provider.shutdown()

    cfg = config(tmp_path, "companion")
    cfg["receivers"]["otlp/vscode"].pop("grpc")
    before = clock.time()
    async with running(cfg) as service:
        await asyncio.to_thread(send, service.receivers["otlp/vscode"].http_port)
    events = read_jsonl(tmp_path / "logs" / "vscode" / "timed.jsonl")
    assert [e["time"] for e in events][:1] == ["2026-07-03T10:15:04.310Z"]
    assert len(events) == 2 and events[1]["time"] >= clock.strftime("%Y-%m-%dT%H:%M:%S", clock.gmtime(before))
    assert all(envelope_errors(e) == [] for e in events)
