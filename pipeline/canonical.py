"""Canonical JSON and content digests (AEP-0003 §9.3)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# What ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` builds on
# every call, built once: digests are on the per-event hot path.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 left unescaped: the form digests are taken over."""
    return _ENCODER.encode(value)


def digest(value: Any) -> str:
    """SHA-256 over the canonical JSON of the original (pre-redaction) value, first 32 hex."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()[:32]
