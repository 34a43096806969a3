"""The stamper of ea1138f, kept as the oracle of ``tests/test_stamp_equivalence.py``.

``aep_collector.pipeline.envelope.Stamper`` stamps the usual draft through a per-session lane fast
path; this copy of the code it replaced must produce the same envelopes, key for key and in order.
"""

from __future__ import annotations

import re
import socket
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from aep_collector.pipeline.envelope import (
    AEP_VERSION,
    COMMAND_TYPE,
    CORE_ATTRIBUTES,
    TYPE_GRAMMAR,
    UNKNOWN_SESSION,
    Bloom,
    EpochStore,
    StampError,
    Ulid,
    _public,
    safe_host,
    source_uri,
)
from aep_collector.pipeline.model import Event

_EXTENSION = re.compile(r"[a-z0-9]{1,20}")
_OPTIONAL = ("cause", "traceparent", "severity", "capture")
_USUAL_KEYS = frozenset({"type", "agent", "id", "subject", "session", "run", "capture", "data"})
_MS_SUFFIX = [f".{ms:03d}Z" for ms in range(1001)]


class ReferenceStamper:
    """The stamper as it was before the lane fast path (ea1138f), kept verbatim as the oracle.

    Sharing it keeps ``seq`` unique per ``(agent, session)`` even when several pipelines emit
    into the same session.
    """

    def __init__(self, state_dir: Path, host: str | None = None, max_sessions: int = 100_000) -> None:
        self.host = safe_host(host or socket.gethostname())
        self.epochs = EpochStore(state_dir)
        self.ids = Ulid()
        self.max_sessions = max_sessions
        self._seq: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._high: dict[str, int] = {}
        self._released = Bloom()
        self._types: dict[Any, int] = {}
        self._sources: dict[tuple[str, str | None], str] = {}
        self._time_sec = -1
        self._time_prefix = ""
        self._epoch: dict[str, int] = {}  # EpochStore's value, fetched once per agent

    def next_seq(self, agent: str, session: str) -> int:
        """Per-session monotonic seq, with bounded state.

        A session whose counter was released (ended, or least recently used beyond
        ``max_sessions``) resumes at the agent's high-water mark, which is above every seq the
        agent has assigned in this epoch: gaps are legal (AEP-0001 §7), going backwards is not.
        """
        key = (agent, session)
        value = self._seq.pop(key, None)
        if value is None:
            # New sessions start at 0; one we released may come back, so it resumes above every
            # seq assigned so far (a Bloom filter: a false positive only costs a gap).
            value = self._high.get(agent, 0) if key in self._released else 0
        self._seq[key] = value + 1
        if value + 1 > self._high.get(agent, 0):
            self._high[agent] = value + 1
        if len(self._seq) > self.max_sessions:
            old, _ = self._seq.popitem(last=False)
            self._released.add(old)
        return value

    def release(self, agent: str, session: str) -> None:
        """Free a session's counter (after ``session.ended``); a late event resumes above it."""
        if self._seq.pop((agent, session), None) is not None:
            self._released.add((agent, session))

    @property
    def sessions(self) -> int:
        return len(self._seq)

    def _type_kind(self, etype: Any) -> int:
        """0 session event, 1 agent-scoped, 2 command (session, no seq); cached per type."""
        kind = self._types.get(etype)
        if kind is None:
            if not isinstance(etype, str) or not TYPE_GRAMMAR.fullmatch(etype):
                raise StampError(f"draft type {etype!r} does not match the AEP type grammar")
            kind = 1 if etype.startswith("agent.") else 2 if COMMAND_TYPE.fullmatch(etype) else 0
            if len(self._types) < 10_000:  # vendor fallbacks are open-ended: a cache, bounded
                self._types[etype] = kind
        return kind

    def _time(self, ts: float) -> str:
        secs = int(ts)
        if secs != self._time_sec:
            self._time_sec = secs
            self._time_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
        return f"{self._time_prefix}.{int((ts - secs) * 1000):03d}Z"

    def _source(self, agent: str, session: str | None) -> str:
        key = (agent, session)
        uri = self._sources.get(key)
        if uri is None:
            uri = source_uri(self.host, agent, session)
            if len(self._sources) >= 10_000:
                self._sources.clear()
            self._sources[key] = uri
        return uri

    def stamp(self, draft: Event, now: float | None = None) -> Event:
        """Return the envelope for ``draft`` (internal ``_`` hints dropped).

        The hot path of every event: per-type, per-second and per-session parts (kind, time
        prefix, ``source``, epoch) are cached, and a draft holding only core attributes skips the
        extension scan, so a stamp is a few dict look-ups and the envelope's own inserts.
        """
        if "aep" in draft and "id" in draft and "source" in draft:
            return _public(draft)  # already stamped (a redelivered ack): never re-stamp
        get = draft.get
        # The usual draft holds no step, cause, traceparent, severity, hint or extension: one
        # C-level check instead of a look-up each.
        usual = _USUAL_KEYS.issuperset(draft)
        etype = get("type")
        kind = self._types.get(etype)
        if kind is None:
            kind = self._type_kind(etype)
        agent = get("agent")
        if not isinstance(agent, str) or not agent:
            raise StampError(f"draft of type {etype} has no agent")
        ts = time.time() if now is None else now
        # An id minted earlier (attention correlation needs the request id before stamping) is kept.
        pre = get("id")
        ev: dict[str, Any] = {"aep": AEP_VERSION,
                              "id": pre if isinstance(pre, str) and pre else self.ids.new_unlocked(int(ts * 1000)),
                              "type": etype}
        subject = get("subject")
        if subject is not None and subject != "":
            ev["subject"] = subject if type(subject) is str else str(subject)
        secs = int(ts)
        if secs != self._time_sec:
            self._time_sec = secs
            self._time_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
        ms = int((ts - secs) * 1000)
        ev["time"] = self._time_prefix + (_MS_SUFFIX[ms] if ms >= 0 else f".{ms:03d}Z")
        if kind == 1:
            ev["source"] = self._sources.get((agent, None)) or self._source(agent, None)
            ev["agent"] = agent
        else:
            session = get("session") or UNKNOWN_SESSION
            if type(session) is not str:
                session = str(session)
            ev["source"] = self._sources.get((agent, session)) or self._source(agent, session)
            ev["agent"] = agent
            ev["session"] = session
            run = get("run")
            if run is not None and run != "":
                ev["run"] = run if type(run) is str else str(run)
            if not usual:
                step = get("step")
                if step is not None and step != "":
                    ev["step"] = step if type(step) is str else str(step)
            if kind == 0:
                ev["seq"] = self.next_seq(agent, session)
                epoch = self._epoch.get(agent)
                if epoch is None:
                    epoch = self._epoch[agent] = self.epochs.epoch(agent)
                ev["epoch"] = epoch
                if etype == "session.ended":
                    self.release(agent, session)
        if usual:
            capture = get("capture")
            if capture is not None and capture != "":
                ev["capture"] = capture
        else:
            for key in _OPTIONAL:
                value = get(key)
                if value is not None and value != "":
                    ev[key] = value
            for key, value in draft.items():  # extension attributes the draft carries, scalars only
                if key not in CORE_ATTRIBUTES and key[:1] != "_" and isinstance(value, (str, int, bool)) \
                        and _EXTENSION.fullmatch(key):
                    ev[key] = value
        data = get("data")
        if data is not None:
            ev["data"] = data
        return ev
