"""The persistent sending queue in front of every non-durable exporter (relay, NATS, OTLP, ...).

What a pipeline hands an exporter is appended to segment files on disk before the hook is
answered; one worker reads them back in order and drives the exporter's ``deliver(batch)``; a
delivery cursor on disk says how far delivery got. What was accepted and not yet delivered
survives ``kill -9`` and a restart. Delivery is at-least-once: a batch delivered just before a
crash, whose cursor step was not yet written, is delivered again after the restart, and the
receiver dedupes on the AEP event id (AEP-0001 §7.4), which the queue never changes.

The exporter API (what an exporter implements to sit behind this queue)::

    async def deliver(self, events: list[Event]) -> int | list[Event] | None

Return only once the peer has *taken* every event of the batch (acknowledged, flushed, answered
2xx); raise anything to have the whole batch retried after a backoff (``RetryLater(seconds)`` to
name the wait, e.g. from ``Retry-After``); raise ``Permanent`` when the batch can never be
delivered (the peer refused the content itself): it is dropped, counted and logged, and the queue
moves on. ``deliver`` is never called concurrently for one exporter and batches come in order.
An exporter that left some events of the batch out on purpose (one it cannot project, one the
peer can never take, records the peer rejected) counts them itself under the name that says why
(``dropped``, ``rejected``) and returns how many (an int) or those events (a list, as
``export_now`` returns the events it did not write); the queue counts only the rest as
``exported``. ``None`` (what an exporter written before this returns) means every event was taken.
An exporter without ``deliver`` is driven through ``export(events)`` instead (for those,
returning counts as delivered, read the same way). An exporter that hands events to something in this process (no
peer that can be away, nothing worth replaying after a restart) sets the class attribute
``persistent_queue = False`` and keeps the memory queue (``aep_collector.pipeline.pipeline.QueuedExporter``).

Layout of ``<state_dir>/queue/<exporter id>/``: ``<n>.seg`` segment files of JSON lines (one
event per line, the ``aep_collector.pipeline.wire`` bytes, appended with one ``write`` per batch), ``cursor``
(16 bytes: segment number and byte offset of the next undelivered line, rewritten in place
after each delivered batch) and ``lock`` (one collector per queue directory). A cursor that
cannot be right (the wrong length, past every segment on disk, past its segment's end or not at
the start of a line) is not trusted: delivery restarts at the oldest segment (some events are
delivered again, none is deleted), with a warning and a ``cursor-reset`` incident.

The bound is bytes on disk (``max_bytes``). Past 90 % of it, new debug/info events are refused;
at 100 %, every new event is: the queue keeps the oldest undelivered events (the JSONL log has
every event anyway). Each refusal is counted (``dropped`` in ``/healthz`` and ``/metrics``) and
logged at most once every ``LOG_EVERY`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import errno
import fcntl
import json
import logging
import os
import random
import re
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import orjson

from .atomic import sync_dir
from .host import Health
from .model import Event
from .wire import _DIGITS_ONLY, dumps_line

log = logging.getLogger("aep.sending_queue")
T = TypeVar("T")
R = TypeVar("R")

LOG_EVERY = 10.0
"""Seconds between two log lines about refused events while the queue stays full."""
LOW_SEVERITIES = frozenset({"debug", "info"})
LOW_SHARE = 0.9
"""Share of ``max_bytes`` past which debug/info events are refused (AEP-0003 §8.4: they go first)."""
_CURSOR = struct.Struct("<QQ")
_READ_CHUNK = 1 << 20
STALL_AFTER = 60.0
"""Seconds one ``deliver`` call may run before ``/healthz`` shows ``delivery-stalled``."""
RETRY_LATER_MAX = 300.0
"""Seconds at most that a peer's ``RetryLater`` (a ``Retry-After``) holds delivery back, unless
``backoff_max`` is longer."""


class Permanent(Exception):
    """Raised by ``deliver``: this batch can never be delivered; drop it (counted) and go on."""


class TooLarge(Permanent):
    """Raised by ``deliver`` (or inside it): the peer refused a request for its size (HTTP 413, gRPC
    ``RESOURCE_EXHAUSTED`` "larger than max"); a smaller one may pass, so an exporter splits it
    (``send_in_parts``)."""


async def send_in_parts(items: list[T], send: Callable[[list[T]], Awaitable[R]]) -> tuple[list[R], list[TooLarge]]:
    """``send(items)``; when the peer refuses it for its size (``TooLarge``: a backlog's full batches
    after an outage), each half the same way, down to single items. Returned: what each part that
    went returned, and the refusal of each item too large even alone. Any other failure raises."""
    try:
        return [await send(items)], []
    except TooLarge as exc:
        if len(items) == 1:
            return [], [exc]
    half = len(items) // 2
    first, refused = await send_in_parts(items[:half], send)
    second, refused_too = await send_in_parts(items[half:], send)
    return first + second, refused + refused_too


class RetryLater(Exception):
    """Raised by ``deliver``: retry the batch after ``delay`` seconds (e.g. an HTTP Retry-After)."""

    def __init__(self, delay: float, message: str = "") -> None:
        super().__init__(message or f"retry after {delay} s")
        self.delay = delay


@dataclass
class SendingQueueConfig:
    """``exporters.<id>.sending_queue``: the persistent queue in front of that exporter."""

    enabled: bool = True
    directory: str | None = None
    """Where the segments live; default ``<service.state_dir>/queue/<exporter id>``."""
    max_bytes: int = 256 * 1024 * 1024
    """Bound on the segment bytes on disk; past it new events are refused (counted, logged)."""
    segment_bytes: int = 8 * 1024 * 1024
    """A segment file is closed and a new one started past this size; a fully delivered closed
    segment is deleted. Capped at an eighth of ``max_bytes``."""
    batch_size: int = 512
    """Events handed to one ``deliver`` call at most."""
    linger: float = 0.005
    """Seconds the worker waits after delivering a batch smaller than ``batch_size`` before it
    reads the next, so events arriving meanwhile share one delivery (one round trip to the peer
    instead of one each; at 1,000 hooks/s this halved the collector's CPU per hook with the relay
    exporter). An event arriving while the worker is idle goes out at once; 0 turns it off."""
    fsync: Literal["always", "interval", "never"] = "interval"
    """``always``: fsync each append before the hook is answered (survives power loss);
    ``interval``: every ``fsync_interval`` seconds; ``never``: leave it to the OS. Each survives
    ``kill -9`` (the data is in the page cache once ``write`` returned)."""
    fsync_interval: float = 1.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0

    def validate(self) -> None:
        if self.max_bytes < 64 * 1024:
            raise ValueError("max_bytes must be at least 65536")
        if self.segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if isinstance(self.linger, bool) or not isinstance(self.linger, int | float) or not 0 <= self.linger <= 1:
            raise ValueError("linger must be a number of seconds from 0 to 1")
        if self.fsync_interval <= 0:
            raise ValueError("fsync_interval must be positive")
        if self.backoff_initial <= 0 or self.backoff_max < self.backoff_initial:
            raise ValueError("backoff_initial must be positive and backoff_max at least backoff_initial")


def queue_directory(state_dir: Path, cid: str, config: SendingQueueConfig) -> Path:
    """``config.directory``, or ``<state_dir>/queue/<id>`` (ids are ``type`` or ``type/name``)."""
    if config.directory:
        return Path(config.directory).expanduser()
    name = cid.removeprefix("exporter/").replace("/", "+")
    return state_dir / "queue" / name


ExportBatch = Callable[[list[Event]], Awaitable[Any]]


def left_out(result: Any, total: int) -> int:
    """How many of a batch of ``total`` events an exporter's ``deliver`` or ``export`` left out,
    read from what it returned: an int is that number, a list holds those events; anything else
    (``None``, whatever a plug-in written before returns) is none. Never more than ``total``."""
    if isinstance(result, bool):
        return 0
    if isinstance(result, int):
        n = result
    elif isinstance(result, list):
        n = len(result)
    else:
        return 0
    return min(max(n, 0), total)


def deliver_of(exporter: Any) -> ExportBatch:
    """The exporter's ``deliver``, or its ``export`` when it has none."""
    fn = getattr(exporter, "deliver", None)
    return fn if callable(fn) else exporter.export


class SendingQueue:
    """A disk-backed FIFO of events plus the one worker that delivers them.

    ``put`` (synchronous, called on the event loop by the pipeline) appends to the open segment;
    ``start`` opens the directory (taking its lock, repairing a torn tail, counting what is
    pending from the cursor) and starts the worker; ``drain`` stops the worker, leaving whatever
    is undelivered on disk for the next start.
    """

    def __init__(self, cid: str, directory: Path, config: SendingQueueConfig, deliver: ExportBatch,
                 health: Health) -> None:
        self.id, self.directory, self.config, self._deliver, self.health = cid, directory, config, deliver, health
        self.segment_limit = min(config.segment_bytes, max(4096, config.max_bytes // 8))
        self.segments: list[int] = []
        """Segment numbers on disk, oldest first; the last is the one appended to."""
        self.sizes: dict[int, int] = {}
        self.cursor = (0, 0)
        self.pending_events = 0
        self.dropped_total = 0
        self._fd: int | None = None
        self._read: tuple[int, int] | None = None
        """(segment, descriptor) the worker reads from, kept open between deliveries."""
        self._lock_fd: int | None = None
        self._cursor_fd: int | None = None
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._refused_since_log = 0
        self._last_log = 0.0
        self._full = False
        self._write_failed: set[str] = set()
        """Causes ``put`` raised for a failed append (``enospc``, ...); the next append that
        succeeds recovers them."""
        self._stall_shown = False
        self._read_failing = False  # the worker's last read raised (``queue-read-failed`` shown)
        self._bad_lines: list[tuple[int, int]] = []
        """(segment, offset) of each line the last read could not decode, reported when it is committed."""
        self._torn_seen: set[int] = set()
        """Segments whose torn last line the reader already counted (a retried read sees it again)."""
        self._progress = time.monotonic()
        self._opened = False

    # -- sizes ------------------------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Segment bytes on disk (delivered lines of the oldest segment count until it is deleted)."""
        return sum(self.sizes.values())

    # -- opening ---------------------------------------------------------------------------

    def open(self) -> None:
        """Open (or create) the queue directory; idempotent. Raises OSError if it cannot."""
        if self._opened:
            return
        d = self.directory
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock_fd = os.open(d / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock_fd)
            raise OSError(errno.EBUSY, f"queue directory {d} is in use by another collector") from None
        self._lock_fd = lock_fd
        try:
            self._load(d)
        except BaseException:
            self.close()  # releases the lock too, so a later attempt can take it again
            raise
        if self.config.fsync == "always":  # the files' names (and the queue's own) last a power loss
            with contextlib.suppress(OSError):
                sync_dir(d)
                sync_dir(d.parent)
        self._opened = True
        self.health.recover(self.id, "queue-unavailable")  # raised by start() or put() while it could not open
        if self.pending_events:
            log.info("%s: %d undelivered events (%d bytes) waiting in %s from before", self.id,
                     self.pending_events, self.pending_bytes, d)

    def _load(self, d: Path) -> None:
        """Find the segments, repair a torn tail, read the cursor, open the tail segment, count."""
        for p in d.glob("*.seg"):
            if p.stem.isdigit():
                self.segments.append(int(p.stem))
                self.sizes[int(p.stem)] = p.stat().st_size
        self.segments.sort()
        if self.segments:  # repaired first, so the cursor is checked against whole lines only
            _repair_tail(self._path(self.segments[-1]))
            self.sizes[self.segments[-1]] = self._path(self.segments[-1]).stat().st_size
        self._cursor_fd = os.open(d / "cursor", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        raw = os.pread(self._cursor_fd, _CURSOR.size + 1, 0)  # one byte more, to see a long file
        seg, off = _CURSOR.unpack(raw) if len(raw) == _CURSOR.size else (0, 0)
        wrong = self._implausible(raw, seg, off)
        if wrong:
            # Its word would delete segments or skip lines: redelivering is the safe side (at-least-once).
            oldest = self.segments[0] if self.segments else 1
            log.warning("%s: the delivery cursor %s %s; not trusted: delivery restarts at the oldest "
                        "segment on disk (%d), so events delivered before may be delivered again",
                        self.id, d / "cursor", wrong, oldest)
            self.health.incident(self.id, "cursor-reset", f"{d / 'cursor'} {wrong}; delivery restarted at "
                                 "the oldest segment (events may be delivered again)")
            seg, off = 0, 0
        # Segments wholly before the cursor were delivered; a cursor on a deleted segment moves on.
        for n in [n for n in self.segments if n < seg]:
            self._unlink(n)
        if not self.segments:
            self.segments.append(max(seg, 1))
            self.sizes[self.segments[0]] = 0
        if self.segments[0] != seg:
            seg, off = self.segments[0], 0
        last = self._path(self.segments[-1])
        self._fd = os.open(last, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.sizes[self.segments[-1]] = os.fstat(self._fd).st_size
        self.cursor = (seg, off)
        if wrong:  # rewritten whole now, or a cursor of the wrong length would be distrusted at every start
            with contextlib.suppress(OSError):
                os.pwrite(self._cursor_fd, _CURSOR.pack(seg, off), 0)
                os.ftruncate(self._cursor_fd, _CURSOR.size)
        self.pending_events = self._count_from_cursor()

    def _implausible(self, raw: bytes, seg: int, off: int) -> str:
        """What is wrong with the cursor read from disk (``raw``, unpacked to ``seg``, ``off``), or "".

        The worker writes the cursor only on a line boundary of a segment it read, and deletes only
        segments before it, so a cursor is never past the newest segment, in a gap, past its
        segment's end or inside a line. Empty is a queue that never delivered; a cursor before the
        oldest segment is one whose step was not written after the segments it passed were deleted.
        """
        if len(raw) not in (0, _CURSOR.size):
            return f"is {len(raw)}{'+' if len(raw) > _CURSOR.size else ''} bytes long, not {_CURSOR.size}"
        if not self.segments or seg < self.segments[0]:
            return ""
        if seg > self.segments[-1]:
            return f"points at segment {seg}, past the newest on disk ({self.segments[-1]})"
        if seg not in self.sizes:
            return f"points at segment {seg}, which is not on disk (segments {self.segments[0]}..{self.segments[-1]})"
        if off > self.sizes[seg]:
            return f"points at offset {off} of segment {seg}, past its end ({self.sizes[seg]} bytes)"
        if off and self._pread(seg, 1, off - 1) != b"\n":
            return f"points at offset {off} of segment {seg}, which is not the start of a line"
        return ""

    def _path(self, n: int) -> Path:
        return self.directory / f"{n:016d}.seg"

    def _count_from_cursor(self) -> int:
        total = 0
        seg, off = self.cursor
        for n in self.segments:
            if n < seg:
                continue
            with open(self._path(n), "rb") as fh:
                if n == seg:
                    fh.seek(off)
                while chunk := fh.read(_READ_CHUNK):
                    total += chunk.count(b"\n")
        return total

    def _unlink(self, n: int) -> None:
        if self._read is not None and self._read[0] == n:
            self._close_read()
        try:
            self._path(n).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:  # left on disk, behind the cursor: the next start deletes it
            log.warning("%s: cannot delete %s (%s); it is deleted at the next start", self.id, self._path(n),
                        exc.strerror or exc)
        with contextlib.suppress(ValueError):
            self.segments.remove(n)
        self.sizes.pop(n, None)

    # -- the pipeline's side ---------------------------------------------------------------

    takes_lines = True
    """``put`` accepts the events' lines already serialized (see ``put``)."""

    def put(self, events: list[Event], lines: list[bytes] | None = None) -> None:
        """Append ``events`` to disk now; refuse (count, log) what the byte bound has no room for.

        ``lines``, when given, are ``wire.dumps_line`` of each event, in order (the pipeline
        serializes once for the JSONL record and this queue)."""
        if not self._opened:
            try:
                self.open()
            except OSError as exc:
                self._refuse(len(events), "queue-unavailable", f"{self.directory}: {exc.strerror or exc}")
                return
        cfg = self.config
        used = self.pending_bytes
        low_cap = int(cfg.max_bytes * LOW_SHARE)
        if lines is None:
            lines = [dumps_line(event) for event in events]
        kept: list[bytes] = []
        size = 0
        refused = 0
        for event, line in zip(events, lines, strict=True):
            cap = low_cap if event.get("severity", "info") in LOW_SEVERITIES else cfg.max_bytes
            if used + size + len(line) > cap:
                refused += 1
                continue
            kept.append(line)
            size += len(line)
        if kept:
            data = b"".join(kept)
            try:
                if self.sizes[self.segments[-1]] >= self.segment_limit:
                    self._roll()  # creating the next segment fails on a full disk too
                _write_all(self._fd, data, self.sizes[self.segments[-1]])  # type: ignore[arg-type]
            except OSError as exc:
                cause = _cause(exc)
                self._write_failed.add(cause)
                self._refuse(len(kept), cause, f"{self._path(self.segments[-1])}: {exc.strerror or exc}")
            else:
                if self._write_failed:  # an append fits again: the disk has room (or works) again
                    for cause in sorted(self._write_failed):
                        self.health.recover(self.id, cause)
                    self._write_failed.clear()
                self.sizes[self.segments[-1]] += len(data)
                self.pending_events += len(kept)
                if cfg.fsync == "always":
                    try:
                        os.fsync(self._fd)  # type: ignore[arg-type]
                    except OSError as exc:
                        self._sync_failed(self.segments[-1], exc)
                else:
                    self._dirty = True
                self._wake.set()
        if refused:
            self._refuse(refused, "queue-full",
                         f"sending queue at its bound of {cfg.max_bytes} bytes on disk; new events refused, "
                         "debug/info first (the JSONL log keeps them)")

    def _roll(self) -> None:
        old = self._fd
        n = self.segments[-1] + 1
        self._fd = os.open(self._path(n), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.segments.append(n)
        self.sizes[n] = 0
        if self.config.fsync == "always":  # the new segment's name, or a power loss can take it whole
            with contextlib.suppress(OSError):
                sync_dir(self.directory)
        if old is not None:
            if self.config.fsync != "never" and self._dirty:
                try:
                    os.fsync(old)
                except OSError as exc:
                    self._sync_failed(n - 1, exc)
            with contextlib.suppress(OSError):
                os.close(old)

    def _sync_failed(self, seg: int, exc: OSError) -> None:
        """Report a failed fsync of segment ``seg`` (EIO; ENOSPC or EDQUOT that NFS defers to
        fsync): what was appended since its last good sync may not be on disk."""
        if exc.errno in (errno.EBADF, errno.EINVAL):  # closed meanwhile (synced then), or unsyncable
            return
        self.health.incident(self.id, "fsync-failed", f"{self._path(seg)}: fsync failed ({exc.strerror or exc}); "
                             "events queued since its last sync may be lost (the JSONL log has them)")

    def _refuse(self, n: int, cause: str, detail: str) -> None:
        self.dropped_total += n
        self.health.count(self.id, "dropped", n)
        self.health.fail(self.id, cause, detail)  # logged once per cause until recovered
        self._full = self._full or cause == "queue-full"
        self._refused_since_log += n
        now = time.monotonic()
        if not self._last_log or now - self._last_log >= LOG_EVERY:
            since = f" in the last {now - self._last_log:.0f} s" if self._last_log else ""
            log.warning("%s: sending queue refused %d events%s (%s; %d bytes queued, bound %d bytes; "
                        "%d refused since start)", self.id, self._refused_since_log, since, cause,
                        self.pending_bytes, self.config.max_bytes, self.dropped_total)
            self._refused_since_log = 0
            self._last_log = now

    # -- the worker ------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.open()
        except OSError as exc:  # reported; put() keeps refusing (counted) until it can open
            self.health.fail(self.id, "queue-unavailable", f"{self.directory}: {exc.strerror or exc}")
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=f"sending-queue:{self.id}")
        if self.config.fsync == "interval":
            self._sync_task = loop.create_task(self._sync_loop(), name=f"sending-queue-sync:{self.id}")

    def read_batch(self) -> tuple[list[Event], tuple[int, int], int]:
        """Up to ``batch_size`` events from the cursor: (events, cursor after them, lines consumed).

        Reads a chunk at a time. A line longer than a chunk is read whole, however long (the queue
        accepted it), and ends the batch: a batch holds at most one line larger than a chunk."""
        seg, off = self.cursor
        if self.segments and seg == self.segments[-1] and off >= self.sizes.get(seg, 0):
            return [], (seg, off), 0  # all read (the worker's look after each delivery)
        events: list[Event] = []
        consumed = 0
        bad = self._bad_lines = []  # read again after a failed delivery: reported once, when committed
        while len(events) < self.config.batch_size:
            size = self.sizes.get(seg)
            if size is None or off >= size:  # read to its end, or found missing (``_missing``)
                later = [n for n in self.segments if n > seg]
                if not later:
                    break
                seg, off = later[0], 0
                continue
            try:
                buf = self._pread(seg, min(_READ_CHUNK, size - off), off)
            except FileNotFoundError:
                self._missing(seg, off)
                continue
            long_line = len(buf) == _READ_CHUNK and b"\n" not in buf
            if long_line:
                buf = self._read_line(seg, off, size, buf)
            pos = 0
            while len(events) < self.config.batch_size:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    break
                line = buf[pos:nl]
                consumed += 1
                event = _decode(line)
                if isinstance(event, dict):
                    events.append(event)
                else:  # cannot happen with our own writes; reported (``_commit``) rather than wedging the queue
                    bad.append((seg, off + pos))
                pos = nl + 1
            if pos == 0:
                if seg == self.segments[-1]:
                    break  # no whole line in range: an append is under way
                # Appends go to the newest segment only, so an older one ending without a newline
                # ends in a torn line (outside damage, or power loss writing pages out of order):
                # skip it rather than stop every later delivery behind it.
                self._torn(seg, off, size)
                off = size
                continue
            off += pos
            if long_line:
                break
        return events, (seg, off), consumed

    def _torn(self, seg: int, off: int, size: int) -> None:
        """Count and show, once per segment, the torn line the reader skips at the end of ``seg``."""
        if seg in self._torn_seen:
            return  # read again after a failed delivery: already counted
        self._torn_seen.add(seg)
        self.health.count(self.id, "corrupt")
        detail = f"{self._path(seg)}: skipped a torn line of {size - off} bytes at its end (offset {off})"
        log.warning("%s: %s", self.id, detail)
        self.health.incident(self.id, "torn-line", detail)

    def _missing(self, seg: int, off: int) -> None:
        """Segment ``seg`` is gone from disk (a cleanup tool, a hand), read up to ``off``: what it
        held after that cannot be delivered. Reported, and delivery goes on with the next segment;
        the newest one is first replaced, so later appends go to a file the reader can open."""
        if seg == self.segments[-1]:
            self._roll()
        detail = (f"{self._path(seg)} was deleted with {self.sizes[seg] - off} undelivered bytes; "
                  "delivery goes on with the next segment (the JSONL log has those events)")
        self._unlink(seg)
        log.warning("%s: %s", self.id, detail)
        self.health.incident(self.id, "segment-missing", detail)

    def _read_line(self, seg: int, off: int, size: int, head: bytes) -> bytes:
        """The line at ``off`` of segment ``seg``, of which the chunk ``head`` holds no newline:
        read on, a chunk at a time, to its newline (or the segment's ``size``)."""
        parts = [head]
        at = off + len(head)
        while at < size:
            chunk = self._pread(seg, min(_READ_CHUNK, size - at), at)
            if not chunk:
                break
            nl = chunk.find(b"\n")
            if nl >= 0:
                parts.append(chunk[:nl + 1])
                break
            parts.append(chunk)
            at += len(chunk)
        return b"".join(parts)

    def _pread(self, seg: int, n: int, off: int) -> bytes:
        """``n`` bytes of segment ``seg`` from ``off``. The segment stays open for the next read:
        at a low hook rate every delivery is one line, and opening the file each time (a file
        object, a path, six system calls) cost more than the read."""
        read = self._read
        if read is None or read[0] != seg:
            self._close_read()
            read = self._read = (seg, os.open(self._path(seg), os.O_RDONLY | os.O_CLOEXEC))
        return os.pread(read[1], n, off)

    def _close_read(self) -> None:
        if self._read is not None:
            with contextlib.suppress(OSError):
                os.close(self._read[1])
            self._read = None

    def _commit(self, cursor: tuple[int, int], consumed: int) -> None:
        if self._bad_lines:
            bad, self._bad_lines = self._bad_lines, []
            self.health.count(self.id, "corrupt", len(bad))
            detail = (f"{len(bad)} line(s) cannot be read back as events and were skipped, the first at offset "
                      f"{bad[0][1]} of {self._path(bad[0][0])}")
            log.warning("%s: %s", self.id, detail)
            self.health.incident(self.id, "corrupt-line", detail)
        self.cursor = cursor
        self.pending_events = max(0, self.pending_events - consumed)
        if self._cursor_fd is not None:
            try:  # a cursor step that fails is retaken by the next one (at worst a redelivery)
                os.pwrite(self._cursor_fd, _CURSOR.pack(*cursor), 0)
                if self.config.fsync == "always":
                    os.fsync(self._cursor_fd)
            except OSError:
                pass
        if self.segments and self.segments[0] < cursor[0]:  # in order: only then is one wholly delivered
            for n in [n for n in self.segments[:-1] if n < cursor[0]]:
                self._unlink(n)
        if self._full and self.pending_bytes < int(self.config.max_bytes * LOW_SHARE):
            self._full = False
            self.health.recover(self.id, "queue-full")
            log.info("%s: sending queue below its bound again; %d events were refused in all",
                     self.id, self.dropped_total)

    async def _run(self) -> None:
        attempt = 0
        while True:
            if not self._opened:
                await asyncio.sleep(self.config.backoff_max)
                with contextlib.suppress(OSError):
                    self.open()
                continue
            try:
                events, after, consumed = self.read_batch()
            except OSError as exc:  # EMFILE, EIO, ...: reported and retried, never the worker's end
                self._read_failing = True
                self.health.fail(self.id, "queue-read-failed", f"{self.directory}: {exc.strerror or exc}")
                await asyncio.sleep(_backoff(attempt, self.config.backoff_initial, self.config.backoff_max))
                attempt += 1
                continue
            if self._read_failing:
                self._read_failing = False
                self.health.recover(self.id, "queue-read-failed")
            if not consumed:
                if after != self.cursor:  # only past a segment found missing: nothing to deliver there
                    self._commit(after, 0)
                    continue
                self.pending_events = 0  # caught up (a missing segment's lines were never counted off)
                self._wake.clear()
                await self._wake.wait()
                continue
            if not events:
                self._commit(after, consumed)
                continue
            # A delivery the peer keeps waiting (or a plug-in's that never returns) shows in
            # /healthz after STALL_AFTER seconds, and clears when that delivery ends either way.
            alarm = asyncio.get_running_loop().call_later(STALL_AFTER, self._stalled, len(events))
            retry_in: float | None = None
            result: Any = None
            try:
                result = await self._deliver(events)
            except asyncio.CancelledError:
                raise
            except Permanent as exc:
                self.health.count(self.id, "failed", len(events))
                self.health.fail(self.id, "export-refused", f"{exc}")
                log.error("%s: dropped a batch of %d events the peer refused for good: %s", self.id,
                          len(events), exc)
                self._commit(after, consumed)
                self._progress = time.monotonic()
                continue
            except Exception as exc:  # retried with backoff: the queue never loses a batch to an error
                self.health.count(self.id, "retried", len(events))
                self.health.fail(self.id, "export-failed", f"{type(exc).__name__}: {exc}")
                # A peer's own delay is honoured up to RETRY_LATER_MAX: a Retry-After of years
                # would otherwise stop this exporter until a restart.
                retry_in = min(exc.delay, max(RETRY_LATER_MAX, self.config.backoff_max)) if isinstance(
                    exc, RetryLater) else _backoff(attempt, self.config.backoff_initial, self.config.backoff_max)
                attempt += 1
            finally:
                alarm.cancel()
                if self._stall_shown:
                    self._stall_shown = False
                    self.health.recover(self.id, "delivery-stalled")
            if retry_in is not None:
                await asyncio.sleep(max(0.0, retry_in))
                continue
            attempt = 0
            # What the exporter left out it counted itself, under its reason (``dropped``, ...).
            taken = len(events) - left_out(result, len(events))
            if taken:
                self.health.count(self.id, "exported", taken)
            self.health.recover(self.id, "export-failed")
            self._commit(after, consumed)
            self._progress = time.monotonic()
            if self.config.linger and len(events) < self.config.batch_size:
                await asyncio.sleep(self.config.linger)  # what arrives meanwhile joins the next batch

    def _stalled(self, n: int) -> None:
        self._stall_shown = True
        self.health.fail(self.id, "delivery-stalled", f"a delivery of {n} events has not returned for "
                         f"{STALL_AFTER:g}s; later events wait behind it (on disk)")

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.fsync_interval)
            if self._dirty and self._fd is not None:
                self._dirty = False
                fd, seg = self._fd, self.segments[-1]
                try:
                    await asyncio.to_thread(os.fsync, fd)
                except OSError as exc:
                    self._sync_failed(seg, exc)

    async def drain(self, timeout: float) -> None:
        """Deliver what is queued while delivery makes progress (at most ``timeout`` s), then stop.

        What is left stays on disk and is delivered after the next start.
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while (self._task is not None and self.pending_events and loop.time() < end
               and time.monotonic() - self._progress < 1.0):
            await asyncio.sleep(0.02)
        for task in (self._task, self._sync_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._sync_task = None
        self.close()

    def close(self) -> None:
        self._close_read()
        for name in ("_fd", "_cursor_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd is not None:
                if name == "_fd" and self._dirty and self.config.fsync != "never":
                    try:
                        os.fsync(fd)
                    except OSError as exc:
                        self._sync_failed(self.segments[-1] if self.segments else 0, exc)
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)
        self._opened = False
        self.segments, self.sizes = [], {}
        if self.pending_events:
            log.info("%s: %d undelivered events stay queued in %s for the next start", self.id,
                     self.pending_events, self.directory)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` (delay-seconds or an HTTP-date) in seconds, None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def shown_url(url: str) -> str:
    """``url`` as errors, logs and ``/healthz`` show it: without user info and query, where a
    password or an ``access_token`` would be (AEP-0003 §8.1: a query-string token MUST NOT be logged)."""
    if "://" not in url:  # host:port (a gRPC target): at most a user info to drop
        return url.rpartition("@")[2]
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket: shown only by its length
        return f"<a {len(url)}-character endpoint that is not a URL>"
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment=""))


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL an exporter can POST to, or None. aiohttp refuses a port
    that is not a number from 1 to 65535 only when it sends: every delivery failed, retried for good."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket
        return f"{exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL with a host"
    try:
        port = parts.port  # checked only when asked
    except ValueError:
        port = 0
    return "the port is not a number from 1 to 65535" if port == 0 else None


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_GRPC_KEY = re.compile(r"[0-9a-z_.-]+")


def headers_problem(headers: Any, grpc: bool = False) -> str | None:
    """Why an exporter's ``headers`` cannot go on every request, or None. A header the HTTP client
    refuses (a newline) failed every delivery, retried for good; a name the server cannot parse was
    answered 400, so every batch was dropped. Values are never quoted: they are often secrets.
    ``grpc``: sent as gRPC metadata (lowercased), whose values must be printable ASCII."""
    if not isinstance(headers, dict):
        return "headers must be a mapping of header names to values"
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            return f"header name {name!r} is not an HTTP token (letters, digits and !#$%&'*+-.^_`|~ only)"
        if grpc and (not _GRPC_KEY.fullmatch(name.lower()) or name.lower().startswith("grpc-")):
            return f"header name {name!r} cannot be gRPC metadata (letters, digits, '-', '_' and '.'; no grpc- prefix)"
        if not isinstance(value, str):
            return f"header {name!r} must have a string value"
        if grpc and not all(" " <= c <= "~" for c in value):
            return f"header {name!r} must have a printable ASCII value (gRPC metadata)"
        if any(c < " " and c != "\t" or c == "\x7f" for c in value):
            return f"header {name!r} has a control character (a newline?) in its value"
    return None


def redirected(resp: Any) -> str:
    """The tail of a failure message for an HTTP answer that is a redirect (never followed: a POST
    redirected is replayed as a bodiless GET): where it points, so the endpoint can be corrected."""
    if not 300 <= resp.status < 400:
        return ""
    return f" (a redirect to {resp.headers.get('Location', 'nowhere named')!r}: set the endpoint to it)"


def http_failure(status: int, retry_after_header: str | None, what: str, retryable: bool) -> Exception:
    """What a peer's non-2xx HTTP answer means for the queue: a retry (after its Retry-After, if
    it named one) or a batch that can never be delivered. Each protocol says which statuses retry."""
    if not retryable:
        return Permanent(what)
    delay = retry_after(retry_after_header)
    return RetryLater(delay, what) if delay is not None else ConnectionError(what)


# What ``_decode`` sends to the standard library: a run of 20 digits, found as ``wire.loads`` finds
# its 19 (digits mapped to "0", the rest to " ", then a substring search: two C passes; the regex
# ``[0-9]{20}`` cost ~30,000 instructions on a 360-byte line).
_LONG_RUN = b"0" * 20


def _long_number(line: bytes) -> bool:
    """Whether ``line`` holds a run of 20 ASCII digits (``re.search(rb"[0-9]{20}", line)``)."""
    return _LONG_RUN in line.translate(_DIGITS_ONLY)


def _decode(line: bytes) -> Any:
    """A queued line back to the event it was, exactly; None if it is not JSON.

    orjson is the fast path, but it reads an integer beyond 64 bits as a float and refuses a lone
    surrogate escape: lines that may hold either (the ``aep_collector.pipeline.wire`` fallback writes them) go
    through the standard library, which is exact for both.
    """
    if not _long_number(line):
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(line)
    except ValueError:
        return None


def _write_all(fd: int, data: bytes, size: int) -> None:
    """One ``write`` at the end (``size``) of the file: whole lines for a reader; a short write is
    cut back and reported."""
    try:
        written = os.write(fd, data)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise
    if written != len(data):
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise OSError(errno.ENOSPC, "short write (disk full?)")


def _repair_tail(path: Path) -> None:
    """Cut a torn last line (power loss mid-append) so the next append starts a fresh line. The
    last newline is looked for a chunk at a time, however far back it is (a line can be longer
    than a chunk); a file without one is all torn line."""
    try:
        with open(path, "rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            keep, end = 0, size
            while end > 0:
                start = max(0, end - _READ_CHUNK)
                fh.seek(start)
                cut = fh.read(end - start).rfind(b"\n")
                if cut >= 0:
                    keep = start + cut + 1
                    break
                end = start
            fh.truncate(keep)
            log.warning("%s: cut a torn last line of %d bytes", path, size - keep)
    except FileNotFoundError:
        return


def _backoff(attempt: int, initial: float, maximum: float) -> float:
    """Exponential with full jitter in its upper half, so many collectors do not retry in step."""
    delay = min(maximum, initial * (2 ** min(attempt, 30)))
    return delay / 2 + random.random() * delay / 2


def _cause(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "error").lower() if exc.errno else type(exc).__name__
