"""The two shapes that flow through a pipeline.

A receiver turns what a vendor sent into a ``Signal``; the mapping processor turns signals into
event *drafts* (plain dicts); later processors transform drafts; the pipeline stamps drafts into
AEP envelopes (``aep_collector.pipeline.envelope``) and hands those to exporters.

Draft keys are AEP attribute names (``type``, ``data``, ``subject``, ``session``, ``run``,
``step``, ``cause``, ``severity``, ``agent``; ``id`` and ``time`` when a processor knows them
better than the stamper, which otherwise sets both) plus internal hints whose names start with ``_``.
No AEP attribute can start with ``_`` (AEP-0001 §5.4: ``[a-z0-9]{1,20}``), so the stamper drops
every ``_`` key and nothing internal is ever exported.

Internal hints understood by the built-in processors:

``_capture``     {dotted.path: level}: capture minimum of vendor fields the schema does not annotate.
``_structural``  {dotted.path: value}: the structural value a ``[metadata*]`` field takes below
                 ``redacted`` (e.g. ``{"prompt": "claude-code requests input (4 fields)"}``).
``_fields``      the field specs an ``answer.values`` is gated against.
``_attention_key`` the vendor's correlation key of an attention request and its legs.
``_hold``        an opaque token a receiver uses to find the stamped event that it holds open.
``_runs``        ``"none"`` opts a draft out of run synthesis (OTLP channels).
``_drain``       ``"cancelled"`` on ``run.started``: close a still-open run as ``run.cancelled``.
``_lane``        a nested agent loop's own run lane within a shared session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]
"""A draft or a stamped AEP envelope."""


@dataclass(slots=True, frozen=True)
class Form:
    """A question a receiver decoded into an AEP-0006 form (Claude Code's AskUserQuestion and
    Elicitation, Kilo's ``question.asked``): the card the mapping draws, what an answer is checked
    against and what the receiver builds the vendor's reply from."""

    prompt: str
    """The card's prompt at full content."""
    fields: list[dict[str, Any]]
    """The field specs at full content (labels as the vendor wrote them)."""
    structural: str
    """The prompt's structural value below ``redacted`` (``claude-code asks 2 questions``)."""


@dataclass(slots=True)
class Signal:
    """One thing a vendor told a receiver: a hook call, a plugin moment, an OTLP log record."""

    agent: str
    """AEP agent identity of the vendor (``claude-code``, ``codex``, ...); selects the mapping."""
    name: str
    """The vendor's own name for the moment (hook event name, bus type, ``event.name``)."""
    payload: dict[str, Any]
    """The vendor's payload as received (the OpenCode family's: the moment its POST decodes to)."""
    mode: str | None = None
    """Set by an OTLP receiver: its ``mode`` (``primary`` or ``companion``, receivers/otlp/README.md);
    None, or anything else, maps as ``companion``. Fourth, so the receiver passes it positionally."""
    attrs: dict[str, Any] | None = None
    """Receiver-private context that no mapping reads (the OpenCode family's vendor server address);
    None when there is none (no dict per signal). What a mapping reads is a typed field."""
    hold: str | None = None
    """Set by a receiver that will hold the vendor's reply open on the resulting attention request."""
    respond_via: list[str] | None = None
    """Set by a receiver for a request it could hold: who can answer it (AEP-0008 ``respond_via``,
    ``["control"]`` while a control route is live, else ``["oob"]``); the mapping copies it onto
    the request's card. None: the mapping's own default stands."""
    expires_at: str | None = None
    """Set with a live hold: when it gives up (RFC 3339), shown on the card as ``expires_at``."""
    options: list[dict[str, str]] | None = None
    """Set with a held gate: the options its permission card offers (the receiver applies the
    answer against them and builds the vendor's reply from it)."""
    tool_closed: bool = False
    """Set by a receiver whose operator tool gate already closed this tool call (its ``tool.denied`` was emitted),
    so the mapping keeps the vendor's late report of it off the tool lifecycle."""
    deltas: bool | None = None
    """Set by the pi receiver from its ``deltas`` config: map stream updates. None: the mapping
    state's own default (``AEP_PI_DELTAS``)."""
    form: Form | None = None
    """Set by a receiver that decoded the vendor's question into a form: the mapping draws the card
    from it (the receiver validates the answer and replies by the same fields)."""
    session: str | None = None
    """Set by a receiver that applies its vendor's identity rule to what it decodes (the OpenCode
    family's moments, the OTLP channels' records): the AEP session the signal belongs to."""
    received_ns: int = field(default_factory=time.time_ns)


Batch = list[Signal | Event]
"""What passes between components: signals before mapping, drafts after."""

