"""Shutdown and request bodies still arriving: a stalled client never holds a stop up.

- A request that sent its headers and only part of its body when the collector stops gets 503
  ``shutting-down`` at once and its connection is closed; the stop does not wait ``body_timeout``.
  Nothing was accepted from it, so nothing is lost.
- A hook whose body is in (held, or still in the pipeline) completes as before: its durable
  record and its reply. A half-sent body on a kept-alive connection, begun while the stop waits
  for that hook, is answered 503 at once too.

``body_timeout`` is an hour here, so without the shutdown path these requests would wait far past
every deadline below; the deadlines only bound a failing run. Real collectors on loopback free
ports, raw sockets for the half-sent bodies.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.config import parse
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.service import Service
from aep_collector.receivers.claude_code import FACTORY as CLAUDE_CODE
from aep_collector.receivers.hook_http import HookServer

from tests.helpers import base_config, http_responses, read_jsonl
from tests.relay_double import wait_until

HOUR = 3600.0
DEADLINE = 20.0
"""Generous bound on what should take milliseconds; far below ``HOUR`` and the service's 30 s
``STOP_LIMIT``, so a stop that waits for a body fails here instead of passing late."""

HOOK = {"session_id": "s-stop", "hook_event_name": "Notification", "message": "m", "cwd": "/w"}


def request_head(length: int, keep_alive: bool = False) -> bytes:
    connection = "keep-alive" if keep_alive else "close"
    return (f"POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Connection: {connection}\r\nContent-Length: {length}\r\n\r\n").encode("ascii")


async def half_sent(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent a hook's headers and half its body, then stalls."""
    body = json.dumps(HOOK).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_head(len(body)) + body[:len(body) // 2])
    await writer.drain()
    return reader, writer


async def answer_then_closed(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], Any]:
    """The one response on a connection the server then closes (read to EOF)."""
    raw = await asyncio.wait_for(reader.read(), DEADLINE)
    ((status, headers, body),) = http_responses(raw)
    return status, headers, json.loads(body)


def assert_shutting_down(answer: tuple[int, dict[str, str], Any]) -> None:
    status, headers, body = answer
    assert status == 503 and headers["content-type"].startswith("application/json")
    assert headers["connection"].lower() == "close"
    assert body["error"] == "shutting-down" and "shutting down" in body["detail"]


def service_for(tmp_path: Path, **receiver: Any) -> Service:
    cfg = base_config(tmp_path, receivers={"claude_code": {"endpoint": "127.0.0.1:0", "body_timeout": HOUR,
                                                           **receiver}})
    registry, _ = build_registry(load_plugins=False)
    return Service(parse(cfg, registry, "test.yaml"), host_name="test-host")


def events(tmp_path: Path) -> list[dict[str, Any]]:
    return [e for f in sorted((tmp_path / "logs").rglob("*.jsonl")) for e in read_jsonl(f)]


async def test_a_half_sent_body_gets_503_at_shutdown_and_does_not_hold_the_stop(tmp_path: Path) -> None:
    service = service_for(tmp_path)
    await service.start()
    receiver = service.receivers["claude_code"]
    assert receiver.port is not None
    reader, writer = await half_sent(receiver.port)
    await wait_until(lambda: receiver.bodies.armed, "the receiver to wait for the rest of the body")
    stop = asyncio.create_task(service.shutdown())
    try:
        assert_shutting_down(await answer_then_closed(reader))
        await asyncio.wait_for(stop, DEADLINE)
    finally:
        writer.close()
        stop.cancel()
    assert service.health.counters[("receiver/claude_code", "refused")] == 1
    assert not [e for e in events(tmp_path) if e["session"] == HOOK["session_id"]]  # nothing accepted


async def test_a_held_hook_still_gets_its_record_and_reply_while_a_half_sent_body_is_ended(
        tmp_path: Path) -> None:
    service = service_for(tmp_path, attention_timeout=HOUR)
    await service.start()
    receiver, router = service.receivers["claude_code"], service.host.control
    assert receiver.port is not None and router is not None
    router.set_route("claude-code", True)
    permission = {"session_id": "s-held", "hook_event_name": "PermissionRequest", "tool_name": "Bash",
                  "tool_input": {"command": "ls"}, "tool_use_id": "t1", "cwd": "/w"}

    async def post() -> int:
        async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{receiver.port}/hook",
                                                        json=permission) as r:
            await r.read()
            return r.status

    held = asyncio.create_task(post())
    await wait_until(lambda: router.holds, "the permission request to be held")
    reader, writer = await half_sent(receiver.port)
    await wait_until(lambda: receiver.bodies.armed, "the receiver to wait for the rest of the body")
    stop = asyncio.create_task(service.shutdown())
    try:
        assert_shutting_down(await answer_then_closed(reader))
        assert await asyncio.wait_for(held, DEADLINE) == 200  # its hold freed by the stop, answered
        await asyncio.wait_for(stop, DEADLINE)
    finally:
        writer.close()
        held.cancel()
        stop.cancel()
    assert [e["type"] for e in events(tmp_path) if e["session"] == "s-held"].count("attention.requested") == 1


class Gated:
    """A pipeline that takes each batch only once ``gate`` is set: a hook in flight at shutdown."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered: list[Any] = []
        self.consumed: list[Any] = []

    async def consume(self, batch: list[Any]) -> list[Any]:
        self.entered += batch
        await self.gate.wait()
        self.consumed += batch
        return []


async def read_one(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], Any]:
    """One response on a connection that stays open (framed by its ``Content-Length``)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE)
    ((status, headers, _),) = http_responses(head)
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), DEADLINE)
    return status, headers, json.loads(body)


async def test_bodies_end_at_once_while_a_hook_in_the_pipeline_is_waited_for(tmp_path: Path) -> None:
    pipeline = Gated()
    config = CLAUDE_CODE.default_config()
    config.endpoint, config.body_timeout, config.reply_timeout = "127.0.0.1:0", HOUR, HOUR
    server: HookServer = CLAUDE_CODE.create(CreateSettings(id="claude_code"), config, pipeline)
    await server.start(Host(health=Health()))
    assert server.port is not None
    url = f"http://127.0.0.1:{server.port}/hook"
    body = json.dumps(HOOK).encode()
    # A kept-alive connection with one hook answered: it may send another while the stop runs.
    kept_reader, kept_writer = await asyncio.open_connection("127.0.0.1", server.port)
    kept_writer.write(request_head(len(body), keep_alive=True) + body)
    await wait_until(lambda: pipeline.entered, "the first hook to reach the pipeline")
    pipeline.gate.set()
    assert (await read_one(kept_reader))[0] == 200
    pipeline.gate.clear()

    async def post() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.post(url, json={**HOOK, "message": "in flight"}) as r:
            return r.status, await r.json()

    in_flight = asyncio.create_task(post())
    await wait_until(lambda: len(pipeline.entered) == 2, "the second hook to reach the pipeline")
    reader, writer = await half_sent(server.port)
    await wait_until(lambda: server.bodies.armed, "the receiver to wait for the rest of the body")
    stop = asyncio.create_task(server.shutdown())
    try:
        assert_shutting_down(await answer_then_closed(reader))
        # The stop now waits for the hook in the pipeline; a body begun meanwhile is ended too.
        kept_writer.write(request_head(len(body)) + body[:len(body) // 2])
        assert_shutting_down(await answer_then_closed(kept_reader))
        assert not in_flight.done() and not stop.done()
        pipeline.gate.set()
        assert await asyncio.wait_for(in_flight, DEADLINE) == (200, {})
        await asyncio.wait_for(stop, DEADLINE)
    finally:
        pipeline.gate.set()
        for w in (writer, kept_writer):
            w.close()
        in_flight.cancel()
        stop.cancel()
    assert [s.payload["message"] for s in pipeline.consumed] == ["m", "in flight"]


async def test_an_otlp_http_body_still_arriving_gets_a_retryable_503_at_shutdown(tmp_path: Path) -> None:
    """OTLP/HTTP reads bodies the same way: a stalled exporter never holds the stop, and its 503
    (UNAVAILABLE, Retry-After) tells it to resend what it had not finished sending."""
    cfg = base_config(tmp_path, receivers={"otlp/vscode": {"profile": "vscode", "body_timeout": HOUR,
                                                           "http": {"endpoint": "127.0.0.1:0"}}})
    registry, _ = build_registry(load_plugins=False)
    service = Service(parse(cfg, registry, "test.yaml"), host_name="test-host")
    await service.start()
    receiver = service.receivers["otlp/vscode"]
    assert receiver.http_port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", receiver.http_port)
    writer.write(b"POST /v1/logs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 400\r\n\r\n{\"resourceLogs\": [")
    await writer.drain()
    await wait_until(lambda: receiver.bodies.armed, "the receiver to wait for the rest of the body")
    stop = asyncio.create_task(service.shutdown())
    try:
        raw = await asyncio.wait_for(reader.read(), DEADLINE)
        ((status, headers, body),) = http_responses(raw)
        assert status == 503 and headers["retry-after"] == "1" and headers["connection"].lower() == "close"
        assert json.loads(body)["code"] == 14 and "shutting down" in json.loads(body)["message"]  # UNAVAILABLE
        await asyncio.wait_for(stop, DEADLINE)
    finally:
        writer.close()
        stop.cancel()
