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
# threads, and a value decoded from JSON cannot be circular (one that still is gets refused with
# ValueError by ``_deep_json``, once the recursion gives up). None where there is no C accelerator.
_C_ENCODE = (
    c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",", True, False, True)
    if c_make_encoder is not None else None
)
_sha256 = hashlib.sha256


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 left unescaped: the form digests are taken over.

    Any depth: a value nested past what the recursive encoder reaches takes ``_deep_json``."""
    if isinstance(value, str):
        return encode_basestring(value)
    try:
        if _C_ENCODE is None:
            return _ENCODER.encode(value)
        return "".join(_C_ENCODE(value, 0))
    except RecursionError:
        return _deep_json(value)


def _deep_json(value: Any) -> str:
    """``canonical_json`` without recursion: the same text for a value nested past Python's
    recursion limit (the encoder's walk on an explicit stack; each leaf still goes through the
    encoder). A value that contains itself is refused with ``ValueError``, as the standard
    encoder's circular check would, instead of being walked forever."""
    out: list[str] = []
    todo: list[Any] = [value]  # values still to write, and _Text to copy out as it is
    path: set[int] = set()  # the containers being written: one met again inside itself is circular
    while todo:
        node = todo.pop()
        if node.__class__ is _Text:
            out.append(node.text)
            if node.leaving is not None:
                path.discard(node.leaving)
            continue
        if node is None or node is True or node is False or isinstance(node, str | int | float):
            out.append(canonical_json(node))
            continue
        if isinstance(node, list | tuple):
            items: list[Any] = list(node)
            step, opener, closer = 1, "[", "]"
        elif isinstance(node, dict):
            pairs = list(node.items())
            pairs.sort()  # what the encoder does with sort_keys: sorts the (key, value) pairs
            items = []
            for key, item in pairs:
                items += (_Text(encode_basestring(_key(key)) + ":"), item)
            step, opener, closer = 2, "{", "}"
        else:
            out.append(canonical_json(node))  # not JSON: refused (TypeError) as the encoder does
            continue
        if not items:
            out.append(opener + closer)
            continue
        if id(node) in path:
            raise ValueError("Circular reference detected")
        path.add(id(node))
        out.append(opener)
        todo.append(_Text(closer, id(node)))
        for at in range(len(items) - step, -1, -step):  # pushed last first: popped in order
            todo.extend(reversed(items[at:at + step]))
            if at:
                todo.append(_Text(","))
    return "".join(out)


class _Text:
    """Text ``_deep_json`` copies out as it is (a separator, a key and its colon, a closing
    bracket: ``leaving`` is then the id of the container it closes)."""

    __slots__ = ("text", "leaving")

    def __init__(self, text: str, leaving: int | None = None) -> None:
        self.text, self.leaving = text, leaving


def _key(key: Any) -> str:
    """A dict key as the standard encoder writes it (``sort_keys``, no ``skipkeys``)."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return canonical_json(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


_ORJSON_DEPTH = 254
"""The deepest nesting ``orjson.dumps`` writes; past it, it refuses (so ``_plain`` stops looking)."""


def _plain(node: dict[Any, Any] | list[Any], depth: int = 1) -> bool:
    """True when ``node`` holds only dicts, lists, str, int, bool and None (exact types, no float),
    all the way down and no deeper than orjson writes: the values orjson writes byte for byte as
    ``canonical_json`` does. Bounded by that depth, so the recursion never nears Python's limit."""
    if depth > _ORJSON_DEPTH:
        return False
    for item in node.values() if node.__class__ is dict else node:
        kind = item.__class__
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if (kind is dict or kind is list) and _plain(item, depth + 1):
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
