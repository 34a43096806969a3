"""Attention correlation: the lifecycle rule that mappings, being pure, cannot keep alone.

AEP-0002 §7.1: every event after ``attention.requested`` carries ``subject`` = the request's event
id, and a request is closed (``resolved``/``timeout``) before its session's ``session.ended``.
Mappings only know the vendor's correlation key, so they tag request and legs with
``_attention_key``; this book mints the request id up front, rewrites the legs' subject and
cause, drops legs whose request it never saw (joins never invent), and sweeps still-open
requests as ``resolved{dismissed}`` before ``session.ended``. Held control loops tag their legs
the same way, so a vendor echo of an answer the operator already gave lands as an orphan.

A form is answered whole or not at all (AEP-0006): an ``attention.answered`` whose ``values`` do
not satisfy the request's field specs (a vendor's "accept" with ``content: {}`` for a required
field, a string in a number field) is not an answer AEP can carry. It is not written; the request
closes as ``resolved{dismissed}`` — closed in the agent's own UI without a usable answer — and the
book counts it (``invalid``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from aep_collector.pipeline.envelope import Ulid
from aep_collector.pipeline.model import Event
from aep_collector.pipeline.validate import form_value_problems

LEGS = frozenset({"attention.answered", "attention.resolved", "attention.timeout"})

Key = tuple[str, str, str]  # (agent, session, vendor key)


@dataclass
class Pending:
    request_id: str
    answered_id: str | None = None
    fields: list | None = None  # a form's field specs
    invalid: bool = False  # its answer did not satisfy them


@dataclass
class AttentionBook:
    """Open requests by ``(agent, session, key)``, bounded; explicit state for the processor."""

    max_open: int = 10_000
    open: OrderedDict[Key, Pending] = field(default_factory=OrderedDict)
    # The keys of ``open`` per (agent, session), in the same order: a session's end sweeps its own
    # requests without scanning every open one (hot path: that scan ran on every session end).
    by_session: dict[tuple[str, str], dict[Key, None]] = field(default_factory=dict)
    orphans: int = 0
    invalid: int = 0
    ids: Ulid = field(default_factory=Ulid)

    def apply(self, drafts: list[Event]) -> list[Event]:
        out: list[Event] = []
        for d in drafts:
            etype = d.get("type")
            key = d.get("_attention_key")
            if key is None and etype != "session.ended":
                out.append(d)  # the common case: nothing to correlate (hot path, no key built)
                continue
            agent = str(d.get("agent", ""))
            session = str(d.get("session") or "unknown")
            if etype == "session.ended":
                out.extend(self.sweep(agent, session))
                out.append(d)
                continue
            k = (agent, session, str(key))
            if etype == "attention.requested":
                d.setdefault("id", self.ids.new())
                stale = self._pop(k)
                if stale is not None:  # asked again before an answer: the earlier card is moot
                    out.append(self._dismissed(agent, session, stale))
                fields = d.get("_fields")
                self.open[k] = Pending(d["id"], fields=fields if isinstance(fields, list) else None)
                self.by_session.setdefault((agent, session), {})[k] = None
                while len(self.open) > self.max_open:
                    self._pop(next(iter(self.open)))
                out.append(d)
            elif etype in LEGS:
                pending = self.open.get(k)
                if pending is None:
                    self.orphans += 1  # the request was never seen (or already settled): never invent one
                    continue
                if etype == "attention.answered" and self._unusable(d, pending):
                    pending.invalid = True
                    self.invalid += 1
                    continue
                if pending.invalid and etype == "attention.resolved" and isinstance(d.get("data"), dict) \
                        and d["data"].get("resolution") == "answered":
                    d["data"] = {**d["data"], "resolution": "dismissed"}
                d["subject"] = pending.request_id
                if etype == "attention.answered":
                    d.setdefault("id", self.ids.new())
                    d.setdefault("cause", pending.request_id)
                    pending.answered_id = d["id"]
                else:
                    d.setdefault("cause", pending.answered_id or pending.request_id)
                    self._pop(k)
                out.append(d)
            else:
                out.append(d)
        return out

    @staticmethod
    def _unusable(d: Event, pending: Pending) -> bool:
        """True when a form answer's values break the request's field specs (judged on the raw
        values, whatever the ceiling will later let through)."""
        data = d.get("data") if isinstance(d.get("data"), dict) else {}
        answer = data.get("answer") if isinstance(data.get("answer"), dict) else {}
        fields = d.get("_fields") if isinstance(d.get("_fields"), list) else pending.fields
        if fields is None or "values" not in answer:
            return False
        values = answer["values"]
        return not isinstance(values, dict) or bool(form_value_problems(fields, values, "full", ""))

    def is_open(self, agent: str, session: str | None, key: str) -> bool:
        return (agent, session or "unknown", key) in self.open

    def sweep(self, agent: str, session: str) -> list[Event]:
        """``resolved{dismissed}`` for every request still open in the session (AEP-0002 §7.1)."""
        keys = self.by_session.pop((agent, session), {})
        return [self._dismissed(agent, session, self.open.pop(k)) for k in keys]

    def _pop(self, k: Key) -> Pending | None:
        """Remove an open request from both indexes (None when it is not open)."""
        pending = self.open.pop(k, None)
        if pending is not None:
            keys = self.by_session.get(k[:2])
            if keys is not None:
                keys.pop(k, None)
                if not keys:
                    del self.by_session[k[:2]]
        return pending

    @staticmethod
    def _dismissed(agent: str, session: str, pending: Pending) -> Event:
        return {"type": "attention.resolved", "agent": agent, "session": session,
                "subject": pending.request_id, "cause": pending.answered_id or pending.request_id,
                "data": {"resolution": "dismissed"}}
