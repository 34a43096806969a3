"""The one place JSON becomes data (``loads``) and events become bytes (``dumps_bytes``).

``loads`` is the decoder every receiver uses for a request body, so every input guarantee holds
the same way everywhere: the body must be UTF-8 JSON (RFC 8259: no NaN/Infinity, no number that
overflows a float, no integer of more than ``sys.get_int_max_str_digits()`` digits, no nesting
deeper than ``MAX_DEPTH``), and a lone
surrogate escape (``"\ud800"``, which JavaScript's ``JSON.stringify`` emits for a broken UTF-16
string) is accepted and becomes U+FFFD, the Unicode replacement character, in keys and values
alike. Nothing downstream (stamping, file names, the relay) ever sees a string that cannot be
encoded as UTF-8.

orjson does the encoding: it is an order of magnitude faster than the standard library on the
per-event hot path and emits the same compact, UTF-8, unescaped form. What it cannot encode
(integers beyond 64 bits) falls back to the standard library with every non-ASCII character
escaped, which is lossless and always valid UTF-8.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import orjson

# Characters str.splitlines() and some JSONL readers treat as line breaks; JSON lets us escape
# them, so one event is always exactly one line for every reader (orjson already escapes C0).
_LINE_BREAKS = re.compile(b"\xc2\x85|\xe2\x80[\xa8\xa9]")
_ESCAPES = {b"\xc2\x85": b"\\u0085", b"\xe2\x80\xa8": b"\\u2028", b"\xe2\x80\xa9": b"\\u2029"}


# A body may hold a surrogate only as a \\uD800-\\uDFFF escape (strict UTF-8 refuses encoded ones):
# only bodies that contain one pay for the walk that replaces the lone ones.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE_ESCAPE_TEXT = re.compile(r"\\u[dD][89abcdefABCDEF]|[\ud800-\udfff]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


MAX_DEPTH = 200
"""Deepest nesting of arrays and objects a body may have (``{"a": 1}`` is 1). Everything an
accepted body becomes must stay encodable by orjson, which refuses past 254 levels (the event's own
envelope adds a few), and walkable without hitting Python's recursion limit: a deeper body is a 400
naming the problem, never an event accepted and then lost on the way to disk."""
_DEPTH_MSG = f"nesting deeper than {MAX_DEPTH} levels"


class DecodeError(ValueError):
    """A body that is not acceptable JSON; the message names the problem for a 400 reply."""


def _constant(name: str) -> Any:
    raise DecodeError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise DecodeError(f"number {text[:40]} is out of range")
    return value


# One decoder for every body: ``json.loads`` with hooks would build a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_finite)


# A run of 19 digits may be an integer beyond 64 bits, which orjson reads as a float. Found by
# mapping every digit to "0" and anything else to " " (two C passes; a regex is four times slower).
_DIGITS_ONLY = bytes(ord("0") if ord("0") <= i <= ord("9") else ord(" ") for i in range(256))
_LONG_RUN = b"0" * 19


def loads(raw: bytes | str) -> Any:
    """Decode a request body (see the module docstring); ``DecodeError`` says what is wrong.

    A body orjson accepts decodes to what ``loads_exact`` gives (three times faster on a hook's
    body): orjson refuses what the rules refuse (bad UTF-8, NaN/Infinity, numbers beyond a
    float, lone surrogates: none needs scrubbing then), and bodies with a 19-digit run go
    straight to ``loads_exact``. What orjson refuses also goes there, which accepts it or says
    what is wrong in its own words. ``tests/test_wire_fastpath.py`` holds the two equal.
    """
    if isinstance(raw, str):
        # A text frame (WebSocket) takes the same path as its UTF-8 bytes, which decode to the same
        # value: the standard library's decoder took 2.5 times as long on a relay's pong. Only text
        # holding a lone surrogate has no UTF-8 form; it is decoded as it is.
        try:
            raw = raw.encode("utf-8")
        except UnicodeEncodeError:
            return loads_exact(raw)
    if _LONG_RUN not in raw.translate(_DIGITS_ONLY):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            if _may_be_deep(raw):
                _check_depth(value)
            return value
    return loads_exact(raw)


def _may_be_deep(raw: bytes) -> bool:
    """Whether ``raw`` holds enough brackets to nest past ``MAX_DEPTH``: two C-speed counts, so only
    the rare body with that many (a deep one, or brackets in its strings) pays for ``_check_depth``."""
    return len(raw) > 2 * MAX_DEPTH and raw.count(b"{") + raw.count(b"[") > MAX_DEPTH


def _check_depth(value: Any) -> None:
    """``DecodeError`` when ``value`` nests deeper than ``MAX_DEPTH``; iterative (no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if node.__class__ is not dict and node.__class__ is not list:
            continue
        if depth > MAX_DEPTH:
            raise DecodeError(_DEPTH_MSG)
        for item in node.values() if node.__class__ is dict else node:
            if item.__class__ is dict or item.__class__ is list:
                stack.append((item, depth + 1))


def loads_exact(raw: bytes | str) -> Any:
    """``loads`` by the standard library's decoder alone: the reference its fast path is held to."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"body is not UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    if not text.strip():
        raise DecodeError("empty body: expected a JSON value")
    try:
        value = _DECODER.decode(text)
    except DecodeError:
        raise
    except json.JSONDecodeError as exc:
        raise DecodeError(f"line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise DecodeError(_DEPTH_MSG) from None
    except ValueError:  # int(): Python refuses to convert integers beyond the digit limit
        raise DecodeError(f"an integer has more than {sys.get_int_max_str_digits()} digits") from None
    if text.count("{") + text.count("[") > MAX_DEPTH:  # the slow path: counted on the text either way
        _check_depth(value)
    if (_SURROGATE_ESCAPE.search(raw) if isinstance(raw, bytes) else _SURROGATE_ESCAPE_TEXT.search(text)):
        value = scrub(value)
    return value


def scrub_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (pairs were already joined by the parser)."""
    return _LONE_SURROGATE.sub(REPLACEMENT, text)


def scrub(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings and keys replaced; iterative (no depth limit)."""
    if isinstance(value, str):
        return scrub_text(value)
    if not isinstance(value, dict | list):
        return value
    root: list[Any] = [value]
    stack: list[tuple[Any, Any, Any]] = [(root, 0, value)]
    while stack:
        parent, slot, node = stack.pop()
        if isinstance(node, dict):
            fresh: dict[str, Any] = {}
            for k, v in node.items():
                fresh[scrub_text(k)] = v
            parent[slot] = fresh
            for k, v in fresh.items():
                if isinstance(v, str):
                    fresh[k] = scrub_text(v)
                elif isinstance(v, dict | list):
                    stack.append((fresh, k, v))
        else:
            for i, v in enumerate(node):
                if isinstance(v, str):
                    node[i] = scrub_text(v)
                elif isinstance(v, dict | list):
                    stack.append((node, i, v))
    return root[0]


def dumps_bytes(event: dict[str, Any]) -> bytes:
    """The event's wire bytes: compact JSON, UTF-8, line-breaking characters escaped."""
    try:
        raw = orjson.dumps(event)
    except (TypeError, orjson.JSONEncodeError):
        raw = json.dumps(event, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    # The line breaks are multi-byte: an ASCII line (a C-speed check) has none, and a line with
    # non-ASCII text pays C substring searches; the regex runs only where one was found.
    if not raw.isascii() and (b"\xe2\x80" in raw or b"\xc2\x85" in raw) and _LINE_BREAKS.search(raw):
        raw = _LINE_BREAKS.sub(lambda m: _ESCAPES[m.group()], raw)
    return raw


def dumps_line(event: dict[str, Any]) -> bytes:
    """``dumps_bytes(event) + b"\\n"``, the event's JSONL line, built in one buffer (no copy)."""
    try:
        raw = orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)
    except (TypeError, orjson.JSONEncodeError):
        return dumps_bytes(event) + b"\n"
    if not raw.isascii() and (b"\xe2\x80" in raw or b"\xc2\x85" in raw) and _LINE_BREAKS.search(raw):
        raw = _LINE_BREAKS.sub(lambda m: _ESCAPES[m.group()], raw)
    return raw


def dumps(event: dict[str, Any]) -> str:
    """The same bytes as text: the WebSocket frame of an event."""
    return dumps_bytes(event).decode("utf-8")
