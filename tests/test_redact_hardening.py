"""§9.4 detectors where what precedes a secret used to hide it (adversarial review).

A key, home path or email right after a JSON escape (tool output that is itself JSON text), glued to
an identifier with `_`, a home behind a path prefix (WSL, Silverblue, backups), escaped path
separators, and a URL-encoded `@`: each is redacted by ``text`` and flagged by ``sensitive``, while
words that merely end in a shape's first letters (`task-`, `risk-`) stay, nothing the old patterns
caught is missed, and the literal pre-checks still prove a string clean.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CaptureConfig, CaptureProcessor, ceiling
from aep_collector.processors.capture import redact as rd
from aep_collector.processors.capture.redact import PII, SECRET, Redactor
from aep_collector.processors.mapping import MappingProcessor
from hypothesis import example, given, settings
from hypothesis import strategies as st

R = Redactor(home="/home/operator")
SK = "sk-proj-AbCdEf123456GhIjKl789012MnOp"
GHP = "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.SflKxwRJSMeKKF2QT4fwpM"
SLACK = "xoxb-123456789012-ABCDEFabcdef"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

# (text, what must not survive). Backslashes are literal: `\\n` is the two characters `\` and `n`.
GAPS = [
    ('{"log":"key rotated:\\n' + SK + '"}', SK),
    ('{"out":"new token\\n' + GHP + '"}', GHP),
    ('{"out":"session\\n' + JWT + '"}', JWT),
    ('{"row":"slack\\t' + SLACK + '"}', SLACK),
    ('{"a":"x\\r' + SK + '"}', SK),
    ('{"a":"x\\u003e' + SK + '"}', SK),
    ("OPENAI_KEY_" + SK, SK),
    ("KEY2" + SK, SK),
    ("GH_" + GHP, GHP),
    ("STRIPE_sk_live_abcdefghij12", "abcdefghij12"),
    ("キーは" + SK, SK),  # CJK prose has no spaces
    ('{"auth":"x\\nBearer abcdefgh12345678"}', "abcdefgh12345678"),
    ('{"k":"x\\n' + AWS_SECRET + '"}', AWS_SECRET),
    ('{"files":"a.txt\\n/home/alice/payroll/export.csv"}', "alice"),
    ("/mnt/c/Users/bob/Documents/plan.key", "bob"),
    ("/var/home/alice/payroll/export.csv", "alice"),
    ("/mnt/backup/home/alice/.ssh/id_rsa", "alice"),
    ("file:///c%3A/Users/bob/repo/a.py", "bob"),  # a VS Code URI
    ('{"cwd":"C:\\\\Users\\\\bob\\\\repo"}', "bob"),  # JSON text of C:\Users\bob
    ('{"cwd":"\\/home\\/alice\\/repo"}', "alice"),  # PHP-style escaped slashes
    ("c:\\users\\bob\\appdata", "bob"),  # os.path.normcase on Windows
    ("c:/users/bob/appdata", "bob"),
    ("D:\\backup\\Users\\bob\\x", "bob"),
    ("https://crm.example.com/search?email=alice.planted%40example.com", "alice.planted"),
    ("q=alice.planted%2540example.com", "alice.planted"),
    ('{"to":"alice.planted\\u0040example.com"}', "alice.planted"),
]


@pytest.mark.parametrize(("text", "needle"), GAPS)
def test_a_secret_path_or_email_glued_to_what_precedes_it_is_redacted_and_flagged(text: str, needle: str) -> None:
    assert needle not in Redactor(home="/home/operator").text(text)
    assert Redactor(home="/home/operator").sensitive(text)
    assert R.text(text) == R.text(R.text(text))  # and the result is stable


@pytest.mark.parametrize("text", [
    "task-" + "a" * 30, "risk-assessment-for-the-quarterly-review", "disk-usage-report-generator-v2",
    "ask-the-operator-before-deleting-anything", "laugh_" + "a" * 30, "weigh_" + "b" * 30,
    "mask-" + "x" * 25, "Bash", "gpt-5.2-codex", "general-purpose", "toolu_01ABCdefGHIjklMNOpqr",
])
def test_a_word_ending_in_a_shape_prefix_is_not_a_key(text: str) -> None:
    assert R.text(text) == text and not R.sensitive(text)


@pytest.mark.parametrize("text", [
    "GET https://api.example.com/v1/users/42",  # a lower-case /users/ route is not a Windows home
    "see /usr/share/doc and ~/notes",
    "ran 42 tests in 3.1s",
    "100% of 40 runs passed",
    "/home",  # no user segment
])
def test_what_is_not_a_home_or_an_email_stays(text: str) -> None:
    assert R.text(text) == text and not R.sensitive(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("/mnt/c/Users/bob/Documents/plan.key", "/mnt/c~/Documents/plan.key"),
    ("C:\\Users\\ann\\repo", "~\\repo"),
    ('"C:\\\\Users\\\\ann\\\\repo"', '"~\\\\repo"'),
    ("a.txt\\n/home/alice/x", "a.txt\\n~/x"),
    ("mail alice%40example.com now", f"mail {PII} now"),
    ("OPENAI_KEY_" + SK + " next", f"OPENAI_KEY_{SECRET} next"),
])
def test_what_the_hardened_detectors_leave(text: str, expected: str) -> None:
    assert R.text(text) == expected


def test_the_configured_home_is_found_in_escaped_spellings_and_still_at_a_boundary() -> None:
    red = Redactor(home="/srv/dev")
    assert red.text("\\/srv\\/dev\\/a /srv/devx/b //srv/dev") == "~\\/a /srv/devx/b ~"
    assert red.sensitive("x\\n\\/srv\\/dev\\/a") and not red.sensitive("/srv/devx/b")
    win = Redactor(home="C:\\Dev\\op")
    assert win.text('{"cwd":"C:\\\\Dev\\\\op\\\\repo"}') == '{"cwd":"~\\\\repo"}'


@pytest.mark.parametrize("text", ["/" * 200_000, "\\" * 200_000, "/home" * 40_000, "a\\n" * 70_000,
                                  "x%" * 100_000, "C:" * 100_000])
def test_long_runs_cost_linear_time(text: str) -> None:
    started = time.monotonic()
    R._redact(text)
    Redactor(home="/srv/dev")._detect(text)
    assert time.monotonic() - started < 5  # quadratic would be minutes


# --- never less than before -------------------------------------------------------------------

# The patterns as they were before this hardening: every character they matched is still matched.
_OLD = {
    "shapes": (re.compile(
        r"(?:AKIA|ASIA)[0-9A-Z]{16}|\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"
        r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\bglpat-[A-Za-z0-9_-]{20,}"
        r"|\bxox[baprs]-[A-Za-z0-9-]{10,}|\bsk-[A-Za-z0-9_-]{20,}|\b[rs]k_(?:live|test)_[A-Za-z0-9]{10,}"
        r"|\bnpm_[A-Za-z0-9]{30,}|\bAIza[0-9A-Za-z_-]{35}"), rd._TOKEN_SHAPES),
    "homes": (re.compile(r"(?<![\w.])(?:/home/|/Users/|[A-Za-z]:\\Users\\)[^/\\\s'\"`:;,)\]}]+"), rd._HOMES),
    "email": (re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
              rd._EMAIL),
    "aws": (re.compile(r"(?<![A-Za-z0-9/+_-])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=_-])"), rd._AWS_SECRET),
    "auth": (re.compile(r"\b(Bearer|Basic|Token)(\s+)[A-Za-z0-9\-._~+/]{8,}=*", re.IGNORECASE), rd._AUTH_SCHEME),
}
_PIECES = ["\\n", "\\t", "\\", "/", "home", "Users", "users", "C:", "c:", "a", "Z", "é", "_", "1", "-", ".", " ",
           "sk-", "ghp_", "eyJ", "xoxb-", "npm_", "AIza", "AKIA", "k_live_", "@", "%40", "%2540", "\\u0040",
           "example.com", "Bearer ", "x" * 12, "A1b2/" * 8, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"]
_TEXTS = st.lists(st.sampled_from(_PIECES), max_size=16).map("".join)


def _covered(pattern: re.Pattern[str], text: str) -> set[int]:
    return {i for m in pattern.finditer(text) for i in range(m.start(), m.end())}


@settings(max_examples=400)
@given(_TEXTS)
# Found by this test: read from the escape, the token swallowed the second scheme word and left its
# credential whole; bounded too eagerly, it left a token that runs on into a scheme word.
@example("\\nBearer " + "A1b2/" * 8 + "Bearer example.com")
@example("Bearer homeBearer ")
@example("\\nBearer ab/Bearer example.com")
def test_every_character_an_old_pattern_matched_is_still_matched(text: str) -> None:
    for name, (old, new) in _OLD.items():
        assert _covered(old, text) <= _covered(new, text), name


@settings(max_examples=400)
@given(_TEXTS)
def test_redacted_text_keeps_nothing_the_old_redactor_removed(text: str) -> None:
    # The old pipeline's secret, home and email matches are all gone from the new output.
    out = R.text(text)
    for name in ("shapes", "homes", "email"):
        for m in _OLD[name][0].finditer(text):
            if len(m.group(0)) >= 8:  # a short match (`/home/a`) can recur by chance in what is left
                assert m.group(0) not in out, (name, m.group(0))


# --- the fast paths stay sound ------------------------------------------------------------------

@settings(max_examples=400)
@given(_TEXTS)
def test_a_token_shape_match_always_holds_a_pre_check_literal(text: str) -> None:
    if rd._TOKEN_SHAPES.search(text):
        assert rd._may_hold_shape(text)
        assert rd.SHAPE_LITERAL.search(text)


@settings(max_examples=400)
@given(st.lists(st.sampled_from(["home", "Users", "users", "u0040", "40", "2540", "Bearer", "Token", "a", "Z", "0",
                                 "_", "-", ".", "+", "n", "t", "sk", "com", "example"]), max_size=20).map("".join))
def test_a_plain_string_without_a_literal_is_clean_by_every_pattern(text: str) -> None:
    """``_detect`` returns early on a ``_PLAIN`` string, and the screen keeps a ``PLAIN_RUN`` without a
    literal: no pattern but the token shapes may match one (and those need a literal)."""
    assert rd._PLAIN.fullmatch(text)
    for pattern in (rd._PEM, rd._AUTH_SCHEME, rd._URL_CREDENTIALS, rd._ASSIGNMENT, rd._EMAIL, rd._HOMES):
        assert pattern.search(text) is None, pattern.pattern
    if rd.SHAPE_LITERAL.search(text) is None:
        assert rd._TOKEN_SHAPES.search(text) is None


@pytest.mark.parametrize(("text", "needle"), GAPS)
def test_no_gap_case_takes_the_screens_shortcut(text: str, needle: str) -> None:
    assert not (rd.PLAIN_RUN.fullmatch(text) and rd.SHAPE_LITERAL.search(text) is None)
    screen = ceiling._screen(ceiling.METADATA, Redactor(home="/nonexistent-home"))
    assert screen is not None and needle not in str(screen(text, False))


# --- end to end -------------------------------------------------------------------------------

def _run(config: CaptureConfig, signal: Signal) -> dict[str, Any]:
    batch: list[Any] = [signal]
    for proc in (MappingProcessor(), CaptureProcessor(config)):
        batch = proc(batch)
    return batch[0]


def test_a_wsl_home_never_reaches_a_default_config_permission_prompt() -> None:
    event = _run(CaptureConfig(), Signal("claude-code", "PermissionRequest", {
        "hook_event_name": "PermissionRequest", "session_id": "s", "tool_name": "Bash",
        "tool_input": {"command": "cat /mnt/c/Users/bob/Documents/plan.key"}}, respond_via=["control"]))
    assert "bob" not in str(event["data"])


def test_json_text_in_a_tool_result_is_redacted_at_the_redacted_ceiling() -> None:
    stdout = '{"log":"key rotated:\\n' + SK + '"}\n{"files":"a.txt\\n/home/alice/payroll/export.csv"}'
    event = _run(CaptureConfig(ceiling="redacted"), Signal("claude-code", "PostToolUse", {
        "hook_event_name": "PostToolUse", "session_id": "s", "tool_name": "Bash", "tool_use_id": "t1",
        "tool_response": {"stdout": stdout}}))
    text = str(event["data"])
    assert SK not in text and "alice" not in text and SECRET in text


@pytest.mark.parametrize(("text", "expected"), [
    ("scp me@host.example.org:/home/alice/f .", f"scp {PII}:~/f ."),
    ("rsync host:/home/alice/f .", "rsync host:~/f ."),
    ("ssh host:/users/bob/x", "ssh host:/users/bob/x"),  # lower case, not after a drive: a remote path
    ("cd C:/Users/bob/x", "cd ~/x"),
])
def test_a_drive_letter_is_not_the_end_of_a_host_name(text: str, expected: str) -> None:
    assert R.text(text) == expected
