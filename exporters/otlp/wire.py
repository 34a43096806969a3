"""The projection's dicts <-> OTLP protobuf (``ExportLogsServiceRequest``), and back for checking."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

SCOPE = InstrumentationScope(name="aep-collector")


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        if -(1 << 63) <= value < (1 << 63):
            return AnyValue(int_value=value)
        return AnyValue(string_value=str(value))  # beyond int64: kept exactly, as text
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=key_values(value)))
    if isinstance(value, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    return AnyValue()  # null: an empty AnyValue


def key_values(mapping: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=str(k), value=any_value(v)) for k, v in mapping.items()]


def log_record(rec: dict[str, Any]) -> LogRecord:
    out = LogRecord(time_unix_nano=rec["time_unix_nano"], observed_time_unix_nano=rec["time_unix_nano"],
                    event_name=rec["event_name"], severity_text=rec["severity_text"],
                    severity_number=rec["severity_number"], attributes=key_values(rec["attributes"]))
    if "trace_id" in rec:
        out.trace_id = bytes.fromhex(rec["trace_id"])
        out.span_id = bytes.fromhex(rec["span_id"])
        out.flags = rec["flags"]
    if "body" in rec:
        out.body.CopyFrom(any_value(rec["body"]))
    return out


def request(records: list[dict[str, Any]], built: list[LogRecord] | None = None) -> ExportLogsServiceRequest:
    """One request: a ResourceLogs per distinct resource (per agent), records in their order.
    ``built``: each record's ``log_record``, made beforehand (one at a time, to find any it refuses)."""
    groups: dict[tuple[tuple[str, Any], ...], list[LogRecord]] = {}
    for i, rec in enumerate(records):
        key = tuple(sorted(rec["resource"].items()))
        groups.setdefault(key, []).append(built[i] if built is not None else log_record(rec))
    return ExportLogsServiceRequest(resource_logs=[
        ResourceLogs(resource=Resource(attributes=key_values(dict(key))),
                     scope_logs=[ScopeLogs(scope=SCOPE, log_records=recs)])
        for key, recs in groups.items()])


def from_any(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "kvlist_value":
        return {kv.key: from_any(kv.value) for kv in value.kvlist_value.values}
    if kind == "array_value":
        return [from_any(v) for v in value.array_value.values]
    return getattr(value, kind)


def records_of(req: ExportLogsServiceRequest) -> list[dict[str, Any]]:
    """A request back to the projection's dicts (what a test compares with the pins)."""
    out = []
    for rl in req.resource_logs:
        resource = {kv.key: from_any(kv.value) for kv in rl.resource.attributes}
        for sl in rl.scope_logs:
            for r in sl.log_records:
                rec: dict[str, Any] = {
                    "time_unix_nano": r.time_unix_nano, "event_name": r.event_name,
                    "severity_text": r.severity_text, "severity_number": r.severity_number,
                    "resource": resource, "attributes": {kv.key: from_any(kv.value) for kv in r.attributes},
                }
                if r.trace_id:
                    rec.update(trace_id=r.trace_id.hex(), span_id=r.span_id.hex(), flags=r.flags)
                if r.HasField("body"):
                    rec["body"] = from_any(r.body)
                out.append(rec)
    return out
