"""The relay exporter against hostile and broken relays, networks and configs (adversarial pass)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from aep_collector.exporters.relay import RelayConfig
from aep_collector.exporters.relay.frames import CAPTURE
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.host import Host
from websockets.asyncio.server import ServerConnection, serve

from tests import test_relay_exporter as base
from tests.relay_double import RelayDouble, wait_until

TOKEN, CC = base.TOKEN, base.CC
EXPORTER = "exporter/relay"
# The relay exporter tests' own fixtures and event maker (fixtures are found as module attributes).
stamper, exporters, make = base.stamper, base.exporters, base.make


def problems(host: Host) -> dict[str, str]:
    return dict(host.health.snapshot().get("problems", {}).get(EXPORTER, {}))


class Partition:
    """A TCP hop between the exporter and a relay that can stop forwarding (a network partition:
    nothing is lost or refused, bytes just stop arriving) and then cut every connection."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.frozen = False
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.cut()
        self.server.close()
        await self.server.wait_closed()

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self.writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    while self.frozen and not dst.is_closing():
                        await asyncio.sleep(0.01)
                    dst.write(data)
                    await dst.drain()
            except (OSError, RuntimeError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


# -- delivery confirmation -------------------------------------------------------------------


@pytest.mark.parametrize("note_bytes", [10, 40_000])
async def test_a_network_partition_never_counts_unread_events_as_delivered(
        relay: RelayDouble, exporters: Any, stamper: Stamper, note_bytes: int) -> None:
    """A pong that does not come because nothing arrives is not a relay without ``ping`` frames:
    ``deliver`` keeps waiting (so the sending queue commits nothing), health says the relay is
    stalled, and once the dead connection is cut the events are resent and land. The large
    variant fills the socket buffers, so the writer itself is blocked while the ping is overdue."""
    hop = Partition(relay.port)
    await hop.start()
    try:
        exporter, host = await exporters(f"ws://127.0.0.1:{hop.port}/socket", hello_timeout=0.3)
        await asyncio.wait_for(exporter.deliver([make(stamper, "s1")]), 10)  # pongs do come back
        hop.frozen = True
        batch = [make(stamper, "s1", data={"note": "n" * note_bytes}) for _ in range(300)]
        delivery = asyncio.create_task(exporter.deliver(batch))
        await wait_until(lambda: delivery.done() or "relay-stalled" in problems(host),
                         "the stall report (or, wrongly, the delivery)")
        assert not delivery.done(), "events the relay never read were reported delivered"
        assert host.health.snapshot()["ok"] is False
        hop.cut()
        hop.frozen = False
        await asyncio.wait_for(delivery, 20)
        stored = {e["id"] for e in relay.stored}
        assert all(e["id"] in stored for e in batch)
        await wait_until(lambda: "relay-stalled" not in problems(host), "the stall report to clear")
    finally:
        await hop.stop()


async def test_a_late_pong_turns_confirmation_back_on(exporters: Any, stamper: Stamper,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A relay slow to answer one ping (past the fallback) still answers pings: its late pong
    switches confirmation back on, so later deliveries wait for a pong again."""
    release = asyncio.Event()
    pings: list[int] = []
    held: list[int] = []

    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(json.dumps({"type": "hello", "versions": ["0.1"]}))

        async def answer_when_released() -> None:
            while True:
                await release.wait()
                release.clear()
                for t in held:
                    await ws.send(json.dumps({"type": "pong", "t": t}))
                held.clear()

        answering = asyncio.create_task(answer_when_released())
        try:
            async for raw in ws:
                frame = json.loads(raw)
                if frame.get("type") == "ping":
                    pings.append(frame["t"])
                    held.append(frame["t"])
        finally:
            answering.cancel()

    caplog.set_level(logging.INFO, "aep.exporter.relay")
    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        exporter, _ = await exporters(f"ws://127.0.0.1:{port}/socket", hello_timeout=0.5)
        await asyncio.wait_for(exporter.deliver([make(stamper, "s1")]), 10)  # by the fallback
        assert "does not answer ping" in caplog.text and len(pings) == 1
        release.set()  # the first ping's pong, late
        await wait_until(lambda: "answered a ping" in caplog.text, "the late pong to be taken")
        delivery = asyncio.create_task(exporter.deliver([make(stamper, "s1")]))
        await wait_until(lambda: len(pings) == 2, "a confirming ping after the delivery")
        assert not delivery.done() and exporter.links[CC].pending == 1
        release.set()
        await asyncio.wait_for(delivery, 10)


# -- reconnecting ----------------------------------------------------------------------------


async def test_a_relay_that_drops_every_connection_after_hello_is_redialled_with_growing_backoff(
        exporters: Any, stamper: Stamper, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []

    def delay(attempt: int, initial: float, maximum: float) -> float:
        attempts.append(attempt)
        return 0.0

    monkeypatch.setattr("aep_collector.exporters.relay.link.backoff_delay", delay)
    hellos = 0

    async def handler(ws: ServerConnection) -> None:
        nonlocal hellos
        await ws.recv()
        hellos += 1
        await ws.send(json.dumps({"type": "hello", "versions": ["0.1"]}))
        await ws.close(1011)

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        exporter, _ = await exporters(f"ws://127.0.0.1:{port}/socket", backoff_max=30.0)
        await exporter.export([make(stamper, "s1")])
        await wait_until(lambda: len(attempts) >= 6, "a few redials")
    assert hellos >= 5
    assert attempts[:6] == [0, 1, 2, 3, 4, 5]  # a completed hello alone does not reset the backoff


async def test_shutdown_does_not_leave_a_stalled_relays_socket_open(exporters: Any, stamper: Stamper) -> None:
    """The close handshake with a relay that stopped reading never completes: the socket is
    aborted, so the relay does not keep a half-dead connection claiming our sessions."""
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(json.dumps({"type": "hello", "versions": ["0.1"]}))
        await ws.wait_closed()  # never reads again: the client's close frame is never taken

    async with serve(handler, "127.0.0.1", 0, max_queue=1) as server:
        port = server.sockets[0].getsockname()[1]
        exporter, _ = await exporters(f"ws://127.0.0.1:{port}/socket", connect_timeout=0.3)
        await exporter.export([make(stamper, "s1", data={"note": "n" * 20_000}) for _ in range(500)])
        ws = await wait_until(lambda: exporter.links[CC]._ws, "the connection")
        await asyncio.wait_for(exporter.shutdown(), 20)
        assert ws.transport.is_closing()


# -- config and secrets ----------------------------------------------------------------------


async def test_secrets_in_the_endpoint_never_reach_logs_or_healthz(
        exporters: Any, stamper: Stamper, caplog: pytest.LogCaptureFixture) -> None:
    """AEP-0003 §8.1: a query-string ``access_token`` MUST NOT be logged; nor a URL password."""
    silent: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    caplog.set_level(logging.DEBUG)
    try:
        stalled, host = await exporters(f"ws://op:PASSWORD1@127.0.0.1:{port}/socket?access_token=QUERYTOKEN",
                                        connect_timeout=0.3)
        with socket_free_port() as refused:
            down, _ = await exporters(f"ws://op:PASSWORD2@127.0.0.1:{refused}?access_token=QUERYTOKEN")
        await stalled.export([make(stamper, "s1")])
        await down.export([make(stamper, "s1")])
        shown = await wait_until(lambda: problems(host).get("handshake-timeout"), "the handshake-timeout report")
        await wait_until(lambda: "unreachable" in caplog.text, "the unreachable warning")
        assert f"ws://127.0.0.1:{port}/socket" in shown
        # The collector's own lines; websockets' debug dump of the request is the CLI's log redaction's.
        ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("aep."))
        text = ours + json.dumps(host.health.snapshot())
        for secret in ("PASSWORD1", "PASSWORD2", "QUERYTOKEN"):
            assert secret not in text
    finally:
        server.close()
        for writer in silent:
            writer.close()
        await server.wait_closed()


class socket_free_port:
    """A loopback port nobody listens on, for the block it guards."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("token", ["s3cret\nX-Injected: 1", "s3cret\u00e9", "two words"])
def test_a_token_that_cannot_be_a_header_is_refused_without_echoing_it(token: str) -> None:
    with pytest.raises(ValueError, match="token must be printable ASCII") as err:
        RelayConfig(token=token).validate()
    assert "s3cret" not in str(err.value) and "words" not in str(err.value)


async def test_a_token_with_a_trailing_newline_still_authenticates(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    """A YAML block scalar or a token file adds a newline; a bearer token never has blanks around it."""
    exporter, host = await exporters(relay.ws_url, token=f"  {TOKEN}\n")
    await exporter.export([make(stamper, "s1")])
    await wait_until(lambda: relay.stored, "the event through the authenticated connection")
    assert "unauthorized" not in problems(host)


async def test_wss_to_a_relay_without_tls_is_reported(exporters: Any, stamper: Stamper) -> None:
    """Not a relay that is down (logged once, health silent): a TLS failure never fixes itself."""
    async def plain_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(plain_http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        exporter, host = await exporters(f"wss://127.0.0.1:{port}/socket")
        await exporter.export([make(stamper, "s1")])
        detail = await wait_until(lambda: problems(host).get("tls-failed"), "the tls-failed report")
        assert f"wss://127.0.0.1:{port}/socket" in detail and host.health.snapshot()["ok"] is False
    finally:
        server.close()
        await server.wait_closed()


# -- privacy ---------------------------------------------------------------------------------


async def test_events_never_claim_more_capture_than_the_hello_declared(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    """A pipeline at ``full`` (the operator's choice for the JSONL log) must not put verbatim
    content on a connection whose hello declared at most ``redacted``: it is down-levelled."""
    canary = "CANARY-prompt-text-7731"
    exporter, _ = await exporters(relay.ws_url)
    full = make(stamper, "s1", "run.started", run="r1", capture="full",
                data={"prompt": canary, "trigger": "user"})
    kept = make(stamper, "s1", "progress.status", capture="redacted", data={})
    await exporter.export([full, kept])
    await wait_until(lambda: len(relay.stored) == 2, "both events")
    (hello,) = relay.hellos(CC)
    declared = hello["capabilities"]["capture"]
    assert declared == list(CAPTURE)
    first, second = relay.stored
    assert first["id"] == full["id"] and first["capture"] in declared
    assert first["data"].get("trigger") == "user"
    assert canary not in json.dumps(relay.frames_from(CC))
    assert second == kept  # within the declaration: untouched


@pytest.mark.parametrize(("code", "name"), [(1008, "policy violation"), (1009, "message too big"),
                                            (1013, "try again later")])
async def test_a_relay_that_closes_each_connection_with_a_code_shows_it_in_healthz(
        exporters: Any, stamper: Stamper, code: int, name: str) -> None:
    """A relay that answers the hello and then closes with 1008, 1009 or 1013 on the first event:
    each new hello cleared the connection problems, so /healthz read ok while the event never
    reached it (redialled for good, the sending queue's delivery waiting). The close is shown."""
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(json.dumps({"type": "hello", "versions": ["0.1"]}))
        async for raw in ws:
            if "." in json.loads(raw).get("type", ""):
                await ws.close(code, "refused here")
                return

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        exporter, host = await exporters(f"ws://127.0.0.1:{port}/socket")
        delivery = asyncio.create_task(exporter.deliver([make(stamper, "s1")]))
        try:
            await wait_until(lambda: "relay-closed" in problems(host), "the close shown")
            detail = problems(host)["relay-closed"]
            assert f"code {code} ({name}): 'refused here'" in detail and CC in detail
            assert not host.health.snapshot()["ok"]
            if code == 1009:  # the event it closed on is left out (see the frame-limit test below)
                assert await asyncio.wait_for(delivery, 30) == 1
            else:
                await wait_until(lambda: exporter.links[CC].connections >= 3, "a few connections")
                assert not delivery.done()
        finally:
            delivery.cancel()


async def test_a_relay_restart_is_not_shown_as_a_relay_closing_on_us(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    exporter, host = await exporters(relay.ws_url)
    await exporter.deliver([make(stamper, "s1")])
    await relay.stop()  # closes every socket with 1001
    await relay.start()
    await exporter.deliver([make(stamper, "s1")])
    assert exporter.links[CC].connections == 2
    assert "relay-closed" not in problems(host) and host.health.snapshot()["ok"]


async def test_an_event_the_relay_refuses_as_invalid_shows_in_healthz(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    """The relay answers an envelope-invalid event (a plug-in's, say) with ``invalid-event`` naming
    its id and does not keep it, while the next pong confirms the write: it was logged as a refused
    *command* and counted, and /healthz read ok with the event lost at the relay."""
    exporter, host = await exporters(relay.ws_url)
    bad = {**make(stamper, "s1"), "Bad_Name": 1}  # an extension name AEP-0001 §5.4 does not allow
    await exporter.deliver([bad, make(stamper, "s1")])
    await wait_until(lambda: "event-refused" in problems(host), "the refusal shown")
    assert bad["id"] in problems(host)["event-refused"] and "Bad_Name" in problems(host)["event-refused"]
    assert not host.health.snapshot()["ok"] and len(relay.stored) == 1


async def test_an_event_over_the_relays_frame_limit_is_dropped_alone_not_resent_for_good(
        stamper: Stamper, exporters: Any, tmp_path: Any) -> None:
    """A collector's relay role with ``max_body`` 8 KiB closes the connection with 1009 on a 20 KB
    event. It went back to the outbox head and was resent on every connection: closed again, for
    good, the sending queue's delivery waiting and every later event behind it. The largest
    unconfirmed event is now left out (counted ``failed``, ``event-too-big``); the rest arrive."""
    from tests.helpers import running
    from tests.test_relay_server import config

    async with running(config(tmp_path, token=TOKEN, max_body=8192)) as service:
        role = service.exporters["relay_server"]
        exporter, host = await exporters(role.url.replace("http://", "ws://") + "/socket")
        events = [make(stamper, "s1", data={"note": "x" * (20_000 if i == 1 else 10)}) for i in range(3)]
        assert await asyncio.wait_for(exporter.deliver(events), 30) == 1  # bounded: it waited for good
        assert await exporter.deliver([make(stamper, "s1")]) == 0  # the link goes on
        stored = [entry.event["id"] for entry in role.surface.buffers.whole("s1")]
    detail = problems(host)["event-too-big"]
    assert events[1]["id"] in detail and "1009" in detail
    assert host.health.counters[(EXPORTER, "failed")] == 1
    assert exporter.links[CC].connections == 2
    assert events[1]["id"] not in stored and {events[0]["id"], events[2]["id"]} <= set(stored)


async def test_a_reclaim_over_the_relays_frame_limit_is_no_longer_sent_and_nothing_else_is_dropped(
        exporters: Any, stamper: Stamper) -> None:
    """A relay restarted with a smaller frame limit is sent, first on the new connection, the claim
    of an idle session: its latest event, delivered before and now over the limit (1009). That claim
    is dropped from the reclaims; no event in flight is taken for it."""
    limit = 1 << 20
    closes: list[ServerConnection] = []

    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        await ws.send(json.dumps({"type": "hello", "versions": ["0.1"]}))
        closes.append(ws)
        async for raw in ws:
            if len(raw) > limit:
                await ws.close(1009, "too big")
                return
            frame = json.loads(raw)
            if frame.get("type") == "ping":
                await ws.send(json.dumps({"type": "pong", "t": frame["t"]}))

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        exporter, host = await exporters(f"ws://127.0.0.1:{port}/socket")
        big = make(stamper, "idle", data={"note": "x" * 20_000})
        assert await exporter.deliver([big]) == 0
        limit = 8192
        await closes[0].close(1001)  # the relay restarts with the smaller limit
        small = make(stamper, "busy")
        assert await asyncio.wait_for(exporter.deliver([small]), 30) == 0
        await wait_until(lambda: "idle" not in exporter.links[CC].latest, "the reclaim given up")
    assert "event-too-big" not in problems(host) and (EXPORTER, "failed") not in host.health.counters
