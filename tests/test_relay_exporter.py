"""The relay exporter against the relay double on loopback: hello, claims, outbox, faults, restart."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aep_collector.exporters.relay import FACTORY, RelayConfig, RelayExporter
from aep_collector.exporters.relay.frames import backoff_delay, category, hello_problem, is_command
from aep_collector.exporters.relay.outbox import Outbox, Pending, pending
from aep_collector.pipeline.component import CreateSettings, Kind
from aep_collector.pipeline.config import ConfigError, parse
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.wire import dumps
from aep_sdk.aio import ControlClient

from tests.helpers import base_config
from tests.relay_double import RelayDouble, wait_until

TOKEN = "relay-token"
RESPOND = "control.attention.respond"
CC = "claude-code"


class FakeRouter:
    """Exactly the control-router interface the exporter codes against, recording every call."""

    def __init__(self, accepts: dict[str, list[str] | None] | None = None) -> None:
        self.table = dict(accepts or {})
        self.routes: list[tuple[str, bool]] = []
        self.submitted: list[tuple[dict[str, Any], str]] = []
        self.on_submit: Callable[[dict[str, Any], str], Awaitable[None]] | None = None

    def accepts(self, agent: str) -> list[str] | None:
        return self.table.get(agent)

    def set_route(self, agent: str, live: bool) -> None:
        self.routes.append((agent, live))

    async def submit(self, command: dict[str, Any], target_agent: str) -> None:
        self.submitted.append((command, target_agent))
        if self.on_submit is not None:
            await self.on_submit(command, target_agent)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def stamper(tmp_path: Path) -> Stamper:
    return Stamper(tmp_path / "state", host="test-host")


@pytest.fixture
async def exporters() -> AsyncIterator[Callable[..., Awaitable[tuple[RelayExporter, Host]]]]:
    """Builds started exporters with fast backoff; shuts every one down afterwards."""
    made: list[RelayExporter] = []

    async def build(endpoint: str, control: Any = None, **overrides: Any) -> tuple[RelayExporter, Host]:
        options = {"token": TOKEN, "backoff_initial": 0.02, "backoff_max": 0.1, "instance": "test/1", **overrides}
        exporter = RelayExporter(CreateSettings(id="relay"), RelayConfig(endpoint=endpoint, **options))
        host = Host(control=control)
        await exporter.start(host)
        made.append(exporter)
        return exporter, host

    yield build
    for exporter in made:
        await asyncio.wait_for(exporter.shutdown(), 10)


def make(stamper: Stamper, session: str | None, type: str = "progress.status", agent: str = CC,
         **extra: Any) -> dict[str, Any]:
    return stamper.stamp({"type": type, "agent": agent, "session": session, "data": {}, **extra})


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in events]


def live_link(exporter: RelayExporter, agent: str = CC) -> Callable[[], bool]:
    return lambda: agent in exporter.links and exporter.links[agent].live


# -- config, factory, pure parts ---------------------------------------------------------------


def test_defaults_and_factory() -> None:
    cfg = RelayConfig()
    assert (cfg.endpoint, cfg.token, cfg.outbox_size, cfg.overflow) == \
        ("ws://127.0.0.1:8787/socket", None, 10000, "drop_oldest")
    assert (cfg.backoff_initial, cfg.backoff_max, cfg.connect_timeout, cfg.hello_timeout) == (0.5, 10.0, 5.0, 5.0)
    assert (cfg.ping_interval, cfg.ack_window_ms, cfg.instance) == (25.0, 10000, None)
    registry, _ = build_registry(load_plugins=False)
    assert registry.get(Kind.EXPORTER, "relay") is FACTORY
    assert RelayConfig(endpoint="wss://relay.example:443").url == "wss://relay.example:443/socket"


@pytest.mark.parametrize("endpoint, message", [
    ("http://127.0.0.1:8787/socket", "ws:// or wss://"),
    ("127.0.0.1:8787", "ws:// or wss://"),
    ("ws:///socket", "names no host"),
    ("ws://127.0.0.1:99999/socket", "invalid port"),
])
def test_bad_endpoints_are_refused_clearly(endpoint: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RelayConfig(endpoint=endpoint).validate()


def test_yaml_token_from_env_and_empty_means_none(tmp_path: Path) -> None:
    registry, _ = build_registry(load_plugins=False)
    raw = base_config(tmp_path, extra_exporters={"relay": {"token": "${env:AEP_TOKEN:-}", "overflow": "drop_newest"}})
    unset = parse(raw, registry, "t.yaml", env={}).exporters["relay"][1]
    assert unset.token is None and unset.overflow == "drop_newest"
    assert parse(raw, registry, "t.yaml", env={"AEP_TOKEN": "s3"}).exporters["relay"][1].token == "s3"
    raw["exporters"]["relay"] = {"overflow": "drop_random"}
    with pytest.raises(ConfigError, match="overflow"):
        parse(raw, registry, "t.yaml", env={})


def entry(name: str, low: bool = True) -> Pending:
    return Pending(text=name, type="progress.status", session="s", low=low)


@pytest.mark.parametrize("policy, kept", [("drop_oldest", ["c", "d"]), ("drop_newest", ["a", "b"])])
def test_outbox_overflow_policies(policy: str, kept: list[str]) -> None:
    box = Outbox(2, policy)  # type: ignore[arg-type]
    dropped = [d.text for name in "abcd" for d in box.push(entry(name))]
    assert [i.text for i in box] == kept
    assert sorted(dropped) == sorted(set("abcd") - set(kept))


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest"])
def test_outbox_drops_debug_and_info_before_notice(policy: str) -> None:
    box = Outbox(2, policy)  # type: ignore[arg-type]
    box.push(entry("notice", low=False))
    box.push(entry("info-1"))
    box.push(entry("info-2"))
    assert [i.text for i in box][0] == "notice" and len(box) == 2


def test_outbox_with_only_notice_left_still_drops_and_says_so() -> None:
    box = Outbox(1, "drop_oldest")
    box.push(entry("n1", low=False))
    assert [d.text for d in box.push(entry("n2", low=False))] == ["n1"]


def test_outbox_push_front_restores_order_and_pop_is_fifo() -> None:
    box = Outbox(10)
    box.push(entry("c"))
    box.push_front([entry("a"), entry("b")])
    assert [box.pop().text for _ in range(3)] == ["a", "b", "c"]


@pytest.mark.parametrize("frame, cause", [
    ({"type": "hello", "versions": ["0.1"]}, None),
    ({"type": "hello", "versions": ["0.1", "0.2"]}, "bad-hello"),
    ({"type": "hello", "versions": ["0.2"]}, "bad-hello"),
    ({"type": "hello"}, "bad-hello"),
    ({"type": "ping", "t": 1}, "bad-hello"),
    (None, "bad-hello"),
    ({"type": "error", "code": "version-unsupported", "versions": ["9.9"]}, "version-unsupported"),
    ({"type": "error", "code": "hello-required"}, "hello-required"),
    ({"type": "error", "code": "unauthorized"}, "hello-refused"),
])
def test_hello_problems(frame: dict[str, Any] | None, cause: str | None) -> None:
    problem = hello_problem(frame)
    assert (problem[0] if problem else None) == cause


@pytest.mark.parametrize("event_type, expected", [
    (RESPOND, True), ("control.cancel", True), ("control.future_verb", True),
    ("x.claude-code.control.instruct", True), ("control.accepted", False), ("control.rejected", False),
    ("attention.routed", False), ("x.acme.tool.ran", False),
])
def test_which_inbound_events_are_commands(event_type: str, expected: bool) -> None:
    assert is_command(event_type) is expected


def test_categories_and_jittered_backoff() -> None:
    assert [category(t) for t in ("session.started", "x.acme.tool.ran", "x.acme.nope.x")] == ["session", "tool", None]
    rng = random.Random(7)
    for attempt in range(12):
        delay = backoff_delay(attempt, 0.5, 10.0, rng)
        assert 0.0 <= delay <= min(10.0, 0.5 * 2 ** attempt)
    assert max(backoff_delay(40, 0.5, 10.0, rng) for _ in range(50)) > 5.0  # full jitter reaches the cap range


# -- against the double ------------------------------------------------------------------------


async def test_export_returns_without_awaiting_anything(relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    exporter, _ = await exporters(relay.ws_url)
    call = exporter.export([make(stamper, "s1") for _ in range(100)])
    with pytest.raises(StopIteration):
        call.send(None)  # the coroutine finished on its first step: it never waited on the network
    await wait_until(lambda: len(relay.stored) == 100, "the 100 events")


async def test_hello_per_agent_with_control_block_only_when_accepts_is_not_none(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    router = FakeRouter({CC: [RESPOND, "x.claude-code.control.instruct"], "gemini-cli": None})
    exporter, _ = await exporters(relay.ws_url, router, ack_window_ms=7000)
    await exporter.export([make(stamper, "s1", "session.started"), make(stamper, "g1", "tool.requested",
                                                                     agent="gemini-cli")])
    await wait_until(lambda: len(relay.stored) == 2, "both agents' events")
    (cc,), (gem,) = relay.hellos(CC), relay.hellos("gemini-cli")
    assert cc == {"type": "hello", "versions": ["0.1"], "role": "emitter",
                  "identity": {"agent": CC, "instance": "test/1"},
                  "capabilities": {"emits": ["session"], "capture": ["none", "metadata", "redacted"],
                                   "control": {"accepts": [RESPOND, "x.claude-code.control.instruct"],
                                               "ack_window_ms": 7000}}}
    assert gem["identity"] == {"agent": "gemini-cli", "instance": "test/1"}
    assert gem["capabilities"] == {"emits": ["tool"], "capture": ["none", "metadata", "redacted"]}


async def test_without_a_router_no_control_block(relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    exporter, _ = await exporters(relay.ws_url, None)
    await exporter.export([make(stamper, "s1")])
    await wait_until(lambda: relay.stored, "the event")
    assert "control" not in relay.hellos(CC)[0]["capabilities"]


async def test_two_agents_two_connections_each_claiming_only_its_sessions(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    router = FakeRouter({CC: [RESPOND], "codex": []})
    exporter, _ = await exporters(relay.ws_url, router)
    batch = [make(stamper, "s1"), make(stamper, "t1", agent="codex"), make(stamper, "s2"),
             make(stamper, "t1", agent="codex"), make(stamper, None, "agent.heartbeat")]
    await exporter.export(batch)
    await wait_until(lambda: len(relay.received) == 5, "all five events")
    (cc,), (codex,) = relay.connections(CC), relay.connections("codex")
    assert (cc.claims, codex.claims) == (["s1", "s2"], ["t1"])
    for agent in (CC, "codex"):
        sent = [f for f in relay.frames_from(agent) if isinstance(f, dict) and "." in f.get("type", "")]
        assert sent and all(e["agent"] == agent for e in sent)
    client = ControlClient(relay.url, agent="operator", host="ops", token=TOKEN)
    await client.connect(connect_timeout_ms=10_000)
    try:
        roster = await client.roster()
    finally:
        await client.close()
    assert sorted((e["session"], e["agent"], e["control"]["accepts"]) for e in roster) == \
        [("s1", CC, [RESPOND]), ("s2", CC, [RESPOND]), ("t1", "codex", [])]
    assert sorted(router.routes) == [(CC, True), ("codex", True)]


async def test_events_wait_in_the_outbox_until_the_hello_completes(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    relay.fault_hello("hold")
    exporter, host = await exporters(relay.ws_url, FakeRouter())
    events = [make(stamper, "s1") for _ in range(5)]
    await exporter.export(events)
    await wait_until(lambda: relay.hellos(CC), "the hello to reach the relay")
    link = exporter.links[CC]
    assert link.state == "hello" and link.pending == 5
    assert [f["type"] for f in relay.frames_from(CC)] == ["hello"]  # nothing sent before the relay's hello
    assert host.health.snapshot()["relay"] is False
    relay.release_hellos()
    await wait_until(lambda: len(relay.stored) == 5, "the queued events after the hello")
    assert ids(relay.stored) == ids(events)
    assert host.health.snapshot()["relay"] is True


async def test_relay_absent_at_start_then_appears(exporters: Any, stamper: Stamper) -> None:
    port = free_port()
    exporter, host = await exporters(f"ws://127.0.0.1:{port}/socket", FakeRouter())
    events = [make(stamper, f"s{i % 2}") for i in range(6)]
    await exporter.export(events[:3])
    await wait_until(lambda: exporter.links[CC].attempts >= 3, "a few refused connection attempts")
    await exporter.export(events[3:])
    assert host.health.snapshot()["relay"] is False and exporter.links[CC].pending == 6
    relay = RelayDouble(token=TOKEN, port=port)
    await relay.start()
    try:
        await wait_until(lambda: len(relay.stored) == 6, "the outbox to flush once the relay is up")
        assert ids(relay.stored) == ids(events)
        await wait_until(lambda: host.health.snapshot()["relay"], "the relay flag")
    finally:
        await relay.stop()


async def test_relay_ping_is_answered_with_pong_echoing_t(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    exporter, _ = await exporters(relay.ws_url)
    await exporter.export([make(stamper, "s1")])
    await wait_until(live_link(exporter), "the connection")
    relay.send(CC, {"type": "ping", "t": 424242})
    await wait_until(lambda: {"type": "pong", "t": 424242} in relay.frames_from(CC), "the pong")


async def test_garbage_unknown_and_error_frames_after_hello_do_not_break_the_link(
        relay: RelayDouble, exporters: Any, stamper: Stamper, caplog: pytest.LogCaptureFixture) -> None:
    exporter, host = await exporters(relay.ws_url, FakeRouter({CC: [RESPOND]}))
    await exporter.export([make(stamper, "s1")])
    await wait_until(live_link(exporter), "the connection")
    caplog.set_level(logging.INFO, "aep.exporter.relay")
    for frame in ("}{ garbage", b"\x00\x01binary", "[1, 2]", {"type": "zigzag", "x": 1},
                  {"type": "error", "code": "weird-thing"},
                  {"type": "error", "code": "no-route", "cause": "01CMDREFUSED", "detail": "nobody"},
                  make(stamper, "other", "session.started", agent="someone-else")):
        relay.send(CC, frame)
    relay.send(CC, {"type": "ping", "t": 9})
    await wait_until(lambda: {"type": "pong", "t": 9} in relay.frames_from(CC), "the link to read past them")
    more = [make(stamper, "s1") for _ in range(3)]
    await exporter.export(more)
    await wait_until(lambda: len(relay.stored) == 4, "events after the odd frames")
    assert exporter.links[CC].connections == 1 and len(relay.hellos(CC)) == 1  # same connection throughout
    counters = host.health.counters
    assert counters[("exporter/relay", "bad-frames")] == 3
    assert counters[("exporter/relay", "relay-refusals")] == 1
    assert "01CMDREFUSED" in caplog.text and "weird-thing" in caplog.text
    assert host.control.submitted == []  # a foreign session.started is not a command
    assert host.health.snapshot()["ok"] is True


@pytest.mark.parametrize("faults, cause", [
    (["close"], "hello-closed"),
    (["garbage"], "bad-hello"),
    (["two-versions"], "bad-hello"),
    (["version-unsupported"], "version-unsupported"),
    (["hello-required"], "hello-required"),
    (["silent"], "hello-timeout"),
    (["close", "garbage", "two-versions"], "bad-hello"),
])
async def test_bad_hello_answers_are_reported_then_retried_without_loss(
        relay: RelayDouble, exporters: Any, stamper: Stamper, faults: list[str], cause: str) -> None:
    for mode in faults:
        relay.fault_hello(mode)
    relay.fault_hello("hold")  # keep the good hello back until the report has been seen
    exporter, host = await exporters(relay.ws_url, FakeRouter(), hello_timeout=0.3)
    events = [make(stamper, "s1") for _ in range(4)]
    await exporter.export(events)
    await wait_until(lambda: cause in host.health.snapshot().get("problems", {}).get("exporter/relay", {}),
                     f"the {cause} report")
    await wait_until(lambda: len(relay.hellos(CC)) == len(faults) + 1, "the held retry")
    assert host.health.snapshot()["relay"] is False
    relay.release_hellos()
    await wait_until(lambda: len(relay.stored) == 4, "the events after the retries")
    assert ids(relay.stored) == ids(events)
    await wait_until(lambda: host.health.snapshot() == {"ok": True, "relay": True}, "the problem to clear")


async def test_relay_flag_true_only_while_a_hello_complete_connection_is_live(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    router = FakeRouter()
    exporter, host = await exporters(relay.ws_url, router)
    assert host.health.snapshot()["relay"] is False
    relay.fault_hello("hold")
    await exporter.export([make(stamper, "s1")])
    await wait_until(lambda: relay.hellos(CC), "the hello")
    assert host.health.snapshot()["relay"] is False
    relay.release_hellos()
    await wait_until(lambda: host.health.snapshot()["relay"], "relay true after the hello")
    await relay.stop()
    await wait_until(lambda: not host.health.snapshot()["relay"], "relay false after the relay went away")
    await relay.start()
    await wait_until(lambda: host.health.snapshot()["relay"], "relay true after it came back")
    assert router.routes == [(CC, True), (CC, False), (CC, True)]


@pytest.mark.parametrize("policy", ["drop_oldest", "drop_newest"])
async def test_overflow_is_counted_and_reported_per_policy(
        exporters: Any, stamper: Stamper, policy: str) -> None:
    port = free_port()
    exporter, host = await exporters(f"ws://127.0.0.1:{port}/socket", outbox_size=4, overflow=policy)
    notice = make(stamper, "s1", "attention.requested", severity="notice")
    infos = [make(stamper, "s1") for _ in range(5)]
    await exporter.export([notice, *infos])
    snap = host.health.snapshot()
    assert snap["dropped"] == {"exporter/relay": 2}
    assert "outbox-overflow" in snap["problems"]["exporter/relay"]
    relay = RelayDouble(token=TOKEN, port=port)
    await relay.start()
    try:
        await wait_until(lambda: len(relay.stored) == 4, "the surviving events")
        # The notice survives either way (AEP-0003 §8.4); the policy picks which infos are kept.
        kept = infos[2:] if policy == "drop_oldest" else infos[:3]
        assert ids(relay.stored) == ids([notice, *kept])
        await wait_until(lambda: "problems" not in host.health.snapshot(), "overflow to clear once drained")
        assert host.health.snapshot()["dropped"] == {"exporter/relay": 2}  # the loss stays visible
    finally:
        await relay.stop()


async def test_inbound_command_reaches_submit_exactly_as_received_and_the_ack_returns(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    router = FakeRouter({CC: [RESPOND]})
    exporter, _ = await exporters(relay.ws_url, router)

    async def acknowledge(command: dict[str, Any], agent: str) -> None:
        # What the real router does: emit the ack through the pipeline, which ends in export().
        await exporter.export([make(stamper, command["session"], "control.accepted", agent=agent,
                                    cause=command["id"])])

    router.on_submit = acknowledge
    request = make(stamper, "s1", "attention.requested")
    await exporter.export([request])
    await wait_until(lambda: relay.stored, "the claiming event")
    client = ControlClient(relay.url, agent="operator", host="ops", token=TOKEN)
    await client.connect(connect_timeout_ms=10_000)
    try:
        ack = await client.send(RESPOND, "s1", subject=request["id"], cause=request["id"],
                                data={"answer": {"option": "allow"}}, retries=0)
    finally:
        await client.close()
    ((target, text),) = relay.forwarded
    ((command, agent),) = router.submitted
    assert target == agent == CC
    assert command == json.loads(text) and list(command) == list(json.loads(text))
    assert ack["type"] == "control.accepted" and ack["cause"] == command["id"]


async def test_a_byte_identical_re_ack_crosses_the_relay(relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    exporter, _ = await exporters(relay.ws_url)
    ack = make(stamper, "s1", "control.accepted", cause="01CMD")
    await exporter.export([ack])
    await wait_until(lambda: relay.stored, "the ack")
    await exporter.export([ack])  # the router re-sends the recorded ack through export
    await wait_until(lambda: len(relay.received) == 2, "the re-ack")
    frames = [f for f in relay.frames_from(CC) if isinstance(f, dict) and f.get("type") == "control.accepted"]
    assert frames == [ack, ack] and relay.stored == [ack]
    assert [json.dumps(f, ensure_ascii=False, separators=(",", ":")) for f in frames] == [dumps(ack)] * 2


async def test_restart_mid_stream_loses_nothing_and_keeps_seq_order(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    router = FakeRouter({CC: [RESPOND]})
    exporter, host = await exporters(relay.ws_url, router)
    sessions = [f"s{i}" for i in range(4)]
    stream = [make(stamper, sessions[i % 4]) for i in range(4000)]
    relay.freeze_at = 100  # the relay hangs after 100 events: the kill lands mid-stream whatever the load
    await exporter.export(stream[:3000])
    await wait_until(lambda: len(relay.stored) >= 100, "the stream to be flowing")
    await relay.stop()
    in_flight_at_kill = exporter.links[CC].pending
    assert 0 < len(relay.stored) < 3000 and in_flight_at_kill > 0, "the kill must land mid-stream"
    await exporter.export(stream[3000:3500])  # keep exporting while the relay is away
    await wait_until(lambda: not host.health.snapshot()["relay"], "the link to notice the restart")
    await relay.start()
    await exporter.export(stream[3500:])
    await wait_until(lambda: len(relay.stored) == len(stream), "every event in the store after the restart")
    counts = Counter(ids(relay.stored))
    assert set(counts) == set(ids(stream)) and max(counts.values()) == 1
    for session in sessions:
        seqs = [e["seq"] for e in relay.store_for(session)]
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) == 1000
    await wait_until(lambda: exporter.links[CC].pending == 0, "every event confirmed by a pong")


async def test_a_restarted_relay_can_still_route_to_an_idle_session(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    router = FakeRouter({CC: [RESPOND]})
    exporter, _ = await exporters(relay.ws_url, router)
    held = make(stamper, "waiting", "attention.requested")
    await exporter.export([held, make(stamper, "done", "session.ended")])
    await wait_until(lambda: len(relay.stored) == 2 and exporter.links[CC].pending == 0, "the confirmed events")
    await relay.stop()
    await relay.start()
    await wait_until(lambda: relay.connections(CC) and relay.connections(CC)[0].claims == ["waiting"],
                     "the idle session re-claimed on the new connection")
    client = ControlClient(relay.url, agent="operator", host="ops", token=TOKEN)
    await client.connect(connect_timeout_ms=10_000)
    try:
        sending = asyncio.create_task(client.send(RESPOND, "waiting", subject=held["id"],
                                                  data={"answer": {"option": "deny"}}, retries=0))
        await wait_until(lambda: router.submitted, "the command at the router")
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
    finally:
        await client.close()
    assert router.submitted[0][0]["subject"] == held["id"]
    assert relay.stored.count(held) == 1  # the re-claim was a redelivery, deduped at admission


async def test_a_changed_accepts_list_is_declared_by_a_fresh_hello(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    router = FakeRouter({CC: []})
    exporter, _ = await exporters(relay.ws_url, router)
    await exporter.export([make(stamper, "s1", "session.started")])
    await wait_until(lambda: relay.stored, "the first event")
    router.table[CC] = [RESPOND]  # an opt-in gate registered late
    later = make(stamper, "s2")
    await exporter.export([later])
    await wait_until(lambda: len(relay.hellos(CC)) == 2 and relay.connections(CC), "the second hello")
    assert [h["capabilities"]["control"]["accepts"] for h in relay.hellos(CC)] == [[], [RESPOND]]
    await wait_until(lambda: sorted(relay.connections(CC)[0].claims) == ["s1", "s2"], "both sessions claimed")
    assert {"type": "closing", "reason": "capabilities-changed", "delivered": []} in relay.frames_from(CC)


async def test_a_relay_that_ignores_ping_falls_back_to_written_is_delivered(
        relay: RelayDouble, exporters: Any, stamper: Stamper, caplog: pytest.LogCaptureFixture) -> None:
    relay.answer_pings = False
    caplog.set_level(logging.WARNING, "aep.exporter.relay")
    exporter, _ = await exporters(relay.ws_url, hello_timeout=0.2)
    await exporter.export([make(stamper, "s1") for _ in range(3)])
    await wait_until(lambda: len(relay.stored) == 3, "the events")
    await wait_until(lambda: exporter.links[CC].pending == 0, "the unconfirmed tail released")
    assert "does not answer ping" in caplog.text


async def test_pongs_that_stop_coming_are_noticed_after_answered_ones(
        relay: RelayDouble, exporters: Any, stamper: Stamper, caplog: pytest.LogCaptureFixture) -> None:
    """The pong deadline's timer stays armed across pings: armed for an earlier, answered ping, it
    rings before the outstanding one's deadline and is armed again for it, so a relay that stops
    answering is still noticed, and no timer is left per delivery."""
    caplog.set_level(logging.WARNING, "aep.exporter.relay")
    exporter, _ = await exporters(relay.ws_url, hello_timeout=0.3)
    for _ in range(4):  # answered pings spread over the first one's deadline
        await asyncio.wait_for(exporter.deliver([make(stamper, "s1")]), 10)
        await asyncio.sleep(0.1)
    assert "does not answer ping" not in caplog.text
    relay.answer_pings = False
    await exporter.export([make(stamper, "s1") for _ in range(2)])
    await wait_until(lambda: len(relay.stored) == 6, "the events")
    await wait_until(lambda: exporter.links[CC].pending == 0, "the unconfirmed tail released")
    assert "does not answer ping" in caplog.text


async def test_a_delivery_written_from_the_callers_task_still_falls_back_without_pongs(
        relay: RelayDouble, exporters: Any, stamper: Stamper, caplog: pytest.LogCaptureFixture) -> None:
    """``deliver`` writes on a parked writer's connection itself (``send_now``); its ping's deadline
    is still watched, so a relay that stops answering releases the delivery after hello_timeout."""
    caplog.set_level(logging.WARNING, "aep.exporter.relay")
    exporter, _ = await exporters(relay.ws_url, hello_timeout=0.3)
    await asyncio.wait_for(exporter.deliver([make(stamper, "s1")]), 10)
    await asyncio.sleep(0.4)  # past the first ping's deadline: its timer rang, none is armed now
    await wait_until(lambda: exporter.links[CC]._parked is not None, "the writer parked")
    relay.answer_pings = False
    late = [make(stamper, "s1"), make(stamper, "s2")]
    await asyncio.wait_for(exporter.deliver(late), 10)  # released by the fallback, not by a pong
    assert ids(relay.stored[-2:]) == ids(late)
    assert "does not answer ping" in caplog.text and exporter.links[CC].pending == 0


async def test_a_wrong_token_is_reported_as_unauthorized(relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    exporter, host = await exporters(relay.ws_url, token="wrong")
    await exporter.export([make(stamper, "s1")])
    await wait_until(lambda: "unauthorized" in host.health.snapshot().get("problems", {}).get("exporter/relay", {}),
                     "the unauthorized report")
    assert host.health.snapshot()["relay"] is False and relay.stored == []


async def test_shutdown_flushes_sends_closing_and_never_hangs(
        relay: RelayDouble, stamper: Stamper, exporters: Any) -> None:
    exporter, host = await exporters(relay.ws_url)
    await exporter.export([make(stamper, "s1")])
    await wait_until(live_link(exporter), "the connection")
    await exporter.export([make(stamper, "s1") for _ in range(50)])
    await asyncio.wait_for(exporter.shutdown(), 10)
    assert len(relay.stored) == 51
    assert relay.frames_from(CC)[-1] == {"type": "closing", "reason": "shutdown", "delivered": []}
    assert host.health.snapshot()["relay"] is False
    await wait_until(lambda: not relay.connections(CC), "the socket to close")
    absent, absent_host = await exporters(f"ws://127.0.0.1:{free_port()}/socket")
    await absent.export([make(stamper, "s9")])
    await asyncio.wait_for(absent.shutdown(), 10)  # nothing to flush to: returns at once
    assert absent.links[CC].state == "closed"
    assert absent_host.health.snapshot()["dropped"] == {"exporter/relay": 1}  # never sent: counted


def test_frames_are_the_one_serializer() -> None:
    event = {"aep": "0.1", "id": "X", "type": "progress.status", "severity": "notice", "data": {"note": "é"}}
    item = pending(event)
    assert (item.text, item.low, item.session) == (dumps(event), False, None)


async def test_open_connects_an_agent_before_its_first_event(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    router = FakeRouter({CC: [RESPOND]})
    exporter, host = await exporters(relay.ws_url, router)
    exporter.open(CC)
    await wait_until(lambda: host.health.snapshot()["relay"], "the eagerly opened connection")
    assert router.routes == [(CC, True)]
    (hello_frame,) = relay.hellos(CC)
    assert hello_frame["capabilities"]["emits"] == [] and hello_frame["capabilities"]["control"]["accepts"] == [RESPOND]
    assert relay.connections(CC)[0].claims == []  # nothing emitted, nothing claimed
    exporter.open(CC)  # idempotent
    await exporter.export([make(stamper, "s1")])
    await wait_until(lambda: relay.connections(CC)[0].claims == ["s1"], "the claim on the same connection")
    assert exporter.links[CC].connections == 1


async def test_with_the_real_service_and_router(relay: RelayDouble, tmp_path: Path) -> None:
    """The interface as the service wires it: the real router's accepts, routes and nack come through."""
    import aiohttp
    from aep_sdk.control import NackError

    from tests.helpers import running

    session_id = "real-router-session"
    cfg = base_config(tmp_path, extra_exporters={"relay": {
        "endpoint": relay.ws_url, "token": TOKEN, "backoff_initial": 0.02, "backoff_max": 0.1}})
    async with running(cfg) as service:
        port = service.receivers["claude_code"].port
        hook = {"session_id": session_id, "hook_event_name": "SessionStart", "source": "startup", "cwd": "/w"}
        async with aiohttp.ClientSession() as http, http.post(f"http://127.0.0.1:{port}/hook", json=hook) as resp:
            assert resp.status == 200
        await wait_until(lambda: relay.store_for(session_id), "the session.started at the relay")
        router = service.host.control
        assert router is not None
        await wait_until(lambda: router.route_live(CC), "the route the exporter reported")
        assert relay.hellos(CC)[0]["capabilities"]["control"]["accepts"] == router.accepts(CC)
        client = ControlClient(relay.url, agent="operator", host="ops", token=TOKEN)
        await client.connect(connect_timeout_ms=10_000)
        try:
            with pytest.raises(NackError) as err:
                await client.send(RESPOND, session_id, subject="no-such-request",
                                  data={"answer": {"option": "allow"}}, retries=0)
        finally:
            await client.close()
        assert err.value.reason == "refused"  # the router's own decision, carried back by this exporter
        (nack,) = [e for e in relay.store_for(session_id) if e["type"] == "control.rejected"]
        assert nack["cause"] == json.loads(relay.forwarded[0][1])["id"]
    assert not router.route_live(CC)


@pytest.mark.parametrize("behaviour", ["silent", "not-http"])
async def test_a_relay_that_never_completes_the_upgrade_is_reported(
    exporters: Any, stamper: Stamper, behaviour: str, caplog: pytest.LogCaptureFixture
) -> None:
    """TCP accepted, then silence (or bytes that are not HTTP): health and the log say so, and it clears."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        if behaviour == "not-http":
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
            await writer.drain()
            writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cause = "handshake-timeout" if behaviour == "silent" else "upgrade-failed"
    caplog.set_level(logging.ERROR, logger="aep.health")
    try:
        exporter, host = await exporters(f"ws://127.0.0.1:{port}/socket", connect_timeout=0.3)
        await exporter.export([make(stamper, "s1")])
        problems = await wait_until(
            lambda: host.health.snapshot().get("problems", {}).get("exporter/relay", {}).get(cause),
            f"the {cause} report")
        assert f"127.0.0.1:{port}" in problems and TOKEN not in problems
        assert host.health.snapshot()["relay"] is False
        assert any(cause in r.getMessage() for r in caplog.records)
    finally:
        server.close()
        for w in held:
            w.close()
        await server.wait_closed()
    # The real relay comes up on that port: the problem is gone with the cause.
    relay = RelayDouble(token=TOKEN, port=port)
    await relay.start()
    try:
        await wait_until(lambda: len(relay.stored) == 1, "the event once a relay answers")
        await wait_until(lambda: host.health.snapshot()["ok"], "the problem to clear")
    finally:
        await relay.stop()


async def test_a_flush_of_several_frames_is_one_socket_write(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    exporter, _ = await exporters(relay.ws_url)
    await exporter.export([make(stamper, "s1")])
    await wait_until(lambda: len(relay.stored) == 1, "the first event")
    transport = exporter.links[CC]._ws.transport  # type: ignore[union-attr]
    writes: list[bytes] = []
    real_write = transport.write

    def write(data: bytes) -> None:
        writes.append(bytes(data))
        real_write(data)

    transport.write = write
    batch = [make(stamper, "s1") for _ in range(20)]
    await exporter.export(batch)  # queued at once: the writer's next flush takes all 20
    await wait_until(lambda: len(relay.stored) == 21, "the 20 events")
    assert len(writes) == 1  # the 20 frames (and the confirming ping) in one send
    assert ids(relay.stored[1:]) == ids(batch)


async def test_deliver_returns_once_the_relay_confirmed_one_agent_or_several(
        relay: RelayDouble, exporters: Any, stamper: Stamper) -> None:
    """The sending queue's call waits for every event's pong: a one-agent batch (one ticket, awaited
    alone) and a two-agent batch (a ticket per connection) alike."""
    exporter, _ = await exporters(relay.ws_url)
    one = [make(stamper, "s1"), make(stamper, "s1")]
    await asyncio.wait_for(exporter.deliver(one), 10)
    assert ids(relay.stored) == ids(one)
    two = [make(stamper, "s1"), make(stamper, "t1", agent="codex"), make(stamper, "s2")]
    await asyncio.wait_for(exporter.deliver(two), 10)
    assert sorted(ids(relay.stored)) == sorted(ids(one + two))
    assert not exporter.links[CC].inflight and not exporter.links["codex"].inflight
