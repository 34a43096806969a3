"""The sending queue against what it finds on disk and what the disk does: lines longer than a
read chunk, a cursor that cannot be right, and health conditions that must clear with their cause."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import struct

import pytest
from aep_collector.pipeline import sending_queue
from aep_collector.pipeline.host import Health
from aep_collector.pipeline.sending_queue import SendingQueue, SendingQueueConfig

from tests.relay_double import wait_until

CHUNK = sending_queue._READ_CHUNK
CURSOR = struct.Struct("<QQ")


def ev(i: int, pad: int = 0) -> dict:
    return {"aep": "0.1", "id": f"e{i:06d}", "type": "progress.note", "source": "t", "agent": "a",
            "session": "s", "seq": i, "severity": "info", "data": {"pad": "x" * pad}}


def ids(events: list[dict]) -> list[str]:
    return [e["id"] for e in events]


class Peer:
    """A deliver function that takes everything."""

    def __init__(self) -> None:
        self.got: list[dict] = []

    async def deliver(self, events: list[dict]) -> None:
        self.got += events


def make(tmp_path, peer: Peer, health: Health | None = None, **cfg) -> SendingQueue:
    config = SendingQueueConfig(backoff_initial=0.01, backoff_max=0.02, **cfg)
    config.validate()
    return SendingQueue("exporter/t", tmp_path / "q", config, peer.deliver, health or Health())


def segment_files(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "q").glob("*.seg"))


# -- a line longer than one read chunk ---------------------------------------------------------

BIG = 3 * CHUNK + 12345  # spans four chunks: the read must go on past more than one


async def test_a_line_longer_than_a_read_chunk_is_delivered_in_order(tmp_path):
    peer = Peer()
    q = make(tmp_path, peer)
    q.start()
    q.put([ev(1)])
    await wait_until(lambda: len(peer.got) == 1, "the small event before")
    q.put([ev(2, pad=BIG)])
    q.put([ev(3)])
    await wait_until(lambda: len(peer.got) == 3, "the big event and the one after it")
    assert ids(peer.got) == ["e000001", "e000002", "e000003"]
    assert peer.got[1] == ev(2, pad=BIG)  # whole, not a prefix
    assert q.pending_events == 0
    await q.drain(0.1)


async def test_a_queued_line_longer_than_a_chunk_is_delivered_after_a_restart(tmp_path):
    q = make(tmp_path, Peer())
    q.open()
    q.put([ev(1, pad=BIG), ev(2), ev(3, pad=CHUNK)])  # the first line starts at the cursor
    q.close()
    peer = Peer()
    again = make(tmp_path, peer)
    again.open()
    assert again.pending_events == 3
    again.start()
    await wait_until(lambda: len(peer.got) == 3, "every event after the restart")
    assert peer.got == [ev(1, pad=BIG), ev(2), ev(3, pad=CHUNK)]
    await again.drain(0.1)
    third = make(tmp_path, Peer())
    third.open()
    assert third.pending_events == 0  # the cursor went past the long lines
    third.close()


def test_a_line_longer_than_a_chunk_ends_its_batch(tmp_path):
    """Memory stays bounded: a batch holds at most one line larger than a read chunk."""
    q = make(tmp_path, Peer(), batch_size=10)
    q.open()
    q.put([ev(1), ev(2, pad=BIG), ev(3, pad=BIG), ev(4)])
    batches = []
    while True:
        events, after, consumed = q.read_batch()
        if not consumed:
            break
        batches.append(ids(events))
        q._commit(after, consumed)
    assert batches == [["e000001", "e000002"], ["e000003"], ["e000004"]]
    q.close()


def test_a_torn_tail_longer_than_a_chunk_is_cut_back_to_the_last_whole_line(tmp_path):
    q = make(tmp_path, Peer())
    q.open()
    q.put([ev(1), ev(2)])
    q.close()
    (seg,) = (tmp_path / "q").glob("*.seg")
    whole = seg.stat().st_size
    with open(seg, "ab") as fh:
        fh.write(b'{"aep":"0.1","id":"torn","data":"' + b"y" * (CHUNK + CHUNK // 2))
    health = Health()
    again = make(tmp_path, Peer(), health)
    again.open()
    assert seg.stat().st_size == whole
    assert again.pending_events == 2
    again.put([ev(3)])  # starts a fresh line, not glued onto the torn one
    events, _, consumed = again.read_batch()
    assert ids(events) == ["e000001", "e000002", "e000003"] and consumed == 3
    assert ("exporter/t", "corrupt") not in health.counters
    again.close()


def test_a_segment_that_is_one_torn_line_longer_than_a_chunk_is_emptied(tmp_path):
    (tmp_path / "q").mkdir()
    seg = tmp_path / "q" / f"{1:016d}.seg"
    seg.write_bytes(b'{"aep":"0.1","id":"torn","data":"' + b"y" * (2 * CHUNK))
    health = Health()
    q = make(tmp_path, Peer(), health)
    q.open()
    assert seg.stat().st_size == 0 and q.pending_events == 0
    q.put([ev(1)])
    events, _, _ = q.read_batch()
    assert ids(events) == ["e000001"]
    assert ("exporter/t", "corrupt") not in health.counters
    q.close()


@pytest.mark.parametrize("torn_bytes", [40, 2 * CHUNK + 7])
async def test_a_torn_line_ending_an_older_segment_is_skipped_and_delivery_goes_on(tmp_path, caplog, torn_bytes):
    """Only the newest segment is appended to, so an older one ending without a newline ends in a
    torn line; the reader used to stop there for good, holding back every later segment."""
    q = make(tmp_path, Peer(), segment_bytes=4096)
    q.open()
    for i in range(20):
        q.put([ev(i, pad=400)])
    q.close()
    names = segment_files(tmp_path)
    assert len(names) >= 3
    with open(tmp_path / "q" / names[0], "ab") as fh:
        fh.write(b'{"aep":"0.1","id":"torn","data":"' + b"y" * torn_bytes)
    health = Health()
    peer = Peer()
    again = make(tmp_path, peer, health, segment_bytes=4096)
    again.start()
    try:
        await wait_until(lambda: len(peer.got) == 20, "all 20 delivered past the torn line")
        assert ids(peer.got) == [f"e{i:06d}" for i in range(20)]
        assert again.pending_events == 0
        assert health.counters[("exporter/t", "corrupt")] == 1
        assert "torn-line" in str(health.snapshot())
        assert any("torn line" in r.getMessage() for r in caplog.records)
    finally:
        again.close()


# -- the cursor on disk ------------------------------------------------------------------------

N = 30


def fill(tmp_path) -> list[str]:
    """N undelivered events over several 4 KiB segments; the segment file names."""
    q = make(tmp_path, Peer(), segment_bytes=4096)
    q.open()
    for i in range(N):
        q.put([ev(i, pad=400)])
    q.close()
    names = segment_files(tmp_path)
    assert len(names) >= 4
    return names


def queued_ids(tmp_path, names: list[str]) -> list[str]:
    lines = [line for n in names for line in (tmp_path / "q" / n).read_bytes().splitlines()]
    return [sending_queue._decode(line)["id"] for line in lines]


def seg_no(name: str) -> int:
    return int(name.removesuffix(".seg"))


def garbage(tmp_path, names):
    return b"\xff" * 8 + b"\x00" * 8  # what the adversarial tester wrote: segment 2**64-1


def past_the_newest_segment(tmp_path, names):
    return CURSOR.pack(seg_no(names[-1]) + 1, 0)


def offset_past_its_segment(tmp_path, names):
    return CURSOR.pack(seg_no(names[0]), (tmp_path / "q" / names[0]).stat().st_size + 10)


def offset_inside_a_line(tmp_path, names):
    return CURSOR.pack(seg_no(names[0]), 5)


def wrong_length(tmp_path, names):
    return CURSOR.pack(seg_no(names[-1]), 0) + b"junk"  # its first 16 bytes alone would drop all but the last


def segment_not_on_disk(tmp_path, names):
    (tmp_path / "q" / names[1]).rename(tmp_path / "elsewhere.seg")  # a gap the queue never makes
    return CURSOR.pack(seg_no(names[1]), 0)


@pytest.mark.parametrize("corrupt", [garbage, past_the_newest_segment, offset_past_its_segment,
                                     offset_inside_a_line, wrong_length, segment_not_on_disk])
async def test_an_implausible_cursor_redelivers_from_the_oldest_segment_and_says_so(tmp_path, caplog, corrupt):
    names = fill(tmp_path)
    cursor = tmp_path / "q" / "cursor"
    cursor.write_bytes(corrupt(tmp_path, names))
    on_disk = segment_files(tmp_path)
    expected = queued_ids(tmp_path, on_disk)  # all N but for segment_not_on_disk, what its gap left
    caplog.set_level(logging.WARNING, "aep.sending_queue")
    peer, health = Peer(), Health()
    q = make(tmp_path, peer, health, segment_bytes=4096)
    q.open()
    assert segment_files(tmp_path) == on_disk  # nothing deleted on the cursor's word
    assert q.pending_events == len(expected)
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "aep.sending_queue" and r.levelno == logging.WARNING and "cursor" in r.getMessage()]
    assert len(warnings) == 1 and str(cursor) in warnings[0] and "not trusted" in warnings[0], warnings
    snapshot = health.snapshot()
    assert "cursor-reset" in snapshot["problems"]["exporter/t"]
    assert "cursor-reset" in snapshot["incidents"]["exporter/t"]  # shown for the window, then cleared
    q.start()
    await wait_until(lambda: len(peer.got) == len(expected), "every undelivered event")
    assert ids(peer.got) == expected
    await q.drain(0.1)
    assert len(cursor.read_bytes()) == CURSOR.size
    caplog.clear()
    again = make(tmp_path, Peer(), segment_bytes=4096)
    again.open()  # the cursor the queue wrote is trusted: nothing to redeliver, nothing to say
    assert again.pending_events == 0
    assert not [r for r in caplog.records if "cursor" in r.getMessage()]
    again.close()


def mid_second_segment(tmp_path, names):
    """A line boundary inside the second segment, and the ids from there on."""
    data = (tmp_path / "q" / names[1]).read_bytes()
    return CURSOR.pack(seg_no(names[1]), data.index(b"\n") + 1), queued_ids(tmp_path, names[1:])[1:]


def before_the_oldest_segment(tmp_path, names):
    """A cursor step not written after the segments it passed were deleted."""
    return CURSOR.pack(seg_no(names[0]) - 1, 123), [f"e{i:06d}" for i in range(N)]


def empty(tmp_path, names):
    """A queue that never delivered anything."""
    return b"", [f"e{i:06d}" for i in range(N)]


@pytest.mark.parametrize("plausible", [mid_second_segment, before_the_oldest_segment, empty])
async def test_a_plausible_cursor_is_trusted_quietly(tmp_path, caplog, plausible):
    names = fill(tmp_path)
    raw, expected = plausible(tmp_path, names)
    (tmp_path / "q" / "cursor").write_bytes(raw)
    caplog.set_level(logging.WARNING, "aep.sending_queue")
    peer, health = Peer(), Health()
    q = make(tmp_path, peer, health, segment_bytes=4096)
    q.start()
    await wait_until(lambda: len(peer.got) == len(expected), "the events from the cursor on")
    assert ids(peer.got) == expected
    assert not [r for r in caplog.records if "cursor" in r.getMessage()]
    assert "exporter/t" not in health.snapshot().get("problems", {})
    await q.drain(0.1)


# -- conditions clear with their cause ---------------------------------------------------------

def test_queue_unavailable_clears_when_a_later_put_opens_the_queue(tmp_path):
    (tmp_path / "q").write_text("a file where the queue directory should be")
    health = Health()
    q = make(tmp_path, Peer(), health)
    q.put([ev(1)])
    assert "queue-unavailable" in health.snapshot()["problems"]["exporter/t"]
    (tmp_path / "q").unlink()
    q.put([ev(2)])
    assert health.snapshot()["ok"] is True
    assert q.pending_events == 1 and health.counters[("exporter/t", "dropped")] == 1
    events, _, _ = q.read_batch()
    assert ids(events) == ["e000002"]
    q.close()


async def test_queue_unavailable_clears_when_the_worker_opens_the_queue(tmp_path):
    (tmp_path / "q").write_text("a file where the queue directory should be")
    peer, health = Peer(), Health()
    q = make(tmp_path, peer, health)
    q.start()
    assert "queue-unavailable" in health.snapshot()["problems"]["exporter/t"]
    (tmp_path / "q").unlink()
    # The worker retries the open every backoff_max (0.02 s) with no event arriving.
    await wait_until(lambda: health.snapshot()["ok"], "the condition cleared by the worker's open")
    q.put([ev(1)])
    await wait_until(lambda: len(peer.got) == 1, "the event put after the open")
    await q.drain(0.1)


def test_a_failed_append_clears_with_the_next_append_that_fits(tmp_path):
    """A real short write: the file-size limit (RLIMIT_FSIZE) cuts the append as a full disk does."""
    health = Health()
    q = make(tmp_path, Peer(), health)
    q.open()
    q.put([ev(i, pad=1000) for i in range(64)])  # ~70 KiB: any other file this test writes stays below
    (seg,) = (tmp_path / "q").glob("*.seg")
    size = seg.stat().st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG / a short write instead of the signal
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
        q.put([ev(100, pad=1000)])  # only 100 bytes of it fit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert seg.stat().st_size == size  # the partial line was cut back
    assert "enospc" in health.snapshot()["problems"]["exporter/t"]
    assert health.counters[("exporter/t", "dropped")] == 1
    q.put([ev(101)])  # room again: this append succeeds
    assert health.snapshot()["ok"] is True
    assert q.pending_events == 65
    events = []
    while True:
        batch, after, consumed = q.read_batch()
        if not consumed:
            break
        events += batch
        q._commit(after, consumed)
    assert ids(events) == [f"e{i:06d}" for i in range(64)] + ["e000101"]
    q.close()


# -- a peer that keeps a delivery waiting, or asks for a wait of years ---------------------------


async def test_a_delivery_that_does_not_return_shows_in_health_and_clears(tmp_path, monkeypatch):
    """A plug-in exporter whose deliver never returned left /healthz saying ok while every later
    event waited behind it."""
    monkeypatch.setattr(sending_queue, "STALL_AFTER", 0.1)
    release = asyncio.Event()
    got: list[dict] = []

    async def deliver(events: list[dict]) -> None:
        await release.wait()
        got.extend(events)

    health = Health()
    q = SendingQueue("exporter/t", tmp_path / "q", SendingQueueConfig(), deliver, health)
    q.start()
    try:
        q.put([ev(1)])
        await wait_until(lambda: "delivery-stalled" in str(health.snapshot()), "the stall shown")
        assert health.snapshot()["ok"] is False
        release.set()
        await wait_until(lambda: got, "the delivery ended")
        await wait_until(lambda: "delivery-stalled" not in str(health.snapshot()), "the stall cleared")
    finally:
        q.close()


async def test_a_retry_after_of_years_is_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(sending_queue, "RETRY_LATER_MAX", 0.2)
    calls: list[int] = []

    async def deliver(events: list[dict]) -> None:
        calls.append(len(events))
        if len(calls) == 1:
            raise sending_queue.RetryLater(1e9, "503 with Retry-After: 999999999")

    q = SendingQueue("exporter/t", tmp_path / "q", SendingQueueConfig(backoff_initial=0.01, backoff_max=0.02),
                     deliver, Health())
    q.start()
    try:
        q.put([ev(1)])
        await wait_until(lambda: len(calls) == 2, "the capped retry")
        await wait_until(lambda: q.pending_events == 0, "delivered")
    finally:
        q.close()


# -- what the disk does while the worker runs --------------------------------------------------


class Away:
    """A deliver function for a peer that is away until ``back`` is set."""

    def __init__(self) -> None:
        self.got: list[dict] = []
        self.back = False

    async def deliver(self, events: list[dict]) -> None:
        if not self.back:
            raise ConnectionError("peer away")
        self.got += events


@pytest.mark.parametrize("which", ["older", "newest"])
async def test_a_segment_deleted_while_running_is_reported_and_delivery_goes_on(tmp_path, caplog, which):
    """A segment removed under the running queue (a cleanup tool, a hand): the worker's read of it
    raised, the worker task died, and nothing was delivered again until a restart, with /healthz
    still ok. What that segment held is gone; the rest is delivered and the loss is reported."""
    peer, health = Away(), Health()
    q = make(tmp_path, peer, health, segment_bytes=4096)  # type: ignore[arg-type]
    q.start()
    try:
        for i in range(N):
            q.put([ev(i, pad=400)])
        names = segment_files(tmp_path)
        assert len(names) >= 4
        gone = names[1] if which == "older" else names[-1]
        lost = set(queued_ids(tmp_path, [gone]))
        (tmp_path / "q" / gone).unlink()
        peer.back = True
        await wait_until(lambda: "segment-missing" in str(health.snapshot()), "the missing segment reported")
        for i in range(N, N + 5):  # accepted after the loss: delivered too
            q.put([ev(i, pad=400)])
        wanted = [f"e{i:06d}" for i in range(N + 5) if f"e{i:06d}" not in lost]
        await wait_until(lambda: ids(peer.got) == wanted, "every event of the segments still on disk, in order")
        await wait_until(lambda: q.pending_events == 0, "nothing counted as waiting once all is delivered")
        assert not q._task.done()
        assert any(gone in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    finally:
        await q.drain(0)


async def test_a_read_that_fails_is_reported_retried_and_cleared(tmp_path, monkeypatch, caplog):
    """A read error (EMFILE, EIO) used to end the worker task for good, silently."""
    peer, health = Peer(), Health()
    q = make(tmp_path, peer, health)
    real = q._pread
    failures = [OSError(24, "Too many open files")] * 3

    def pread(seg: int, n: int, off: int) -> bytes:
        if failures:
            raise failures.pop()
        return real(seg, n, off)

    monkeypatch.setattr(q, "_pread", pread)
    q.start()
    try:
        q.put([ev(1), ev(2)])
        await wait_until(lambda: ids(peer.got) == ["e000001", "e000002"], "delivered once reads work again")
        assert not failures
        assert any("queue-read-failed" in r.getMessage() for r in caplog.records)
        assert "queue-read-failed" not in str(health.snapshot())
        assert not q._task.done()
    finally:
        await q.drain(0)


async def test_a_delivered_segment_that_cannot_be_deleted_does_not_stop_delivery(tmp_path, monkeypatch, caplog):
    """Deleting a delivered segment can fail (a read-only remount, EACCES); that raise used to end
    the worker task for good. The segment stays on disk behind the cursor, said in the log."""
    real = sending_queue.Path.unlink

    def unlink(self, missing_ok: bool = False) -> None:
        if self.suffix == ".seg":
            raise PermissionError(13, "Permission denied", str(self))
        real(self, missing_ok=missing_ok)

    monkeypatch.setattr(sending_queue.Path, "unlink", unlink)
    peer = Peer()
    q = make(tmp_path, peer, segment_bytes=4096, batch_size=3)
    q.start()
    try:
        for i in range(N):
            q.put([ev(i, pad=400)])
            await asyncio.sleep(0)
        await wait_until(lambda: len(peer.got) == N, "every event delivered past the segments left on disk")
        assert ids(peer.got) == [f"e{i:06d}" for i in range(N)]
        assert not q._task.done()
        assert any("cannot delete" in r.getMessage() for r in caplog.records)
    finally:
        await q.drain(0)


async def test_a_corrupt_line_is_counted_once_however_often_its_batch_is_retried(tmp_path, caplog):
    """The reader counted a line it cannot decode at every read, and a batch is read again at every
    retry: with the peer away, one bad line on disk climbed the `corrupt` count without end."""
    q = make(tmp_path, Peer())
    q.open()
    q.put([ev(1)])
    with open(tmp_path / "q" / segment_files(tmp_path)[-1], "ab") as fh:
        fh.write(b"\x00\x00 not json\n")
    q.put([ev(2)])
    q.close()
    peer, health = Away(), Health()
    again = make(tmp_path, peer, health)  # type: ignore[arg-type]
    again.start()
    try:
        await wait_until(lambda: health.counters.get(("exporter/t", "retried"), 0) >= 3 * 2, "three tries")
        peer.back = True
        await wait_until(lambda: ids(peer.got) == ["e000001", "e000002"], "the events around the bad line")
        assert health.counters[("exporter/t", "corrupt")] == 1
        assert "corrupt-line" in str(health.snapshot())
        assert any("cannot be read back" in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    finally:
        await again.drain(0)


def synced_inodes(monkeypatch) -> list[int]:
    """Patch ``os.fsync`` to record the inode of everything it syncs."""
    import os

    real, seen = os.fsync, []

    def fsync(fd: int) -> None:
        seen.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_with_fsync_always_a_new_segment_is_synced_into_its_directory(tmp_path, monkeypatch):
    """`always` promises an append survives power loss once the hook is answered. The segment
    file's data was synced, its name in the directory never was: a power loss could lose the
    whole new segment, synced lines and all (POSIX: a new file's entry lasts once its directory
    is synced)."""
    seen = synced_inodes(monkeypatch)
    q = make(tmp_path, Peer(), segment_bytes=4096, fsync="always")
    q.open()
    directory = (tmp_path / "q").stat().st_ino
    assert directory in seen and (tmp_path).stat().st_ino in seen  # the queue's files, and the queue
    seen.clear()
    for i in range(12):
        q.put([ev(i, pad=400)])
    assert len(segment_files(tmp_path)) >= 2
    assert directory in seen
    rolls = seen.count(directory)
    seen.clear()
    q.put([ev(99)])  # an append to a segment already there: its data only, as before
    assert directory not in seen
    assert rolls == len(segment_files(tmp_path)) - 1
    q.close()


@pytest.mark.parametrize("policy", ["always", "interval"])
async def test_a_failed_fsync_of_a_segment_is_reported_not_swallowed(tmp_path, monkeypatch, caplog, policy):
    """A segment's sync can fail after its appends went through (EIO; ENOSPC or EDQUOT that NFS
    reports only at fsync): every such error was suppressed, so queued events could be lost to
    a power loss with nothing in the log or /healthz."""
    import errno
    import os

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    health = Health()
    q = make(tmp_path, Away(), health, fsync=policy, fsync_interval=0.01)  # type: ignore[arg-type]
    q.start()
    try:
        monkeypatch.setattr(os, "fsync", fsync)
        q.put([ev(1), ev(2)])
        await wait_until(lambda: "fsync-failed" in str(health.snapshot()), "the failed sync shown")
        assert segment_files(tmp_path)[0] in health.problems["exporter/t"]["fsync-failed"]
        assert any("fsync-failed" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    finally:
        monkeypatch.undo()
        await q.drain(0)
