"""What the VS Code and Codex OTel-channel profiles share: identity, modes, the companion family.

Named after the receiver that feeds them, ``aep_collector.receivers.otlp``.

Both channels deliver flattened OTLP log records (see ``receivers/otlp/flatten.py``)::

    {"resource": {dotted.key: value}, "attributes": {dotted.key: value},
     "severity_number"?: int, "trace_id"?: hex, "span_id"?: hex, "flags"?: int, ...}

A profile names the identity keys that never reach ``data``, the capture
minimum of content keys, the KNOWN ``event.name`` set (with its companion suffix), the attribute
keys each record declares structural, and the primary-mode core mapping. ``map_record`` is the one
pure mapper both profiles run.

The attribute set of an OTel record is open (vendors add keys between releases, users add their
own), so the companion family is closed by declaration: a key a record does not declare
structural is content (``redacted`` minimum) whatever it looks like, and a declared key still
passes the capture processor's token check (processors/capture/structure.py).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.model import Event, Signal

from .drafting import digest, draft

COMPANION = "companion"
PRIMARY = "primary"
MODES = (COMPANION, PRIMARY)

# Bridges digest §1.6 / AEP-0001 §3.4 inverse buckets: OTel severity_number -> AEP severity.
_SEVERITY_BUCKETS = ((1, 8, "debug"), (9, 9, "info"), (10, 12, "notice"), (13, 16, "warning"),
                     (17, 20, "error"), (21, 24, "critical"))
_HEX = re.compile(r"^[0-9a-f]+$")
_INT64_MAX = 2**63 - 1  # the largest OTel int attribute: a count past it is no count

PrimaryRule = Callable[[dict[str, Any]], "list[Event] | None"]
"""Primary-mode mapping of one record's attributes: core drafts, ``[]`` (emit nothing) or
``None`` (no core moment: the record stays in the companion family)."""


@dataclass(frozen=True)
class Profile:
    """One vendor's OTel channel: identity rule, data hygiene, known records and core subset."""

    agent: str
    """AEP agent identity (``vscode``, ``codex``); also the ``x.<agent>.otel.*`` namespace."""
    identity_keys: frozenset[str]
    """Attribute keys that are envelope identity, never ``data``."""
    capture: dict[str, str]
    """Capture minimum of content-bearing attribute keys (everything else is metadata)."""
    known: dict[str, str]
    """KNOWN ``event.name`` -> companion suffix; any other name is ``unknown``."""
    structural: dict[str, frozenset[str]] = field(default_factory=dict)
    """Companion suffix -> the attribute keys declared structure (names, ids, counts, statuses)."""
    primary: dict[str, PrimaryRule] = field(default_factory=dict)
    """``event.name`` -> primary-mode rule; names absent here stay companion in primary too."""
    scrub: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Profile-specific data hygiene applied after identity keys are removed."""

    def family(self, suffix: str) -> str:
        return f"x.{self.agent}.otel.{suffix}"

    def capture_hint(self, suffix: str) -> dict[str, str]:
        """The ``_capture`` hint of a companion record: declared keys are tokens, all else content.

        Constant per suffix (it names every declared and content key, present or not), so the
        capture processor sees one classification table per type.
        """
        hint = {"*": "redacted", **{key: "token" for key in self.structural.get(suffix, ())}}
        hint.update(self.capture)  # content keys keep their own minimum (full beats a declaration)
        return hint

    # The vendor module's mapping contract, bound to this profile (its module re-exports them).

    def map_record(self, flat: dict[str, Any], mode: str = COMPANION, session: str | None = None) -> list[Event]:
        """Pure mapping of one flattened record in ``companion`` or ``primary`` mode, filed under ``session``."""
        return map_record(self, flat, mode, session)

    def map_signal(self, signal: Signal, state: None = None) -> list[Event]:
        """Map a receiver Signal (payload = flattened record, ``Signal.mode``, ``Signal.session``)."""
        return map_signal(self, signal)


def new_state() -> None:
    """The channel is stateless: every record maps on its own (no joins, no runs)."""
    return None


def severity_of(flat: Any) -> str | None:
    """AEP severity from ``severity_number``; None for unset, out of range, or the default info."""
    number = flat.get("severity_number") if isinstance(flat, dict) else None
    if not isinstance(number, int) or isinstance(number, bool):
        return None
    for low, high, level in _SEVERITY_BUCKETS:
        if low <= number <= high:
            return None if level == "info" else level  # info is the envelope default: omit it
    return None


def traceparent_of(flat: Any) -> str | None:
    """W3C ``traceparent`` from the record's trace/span ids when both are set and non-zero."""
    if not isinstance(flat, dict):
        return None
    trace, span, flags = flat.get("trace_id"), flat.get("span_id"), flat.get("flags", 0)
    if not (isinstance(trace, str) and isinstance(span, str)):
        return None
    if len(trace) != 32 or len(span) != 16 or not _HEX.match(trace) or not _HEX.match(span):
        return None
    if set(trace) == {"0"} or set(span) == {"0"}:
        return None
    flag_byte = flags & 0xFF if isinstance(flags, int) and not isinstance(flags, bool) else 0
    return f"00-{trace}-{span}-{flag_byte:02x}"


_LAST_SECOND: list[Any] = [None, ""]
"""The second last formatted and its text: a batch's records mostly share their second."""
_NS_END = 253402300800 * 1_000_000_000
"""10000-01-01T00:00:00Z in epoch nanoseconds: RFC 3339 has four-digit years."""
_MS = [f".{ms:03d}Z" for ms in range(1000)]
"""The time's ".mmmZ" tail, looked up: half of ``time_of``'s cost was formatting it."""


def time_of(ns: Any) -> str | None:
    """A record's time (epoch nanoseconds; the flattener falls back to the observed time) as the
    envelope's RFC 3339 UTC time with milliseconds (bridges digest §1.6: ``time`` from the record,
    not from when the batch arrived). Integer arithmetic only, so ``.310`` stays ``.310``; None for
    a time that is not a positive count before the year 10000 (the stamper then takes its own)."""
    if type(ns) is not int or not 0 < ns < _NS_END:
        return None
    secs, rest = divmod(ns, 1_000_000_000)
    last = _LAST_SECOND
    if last[0] != secs:
        last[1] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
        last[0] = secs
    return last[1] + _MS[rest // 1_000_000]


def parse_bool(value: Any) -> bool | None:
    """A vendor boolean: native (VS Code) or the strings ``"true"``/``"false"`` (Codex); else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def parse_count(value: Any) -> int | None:
    """A non-negative int64 from a native int or a decimal string (``"412"``); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= _INT64_MAX else None
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer():
        return int(value) if value <= _INT64_MAX else None
    if isinstance(value, str):
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses, and int() refuses
        # more than 4300 digits; either raised and lost the whole record's mapping.
        digits = value.strip()
        if digits.isascii() and digits.isdigit():
            digits = digits.lstrip("0") or "0"
            if len(digits) <= 19:
                number = int(digits)
                return number if number <= _INT64_MAX else None
    return None


def text(attrs: dict[str, Any], key: str) -> str | None:
    """``attrs[key]`` when it is a non-empty string."""
    value = attrs.get(key)
    return value if isinstance(value, str) and value else None


def add_result(data: dict[str, Any], value: Any) -> None:
    """Carry a tool's output as ``result`` (full) plus its ``result_digest`` (metadata)."""
    if isinstance(value, (str, dict)) and value:
        data["result"] = value
        data["result_digest"] = digest(value)  # AEP-0003 §9.3: over the original, before gating


def session_started(agent: str, model_key: str) -> PrimaryRule:
    """The primary rule of a channel's session-start record: ``session.started`` with the profile's
    agent as ``client.name`` and the record's model (read at ``model_key``) renamed
    ``gen_ai.request.model``; every other attribute stays companion-only."""

    def rule(attrs: dict[str, Any]) -> list[Event]:
        data: dict[str, Any] = {"client": {"name": agent}}
        model = text(attrs, model_key)
        if model:
            data["gen_ai.request.model"] = model
        return [draft("session.started", data)]

    return rule


def companion_draft(profile: Profile, suffix: str, attrs: dict[str, Any]) -> Event:
    """The channel-family draft: every non-identity attribute, classed by the record's declaration.

    Undeclared attributes ride at their content minimum, so the capture processor drops them at
    ``metadata`` and redacts them at ``redacted`` (issue #12: a ``prompt`` or ``user.email`` the
    fixture never pinned must not leave verbatim at the default ceiling).
    """
    data = {k: v for k, v in attrs.items() if k not in profile.identity_keys}
    if profile.scrub is not None:
        data = profile.scrub(data)
    out = draft(profile.family(suffix), data)
    out["_capture"] = profile.capture_hint(suffix)
    return out


def unknown_draft(profile: Profile, name: str | None) -> Event:
    """Bridges digest §1.3: a record outside the KNOWN set carries its event name and nothing else."""
    out = draft(profile.family("unknown"), {"event.name": name} if name else {})
    out["_capture"] = profile.capture_hint("unknown")
    return out


def map_record(profile: Profile, flat: Any, mode: str = COMPANION, session: str | None = None) -> list[Event]:
    """Map one flattened record to drafts (pure; severity and traceparent included), filed under
    ``session``: the receiver applies the profile's identity rule (``receivers/otlp/identity.py``)."""
    # The record's attributes ({} for any odd shape) and its event.name (the flattener already
    # folded in the LogRecord field), each read once: this runs for every record of every export.
    if isinstance(flat, dict):
        attrs = flat.get("attributes")
        if not isinstance(attrs, dict):
            attrs = {}
        # Each helper is called only when its field is there: absent, it would return None.
        severity = severity_of(flat) if "severity_number" in flat else None
        traceparent = traceparent_of(flat) if "trace_id" in flat else None
        when = time_of(flat.get("time_unix_nano"))
    else:
        attrs, severity, traceparent, when = {}, None, None, None
    name = attrs.get("event.name")
    if not isinstance(name, str) or not name:
        name = None
    suffix = profile.known.get(name) if name else None
    if suffix is None:
        drafts = [unknown_draft(profile, name)]  # both modes: never guess
    else:
        core = None
        if mode == PRIMARY and name in profile.primary:
            core = profile.primary[name](attrs)
        drafts = [companion_draft(profile, suffix, attrs)] if core is None else core
    for d in drafts:
        # No session: the stamper files the event in its `unknown` lane (the receiver rejects
        # records without one first; see receivers/otlp/README.md).
        if session is not None:
            d["session"] = session
        if severity is not None:
            d["severity"] = severity
        if traceparent is not None:
            d["traceparent"] = traceparent
        if when is not None:
            d["time"] = when
        # Fixture identity.run_from is null: batched, retried OTLP export cannot pair run
        # boundaries honestly, so no run is ever synthesized on this channel.
        d["_runs"] = "none"
    return drafts


def map_signal(profile: Profile, signal: Signal) -> list[Event]:
    """``map_record`` over a receiver's Signal: payload = flattened record, ``Signal.mode`` = mode,
    ``Signal.session`` = the session the receiver's identity rule found."""
    mode = signal.mode
    # Unset or unrecognised degrades to companion, the mode that never emits a core type.
    return map_record(profile, signal.payload, mode if mode in MODES else COMPANION, signal.session)
