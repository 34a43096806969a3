"""Flattening OTLP log records and decoding the OTLP wire encodings (protobuf, OTLP/JSON, gzip)."""

from __future__ import annotations

import base64
import gzip
import json
import math
from typing import Any

import pytest
from aep_collector.processors.mapping import codex_otel, vscode_otel
from aep_collector.processors.mapping.otlp_vendors import time_of
from aep_collector.receivers.otlp import wire
from aep_collector.receivers.otlp.flatten import any_value, count_records, flatten_record, flatten_request
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource

from tests.conftest import corpus

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize("value,expect", [
    (AnyValue(string_value="x"), "x"),
    (AnyValue(string_value=""), ""),
    (AnyValue(bool_value=True), True),
    (AnyValue(bool_value=False), False),
    (AnyValue(int_value=0), 0),
    (AnyValue(int_value=2**62 + 1), 2**62 + 1),
    (AnyValue(int_value=-7), -7),
    (AnyValue(double_value=0.25), 0.25),
    (AnyValue(double_value=math.inf), "Infinity"),
    (AnyValue(double_value=-math.inf), "-Infinity"),
    (AnyValue(double_value=math.nan), "NaN"),
    (AnyValue(bytes_value=b"\x00\xff"), "AP8="),
    (AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(string_value="a")])), [1, "a"]),
    (AnyValue(kvlist_value=KeyValueList(values=[
        KeyValue(key="k", value=AnyValue(kvlist_value=KeyValueList(values=[
            KeyValue(key="n", value=AnyValue(bool_value=False))])))])), {"k": {"n": False}}),
    (AnyValue(), None),
], ids=["str", "empty-str", "true", "false", "zero", "int64", "negative", "double", "inf", "-inf", "nan",
        "bytes", "array", "kvlist", "unset"])
def test_any_value(value: AnyValue, expect: Any) -> None:
    got = any_value(value)
    assert got == expect and type(got) is type(expect)  # bool stays bool, int stays int


def kv(key: str, **value: Any) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))


def test_flatten_record_carries_every_field_the_envelope_wiring_needs() -> None:
    record = LogRecord(time_unix_nano=1783073704221000000, observed_time_unix_nano=1783073704300000000,
                       severity_number=13, severity_text="WARN", trace_id=bytes.fromhex(TRACE),
                       span_id=bytes.fromhex(SPAN), flags=1, body=AnyValue(string_value="hello"),
                       event_name="copilot_chat.tool.call",
                       attributes=[kv("duration_ms", int_value=63), kv("success", bool_value=True)])
    flat = flatten_record({"session.id": "s"}, {"name": "copilot-chat"}, record)
    assert flat == {
        "resource": {"session.id": "s"}, "scope": {"name": "copilot-chat"},
        "attributes": {"duration_ms": 63, "success": True, "event.name": "copilot_chat.tool.call"},
        "time_unix_nano": 1783073704221000000, "observed_time_unix_nano": 1783073704300000000,
        "severity_number": 13, "severity_text": "WARN", "trace_id": TRACE, "span_id": SPAN, "flags": 1,
        "body": "hello",
    }


def test_event_name_attribute_wins_over_the_field_and_unset_fields_are_left_out() -> None:
    record = LogRecord(observed_time_unix_nano=5, event_name="from.field",
                       attributes=[kv("event.name", string_value="from.attribute")])
    flat = flatten_record({}, {}, record)
    assert flat == {"resource": {}, "attributes": {"event.name": "from.attribute"},
                    "time_unix_nano": 5, "observed_time_unix_nano": 5}


def test_flatten_request_keeps_order_and_gives_each_record_its_own_resource() -> None:
    request = json_format.ParseDict({"resourceLogs": [
        {"resource": {"attributes": [{"key": "session.id", "value": {"stringValue": "a"}}]},
         "scopeLogs": [{"logRecords": [{"eventName": "one"}, {"eventName": "two"}]},
                       {"scope": {"name": "s2", "version": "1"}, "logRecords": [{"eventName": "three"}]}]},
        {"resource": {}, "scopeLogs": [{"logRecords": [{"eventName": "four"}]}]},
    ]}, ExportLogsServiceRequest())
    flats = flatten_request(request)
    assert [f["attributes"]["event.name"] for f in flats] == ["one", "two", "three", "four"]
    assert count_records(request) == 4
    assert flats[2]["scope"] == {"name": "s2", "version": "1"}
    flats[0]["resource"]["session.id"] = "changed"
    assert flats[1]["resource"] == {"session.id": "a"} and flats[3]["resource"] == {}


def sdk_request(resource: dict[str, Any], records: list[dict[str, Any]]) -> ExportLogsServiceRequest:
    """Records emitted through the real OTel Python SDK, encoded as its OTLP exporters encode them."""
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=Resource.create(resource))
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("aep-test")
    for r in records:
        logger.emit(event_name=r.get("event_name"), attributes=r["attributes"])
    provider.shutdown()
    return encode_logs(memory.get_finished_logs())


def fixture_records() -> list[Any]:
    out = []
    for fname, mod in (("vscode-otel.json", vscode_otel), ("codex-otel.json", codex_otel)):
        doc = corpus(f"mappings/{fname}")
        for name, case in [*doc["records"].items(), ("unknown", doc["unknown"])]:
            out.append(pytest.param(mod, case["input"], id=f"{fname.split('.')[0]}:{name}"))
    return out


@pytest.mark.parametrize("mod,pinned", fixture_records())
def test_sdk_emitted_fixture_records_flatten_back_to_the_fixture_input(mod: Any, pinned: dict[str, Any]) -> None:
    # The SDK sends the name in LogRecord.event_name, not as an attribute (bridges digest §6.3).
    attrs = {k: v for k, v in pinned["attributes"].items() if k != "event.name"}
    request = sdk_request(pinned["resource"], [{"event_name": pinned["attributes"]["event.name"],
                                                "attributes": attrs}])
    (flat,) = flatten_request(request)
    assert flat["attributes"] == pinned["attributes"]
    assert flat["resource"].items() >= pinned["resource"].items()  # plus telemetry.sdk.*
    from_sdk = mod.map_record(flat, "primary")
    # The SDK stamps the record's time (the fixture input has none): the drafts carry it as `time`.
    assert all(d.pop("time") == time_of(flat["time_unix_nano"]) for d in from_sdk)
    assert from_sdk == mod.map_record(pinned, "primary")


def otlp_json_as_js_sends_it() -> dict[str, Any]:
    """OTLP/JSON as @opentelemetry/exporter-logs-otlp-http sends it: camelCase, hex ids, int64 strings."""
    return {"resourceLogs": [{
        "resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "copilot-chat"}},
            {"key": "session.id", "value": {"stringValue": "vsc_js_1"}}], "droppedAttributesCount": 0},
        "scopeLogs": [{"scope": {"name": "copilot-chat", "version": "0.37.0"}, "logRecords": [{
            "timeUnixNano": "1783073704221000000", "observedTimeUnixNano": "1783073704221000000",
            "severityNumber": 9, "severityText": "INFO", "body": {"stringValue": "tool call"},
            "eventName": "copilot_chat.tool.call", "droppedAttributesCount": 0, "flags": 1,
            "traceId": TRACE, "spanId": SPAN,
            "attributes": [
                {"key": "gen_ai.tool.name", "value": {"stringValue": "readFile"}},
                {"key": "duration_ms", "value": {"intValue": "63"}},
                {"key": "success", "value": {"boolValue": True}},
                {"key": "ratio", "value": {"doubleValue": 0.5}},
                {"key": "blob", "value": {"bytesValue": "AP8="}}]}]}]}]}


def test_otlp_json_hex_ids_and_int64_strings_decode_exactly() -> None:
    (flat,) = flatten_request(wire.parse_json(json.dumps(otlp_json_as_js_sends_it()).encode()))
    assert flat["trace_id"] == TRACE and flat["span_id"] == SPAN  # not base64-misread into 24 bytes
    assert flat["time_unix_nano"] == 1783073704221000000 and flat["severity_number"] == 9
    assert flat["attributes"] == {"gen_ai.tool.name": "readFile", "duration_ms": 63, "success": True,
                                  "ratio": 0.5, "blob": "AP8=", "event.name": "copilot_chat.tool.call"}
    assert flat["resource"] == {"service.name": "copilot-chat", "session.id": "vsc_js_1"}


def test_otlp_json_with_snake_case_keys_and_unknown_fields_decodes() -> None:
    doc = {"resource_logs": [{"scope_logs": [{"log_records": [
        {"event_name": "x", "trace_id": TRACE, "someFutureField": {"a": 1}}]}]}], "futureTopLevel": True}
    (flat,) = flatten_request(wire.parse_json(json.dumps(doc).encode()))
    assert flat["trace_id"] == TRACE and flat["attributes"] == {"event.name": "x"}


def test_json_object_with_only_unknown_keys_is_an_empty_request() -> None:
    # OTLP/HTTP: receivers MUST ignore unknown JSON fields, so this is valid and carries nothing.
    assert count_records(wire.parse_json(b'{"foo": 1}')) == 0


@pytest.mark.parametrize("body", [
    b"not json", b"\xff\xfe\x00garbage", b"[1, 2]", b'"a string"', b'{"resourceLogs": 5}',
    b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]}',
    b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityNumber": {"a": 1}}]}]}]}',
    b'{"resourceLogs": [{"scopeLogs": [{"logRecords": {"not": "a list"}}]}]}',
    b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"timeUnixNano": "soon"}]}]}]}',
    b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"attributes": [{"key": "a", "value": {"intValue": 1.5}}]}]}]}]}',
], ids=["text", "binary", "array", "string", "wrong-type", "bad-hex", "bad-enum-type", "records-not-list",
        "bad-int64", "fractional-int"])
def test_json_that_is_not_otlp_is_invalid_argument(body: bytes) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.parse_json(body)
    assert (err.value.status, err.value.code) == (400, wire.INVALID_ARGUMENT)


def test_truncated_protobuf_is_invalid_argument() -> None:
    good = sdk_request({"session.id": "s"}, [{"event_name": "x", "attributes": {"a": "b" * 40}}])
    raw = good.SerializeToString()
    assert count_records(wire.parse_protobuf(raw)) == 1
    with pytest.raises(wire.WireError) as err:
        wire.parse_protobuf(raw[: len(raw) // 2])
    assert (err.value.status, err.value.code) == (400, wire.INVALID_ARGUMENT)


def test_gunzip_round_trip_and_concatenated_members() -> None:
    assert wire.gunzip(gzip.compress(b"abc"), 10) == b"abc"
    assert wire.gunzip(gzip.compress(b"ab") + gzip.compress(b"cd"), 10) == b"abcd"


@pytest.mark.parametrize("body,limit,status", [
    (b"plainly not gzip", 100, 400),
    (gzip.compress(b"x" * 1000)[:-12], 5000, 400),
    (b"", 100, 400),
    (gzip.compress(b"\0" * 200_000), 100_000, 413),
    (gzip.compress(b"a" * 60) + gzip.compress(b"b" * 60), 100, 413),
], ids=["not-gzip", "truncated", "empty", "bomb", "members-over-limit"])
def test_gunzip_refusals(body: bytes, limit: int, status: int) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.gunzip(body, limit)
    assert err.value.status == status


@pytest.mark.parametrize("ctype", [wire.PROTOBUF, wire.JSON])
def test_status_body_is_a_real_google_rpc_status(ctype: str) -> None:
    body = wire.encode_status(wire.INVALID_ARGUMENT, "bad body: ü", ctype)
    status = status_pb2.Status()
    if ctype == wire.JSON:
        json_format.Parse(body, status)
    else:
        status.ParseFromString(body)
    assert (status.code, status.message) == (wire.INVALID_ARGUMENT, "bad body: ü")


def test_partial_success_json_spells_int64_as_a_string() -> None:
    response = ExportLogsServiceResponse()
    response.partial_success.rejected_log_records = 2
    response.partial_success.error_message = "no session"
    assert json.loads(wire.encode_message(response, wire.JSON)) == {
        "partialSuccess": {"rejectedLogRecords": "2", "errorMessage": "no session"}}
    assert wire.encode_message(ExportLogsServiceResponse(), wire.JSON) == b"{}"
    assert wire.encode_message(ExportLogsServiceResponse(), wire.PROTOBUF) == b""


def test_bytes_attributes_in_json_use_base64_like_the_protobuf_path() -> None:
    doc = otlp_json_as_js_sends_it()
    (from_json,) = flatten_request(wire.parse_json(json.dumps(doc).encode()))
    request = wire.parse_json(json.dumps(doc).encode())
    (from_proto,) = flatten_request(wire.parse_protobuf(request.SerializeToString()))
    assert from_json == from_proto
    assert base64.b64decode(from_json["attributes"]["blob"]) == b"\x00\xff"
