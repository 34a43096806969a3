"""The ``otlp`` receiver on real loopback ports, driven by the real OpenTelemetry Python SDK
exporters, hand-built OTLP/JSON as a JS exporter sends it, and every kind of bad input."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.mapping import codex_otel, vscode_otel
from aep_collector.receivers.otlp import OtlpConfig, OtlpReceiver, wire
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    InMemoryLogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource

from tests.conftest import corpus

EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
PROTOBUF, JSON = "application/x-protobuf", "application/json"


class Recorder:
    """The next consumer: records each batch; ``fail`` makes it raise like a broken pipeline."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.fail = False

    async def consume(self, batch: list[Any]) -> list[Any]:
        if self.fail:
            raise RuntimeError("disk full")
        self.batches.append(batch)
        return []

    @property
    def signals(self) -> list[Signal]:
        return [s for b in self.batches for s in b]


@contextlib.asynccontextmanager
async def running(profile: str = "vscode", mode: str = "companion", host: Host | None = None,
                  **extra: Any) -> AsyncIterator[tuple[OtlpReceiver, Recorder, Host]]:
    sink, host = Recorder(), host or Host()
    cfg = OtlpConfig(profile=profile, mode=mode, grpc={"endpoint": "127.0.0.1:0"},
                     http={"endpoint": "127.0.0.1:0"}, **extra)
    receiver = OtlpReceiver(CreateSettings(id=f"otlp/{profile}"), cfg, sink)
    await receiver.start(host)
    try:
        yield receiver, sink, host
    finally:
        await receiver.shutdown()


def fixture_cases(fname: str) -> list[tuple[str, dict[str, Any]]]:
    doc = corpus(f"mappings/{fname}")
    return [*doc["records"].items(), ("unknown", doc["unknown"])]


def emit_through_sdk(exporter: Any, resource: dict[str, Any], records: list[dict[str, Any]],
                     batch: bool = False) -> None:
    """A LoggerProvider with a real processor and exporter, as a vendor process would run it."""
    provider = LoggerProvider(resource=Resource.create(resource))
    processor = BatchLogRecordProcessor(exporter) if batch else SimpleLogRecordProcessor(exporter)
    provider.add_log_record_processor(processor)
    logger = provider.get_logger("copilot-chat")
    for attrs in records:
        # The SDK, like the JS one, carries the name in LogRecord.event_name (not an attribute).
        logger.emit(event_name=attrs["event.name"], severity_number=SeverityNumber.INFO, severity_text="INFO",
                    attributes={k: v for k, v in attrs.items() if k != "event.name"})
    provider.force_flush()
    provider.shutdown()


def export_result(exporter: Any, resource: dict[str, Any], records: list[dict[str, Any]]) -> Any:
    """The exporter's own verdict on one export of ``records`` (SUCCESS or FAILURE)."""
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=Resource.create(resource))
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    for attrs in records:
        provider.get_logger("t").emit(event_name=attrs.get("event.name"), attributes=attrs)
    provider.shutdown()
    try:
        return exporter.export(list(memory.get_finished_logs()))
    finally:
        exporter.shutdown()


def mapped(signal: Signal) -> list[dict[str, Any]]:
    mod = vscode_otel if signal.agent == "vscode-otel" else codex_otel
    out = [cap_draft(d, CapturePolicy()) for d in mod.map_signal(signal, mod.new_state())]
    return [{k: d[k] for k in ("type", "data", "subject") if k in d} for d in out]


def pinned(pin: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [] if pin is None else [{k: v for k, v in pin.items() if k != "$comment"}]


def tool_call(session: str | None = "vsc_fix_1") -> bytes:
    """A one-record VS Code export request (no session.id when ``session`` is None)."""
    resource = [] if session is None else [{"key": "session.id", "value": {"stringValue": session}}]
    doc = {"resourceLogs": [{"resource": {"attributes": resource}, "scopeLogs": [{"logRecords": [{
        "eventName": "copilot_chat.tool.call",
        "attributes": [{"key": "gen_ai.tool.name", "value": {"stringValue": "readFile"}}]}]}]}]}
    return json_format.ParseDict(doc, ExportLogsServiceRequest()).SerializeToString()


async def post(port: int, body: bytes, ctype: str = PROTOBUF, path: str = "/v1/logs",
               **headers: str) -> tuple[int, str, bytes, Any]:
    async with aiohttp.ClientSession(auto_decompress=False) as http, http.post(
            f"http://127.0.0.1:{port}{path}", data=body,
            headers={"Content-Type": ctype, **{k.replace("_", "-"): v for k, v in headers.items()}}) as r:
        return r.status, r.content_type, await r.read(), r.headers


async def assert_still_serving(receiver: OtlpReceiver, sink: Recorder) -> None:
    before = len(sink.signals)
    status, ctype, body, _ = await post(receiver.http_port, tool_call())
    assert (status, ctype, body) == (200, PROTOBUF, b"")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        assert await channel.unary_unary(EXPORT)(tool_call()) == b""
    assert len(sink.signals) == before + 2


def status_of(body: bytes, ctype: str) -> status_pb2.Status:
    status = status_pb2.Status()
    if ctype == JSON:
        json_format.Parse(body, status)
    else:
        status.ParseFromString(body)
    return status


# -- real OpenTelemetry SDK clients ------------------------------------------------------------


@pytest.mark.parametrize("transport", ["grpc", "grpc-gzip", "http", "http-gzip"])
@pytest.mark.parametrize("mode", ["companion", "primary"])
async def test_real_sdk_exporter_delivers_every_vscode_fixture_record(transport: str, mode: str) -> None:
    cases = fixture_cases("vscode-otel.json")
    resource = cases[0][1]["input"]["resource"]
    assert all(c["input"]["resource"] == resource for _, c in cases)  # one exporter process
    async with running("vscode", mode) as (receiver, sink, _):
        if transport.startswith("grpc"):
            exporter = GrpcLogExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True,
                                       compression=grpc.Compression.Gzip if transport == "grpc-gzip" else None)
        else:
            exporter = HttpLogExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/logs",
                                       compression=Compression.Gzip if transport == "http-gzip" else None)
        await asyncio.to_thread(emit_through_sdk, exporter, resource, [c["input"]["attributes"] for _, c in cases])
    assert [len(b) for b in sink.batches] == [1] * len(cases)  # SimpleLogRecordProcessor: one export each
    for signal, (_, case) in zip(sink.signals, cases, strict=True):
        assert (signal.agent, signal.mode, signal.attrs) == ("vscode-otel", mode, None)
        assert signal.name == case["input"]["attributes"]["event.name"]
        assert signal.payload["attributes"] == case["input"]["attributes"]
        assert signal.payload["resource"].items() >= resource.items()
        assert signal.payload["severity_number"] == 9 and signal.payload["time_unix_nano"] > 0
        assert mapped(signal) == pinned(case[mode])


async def test_batch_processor_sends_one_batch_per_export_request() -> None:
    records = [{"event.name": "codex.api_request", "conversation.id": f"conv_{i % 3}", "status": "200",
                "duration_ms": str(i)} for i in range(250)]
    async with running("codex", "primary") as (receiver, sink, host):
        exporter = HttpLogExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/logs")
        await asyncio.to_thread(emit_through_sdk, exporter, {"service.name": "codex-app-server"}, records, True)
        assert host.health.counters[("receiver/otlp/codex", "accepted")] == 250
    assert 1 <= len(sink.batches) < 250
    assert [s.payload["attributes"]["duration_ms"] for s in sink.signals] == [str(i) for i in range(250)]
    assert {s.agent for s in sink.signals} == {"codex-otel"}


@pytest.mark.parametrize("via", ["grpc", "http"])
async def test_sdk_exporter_reports_success(via: str) -> None:
    async with running("codex") as (receiver, sink, _):
        exporter = (GrpcLogExporter(endpoint=f"127.0.0.1:{receiver.grpc_port}", insecure=True) if via == "grpc"
                    else HttpLogExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/logs"))
        (_, case), *_ = fixture_cases("codex-otel.json")
        result = await asyncio.to_thread(export_result, exporter, case["input"]["resource"],
                                         [case["input"]["attributes"]])
    assert result == LogRecordExportResult.SUCCESS
    assert sink.signals[0].payload["attributes"] == case["input"]["attributes"]


# -- OTLP/JSON as an OTel JS exporter sends it ---------------------------------------------------


def js_body(records: list[dict[str, Any]], session: str = "vsc_js_1") -> bytes:
    """OTLP/JSON from @opentelemetry/exporter-logs-otlp-http: camelCase, hex ids, int64 as strings."""
    def value(v: Any) -> dict[str, Any]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"stringValue": v}
    logs = [{"timeUnixNano": "1783073704221000000", "observedTimeUnixNano": "1783073704221000000",
             "severityNumber": 9, "severityText": "INFO", "eventName": r["event.name"],
             "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7", "flags": 1,
             "attributes": [{"key": k, "value": value(v)} for k, v in r.items() if k != "event.name"],
             "droppedAttributesCount": 0} for r in records]
    return json.dumps({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "copilot-chat"}},
                                    {"key": "session.id", "value": {"stringValue": session}}],
                     "droppedAttributesCount": 0},
        "scopeLogs": [{"scope": {"name": "copilot-chat", "version": "0.37.0"}, "logRecords": logs}]}]}).encode()


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
async def test_otlp_json_from_a_js_exporter(gzipped: bool) -> None:
    cases = fixture_cases("vscode-otel.json")
    body = js_body([c["input"]["attributes"] for _, c in cases])
    headers = {"Content_Encoding": "gzip"} if gzipped else {}
    async with running("vscode", "primary") as (receiver, sink, _):
        status, ctype, reply, _ = await post(receiver.http_port, gzip.compress(body) if gzipped else body,
                                             "application/json; charset=utf-8", **headers)
    assert (status, ctype, json.loads(reply)) == (200, JSON, {})
    (batch,) = sink.batches
    assert len(batch) == len(cases)
    for signal, (_, case) in zip(batch, cases, strict=True):
        assert signal.payload["attributes"] == case["input"]["attributes"]  # "63" arrived as 63
        assert signal.payload["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert mapped(signal) == pinned(case["primary"])
    draft = vscode_otel.map_signal(batch[0], None)[0]
    assert draft["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert draft["session"] == "vsc_js_1"


# -- records without a session -------------------------------------------------------------------


async def test_sessionless_records_are_rejected_in_partial_success_and_the_rest_delivered() -> None:
    request = ExportLogsServiceRequest()
    request.MergeFromString(tool_call("vsc_ok"))
    request.MergeFromString(tool_call(None))
    request.MergeFromString(tool_call(None))
    async with running("vscode") as (receiver, sink, host):
        status, ctype, body, _ = await post(receiver.http_port, request.SerializeToString())
        json_status, _, json_body, _ = await post(receiver.http_port,
                                                  json_format.MessageToJson(request).encode(), JSON)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            grpc_reply = await channel.unary_unary(EXPORT)(request.SerializeToString())
        await assert_still_serving(receiver, sink)
        assert host.health.counters[("receiver/otlp/vscode", "rejected")] == 6
    assert (status, ctype, json_status) == (200, PROTOBUF, 200)
    for raw in (body, grpc_reply):
        response = ExportLogsServiceResponse.FromString(raw)
        assert response.partial_success.rejected_log_records == 2
        assert "resource attribute session.id" in response.partial_success.error_message
    assert json.loads(json_body)["partialSuccess"]["rejectedLogRecords"] == "2"
    assert [s.payload["resource"].get("session.id") for s in sink.signals[:3]] == ["vsc_ok"] * 3


async def test_codex_records_need_conversation_id() -> None:
    (_, case), *_ = fixture_cases("codex-otel.json")
    attrs = {k: v for k, v in case["input"]["attributes"].items() if k != "conversation.id"}
    async with running("codex") as (receiver, sink, _):
        result = await asyncio.to_thread(
            export_result, HttpLogExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/logs"),
            case["input"]["resource"], [attrs, case["input"]["attributes"]])
    assert result == LogRecordExportResult.SUCCESS  # a partial success is not retried
    assert [s.payload["attributes"]["conversation.id"] for s in sink.signals] == ["conv_fix_1"]


async def test_an_all_rejected_or_empty_request_does_not_call_the_pipeline() -> None:
    async with running("vscode") as (receiver, sink, _):
        status, _, body, _ = await post(receiver.http_port, tool_call(None))
        empty_status, _, empty_body, _ = await post(receiver.http_port, b"", PROTOBUF)
        assert ExportLogsServiceResponse.FromString(body).partial_success.rejected_log_records == 1
        assert (status, empty_status, empty_body) == (200, 200, b"")
        assert sink.batches == []
        await assert_still_serving(receiver, sink)


# -- bad input over HTTP ---------------------------------------------------------------------------


BAD_HTTP = [
    pytest.param(tool_call()[:-7], PROTOBUF, {}, 400, 3, id="truncated-protobuf"),
    pytest.param(b"\x0a\xff\xff\xff\xff\x0f", PROTOBUF, {}, 400, 3, id="garbage-protobuf"),
    pytest.param(b'{"resourceLogs": {"not": "a list"}}', JSON, {}, 400, 3, id="json-not-otlp"),
    pytest.param(b"[1, 2, 3]", JSON, {}, 400, 3, id="json-array"),
    pytest.param(b"{not json", JSON, {}, 400, 3, id="not-json"),
    pytest.param(tool_call(), PROTOBUF, {"Content_Encoding": "gzip"}, 400, 3, id="gzip-that-is-not-gzip"),
    pytest.param(gzip.compress(tool_call())[:-9], PROTOBUF, {"Content_Encoding": "gzip"}, 400, 3,
                 id="truncated-gzip"),
    pytest.param(tool_call(), PROTOBUF, {"Content_Encoding": "br"}, 415, 3, id="unsupported-encoding"),
    pytest.param(b"x" * 5000, PROTOBUF, {}, 413, 8, id="oversize"),
    pytest.param(gzip.compress(b"\0" * 50_000), PROTOBUF, {"Content_Encoding": "gzip"}, 413, 8,
                 id="oversize-once-gunzipped"),
    pytest.param(b"x" * 5000, JSON, {}, 413, 8, id="oversize-json"),
]


@pytest.mark.parametrize("body,ctype,headers,status,code", BAD_HTTP)
async def test_bad_http_input_gets_the_otlp_error_and_the_receiver_keeps_serving(
        body: bytes, ctype: str, headers: dict[str, str], status: int, code: int) -> None:
    async with running("vscode", max_request_bytes=4096) as (receiver, sink, host):
        got_status, got_ctype, reply, _ = await post(receiver.http_port, body, ctype, **headers)
        assert (got_status, got_ctype) == (status, ctype)
        error = status_of(reply, ctype)  # a google.rpc.Status in the request's own encoding
        assert error.code == code and error.message
        assert sink.batches == [] and host.health.snapshot()["ok"]  # a bad client is not our failure
        await assert_still_serving(receiver, sink)


async def test_a_stalled_body_is_408_with_a_status_that_reads_right() -> None:
    async with running("vscode", body_timeout=0.2) as (receiver, sink, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", receiver.http_port)
        writer.write(b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")  # then nothing more
        reply = await reader.read()  # the connection is closed after the answer
        writer.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.split()[1] == b"408"
        assert json.loads(body) == {"code": 3, "message": "request body not received within 0.2s"}  # not "request request"
        await assert_still_serving(receiver, sink)


@pytest.mark.parametrize("ctype", ["text/plain", "application/protobuf", "application/grpc", ""])
async def test_unsupported_content_type_is_415(ctype: str) -> None:
    async with running("vscode") as (receiver, sink, _):
        status, _, reply, _ = await post(receiver.http_port, tool_call(), ctype)
        assert status == 415 and b"application/x-protobuf" in reply
        await assert_still_serving(receiver, sink)


async def test_other_routes_and_methods() -> None:
    async with running("vscode") as (receiver, sink, _), aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{receiver.http_port}"
        async with http.get(f"{base}/v1/logs") as r:
            assert (r.status, r.headers["Allow"]) == (405, "POST")
        async with http.post(f"{base}/v1/log", data=tool_call()) as r:
            assert r.status == 404
        await assert_still_serving(receiver, sink)


async def test_traces_and_metrics_are_accepted_and_ignored() -> None:
    # VS Code exports traces and metrics to the same endpoint; refusing them would log errors.
    async with running("vscode") as (receiver, sink, host):
        for path in ("/v1/traces", "/v1/metrics"):
            assert (await post(receiver.http_port, b"", PROTOBUF, path))[:3] == (200, PROTOBUF, b"")
            assert (await post(receiver.http_port, b"{}", JSON, path))[:3] == (200, JSON, b"{}")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            reply = await trace_service_pb2_grpc.TraceServiceStub(channel).Export(
                trace_service_pb2.ExportTraceServiceRequest())
        assert reply == trace_service_pb2.ExportTraceServiceResponse()
        assert host.health.counters[("receiver/otlp/vscode", "ignored_requests")] == 5
        assert sink.batches == []


# -- bad input over gRPC ---------------------------------------------------------------------------


@pytest.mark.parametrize("body,code", [
    (tool_call()[:-7], grpc.StatusCode.INVALID_ARGUMENT),
    (b"\x0a\xff\xff\xff\xff\x0f", grpc.StatusCode.INVALID_ARGUMENT),
    (b"\x0a" + b"\x80" * 5000, grpc.StatusCode.RESOURCE_EXHAUSTED),
], ids=["truncated", "garbage", "oversize"])
@pytest.mark.parametrize("compression", [None, grpc.Compression.Gzip], ids=["plain", "gzip"])
async def test_bad_grpc_input_gets_its_status_and_the_receiver_keeps_serving(
        body: bytes, code: grpc.StatusCode, compression: Any) -> None:
    async with running("vscode", max_request_bytes=4096) as (receiver, sink, _):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary(EXPORT)(body, compression=compression)
        assert err.value.code() == code
        await assert_still_serving(receiver, sink)


# -- strings a JavaScript protobuf encoder writes --------------------------------------------------


def js_encoded(raw: bytes) -> bytes:
    """A one-record export request whose tool result is the string bytes ``raw``, taken as they are."""
    body = wire.parse_json(js_body([{"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "readFile",
                                     "gen_ai.tool.call.result": "#" * len(raw)}])).SerializeToString()
    assert body.count(b"#" * len(raw)) == 1
    return body.replace(b"#" * len(raw), raw)


async def test_a_lone_surrogate_in_a_protobuf_string_is_u_fffd_and_the_batch_is_kept() -> None:
    # As the OTLP/JSON path treats a lone "\ud83d" escape (README "Answers"): refusing the body
    # would lose every record of the batch for one broken character, and 400 is never retried.
    # protobufjs writes a lone UTF-16 surrogate (a string cut mid-pair) as its own 3 bytes.
    body = js_encoded("cut at \ud83d".encode("utf-8", "surrogatepass"))
    async with running("vscode") as (receiver, sink, host):
        status, _, reply, _ = await post(receiver.http_port, body)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            grpc_reply = await channel.unary_unary(EXPORT)(body)
        # Bytes that are no UTF-8 in any reading are still refused.
        bad_status, _, bad_reply, _ = await post(receiver.http_port, js_encoded(b"a stray byte: \xff"))
        assert ("receiver/otlp/vscode", "refused") in host.health.counters
    assert (status, reply, grpc_reply) == (200, b"", b"")
    assert [s.payload["attributes"]["gen_ai.tool.call.result"] for s in sink.signals] == ["cut at \ufffd"] * 2
    assert (bad_status, status_of(bad_reply, PROTOBUF).code) == (400, 3)


# -- a failing pipeline ----------------------------------------------------------------------------


async def test_a_failing_pipeline_is_retryable_reported_and_recovers() -> None:
    async with running("vscode") as (receiver, sink, host):
        sink.fail = True
        status, ctype, body, headers = await post(receiver.http_port, tool_call())
        json_status, _, json_reply, _ = await post(receiver.http_port,
                                                   js_body([{"event.name": "copilot_chat.agent.turn"}]), JSON)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary(EXPORT)(tool_call())
        assert (status, ctype, headers["Retry-After"], json_status) == (503, PROTOBUF, "1", 503)
        assert status_of(body, PROTOBUF).code == 14 and status_of(json_reply, JSON).code == 14
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        problem = host.health.snapshot()["problems"]["receiver/otlp/vscode"]
        assert "disk full" in problem["pipeline-error"]
        sink.fail = False
        await assert_still_serving(receiver, sink)
        assert host.health.snapshot()["ok"]


async def test_the_sdk_exporter_retries_through_a_pipeline_outage() -> None:
    async with running("vscode") as (receiver, sink, _):
        sink.fail = True

        async def heal() -> None:
            while not receiver.health.problems:
                await asyncio.sleep(0.01)
            sink.fail = False
        healer = asyncio.create_task(heal())
        result = await asyncio.to_thread(
            export_result, HttpLogExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/logs"),
            {"session.id": "s1"}, [{"event.name": "copilot_chat.agent.turn", "turn.index": 1}])
        await healer
    assert result == LogRecordExportResult.SUCCESS  # 503 was retried, not dropped
    assert [s.payload["attributes"]["turn.index"] for s in sink.signals] == [1]


# -- binding ---------------------------------------------------------------------------------------


def test_default_endpoints_are_loopback() -> None:
    cfg = OtlpConfig(profile="vscode", grpc={}, http={})
    assert cfg.grpc.endpoint.startswith("127.0.0.1:") and cfg.http.endpoint.startswith("127.0.0.1:")


async def test_a_taken_port_fails_start_and_a_stopped_receiver_stops_listening() -> None:
    async with running("vscode") as (first, _, _):
        for section, port in (("grpc", first.grpc_port), ("http", first.http_port)):
            cfg = OtlpConfig(profile="vscode", **{section: {"endpoint": f"127.0.0.1:{port}"}})
            second = OtlpReceiver(CreateSettings(id="otlp/second"), cfg, Recorder())
            with pytest.raises(OSError):
                await second.start(Host())
            await second.shutdown()
        ports = (first.grpc_port, first.http_port)
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


async def test_a_max_request_bytes_past_what_grpc_takes_still_starts_both_protocols() -> None:
    # grpc's max_receive_message_length is a C int: 4 GiB made start fail with an OverflowError.
    async with running("vscode", max_request_bytes=4 << 30) as (receiver, sink, _):
        await assert_still_serving(receiver, sink)


async def test_only_the_configured_protocol_listens() -> None:
    cfg = OtlpConfig(profile="codex", http={"endpoint": "127.0.0.1:0"})
    receiver = OtlpReceiver(CreateSettings(id="otlp/codex"), cfg, Recorder())
    await receiver.start(Host())
    try:
        assert receiver.grpc_port is None and receiver.grpc_server is None and receiver.http_port
    finally:
        await receiver.shutdown()
