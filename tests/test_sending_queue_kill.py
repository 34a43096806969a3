"""Done-when of issue 15: ``kill -9`` the collector while the relay is down and 20,000 events wait,
restart it, bring the relay back, and count every event at the relay: none missing, ids unique."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import urllib.request

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from tests.helpers import Collector
from tests.relay_double import RelayDouble, wait_until

TOTAL = 20_000
PER_REQUEST = 1_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def otlp_body(session: str, start: int, n: int) -> bytes:
    """``n`` Copilot Chat tool-call records (one AEP event each in companion mode)."""
    records = [LogRecord(time_unix_nano=1_700_000_000_000_000_000 + start + i, severity_number=9,
                         attributes=[kv("event.name", "copilot_chat.tool.call"), kv("tool.name", "read_file"),
                                     kv("session.id", session)])
               for i in range(n)]
    res = Resource(attributes=[kv("service.name", "copilot-chat"), kv("session.id", session)])
    req = ExportLogsServiceRequest(resource_logs=[ResourceLogs(resource=res, scope_logs=[ScopeLogs(log_records=records)])])
    return req.SerializeToString()


def post(port: int, body: bytes) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/logs", data=body, method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def jsonl_ids(root) -> list[str]:
    ids = []
    for path in sorted(root.rglob("*.jsonl")):
        ids += [json.loads(line)["id"] for line in path.read_text().splitlines() if line]
    return ids


async def test_kill_9_with_relay_down_loses_nothing(tmp_path):
    port = free_port()
    config = {
        "receivers": {"otlp/vscode": {"profile": "vscode", "mode": "companion", "http": {"endpoint": "127.0.0.1:0"}}},
        "processors": {"mapping": None, "capture": None},
        "exporters": {"jsonl": {"directory": str(tmp_path / "logs"), "fsync": "never"},
                      "relay": {"endpoint": f"ws://127.0.0.1:{port}/socket", "backoff_initial": 0.1,
                                "backoff_max": 0.5}},
        "service": {"state_dir": str(tmp_path / "state"), "pipelines": {"p": {
            "receivers": ["otlp/vscode"], "processors": ["mapping", "capture"], "exporters": ["jsonl", "relay"]}}},
    }
    first = Collector(config, tmp_path).start()
    try:
        http = first.ports["receiver/otlp/vscode:http"]
        for i in range(TOTAL // PER_REQUEST):
            await asyncio.to_thread(post, http, otlp_body(f"s{i % 4}", i * PER_REQUEST, PER_REQUEST))
        accepted = jsonl_ids(tmp_path / "logs")
        assert len(accepted) == TOTAL and len(set(accepted)) == TOTAL
        os.kill(first.proc.pid, signal.SIGKILL)  # no drain, no shutdown: only what is on disk survives
        assert first.proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    queued = sum(p.stat().st_size for p in (tmp_path / "state" / "queue" / "relay").glob("*.seg"))
    assert queued > 0

    relay = RelayDouble(port=port)
    await relay.start()
    second = await asyncio.to_thread(Collector(config, tmp_path).start)
    try:
        wanted = set(accepted)
        await wait_until(lambda: wanted <= {e["id"] for e in relay.received}, "every accepted event at the relay",
                         timeout=60)
        got = [e["id"] for e in relay.received]
        assert set(got) == wanted  # nothing the collector did not accept, nothing missing
        # The relay's admission dedupes on (source, id): each accepted event is stored exactly once.
        assert sorted(e["id"] for e in relay.stored) == sorted(accepted)
        # At-least-once: a copy may arrive twice, but never as two different events with one id.
        by_id = {}
        for e in relay.received:
            assert by_id.setdefault(e["id"], e) == e
        assert await asyncio.to_thread(second.stop) == 0
    finally:
        if second.proc is not None and second.proc.poll() is None:
            second.proc.kill()
        await relay.stop()
    # Delivered and acknowledged: the queue let go of what it delivered.
    assert not any("refused" in line for line in second.log)
