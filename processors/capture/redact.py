"""The AEP-0003 §9.4 redaction pipeline: secrets, configured values, home paths, PII, in that order.

The normative floor is hardened the way the redaction corpus (``conformance/fixtures/redaction``)
pins it; §9.4 allows redacting more, never less.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

SECRET = "[REDACTED:secret]"
PII = "[REDACTED:pii]"

# (a) Credentials. Order inside the step matters only for readability of the result: PEM blocks
# first (multi-line), then prefixed token shapes, then the key=value form.
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*-----(?:.*?-----END [A-Z0-9 ]*-----|.*\Z)", re.DOTALL
)  # an unterminated block is redacted to the end: a truncated key is still a key
# What may stand right before a prefixed token shape. Not an ASCII letter: `task-…`, `risk-…`,
# `disk-…`, `laugh_…` are words, and refusing a letter is what keeps them from being read as keys.
# Anything else may (wider than the `\b` this replaces, so nothing is redacted less): a digit or
# `_` (`OPENAI_KEY_sk-…`, `key2sk-…`; an identifier glued to a key is still a key), punctuation,
# whitespace, a non-ASCII letter (CJK prose has no spaces: `キーはsk-…`), and a JSON escape whose
# last character is a letter (`\nsk-…`, `\tghp_…`, `\u003eeyJ…`): tool output that is itself
# JSON text. A letter after a backslash is taken for an escape even when it is not one
# (`C:\tmp\nsk-…` loses `sk-…`): §9.4 allows redacting more.
_JSON_ESCAPE = r"(?<=\\[bfnrt])|(?<=\\u[0-9A-Fa-f]{4})"  # right after `\n`, `\t`, …, `\u003e`
_LEFT = r"(?:(?<![A-Za-z])|" + _JSON_ESCAPE + ")"
_TOKEN_SHAPES = re.compile(
    r"(?:AKIA|ASIA)[0-9A-Z]{16}|"  # AWS access key ids (ASIA: temporary credentials)
    + _LEFT + r"(?:eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"  # JWT
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub classic tokens
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[baprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|sk-[A-Za-z0-9_-]{20,}"  # OpenAI / Anthropic style
    r"|[rs]k_(?:live|test)_[A-Za-z0-9]{10,}"  # Stripe
    r"|npm_[A-Za-z0-9]{30,}"
    r"|AIza[0-9A-Za-z_-]{35})"  # Google API keys
)
# Every shape above starts with one of these literals: a string holding none of them is checked in
# a few C-level substring tests instead of a regex pass (the ceiling asks about every structural value).
_SHAPE_LITERALS = ("AKIA", "ASIA", "eyJ", "gh", "glpat-", "xox", "sk-", "k_live_", "k_test_", "npm_", "AIza")


def _may_hold_shape(value: str) -> bool:
    # _SHAPE_LITERALS spelled out: a generator over the tuple costs more than the eleven tests.
    return ("AKIA" in value or "ASIA" in value or "eyJ" in value or "gh" in value or "glpat-" in value
            or "xox" in value or "sk-" in value or "k_live_" in value or "k_test_" in value
            or "npm_" in value or "AIza" in value)


# A bare AWS secret access key: 40 base64 characters with no prefix to anchor on (issue #12). The
# run is bounded by non-base64 characters; ``_is_aws_secret`` asks for the mix random base64 has
# (both cases; a digit, a `/` or `+`, or many capitals), which keeps hex digests and commit ids
# (no capitals), CamelCase names (no digit, few capitals) and deep paths (many slashes) out.
# §9.4 allows redacting more: a 40-character mixed-case run with a digit is taken for a key.
# A JSON escape before the run (`\nwJalr…`) bounds it too: its letter is not part of the key.
_AWS_SECRET = re.compile(r"(?:(?<![A-Za-z0-9/+_-])|" + _JSON_ESCAPE + r")[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=_-])")
# RFC 6750: the scheme is case-insensitive; 8+ token chars keep prose ("the bearer of good news").
# Group 1 is set when the scheme stands right after an escape (`\nBearer …`), where the word-boundary
# spelling never started a match: such a token then ends before a scheme word that starts a
# credential of its own (`…/Bearer example.com`), or the match fails there, so it never swallows
# the start of a match the boundary spelling makes (the second credential would be left whole).
_AUTH_TOKEN = r"[A-Za-z0-9\-._~+/]"
_AUTH_SCHEME = re.compile(
    r"(?:\b|(" + _JSON_ESCAPE + r"))(Bearer|Basic|Token)(\s+)"
    r"(?(1)(?:(?!(?<=[-._~+/])(?:Bearer|Basic|Token)\s+" + _AUTH_TOKEN + r"{8})" + _AUTH_TOKEN + r"){8,}"
    r"|" + _AUTH_TOKEN + r"{8,})=*", re.IGNORECASE)
# user:password@host inside URLs.
_URL_CREDENTIALS = re.compile(r"(://[^/\s:@]+:)[^/\s@]+@")
_KEY_WORDS = (
    r"password|passwd|passphrase|secret|api[_-]?key|token|authorization|credentials?"
    r"|private[_-]?key|access[_-]?key"
)
# `KEY = value`, `"key": "value"` and `KEY=\nvalue`. The key may be a longer identifier ending in
# a credential word (GITHUB_TOKEN, client_secret), but `tokens:` / `token_count=` do not match.
# Every pattern with a repeated prefix starts only where that prefix starts (the lookbehinds):
# without them a long identifier-like run (a base64 blob) costs quadratic time.
# Quotes may be backslash-escaped (JSON text inside a JSON string); an auth scheme word before the
# value is part of the value (`authorization: Basic abc=` must not leave `abc=` behind).
_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<key>[A-Za-z0-9_.-]*(?:" + _KEY_WORDS + r"))(?P<q1>\\?[\"']?)(?P<sep>\s*[=:]\s*)"
    r"(?:(?P<q2>\\?[\"'])(?P<quoted>[^\n]{0,2048}?)(?P=q2)"
    r"|(?P<bare>(?:(?:bearer|basic|digest|token)[ \t]+)?\S+))",
    re.IGNORECASE,
)
# Dict keys whose value is a credential whatever it looks like (corpus value_cases), plus longer
# names ending in one of those words.
CREDENTIAL_KEY = re.compile(
    r"^(?:[A-Za-z0-9]+[_.-])*(?:password|passwd|passphrase|secret|api[_-]?key|apikey|token"
    r"|authorization|credentials?|private[_-]?key|access[_-]?key|cookie|set[_-]cookie)$",
    re.IGNORECASE,
)

# (c) Any user's home, not only the configured one (corpus hardening beyond the floor): `home` or
# `Users` and the segment after it, wherever they sit in a path, not only at its start. Behind a
# prefix it is still a home (`/mnt/c/Users/bob` on WSL, `/var/home/alice` on Silverblue, a backup's
# `/mnt/backup/home/alice`), and glued to what precedes it too (`\n/home/alice` in JSON text). The
# prefix stays (`/var~/x`). A separator is any run of `/` and `\`, so escaped spellings count
# (`C:\\Users\\bob`, `\/home\/alice` in JSON text); Windows also in lower case (`c:\users\bob`,
# what `normcase` gives) but only after a backslash or a drive: a URL's `/users/` is an API route.
# A relative `…/home/<x>` is taken too (`src/pages/home/index.tsx` becomes `src/pages~/index.tsx`):
# a relative path into a home names the user as well, and §9.4 allows redacting more. A run of
# separators is entered at its start only, so `////…` costs linear time.
_USER = r"[^/\\\s'\"`:;,)\]}]+"
_DRIVE = r"(?<![A-Za-z0-9])[A-Za-z]:"  # not the end of `host:` (`scp me@host:/home/x` keeps `host`)
_HOMES = re.compile(
    r"(?:" + _DRIVE + r")?(?<![/\\])(?:[/\\]+(?:home|Users)|\\+users)[/\\]+" + _USER
    + r"|" + _DRIVE + r"/+users[/\\]+" + _USER
)

# (d) PII.
# The `@` also URL-encoded (`%40`, twice: `%2540`) or JSON-escaped (`\u0040`): a query string or
# JSON text carries the address as well.
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+(?:@|%(?:25)?40|\\u0040)[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
)
_PHONE = re.compile(r"(?<![\d\w])\+?\d[\d\s().-]{6,}\d(?![\d\w])")
_DOTTED_NUMBERS = re.compile(r"^\d+(?:\.\d+)+$")  # versions (22.11.0) and IPv4, not phones
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

# A string of these characters can hold a token shape or a configured value, but no PEM block,
# auth scheme, URL password, key=value pair, email or path: `sensitive` stops early on it.
_PLAIN = re.compile(r"[A-Za-z0-9_.+-]*")
# A short plain identifier (a tool call id, a request id: a new one on nearly every event) that
# ``_detect`` clears, with ``is_token`` true, decided by one regex instead of those calls: a letter
# or digit first and ``_PLAIN``'s characters only (so no PEM, auth scheme, URL password,
# assignment, email or path), under 40 of them (no bare AWS secret), none of _SHAPE_LITERALS (no
# token shape). Configured secret values are not in it: callers check there are none.
# tests/test_capture_fastpath.py holds it to _detect and is_token.
PLAIN_ID = re.compile(
    r"(?![A-Za-z0-9_.+-]*?(?:" + "|".join(map(re.escape, _SHAPE_LITERALS)) + r"))[A-Za-z0-9][A-Za-z0-9_.+-]{0,38}"
)
# PLAIN_ID in two passes, the same answer at a half to a third of the cost (its lookahead tries
# every literal at every position): the run of _PLAIN's characters, then one search for the
# literals (every character of a match of the run is one of them, so "no literal after a plain
# prefix" is "no literal anywhere"). tests/test_capture_fastpath.py holds the two to PLAIN_ID.
PLAIN_RUN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,38}")
SHAPE_LITERAL = re.compile("|".join(map(re.escape, _SHAPE_LITERALS)))
_MEMO_LIMIT = 8192
_MEMO_VALUE_LIMIT = 256

MIN_SECRET_VALUE = 4  # rule (b): shorter configured values would shred ordinary text


def _assignment(match: re.Match[str]) -> str:
    head = match.group("key") + match.group("q1") + match.group("sep")
    quote = match.group("q2")
    if quote:
        return f"{head}{quote}{SECRET}{quote}"
    return head + SECRET


def _is_aws_secret(text: str) -> bool:
    upper = sum(ch.isupper() for ch in text)
    lower = sum(ch.islower() for ch in text)
    digits = sum(ch.isdigit() for ch in text)
    separators = text.count("/") + text.count("+")
    mixed = digits > 0 or separators > 0 or upper >= 10
    return upper >= 2 and lower >= 2 and mixed and separators <= 8


def _aws_secret(match: re.Match[str]) -> str:
    return SECRET if _is_aws_secret(match.group(0)) else match.group(0)


def _phone(match: re.Match[str]) -> str:
    text = match.group(0)
    digits = sum(ch.isdigit() for ch in text)
    if digits < 7 or _DOTTED_NUMBERS.match(text) or _ISO_DATE.match(text):
        return text
    return PII


class Redactor:
    """Runs the §9.4 pipeline over text and over JSON values."""

    def __init__(self, secret_values: Iterable[str] = (), pii: bool = True, home: str | None = None,
                 *, phones: bool = True) -> None:
        # Longest first, so a value containing another configured value is replaced whole.
        values = {v for v in secret_values if isinstance(v, str) and len(v) >= MIN_SECRET_VALUE}
        self.secret_values = sorted(values, key=len, reverse=True)
        self.pii = pii
        self.phones = phones
        """With ``pii``, whether rule (d) takes phone numbers too (the log keeps them: ports, counts)."""
        self.home = _home_prefix(os.path.expanduser("~") if home is None else home)
        self._home = _home_pattern(self.home) if self.home else None
        self.verdicts: dict[str, bool] = {}
        """``sensitive``'s memo (value -> answer), readable by callers that ask on every event."""
        self._text: dict[str, str] = {}

    def text(self, value: str) -> str:
        """Redact one string: (a) secrets, (b) configured values, (c) home paths, (d) PII.

        Results of short strings are memoized (bounded): labels, prompts and ids repeat.
        """
        out = self._text.get(value)
        if out is None:
            out = self._redact(value)
            if len(self._text) < _MEMO_LIMIT and len(value) <= _MEMO_VALUE_LIMIT:
                self._text[value] = out
        return out

    def _redact(self, value: str) -> str:
        out = _PEM.sub(SECRET, value)
        if _may_hold_shape(out):
            out = _TOKEN_SHAPES.sub(SECRET, out)
        out = _AWS_SECRET.sub(_aws_secret, out)
        out = _AUTH_SCHEME.sub(lambda m: f"{m.group(2)}{m.group(3)}{SECRET}", out)
        out = _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{SECRET}@", out)
        out = _ASSIGNMENT.sub(_assignment, out)
        for secret in self.secret_values:
            out = out.replace(secret, SECRET)
        if self._home is not None:
            out = self._home.sub("~", out)
        out = _HOMES.sub("~", out)
        if self.pii:
            out = _EMAIL.sub(PII, out)
            if self.phones:
                out = _PHONE.sub(_phone, out)
        return out

    def sensitive(self, value: str) -> bool:
        """True when ``text`` would redact a secret, a configured value, a home path or an email.

        The ceiling asks this of every string it keeps as structure below ``full``: such a value is
        content whatever field it sits in. Phone numbers are left out on purpose: ids and counts
        made of digits look like phones, and rule (d) still runs on content at ``redacted``.
        Answers are memoized (bounded): the same tool names, models and session ids come by on
        every event.
        """
        hit = self.verdicts.get(value)
        if hit is None:
            hit = self._detect(value)
            if len(self.verdicts) < _MEMO_LIMIT and len(value) <= _MEMO_VALUE_LIMIT:
                self.verdicts[value] = hit
        return hit

    def _detect(self, value: str) -> bool:
        if _may_hold_shape(value) and _TOKEN_SHAPES.search(value):
            return True
        if len(value) >= 40 and any(_is_aws_secret(m.group(0)) for m in _AWS_SECRET.finditer(value)):
            return True
        if self.secret_values and any(secret in value for secret in self.secret_values):
            return True
        if _PLAIN.fullmatch(value):
            return False  # no separator, space, `@`, `/` or `=`: only the shapes above can match
        return bool(_PEM.search(value) or _AUTH_SCHEME.search(value) or _URL_CREDENTIALS.search(value)
                    or _ASSIGNMENT.search(value) or _EMAIL.search(value) or _HOMES.search(value)
                    or (self._home is not None and self._home.search(value)))

    def value(self, obj: Any) -> Any:
        """Redact a JSON value: strings through ``text``, recursing into lists and dicts.

        A dict key that names a credential has its non-null value replaced whatever its shape;
        keys themselves are structural and never rewritten. Numbers, booleans and null pass.
        """
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, list):
            return [self.value(item) for item in obj]
        if isinstance(obj, dict):
            return {
                key: SECRET if obj[key] is not None and is_credential_key(key) else self.value(obj[key])
                for key in obj
            }
        return obj


def is_credential_key(key: Any) -> bool:
    """True for a dict key whose value is a credential by name (``token``, ``API_KEY``, ...)."""
    return isinstance(key, str) and CREDENTIAL_KEY.match(key) is not None


def _home_pattern(home: str) -> re.Pattern[str]:
    """The configured home at a path boundary, its separators spelled as any run of `/` and `\\`
    (`\\/srv\\/dev` and `C:\\\\dev` in JSON text are the same directory)."""
    parts = re.split(r"[/\\]+", home)
    body = r"[/\\]+".join(map(re.escape, parts))
    if not parts[0]:
        body = r"(?<![/\\])" + body  # a run of separators is entered at its start only
    return re.compile(body + r"(?![\w.-])")


def _home_prefix(home: str) -> str:
    """The configured home without a trailing separator; a root-like home ("/", "") is ignored."""
    stripped = home.rstrip("/\\")
    if len(stripped) < 2 or re.fullmatch(r"[A-Za-z]:", stripped):
        return ""  # replacing "/" with "~" would rewrite every absolute path
    return stripped
