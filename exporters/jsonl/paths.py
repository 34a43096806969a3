"""Session ids to file names that never escape their directory and never collide.

Never collide on a case-sensitive filesystem: names are kept in their letter case (plain names
pass unchanged, so existing logs keep their names), so on a case-insensitive one two ids that
differ only in case name one file, whose lines each still carry their own ``session``.
"""

from __future__ import annotations

import hashlib
import re

_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
MAX_NAME = 200  # bytes, leaving room for ".jsonl" and repair suffixes under NAME_MAX (255)
AGENT_FILE = "_agent"  # agent-scoped events; no encoded session can start with "_"


def encode_name(name: str) -> str:
    """Percent-encode ``name`` into one safe path segment.

    Plain names (``^[A-Za-z0-9][A-Za-z0-9._-]*$``) pass unchanged. Any other name has every byte
    outside ``[A-Za-z0-9._-]`` and its first byte (unless alphanumeric) percent-encoded; ``%`` is
    always encoded, so the mapping is injective. ``..``, ``/``, NUL, absolute paths and dotfiles
    all become names inside the directory. Over-long names keep a prefix plus a SHA-256 tail.
    """
    if _PLAIN.match(name) and not name.endswith("."):
        out = name
    else:
        raw = name.encode("utf-8", "surrogatepass")
        parts = []
        for i, b in enumerate(raw):
            if b in _SAFE and not (i == 0 and not chr(b).isalnum()) and not (i == len(raw) - 1 and b == 0x2E):
                parts.append(chr(b))
            else:
                parts.append(f"%{b:02X}")
        out = "".join(parts) or "%"
    if len(out) > MAX_NAME:
        tail = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        out = f"{out[:MAX_NAME - 34]}~{tail}"
    return out
