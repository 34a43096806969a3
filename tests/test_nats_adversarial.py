"""The fleet tier under attack: oversize events, streams that are gone or bind other subjects, TLS
a server does not offer, garbage and dishonest capture claims on the stream, and edges that answer
a command with something else. Real nats-server processes throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import nats
import pytest
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.natsconn import Link, NatsConnection
from nats.js import api

from tests.helpers import read_jsonl, running
from tests.nats_support import NatsNode, free_port, stream_with_max_msg_size
from tests.relay_double import wait_until
from tests.test_nats_exporter import events, make_exporter, stored
from tests.test_nats_fleet import CC, TOKEN, Operator, gateway, history

EXPORTER = "exporter/nats"
RECEIVER = "receiver/nats"


def padded(stamper: Stamper, session: str, size: int) -> dict[str, Any]:
    """A progress event whose wire form is about ``size`` bytes."""
    event = stamper.stamp({"type": "progress.status", "agent": CC, "session": session, "data": {"message": ""}})
    event["data"]["message"] = "x" * (size - len(json.dumps(event, separators=(",", ":"))))
    return event


# -- edge: events NATS can never take ------------------------------------------------------------


@pytest.mark.parametrize("in_flight", [1, 512])
async def test_an_event_above_max_payload_is_dropped_visibly_and_the_rest_is_delivered(
        small_node: NatsNode, tmp_path: Path, in_flight: int) -> None:
    exp, host = make_exporter(small_node.url, tmp_path, max_in_flight=in_flight)
    await exp.start(host)
    try:
        stamper = Stamper(tmp_path / "st", "h")
        before = events(stamper, "s", 2)
        # Under max_payload by itself, over it with the headers: the server would cut the connection.
        near = padded(stamper, "s", 4096 - 20)
        huge = padded(stamper, "s", 20_000)
        after = events(stamper, "s", 2)
        await asyncio.wait_for(exp.deliver(before + [near, huge] + after), 30)  # returns: nothing to retry
        assert [m.headers["Nats-Msg-Id"] for m in await stored(small_node.url)] == [
            e["id"] for e in before + after]
        health = host.health.snapshot()
        assert health["dropped"] == {EXPORTER: 2}
        assert "max_payload of 4096" in health["problems"][EXPORTER]["event-too-large"]
        assert exp.link.nc.is_connected and exp.link.ready.is_set()  # the server never cut us off
    finally:
        await exp.shutdown()


@pytest.mark.parametrize("in_flight", [1, 512])
async def test_an_event_above_the_streams_max_msg_size_is_dropped_not_retried_for_ever(
        node: NatsNode, tmp_path: Path, in_flight: int) -> None:
    await stream_with_max_msg_size(node.url, 2000)
    exp, host = make_exporter(node.url, tmp_path, max_in_flight=in_flight, publish_timeout=2.0)
    await exp.start(host)
    try:
        stamper = Stamper(tmp_path / "st", "h")
        batch = [*events(stamper, "s", 1), padded(stamper, "s", 5000), *events(stamper, "t", 1)]
        await asyncio.wait_for(exp.deliver(batch), 30)
        assert [m.headers["Nats-Msg-Id"] for m in await stored(node.url)] == [batch[0]["id"], batch[2]["id"]]
        assert "max_msg_size" in host.health.snapshot()["problems"][EXPORTER]["event-too-large"]
    finally:
        await exp.shutdown()


# -- edge and gateway: the stream ------------------------------------------------------------------


async def test_a_stream_deleted_under_a_running_edge_is_created_again(node: NatsNode, tmp_path: Path) -> None:
    exp, host = make_exporter(node.url, tmp_path, publish_timeout=1.0)
    await exp.start(host)
    try:
        stamper = Stamper(tmp_path / "st", "h")
        await exp.deliver(events(stamper, "s", 1))
        nc = await nats.connect(node.url)
        try:
            await nc.jetstream().delete_stream("AEP_EVENTS")
        finally:
            await nc.close()
        later = events(stamper, "s", 3)

        async def retried() -> None:  # as the sending queue does
            while True:
                try:
                    return await exp.deliver(later)
                except Exception:
                    await asyncio.sleep(0.1)

        await asyncio.wait_for(retried(), 30)
        assert [m.headers["Nats-Msg-Id"] for m in await stored(node.url)] == [e["id"] for e in later]
    finally:
        await exp.shutdown()


async def test_a_stream_that_binds_other_subjects_is_refused_by_name_at_edge_and_gateway(
        node: NatsNode, tmp_path: Path) -> None:
    nc = await nats.connect(node.url)
    try:
        await nc.jetstream().add_stream(api.StreamConfig(name="AEP_EVENTS", subjects=["other.>"]))
    finally:
        await nc.close()
    exp, host = make_exporter(node.url, tmp_path, publish_timeout=1.0)
    await exp.start(host)
    try:
        with pytest.raises(ValueError, match=r"binds \['other.>'\], not aep.events.>"):
            await exp.deliver(events(Stamper(tmp_path / "st", "h"), "s", 1))
    finally:
        await exp.shutdown()
    async with running(gateway(tmp_path / "gw", [node.url])) as gw:
        problem = await wait_until(lambda: gw.host.health.snapshot().get("problems", {}).get(RECEIVER, {})
                                   .get("consume-failed"), "the gateway to say it consumes nothing", 20)
        assert "binds ['other.>']" in problem


async def test_a_gateway_restarted_with_new_ack_settings_applies_them_to_its_durable(
        node: NatsNode, tmp_path: Path) -> None:
    """nats-py reuses an existing durable as it is: a changed ack_wait or max_ack_pending must
    still reach the server, not be silently ignored."""
    async def settings() -> tuple[float, int] | None:
        nc = await nats.connect(node.url)
        try:
            info = await nc.jetstream().consumer_info("AEP_EVENTS", "aep-gateway")
            return info.config.ack_wait, info.config.max_ack_pending
        except Exception:
            return None
        finally:
            await nc.close()

    async def until(want: tuple[float, int], what: str) -> None:
        got = None
        for _ in range(400):
            if (got := await settings()) == want:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{what}: the durable has {got}")

    async with running(gateway(tmp_path / "gw", [node.url])):
        await until((30.0, 20_000), "the durable made with the defaults")
    cfg = gateway(tmp_path / "gw", [node.url])
    cfg["receivers"]["nats"].update(ack_wait=7.0, max_ack_pending=500)
    async with running(cfg) as gw:
        await until((7.0, 500), "the durable updated on restart")
        assert gw.host.health.snapshot()["ok"]


async def test_a_gateway_that_cannot_consume_says_so_in_healthz_until_it_can(node: NatsNode, tmp_path: Path) -> None:
    cfg = gateway(tmp_path / "gw", [node.url])
    cfg["receivers"]["nats"]["stream"]["create"] = False
    async with running(cfg) as gw:
        problem = await wait_until(lambda: gw.host.health.snapshot().get("problems", {}).get(RECEIVER, {})
                                   .get("consume-failed"), "the missing stream in /healthz", 20)
        assert "stream not found" in problem
        nc = await nats.connect(node.url)
        try:
            await nc.jetstream().add_stream(api.StreamConfig(name="AEP_EVENTS", subjects=["aep.events.>"]))
        finally:
            await nc.close()
        await wait_until(lambda: gw.host.health.snapshot()["ok"], "the condition to clear once the stream exists", 30)


# -- connection ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tls", [{"scheme": "tls"}, {"scheme": "nats", "tls_hostname": "nats.internal"}],
                         ids=["tls-url", "tls_hostname-only"])
async def test_tls_is_never_given_up_for_plaintext_and_the_token_never_sent(tmp_path: Path, tls: dict[str, str]) -> None:
    """A server that does not ask for TLS (a plain one, or a spoofer) gets no CONNECT, so no token;
    any ``tls_*`` key turns TLS on, ``tls_hostname`` alone included (README: Fleet on NATS JetStream)."""
    tls = dict(tls)
    scheme = tls.pop("scheme")
    seen: list[bytes] = []

    async def plain_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b'INFO {"server_id":"x","version":"2.15.1","proto":1,"headers":true,'
                     b'"max_payload":1048576,"auth_required":true}\r\n')
        await writer.drain()
        with contextlib.suppress(Exception):
            while data := await reader.read(4096):
                seen.append(data)
        writer.close()

    port = free_port()
    server = await asyncio.start_server(plain_server, "127.0.0.1", port)
    downs: list[str] = []
    link = Link(NatsConnection(servers=[f"{scheme}://127.0.0.1:{port}"], token="s3cret-fleet", reconnect_wait=0.1,
                               connect_timeout=1.0, **tls), _never_up, downs.append)
    try:
        link.start("nats:plain")
        await wait_until(lambda: any("TLS" in d for d in downs), "the link to refuse the plaintext server", 20)
        assert not link.ready.is_set()
        assert b"s3cret-fleet" not in b"".join(seen) and b"CONNECT" not in b"".join(seen)
    finally:
        await link.close()
        server.close()
        await server.wait_closed()


async def _never_up(nc: Any) -> None:
    raise AssertionError("a server without TLS must not be used")


# -- gateway: what arrives on the stream ------------------------------------------------------------


def stamped(i: int, **over: Any) -> dict[str, Any]:
    event = {"aep": "0.1", "id": f"01JNATSADVERSARIAL{i:08d}", "type": "progress.status",
             "source": "aep://edge-x/claude-code/s1", "agent": CC, "session": "s1", "seq": i,
             "time": "2025-01-01T00:00:00.000Z", "data": {"percent": 50}}
    event.update(over)
    return event


async def publish(url: str, bodies: list[bytes], headers: dict[str, str] | None = None) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for i, body in enumerate(bodies):
            await js.publish(f"aep.events.{CC}.s1", body, headers={"Nats-Msg-Id": f"m{i}", **(headers or {})})
    finally:
        await nc.close()


async def stream_ready(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for _ in range(600):
            with contextlib.suppress(Exception):
                await js.stream_info("AEP_EVENTS")
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the gateway never created the stream")
    finally:
        await nc.close()


async def test_envelope_invalid_messages_are_rejected_by_name_and_never_break_the_gateways_exporters(
        node: NatsNode, tmp_path: Path) -> None:
    async with running(gateway(tmp_path / "gw", [node.url])) as gw:
        await stream_ready(node.url)
        bad = [b"not json", b"[1]", json.dumps(stamped(1, session={"a": 1})).encode(),
               json.dumps(stamped(2, seq="x")).encode(), json.dumps(stamped(3, capture="bogus")).encode(),
               ("[" * 300 + "]" * 300).encode()]
        good = stamped(9)
        await publish(node.url, [*bad, json.dumps(good).encode()])
        await wait_until(lambda: history(tmp_path / "gw"), "the valid event in the gateway's history", 20)
        await wait_until(lambda: gw.host.health.counters.get((RECEIVER, "rejected")) == len(bad),
                         "every bad message rejected", 20)
        assert history(tmp_path / "gw") == [good]
        problems = gw.host.health.snapshot()["problems"]
        assert set(problems) == {RECEIVER}  # jsonl and the relay role never saw one of them
        assert "is not an AEP event" in problems[RECEIVER]["not-an-event"]
        assert gw.host.health.counters.get(("exporter/relay_server", "failed")) is None


async def test_a_capture_claim_its_content_breaks_is_cut_to_the_gateways_ceiling(
        node: NatsNode, tmp_path: Path) -> None:
    async with running(gateway(tmp_path / "gw", [node.url])) as gw:
        watcher = await Operator(gw.exporters["relay_server"].url).start()
        try:
            await stream_ready(node.url)
            # No capture attribute reads as metadata, yet the tool's full result rides along.
            liar = stamped(1, type="tool.completed", data={"tool": {"name": "Bash", "call_id": "toolu_1"},
                                                            "result": "AKIA-SECRET-OUTPUT of the tool"})
            await publish(node.url, [json.dumps(liar).encode()])
            kept = (await wait_until(lambda: history(tmp_path / "gw"), "the event at the gateway", 20))[0]
            seen = (await wait_until(lambda: watcher.of("s1"), "the event at the relay role", 20))[0]
        finally:
            await watcher.close()
        for event in (kept, seen):
            assert event["id"] == liar["id"] and "result" not in event["data"]
            assert event["capture"] == "metadata" and event["data"]["tool"] == liar["data"]["tool"]
        assert "claims capture 'metadata'" in gw.host.health.snapshot()["problems"][RECEIVER]["capture-claim-too-low"]


async def test_an_event_stored_twice_is_taken_in_once_even_within_one_fetch(node: NatsNode, tmp_path: Path) -> None:
    """Two copies outside JetStream's duplicate window (an edge resending after a long outage)."""
    nc = await nats.connect(node.url)
    try:
        await nc.jetstream().add_stream(api.StreamConfig(name="AEP_EVENTS", subjects=["aep.events.>"]))
    finally:
        await nc.close()
    event = json.dumps(stamped(1)).encode()
    await publish(node.url, [event, event, json.dumps(stamped(2)).encode()])  # distinct Nats-Msg-Ids
    async with running(gateway(tmp_path / "gw", [node.url])) as gw:
        await wait_until(lambda: gw.host.health.counters.get((RECEIVER, "duplicates")), "the copy skipped", 20)
        await wait_until(lambda: len(history(tmp_path / "gw")) >= 2, "both events", 20)
    assert [e["seq"] for e in history(tmp_path / "gw")] == [1, 2]


async def test_two_emitters_minting_one_id_are_both_taken_in(node: NatsNode, tmp_path: Path) -> None:
    """Ids are unique per source only: a consumer dedupes on (source, id), never on a bare id."""
    nc = await nats.connect(node.url)
    try:
        await nc.jetstream().add_stream(api.StreamConfig(name="AEP_EVENTS", subjects=["aep.events.>"]))
    finally:
        await nc.close()
    mine = stamped(1)
    theirs = stamped(1, source="aep://edge-y/claude-code/s1", data={"percent": 80})
    await publish(node.url, [json.dumps(mine).encode(), json.dumps(theirs).encode(), json.dumps(stamped(2)).encode()])
    async with running(gateway(tmp_path / "gw", [node.url])) as gw:
        await wait_until(lambda: any(e["seq"] == 2 for e in history(tmp_path / "gw")), "the last event", 20)
        assert gw.host.health.counters.get((RECEIVER, "duplicates")) is None
    assert history(tmp_path / "gw") == [mine, theirs, stamped(2)]


async def test_an_event_the_gateways_jsonl_cannot_write_is_not_acknowledged_and_is_written_later(
        node: NatsNode, tmp_path: Path) -> None:
    """Acknowledged only once written: the durable consumer must not move past an event the gateway's
    history lacks. Its session's file is a directory for a while (any per-file write failure)."""
    nc = await nats.connect(node.url)
    try:
        await nc.jetstream().add_stream(api.StreamConfig(name="AEP_EVENTS", subjects=["aep.events.>"]))
    finally:
        await nc.close()
    blocked = tmp_path / "gw" / "logs" / CC / "s1.jsonl"
    blocked.mkdir(parents=True)
    other = stamped(2, session="s2", source="aep://edge-x/claude-code/s2")
    await publish(node.url, [json.dumps(stamped(1)).encode(), json.dumps(other).encode()])
    cfg = gateway(tmp_path / "gw", [node.url])
    cfg["receivers"]["nats"]["ack_wait"] = 1.0  # redelivered soon after

    def written() -> list[dict[str, Any]]:
        return [e for f in sorted((tmp_path / "gw" / "logs").rglob("*.jsonl")) if f.is_file() for e in read_jsonl(f)]

    async with running(cfg) as gw:
        await wait_until(lambda: written() == [other], "the other session's event written", 20)
        await wait_until(lambda: gw.host.health.counters.get(("exporter/jsonl", "dropped"), 0) >= 2,
                         "the blocked event tried again", 20)
        blocked.rmdir()
        await wait_until(lambda: len(written()) == 2, "the blocked event written once it can be", 20)
    assert sorted(e["seq"] for e in written()) == [1, 2]  # and the other one not again


async def test_an_edge_answering_a_command_with_garbage_gets_it_nacked_busy(node: NatsNode, tmp_path: Path) -> None:
    from aep_sdk.aio import ControlClient
    from aep_sdk.control import NackError

    nc = await nats.connect(node.url)

    async def impostor(msg: Any) -> None:
        await msg.respond(b"this is not an ack\n{]")

    await nc.subscribe("aep.control.edge-z", cb=impostor)
    try:
        async with running(gateway(tmp_path / "gw", [node.url])) as gw:
            watcher = await Operator(gw.exporters["relay_server"].url).start()
            await stream_ready(node.url)
            await publish(node.url, [json.dumps(stamped(1)).encode()],
                          headers={"Aep-Control": "aep.control.edge-z",
                                   "Aep-Accepts": json.dumps(["control.attention.respond"])})
            await wait_until(lambda: watcher.of("s1") and gw.host.control.accepts(CC), "the session at the gateway", 20)
            operator = ControlClient(watcher.url, agent="aep-console", host="ops-host", token=TOKEN)
            await operator.connect()
            try:
                with pytest.raises(NackError) as err:
                    await asyncio.wait_for(operator.send("control.attention.respond", "s1", subject="01JNOSUCH",
                                                         data={"answer": {"option": "allow"}}), 60)
                assert err.value.reason == "busy"
            finally:
                await operator.close()
                await watcher.close()
    finally:
        await nc.close()


async def test_a_gateway_shut_down_after_a_rejected_message_leaves_no_stuck_drain_behind(
        node: NatsNode, tmp_path: Path) -> None:
    """A pull request's late status reply, left unread in the consumer's inbox, kept the connection's
    drain waiting until close gave up on it, leaving a cancelled task behind."""
    import gc

    loop = asyncio.get_running_loop()
    leftovers: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: leftovers.append(context))
    try:
        async with running(gateway(tmp_path / "gw", [node.url])) as gw:
            await stream_ready(node.url)
            await publish(node.url, [b"junk"])
            await wait_until(lambda: gw.host.health.counters.get((RECEIVER, "rejected")), "the junk rejected", 20)
            await asyncio.sleep(1.5)  # a fetch or two expire meanwhile, as on any idle gateway
        gc.collect()
        assert not leftovers
    finally:
        loop.set_exception_handler(previous)
