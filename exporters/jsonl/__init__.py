"""The ``jsonl`` exporter: one append-only file per session, the durable record (AEP-0003 §3.1).

Layout ``<directory>/<agent>/<session>.jsonl``; agent-scoped events go to ``<agent>/_agent.jsonl``.
Each event is one line written with a single ``write`` on an ``O_APPEND`` descriptor, so a reader
never sees a torn line followed by more events; a short write is truncated back, and a torn last
line left by a crash is cut off (and kept beside the file) the first time the file is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.component import CreateSettings, Factory, Kind
from pipeline.host import Health, Host
from pipeline.model import Event
from pipeline.wire import dumps_bytes

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

    def validate(self) -> None:
        if self.fsync_interval <= 0:
            raise ValueError("fsync_interval must be positive")
        if self.max_open_files < 1:
            raise ValueError("max_open_files must be at least 1")
        if self.min_free_bytes < 0:
            raise ValueError("min_free_bytes must not be negative")


class JsonlExporter:
    """Writes each event as one line of its session's file."""

    durable = True  # called inline by the pipeline: on disk before the hook is answered

    def __init__(self, settings: CreateSettings, config: JsonlConfig) -> None:
        self.id = f"exporter/{settings.id}"
        self.config = config
        self.root = Path(config.directory).expanduser()
        self.health: Health = Health()
        self._fds: OrderedDict[Path, int] = OrderedDict()
        self._dirty: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self._paths: dict[tuple[Any, Any], Path] = {}

    async def start(self, host: Host) -> None:
        self.health = host.health
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # reported, and hooks keep being answered
            self._fail(exc, f"{self.root}: {exc.strerror}")
        if self.config.fsync == "interval":
            self._task = asyncio.get_running_loop().create_task(self._fsync_loop())

    def path_for(self, event: Event) -> Path:
        key = (event.get("agent", "unknown"), event.get("session"))
        path = self._paths.get(key)
        if path is None:
            agent = encode_name(str(key[0]))
            name = AGENT_FILE if key[1] is None else encode_name(str(key[1]))
            path = self.root / agent / f"{name}.jsonl"
            if len(self._paths) >= 4096:  # a cache, not state: bounded, rebuilt on demand
                self._paths.clear()
            self._paths[key] = path
        return path

    async def export(self, events: list[Event]) -> None:
        self.export_now(events)

    def export_now(self, events: list[Event]) -> None:
        """Append every event; raise nothing (a failure is reported in health, per cause).

        A batch's lines for one file go out in one ``write`` (order kept): still whole lines only,
        and one system call per session per batch instead of one per event.
        """
        by_path: dict[Path, list[bytes]] = {}
        for event in events:
            by_path.setdefault(self.path_for(event), []).append(dumps_bytes(event) + b"\n")
        touched: set[int] = set()
        failed = 0
        for path, lines in by_path.items():
            try:
                fd = self._open(path)
                self._append(fd, b"".join(lines))
                touched.add(fd)
            except OSError as exc:
                failed += len(lines)
                self._fail(exc, f"{path}: {exc.strerror or exc}")
                self._close(path)
        if failed:
            self.health.count(self.id, "dropped", failed)
        elif self.health.problems.get(self.id):
            for cause in list(self.health.problems.get(self.id, {})):
                # A write that fitted says nothing about a disk still at its limit.
                if cause not in _FULL or self.has_room():
                    self.health.recover(self.id, cause)
        if self.config.fsync == "always":
            for fd in touched:
                with contextlib.suppress(OSError):
                    os.fsync(fd)
        else:
            self._dirty |= touched

    def _fail(self, exc: OSError, detail: str) -> None:
        cause = _cause(exc)
        # A full disk is a state: it clears when space is back, even if no write comes to prove it.
        self.health.fail(self.id, cause, detail, clears=self.has_room if cause in _FULL else None)

    def has_room(self) -> bool:
        """Whether the log directory's filesystem has ``min_free_bytes`` free."""
        try:
            st = os.statvfs(self.root)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= self.config.min_free_bytes

    def _append(self, fd: int, line: bytes) -> None:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # never leave half a line for the next event to follow
            raise
        if written != len(line):
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise OSError(errno.ENOSPC, "short write (disk full?)")

    def _open(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        path.parent.mkdir(parents=True, exist_ok=True)
        repair_torn_tail(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        self._fds[path] = fd
        while len(self._fds) > self.config.max_open_files:
            old_path, old_fd = self._fds.popitem(last=False)
            self._release(old_fd)
        return fd

    def _close(self, path: Path) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            self._release(fd)

    def _release(self, fd: int) -> None:
        with contextlib.suppress(OSError):
            if fd in self._dirty and self.config.fsync != "never":
                os.fsync(fd)
            os.close(fd)
        self._dirty.discard(fd)

    def sync(self) -> None:
        for fd in list(self._dirty):
            with contextlib.suppress(OSError):
                os.fsync(fd)
        self._dirty.clear()

    async def _fsync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.fsync_interval)
            if self._dirty:
                await asyncio.to_thread(self.sync)

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for path in list(self._fds):
            self._close(path)


def repair_torn_tail(path: Path) -> bool:
    """Cut a torn last line (a crash mid-write) and keep it in ``<file>.torn-<ms>``; True if cut."""
    try:
        with open(path, "rb+") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size == 0:
                return False
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
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
            (path.parent / f"{path.name}.torn-{int(time.time() * 1000)}").write_bytes(fragment)
            fh.truncate(cut)
            log.warning("%s: cut a torn last line of %d bytes (kept beside the file)", path, len(fragment))
            return True
    except FileNotFoundError:
        return False


_FULL = frozenset({"enospc", "edquot"})


def _cause(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "error").lower() if exc.errno else type(exc).__name__


FACTORY = Factory(
    kind=Kind.EXPORTER,
    type="jsonl",
    config_class=JsonlConfig,
    create=lambda settings, cfg: JsonlExporter(settings, cfg),
    description="Appends each event to <directory>/<agent>/<session>.jsonl, one line per event",
)
