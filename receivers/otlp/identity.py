"""Whose session an OTLP log record is: each profile's identity rule (the fixtures' ``identity.session_from``).

Bridges digest §1.6: a record that names no session cannot form a valid session-scoped envelope,
so the receiver refuses it rather than invent an id. The receiver decodes the session once, here,
and hands it on as ``Signal.session``; the mapping files its drafts under it.
"""

from __future__ import annotations

from typing import Any

SESSION_FROM: dict[str, tuple[tuple[str, str], ...]] = {
    # vscode-otel.json: the resource's session.id; some records repeat it as a record attribute
    # (fixture session_start), used only when an exporter dropped the resource key.
    "vscode": (("resource", "session.id"), ("attributes", "session.id")),
    # codex-otel.json: the record's conversation.id.
    "codex": (("attributes", "conversation.id"),),
}
"""Profile -> where its session id lives, in order: ``(section, key)`` of the flattened record."""


def session_of(places: tuple[tuple[str, str], ...], flat: Any) -> str | None:
    """The session id at the first of ``places`` that holds one (a string, or an integer as text)."""
    for section, key in places:
        values = flat.get(section) if isinstance(flat, dict) else None
        value = values.get(key) if isinstance(values, dict) else None
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return None


def describe(places: tuple[tuple[str, str], ...]) -> str:
    """The first place in words, for the refusal message (``resource attribute session.id``)."""
    section, key = places[0]
    return f"{'resource' if section == 'resource' else 'record'} attribute {key}"
