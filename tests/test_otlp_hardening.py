"""The ``otlp`` receiver under abuse: oversized batches, a durable record that fails, malformed ids.

Real receivers on 127.0.0.1 (free ports), real HTTP/gRPC clients and the real SDK exporter, the
real pipeline and JSONL exporter where the durable record is the point.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from aep_collector.pipeline.registry import build_registry
from aep_collector.receivers.otlp import OtlpConfig
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk._logs.export import LogRecordExportResult

from tests import memory_exporter
from tests.helpers import read_jsonl
from tests.helpers import running as running_service
from tests.test_otlp_receiver import EXPORT, JSON, PROTOBUF, export_result, post, status_of, tool_call
from tests.test_otlp_receiver import running as running_receiver


def request(sessions: dict[str, int], numbered: bool = True, **record: Any) -> ExportLogsServiceRequest:
    """An export request: ``n`` tool-call records per session (one resource each), numbered."""
    req = ExportLogsServiceRequest()
    for session, n in sessions.items():
        rl = req.resource_logs.add()
        rl.resource.attributes.add(key="session.id", value=AnyValue(string_value=session))
        sl = rl.scope_logs.add()
        for i in range(n):
            lr = sl.log_records.add(event_name="copilot_chat.tool.call", **record)
            lr.attributes.add(key="gen_ai.tool.name", value=AnyValue(string_value=f"t{i}" if numbered else "t"))
    return req


def json_body(req: ExportLogsServiceRequest) -> bytes:
    return json_format.MessageToJson(req).encode()


def service_config(tmp_path: Path, sink: str | None = None, **otlp: Any) -> dict[str, Any]:
    exporters: dict[str, Any] = {"jsonl": {"directory": str(tmp_path / "logs"), "fsync": "never"}}
    if sink:
        exporters["memory"] = {"name": sink, "sending_queue": {"enabled": False}}  # the memory queue
    receivers = {"claude_code": {"endpoint": "127.0.0.1:0"},
                 "otlp/vscode": {"profile": "vscode", "grpc": {"endpoint": "127.0.0.1:0"},
                                 "http": {"endpoint": "127.0.0.1:0"}, **otlp}}
    return {"receivers": receivers,
            "processors": {"mapping": None, "runs": None, "capture": None},
            "exporters": exporters,
            "service": {"state_dir": str(tmp_path / "state"),
                        "pipelines": {"agents": {"receivers": list(receivers),
                                                 "processors": ["mapping", "runs", "capture"],
                                                 "exporters": list(exporters)}}}}


def registry() -> Any:
    reg, _ = build_registry(load_plugins=False)
    reg.register(memory_exporter.FACTORY, "test")
    return reg


def sync_post(url: str, body: bytes, ctype: str) -> tuple[int, bytes, float]:
    """POST from a thread (the service's loop stays free): status, body, the time it was answered."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers={"Content-Type": ctype}),
                                    timeout=120) as r:
            return r.status, r.read(), time.monotonic()
    except urllib.error.HTTPError as e:
        return e.code, e.read(), time.monotonic()


async def grpc_export(port: int, body: bytes) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            await channel.unary_unary(EXPORT)(body)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def until_idle(service: Any) -> None:
    for q in service.queues:  # the memory queue's worker hands the sink what was put
        while q.queue.qsize():
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)


# -- records per request ------------------------------------------------------------------------


async def test_more_records_than_max_request_records_is_413_resource_exhausted_on_every_transport() -> None:
    async with running_receiver("vscode", max_request_records=10) as (receiver, sink, host):
        over, at_limit = request({"s": 11}), request({"s": 10})
        for body, ctype in ((over.SerializeToString(), PROTOBUF), (json_body(over), JSON)):
            status, got_ctype, reply, headers = await post(receiver.http_port, body, ctype)
            error = status_of(reply, ctype)
            assert (status, got_ctype, error.code) == (413, ctype, 8)  # not retried by exporters
            assert "11 log records" in error.message and "max_request_records (10)" in error.message
            assert "Retry-After" not in headers
        assert await grpc_export(receiver.grpc_port, over.SerializeToString()) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert sink.batches == []
        assert host.health.counters[("receiver/otlp/vscode", "refused")] == 3
        status, *_ = await post(receiver.http_port, at_limit.SerializeToString())
        assert status == 200 and len(sink.signals) == 10


def twice_spelled(level: str, first: list[Any] | None, second: list[Any] | None) -> bytes:
    """OTLP/JSON giving the records under both names (camelCase, then the proto name) of one field."""
    resource = {"attributes": [{"key": "session.id", "value": {"stringValue": "s"}}]}

    def scopes(records: list[Any] | None) -> Any:
        return None if records is None else [{"logRecords": records}]

    def resources(records: list[Any] | None) -> Any:
        return None if records is None else [{"resource": resource, "scopeLogs": scopes(records)}]
    if level == "resource":
        doc: dict[str, Any] = {"resourceLogs": resources(first), "resource_logs": resources(second)}
    elif level == "scope":
        doc = {"resourceLogs": [{"resource": resource, "scopeLogs": scopes(first), "scope_logs": scopes(second)}]}
    else:
        doc = {"resourceLogs": [{"resource": resource, "scopeLogs": [{"logRecords": first, "log_records": second}]}]}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("level", ["resource", "scope", "record"])
async def test_otlp_json_spelling_one_field_twice_is_400_not_a_way_past_the_record_limit(level: str) -> None:
    # ParseDict keeps the spelling that comes last: the limit was checked on the first one only
    # (11 records got in under max_request_records 10), and a last null emptied the batch (200, no
    # record delivered).
    one, eleven = [{"eventName": "copilot_chat.tool.call"}], [{"eventName": "copilot_chat.tool.call"}] * 11
    async with running_receiver("vscode", max_request_records=10) as (receiver, sink, host):
        for first, second in ((one, eleven), (one * 2, None), (one * 2, [])):
            status, _, reply, _ = await post(receiver.http_port, twice_spelled(level, first, second), JSON)
            error = status_of(reply, JSON)
            assert (status, error.code) == (400, 3) and "are one field" in error.message
        assert sink.batches == [] and host.health.counters[("receiver/otlp/vscode", "refused")] == 3


@pytest.mark.parametrize("item", [[], ""], ids=["empty-list", "empty-string"])
@pytest.mark.parametrize("level", ["resourceLogs", "scopeLogs", "logRecords"])
async def test_otlp_json_list_items_that_are_not_objects_are_400_not_uncounted_records(level: str, item: Any) -> None:
    # ParseDict reads [] and "" as empty messages, and the record count skipped them: as records,
    # 11 got in under max_request_records 10 (as resources or scopes, they were quietly empty ones).
    record = {"eventName": "copilot_chat.tool.call"}
    scope = {"logRecords": [record] if level != "logRecords" else [item] * 11}
    resource = {"resource": {"attributes": [{"key": "session.id", "value": {"stringValue": "s"}}]},
                "scopeLogs": [scope] if level != "scopeLogs" else [scope] * 10 + [item]}
    doc = {"resourceLogs": [resource] if level != "resourceLogs" else [resource] * 10 + [item]}
    async with running_receiver("vscode", max_request_records=10) as (receiver, sink, _):
        status, _, reply, _ = await post(receiver.http_port, json.dumps(doc).encode(), JSON)
        error = status_of(reply, JSON)
        assert (status, error.code) == (400, 3) and f"{level} holds" in error.message
        assert sink.batches == []


def test_max_request_records_default_and_validation() -> None:
    # 32x the SDK BatchLogRecordProcessor's 512 per export: no real exporter's batch is refused.
    assert OtlpConfig(profile="vscode", http={}).max_request_records == 16384
    for bad in (0, -1, True, 2.5, "100"):
        with pytest.raises(ValueError, match="max_request_records"):
            OtlpConfig(profile="vscode", http={}, max_request_records=bad).validate()


# -- a big batch does not hold the loop -----------------------------------------------------------


async def test_a_hook_is_answered_while_a_big_otlp_batch_is_processed(tmp_path: Path) -> None:
    n = 40_000
    # One tool name throughout, as a real batch repeats its attributes: the flatten (one step, not
    # sliced) then finds them in its cache and stays a small part of the work.
    body = request({"big": n}, numbered=False).SerializeToString()
    stalls: list[float] = []

    async def probe() -> None:  # the longest the loop went without running another task
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.001)
            stalls.append(time.monotonic() - t)

    async with running_service(service_config(tmp_path, max_request_records=n)) as service:
        otlp_url = f"http://127.0.0.1:{service.receivers['otlp/vscode'].http_port}/v1/logs"
        hook_url = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"
        hook = json.dumps({"hook_event_name": "Notification", "session_id": "h1", "message": "x"}).encode()
        watch = asyncio.create_task(probe())
        sent = time.monotonic()
        big = asyncio.create_task(asyncio.to_thread(sync_post, otlp_url, body, PROTOBUF))
        await asyncio.sleep(0.2)  # the batch is being flattened and processed by now
        asked = time.monotonic()
        hook_status, _, hook_done = await asyncio.to_thread(sync_post, hook_url, hook, JSON)
        big_status, _, big_done = await big
        watch.cancel()
    assert (big_status, hook_status) == (200, 200)
    took = big_done - sent
    # Held for the whole batch, the loop answered the hook only after the OTLP reply.
    assert hook_done < big_done, (hook_done - asked, took)
    # No phase (flatten, signals, processing, stamping and delivery) holds the loop for long: the
    # longest stall is the flatten, a small part of the request's time (unsliced: over 2/3 of it).
    assert max(stalls) < took / 3, (max(stalls), took)
    events = read_jsonl(tmp_path / "logs" / "vscode" / "big.jsonl")
    assert len(events) == n
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)  # slices stamped in order


# -- the durable record first, then the acknowledgement -----------------------------------------------


async def test_records_the_durable_record_did_not_take_are_answered_retryable(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "vscode").write_text("not a directory\n")  # every vscode session file fails
    name = "otlp-not-durable"
    memory_exporter.SINKS.pop(name, None)
    async with running_service(service_config(tmp_path, sink=name), registry()) as service:
        receiver = service.receivers["otlp/vscode"]
        body = request({"s1": 2}).SerializeToString()
        status, ctype, reply, headers = await post(receiver.http_port, body)
        json_status, _, json_reply, _ = await post(receiver.http_port, json_body(request({"s2": 1})), JSON)
        grpc_code = await grpc_export(receiver.grpc_port, request({"s3": 1}).SerializeToString())
        assert (status, headers["Retry-After"], status_of(reply, ctype).code) == (503, "1", 14)
        assert "not in the durable record" in status_of(reply, ctype).message
        assert (json_status, status_of(json_reply, JSON).code) == (503, 14)
        assert grpc_code == grpc.StatusCode.UNAVAILABLE
        health = service.health.snapshot()
        assert not health["ok"] and "not-durable" in health["problems"]["receiver/otlp/vscode"]
        assert ("receiver/otlp/vscode", "accepted") not in service.health.counters
        # Hooks still fail open on the same broken record: a neutral reply, never an error.
        hook = json.dumps({"hook_event_name": "Notification", "session_id": "h", "message": "x"}).encode()
        (tmp_path / "logs" / "claude-code").write_text("not a directory\n")
        hook_status, hook_reply, _ = await asyncio.to_thread(
            sync_post, f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook", hook, JSON)
        assert hook_status == 200, hook_reply
        await until_idle(service)
        # Not durable, so not delivered either: the exporter's retry brings them again.
        assert [e["agent"] for e in memory_exporter.SINKS[name]] == ["claude-code"]

        # The real SDK exporter retries the 503 until the record can be written, then succeeds.
        async def heal() -> None:
            while service.health.counters.get(("exporter/jsonl", "dropped"), 0) < 5:
                await asyncio.sleep(0.01)
            (tmp_path / "logs" / "vscode").unlink()
        healer = asyncio.create_task(heal())
        result = await asyncio.to_thread(
            export_result, HttpLogExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/logs"),
            {"session.id": "sdk"}, [{"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "x"}])
        await healer
        await until_idle(service)
    assert result == LogRecordExportResult.SUCCESS
    assert len(read_jsonl(tmp_path / "logs" / "vscode" / "sdk.jsonl")) == 1
    assert [e["session"] for e in memory_exporter.SINKS[name] if e["agent"] == "vscode"] == ["sdk"]


@pytest.mark.parametrize("transport", ["http", "grpc"])
async def test_a_retry_after_a_partial_durable_failure_writes_each_record_once(tmp_path: Path, transport: str) -> None:
    (tmp_path / "logs" / "vscode" / "bad.jsonl").mkdir(parents=True)  # only this session's file fails
    name = f"otlp-partial-{transport}"
    memory_exporter.SINKS.pop(name, None)
    body = request({"good": 3, "bad": 2}).SerializeToString()
    async with running_service(service_config(tmp_path, sink=name), registry()) as service:
        receiver = service.receivers["otlp/vscode"]

        async def send() -> Any:
            if transport == "http":
                return (await post(receiver.http_port, body))[0]
            return await grpc_export(receiver.grpc_port, body)
        first = await send()
        assert len(read_jsonl(tmp_path / "logs" / "vscode" / "good.jsonl")) == 3
        second = await send()  # still failing: "good" is not written a second time
        (tmp_path / "logs" / "vscode" / "bad.jsonl").rmdir()
        third = await send()  # the exporter's retry, same bytes
        fourth = await send()  # the same bytes once more, after a success: a new request
        await until_idle(service)
    unavailable, ok = (503, 200) if transport == "http" else (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK)
    assert (first, second, third, fourth) == (unavailable, unavailable, ok, ok)
    good = read_jsonl(tmp_path / "logs" / "vscode" / "good.jsonl")
    bad = read_jsonl(tmp_path / "logs" / "vscode" / "bad.jsonl")
    assert len(good) == 6 and len(bad) == 4  # once for the retried request, once for the new one
    delivered = [e["session"] for e in memory_exporter.SINKS[name]]
    assert delivered.count("good") == 6 and delivered.count("bad") == 4


# -- trace and span ids of the wrong length -------------------------------------------------------------


@pytest.mark.parametrize("ids", [{"traceId": "abcd"}, {"spanId": "ef01"},
                                 {"traceId": "ab" * 17}, {"spanId": "ab" * 9}])
async def test_otlp_json_ids_of_the_wrong_length_are_400(ids: dict[str, str]) -> None:
    (key, value), = ids.items()
    doc = json.loads(json_body(request({"s": 1})))
    doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0][key] = value
    async with running_receiver("vscode") as (receiver, sink, _):
        status, ctype, reply, _ = await post(receiver.http_port, json.dumps(doc).encode(), JSON)
        error = status_of(reply, JSON)
        assert (status, ctype, error.code) == (400, JSON, 3) and key in error.message
        assert sink.batches == []


@pytest.mark.parametrize("field,size", [("trace_id", 2), ("trace_id", 17), ("span_id", 2), ("span_id", 9)])
async def test_protobuf_ids_of_the_wrong_length_are_invalid_argument(field: str, size: int) -> None:
    body = request({"s": 1}, **{field: b"\x01" * size}).SerializeToString()
    async with running_receiver("vscode") as (receiver, sink, _):
        status, _, reply, _ = await post(receiver.http_port, body)
        error = status_of(reply, PROTOBUF)
        assert (status, error.code) == (400, 3) and field in error.message
        assert await grpc_export(receiver.grpc_port, body) == grpc.StatusCode.INVALID_ARGUMENT
        assert sink.batches == []


async def test_ids_of_the_right_length_or_empty_are_kept() -> None:
    trace, span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    doc = json.loads(json_body(request({"s": 2})))
    first, second = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    first.update(traceId=trace, spanId=span)
    second.update(traceId="", spanId="")
    proto = request({"s": 1}, trace_id=bytes.fromhex(trace), span_id=bytes.fromhex(span)).SerializeToString()
    async with running_receiver("vscode") as (receiver, sink, _):
        assert (await post(receiver.http_port, json.dumps(doc).encode(), JSON))[0] == 200
        assert (await post(receiver.http_port, proto))[0] == 200
        assert await grpc_export(receiver.grpc_port, tool_call()) == grpc.StatusCode.OK
    payloads = [s.payload for s in sink.signals]
    assert [(p.get("trace_id"), p.get("span_id")) for p in payloads] == [
        (trace, span), (None, None), (trace, span), (None, None)]


@pytest.mark.parametrize("record", [
    {"attributes": [{"key": "k", "value": {"intValue": "PROMPT: deploy the thing to prod-db-7 now"}}]},
    {"timeUnixNano": "PROMPT: deploy the thing to prod-db-7 now"},
], ids=["int-attribute", "time"])
async def test_a_value_that_is_not_a_number_is_not_quoted_into_the_400_or_the_log(
        record: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    # protobuf's error quotes the value whole: text sent where a number belongs (a prompt) reached
    # the WARNING log as well as the sender. Its length stands in for it; short ones stay readable.
    doc = {"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]}
    async with running_receiver("vscode") as (receiver, sink, _):
        status, _, reply, _ = await post(receiver.http_port, json.dumps(doc).encode(), JSON)
        error = status_of(reply, JSON)
        assert (status, error.code) == (400, 3) and "41-character string" in error.message
        assert sink.batches == []
    assert "41-character string" in caplog.text  # it was logged, without the value
    assert "prod-db-7" not in error.message and "prod-db-7" not in caplog.text
