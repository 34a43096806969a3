"""What is structure and what is content: the value classes the capture ceiling applies below ``full``.

AEP-0001 §8.2: ``metadata`` carries "structure only (names, ids, counts, durations, statuses); no
free text". A schema annotation says which FIELD may appear at a level; it cannot stop a vendor
from filling a metadata field with free text, and vendor extension types (``x.*``, AEP-0001 §6)
have no schema at all. So besides the capture levels, a path can be classed ``token``: its value
is structure when it is a short identifier-like token (an enumerated value, an id, a name) and
content otherwise. The tables below are declarative: type -> {dotted path: class}, with ``*``
naming the class of every path a table does not name.
"""

from __future__ import annotations

import re
from typing import Any

from aep_collector.pipeline.canonical import digest

TOKEN = "token"
"""Class of a path whose value is structure only when ``is_token`` holds (else content, ``redacted`` minimum)."""
WILDCARD = "*"
"""Key of a table entry that classes every path the table does not name."""

# An identifier, an enumerated value or a rule pattern: alphanumeric first, no whitespace, no
# quotes, at most 128 characters. `Bash(rm:*)`, `rate_limit`, `gpt-5.2-codex`, `2026-07-12T10:15:00`
# pass; a sentence, a multi-line message or a JSON blob does not.
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+#=()*,~\[\]-]{0,127}")

OPAQUE_PREFIX = "sha256-"
"""A structural value found to be content is replaced by ``sha256-`` + its AEP-0003 §9.3 digest:
correlatable (the same value gives the same digest), never the value. The form is a valid
session/run/step id (AEP-0003 §9.6), so it can stand in for an identifier too."""

# Core fields the schemas annotate `metadata` that vendors fill with free text (issue #12). Each
# stays structure when it holds a token and is content otherwise:
# - tool.denied.rule: a permission rule id or pattern (`Bash(rm:*)`); a vendor's deny message is prose.
# - run.failed.reason: a machine reason (Claude Code StopFailure `error` is the enum `rate_limit`,
#   `authentication_failed`, …; pins: rate_limit, ProviderError, ApiError); an error text is prose.
# - agent_type (subagent start/stop, session start): an agent kind (`Explore`, `Plan`,
#   `general-purpose`); a user-written description in its place is prose.
# The envelope `subject` is classed the same way by the capture ceiling (ENVELOPE_TOKEN).
FIELD_CLASSES: dict[str, dict[str, str]] = {
    "tool.denied": {"rule": TOKEN},
    "run.failed": {"reason": TOKEN},
    "delegation.subagent.started": {"agent_type": TOKEN},
    "delegation.subagent.stopped": {"agent_type": TOKEN},
    "session.started": {"agent_type": TOKEN},
}

EXTENSION_DEFAULT = TOKEN
"""Class of every data path of an ``x.*`` type that neither the type's table nor the draft's hint
names: numbers and booleans are structure, a string only when it is a token. A channel whose
attribute set is open (the OTel profiles) declares its structural keys and classes the rest
``redacted`` with a ``*`` hint, so an undeclared attribute is content whatever it looks like."""

ENVELOPE_TOKEN = ("subject",)
"""Envelope attributes classed ``token``: a subject is an id or a name, never free text."""
ENVELOPE_IDS = ("session", "run", "step")
"""Envelope identifiers: kept as they are unless a detector finds a secret, an email or a home
path in one (then the opaque digest stands in, consistently, at every level below ``full``)."""


def is_token(value: str) -> bool:
    """True for a short identifier-like string (see ``_TOKEN``)."""
    return _TOKEN.fullmatch(value) is not None


def opaque(value: Any) -> str:
    """The structural stand-in for a value that turned out to be content."""
    return OPAQUE_PREFIX + digest(value)
