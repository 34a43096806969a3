"""Replace a file's contents all at once: readers see the old file or the new one, never a part.

Each writer stages in a temp file of its own beside the target (a shared ``<file>.tmp`` let two
concurrent writers truncate or rename each other's half-written file), then renames it over the
target; on any failure the temp file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def atomic_write(path: Path, data: bytes | str, *, mode: int | None = None, durable: bool = False) -> None:
    """Write ``data`` to ``path`` atomically.

    ``mode``: the new file's permissions; by default an existing target's are kept and a new file
    gets the usual ``0o666 & ~umask`` (mkstemp's fixed 0600 would change what other users can read).
    ``durable``: fsync the file and its folder, for state that must survive a crash.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        keep: int | None = path.stat().st_mode & 0o7777 if mode is None else mode
    except FileNotFoundError:
        keep = None
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        if keep is not None:
            os.chmod(tmp, keep)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        sync_dir(path.parent)


def sync_dir(path: str | Path) -> None:
    """fsync the directory ``path``: the names created in it (a new file, a rename) last a power loss."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
