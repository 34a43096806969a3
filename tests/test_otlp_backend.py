"""The OTLP receiver's decoding runs on protobuf's upb backend, and its attribute fast path agrees
with the per-value conversion for every ``AnyValue`` kind."""

from __future__ import annotations

import math

from aep_collector.receivers.otlp.flatten import any_value, key_values
from google.protobuf.internal import api_implementation
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList


def test_protobuf_runs_on_the_upb_backend() -> None:
    # The receiver's cost per record (and bench_otlp's figures) assume upb; the pure-Python
    # backend (PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python, or a wheel without upb) is ~10x slower.
    assert api_implementation.Type() == "upb"


def test_key_values_reads_every_kind_as_any_value_does() -> None:
    values = [
        AnyValue(string_value="x"), AnyValue(string_value=""), AnyValue(bool_value=True),
        AnyValue(bool_value=False), AnyValue(int_value=-(2**63)), AnyValue(int_value=0),
        AnyValue(double_value=1.5), AnyValue(double_value=math.inf), AnyValue(double_value=math.nan),
        AnyValue(bytes_value=b"\x00\xff"), AnyValue(), AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1)])),
        AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=AnyValue(string_value="v"))])),
    ]
    kvs = [KeyValue(key=f"k{i}", value=v) for i, v in enumerate(values)]
    kvs += [KeyValue(key="k0", value=AnyValue(int_value=7)), KeyValue(key="unset")]  # last wins; no value
    got = key_values(kvs)
    expect = {f"k{i}": any_value(v) for i, v in enumerate(values)} | {"k0": 7, "unset": None}
    assert got == expect and list(got) == list(expect)
    assert got["k1"] == "" and got["k3"] is False and got["k8"] == "NaN" and got["k10"] is None
    assert type(got["k2"]) is bool and type(got["k5"]) is int
