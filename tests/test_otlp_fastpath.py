"""The binary fast path (``flatten_protobuf``) gives exactly what the message path gives
(``flatten_request(wire.parse_protobuf(body))``), and refuses exactly the bodies it refuses."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from aep_collector.receivers.otlp import flatten, wire
from aep_collector.receivers.otlp.flatten import flatten_protobuf, flatten_request
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord


def reference(body: bytes) -> list[dict[str, Any]]:
    return flatten_request(wire.parse_protobuf(body))


def same(body: bytes) -> list[dict[str, Any]]:
    """Both paths on ``body``: equal, with the same key order at every level and the same types."""
    got, expect = flatten_protobuf(body), reference(body)
    assert got == expect
    assert shape(got) == shape(expect)
    return got


def shape(value: Any) -> Any:
    # Key order and exact types: == alone would pass 1 for True and reordered dicts.
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [shape(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def random_value(rng: random.Random, depth: int = 0) -> AnyValue:
    kinds = ["string", "bool", "int", "double", "bytes", "unset"] + (["array", "kvlist"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return AnyValue(string_value=rng.choice(["", "x", "readFile", "ü€😀", "a" * rng.choice([1, 127, 128, 300])]))
    if kind == "bool":
        return AnyValue(bool_value=rng.random() < 0.5)
    if kind == "int":
        return AnyValue(int_value=rng.choice([0, 1, -1, 63, 127, 128, 2**31, -(2**63), 2**63 - 1, rng.randrange(10**6)]))
    if kind == "double":
        return AnyValue(double_value=rng.choice([0.0, -0.0, 0.5, 1e300, math.inf, -math.inf, math.nan, rng.random()]))
    if kind == "bytes":
        return AnyValue(bytes_value=rng.choice([b"", b"\x00\xff", bytes(range(256))]))
    if kind == "array":
        return AnyValue(array_value=ArrayValue(values=[random_value(rng, depth + 1) for _ in range(rng.randrange(4))]))
    if kind == "kvlist":
        return AnyValue(kvlist_value=KeyValueList(values=random_attributes(rng, depth + 1)))
    return AnyValue()


def random_attributes(rng: random.Random, depth: int = 0) -> list[KeyValue]:
    keys = ["event.name", "session.id", "gen_ai.tool.name", "duration_ms", "success", "k", "ü", ""]
    out = []
    for _ in range(rng.randrange(7)):
        if rng.random() < 0.1:
            out.append(KeyValue(key=rng.choice(keys)))  # no value at all
        else:
            out.append(KeyValue(key=rng.choice(keys), value=random_value(rng, depth)))
    return out


def random_record(rng: random.Random) -> LogRecord:
    record = LogRecord(attributes=random_attributes(rng))
    if rng.random() < 0.5:
        record.event_name = rng.choice(["copilot_chat.tool.call", "codex.tool_result", "x"])
    for name, values in (("time_unix_nano", [1783073704221000000, 1]), ("observed_time_unix_nano", [5, 2**64 - 1]),
                         ("severity_number", [9, 24]), ("severity_text", ["INFO", "ü"]), ("flags", [1, 2**32 - 1])):
        if rng.random() < 0.5:
            setattr(record, name, rng.choice(values))
    if rng.random() < 0.3:
        record.trace_id = bytes(range(16))
    if rng.random() < 0.3:
        record.span_id = b"\x00\xf0g\xaa\x0b\xa9\x02\xb7"
    if rng.random() < 0.4:
        record.body.CopyFrom(random_value(rng))
    return record


def random_request(rng: random.Random) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    for _ in range(rng.randrange(4)):
        rl = request.resource_logs.add()
        if rng.random() < 0.8:
            rl.resource.attributes.extend(random_attributes(rng))
        for _ in range(rng.randrange(3)):
            sl = rl.scope_logs.add()
            if rng.random() < 0.5:
                sl.scope.name = "copilot-chat"
            if rng.random() < 0.5:
                sl.scope.version = "0.37.0"
            if rng.random() < 0.3:
                sl.scope.attributes.extend(random_attributes(rng))
            sl.log_records.extend(random_record(rng) for _ in range(rng.randrange(6)))
    return request


@pytest.mark.parametrize("seed", range(40))
def test_random_requests_flatten_alike_on_both_paths(seed: int) -> None:
    rng = random.Random(seed)
    body = random_request(rng).SerializeToString()
    same(body)
    same(body)  # a second time: now from the attribute cache


def test_every_any_value_kind_and_repeated_keys_alike() -> None:
    values = [
        AnyValue(string_value="x"), AnyValue(string_value=""), AnyValue(bool_value=True), AnyValue(bool_value=False),
        AnyValue(int_value=-(2**63)), AnyValue(int_value=0), AnyValue(double_value=1.5),
        AnyValue(double_value=math.inf), AnyValue(double_value=-math.inf), AnyValue(double_value=math.nan),
        AnyValue(bytes_value=b"\x00\xff"), AnyValue(),
        AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(kvlist_value=KeyValueList(
            values=[KeyValue(key="deep", value=AnyValue(array_value=ArrayValue()))]))])),
        AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=AnyValue(string_value="v")),
                                                   KeyValue(key="k", value=AnyValue(int_value=2))])),
    ]
    attributes = [KeyValue(key=f"k{i}", value=v) for i, v in enumerate(values)]
    attributes += [KeyValue(key="k0", value=AnyValue(int_value=7)), KeyValue(key="unset"),
                   KeyValue(key="event.name", value=AnyValue(int_value=3))]  # not a str: the field wins
    request = ExportLogsServiceRequest()
    sl = request.resource_logs.add().scope_logs.add()
    sl.log_records.add(attributes=attributes, event_name="from.field")
    sl.log_records.add(attributes=attributes)
    (one, two) = same(request.SerializeToString())
    assert one["attributes"]["k0"] == 7 and one["attributes"]["event.name"] == "from.field"
    assert two["attributes"]["event.name"] == 3 and two["attributes"]["unset"] is None
    assert one["attributes"]["k13"] == {"k": 2}


@pytest.mark.parametrize("severity", [1, 9, 24, 25, 2**31 - 1, -1, -(2**31)])
def test_severity_number_is_the_plain_int_the_field_holds(severity: int) -> None:
    # _flat, shared by both paths, no longer wraps the field in int(): an enum field (open in
    # proto3, so any int32 arrives) must read as an exact int, on both paths, as int() gave.
    request = ExportLogsServiceRequest()
    request.resource_logs.add().scope_logs.add().log_records.add(severity_number=severity)
    body = request.SerializeToString()
    (flat,) = same(body)
    assert type(flat["severity_number"]) is int and flat["severity_number"] == severity
    (record,) = wire.parse_protobuf(body).resource_logs[0].scope_logs[0].log_records
    assert type(record.severity_number) is int


def test_many_attributes_in_order_alike() -> None:
    # The view's attributes are read as one slice of the repeated field: every one, in order.
    for count in (0, 1, 2, 200):
        request = ExportLogsServiceRequest()
        sl = request.resource_logs.add().scope_logs.add()
        sl.log_records.add(attributes=[KeyValue(key=f"k{i % 150}", value=AnyValue(int_value=i)) for i in range(count)])
        expect: dict[str, int] = {}
        for i in range(count):  # a repeated key keeps its first place and takes the last value
            expect[f"k{i % 150}"] = i
        (flat,) = same(request.SerializeToString())
        assert list(flat["attributes"].items()) == list(expect.items())


def test_records_never_share_a_list_or_dict_value() -> None:
    # The cache keeps only values nothing can change in place; each record owns its lists and dicts.
    request = ExportLogsServiceRequest()
    rl = request.resource_logs.add()
    rl.resource.attributes.add(key="session.id", value=AnyValue(string_value="s"))
    sl = rl.scope_logs.add()
    sl.scope.name = "n"
    nested = KeyValue(key="list", value=AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1)])))
    mapping = KeyValue(key="map", value=AnyValue(kvlist_value=KeyValueList(values=[nested])))
    for _ in range(2):
        sl.log_records.add(attributes=[nested, mapping])
    one, two = same(request.SerializeToString())
    one["attributes"]["list"].append(2)
    one["attributes"]["map"]["list"].append(2)
    one["resource"]["session.id"] = "changed"
    one["scope"]["name"] = "changed"
    assert two["attributes"] == {"list": [1], "map": {"list": [1]}}
    assert two["resource"] == {"session.id": "s"} and two["scope"] == {"name": "n"}
    (again, _) = flatten_protobuf(request.SerializeToString())
    assert again["attributes"] == {"list": [1], "map": {"list": [1]}}


def test_long_values_and_more_distinct_attributes_than_the_cache_holds() -> None:
    request = ExportLogsServiceRequest()
    sl = request.resource_logs.add().scope_logs.add()
    for i in range(flatten._CACHE_ENTRIES + 500):  # the cache empties itself at least once on the way
        sl.log_records.add(attributes=[KeyValue(key="n", value=AnyValue(int_value=i)),
                                       KeyValue(key="prompt", value=AnyValue(string_value=f"{i}" + "p" * 400))])
    body = request.SerializeToString()
    got = same(body)
    assert got[-1]["attributes"]["n"] == flatten._CACHE_ENTRIES + 499
    assert len(flatten._ATTRIBUTES) <= flatten._CACHE_ENTRIES
    assert not any(len(raw) > flatten._CACHE_BYTES for raw in flatten._ATTRIBUTES)
    assert same(body) == got


def corrupted(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randrange(1, 4)):
        what = rng.random()
        at = rng.randrange(len(data))
        if what < 0.5:
            data[at] = rng.randrange(256)
        elif what < 0.8:
            del data[at:]
        else:
            data[at:at] = bytes([rng.randrange(256)])
        if not data:
            break
    return bytes(data)


@pytest.mark.parametrize("seed", range(30))
def test_corrupted_bodies_are_refused_or_read_alike(seed: int) -> None:
    rng = random.Random(1000 + seed)
    body = random_request(rng).SerializeToString() or b"\x0a\x00"
    for _ in range(20):
        bad = corrupted(rng, body)
        try:
            expect = reference(bad)
        except wire.WireError as exc:
            with pytest.raises(wire.WireError) as err:
                flatten_protobuf(bad)
            assert (err.value.status, err.value.code, err.value.message) == (exc.status, exc.code, exc.message)
        else:
            assert flatten_protobuf(bad) == expect


def test_attribute_that_is_not_a_key_value_is_refused_as_before() -> None:
    # Field 6 of a LogRecord with bytes that are no KeyValue (a string field holding invalid UTF-8):
    # the message path refuses the body, so the bytes view must not let it through.
    record = b"\x32\x03\x0a\x01\xff"  # attributes: KeyValue{key: b"\xff"}
    body = b"\x0a" + bytes([len(record) + 4]) + b"\x12" + bytes([len(record) + 2]) + b"\x12" + bytes([len(record)]) + record
    with pytest.raises(wire.WireError) as err:
        flatten_protobuf(body)
    assert (err.value.status, err.value.code) == (400, wire.INVALID_ARGUMENT)
    with pytest.raises(wire.WireError):
        wire.parse_protobuf(body)


# -- the real parse is skipped unless the view cannot vouch for a body: refusals stay its own -------


def outcome(flatten_fn: Any, body: bytes) -> tuple[Any, ...]:
    """What a path makes of ``body``: its records (with key order and types), or its refusal."""
    try:
        return ("read", shape(flatten_fn(body)))
    except wire.WireError as exc:
        return ("refused", exc.status, exc.code, exc.message)


def alike(body: bytes) -> tuple[Any, ...]:
    """``body`` read or refused alike by both paths, with the attribute cache cold and warm."""
    expect = outcome(reference, body)
    flatten._ATTRIBUTES.clear()
    assert outcome(flatten_protobuf, body) == expect
    assert outcome(flatten_protobuf, body) == expect
    return expect


def varint(n: int) -> bytes:
    return wire._varint(n)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def body_with(attribute: bytes, record_extra: bytes = b"") -> bytes:
    """A request whose one record carries ``attribute`` (raw bytes, field 6) and a session id."""
    session = field(1, field(1, field(1, b"session.id") + field(2, field(1, b"s"))))  # Resource.attributes
    record = field(6, attribute) + record_extra
    return field(1, field(1, session) + field(2, field(2, record)))


def nested_arrays(depth: int) -> bytes:
    """An AnyValue holding ``depth`` arrays, one inside the other, around a string."""
    value = field(1, b"x")
    for _ in range(depth):
        value = field(5, field(1, value))  # AnyValue.array_value{values: [value]}
    return value


def nested_kvlists(depth: int) -> bytes:
    value = field(1, b"x")
    for _ in range(depth):
        value = field(6, field(1, field(1, b"k") + field(2, value)))  # kvlist_value{values: [{k: value}]}
    return value


def nested_groups(depth: int) -> bytes:
    """``depth`` unknown groups (field 7), one inside the other: a flat KeyValue may carry them."""
    return b"\x3b" * depth + b"\x3c" * depth


def test_the_real_parse_runs_only_when_the_view_cannot_vouch(monkeypatch: pytest.MonkeyPatch) -> None:
    # The point of the shortcut: a body of short flat attributes is parsed once, into the view.
    calls: list[bytes] = []
    real = wire.parse_protobuf
    monkeypatch.setattr(wire, "parse_protobuf", lambda body: calls.append(body) or real(body))
    flat_body = body_with(field(1, b"k") + field(2, field(1, b"v")))
    alike(flat_body)
    calls.clear()
    flatten_protobuf(flat_body)
    assert calls == []
    short_nested = body_with(field(1, b"k") + field(2, nested_arrays(3)))
    alike(short_nested)
    calls.clear()
    flatten_protobuf(short_nested)  # not cached (a list), parsed alone each time: still too short to matter
    assert calls == []
    long = body_with(field(1, b"k") + field(2, field(1, b"v" * flatten._CACHE_BYTES)))
    flatten_protobuf(long)
    assert calls == [long]


@pytest.mark.parametrize("kind", ["arrays", "kvlists"])
def test_attributes_nested_up_to_and_past_the_depth_limit_alike(kind: str) -> None:
    # protobuf refuses a message nested past 100 levels; an attribute parsed alone starts 4 levels
    # higher than in place, so only the real parse can say where a body's limit falls.
    nest = nested_arrays if kind == "arrays" else nested_kvlists
    seen = set()
    for depth in range(30, 60):
        attribute = field(1, b"k") + field(2, nest(depth))
        seen.add(alike(body_with(attribute))[0])
        seen.add(alike(body_with(attribute, record_extra=field(6, field(1, b"a") + field(2, field(1, b"b")))))[0])
    assert seen == {"read", "refused"}  # the range crosses the limit


def test_unknown_groups_in_a_flat_attribute_up_to_and_past_the_depth_limit_alike() -> None:
    seen = set()
    for depth in range(85, 101):
        attribute = field(1, b"k") + field(2, field(1, b"v")) + nested_groups(depth)
        seen.add(alike(body_with(attribute))[0])
    assert seen == {"read", "refused"}


def test_an_attribute_the_view_vouches_for_alone_cannot_reach_the_depth_limit() -> None:
    # _CACHE_BYTES is the bound below which an attribute is trusted on its own parse: at two bytes a
    # level, the deepest attribute of that many bytes still parses in place (and leaves room).
    depth = (flatten._CACHE_BYTES - 4) // 2
    attribute = field(1, b"k") + b"\x3b" * depth + b"\x3c" * depth
    assert len(attribute) <= flatten._CACHE_BYTES
    wire.parse_protobuf(body_with(attribute))
    wire.parse_protobuf(body_with(field(1, b"k") + field(2, nested_arrays(depth // 2))))
    assert alike(body_with(attribute))[0] == "read"


def test_a_cached_attribute_in_a_body_too_deep_elsewhere_is_refused_alike() -> None:
    # The cache may vouch for one attribute; the rest of the body is still judged by the view parse
    # (body values and resource attributes are real messages there) or by the real parse.
    flat_attr = field(1, b"k") + field(2, field(1, b"v"))
    alike(body_with(flat_attr))
    for depth in (45, 47, 48, 49, 50, 60):
        deep_body_value = field(5, nested_arrays(depth))  # LogRecord.body
        alike(body_with(flat_attr, record_extra=deep_body_value))
        alike(body_with(flat_attr, record_extra=field(6, field(1, b"d") + field(2, nested_kvlists(depth)))))


def test_malformed_attributes_are_refused_alike() -> None:
    flat = field(1, b"k") + field(2, field(1, b"v"))
    cases = [
        field(1, b"\xff"),                                   # key not UTF-8
        field(1, b"k") + field(2, field(1, b"\xc3")),        # string value not UTF-8
        field(1, b"k") + field(2, nested_kvlists(2).replace(b"\x0a\x01k", b"\x0a\x01\xff")),  # nested key
        field(1, b"k") + b"\x12\x05\x0a\x01",                # value longer than the attribute
        field(1, b"k") + b"\x12\x01\xff",                    # value with a broken varint tag
        flat + b"\x3c",                                      # an end group with no start
        flat + b"\x3b",                                      # a group never ended
        flat + b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # an overlong varint
        flat + b"\x0f",                                      # wire type 7
        flat + b"\x15\x01\x02",                              # a fixed32 cut short
        b"",                                                 # an empty KeyValue: valid
        flat + b"\x08\x01",                                  # an unknown varint field: valid
        field(1, b"k") + field(2, field(1, b"v") + field(3, b"\x01")),  # wire-type clash in AnyValue
    ]
    outcomes = {alike(body_with(attribute))[0] for attribute in cases}
    assert outcomes == {"read", "refused"}
    for attribute in cases:  # the bad one after good ones, then before
        alike(body_with(flat, record_extra=field(6, attribute)))
        alike(body_with(attribute, record_extra=field(6, flat)))


def test_a_lone_surrogate_in_any_string_field_is_u_fffd_alike() -> None:
    # protobufjs writes a lone UTF-16 surrogate as its own 3 bytes (not UTF-8): each string field
    # holding one reads as U+FFFD on both paths, as a "\\ud800" escape does in OTLP/JSON.
    lone = "\ud800".encode("utf-8", "surrogatepass")
    kv = field(1, b"k" + lone) + field(2, field(1, b"v" + lone))
    resource = field(1, field(1, b"session.id") + field(2, field(1, b"s" + lone)))
    scope = field(1, b"n" + lone) + field(2, b"1" + lone)
    record = (field(6, kv) + field(6, field(1, b"m") + field(2, field(6, field(1, kv))))
              + field(12, b"e" + lone) + field(3, b"t" + lone))
    body = field(1, field(1, resource) + field(2, field(1, scope) + field(2, record)))
    assert alike(body)[0] == "read"
    (flat,) = flatten_protobuf(body)
    u = "\ufffd"
    assert flat == {"resource": {"session.id": f"s{u}"}, "scope": {"name": f"n{u}", "version": f"1{u}"},
                    "attributes": {f"k{u}": f"v{u}", "m": {f"k{u}": f"v{u}"}, "event.name": f"e{u}"},
                    "severity_text": f"t{u}"}
    for broken in (b"\xff", b"\xed\xa0", lone[:2] + b"x"):  # not UTF-8 in any reading: still refused
        assert alike(body_with(field(1, b"k") + field(2, field(1, b"v" + broken))))[:3] == ("refused", 400, 3)


def test_attribute_field_with_another_wire_type_alike() -> None:
    # LogRecord field 6 as a varint or fixed64: both message classes keep it as an unknown field.
    for extra in (b"\x30\x01", b"\x31" + bytes(8), b"\x35" + bytes(4)):
        alike(body_with(field(1, b"k") + field(2, field(1, b"v")), record_extra=extra))


@pytest.mark.parametrize("seed", range(10))
def test_every_truncation_of_a_body_alike(seed: int) -> None:
    rng = random.Random(2000 + seed)
    body = random_request(rng).SerializeToString()
    for cut in range(len(body)):
        alike(body[:cut])


@pytest.mark.parametrize("seed", range(10))
def test_random_bytes_alike(seed: int) -> None:
    rng = random.Random(3000 + seed)
    for _ in range(200):
        alike(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))


def wrong_types() -> list[Any]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    rng = random.Random(7)
    traces = ExportTraceServiceRequest()
    span = traces.resource_spans.add().scope_spans.add().spans.add(
        trace_id=bytes(16), span_id=bytes(8), name="chat", attributes=random_attributes(rng))
    span.events.add(name="e", attributes=random_attributes(rng))
    metrics = ExportMetricsServiceRequest()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add(name="tokens")
    metric.sum.data_points.add(as_int=3, attributes=random_attributes(rng))
    record = random_record(rng)
    return [
        pytest.param(traces.SerializeToString(), id="trace-request"),
        pytest.param(metrics.SerializeToString(), id="metrics-request"),
        pytest.param(record.SerializeToString(), id="a-log-record-alone"),
        pytest.param(KeyValue(key="k", value=AnyValue(string_value="v")).SerializeToString(), id="a-key-value"),
        pytest.param(b'{"resourceLogs": []}', id="otlp-json"),
        pytest.param(b"", id="empty"),
    ]


@pytest.mark.parametrize("body", wrong_types())
def test_bodies_of_another_type_alike(body: bytes) -> None:
    alike(body)


def corpus_bodies() -> list[Any]:
    from tests.conftest import corpus
    from tests.test_otlp_flatten import sdk_request

    out = []
    for fname in ("vscode-otel.json", "codex-otel.json"):
        doc = corpus(f"mappings/{fname}")
        cases = [c["input"] for c in (*doc["records"].values(), doc["unknown"])]
        resource = cases[0]["resource"]
        records = [{"event_name": c["attributes"]["event.name"],
                    "attributes": {k: v for k, v in c["attributes"].items() if k != "event.name"}}
                   for c in cases]
        out.append(pytest.param(sdk_request(resource, records).SerializeToString(), id=fname))
    return out


@pytest.mark.parametrize("body", corpus_bodies())
def test_corpus_records_read_alike_and_every_truncation_refused_alike(body: bytes) -> None:
    assert alike(body)[0] == "read"
    for cut in range(0, len(body), 7):
        alike(body[:cut])
