"""The ``jsonl`` exporter: one append-only file per session, the durable record (AEP-0003 §3.1).

Layout ``<directory>/<agent>/<session>.jsonl``; agent-scoped events go to ``<agent>/_agent.jsonl``.
Retention (off by default): a session file past ``rotate_bytes`` or older than ``rotate_age`` is
closed as ``<session>@<UTC time>.jsonl`` (``aep_collector.pipeline.jsonl_files`` names and reads them), closed
files are gzip-compressed, and past ``max_total_bytes`` the oldest closed files are deleted.
Each event is one line written with a single ``write`` on an ``O_APPEND`` descriptor, so a reader
never sees a torn line followed by more events; a short write's torn fragment is cut back (or
blanked in place when another appender wrote after it), and a torn last line left by a crash is
cut off (and kept beside the file) the first time the file is opened.
An open file that someone deletes or moves away is noticed by a check about once a second (not per
write) and closed, so the session's next event re-creates the file at its path (``_watch_loop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import gzip
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import orjson
from aep_collector.pipeline.atomic import sync_dir
from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.config import no_folder
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.jsonl_files import is_rotated, rotated_name
from aep_collector.pipeline.model import Event
from aep_collector.pipeline.wire import dumps_line

from .paths import AGENT_FILE, encode_name

log = logging.getLogger("aep.exporter.jsonl")


@dataclass
class JsonlConfig:
    """Config of the ``jsonl`` exporter."""

    directory: str = "~/.aep/logs"
    fsync: Literal["always", "interval", "never"] = "interval"
    """``always``: fsync after every batch before the hook is answered; ``interval``: every
    ``fsync_interval`` seconds; ``never``: leave it to the OS."""
    fsync_interval: float = 1.0
    max_open_files: int = 128
    min_free_bytes: int = 16 << 20
    """Once a write hit a full disk, the disk is reported full until its filesystem has this much
    free space again: the state of the disk, not whether the last (maybe small) write fitted."""
    rotate_bytes: int = 0
    """Close a session file as ``<session>@<time>.jsonl`` before it grows past this; 0: never."""
    rotate_age: float = 0
    """Close a session file whose first event is older than this many seconds (checked when the
    session writes); 0: never."""
    compress: bool = True
    """gzip closed (rotated) files to ``.jsonl.gz``."""
    max_total_bytes: int = 0
    """Delete the oldest closed files while the directory holds more than this; 0: no cap. The
    file a session is writing is never deleted."""

    def validate(self) -> None:
        no_folder(self.directory, "directory")  # "" would be the working directory
        if self.fsync_interval <= 0:
            raise ValueError("fsync_interval must be positive")
        if self.max_open_files < 1:
            raise ValueError("max_open_files must be at least 1")
        if self.min_free_bytes < 0:
            raise ValueError("min_free_bytes must not be negative")
        for name in ("rotate_bytes", "rotate_age", "max_total_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (off) or positive")
        if self.max_total_bytes and not (self.rotate_bytes or self.rotate_age):
            raise ValueError("max_total_bytes needs rotate_bytes or rotate_age: only closed files are deleted")

    @property
    def retention(self) -> bool:
        return bool(self.rotate_bytes or self.rotate_age or self.max_total_bytes)


class JsonlExporter:
    """Writes each event as one line of its session's file."""

    durable = True  # called inline by the pipeline: on disk before the hook is answered
    takes_lines = True  # export_now accepts the events' lines, serialized once by the pipeline
    check_interval = 1.0
    """Seconds between checks that each open file is still at its path (``_watch_loop``)."""

    def __init__(self, settings: CreateSettings, config: JsonlConfig) -> None:
        self.id = f"exporter/{settings.id}"
        self.config = config
        self.root = Path(config.directory).expanduser()
        self.health: Health = Health()
        # Open files by path string (hashing a str is cached, a Path's is a Python call per lookup).
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._dirty: set[int] = set()
        self._syncing: set[int] = set()  # the interval loop's thread is fsyncing these now
        self._task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._paths: dict[tuple[Any, Any], str] = {}
        self._last_path: str | None = None  # the path at the end of _fds (most recently written), if any
        self._born: dict[str, float] = {}
        self._closed: asyncio.Queue[Path | None] | None = None
        self._busy: set[Path] = set()  # closed files another process held: compressed at a later wake
        self._retention_task: asyncio.Task[None] | None = None
        self._failing: dict[str, str] = {}
        """Where writing failed (a session file, or the log directory at start) -> its cause. A
        cause is reported while some place still fails with it: one agent's unwritable directory
        is not cleared by another agent's writes (``_written``, ``_cleared``)."""
        self._retention_failing: set[str] = set()  # retention steps whose last run failed
        self._last_closed = datetime.min.replace(tzinfo=UTC)  # the stamp of the last file closed

    async def start(self, host: Host) -> None:
        self.health = host.health
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # reported, and hooks keep being answered
            self._fail(exc, str(self.root), f"{self.root}: {exc.strerror}")
        if self.config.fsync == "interval":
            self._task = asyncio.get_running_loop().create_task(self._fsync_loop())
        self._watch_task = asyncio.get_running_loop().create_task(self._watch_loop())
        if self.config.retention:
            self._closed = asyncio.Queue()
            self._retention_task = asyncio.get_running_loop().create_task(self._retention_loop())

    def path_for(self, event: Event) -> Path:
        return Path(self._file(event))

    def _file(self, event: Event) -> str:
        """The file of ``event``'s session: ``encode_name`` keeps every session id inside its directory."""
        key = (event.get("agent", "unknown"), event.get("session"))
        path = self._paths.get(key)
        if path is None:
            agent = encode_name(str(key[0]))
            name = AGENT_FILE if key[1] is None else encode_name(str(key[1]))
            path = str(self.root / agent / f"{name}.jsonl")
            if len(self._paths) >= 4096:  # a cache, not state: bounded, rebuilt on demand
                self._paths.clear()
            self._paths[key] = path
        return path

    async def export(self, events: list[Event]) -> None:
        self.export_now(events)  # failures are reported in health; nobody to hand them back to

    def export_now(self, events: list[Event], lines: list[bytes] | None = None) -> list[Event]:
        """Append every event; raise nothing (a failure is reported in health, per cause). Returns
        the events not written (a caller that can be retried, the OTLP receiver, is told so).

        ``lines``, when given, are the events' lines already serialized (``wire.dumps_line`` of
        each event, in order: the pipeline serializes once for every consumer of the bytes).
        A batch's lines for one file go out in one ``write`` (order kept): still whole lines only,
        and one system call per session per batch instead of one per event. A batch of one (a
        hook's) for a file already open, with no rotation, takes the short path first below.
        """
        cfg = self.config
        if len(events) == 1 and not (cfg.rotate_bytes or cfg.rotate_age):
            event = events[0]
            path = self._paths.get((event.get("agent", "unknown"), event.get("session"))) or self._file(event)
            fd = self._fds.get(path)
            if fd is not None:
                if path is not self._last_path:  # the open-file LRU: a hook stream repeats its session
                    self._fds.move_to_end(path)
                    self._last_path = path
                data = dumps_line(event) if lines is None else lines[0]
                try:
                    written = os.write(fd, data)
                except OSError as exc:
                    self._dropped(path, exc, 1)
                    return events
                if written != len(data):
                    kept = self._cut_short_write(path, fd, data, written)
                    self._dropped(path, self._short_write_error(), 1 - kept)
                    return [] if kept else events
                if self._failing:
                    self._written(path)
                if cfg.fsync == "always":
                    try:
                        os.fsync(fd)
                    except OSError as exc:
                        self._sync_failed([(fd, exc)])
                else:
                    self._dirty.add(fd)
                return []
        if lines is None:
            lines = [dumps_line(event) for event in events]
        if len(events) == 1:
            event = events[0]
            path = self._paths.get((event.get("agent", "unknown"), event.get("session"))) or self._file(event)
            groups: list[tuple[str, list[bytes]]] = [(path, lines)]
        else:
            by_path: dict[str, list[bytes]] = {}
            paths = self._paths
            for event, line in zip(events, lines, strict=True):
                # ``_file`` only when its cache misses: a call per event costs more than the look-up.
                path = paths.get((event.get("agent", "unknown"), event.get("session"))) or self._file(event)
                by_path.setdefault(path, []).append(line)
            groups = list(by_path.items())
        touched: list[int] = []
        failed = 0
        lost: dict[str, int] = {}  # path -> lines of its group not written (the last ones)
        for path, group in groups:
            kept = 0
            try:
                data = group[0] if len(group) == 1 else b"".join(group)
                fd = self._fds.get(path)
                if fd is None:
                    fd = self._open(path)
                else:
                    self._fds.move_to_end(path)
                    self._last_path = path
                if cfg.rotate_bytes or cfg.rotate_age:
                    fd = self._maybe_rotate(path, fd, len(data))
                written = os.write(fd, data)
                if written != len(data):
                    kept = self._cut_short_write(path, fd, data, written)
                    raise self._short_write_error()
                touched.append(fd)
                if cfg.rotate_age and path not in self._born:
                    self._born[path] = _event_time(group[0])
                if self._failing:
                    self._written(path)
            except OSError as exc:
                failed += len(group) - kept
                lost[path] = len(group) - kept
                self._dropped(path, exc, 0)
        if failed:
            self.health.count(self.id, "dropped", failed)
        if cfg.fsync == "always":
            for fd in touched:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    self._sync_failed([(fd, exc)])
        else:
            self._dirty.update(touched)
        if not lost:
            return []
        # Rare: which events those were, each file's last ones (a short write keeps whole lines).
        by_path: dict[str, list[Event]] = {}
        for event in events:
            path = self._paths.get((event.get("agent", "unknown"), event.get("session"))) or self._file(event)
            if path in lost:
                by_path.setdefault(path, []).append(event)
        return [e for path, group_events in by_path.items() for e in group_events[len(group_events) - lost[path]:]]

    def _dropped(self, path: str, exc: OSError, count: int) -> None:
        """A write to ``path`` failed: report the cause and close the file; count ``count`` events dropped."""
        self._fail(exc, path, f"{path}: {exc.strerror or exc}")
        self._close(path)
        if count:
            self.health.count(self.id, "dropped", count)

    def _fail(self, exc: OSError, where: str, detail: str) -> None:
        cause = _cause(exc)
        self._failing[where] = cause
        # Logged once while the cause stands (``Health.fail``); the probe lets a /healthz read clear
        # it when the file system says so, even if that place is never written again. It can tell
        # only space and permissions: any other cause (EFBIG, EIO, EMFILE) it would call fixed at
        # once, so those stand until a write to that place goes through (``_written``).
        probe = (lambda: self._cleared(cause)) if cause in _FULL or cause in _PROBED else None
        self.health.fail(self.id, cause, detail, clears=probe)

    def _written(self, path: str) -> None:
        """A write to ``path`` went through: clear what that proves fixed, and only that. That file
        and the directories it is in are writable; a full disk clears only once it has room (a write
        that fitted says nothing about a disk still at its limit)."""
        failing, cleared, room = self._failing, set(), None
        for where, cause in list(failing.items()):
            if cause in _FULL:
                if room is None:
                    room = self.has_room()
                fixed = room
            else:
                fixed = where == path or path.startswith(where + os.sep)
            if fixed:
                del failing[where]
                cleared.add(cause)
        for cause in cleared:
            if cause not in failing.values():
                self.health.recover(self.id, cause)

    def _cleared(self, cause: str) -> bool:
        """The ``clears`` probe of ``cause``: drop each place failing with it that the file system
        now says can be written (a full disk: once it has room); True once none is left."""
        failing = self._failing
        places = [where for where, c in failing.items() if c == cause]
        room = self.has_room() if cause in _FULL else None
        for where in places:
            if room if room is not None else self._could_write(where):
                del failing[where]
        return cause not in failing.values()

    def _could_write(self, where: str) -> bool:
        """Whether writing at ``where`` (a session file, or the log directory) would go through as
        far as the file system tells: it is a writable file (a directory, for the log directory),
        or it is missing and the nearest directory above it that exists is writable."""
        path, want_dir = where, where == str(self.root)
        while True:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                parent = os.path.dirname(path)
                if parent == path:
                    return False
                path, want_dir = parent, True  # created on the next write, in what exists above it
                continue
            except OSError:
                return False
            if want_dir:
                return stat.S_ISDIR(st.st_mode) and os.access(path, os.W_OK | os.X_OK)
            return stat.S_ISREG(st.st_mode) and os.access(path, os.W_OK)

    def has_room(self) -> bool:
        """Whether the log directory's filesystem has ``min_free_bytes`` free."""
        try:
            st = os.statvfs(self.root)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= self.config.min_free_bytes

    def _short_write_error(self) -> OSError:
        """The cause of a write cut short (write(2) says none): a full disk when the filesystem is
        short of room, else a limit its free space does not show (a quota, a file size limit), which
        ``_fail`` leaves standing until a write goes through."""
        if self.has_room():
            return OSError(errno.EDQUOT, "short write with the disk not full (a quota or a file size limit?)")
        return OSError(errno.ENOSPC, "short write (disk full?)")

    def _cut_short_write(self, path: str, fd: int, data: bytes, written: int) -> int:
        """Undo the torn line a short write left; return how many of ``data``'s lines stay.

        write(2) either fails having written nothing (OSError) or returns how much it wrote. The
        whole lines it wrote stay (accepted events, on disk). Only our torn fragment is undone, and
        only if it is still ours: another appender (a second exporter or collector on this
        directory) may have written after it, or cut it while repairing the tail on opening. The
        O_APPEND write left our offset just past the fragment, whoever wrote since (no fstat per
        event). At the end of the file the fragment is cut; with a record after it, it is blanked
        in place (spaces and a newline), so that record keeps its own line and nothing of it is cut.
        """
        keep = data.rfind(b"\n", 0, written) + 1
        if keep:
            self._dirty.add(fd)  # fsynced when the failed file is closed
        fragment = data[keep:written]
        if fragment:
            with contextlib.suppress(OSError):
                end = os.lseek(fd, 0, os.SEEK_CUR)
                start = end - len(fragment)
                other = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
                try:
                    if start >= 0 and os.pread(other, len(fragment), start) == fragment:
                        if os.fstat(other).st_size == end:
                            os.ftruncate(other, start)
                        else:
                            os.pwrite(other, b" " * (len(fragment) - 1) + b"\n", start)
                finally:
                    os.close(other)
        return data.count(b"\n", 0, keep)

    def _open(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            self._last_path = path
            return fd
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        repair_torn_tail(Path(path))
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, 0o600)
        # Held while the file is open: another collector that renames (rotates) this file under us
        # must not compress it away while we still append to it (see _compress).
        if not _try_lock(fd, fcntl.LOCK_SH):
            # A compressor holds it: the file was renamed (closed) between our open and our lock,
            # and what we append after its copy goes with its unlink. The name is a new file now.
            # Once, never waiting: a second refusal (another rotation meanwhile) is written as before.
            os.close(fd)
            fd = os.open(path, flags, 0o600)
            _try_lock(fd, fcntl.LOCK_SH)
        if self.config.fsync == "always" and os.fstat(fd).st_size == 0:
            # A new file: its name (and its agent folder's, maybe new too) must last a power loss
            # as its synced lines do. Once per file, not per write.
            with contextlib.suppress(OSError):
                sync_dir(os.path.dirname(path))
                sync_dir(str(self.root))
        self._fds[path] = fd
        self._last_path = path
        # The first event's stamp is the best guess of a file's start only for one this process has
        # not seen: an open-file-bound reopen keeps what it knew (``_release`` leaves ``_born``).
        if self.config.rotate_age and path not in self._born and os.fstat(fd).st_size:
            self._born[path] = _first_event_time(Path(path))
        while len(self._fds) > self.config.max_open_files:
            old_path, old_fd = self._fds.popitem(last=False)
            self._release(old_fd, old_path)
        return fd

    def _maybe_rotate(self, path: str, fd: int, incoming: int) -> int:
        """Close ``path`` as a rotated file (and reopen it empty) when it is due; the fd to write."""
        cfg = self.config
        st = os.fstat(fd)
        if st.st_nlink == 0:
            # Deleted under us. Rotation pays for this fstat anyway, so here it is caught before the
            # write, not by the next check (``_watch_loop``) after some events went into the void.
            self._vanished(path, "deleted", lost=False)
            return self._open(path)
        size = st.st_size
        if size == 0:
            return fd
        too_big = cfg.rotate_bytes and size + incoming > cfg.rotate_bytes
        too_old = cfg.rotate_age and time.time() - self._born.get(path, time.time()) > cfg.rotate_age
        if not (too_big or too_old):
            return fd
        try:
            self._retire(path, "size" if too_big else "age")
        except OSError as exc:
            # Not renamed (an append-only directory, say): the record goes on in this file, past
            # its bound, rather than nowhere; the rename is tried again at the next write.
            self._retention("rotate", f"{path}: cannot close it as a rotated file ({exc.strerror or exc})")
            return fd
        if self._retention_failing:
            self._retention("rotate")
        fd = self._open(path)
        # Started now: its first event's stamp may be old (a gateway's backlog), and counting from
        # it would close this file again at its next write, and every file after it.
        self._born[path] = time.time()
        return fd

    def _retire(self, file: str | Path, why: str) -> None:
        """Rename ``file`` to its rotated name and close it; queue it for compression and the cap.
        A rename that fails (but for a file already gone) raises, leaving the file open as it was."""
        path = Path(file)
        # Readers take a session's closed files in name order: after the clock stepped back (or
        # stood still), a later file still gets a later name than every one this process closed.
        now = datetime.now(UTC)
        if now <= self._last_closed:
            now = self._last_closed + timedelta(microseconds=1)
        self._last_closed = now
        stamp = now.strftime("%Y%m%dT%H%M%S.%fZ")
        base = path.name[: -len(".jsonl")]
        target = path.parent / rotated_name(base, stamp)
        n = 1
        while target.exists() or target.with_name(target.name + ".gz").exists():
            target = path.parent / rotated_name(base, f"{stamp}-{n}")
            n += 1
        try:
            os.rename(path, target)
        except FileNotFoundError:  # moved away or deleted by someone else: nothing left to close
            self._close(file)
            log.info("%s: %s was gone when it fell due (%s): the session starts a new file", self.id, path.name, why)
            return
        self._close(file)  # after the rename: the open file is the renamed one; its lock goes now
        log.info("%s: closed %s as %s (%s)", self.id, path.name, target.name, why)
        if self._closed is not None:
            self._closed.put_nowait(target)

    def _idle_files(self, cutoff: float) -> list[Path]:
        """Session files not written since ``cutoff`` (an ended session's file, typically)."""
        out = []
        for p in self.root.glob("*/*.jsonl"):
            with contextlib.suppress(OSError):
                if not is_rotated(p) and p.stat().st_mtime < cutoff and p.stat().st_size:
                    out.append(p)
        return out

    async def _rotate_idle(self) -> None:
        idle = await asyncio.to_thread(self._idle_files, time.time() - self.config.rotate_age)
        for path in idle:  # decided and renamed on the loop: export_now cannot interleave
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < time.time() - self.config.rotate_age:
                    self._retire(path, "idle")

    async def _retention_loop(self) -> None:
        """Compress closed files and hold the byte cap, off the event loop; a startup sweep first."""
        assert self._closed is not None
        await asyncio.to_thread(self._sweep)
        # With rotate_age, files nobody writes any more are closed too, checked this often.
        every = min(self.config.rotate_age / 2, 60.0) if self.config.rotate_age else None
        while True:
            try:
                path = await asyncio.wait_for(self._closed.get(), every)
            except TimeoutError:
                try:
                    await self._rotate_idle()
                except OSError as exc:
                    self._retention("rotate", f"{self.root}: {exc.strerror or exc}")
                else:
                    self._retention("rotate")
                continue
            if path is None:
                return
            if self.config.compress:
                failure = None
                for file in [path, *self._busy]:  # one file that fails leaves the others to be tried
                    try:
                        await asyncio.to_thread(self._compress, file)
                    except OSError as exc:
                        failure = f"{file}: {exc.strerror or exc}"
                self._retention("compress", failure)
            # Also when compressing failed: a disk too full to compress is when the cap frees room.
            if self.config.max_total_bytes:
                try:
                    await asyncio.to_thread(self._enforce_cap)
                except OSError as exc:
                    self._retention("cap", f"{self.root}: {exc.strerror or exc}")
                else:
                    self._retention("cap")

    def _retention(self, step: str, failure: str | None = None) -> None:
        """How a retention step (``rotate``, ``compress``, ``cap``) went: ``retention-failed`` stands
        while the last run of some step failed, and clears when that step goes through again."""
        if failure is not None:
            self._retention_failing.add(step)
            self.health.fail(self.id, "retention-failed", failure)
        elif step in self._retention_failing:
            self._retention_failing.discard(step)
            if not self._retention_failing:
                self.health.recover(self.id, "retention-failed")

    def _compress(self, path: Path) -> None:
        """Compress one closed file, or keep it for later while another process holds it."""
        if _compress(path):
            self._busy.discard(path)
        elif path not in self._busy:
            self._busy.add(path)
            log.info("%s: %s is held by another process (a compressor, or a collector still appending): "
                     "compressed later", self.id, path.name)

    def _sweep(self) -> None:
        """Finish what a crash interrupted: drop partial .gz, compress closed files, apply the cap."""
        if not self.root.is_dir():
            return
        for p in self.root.rglob("*.gz.tmp"):
            with contextlib.suppress(OSError):
                _drop_stale_temp(p)
        if self.config.compress:
            for p in self.root.rglob("*.jsonl"):
                if is_rotated(p):
                    with contextlib.suppress(OSError):
                        self._compress(p)
        if self.config.max_total_bytes:
            self._enforce_cap()

    def _enforce_cap(self) -> None:
        files = []
        total = 0
        for p in self.root.rglob("*"):
            with contextlib.suppress(OSError):
                if p.is_file():
                    st = p.stat()
                    total += st.st_size
                    if is_rotated(p):
                        files.append((st.st_mtime, p.name, st.st_size, p))
        files.sort()
        removed = 0
        for _, _, size, p in files:
            if total <= self.config.max_total_bytes:
                break
            if not _unlink_unless_held(p):
                continue  # another collector still appends to it (or compresses it): a later round's
            total -= size
            removed += 1
        if removed:
            self.health.count(self.id, "files_deleted", removed)
            log.info("%s: deleted the %d oldest closed log files to stay within max_total_bytes (%d)",
                     self.id, removed, self.config.max_total_bytes)
        if total > self.config.max_total_bytes:
            log.warning("%s: %s holds %d bytes in files still being written, over max_total_bytes %d",
                        self.id, self.root, total, self.config.max_total_bytes)

    def _close(self, file: str | Path) -> None:
        path = os.fspath(file)
        self._born.pop(path, None)
        fd = self._fds.pop(path, None)
        if fd is not None:
            self._release(fd, path)

    def _release(self, fd: int, path: str) -> None:
        # One the interval thread holds may be closed before it gets to it: synced here.
        if (fd in self._dirty or fd in self._syncing) and self.config.fsync != "never":
            try:
                os.fsync(fd)
            except OSError as exc:
                self._sync_failed([(fd, exc)], {fd: path})
        with contextlib.suppress(OSError):
            os.close(fd)
        self._dirty.discard(fd)

    def _sync_failed(self, failures: list[tuple[int, OSError]], paths: dict[int, str] | None = None) -> None:
        """Report fsyncs that failed (EIO; ENOSPC or EDQUOT that NFS defers to fsync): the lines
        written to those files since their last good sync may not be on disk."""
        if paths is None:
            paths = {fd: path for path, fd in self._fds.items()}
        for fd, exc in failures:
            if exc.errno in (errno.EBADF, errno.EINVAL):  # closed meanwhile (and synced then), or unsyncable
                continue
            where = os.path.relpath(paths[fd], self.root) if fd in paths else f"descriptor {fd}"
            detail = f"{where}: fsync failed ({exc.strerror or exc}); lines written since its last sync may be lost"
            self.health.incident(self.id, "fsync-failed", detail)

    def sync(self) -> None:
        """fsync every file written since the last sync."""
        dirty, self._dirty = self._dirty, set()
        failed = _fsync_each(dirty)
        if failed:
            self._sync_failed(failed)

    async def _fsync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.fsync_interval)
            if self._dirty:
                # Taken on the loop, before the thread starts: a file written while the thread
                # syncs is marked again and synced next time (clearing the set after the thread
                # had synced it would lose that mark until the file is closed).
                self._syncing, self._dirty = self._dirty, set()
                try:
                    failed = await asyncio.to_thread(_fsync_each, self._syncing)
                    if failed:
                        self._sync_failed(failed)
                except BaseException:  # cancelled (shutdown): closing the files syncs them instead
                    self._dirty |= self._syncing
                    raise
                finally:
                    self._syncing = set()

    async def _watch_loop(self) -> None:
        """Close each open file that was deleted or moved away; the next write re-creates it at its path.

        Checked every ``check_interval`` seconds, not per write (an fstat per event is hot-path cost):
        what a session writes into a deleted file before the check sees it is lost, and reported.
        """
        while True:
            await asyncio.sleep(self.check_interval)
            if not self._fds:
                continue
            try:
                # Stat'ed in a thread (a slow file system must not hold the loop) from a copy taken on
                # the loop; closed on the loop, the only place ``_fds`` changes.
                suspects = await asyncio.to_thread(_vanished_of, list(self._fds.items()))
                for path, fd in suspects:
                    # Asked again here: meanwhile the loop may have closed that fd and reopened the
                    # path, getting the same number for the new file.
                    how = _whereabouts(path, fd) if self._fds.get(path) == fd else None
                    if how is not None:  # with rotation, every write checks first: none went in
                        rotating = bool(self.config.rotate_bytes or self.config.rotate_age)
                        self._vanished(path, how, lost=how == "deleted" and not rotating)
            except Exception:  # never let the check die silently: the next round tries again
                log.exception("%s: checking the open session files failed", self.id)

    def _vanished(self, path: str, how: Literal["deleted", "moved"], lost: bool) -> None:
        """``path``'s open file was deleted or moved away: close it (the next write re-creates it)
        and say so; ``lost``: events may have gone into the deleted file since."""
        self._close(path)
        rel = os.path.relpath(path, self.root)
        if how == "moved":
            # Its events are where it was moved (a user's mv, logrotate, another collector's
            # rotation): nothing lost, nothing unhealthy.
            log.info("%s: %s was moved away while open; the session continues in a new file at its path",
                     self.id, rel)
            self.health.count(self.id, "files_moved")
            return
        since = ("the events written to it since it was deleted are lost" if lost
                 else "no event was written to it since")
        log.warning("%s: %s was deleted while open (%s); the session continues in a new file at its path",
                    self.id, rel, since)
        self.health.count(self.id, "files_vanished")
        self.health.incident(self.id, "file-vanished", f"{rel}: deleted while open; {since}")

    async def shutdown(self) -> None:
        for task in (self._task, self._watch_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._retention_task is not None and self._closed is not None:
            self._closed.put_nowait(None)  # finish compressing what is queued; the next start sweeps
            try:
                await asyncio.wait_for(self._retention_task, 10.0)
            except (TimeoutError, Exception):
                self._retention_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._retention_task
        for path in list(self._fds):
            self._close(path)


def _fsync_each(fds: set[int]) -> list[tuple[int, OSError]]:
    """fsync each of ``fds``; the (descriptor, error) of each that failed."""
    failed = []
    for fd in fds:
        try:
            os.fsync(fd)
        except OSError as exc:
            failed.append((fd, exc))
    return failed


def _whereabouts(path: str, fd: int) -> Literal["deleted", "moved"] | None:
    """What became of the file open as ``fd`` at ``path``: ``deleted`` (no name left), ``moved``
    (``path`` names another file or none), or None while it is there (or when it cannot tell)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if st.st_nlink == 0:
        return "deleted"
    try:
        at = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "moved"
    except OSError:  # e.g. a directory made unreadable: not evidence the file went anywhere
        return None
    return None if (at.st_dev, at.st_ino) == (st.st_dev, st.st_ino) else "moved"


def _vanished_of(files: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (path, fd) of ``files`` whose file was deleted or moved away."""
    return [(path, fd) for path, fd in files if _whereabouts(path, fd) is not None]


def repair_torn_tail(path: Path) -> bool:
    """Cut a torn last line (a crash mid-write) and keep it in ``<file>.torn-<ms>``; True if cut.
    A file another live writer holds (its shared lock) is left as it is."""
    try:
        with open(path, "rb+") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size == 0:
                return False
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return False
            # Every live writer holds a shared lock on its file: a tail it holds is its write under
            # way (a reader can see part of one), not a crash's. Cut, it would lose that record.
            if not _try_lock(fh.fileno(), fcntl.LOCK_EX):
                return False
            # Walk back to the last newline; the tail after it is the torn fragment.
            pos, chunk = size, 65536
            cut = 0
            while pos > 0:
                start = max(0, pos - chunk)
                fh.seek(start)
                buf = fh.read(pos - start)
                idx = buf.rfind(b"\n")
                if idx >= 0:
                    cut = start + idx + 1
                    break
                pos = start
            fh.seek(cut)
            fragment = fh.read()
            kept = path.parent / f"{path.name}.torn-{int(time.time() * 1000)}"
            try:
                kept.write_bytes(fragment)
            except OSError:  # a full disk: no part-copy left per attempt; cut only once it is kept
                kept.unlink(missing_ok=True)
                raise
            fh.truncate(cut)
            log.warning("%s: cut a torn last line of %d bytes (kept beside the file)", path, len(fragment))
            return True
    except FileNotFoundError:
        return False


_FULL = frozenset({"enospc"})
"""A full disk: seen gone by the filesystem's free space (``has_room``). Not EDQUOT: a per-user quota
does not show there, so it stands until a write goes through."""
_PROBED = frozenset({"eacces", "eperm", "erofs", "enoent", "enotdir", "eisdir", "eexist"})
"""Causes ``_could_write`` can see gone (permissions, a missing or misplaced folder or file)."""


def _first_event_time(path: Path) -> float:
    """When the file's first event was stamped (its ``time``), else now: where its age counts from."""
    try:
        with open(path, "rb") as fh:
            return _event_time(fh.readline(65536))
    except OSError:
        return time.time()


def _event_time(line: bytes) -> float:
    """The event's ``time``, never later than now: an OTLP event carries its record's time, and a
    client clock years ahead must not keep its file from ever rotating by age."""
    now = time.time()
    try:
        return min(datetime.fromisoformat(orjson.loads(line).get("time")).timestamp(), now)
    except (ValueError, TypeError, AttributeError):
        return now


# A compressor's temp file: ``.<closed file>.<random>.gz.tmp``; ``<closed file>.gz.tmp`` is the one
# fixed name older versions used (it let two compressors truncate and rename each other's temp).
_TEMP = re.compile(r"^(?:\.(?P<src>.+\.jsonl)\.[^.]+|(?P<legacy>.+\.jsonl))\.gz\.tmp$")


def _try_lock(fd: int, kind: int) -> bool:
    """flock ``fd`` without waiting; False only if another open file holds a conflicting lock."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a filesystem without flock: go on unlocked, as before locks were taken
        pass
    return True


def _compress(path: Path) -> bool:
    """``x.jsonl`` -> ``x.jsonl.gz``: written aside, synced, renamed, then the original removed.

    Holds an exclusive flock on ``x.jsonl`` throughout, so one compressor at a time works on a file
    and never while a writer (which holds a shared one) still appends to it; the temp file's name is
    its own, so nothing else writes or renames it. False, leaving the file as it is, when another
    process holds the file; True when it is compressed (by this call or another) or gone.
    """
    target = path.with_name(path.name + ".gz")
    try:
        src = open(path, "rb")
    except FileNotFoundError:  # compressed by another compressor meanwhile (or deleted by the cap)
        return True
    with src:
        if not _try_lock(src.fileno(), fcntl.LOCK_EX):
            return False
        if target.exists():  # compressed before a crash kept the original, or by the lock's last holder
            path.unlink(missing_ok=True)
            return True
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".gz.tmp", dir=path.parent)  # mode 0600
        try:
            with open(fd, "wb") as raw:
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                    shutil.copyfileobj(src, gz, 1 << 20)
                raw.flush()
                os.fsync(raw.fileno())
            os.rename(name, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise
        path.unlink(missing_ok=True)  # another collector's byte cap may have deleted it meanwhile
    return True


def _unlink_unless_held(path: Path) -> bool:
    """Delete the closed file ``path`` unless a process holds it (a collector that opened it before
    it was closed still appends to it: a shared lock; a compressor: an exclusive one). True if it
    is gone."""
    try:
        src = open(path, "rb")
    except FileNotFoundError:
        return True
    with src:
        if not _try_lock(src.fileno(), fcntl.LOCK_EX):
            return False
        path.unlink(missing_ok=True)
    return True


def _drop_stale_temp(tmp: Path) -> None:
    """Remove ``tmp`` if it is left from a crashed compression, not one still running.

    A live compressor holds its closed file's lock until its temp is renamed; a crashed one's lock
    went with its process. Holding that lock here keeps a new compressor from starting meanwhile.
    """
    m = _TEMP.match(tmp.name)
    if m is None:
        return
    try:
        src = open(tmp.with_name(m.group("src") or m.group("legacy")), "rb")
    except FileNotFoundError:  # its file is compressed (or deleted by the cap): nobody renames this one
        tmp.unlink(missing_ok=True)
        return
    with src:
        if _try_lock(src.fileno(), fcntl.LOCK_EX):
            tmp.unlink(missing_ok=True)


def _cause(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "error").lower() if exc.errno else type(exc).__name__


FACTORY = Factory(
    kind=Kind.EXPORTER,
    type="jsonl",
    config_class=JsonlConfig,
    create=lambda settings, cfg: JsonlExporter(settings, cfg),
    description="Appends each event to <directory>/<agent>/<session>.jsonl, one line per event",
)
