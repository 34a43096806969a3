"""Bounded per-session replay buffers (AEP-0003 §5, AEP-0001 §7).

Keyed by the bare ``session`` (resume tokens name only it). Admission dedupes on ``(source, id)``;
entries stay sorted by ``(epoch, seq)``. Past ``depth`` the lowest position is evicted and the
highest evicted position is remembered, so a resume from before it is told exactly that
(``replay-exhausted``) instead of guessing from gaps. A session dropped whole (``max_sessions``) keeps
its high-water mark in a bounded memory of dropped sessions, so a resume from before it still gets the
marker (with ``earliest`` just past the mark when nothing of the session is held any more).
"""

from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

Position = tuple[int, int]


@dataclass(order=True)
class Entry:
    pos: Position
    order: int
    text: str = field(compare=False)
    event: dict[str, Any] = field(compare=False)
    claim: str | None = field(default=None, compare=False)
    """The level the event is trusted at when not its own ``capture`` (``honest_claim``), else None."""


@dataclass
class SessionBuffer:
    entries: list[Entry] = field(default_factory=list)
    evicted: Position | None = None
    """The highest position dropped for space; a resume from below it has missed events."""


@dataclass
class Replay:
    """What a ``from`` request yields: markers ``(session, earliest)`` then entries, in order."""

    exhausted: list[tuple[str, Position]]
    entries: list[Entry]


DROPPED_PER_SESSION = 10
"""High-water marks of sessions dropped whole, remembered per ``max_sessions`` (oldest forgotten first)."""


class Buffers:
    def __init__(self, depth: int, max_sessions: int) -> None:
        self.depth, self.max_sessions = depth, max_sessions
        self.sessions: OrderedDict[str, SessionBuffer] = OrderedDict()
        self.dropped: OrderedDict[str, Position] = OrderedDict()
        """Session -> highest position it held when the session cap dropped it."""
        self._seen: dict[str, set[tuple[str, str]]] = {}
        self._order = itertools.count()

    def admit(self, ev: dict[str, Any], text: str, claim: str | None = None) -> bool:
        """Buffer a sequenced session event; False when ``(source, id)`` is already held."""
        session = ev["session"]
        buf = self.sessions.get(session)
        seen = self._seen.setdefault(session, set())
        key = (ev["source"], ev["id"])
        if key in seen:
            return False
        if buf is None:
            # A session that comes back after being dropped has still missed what it lost.
            buf = self.sessions[session] = SessionBuffer(evicted=self.dropped.pop(session, None))
            while len(self.sessions) > self.max_sessions:
                old, old_buf = self.sessions.popitem(last=False)
                self._seen.pop(old, None)
                self._forget(old, old_buf)
        self.sessions.move_to_end(session)  # every write refreshes recency
        seen.add(key)
        entry = Entry((ev.get("epoch", 0), ev["seq"]), next(self._order), text, ev, claim)
        if not buf.entries or buf.entries[-1].pos <= entry.pos:
            buf.entries.append(entry)  # the common case: in order
        else:
            bisect.insort(buf.entries, entry)  # backfill
        while len(buf.entries) > self.depth:
            gone = buf.entries.pop(0)
            seen.discard((gone.event["source"], gone.event["id"]))
            buf.evicted = gone.pos if buf.evicted is None or gone.pos > buf.evicted else buf.evicted
        return True

    def _forget(self, session: str, buf: SessionBuffer) -> None:
        high = max([p for p in (buf.evicted, buf.entries[-1].pos if buf.entries else None) if p is not None],
                   default=None)
        if high is None:
            return
        self.dropped[session] = high
        while len(self.dropped) > self.max_sessions * DROPPED_PER_SESSION:
            self.dropped.popitem(last=False)

    def replay(self, from_: Any) -> Replay:
        """``from_`` is ``"all"`` or a validated list of ``{session, epoch?, seq?}``."""
        if from_ == "all":  # every held session from its earliest, never a marker (§5)
            return Replay([], [e for buf in self.sessions.values() for e in buf.entries])
        markers: list[tuple[str, Position]] = []
        picks: list[Entry] = []
        for p in from_:
            after = (p.get("epoch", 0), p.get("seq", -1))
            buf = self.sessions.get(p["session"])
            if buf is None or not buf.entries:
                high = self.dropped.get(p["session"])
                if high is not None and after < high:  # all of it is gone: nothing at or before high
                    markers.append((p["session"], (high[0], high[1] + 1)))
                continue
            if buf.evicted is not None and after < buf.evicted:
                markers.append((p["session"], buf.entries[0].pos))
            picks.extend(e for e in buf.entries if e.pos > after)
        return Replay(markers, picks)

    def whole(self, session: str) -> list[Entry]:
        buf = self.sessions.get(session)
        return list(buf.entries) if buf else []


def from_problem(from_: Any, max_from: int) -> tuple[str, str] | None:
    """``(code, detail)`` when a ``from`` value is unusable, else None (AEP-0003 §6.5 codes)."""
    if from_ is None or from_ == "all":
        return None
    if not isinstance(from_, list):
        return "invalid-filter", 'from is an array of positions or "all"'
    if len(from_) > max_from:
        return "limit-exceeded", f"from names {len(from_)} positions; the limit is {max_from}"
    for p in from_:
        if not isinstance(p, dict) or not isinstance(p.get("session"), str) or not p["session"]:
            return "invalid-filter", "each from entry is {session, epoch?, seq?}"
        for k in ("epoch", "seq"):
            if k in p and (type(p[k]) is not int or p[k] < 0):
                return "invalid-filter", f"from {k} must be a non-negative integer"
    return None
