"""``canonical.digest`` (orjson for plain dicts and lists) gives what the SHA-256 of
``canonical_json`` gives, for every value (issue 16).

Held over every JSON value in the corpus fixtures, over generated values (every code point in keys
and strings, key orders, nesting, integers at the 64-bit edges) and over what the fast path must
leave to ``canonical_json``: floats, NaN and infinities, keys that are not strings, subclasses,
tuples, and values the standard encoder refuses (which must still be refused, alike).
"""

from __future__ import annotations

import enum
import hashlib
import json
import random
import uuid
from collections import OrderedDict
from typing import Any

import pytest
from aep_collector.pipeline import canonical

from tests.conftest import FIXTURES


def reference(value: Any) -> str:
    """The digest as it was before the fast path: SHA-256 over ``canonical_json`` alone."""
    return hashlib.sha256(canonical.canonical_json(value).encode("utf-8")).hexdigest()[:32]


def outcome(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "digest", fn(value)
    except Exception as exc:  # the same refusal, by type
        return "refused", type(exc)


def check(value: Any) -> None:
    assert outcome(canonical.digest, value) == outcome(reference, value), value


def corpus_values() -> list[Any]:
    """Every dict and list inside every fixture file, the files themselves included."""
    out: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, (dict, list)):
            out.append(node)
            for item in node.values() if isinstance(node, dict) else node:
                walk(item)

    for path in sorted(FIXTURES.rglob("*.json")):
        walk(json.loads(path.read_text()))
    return out


def test_corpus_values_digest_as_before() -> None:
    values = corpus_values()
    assert len(values) > 1000
    for value in values:
        check(value)


def test_every_code_point_in_keys_and_strings() -> None:
    chars = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    for at in range(0, len(chars), 512):
        chunk = chars[at:at + 512]
        check({"k" + c: ["a" + c + "b", c] for c in chunk})
        check(["".join(chunk)])


def random_string(rng: random.Random) -> str:
    pools = [(0, 0x7F), (0, 0x1F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    out = []
    for _ in range(rng.randint(0, 6)):
        lo, hi = rng.choice(pools)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 4 and roll < 0.2:
        return {random_string(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}
    if depth < 4 and roll < 0.35:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return rng.choice([
        random_string(rng), rng.randint(-10, 10), rng.choice([True, False, None]),
        rng.choice([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30]),
    ])


def test_generated_values_digest_as_before() -> None:
    rng = random.Random(16)
    for _ in range(20_000):
        check({"v": random_value(rng)})
        check([random_value(rng)])


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Text(str):
    pass


ODD = [
    {"x": 1.0}, {"x": 0.1}, {"x": 1e-05}, {"x": 1e16}, {"x": -0.0}, [5e-324], [1.7976931348623157e308],
    [float("nan")], {"x": float("inf")}, [float("-inf")], {"deep": [[{"x": 2.5}]]},
    {1: "int key"}, {None: "null key"}, {True: 1}, {"a": 1, 2: "mixed keys"},
    {"big": 2**64}, [-(2**63) - 1], {"t": (1, "two")}, [(1, 2)],
    {"s": Text("sub")}, {"k": Level.HIGH}, [Color.RED], {"u": uuid.UUID(int=7)}, OrderedDict(b=1, a=2),
    {"o": OrderedDict(b=1, a=2)}, {"b": b"bytes"}, {"lone": "\ud800"}, {"\udfff": 1}, {"set": {1}},
    "text", 7, 1.5, None, True, (1, 2), [], {}, [[]], [{}],
]


@pytest.mark.parametrize("value", ODD, ids=[repr(v)[:40] for v in ODD])
def test_what_the_fast_path_leaves_digests_as_before(value: Any) -> None:
    check(value)


def test_plain_takes_only_exact_json_types() -> None:
    assert canonical._plain({"a": ["b", 1, True, None, {"c": []}]})
    for odd in ({"x": 1.0}, [Text("s")], [(1,)], {"o": OrderedDict()}, [Level.HIGH], [uuid.UUID(int=1)]):
        assert not canonical._plain(odd), odd
