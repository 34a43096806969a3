"""The §9.4 redactor beyond the corpus: order, configuration edges, hardening, properties."""

from __future__ import annotations

import pytest
from aep_collector.processors.capture import Redactor
from aep_collector.processors.capture.redact import PII, SECRET
from hypothesis import given
from hypothesis import strategies as st

R = Redactor(home="/home/dev")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=foo@bar.com", f"password={SECRET}"),  # (a) before (d)
        ("GITHUB_TOKEN=ghx123 and input_tokens: 5", f"GITHUB_TOKEN={SECRET} and input_tokens: 5"),
        ('{"password": "it\'s me", "user": "bob"}', f'{{"password": "{SECRET}", "user": "bob"}}'),
        ('arg {\\"token\\": \\"abc\\"}', f'arg {{\\"token\\": \\"{SECRET}\\"}}'),
        ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: {SECRET}"),
        ("Authorization: Basic abc=", f"Authorization: {SECRET}"),
        ("psql postgres://app:hunter2@db/x", f"psql postgres://app:{SECRET}@db/x"),
        ("-----BEGIN PRIVATE KEY-----\nMIIEv (truncated", SECRET),
        ("temp ASIAABCDEFGHIJKLMNOP", f"temp {SECRET}"),
        ("stripe sk_live_abcdefghij12", f"stripe {SECRET}"),
        ("cd /home/dev/app && ls /home/dev", "cd ~/app && ls ~"),
        ("/home/developer/x stays someone else's home", "~/x stays someone else's home"),
        ("C:\\Users\\ann\\repo", "~\\repo"),
        ("ring 555-123-4567 on 2026-07-03 from 10.0.0.1 with node 1.22.11.0", f"ring {PII} on 2026-07-03 from 10.0.0.1 with node 1.22.11.0"),
        ("mail a.b@example.org", f"mail {PII}"),
        ("the secret: love, the secret sauce: salt", f"the secret: {SECRET} the secret sauce: salt"),
    ],
)
def test_text(text: str, expected: str) -> None:
    assert R.text(text) == expected


def test_configured_home_is_replaced_at_a_path_boundary_only() -> None:
    assert Redactor(home="/srv/dev/").text("/srv/dev/a /srv/devx/b /srv/dev") == "~/a /srv/devx/b ~"


@pytest.mark.parametrize("home", ["/", "", "C:\\"])
def test_a_root_like_home_is_ignored(home: str) -> None:
    assert Redactor(home=home).text("/usr/bin/env") == "/usr/bin/env"


def test_short_configured_values_are_ignored_and_longest_wins() -> None:
    r = Redactor(secret_values=["abc", "deploy-key", "deploy-key-2"], home="")
    assert r.text("abc deploy-key-2 deploy-key") == f"abc {SECRET} {SECRET}"


def test_pii_switch() -> None:
    assert Redactor(pii=False, home="").text("ops@example.com +1 555 123 4567") == "ops@example.com +1 555 123 4567"


def test_value_recursion_keys_and_scalars() -> None:
    value = {"Authorization": None, "x-api-key": "k", "client_secret": {"a": 1}, "tokens": 3,
             "list": [{"password": "p"}, "AKIAIOSFODNN7EXAMPLE", 1.5, True, None]}
    assert R.value(value) == {"Authorization": None, "x-api-key": SECRET, "client_secret": SECRET, "tokens": 3,
                              "list": [{"password": SECRET}, SECRET, 1.5, True, None]}


@given(st.text())
def test_redaction_is_idempotent(text: str) -> None:
    once = R.text(text)
    assert R.text(once) == once


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40),
       st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40))
def test_a_planted_key_never_survives(before: str, after: str) -> None:
    secret = "AKIAIOSFODNN7EXAMPLE"
    assert secret not in R.text(f"{before} {secret} {after}")


def test_a_large_identifier_like_blob_is_redacted_in_one_pass() -> None:
    # Regression: unanchored key/email prefixes made this input quadratic (minutes per call).
    blob = "QUJD" * 25_000 + " token=abc123def " + "a." * 25_000
    out = R.text(blob)
    assert "abc123def" not in out and out.startswith("QUJD") and SECRET in out


@pytest.mark.parametrize("text", [
    "aws_secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY in env",
    "X=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    '{"SecretAccessKey": "je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY"}',
])
def test_a_bare_aws_secret_access_key_is_a_secret(text: str) -> None:
    out = R.text(text)
    assert "EXAMPLEKEY" not in out and SECRET in out and R.sensitive(text)


@pytest.mark.parametrize("text", [
    "commit 3f786850e387550fdab836ed7e6dc881de23001b",  # a sha1: no capitals
    "AbstractSingletonProxyFactoryBeanBuilder",  # 40 letters of CamelCase, no digit
    "src/components/button/group2/index/a/b/c",  # a path in lower case
    "a/b/c/d/e/f/g/h/Jj/K1/LLLLLLLLLLLLLLLLLL",  # ten slashes: a path, not base64
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEYS",  # 41 characters: part of something longer
])
def test_forty_character_lookalikes_are_left_alone(text: str) -> None:
    assert len(text.split()[-1]) in (40, 41)
    assert R.text(text) == text and not R.sensitive(text)


@given(st.integers(0, 2**32 - 1))
def test_random_aws_secrets_are_caught(seed: int) -> None:
    import base64
    import random

    secret = base64.b64encode(random.Random(seed).randbytes(30)).decode()  # how AWS mints them
    assert secret not in R.text(f"key {secret} end")


@given(st.text(alphabet="AKISeyJghlpat-xosnmz_vetiw ", max_size=12))
def test_the_shape_prefilter_is_the_literal_list(text: str) -> None:
    from aep_collector.processors.capture.redact import _SHAPE_LITERALS, _may_hold_shape

    assert _may_hold_shape(text) == any(literal in text for literal in _SHAPE_LITERALS)
    for literal in _SHAPE_LITERALS:
        assert _may_hold_shape(text + literal)


def test_text_results_are_the_same_from_the_memo() -> None:
    red = Redactor(home="/nonexistent-home")
    text = "token=abcdefgh1234 mail a@b.io"
    first = red.text(text)
    assert red.text(text) == first == Redactor(home="/nonexistent-home").text(text)
    assert SECRET in first and PII in first
