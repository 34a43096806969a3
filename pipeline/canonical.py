"""Canonical JSON and content digests (AEP-0003 §9.3)."""

from __future__ import annotations

import hashlib
import json
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

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


def digest(value: Any) -> str:
    """SHA-256 over the canonical JSON of the original (pre-redaction) value, first 32 hex."""
    return _sha256(canonical_json(value).encode("utf-8")).hexdigest()[:32]
