"""OTLP wire encodings: protobuf and OTLP/JSON bodies, gzip, responses and ``google.rpc.Status``."""

from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from typing import Any

from aep_collector.pipeline.wire import DecodeError as JsonDecodeError
from aep_collector.pipeline.wire import loads, scrub_text
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CONTENT_TYPES = (PROTOBUF, JSON)

# google.rpc.Code values the receiver answers with (the gRPC status codes).
INVALID_ARGUMENT = 3
RESOURCE_EXHAUSTED = 8
INTERNAL = 13
UNAVAILABLE = 14

_ID_KEYS = ("traceId", "spanId", "trace_id", "span_id")
_ID_BYTES = {"traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8}


class WireError(Exception):
    """A request body the receiver cannot use: HTTP status, google.rpc code and a message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def too_many_records(n: int, limit: int) -> WireError:
    # 413 / RESOURCE_EXHAUSTED as for max_request_bytes: the sender must split the batch, and
    # neither is retried (RESOURCE_EXHAUSTED only with RetryInfo, which is never sent).
    return WireError(413, RESOURCE_EXHAUSTED, f"request has {n} log records, over this receiver's "
                     f"max_request_records ({limit}): send smaller batches")


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body, refusing more than ``limit`` bytes of output (a gzip bomb is 413)."""
    out = bytearray()
    data = body
    try:
        while True:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing only
            out += inflater.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise WireError(413, RESOURCE_EXHAUSTED, f"request body over {limit} bytes once decompressed")
            if not inflater.eof:
                if inflater.unconsumed_tail:
                    raise WireError(413, RESOURCE_EXHAUSTED,
                                    f"request body over {limit} bytes once decompressed")
                raise WireError(400, INVALID_ARGUMENT, "gzip body is truncated")
            data = inflater.unused_data
            if not data:  # RFC 1952 §2.2: a gzip file may hold several members back to back
                return bytes(out)
    except zlib.error as exc:
        raise WireError(400, INVALID_ARGUMENT, f"Content-Encoding is gzip but the body is not: {exc}") from None


def parse_protobuf(body: bytes) -> ExportLogsServiceRequest:
    """A binary ``ExportLogsServiceRequest``; a lone surrogate encoded in a string becomes U+FFFD."""
    request = ExportLogsServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        # Only a refused body pays for this: most refusals are not about UTF-8 at all.
        repaired = _lone_surrogates_replaced(body)
        if repaired is None:
            raise WireError(400, INVALID_ARGUMENT, f"body is not an OTLP ExportLogsServiceRequest: {exc}") from None
        request = ExportLogsServiceRequest.FromString(repaired)  # every string is UTF-8 now
    return request


def _lenient_class() -> tuple[type[Message], frozenset[str]]:
    """``ExportLogsServiceRequest`` with every ``string`` field read as ``bytes`` (no UTF-8 check),
    and the full names of those fields. Built in a private pool, as ``flatten._view_class``."""
    pool = descriptor_pool.DescriptorPool()
    text: set[str] = set()

    def add(file: FileDescriptor, done: set[str]) -> None:
        for dependency in file.dependencies:
            add(dependency, done)
        if file.name in done:
            return
        done.add(file.name)
        proto = descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb)
        messages = [(f"{proto.package}.{m.name}", m) for m in proto.message_type]
        while messages:
            name, message = messages.pop()
            messages += [(f"{name}.{n.name}", n) for n in message.nested_type]
            for field in message.field:
                if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
                    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                    text.add(f"{name}.{field.name}")
        pool.Add(proto)

    add(ExportLogsServiceRequest.DESCRIPTOR.file, set())
    name = ExportLogsServiceRequest.DESCRIPTOR.full_name
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name)), frozenset(text)


_LENIENT, _TEXT_FIELDS = _lenient_class()


def _lone_surrogates_replaced(body: bytes) -> bytes | None:
    """``body`` with each lone surrogate encoded in a string field (ED A0 80..ED BF BF, what a
    JavaScript protobuf encoder writes for a broken UTF-16 string) replaced by U+FFFD, as the JSON
    decoder does with a lone ``\\ud800`` escape; None if the body has other faults (bad UTF-8 too)."""
    try:
        message = _LENIENT.FromString(body)
        _replace_in(message)
    except (DecodeError, RecursionError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return message.SerializeToString()


def _replace_in(message: Message) -> None:
    for field, value in message.ListFields():
        repeated = field.is_repeated
        if field.full_name in _TEXT_FIELDS:
            if repeated:
                value[:] = [_as_text(v) for v in value]
            else:
                setattr(message, field.name, _as_text(value))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in (value if repeated else (value,)):
                _replace_in(item)


def _as_text(raw: bytes) -> bytes:
    # surrogatepass decodes an encoded surrogate and still refuses every other invalid sequence.
    return scrub_text(raw.decode("utf-8", "surrogatepass")).encode("utf-8")


def _hex_ids_to_base64(doc: dict[str, Any], max_records: int | None = None) -> None:
    # OTLP/JSON spells traceId/spanId as hex, proto3 JSON as base64: ParseDict would silently
    # misread 32 hex characters as a 24-byte id (bridges digest §6.2, §7 item 9).
    # The same walk counts the records, so an oversized batch is refused before ParseDict (pure
    # Python, per record) ever sees it.
    n = 0
    for rl in _items(doc, "resourceLogs", "resource_logs"):
        for sl in _items(rl, "scopeLogs", "scope_logs"):
            records = _items(sl, "logRecords", "log_records")
            n += len(records)
            if max_records is not None and n > max_records:
                raise too_many_records(_count(doc), max_records)
            for lr in records:
                for key in _ID_KEYS:
                    value = lr.get(key)
                    if isinstance(value, str):
                        try:
                            raw = bytes.fromhex(value)
                        except ValueError:
                            raise WireError(400, INVALID_ARGUMENT,
                                            f"{key} {value[:40]!r} is not hex (OTLP/JSON ids are hex)") from None
                        if raw and len(raw) != _ID_BYTES[key]:  # the Collector's pdata refuses it too
                            raise WireError(400, INVALID_ARGUMENT,
                                            f"{key} {value[:40]!r} is {len(raw)} bytes; an OTLP {key} is "
                                            f"{_ID_BYTES[key] * 2} hex characters (or empty)")
                        lr[key] = base64.b64encode(raw).decode("ascii")


def _count(doc: dict[str, Any]) -> int:
    return sum(len(_items(sl, "logRecords", "log_records"))
               for rl in _items(doc, "resourceLogs", "resource_logs")
               for sl in _items(rl, "scopeLogs", "scope_logs"))


def _items(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        return []
    given = [key for key in keys if key in obj]
    if len(given) > 1:
        # ParseDict keeps the spelling that comes last (a null one empties the field), so the
        # records counted and given hex ids here would not be the ones read: refused, never guessed.
        raise WireError(400, INVALID_ARGUMENT, f"{' and '.join(given)} are one field (OTLP/JSON may "
                        "spell a field either way, not both)")
    for key in given:
        value = obj[key]
        if isinstance(value, list):
            for item in value:
                if not isinstance(item, dict):
                    # ParseDict reads [] and "" as empty messages: uncounted, they were records
                    # past max_request_records. An OTLP/JSON message is an object.
                    raise WireError(400, INVALID_ARGUMENT, f"{key} holds {json.dumps(item)[:40]}, "
                                    "not an object (each item of an OTLP/JSON message list is one)")
            return value
    return []


def parse_json(body: bytes, max_records: int | None = None) -> ExportLogsServiceRequest:
    """An OTLP/JSON ``ExportLogsServiceRequest`` (hex ids, int64 as strings, unknown keys ignored).

    The body goes through the collector's one JSON decoder (``aep_collector.pipeline.wire.loads``): lone
    surrogate escapes become U+FFFD and oversized numbers are a 400, as on every hook receiver.
    More than ``max_records`` log records is a 413.
    """
    try:
        doc = loads(body)
    except JsonDecodeError as exc:
        raise WireError(400, INVALID_ARGUMENT, f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError(400, INVALID_ARGUMENT,
                        f"body is JSON {type(doc).__name__}, not an OTLP ExportLogsServiceRequest object")
    _hex_ids_to_base64(doc, max_records)
    request = ExportLogsServiceRequest()
    try:
        # OTLP/HTTP: receivers MUST ignore unknown fields (forward compatibility).
        json_format.ParseDict(doc, request, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, TypeError, ValueError, binascii.Error,
            SystemError) as exc:  # SystemError: protobuf's C parser on strings it cannot convert
        raise WireError(400, INVALID_ARGUMENT,
                        f"body is not an OTLP ExportLogsServiceRequest: {_unquoted(str(exc))}") from None
    return request


_QUOTED = re.compile(r""""((?:[^"\\]|\\.){25,})"|'((?:[^'\\]|\\.){25,})'""")


def _unquoted(message: str) -> str:
    """protobuf's parse error with each long value it quotes replaced by its length: the value may
    be a prompt sent where a number belongs, and the error reaches the log as well as the sender."""
    return _QUOTED.sub(lambda m: f"<a {len(m.group(1) or m.group(2))}-character string>", message)


def encode_message(message: Message, content_type: str) -> bytes:
    """A response message in the request's encoding (OTLP/JSON: camelCase, int64 as strings)."""
    if content_type == JSON:
        return json_format.MessageToJson(message, indent=None).encode("utf-8")
    return message.SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_status(code: int, message: str, content_type: str) -> bytes:
    """A ``google.rpc.Status`` error body (OTLP/HTTP failures) in the request's encoding.

    Written by hand (field 1 ``code`` varint, field 2 ``message`` string) so the receiver needs no
    googleapis-common-protos at run time; the tests decode it with the real message class.
    """
    message = scrub_text(message)  # a message quoting input must still encode
    if content_type == JSON:
        return json.dumps({"code": code, "message": message}, ensure_ascii=False).encode("utf-8")
    text = message.encode("utf-8")
    out = b""
    if code:
        out += b"\x08" + _varint(code)
    if text:
        out += b"\x12" + _varint(len(text)) + text
    return out
