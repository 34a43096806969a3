"""Canonical JSON and content digests (AEP-0003 §9.3)."""

from __future__ import annotations

import hashlib
import json
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import orjson

# What ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` builds on
# every call, built once: digests are on the per-event hot path.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
# The C encoder ``_ENCODER.encode`` would build anew on each call, built once too (same arguments,
# so the same bytes). No circular-reference markers: a shared markers dict is not safe across
# threads, and a value decoded from JSON cannot be circular (one that is still fails, with
# RecursionError instead of ValueError). None where the interpreter has no C accelerator.
_C_ENCODE = (
    c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",", True, False, True)
    if c_make_encoder is not None else None
)
_sha256 = hashlib.sha256


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 left unescaped: the form digests are taken over."""
    if isinstance(value, str):
        return encode_basestring(value)
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


def _plain(node: dict[Any, Any] | list[Any]) -> bool:
    """True when ``node`` holds only dicts, lists, str, int, bool and None (exact types, no float),
    all the way down: the values orjson writes byte for byte as ``canonical_json`` does."""
    for item in node.values() if node.__class__ is dict else node:
        kind = item.__class__
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if (kind is dict or kind is list) and _plain(item):
            continue
        return False
    return True


_SORTED = orjson.OPT_SORT_KEYS


def digest(value: Any) -> str:
    """SHA-256 over the canonical JSON of the original (pre-redaction) value, first 32 hex.

    A dict or list of plain JSON values (``_plain``: no float, whose text differs, e.g. ``1e-05``
    against orjson's ``0.00001``, no subclass and nothing orjson writes that the standard encoder
    refuses) is encoded by orjson with sorted keys, the same bytes at a fifth of the cost (UTF-8
    unescaped, the same escapes of every code point, keys in code point order); what it refuses
    (a key that is not a str, an integer beyond 64 bits) and everything else take
    ``canonical_json``. ``tests/test_digest_fastpath.py`` holds the two equal.
    """
    kind = value.__class__
    if (kind is dict or kind is list) and _plain(value):
        try:
            return _sha256(orjson.dumps(value, option=_SORTED)).hexdigest()[:32]
        except TypeError:  # orjson.JSONEncodeError is one
            pass
    return _sha256(canonical_json(value).encode("utf-8")).hexdigest()[:32]
