"""The relay role's ingest (``POST /events``) and shutdown: a stalled emitter never holds the stop up.

- An emitter that sent its headers and only part of a body when the collector stops gets a
  retryable 503 ``{"error": "shutting-down", "detail": ...}`` with ``Retry-After: 1`` at once and
  its connection is closed; the stop waits neither for the body timeout nor for aiohttp's own
  ``shutdown_timeout`` (2 s). Nothing of that body was ingested, so nothing is lost; the emitter
  resends it (AEP-0003 §3.2: retry on 5xx with the same ids).
- A body that arrived in pieces before the stop is ingested as before (202, buffered, replayed).
- A body that does not arrive within the body timeout gets 408 and its connection is closed too
  (the rest of it is never read).

A real relay role on 127.0.0.1 and a free port; raw sockets for the half-sent bodies.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.exporters.relay_server import RelayServer, RelayServerConfig
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host

from tests.helpers import http_responses
from tests.relay_double import wait_until
from tests.test_relay_server import TOKEN

DEADLINE = 20.0
"""Generous bound on what should take milliseconds; it only bounds a failing run."""
STOP_BOUND = 1.5
"""A stop that waited for the body would take at least aiohttp's ``shutdown_timeout`` (2 s) and then
cut the connection without a reply; one that ends the body takes milliseconds."""

SID = "rs-stop-1"


def event(seq: int) -> dict[str, Any]:
    return {"aep": "0.1", "id": f"01RSSTOP{seq:018d}", "type": "progress.status",
            "time": "2026-01-01T00:00:00.000Z", "source": f"aep://test-host/agent/emitter/session/{SID}",
            "agent": "emitter", "session": SID, "seq": seq, "epoch": 0, "capture": "metadata",
            "data": {"message": f"step {seq}"}}


def request_head(length: int, media: str) -> bytes:
    return (f"POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\nAEP-Version: 0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: {media}\r\nConnection: close\r\n"
            f"Content-Length: {length}\r\n\r\n").encode("ascii")


async def relay_role(tmp_path: Path, **cfg: Any) -> RelayServer:
    relay = RelayServer(CreateSettings(id="relay_server"),
                        RelayServerConfig(endpoint="127.0.0.1:0", token=TOKEN, **cfg))
    await relay.start(Host(state_dir=tmp_path))
    return relay


async def partly_sent(relay: RelayServer, body: bytes, media: str,
                      sent: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent a POST's headers and the first ``sent`` bytes of ``body``, then stalls."""
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(request_head(len(body), media) + body[:sent])
    await writer.drain()
    return reader, writer


async def replayed(relay: RelayServer) -> list[dict[str, Any]]:
    """Every event the relay role holds for ``SID`` (a replay-only SSE stream)."""
    query = {"filter": json.dumps({"session": SID}), "from": "all", "live": "0"}
    async with aiohttp.ClientSession() as s, s.get(f"{relay.url}/stream", params=query,
                                                   headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        text = await r.text()
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def test_a_half_sent_ingest_body_gets_a_retryable_503_at_shutdown_and_does_not_hold_the_stop(
        tmp_path: Path) -> None:
    relay = await relay_role(tmp_path)
    body = b"\n".join(json.dumps(event(n)).encode() for n in range(3)) + b"\n"
    reader, writer = await partly_sent(relay, body, "application/x-ndjson", len(body) // 2)
    await wait_until(lambda: relay.surface.bodies.armed, "the relay role to wait for the rest of the body")
    began = time.monotonic()
    stop = asyncio.create_task(relay.shutdown())
    try:
        raw = await asyncio.wait_for(reader.read(), DEADLINE)  # to EOF: the relay closes the connection
        await asyncio.wait_for(stop, DEADLINE)
        took = time.monotonic() - began
    finally:
        writer.close()
        stop.cancel()
    assert raw, f"the connection was cut without a reply after {took:.2f} s"
    ((status, headers, reply),) = http_responses(raw)
    assert status == 503 and headers["retry-after"] == "1" and headers["connection"].lower() == "close"
    assert headers["content-type"].startswith("application/json")
    answer = json.loads(reply)
    assert answer["error"] == "shutting-down" and "shutting down" in answer["detail"]
    assert took < STOP_BOUND, f"the stop took {took:.2f} s: it waited for the body"
    assert not relay.surface.buffers.sessions  # nothing of the unfinished body was ingested


async def test_an_ingest_body_that_arrived_in_pieces_before_the_stop_is_ingested(tmp_path: Path) -> None:
    relay = await relay_role(tmp_path)
    try:
        body = json.dumps(event(0)).encode()
        reader, writer = await partly_sent(relay, body, "application/json", 10)
        await wait_until(lambda: relay.surface.bodies.armed, "the relay role to wait for the rest of the body")
        writer.write(body[10:])
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), DEADLINE)
        writer.close()
        ((status, _, _),) = http_responses(raw)
        assert status == 202 and not relay.surface.bodies.armed
        assert [e["id"] for e in await replayed(relay)] == [event(0)["id"]]
    finally:
        await asyncio.wait_for(relay.shutdown(), DEADLINE)


async def test_an_ingest_body_past_its_timeout_gets_408_and_the_connection_is_closed(tmp_path: Path) -> None:
    relay = await relay_role(tmp_path, body_timeout=0.2)  # the relay role's own key, as the receivers have
    try:
        body = json.dumps(event(0)).encode()
        reader, writer = await partly_sent(relay, body, "application/json", 10)
        # To EOF, well before aiohttp's 10 s lingering read of the rest: the relay closed the connection.
        raw = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
        ((status, headers, reply),) = http_responses(raw)
        assert status == 408 and headers["connection"].lower() == "close" and "retry-after" not in headers
        assert json.loads(reply) == {"error": "body-timeout", "detail": "request body not received within 0.2s",
                                     "body_timeout": 0.2}
        assert not relay.surface.buffers.sessions
    finally:
        await asyncio.wait_for(relay.shutdown(), DEADLINE)


@pytest.mark.parametrize("bad", [0, -1, True, "10"])
def test_a_body_timeout_that_is_not_a_positive_number_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="body_timeout must be a positive number of seconds"):
        RelayServerConfig(body_timeout=bad).validate()
