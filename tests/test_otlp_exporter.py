"""The ``otlp`` exporter: the projection against the pins, the protobuf wire, OTLP retry rules against
real gRPC and HTTP receivers on loopback, the capture ceiling, and the service's sending queue in front."""

from __future__ import annotations

import asyncio
import gzip
import json

import grpc
import pytest
from aep_collector.exporters.otlp import OtlpExporter, OtlpExporterConfig, retry_after
from aep_collector.exporters.otlp.projection import SEVERITY, to_otlp
from aep_collector.exporters.otlp.wire import records_of, request
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.sending_queue import Permanent, RetryLater
from aiohttp import web
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from tests.conftest import AEP_DIR, FIXTURES, corpus
from tests.helpers import redirected_elsewhere, running, serve
from tests.relay_double import wait_until

GOLDEN = [json.loads(line) for line in (FIXTURES / "golden" / "golden.jsonl").read_text().splitlines() if line.strip()]
PINS = corpus("otlp/otlp-expected.json")
DOWNLEVEL = corpus("downlevel/cases.json")["cases"]


@pytest.mark.parametrize("k", sorted(PINS, key=int))
def test_projection_and_wire_match_the_pins(k):
    assert to_otlp(GOLDEN[int(k)]) == PINS[k]
    wire = ExportLogsServiceRequest.FromString(request([PINS[k]]).SerializeToString())
    assert records_of(wire) == [PINS[k]]


def test_severity_table_is_the_registry():
    reg = json.loads((AEP_DIR / "schemas" / "registry" / "severity.json").read_text())
    assert {k: (v["severity_text"], v["severity_number"]) for k, v in reg["otlp"].items()} == SEVERITY
    assert set(reg["order"]) == set(SEVERITY)


def test_every_golden_event_projects_and_survives_the_wire():
    records = [to_otlp(e) for e in GOLDEN]
    assert len(records) == len(GOLDEN)
    back = records_of(ExportLogsServiceRequest.FromString(request(records).SerializeToString()))
    # Grouped per agent on the wire; every record comes back unchanged.
    key = lambda r: r["attributes"]["aep.event_id"] + r["attributes"]["aep.source"]  # noqa: E731
    assert sorted(back, key=key) == sorted(records, key=key)


@pytest.mark.parametrize("ceiling", ["none", "metadata", "redacted"])
def test_nothing_above_the_ceiling_leaves(ceiling):
    order = ["none", "metadata", "redacted", "full"]
    events = GOLDEN + [c["event"] for c in DOWNLEVEL]
    over = 0
    for event in events:
        rec = to_otlp(event, ceiling)
        if order.index(event.get("capture", "metadata")) > order.index(ceiling) or event.get("capture") == "none":
            over += 1
            assert "body" not in rec
            assert all(k.startswith("aep.") for k in rec["attributes"])  # nothing hoisted from data
            wire = request([rec]).SerializeToString()
            assert records_of(ExportLogsServiceRequest.FromString(wire)) == [rec]
            envelope = json.dumps({k: v for k, v in event.items() if k != "data"})
            for text in _strings(event.get("data")):
                if len(text) >= 8 and text not in envelope:
                    assert text.encode() not in wire
    assert over > 0


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_retry_after_reads_seconds_and_dates():
    assert retry_after("7") == 7.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after(None) is None and retry_after("soon") is None


# -- a real gRPC receiver ------------------------------------------------------------------

class Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self) -> None:
        self.requests: list[ExportLogsServiceRequest] = []
        self.metadata: list[dict] = []
        self.answers: list[tuple] = []  # (code, details, trailing metadata) to fail with, in order
        self.rejected = 0

    async def Export(self, req, context):  # noqa: N802 -- the generated servicer's name
        self.metadata.append(dict(context.invocation_metadata()))
        if self.answers:
            code, details, trailing = self.answers.pop(0)
            if trailing:
                context.set_trailing_metadata(trailing)
            await context.abort(code, details)
        self.requests.append(req)
        if self.rejected:
            return ExportLogsServiceResponse(partial_success=ExportLogsPartialSuccess(
                rejected_log_records=self.rejected, error_message="too old"))
        return ExportLogsServiceResponse()


@pytest.fixture
async def grpc_receiver():
    server = grpc.aio.server()
    logs = Logs()
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(logs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield logs, port
    await server.stop(None)


async def exporter(**cfg) -> tuple[OtlpExporter, Host]:
    exp = OtlpExporter(CreateSettings(id="otlp"), OtlpExporterConfig(**cfg))
    host = Host()
    await exp.start(host)
    return exp, host


def retry_info(seconds: int) -> tuple:
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="slow down")
    info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds))
    status.details.add().Pack(info)
    return (("grpc-status-details-bin", status.SerializeToString()),)


async def test_grpc_delivers_and_classifies_failures(grpc_receiver):
    logs, port = grpc_receiver
    exp, host = await exporter(endpoint=f"127.0.0.1:{port}", headers={"X-Api-Key": "k1"})
    try:
        await exp.deliver([GOLDEN[3], GOLDEN[13]])
        assert records_of(logs.requests[0]) == [PINS["3"], PINS["13"]]
        assert logs.metadata[0]["x-api-key"] == "k1"
        logs.answers = [(grpc.StatusCode.UNAVAILABLE, "restarting", None)]
        with pytest.raises(ConnectionError, match="UNAVAILABLE"):
            await exp.deliver([GOLDEN[3]])
        logs.answers = [(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota", retry_info(3))]
        with pytest.raises(RetryLater) as later:
            await exp.deliver([GOLDEN[3]])
        assert later.value.delay == 3
        logs.answers = [(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota", None)]
        with pytest.raises(Permanent):  # no RetryInfo: the server says retrying will not help
            await exp.deliver([GOLDEN[3]])
        logs.answers = [(grpc.StatusCode.INVALID_ARGUMENT, "bad", None)]
        with pytest.raises(Permanent, match="INVALID_ARGUMENT"):
            await exp.deliver([GOLDEN[3]])
        logs.rejected = 1
        await exp.deliver([GOLDEN[3], GOLDEN[24]])  # partial success: counted, not retried
        assert host.health.counters[("exporter/otlp", "rejected")] == 1
    finally:
        await exp.shutdown()


# -- a real HTTP receiver ------------------------------------------------------------------

@pytest.fixture
async def http_receiver():
    state = {"requests": [], "answers": [], "headers": []}

    async def v1_logs(request: web.Request) -> web.Response:
        state["headers"].append(dict(request.headers))
        if state["answers"]:
            status, headers = state["answers"].pop(0)
            return web.Response(status=status, headers=headers)
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip" and body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        state["requests"].append(ExportLogsServiceRequest.FromString(body))
        return web.Response(body=ExportLogsServiceResponse().SerializeToString(), content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/logs", v1_logs)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/logs"
    yield state
    await runner.cleanup()


async def test_http_delivers_and_honours_retry_after(http_receiver):
    exp, _ = await exporter(protocol="http", endpoint=http_receiver["url"], compression="gzip")
    try:
        await exp.deliver([GOLDEN[15], GOLDEN[24]])
        assert records_of(http_receiver["requests"][0]) == [PINS["15"], PINS["24"]]
        assert http_receiver["headers"][0]["Content-Type"] == "application/x-protobuf"
        for status in (429, 502, 503, 504):
            http_receiver["answers"] = [(status, {"Retry-After": "2"})]
            with pytest.raises(RetryLater) as later:
                await exp.deliver([GOLDEN[3]])
            assert later.value.delay == 2.0
        http_receiver["answers"] = [(503, {})]
        with pytest.raises(ConnectionError, match="503"):
            await exp.deliver([GOLDEN[3]])
        for status in (400, 401, 413, 500):
            http_receiver["answers"] = [(status, {})]
            with pytest.raises(Permanent, match=str(status)):
                await exp.deliver([GOLDEN[3]])
    finally:
        await exp.shutdown()


async def test_in_the_service_behind_the_sending_queue_through_a_receiver_outage(tmp_path, grpc_receiver):
    """Hook in, OTLP out: the receiver answers UNAVAILABLE twice, then takes every event exactly as pinned."""
    import aiohttp

    logs, port = grpc_receiver
    logs.answers = [(grpc.StatusCode.UNAVAILABLE, "warming up", None)] * 2
    raw = {
        "receivers": {"claude_code": {"endpoint": "127.0.0.1:0"}},
        "processors": {"mapping": None, "runs": None, "capture": None},
        "exporters": {"jsonl": {"directory": str(tmp_path / "logs"), "fsync": "never"},
                      "otlp": {"endpoint": f"127.0.0.1:{port}",
                               "sending_queue": {"backoff_initial": 0.05, "backoff_max": 0.1}}},
        "service": {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
            "receivers": ["claude_code"], "processors": ["mapping", "runs", "capture"],
            "exporters": ["jsonl", "otlp"]}}},
    }
    async with running(raw) as service:
        url = f"http://127.0.0.1:{service.receivers['claude_code'].port}/hook"
        async with aiohttp.ClientSession() as s, s.post(url, json={
                "session_id": "otlp-1", "hook_event_name": "SessionStart", "source": "startup",
                "cwd": "/tmp", "transcript_path": "/tmp/t.jsonl"}) as r:
            assert r.status == 200
        written = [json.loads(x) for x in (tmp_path / "logs" / "claude-code" / "otlp-1.jsonl").read_text().splitlines()]
        await wait_until(lambda: logs.requests, "the export after two UNAVAILABLE answers", timeout=20)
        await asyncio.sleep(0)
    assert not logs.answers  # both UNAVAILABLE answers were met, and retried past
    got = [r for req in logs.requests for r in records_of(req)]
    assert got == [to_otlp(e) for e in written]
    assert [r["attributes"]["aep.event_id"] for r in got] == [e["id"] for e in written]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_not_followed_and_the_batch_is_not_counted_delivered(status):
    """aiohttp followed a 301/302/303 with a GET carrying no body (and the configured headers): the
    GET's 200 returned from ``deliver``, so the queue committed a batch no receiver ever had."""
    def logs_taken() -> web.Response:
        return web.Response(body=ExportLogsServiceResponse().SerializeToString(), content_type="application/x-protobuf")

    async with redirected_elsewhere("/v1/logs", status, logs_taken) as (url, elsewhere):
        exp, _ = await exporter(protocol="http", endpoint=url, headers={"X-Api-Key": "k"})
        try:
            with pytest.raises(Permanent, match=f"HTTP {status}.*/elsewhere"):
                await exp.deliver([GOLDEN[3]])
        finally:
            await exp.shutdown()
    assert elsewhere == []


@pytest.mark.parametrize(("protocol", "headers", "message"), [
    ("http", {"X-Key": "secret\nX-Other: 1"}, "header 'X-Key' has a control character"),
    ("http", {"Bad Name": "x"}, "header name 'Bad Name' is not an HTTP token"),
    ("grpc", {"X-Key": "secrét"}, "header 'X-Key' must have a printable ASCII value"),
    ("grpc", {"Bad Name": "x"}, "header name 'Bad Name' is not an HTTP token"),
    ("grpc", {"grpc-timeout": "1S"}, "header name 'grpc-timeout' cannot be gRPC metadata"),
])
def test_headers_that_cannot_go_on_a_request_are_refused_at_config_load_by_name(protocol, headers, message):
    """They passed validation and failed every export: gRPC refused the metadata locally (an error
    retried for good, the queue stuck), aiohttp a newline, a receiver a name it cannot parse (400:
    every batch dropped). The value, often a secret, is never quoted."""
    with pytest.raises(ValueError, match=message) as refused:
        OtlpExporterConfig(protocol=protocol, headers=headers).validate()
    assert "secret" not in str(refused.value)


async def test_a_non_ascii_header_value_still_goes_over_http(http_receiver):
    exp, _ = await exporter(protocol="http", endpoint=http_receiver["url"], headers={"X-Team": "équipe"})
    try:
        await exp.deliver([GOLDEN[3]])
    finally:
        await exp.shutdown()
    assert records_of(http_receiver["requests"][0]) == [PINS["3"]]


@pytest.mark.parametrize(("endpoint", "problem"), [
    ("http://127.0.0.1:4317/v1/logs", "no path"),  # the OTLP/HTTP URL given to gRPC: retried for good
    ("127.0.0.1:99999", "the port is not a number from 1 to 65535"),  # gRPC dialled 34463
    ("127.0.0.1:abc", "the port is not a number from 1 to 65535"),
    ("127.0.0.1", "no port"),  # gRPC dialled 443
    ("https://", "no host"),  # every batch dropped: 'the target uri is not valid'
    ("[::1:4317", "Invalid IPv6 URL"),
    ("dns:///collector:4317", "unknown scheme 'dns'"),
])
def test_a_grpc_endpoint_grpc_cannot_dial_as_written_is_refused_at_config_load(endpoint, problem):
    with pytest.raises(ValueError, match=r"endpoint must be host:port or http\(s\)://host:port, got .*" + problem):
        OtlpExporterConfig(protocol="grpc", endpoint=endpoint).validate()


@pytest.mark.parametrize("endpoint", ["127.0.0.1:4317", "collector.example:4317", "[::1]:4317",
                                      "http://127.0.0.1:4317", "https://otlp.example", "https://otlp.example:443/",
                                      "unix:/run/otel.sock"])
def test_grpc_endpoints_that_dial_as_written_are_kept(endpoint):
    OtlpExporterConfig(protocol="grpc", endpoint=endpoint).validate()


async def test_a_grpc_endpoint_with_a_trailing_slash_delivers(grpc_receiver):
    logs, port = grpc_receiver
    exp, _ = await exporter(endpoint=f"http://127.0.0.1:{port}/")
    try:
        await exp.deliver([GOLDEN[3]])
    finally:
        await exp.shutdown()
    assert records_of(logs.requests[0]) == [PINS["3"]]


@pytest.mark.parametrize(("endpoint", "problem"), [
    ("http://127.0.0.1:99999/v1/logs", "the port is not a number from 1 to 65535"),
    ("http://127.0.0.1:abc/v1/logs", "the port is not a number from 1 to 65535"),
    ("http://[::1/v1/logs", "Invalid IPv6 URL"),
])
def test_an_http_endpoint_aiohttp_cannot_post_to_is_refused_at_config_load(endpoint, problem):
    """A port out of range or not a number passed validation: aiohttp refused it on every export,
    retried for good, the sending queue stuck behind the first batch."""
    with pytest.raises(ValueError, match=r"endpoint must be an http\(s\) URL .*: " + problem):
        OtlpExporterConfig(protocol="http", endpoint=endpoint).validate()


@pytest.mark.parametrize(("claimed", "counted"), [(1000, 2), (-5, 0)])
async def test_a_partial_success_is_counted_within_the_records_sent(grpc_receiver, claimed, counted):
    """A receiver's ``rejected_log_records`` was counted as given: 1000 rejected of a batch of 2 (or
    a negative count) made /metrics say more events were rejected than were ever sent."""
    logs, port = grpc_receiver
    logs.rejected = claimed
    exp, host = await exporter(endpoint=f"127.0.0.1:{port}")
    try:
        assert await exp.deliver([GOLDEN[3], GOLDEN[24]]) == counted
    finally:
        await exp.shutdown()
    assert host.health.counters.get(("exporter/otlp", "rejected"), 0) == counted


def big(i: int, size: int) -> dict:
    return {**GOLDEN[3], "id": f"big-{i}", "capture": "full", "data": {"text": "x" * size}}


async def test_a_batch_over_the_grpc_receivers_size_limit_is_split_not_dropped():
    """A receiver answers a request over its receive limit (4 MiB by default: a backlog's full
    batches after an outage) RESOURCE_EXHAUSTED "larger than max", without RetryInfo: the whole
    batch was dropped though each event would fit. It is split until each part fits; an event too
    large even alone is the only one refused (counted ``failed``)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024)])
    logs = Logs()
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(logs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    exp, host = await exporter(endpoint=f"127.0.0.1:{port}", max_capture="full")
    events = [big(i, 20_000) for i in range(12)]
    events[7] = big(7, 100_000)
    try:
        assert await exp.deliver(events) == 1
        with pytest.raises(Permanent, match="larger than max"):  # alone and too large: refused as before
            await exp.deliver([events[7]])
    finally:
        await exp.shutdown()
        await server.stop(None)
    got = [r["attributes"]["aep.event_id"] for req in logs.requests for r in records_of(req)]
    assert got == [e["id"] for e in events if e["id"] != "big-7"]
    assert host.health.counters[("exporter/otlp", "failed")] == 1
    assert "export-refused" in host.health.snapshot()["problems"]["exporter/otlp"]


async def test_a_batch_answered_413_is_split_not_dropped():
    limit = 64 * 1024
    taken: list[str] = []

    async def v1_logs(request: web.Request) -> web.Response:
        body = await request.read()
        if len(body) > limit:
            return web.Response(status=413)
        taken.extend(r["attributes"]["aep.event_id"] for r in records_of(ExportLogsServiceRequest.FromString(body)))
        return web.Response(body=ExportLogsServiceResponse().SerializeToString(), content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/logs", v1_logs)
    runner, port = await serve(app)
    exp, _ = await exporter(protocol="http", endpoint=f"http://127.0.0.1:{port}/v1/logs", max_capture="full")
    events = [big(i, 20_000) for i in range(12)]
    try:
        assert await exp.deliver(events) == 0
    finally:
        await exp.shutdown()
        await runner.cleanup()
    assert taken == [e["id"] for e in events]


def test_a_leap_second_projects_as_the_next_seconds_start():
    """``:60`` is envelope-valid (RFC 3339 §5.6): datetime refused it, so the event was dropped."""
    leap = to_otlp({**GOLDEN[3], "time": "2016-12-31T23:59:60.5Z"})
    assert leap["time_unix_nano"] == to_otlp({**GOLDEN[3], "time": "2017-01-01T00:00:00.5Z"})["time_unix_nano"]


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "9999-12-31T23:59:59Z"])
async def test_a_valid_time_otlp_cannot_hold_leaves_its_event_out_not_the_batch_retried_for_good(grpc_receiver, when):
    """A time before 1970 (Go's zero time from a vendor, say) or after 2554 is envelope-valid, but
    protobuf refused it as a fixed64 while building the request, outside the per-event check: the
    whole batch raised, and the sending queue retried it for good with every later event behind."""
    logs, port = grpc_receiver
    exp, host = await exporter(endpoint=f"127.0.0.1:{port}")
    try:
        assert await exp.deliver([{**GOLDEN[13], "time": when}, GOLDEN[3]]) == 1
    finally:
        await exp.shutdown()
    assert [r for req in logs.requests for r in records_of(req)] == [PINS["3"]]
    assert host.health.counters[("exporter/otlp", "dropped")] == 1
    assert "unprojectable" in host.health.snapshot()["problems"]["exporter/otlp"]


async def test_a_string_protobuf_cannot_carry_leaves_its_event_out_not_the_batch_retried_for_good(grpc_receiver):
    """A lone surrogate (a plug-in's string; the queue keeps it exactly) is JSON the CloudEvents
    exporter escapes, but protobuf refuses to encode it: raised while building the whole request,
    it had the sending queue retry the batch for good. Each record is now built on its own."""
    logs, port = grpc_receiver
    exp, host = await exporter(endpoint=f"127.0.0.1:{port}", max_capture="full")
    try:
        assert await exp.deliver([{**GOLDEN[13], "data": {"note": "half a pair \ud800"}}, GOLDEN[3]]) == 1
    finally:
        await exp.shutdown()
    assert [r for req in logs.requests for r in records_of(req)] == [PINS["3"]]
    assert host.health.counters[("exporter/otlp", "dropped")] == 1
