"""The one place events become bytes, so a re-sent event is byte-identical to the first send.

orjson does the encoding: it is an order of magnitude faster than the standard library on the
per-event hot path and emits the same compact, UTF-8, unescaped form. What it cannot encode
(integers beyond 64 bits, lone surrogates from a ``\ud800`` escape in a vendor payload) falls back
to the standard library with every non-ASCII character escaped, which is lossless and always valid
UTF-8. Receivers refuse NaN and infinities, which are not JSON, before anything reaches here.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# Characters str.splitlines() and some JSONL readers treat as line breaks; JSON lets us escape
# them, so one event is always exactly one line for every reader (orjson already escapes C0).
_LINE_BREAKS = re.compile(b"\xc2\x85|\xe2\x80[\xa8\xa9]")
_ESCAPES = {b"\xc2\x85": b"\\u0085", b"\xe2\x80\xa8": b"\\u2028", b"\xe2\x80\xa9": b"\\u2029"}


def dumps_bytes(event: dict[str, Any]) -> bytes:
    """The event's wire bytes: compact JSON, UTF-8, line-breaking characters escaped."""
    try:
        raw = orjson.dumps(event)
    except (TypeError, orjson.JSONEncodeError):
        raw = json.dumps(event, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    if _LINE_BREAKS.search(raw):
        raw = _LINE_BREAKS.sub(lambda m: _ESCAPES[m.group()], raw)
    return raw


def dumps(event: dict[str, Any]) -> str:
    """The same bytes as text: the WebSocket frame of an event."""
    return dumps_bytes(event).decode("utf-8")
