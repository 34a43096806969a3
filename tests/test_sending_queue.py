"""The persistent sending queue: order, restart, retry, refusals at the byte bound, config, metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re

import aiohttp
import pytest
from aep_collector.pipeline import sending_queue
from aep_collector.pipeline.config import ConfigError, parse
from aep_collector.pipeline.host import Health
from aep_collector.pipeline.pipeline import QueuedExporter
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.sending_queue import Permanent, RetryLater, SendingQueue, SendingQueueConfig

from tests.helpers import base_config, running
from tests.relay_double import wait_until


def ev(i: int, severity: str = "info", pad: int = 0) -> dict:
    return {"aep": "0.1", "id": f"e{i:06d}", "type": "progress.note", "source": "t", "agent": "a",
            "session": "s", "seq": i, "severity": severity, "data": {"pad": "x" * pad}}


class Peer:
    """A deliver function whose outcome the test sets: ok, or raise what ``fail`` holds."""

    def __init__(self) -> None:
        self.got: list[dict] = []
        self.calls = 0
        self.fail: list[BaseException] = []

    async def deliver(self, events: list[dict]) -> None:
        self.calls += 1
        if self.fail:
            raise self.fail.pop(0)
        self.got += events


def make(tmp_path, peer: Peer, health: Health | None = None, **cfg) -> SendingQueue:
    config = SendingQueueConfig(backoff_initial=0.01, backoff_max=0.02, **cfg)
    config.validate()
    return SendingQueue("exporter/t", tmp_path / "q", config, peer.deliver, health or Health())


async def test_delivers_in_order_in_batches(tmp_path):
    peer = Peer()
    q = make(tmp_path, peer, batch_size=7)
    q.start()
    for i in range(0, 100, 10):
        q.put([ev(j) for j in range(i, i + 10)])
    await wait_until(lambda: len(peer.got) == 100, "all delivered")
    assert [e["id"] for e in peer.got] == [f"e{j:06d}" for j in range(100)]
    assert peer.calls >= 100 // 7
    assert q.pending_events == 0
    await q.drain(1.0)


async def test_undelivered_events_survive_a_restart_and_the_cursor_holds(tmp_path):
    down = Peer()
    down.fail = [ConnectionError("peer down")] * 1000
    q = make(tmp_path, down, segment_bytes=4096, batch_size=50)
    q.start()
    for i in range(0, 300, 10):
        q.put([ev(j) for j in range(i, i + 10)])
    assert q.pending_events == 300 and len(q.segments) > 1  # rolled over several segments
    await wait_until(lambda: down.calls >= 2, "a retried delivery")
    await q.drain(0.1)
    up = Peer()
    again = make(tmp_path, up, segment_bytes=4096, batch_size=50)
    again.open()
    assert again.pending_events == 300
    again.start()
    await wait_until(lambda: len(up.got) == 300, "the backlog after the restart")
    assert [e["id"] for e in up.got] == [f"e{j:06d}" for j in range(300)]
    await wait_until(lambda: len(again.segments) == 1, "delivered segments deleted")
    await again.drain(0.1)
    third = make(tmp_path, Peer(), segment_bytes=4096, batch_size=50)
    third.open()
    assert third.pending_events == 0  # the cursor on disk says all of it went
    third.close()


async def test_retry_later_and_permanent(tmp_path):
    peer = Peer()
    peer.fail = [RetryLater(0.01), Permanent("the peer refused the content")]
    health = Health()
    q = make(tmp_path, peer, health, batch_size=10)
    q.put([ev(j) for j in range(20)])
    q.start()
    await wait_until(lambda: len(peer.got) == 10, "the batch after the refused one")
    # The first batch was retried once, then refused for good; the second went through.
    assert [e["id"] for e in peer.got] == [f"e{j:06d}" for j in range(10, 20)]
    assert health.counters[("exporter/t", "failed")] == 10
    assert "export-refused" in health.problems["exporter/t"]
    await q.drain(0.1)


async def test_the_byte_bound_refuses_debug_info_first_counted_and_logged(tmp_path, caplog):
    health = Health()
    q = make(tmp_path, Peer(), health, max_bytes=65536)  # not started: the peer is never reached
    caplog.set_level(logging.WARNING, "aep.sending_queue")
    q.put([ev(j, pad=900) for j in range(200)])  # ~1 KiB each: far past the bound
    assert q.pending_bytes <= 65536 * 0.9
    kept_info = q.pending_events
    q.put([ev(1000 + j, severity="error", pad=900) for j in range(20)])
    assert q.pending_events > kept_info  # the last tenth is kept for notice and above
    assert q.pending_bytes <= 65536
    dropped = health.counters[("exporter/t", "dropped")]
    assert dropped == 220 - q.pending_events and dropped > 0
    assert "queue-full" in health.problems["exporter/t"]
    assert sum("sending queue refused" in r.message for r in caplog.records) == 1  # rate-limited
    q.close()


def test_a_torn_tail_is_cut_on_open(tmp_path):
    q = make(tmp_path, Peer())
    q.open()
    q.put([ev(1), ev(2)])
    q.close()
    seg = sorted((tmp_path / "q").glob("*.seg"))[-1]
    with open(seg, "ab") as fh:
        fh.write(b'{"aep":"0.1","id":"torn')
    again = make(tmp_path, Peer())
    again.open()
    assert again.pending_events == 2
    events, _, _ = again.read_batch()
    assert [e["id"] for e in events] == ["e000001", "e000002"]
    again.close()


def test_one_collector_per_queue_directory(tmp_path):
    q = make(tmp_path, Peer())
    q.open()
    with pytest.raises(OSError, match="in use"):
        make(tmp_path, Peer()).open()
    q.close()


def test_config_block_on_any_exporter(tmp_path):
    registry, _ = build_registry(load_plugins=False)
    raw = base_config(tmp_path, extra_exporters={"relay": {"sending_queue": {"max_bytes": 1048576, "fsync": "always"}}})
    cfg = parse(raw, registry, "t.yaml")
    assert cfg.sending_queues["relay"].max_bytes == 1048576
    assert cfg.exporters["relay"][1].endpoint.startswith("ws://")
    raw["exporters"]["relay"]["sending_queue"] = {"max_byte": 1}
    with pytest.raises(ConfigError, match=r"exporters\.relay\.sending_queue\.max_byte: unknown key"):
        parse(raw, registry, "t.yaml")
    raw["exporters"]["relay"]["sending_queue"] = {"max_bytes": 10}
    with pytest.raises(ConfigError, match="max_bytes must be at least"):
        parse(raw, registry, "t.yaml")


async def test_service_queue_on_by_default_off_by_config_and_in_metrics(tmp_path):
    raw = base_config(tmp_path, extra_exporters={"relay": {"endpoint": "ws://127.0.0.1:9/socket"}})
    raw["service"]["telemetry"] = {"metrics": {"endpoint": "127.0.0.1:0"}}
    async with running(raw) as service:
        (q,) = service.queues
        assert isinstance(q, SendingQueue) and q.directory == tmp_path / "state" / "queue" / "relay"
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{service.metrics.port}/metrics") as r:
            text = await r.text()
        assert 'aep_collector_queue_events{component="exporter/relay"} 0' in text
        assert 'aep_collector_queue_max_bytes{component="exporter/relay"} 268435456' in text
    raw["exporters"]["relay"]["sending_queue"] = {"enabled": False}
    async with running(raw) as service:
        assert isinstance(service.queues[0], QueuedExporter)


async def test_drain_does_not_wait_for_a_peer_that_is_away(tmp_path):
    never = asyncio.Event()

    async def stuck(events):
        await never.wait()

    q = SendingQueue("exporter/t", tmp_path / "q", SendingQueueConfig(), stuck, Health())
    q.start()
    q.put([ev(1)])
    await asyncio.sleep(0)
    await asyncio.wait_for(q.drain(30.0), 5.0)  # returns within ~1 s of no progress, not 30
    again = SendingQueue("exporter/t", tmp_path / "q", SendingQueueConfig(), stuck, Health())
    again.open()
    assert again.pending_events == 1  # still on disk for the next start
    again.close()


async def test_an_in_process_exporter_opts_out_of_the_disk(tmp_path):
    from aep_collector.exporters.relay import RelayExporter

    class Local(RelayExporter):
        persistent_queue = False

    raw = base_config(tmp_path, extra_exporters={"relay": {"endpoint": "ws://127.0.0.1:9/socket"}})
    async with running(raw) as service:
        service.exporters["relay"].__class__ = Local  # what a local surface declares
        assert isinstance(service._queue("relay", service.exporters["relay"]), QueuedExporter)


def test_an_unusable_directory_refuses_counted_and_reported(tmp_path):
    (tmp_path / "q").write_text("a file where the queue directory should be")
    health = Health()
    q = make(tmp_path, Peer(), health)
    q.put([ev(1), ev(2)])
    assert health.counters[("exporter/t", "dropped")] == 2
    assert "queue-unavailable" in health.problems["exporter/t"]


async def test_a_corrupt_line_is_counted_and_skipped_not_a_wedge(tmp_path):
    q = make(tmp_path, Peer())
    q.open()
    q.put([ev(1)])
    seg = sorted((tmp_path / "q").glob("*.seg"))[-1]
    with open(seg, "ab") as fh:
        fh.write(b"\x00\x00 not json\n")
    q.close()
    peer, health = Peer(), Health()
    again = make(tmp_path, peer, health)
    again.start()
    again.put([ev(2)])
    await wait_until(lambda: len(peer.got) == 2, "the events around the bad line")
    assert [e["id"] for e in peer.got] == ["e000001", "e000002"]
    assert health.counters[("exporter/t", "corrupt")] == 1
    await again.drain(0.1)


async def test_a_plug_in_exporter_with_only_export_is_retried_through_the_disk(tmp_path):
    """A plug-in written before ``deliver`` existed: ``export`` raising means not delivered."""
    from dataclasses import dataclass

    import aiohttp
    from aep_collector.pipeline.component import Factory, Kind

    got: list[dict] = []
    failures = [RuntimeError("peer away")] * 3

    @dataclass
    class Cfg:
        pass

    class Flaky:
        async def start(self, host):
            return None

        async def export(self, events):
            if failures:
                raise failures.pop()
            got.extend(events)

        async def shutdown(self):
            return None

    registry, _ = build_registry(load_plugins=False)
    registry.register(Factory(kind=Kind.EXPORTER, type="flaky", config_class=Cfg,
                              create=lambda settings, cfg: Flaky()), "test")
    raw = base_config(tmp_path, extra_exporters={"flaky": {"sending_queue": {"backoff_initial": 0.01,
                                                                             "backoff_max": 0.02}}})
    async with running(raw, registry) as service:
        assert isinstance(service.queues[0], SendingQueue)
        port = service.receivers["claude_code"].port
        async with aiohttp.ClientSession() as s:
            for name in ("SessionStart", "UserPromptSubmit", "Stop"):
                async with s.post(f"http://127.0.0.1:{port}/hook",
                                  json={"session_id": "pl", "hook_event_name": name, "prompt": "x"}) as r:
                    assert r.status == 200
        written = [json.loads(line)["id"]
                   for line in (tmp_path / "logs" / "claude-code" / "pl.jsonl").read_text().splitlines()]
        await wait_until(lambda: len(got) >= len(written), "every event past three failed exports")
    assert [e["id"] for e in got] == written and not failures


async def test_a_batch_taken_but_not_yet_acknowledged_is_sent_again_after_a_crash(tmp_path):
    """At-least-once: the cursor moves only after ``deliver`` returned; a crash in between repeats."""
    seen: list[str] = []
    hang = asyncio.Event()

    async def takes_then_hangs(events):
        seen.extend(e["id"] for e in events)
        await hang.wait()  # the peer has the batch; its acknowledgement never comes

    q = SendingQueue("exporter/t", tmp_path / "q", SendingQueueConfig(batch_size=10), takes_then_hangs, Health())
    q.start()
    q.put([ev(j) for j in range(25)])
    await wait_until(lambda: len(seen) == 10, "the first batch at the peer")
    await q.drain(0.1)  # the process ends with the batch unacknowledged
    peer = Peer()
    again = make(tmp_path, peer, batch_size=10)
    again.start()
    await wait_until(lambda: len(peer.got) == 25, "everything after the restart")
    assert [e["id"] for e in peer.got] == [f"e{j:06d}" for j in range(25)]  # the first ten again, none lost
    await again.drain(0.1)


def test_what_orjson_cannot_read_back_exactly_comes_back_exactly(tmp_path):
    """Integers beyond 64 bits and lone surrogates leave the queue as they entered it."""
    q = make(tmp_path, Peer())
    q.open()
    odd = [dict(ev(1), data={"big": 123456789012345678901234567890, "neg": -(1 << 70)}),
           dict(ev(2), data={"text": "broken \ud800 half"}),
           dict(ev(3), data={"id": "00000000000000000000000042", "n": 18446744073709551615})]
    q.put(odd)
    events, _, consumed = q.read_batch()
    assert consumed == 3 and events == odd
    assert isinstance(events[0]["data"]["big"], int)
    q.close()


class Batches(Peer):
    """A peer that keeps each delivery's events as one batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    async def deliver(self, events: list[dict]) -> None:
        self.batches.append([e["id"] for e in events])
        await super().deliver(events)


async def settle_loop() -> None:
    for _ in range(20):  # every ready task runs: the worker picks up what it was woken for
        await asyncio.sleep(0)


@pytest.mark.parametrize(("linger", "expected"), [(1.0, [["e000000"], ["e000001", "e000002", "e000003"]]),
                                                  (0, [["e000000"], ["e000001"], ["e000002"], ["e000003"]])])
async def test_linger_lets_events_arriving_after_a_delivery_share_the_next_one(tmp_path, linger, expected):
    peer = Batches()
    q = make(tmp_path, peer, linger=linger)
    q.start()
    q.put([ev(0)])  # an idle queue delivers at once, linger or not
    await wait_until(lambda: len(peer.got) == 1, "the first event delivered alone")
    for i in (1, 2, 3):  # each arrives after the worker had its chance to run
        q.put([ev(i)])
        await settle_loop()
    await wait_until(lambda: len(peer.got) == 4, "all delivered")
    assert peer.batches == expected
    await q.drain(1.0)


@pytest.mark.parametrize("bad", [-0.001, 1.5, True, "5ms"])
def test_linger_must_be_seconds_from_0_to_1(bad):
    with pytest.raises(ValueError, match="linger must be a number of seconds from 0 to 1"):
        SendingQueueConfig(linger=bad).validate()


def test_the_long_number_check_is_the_regex_it_replaced():
    """``_decode`` sends a line with a run of 20 digits to the exact decoder: found by a translate
    and a substring search, it is the same predicate as ``re.search(rb"[0-9]{20}")``."""
    reference = re.compile(rb"[0-9]{20}")
    rng = random.Random(16)
    alphabet = b"0123456789" * 4 + b'/:."-e+ ,{}[]\xa0\xff'
    lines = [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(5000)]
    lines += [b"1" * n for n in range(25)] + [b"x" + b"9" * 20 + b"x", b"9" * 19 + b"a" + b"9" * 19]
    lines += [json.dumps(ev(i)).encode() for i in range(50)]
    for line in lines:
        assert sending_queue._long_number(line) == (reference.search(line) is not None), line


def queue_fds(directory) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            out.append(target)
    return out


async def test_the_segment_read_stays_open_across_deliveries_and_follows_the_segments(tmp_path):
    """The worker keeps the segment it reads open between deliveries; it moves to the next
    segment with the cursor, closes a deleted one, and closes it with the queue."""
    peer = Peer()
    q = make(tmp_path, peer, segment_bytes=4096, batch_size=5)
    q.start()
    for i in range(60):  # about 9 segments of 4 KiB
        q.put([ev(i, pad=400)])
        await settle_loop()
    await wait_until(lambda: len(peer.got) == 60, "every event")
    assert [e["id"] for e in peer.got] == [f"e{i:06d}" for i in range(60)]
    read = q._read
    assert read is not None and read[0] == q.cursor[0]
    # lock, cursor, the segment appended to and the one read from; no file of a deleted segment
    fds = queue_fds(tmp_path / "q")
    assert len(fds) <= 4 and not any(t.endswith("(deleted)") for t in fds), fds
    await q.drain(0.1)
    assert q._read is None and queue_fds(tmp_path / "q") == []
