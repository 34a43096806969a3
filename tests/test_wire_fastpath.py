"""``wire.loads`` (orjson first) decodes every body to what ``wire.loads_exact`` (the standard
library's decoder with the collector's rules) gives, or refuses it with the same message (issue 16).

Held over the corpus hook inputs encoded several ways and over generated bodies: numbers at the
edges of 64-bit integers and of doubles, strings with escapes and surrogates, and broken bodies.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from aep_collector.pipeline import wire

from tests.conftest import FIXTURES


def outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "value", decode(raw)
    except wire.DecodeError as exc:
        return "refused", str(exc)


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (1 is not 1.0, -0.0 is not 0.0), keys in order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


def check(raw: bytes) -> None:
    fast, exact = outcome(wire.loads, raw), outcome(wire.loads_exact, raw)
    assert fast[0] == exact[0] and (same(fast[1], exact[1]) if fast[0] == "value" else fast[1] == exact[1]), raw[:200]


def corpus_inputs() -> list[Any]:
    out = []
    for path in sorted((FIXTURES / "mappings").glob("*.json")):
        hooks = json.loads(path.read_text(encoding="utf-8")).get("hooks") or {}
        out += [hooks[key]["input"] for key in sorted(hooks) if isinstance(hooks[key], dict) and "input" in hooks[key]]
    return out


def test_the_corpus_hook_inputs_decode_the_same_however_encoded() -> None:
    inputs = corpus_inputs()
    assert len(inputs) > 100
    for value in inputs:
        for raw in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode(),
                    json.dumps(value, indent=2, ensure_ascii=False).encode()):
            check(raw)


EDGE_NUMBERS = [
    "0", "-0", "0.0", "-0.0", "1", "-1", "1e0", "1E+2", "1e-2", "123456789012345678", "-123456789012345678",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
    "18446744073709551615", "18446744073709551616", "99999999999999999999999", "-99999999999999999999999",
    "1" * 4301, "1e400", "-1e400", "1e-400", "1.7976931348623157e308", "1.7976931348623159e308",
    "5e-324", "2.4703282292062328e-324", "2.2250738585072011e-308", "0.30000000000000004441",
    "9007199254740993", "9007199254740993.0", "1.00000000000000011102230246251565404236316680908203125",
    "123456789012345678901234567890e-10", "0.1e1", "1.5e19",
]


@pytest.mark.parametrize("number", EDGE_NUMBERS)
def test_numbers_at_the_edges(number: str) -> None:
    check(number.encode())
    check(f'{{"n": {number}, "list": [{number}, "{number}"]}}'.encode())


def test_generated_numbers() -> None:
    rng = random.Random(16)
    for _ in range(3000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 24))).lstrip("0") or "0"
        sign = rng.choice(["", "-"])
        kind = rng.randrange(4)
        if kind == 0:
            text = sign + digits
        elif kind == 1:
            text = f"{sign}{digits[:1]}.{digits[1:] or '0'}e{rng.randint(-330, 310)}"
        elif kind == 2:
            text = repr(rng.uniform(-1e6, 1e6) * 10.0 ** rng.randint(-300, 300))
        else:
            text = f"{sign}{digits}.{rng.randint(0, 10**rng.randint(1, 20))}"
        check(f'{{"v":{text}}}'.encode())


STRINGS = [
    '"plain"', '"\\u00e9 caf\u00e9"', '"\\ud83d\\ude00"', '"\U0001F600"', '"\\ud800"', '"\\udc00x"',
    '"a\\ud800\\ud800b"', '{"\\ud800": "k"}', '"\\u0000\\n\\t\\"\\\\\\/"', '"\\u2028\\u2029\u0085"',
    '{"a": 1, "a": 2}', '{"b": 1, "a": 2}', "[]", "{}", '"x"', "true", "null", ' {"a": [1, 2]} \n\t',
]
BROKEN = [
    b"", b"   ", b"{", b'{"a": }', b"[1,]", b"NaN", b"Infinity", b"-Infinity", b'{"a": NaN}', b"\xef\xbb\xbf{}",
    b'"\x01"', b'{"a":"\xc3"}', b'"\xed\xa0\x80"', b"{} {}", b"{}x", b"01", b"+1", b".5", b"1.", b"'a'",
    b"[" * 1100 + b"]" * 1100, b"[" * 100_000, b"\x00", b'{"a":1}\x00',
]


@pytest.mark.parametrize("raw", [s.encode() for s in STRINGS] + BROKEN)
def test_strings_surrogates_and_broken_bodies(raw: bytes) -> None:
    check(raw)


def test_generated_documents() -> None:
    rng = random.Random(61)
    alphabet = ["a", "\u00e9", "\U0001F600", "\\n", "\\u00e9", "\\ud83d\\ude00", "\\ud800", '\\"', " ", "7"]

    def text() -> str:
        return '"' + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) + '"'

    def value(depth: int) -> str:
        kind = rng.randrange(7 if depth < 4 else 4)
        if kind == 0:
            return text()
        if kind == 1:
            return str(rng.randint(-(10**21), 10**21))
        if kind == 2:
            return repr(rng.random() * 10.0 ** rng.randint(-20, 25))
        if kind == 3:
            return rng.choice(["true", "false", "null"])
        if kind in (4, 5):
            return "{" + ",".join(f"{text()}:{value(depth + 1)}" for _ in range(rng.randint(0, 4))) + "}"
        return "[" + ",".join(value(depth + 1) for _ in range(rng.randint(0, 4))) + "]"

    for _ in range(2000):
        check(value(0).encode())


def test_a_text_body_takes_the_exact_path_unchanged() -> None:
    assert same(wire.loads('{"a": 1.5, "b": "\\ud800"}'), {"a": 1.5, "b": "\ufffd"})



def check_text(text: str) -> None:
    fast, exact = outcome(wire.loads, text), outcome(wire.loads_exact, text)  # type: ignore[arg-type]
    assert fast[0] == exact[0] and (same(fast[1], exact[1]) if fast[0] == "value" else fast[1] == exact[1]), text[:200]


def test_text_decodes_as_the_exact_decoder_reads_it() -> None:
    """A ``str`` (a WebSocket text frame) goes the fast way as its UTF-8 bytes: the same value or
    the same refusal as the standard library's decoder reading the text itself."""
    for value in corpus_inputs():
        check_text(json.dumps(value, ensure_ascii=False))
        check_text(json.dumps(value))
    for number in EDGE_NUMBERS:
        check_text(f'{{"n": {number}, "list": [{number}, "{number}"]}}')
    for text in ['{"type":"pong","t":5703769}', '{"a": "\\ud800"}', '{"a": "\ud83d\ude00"}', '{"a": "\ud800"}',
                 '{"a": "lone \ud800 literal"}', '"\u2028"', "", "  ", "{", '{"a": NaN}', '{"a": 1}x', "[1, 2,]",
                 '{"k": "caf\u00e9 \u00e9"}', "\ufeff{}"]:
        check_text(text)
