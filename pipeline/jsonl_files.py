"""The one reader of JSONL event logs: plain, rotated and gzip-compressed files alike.

The ``jsonl`` exporter writes ``<agent>/<session>.jsonl``; with retention on it closes that file
now and then as ``<agent>/<session>@<UTC time>.jsonl`` and compresses closed files to
``...jsonl.gz``. ``@`` never occurs in an encoded session name (``aep_collector.exporters.jsonl.paths``), so the
rotated files of a session are exactly ``<session>@*``, and their names sort oldest first.
Everything that reads a session's log (``validate-events``, the operator CLI's ``timeline`` and
``tail --file``) goes through ``session_files`` / ``iter_lines`` here.
"""

from __future__ import annotations

import glob
import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

ROTATED_SEP = "@"
_GZIP_MAGIC = b"\x1f\x8b"
_ROTATED = re.compile(r"^(?P<base>[^@]+)@(?P<stamp>[0-9TZ.-]+)\.jsonl(\.gz)?$")


def rotated_name(base: str, stamp: str) -> str:
    """The name of ``<base>.jsonl`` once closed at ``stamp`` (sortable UTC time)."""
    return f"{base}{ROTATED_SEP}{stamp}.jsonl"


def base_of(path: Path) -> str | None:
    """The session file base (``<session>``) of an active or rotated log file name, else None."""
    m = _ROTATED.match(path.name)
    if m:
        return m.group("base")
    for suffix in (".jsonl", ".jsonl.gz"):
        if path.name.endswith(suffix) and ROTATED_SEP not in path.name:
            return path.name[: -len(suffix)]
    return None


def is_rotated(path: Path) -> bool:
    return _ROTATED.match(path.name) is not None


def session_files(path: str | Path) -> list[Path]:
    """Every file of the session log ``path`` names, oldest first.

    ``path`` is the active ``<session>.jsonl``: its rotated (and compressed) predecessors come
    first, then the active file if it exists. Any other path (one rotated file, a ``.gz``, a file
    the exporter did not write) is that file alone.
    """
    path = Path(path)
    if is_rotated(path) or not path.name.endswith(".jsonl"):
        return [path]
    base = path.name[: -len(".jsonl")]
    rotated = [p for p in path.parent.glob(f"{glob.escape(base)}{ROTATED_SEP}*")
               if (m := _ROTATED.match(p.name)) and m.group("base") == base]
    # A crash between compressing and unlinking leaves both copies: read the complete .gz once.
    names = {p.name for p in rotated}
    rotated = [p for p in rotated if not (p.suffix == ".jsonl" and f"{p.name}.gz" in names)]
    files = sorted(rotated, key=lambda p: p.name.removesuffix(".gz"))
    if path.exists() or not files:
        files.append(path)
    return files


def open_log(path: Path):  # -> BinaryIO
    """Open one log file for binary reading, decompressing when it is gzip (by content, not name)."""
    fh = open(path, "rb")
    if fh.read(2) == _GZIP_MAGIC:
        fh.close()
        return gzip.open(path, "rb")
    fh.seek(0)
    return fh


def iter_lines(path: str | Path) -> Iterator[bytes]:
    """The lines (with their ``\\n``) of the session log ``path`` names, across rotated and
    compressed files, oldest first. Raises OSError (e.g. FileNotFoundError) like ``open``, also
    for a damaged ``.gz``, so every reader reports it as the unreadable file it is."""
    for file in session_files(path):
        with open_log(file) as fh:
            try:
                yield from fh
            except EOFError as exc:  # a truncated .gz
                raise OSError(f"{file}: compressed file ends early ({exc})") from None
            except zlib.error as exc:  # a corrupt deflate stream (neither OSError nor EOFError)
                raise OSError(f"{file}: compressed file is corrupt ({exc})") from None
