"""OTLP log records -> the flat dicts the OTel-channel mappings read (bridges digest §1.2).

One flattened record::

    {"resource":   {dotted.key: value},   # resource attributes
     "attributes": {dotted.key: value},   # record attributes; event.name from the field if absent
     "scope"?:     {"name"?, "version"?},
     "time_unix_nano"?: int,              # the record time, else its observed time
     "observed_time_unix_nano"?: int,
     "severity_number"?: int, "severity_text"?: str,
     "trace_id"?: hex, "span_id"?: hex, "flags"?: int,
     "body"?: value}

Values: string, bool, int (int64 exactly, never a float), float, list, dict; bytes become
base64 text (the OTLP/JSON spelling); a non-finite double becomes its OTLP/JSON string
(``"NaN"``, ``"Infinity"``, ``"-Infinity"``) so the record stays JSON. Keys left out are unset.

Two paths give the same dicts: ``flatten_request`` reads a decoded message (OTLP/JSON comes in
that way), ``flatten_protobuf`` reads a binary body. The binary one is the hot path: it reads
each record's attributes as their raw ``KeyValue`` bytes (a second message class over the same
wire format, ``_VIEW``) and converts each distinct one once, where reading them as messages
builds two wrapper objects and a handful of C calls per attribute per record.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.resource.v1 import resource_pb2

from . import wire


def any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as plain Python (unset -> None)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        d = value.double_value
        if math.isfinite(d):
            return d
        return "NaN" if math.isnan(d) else ("Infinity" if d > 0 else "-Infinity")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return key_values(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return None


# The kinds whose value protobuf already hands over as the plain Python value (no conversion).
_PLAIN = frozenset({"string_value", "bool_value", "int_value"})


def key_values(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    """Repeated ``KeyValue`` -> dict (a repeated key: the last one wins)."""
    out: dict[str, Any] = {}
    for kv in kvs:  # the per-record hot loop: plain kinds are read directly, the rest via any_value
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = getattr(value, kind) if kind in _PLAIN else any_value(value)
    return out


def flatten_record(resource: dict[str, Any], scope: dict[str, str], record: LogRecord) -> dict[str, Any]:
    """One ``LogRecord`` with its resource and scope as a flat dict (see the module docstring)."""
    return _flat(resource, scope, record, key_values(record.attributes))


def _flat(resource: dict[str, Any], scope: dict[str, str], record: Any, attributes: dict[str, Any]) -> dict[str, Any]:
    """A record's flat dict around ``attributes`` already read (from messages, or from raw bytes)."""
    # Each field is read once: a protobuf attribute read is a C call that builds a Python value.
    event_name = record.event_name
    if event_name:
        name = attributes.get("event.name")
        if not isinstance(name, str) or not name:
            # The Python and JS SDKs put the name in LogRecord.event_name (field 12), not an attribute.
            attributes["event.name"] = event_name
    flat: dict[str, Any] = {"resource": dict(resource), "attributes": attributes}
    if scope:
        flat["scope"] = dict(scope)
    observed = record.observed_time_unix_nano
    when = record.time_unix_nano or observed
    if when:
        flat["time_unix_nano"] = when
    if observed:
        flat["observed_time_unix_nano"] = observed
    severity = record.severity_number
    if severity:
        flat["severity_number"] = severity  # an enum field reads as a plain int
    severity_text = record.severity_text
    if severity_text:
        flat["severity_text"] = severity_text
    trace_id = record.trace_id
    if trace_id:
        if len(trace_id) != 16:
            raise _bad_id("trace_id", trace_id, 16)
        flat["trace_id"] = trace_id.hex()
    span_id = record.span_id
    if span_id:
        if len(span_id) != 8:
            raise _bad_id("span_id", span_id, 8)
        flat["span_id"] = span_id.hex()
    flags = record.flags
    if flags:
        flat["flags"] = flags
    if record.HasField("body"):
        body = any_value(record.body)
        if body is not None:
            flat["body"] = body
    return flat


def _bad_id(name: str, value: bytes, size: int) -> wire.WireError:
    # As the OTel Collector (pdata): an id is empty or exactly its size; anything else is a 400,
    # not a record whose trace context silently vanishes further on.
    return wire.WireError(400, wire.INVALID_ARGUMENT,
                          f"{name} is {len(value)} bytes; an OTLP {name} is {size} bytes (or empty)")


def flatten_request(request: ExportLogsServiceRequest) -> list[dict[str, Any]]:
    """Every log record of an export request, flattened, in request order."""
    out: list[dict[str, Any]] = []
    for resource_logs in request.resource_logs:
        resource = key_values(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            scope: dict[str, str] = {}
            if scope_logs.scope.name:
                scope["name"] = scope_logs.scope.name
            if scope_logs.scope.version:
                scope["version"] = scope_logs.scope.version
            for record in scope_logs.log_records:
                out.append(flatten_record(resource, scope, record))
    return out


def count_records(request: Any) -> int:
    """How many log records an export request (or its view) carries."""
    return sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)


def check_records(request: Any, limit: int) -> None:
    """Refuse a request of more than ``limit`` log records (413 / RESOURCE_EXHAUSTED), before a
    record is flattened: their count, not their bytes, is what the pipeline's work grows with."""
    n = count_records(request)
    if n > limit:
        raise wire.too_many_records(n, limit)


def _view_class() -> type[Message]:
    """``ExportLogsServiceRequest`` with ``LogRecord.attributes`` read as ``repeated bytes``.

    A ``KeyValue`` is length-delimited on the wire, as ``bytes`` is, so the same body parses
    into this class with each attribute left as its raw encoding. Built in a private pool: the
    generated classes in the default pool are untouched.
    """
    pool = descriptor_pool.DescriptorPool()
    for module in (common_pb2, resource_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    logs = descriptor_pb2.FileDescriptorProto.FromString(logs_pb2.DESCRIPTOR.serialized_pb)
    (record,) = (m for m in logs.message_type if m.name == "LogRecord")
    (field,) = (f for f in record.field if f.name == "attributes")
    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
    field.ClearField("type_name")
    pool.Add(logs)
    pool.AddSerializedFile(logs_service_pb2.DESCRIPTOR.serialized_pb)
    name = ExportLogsServiceRequest.DESCRIPTOR.full_name
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


_VIEW = _view_class()

# Raw KeyValue bytes -> (key, value), for values that cannot be changed in place (str, int, float,
# bool, None): attribute sets repeat across records (tool names, flags, model names), so most
# attributes of a batch are one dict lookup. Bounded: emptied when full; long values (prompts,
# outputs), rarely repeated, are never kept.
_ATTRIBUTES: dict[bytes, tuple[str, Any]] = {}
_CACHE_ENTRIES = 4096
# Also the length up to which an attribute's own parse is trusted for the body: protobuf refuses a
# message nested past its depth limit (100 levels), and an attribute parsed alone starts 4 levels
# higher than in place, so a KeyValue accepted alone may be refused inside a body. Each level
# costs at least 2 bytes (a tag and a length, or a group's start and end tags), so nothing in 160
# bytes nests deep enough to matter (tests/test_otlp_fastpath.py holds that); a longer attribute,
# nested or not, has the whole body parsed as the real message once.
_CACHE_BYTES = 160


def flatten_protobuf(body: bytes, max_records: int | None = None) -> list[dict[str, Any]]:
    """A binary ``ExportLogsServiceRequest`` body flattened, in request order: what
    ``flatten_request(wire.parse_protobuf(body))`` gives, and the same ``WireError`` for a body
    it refuses.

    The body is parsed once, into the view. The view takes any bytes as an attribute, so each
    attribute is then parsed alone (or found in the cache, which holds only attributes that
    parsed). Where that cannot tell what the real parse would say, the real parse decides: when the
    view or an attribute fails to parse (its error is the refusal), and when an attribute is long
    enough to nest past protobuf's depth limit in place (see ``_CACHE_BYTES``). With
    ``max_records``, a body of more records is refused (``check_records``) before any is read.
    """
    unsure = True  # until the real parse has accepted the body

    def attribute(raw: bytes) -> tuple[str, Any]:
        # One raw KeyValue as (key, value), read as key_values reads it (a cache miss).
        nonlocal unsure
        kv = KeyValue.FromString(raw)
        value = kv.value
        kind = value.WhichOneof("value")
        item = (kv.key, getattr(value, kind) if kind in _PLAIN else any_value(value))
        if len(raw) > _CACHE_BYTES:
            if unsure:
                wire.parse_protobuf(body)  # raises the refusal if the body is past the depth limit
                unsure = False
        elif kind != "array_value" and kind != "kvlist_value":
            if len(_ATTRIBUTES) >= _CACHE_ENTRIES:
                _ATTRIBUTES.clear()
            _ATTRIBUTES[raw] = item
        return item

    try:
        view = _VIEW.FromString(body)
    except (DecodeError, RecursionError, ValueError):  # what wire.parse_protobuf catches
        view = None
    if view is not None:
        if max_records is not None:
            check_records(view, max_records)
        try:
            return _flatten_view(view, attribute)
        except (DecodeError, RecursionError, ValueError):
            pass
    request = wire.parse_protobuf(body)  # raises its refusal
    if max_records is not None:
        check_records(request, max_records)
    return flatten_request(request)


def _flatten_view(request: Any, attribute: Callable[[bytes], tuple[str, Any]]) -> list[dict[str, Any]]:
    cached, flat_record = _ATTRIBUTES.get, _flat
    out: list[dict[str, Any]] = []
    append = out.append
    for resource_logs in request.resource_logs:
        resource = key_values(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            scope: dict[str, str] = {}
            scope_message = scope_logs.scope
            if scope_message.name:
                scope["name"] = scope_message.name
            if scope_message.version:
                scope["version"] = scope_message.version
            for record in scope_logs.log_records:
                # flatten_record's, with the attributes from their bytes.
                attributes: dict[str, Any] = {}
                # A slice hands the raw attributes over as one list: iterating the repeated
                # field itself fetches each element through a separate C call.
                for raw in record.attributes[:]:
                    key, value = cached(raw) or attribute(raw)
                    attributes[key] = value
                append(flat_record(resource, scope, record, attributes))
    return out
