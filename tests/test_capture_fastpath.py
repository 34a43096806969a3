"""The capture fast paths decide as the steps they skip would (issue 16).

A string kept as structure that ``redact.PLAIN_ID`` matches (a short plain id: a tool call id) is
kept without asking ``is_token`` and the detector; over generated strings rich in the token-shape
literals, such a string is a token the detector clears, the screen's two-pass form of it
(``PLAIN_RUN``, ``SHAPE_LITERAL``) answers as it does, and the screen answers as the general rule.

``apply_cap`` keeps, per route, whether the type's annotations declare any ``_redacted`` twin and
skips the twin walk when none is declared; the walk would have returned an equal copy. Routes of
drafts with neither a hint nor a declared level are kept under the type alone. Over every corpus
payload (``tests.test_capture_plan.PAYLOADS``) both are held to the general path.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from aep_collector.processors.capture import ceiling
from aep_collector.processors.capture.redact import (
    _SHAPE_LITERALS,
    PLAIN_ID,
    PLAIN_RUN,
    SHAPE_LITERAL,
    Redactor,
)
from aep_collector.processors.capture.structure import is_token, opaque

from tests.test_capture_plan import HOME, PAYLOADS


def test_no_declared_twin_means_the_twin_walk_changes_nothing() -> None:
    make = Redactor(home=HOME).value
    skipped = walked = 0
    for event_type, hint, data in PAYLOADS:
        ann, _plan = ceiling._merged(event_type, hint, data)
        twinned = ceiling._twins(copy.deepcopy(data), "", ann, make)
        if ceiling._declares_twins(ann):
            walked += 1
        else:
            assert twinned == data, event_type
            skipped += 1
    assert skipped and walked  # both sides of the switch are exercised by the corpus


@pytest.mark.parametrize("level", range(len(ceiling.LEVELS)), ids=ceiling.LEVELS)
def test_routes_kept_under_the_type_equal_deciding_anew(level: int) -> None:
    """A route table shared by hinted, declared and plain drafts of the same types caps each as
    ``cap_draft`` does with no routes, and keeps the plain drafts' routes under the bare type."""
    policy = ceiling.CapturePolicy(ceiling=ceiling.LEVELS[level], overrides={"attention": "redacted"})
    detector = Redactor(home=HOME)
    routes: dict[Any, Any] = {}
    for _ in range(2):
        for event_type, hint, data in PAYLOADS:
            for declared, with_hint in ((None, False), (None, True), ("metadata", False)):
                draft: dict[str, Any] = {"type": event_type, "agent": "codex", "session": "s1", "data": copy.deepcopy(data)}
                if with_hint and hint is not None:
                    draft["_capture"] = dict(hint)
                if declared is not None:
                    draft["capture"] = declared
                want = ceiling.cap_draft(copy.deepcopy(draft), policy, detector)
                assert ceiling.apply_cap(draft, policy, detector, routes) == want, (event_type, declared, with_hint)
    plain = {t for t, _, _ in PAYLOADS if not t.startswith("message.")}
    assert plain <= set(routes)


def _strings(n: int) -> list[str]:
    """Short strings of id characters, separators and shape-literal fragments, some with a literal."""
    rng = random.Random(16)
    alphabet = "AKISeyJghlpatxoskrnmuvIz_-.+/@:= 0189wqeZ"
    out = []
    for _ in range(n):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 44)))
        if rng.random() < 0.3:
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(_SHAPE_LITERALS) + text[at:]
        out.append(text)
    return out + ["toolu_01ABC", "call_9f", "a" * 39, "a" * 40, "Bash", "x.y+z", "sk-" + "a" * 30,
                  "ghp_" + "a" * 36, "AKIA" + "B" * 16, "eyJhbGciOi.eyJzdWIi.sig", "npm_" + "b" * 36]


@pytest.mark.parametrize("home", [HOME, None, "ab"])
def test_a_plain_id_is_a_token_the_detector_clears(home: str | None) -> None:
    detector = Redactor(home=home)
    matched = 0
    for text in _strings(20_000):
        if PLAIN_ID.fullmatch(text):
            matched += 1
            assert is_token(text) and not detector._detect(text), text
    assert 1_000 < matched < 19_000  # both sides exercised


def test_plain_id_in_two_passes_answers_as_plain_id() -> None:
    """The screen's ``PLAIN_RUN`` then ``SHAPE_LITERAL`` decide what ``PLAIN_ID`` does, its reference."""
    rng = random.Random(7)
    texts = _strings(20_000) + ["", "_a", "-a", ".a", "+a", "a" * 38 + "gh", "gh" + "a" * 37, "a\n", "a b", "é", "a/b"]
    texts += ["".join(rng.choice("ghAKIASeyJxok_-.+9z") for _ in range(rng.randint(1, 41))) for _ in range(20_000)]
    agree = 0
    for text in texts:
        two = PLAIN_RUN.fullmatch(text) is not None and SHAPE_LITERAL.search(text) is None
        assert two == (PLAIN_ID.fullmatch(text) is not None), text
        agree += two
    assert 1_000 < agree < len(texts) - 1_000  # both answers exercised


@pytest.mark.parametrize("level", [ceiling.NONE, ceiling.METADATA, ceiling.REDACTED])
@pytest.mark.parametrize("secrets", [(), ("pata", "ghp_")], ids=["no-secrets", "secrets"])
def test_the_screen_of_a_new_string_answers_as_the_general_rule(level: int, secrets: tuple[str, ...]) -> None:
    detector = Redactor(secret_values=secrets, home=HOME)
    screen = ceiling._screen(level, detector)
    assert screen is not None
    stand_in = detector.text if level == ceiling.REDACTED else opaque
    reference = Redactor(secret_values=secrets, home=HOME)
    for text in [*_strings(5_000), "call_pata_9", "pata"]:  # a configured value in a plain id
        for token in (True, False):
            want = stand_in(text) if (token and not is_token(text)) or reference.sensitive(text) else text
            assert screen(text, token) == want, (text, token)


def envelope_reference(out: dict[str, Any], screen: Any, detector: Redactor) -> None:
    """The envelope screen of ``apply_cap`` as it was, a loop over each tuple (the oracle)."""
    from aep_collector.processors.capture.structure import ENVELOPE_IDS, ENVELOPE_TOKEN

    # A value that is not a string is screened as the text the stamper will write for it.
    for name in ENVELOPE_TOKEN:
        if name in out:
            value = out[name]
            if value is not None and not isinstance(value, str):
                value = str(value)
            if isinstance(value, str):
                out[name] = screen(value, True)
    for name in ENVELOPE_IDS:
        if name in out:
            value = out[name]
            if value is not None and not isinstance(value, str):
                value = out[name] = str(value)
            if isinstance(value, str):
                hit = detector.verdicts.get(value)
                if hit or (hit is None and detector.sensitive(value)):
                    out[name] = opaque(value)


class _Text(str):
    pass


ENVELOPE_VALUES = ["Bash", "call_9f", "sk-" + "a" * 30, "a@example.com", "/home/alice/secret", "two words",
                   "", _Text("ghp_" + "b" * 36), 3, None, ["x"], {"k": "v"}]


@pytest.mark.parametrize("ceiling_", ["none", "metadata", "redacted", "full"])
def test_the_envelope_screen_answers_as_the_loops_over_its_tuples(ceiling_: str) -> None:
    policy = ceiling.CapturePolicy(ceiling=ceiling_, overrides={})
    detector = Redactor(home=HOME)
    reference = Redactor(home=HOME)
    screen = ceiling._screen(ceiling.rank(ceiling_), reference)
    rng = random.Random(5)
    absent = object()
    for _ in range(2_000):
        draft: dict[str, Any] = {"type": "tool.requested", "agent": "a", "data": {}}
        for name in ("subject", "session", "run", "step"):
            value = rng.choice([absent, *ENVELOPE_VALUES])
            if value is not absent:
                draft[name] = value
        got = ceiling.apply_cap(draft, policy, detector, {})
        want = dict(draft)
        if screen is not None:
            envelope_reference(want, screen, reference)
        for name in ("subject", "session", "run", "step"):
            assert (name in got) == (name in want), (draft, name)
            if name in want:
                assert got[name] == want[name] and type(got[name]) is type(want[name]), (draft, name)
