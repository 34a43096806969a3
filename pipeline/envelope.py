"""Envelope stamping, done once and only here (AEP-0001 §5–§7).

The stamper turns a draft into a complete envelope: ``aep``, a ULID ``id``, RFC 3339 UTC ``time``
with milliseconds, ``source``, per-session monotonic ``seq`` and an ``epoch`` that is persisted and
bumped once per process start. Absent optionals are omitted, never ``null``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .atomic import atomic_write
from .model import Event

AEP_VERSION = "0.1"

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

# AEP-0001 §5.2 / schema allOf: foreign-emitter session events carry session but never seq.
COMMAND_TYPE = re.compile(
    r"^(control\.attention\.respond|control\.cancel|control\.pause|control\.resume"
    r"|x\.[a-z0-9_-]+\.control\..+|attention\.routed)$"
)
TYPE_GRAMMAR = re.compile(
    r"^((agent|session|run|progress|tool|delegation|attention|resource|error|state|assessment|message|control)"
    r"(\.[a-z0-9_]+)+|x\.[a-z0-9_-]+\.[a-z0-9_]+(\.[a-z0-9_]+)+)$"
)
SEVERITIES = ("debug", "info", "notice", "warning", "error", "critical")
CAPTURES = ("none", "metadata", "redacted", "full")
CORE_ATTRIBUTES = frozenset({"aep", "id", "type", "subject", "time", "source", "agent", "session", "run",
                             "step", "seq", "epoch", "cause", "traceparent", "severity", "capture", "data"})
_EXTENSION = re.compile(r"[a-z0-9]{1,20}")
UNKNOWN_SESSION = "unknown"
_OPTIONAL = ("cause", "traceparent", "severity", "capture")
_USUAL_KEYS = frozenset({"type", "agent", "id", "subject", "session", "run", "time", "capture", "data"})
# ".000Z" .. ".999Z" (and ".1000Z", which float rounding can in theory produce): the time suffix.
_MS_SUFFIX = [f".{ms:03d}Z" for ms in range(1001)]
log = logging.getLogger("aep.stamper")



class StampError(ValueError):
    """A draft cannot become a valid envelope (a mapping bug, never the vendor's fault)."""


# Two Crockford characters per 10 bits: a 10-bit group is one table lookup.
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
_PAIR_VALUE = {pair: i for i, pair in enumerate(_PAIRS)}
# os.urandom bytes -> Crockford characters: 256 is a multiple of 32, so each character is 5 uniform bits.
_RANDOM_CHARS = bytes((_CROCKFORD * 8).encode("ascii"))
_RAND_MASK = (1 << 80) - 1


def _encode(value: int, pairs: int) -> str:
    return "".join([_PAIRS[(value >> (10 * i)) & 1023] for i in range(pairs - 1, -1, -1)])


class Ulid:
    """Monotonic ULID generator: 48-bit milliseconds + 80 random bits, Crockford base32.

    A new millisecond takes 80 fresh random bits; within one millisecond the random part is
    incremented, so ids sort by creation. The hot path is string work only: the random part is
    16 characters sliced from a pool drawn 64 ids at a time (16 random Crockford characters are 80
    random bits), the time part is re-encoded once per millisecond (its high 8 characters once per
    1,024 ms), and an increment re-encodes only the last 4 characters (20 bits) unless it carries.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -(1 << 63)  # below any time: the first id always takes fresh bits
        self._time_hi_key = -1
        self._time_hi = ""
        self._last_id = ""
        self._low = -1  # the last id's final 4 characters as a 20-bit int; -1 until an increment needs it
        self._pool = ""
        self._pos = 1024  # pool exhausted: the first id draws it

    @property
    def _last_rand(self) -> int:
        """The 80 random bits of the last id (for tests and debugging)."""
        value = 0
        for c in self._last_id[10:]:
            value = value * 32 + _CROCKFORD.index(c)
        return value

    def new(self, now_ms: int | None = None) -> str:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            return self.new_unlocked(ms)

    def new_unlocked(self, ms: int) -> str:
        """``new`` for a caller that already keeps to one thread (the stamper, like its seq counters)."""
        if ms > self._last_ms:
            self._last_ms = ms
            if ms >> 10 != self._time_hi_key:
                self._time_hi_key = ms >> 10
                self._time_hi = _encode(ms >> 10, 4)
            pos = self._pos
            if pos == 1024:
                self._pool = os.urandom(1024).translate(_RANDOM_CHARS).decode("ascii")
                pos = 0
            self._pos = pos + 16
            self._low = -1
            uid = self._last_id = self._time_hi + _PAIRS[ms & 1023] + self._pool[pos:pos + 16]
            return uid
        # Same millisecond (or a clock step back): increment, so ids still sort by creation.
        last = self._last_id
        low = self._low
        if low < 0:
            low = (_PAIR_VALUE[last[22:24]] << 10) | _PAIR_VALUE[last[24:]]
        low += 1
        if low >> 20:  # the carry reaches the high random characters: redo all 80 bits
            rand = (self._last_rand + 1) & _RAND_MASK
            head = last[:10] + _encode(rand >> 20, 6)
            low = rand & 0xFFFFF
        else:
            head = last[:22]
        self._low = low
        uid = self._last_id = head + _PAIRS[low >> 10] + _PAIRS[low & 1023]
        return uid


def rfc3339_ms(ts: float) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-12-02T14:10:04.123Z``."""
    secs = int(ts)
    ms = int((ts - secs) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{ms:03d}Z"


def safe_host(name: str) -> str:
    """A hostname usable as a URI authority (lowercase, only letters, digits, ``.`` and ``-``)."""
    cleaned = re.sub(r"[^a-z0-9.-]", "-", name.lower()).strip(".-")
    return cleaned or "localhost"


def source_uri(host: str, agent: str, session: str | None) -> str:
    """``aep://{host}/agent/{agent}[/session/{session}]`` with every segment percent-encoded."""
    base = f"aep://{host}/agent/{quote(agent, safe='')}"
    return base if session is None else f"{base}/session/{quote(session, safe='')}"


# The process epoch's file. ``quote`` never leaves an ``@`` in a name, so no agent's legacy
# ``<agent>.json`` (epochs were once kept per agent, bumped when an agent was first seen) is this one.
_GENERATION = "@generation"
_CLOCK_ORIGIN_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: keeps a clock-seeded epoch shorter


class EpochStore:
    """The epoch of this process, one for every agent, persisted as ``<state_dir>/epochs/@generation.json``.

    AEP-0001 §7: an emitter whose seq counter is not durable MUST bump the epoch on restart and
    never reuse one in a session, which takes durable memory or a seed that only grows. It is taken
    once per process, in ``check`` (the service's start, with the folder known writable), under a
    file lock (two processes sharing a state directory each take their own), above every epoch an
    earlier start took, the per-agent ones of older versions included. Nothing is written after
    that, so a folder that breaks while the collector runs cannot make a later start reuse it.

    Without ``check`` (a stamper used on its own) the epoch is taken at the first event; if it
    cannot be persisted then, or an epoch file is unreadable, it is seeded from the clock (milliseconds
    since 2026), which no earlier start can have reached and a later one passes, so it cannot
    repeat; ``report`` (the service's /healthz) says so. A later start on the repaired folder goes
    on from the persisted epoch, below a clock-seeded one: a regression consumers detect
    (``epoch-regression``), never a repeated position.
    """

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir).expanduser() / "epochs"
        self._value: int | None = None
        self._lock = threading.Lock()
        self.unpersisted: int | None = None
        self.report: Callable[[str], None] | None = None

    def check(self) -> None:
        """Take and persist this process's epoch; raise ``OSError`` naming the folder if it cannot."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=self.dir).close()
            with self._lock:
                if self._value is None:
                    self._value = self._bump()
        except OSError as exc:
            raise OSError(exc.errno, f"state directory {self.dir} is not writable ({exc.strerror or exc}): the "
                          "epochs are persisted there; fix it or set service.state_dir") from exc

    def epoch(self, agent: str) -> int:
        """The epoch ``agent``'s sessions are stamped with: this process's, the same for every agent."""
        value = self._value
        if value is None:
            with self._lock:
                value = self._value
                if value is None:
                    try:
                        value = self._bump()
                    except OSError as exc:
                        value = self._unpersisted(exc)
                    self._value = value
        return value

    def _unpersisted(self, exc: OSError) -> int:
        """An epoch kept in memory only, seeded from the clock: stamping goes on (events are never
        dropped for it) and no restart, persisted or not, can have taken it before."""
        value = max(self._previous()[0] + 1, _clock_epoch())
        self.unpersisted = value
        detail = (f"cannot persist the epoch in {self.dir} ({exc.strerror or exc}); stamping goes on with "
                  f"epoch {value} seeded from the clock (it cannot repeat; a later start on the repaired "
                  "folder goes on from the persisted epoch, below it)")
        if self.report is not None:
            self.report(detail)  # logged once, shown in /healthz
        else:
            log.error("%s", detail)
        return value

    def _previous(self) -> tuple[int, bool]:
        """(the highest epoch persisted so far, or -1; whether an epoch file was unreadable: the process
        epoch's, or an older version's per-agent one, whose agent may have gone above all the others)."""
        highest, unreadable = -1, False
        with contextlib.suppress(OSError):
            for path in self.dir.glob("*.json"):
                try:
                    highest = max(highest, int(json.loads(path.read_text())["epoch"]))
                except (OSError, ValueError, TypeError, KeyError, OverflowError):  # 1e999 reads as inf
                    unreadable = True
        return highest, unreadable

    def _bump(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{_GENERATION}.json"
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                previous, unreadable = self._previous()
                # A damaged file lost the memory: the clock is the seed that only grows.
                value = max(previous + 1, _clock_epoch() if unreadable else 0)
                atomic_write(path, json.dumps({"epoch": value}), durable=True)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return value


_last_clock_epoch = -1


def _clock_epoch() -> int:
    """Milliseconds since 2026, above the last one this process took (two stores in one millisecond)."""
    global _last_clock_epoch
    _last_clock_epoch = max(int(time.time() * 1000) - _CLOCK_ORIGIN_MS, _last_clock_epoch + 1)
    return _last_clock_epoch


class Bloom:
    """A fixed-size Bloom filter of session keys (1 MiB): no false negatives, bounded forever."""

    def __init__(self, bits: int = 1 << 23, hashes: int = 4) -> None:
        self.bits, self.k = bits, hashes
        self.array = bytearray(bits // 8)

    def _positions(self, key: tuple[str, str]) -> list[int]:
        h = hashlib.blake2b("\x00".join(key).encode("utf-8", "surrogatepass"), digest_size=16).digest()
        a, b = int.from_bytes(h[:8], "big"), int.from_bytes(h[8:], "big") | 1
        return [(a + i * b) % self.bits for i in range(self.k)]

    def add(self, key: tuple[str, str]) -> None:
        for p in self._positions(key):
            self.array[p >> 3] |= 1 << (p & 7)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return all(self.array[p >> 3] & (1 << (p & 7)) for p in self._positions(key))


class _Lane:
    """One session's stamping state: its next ``seq`` and the envelope parts fixed for the session."""

    __slots__ = ("next", "source", "epoch", "high")

    def __init__(self, start: int, source: str, epoch: int, high: list[int]) -> None:
        self.next = start
        self.source = source
        self.epoch = epoch
        self.high = high
        """The agent's high-water mark (one cell shared by its lanes), kept above every seq assigned."""


class Stamper:
    """Stamps drafts into envelopes. One per service, shared by every pipeline.

    Sharing it keeps ``seq`` unique per ``(agent, session)`` even when several pipelines emit
    into the same session.
    """

    def __init__(self, state_dir: Path, host: str | None = None, max_sessions: int = 100_000) -> None:
        self.host = safe_host(host or socket.gethostname())
        self.epochs = EpochStore(state_dir)
        self.ids = Ulid()
        self.max_sessions = max_sessions
        # Per-session lanes, least recently used first (the seq state bound evicts from the front).
        self._lanes: OrderedDict[tuple[str, str], _Lane] = OrderedDict()
        self._last_lane: _Lane | None = None  # the lane at the end of _lanes, if any: no move needed
        self._high: dict[str, list[int]] = {}
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
        return self._take_seq(self._lane(agent, session))

    def _lane(self, agent: str, session: str) -> _Lane:
        """The session's lane, now the most recently used one (created if the session is new)."""
        key = (agent, session)
        lane = self._lanes.get(key)
        if lane is None:
            return self._new_lane(key)
        if lane is not self._last_lane:
            self._lanes.move_to_end(key)
            self._last_lane = lane
        return lane

    def _new_lane(self, key: tuple[str, str]) -> _Lane:
        agent = key[0]
        high = self._high.get(agent)
        if high is None:
            high = self._high[agent] = [0]
        epoch = self._epoch.get(agent)
        if epoch is None:
            epoch = self._epoch[agent] = self.epochs.epoch(agent)
        # New sessions start at 0; one we released may come back, so it resumes above every seq
        # assigned so far (a Bloom filter: a false positive only costs a gap).
        lane = _Lane(high[0] if key in self._released else 0, self._sources.get(key) or self._source(*key),
                     epoch, high)
        self._lanes[key] = lane
        self._last_lane = lane
        if len(self._lanes) > self.max_sessions:
            old, _ = self._lanes.popitem(last=False)
            self._released.add(old)
        return lane

    @staticmethod
    def _take_seq(lane: _Lane) -> int:
        value = lane.next
        lane.next = value + 1
        high = lane.high
        if value + 1 > high[0]:
            high[0] = value + 1
        return value

    def release(self, agent: str, session: str) -> None:
        """Free a session's counter (after ``session.ended``); a late event resumes above it."""
        if self._lanes.pop((agent, session), None) is not None:
            self._released.add((agent, session))

    @property
    def sessions(self) -> int:
        return len(self._lanes)

    def _type_kind(self, etype: Any) -> int:
        """0 session event, 1 agent-scoped, 2 command (session, no seq), 3 ``session.ended`` (a
        session event that releases the seq counter); cached per type."""
        kind = self._types.get(etype)
        if kind is None:
            if not isinstance(etype, str) or not TYPE_GRAMMAR.fullmatch(etype):
                raise StampError(f"draft type {etype!r} does not match the AEP type grammar")
            kind = 1 if etype.startswith("agent.") else 2 if COMMAND_TYPE.fullmatch(etype) else \
                3 if etype == "session.ended" else 0
            if len(self._types) < 10_000:  # vendor fallbacks are open-ended: a cache, bounded
                self._types[etype] = kind
        return kind

    def _time(self, ts: float) -> str:
        secs = int(ts)
        if secs != self._time_sec:
            self._time_sec = secs
            self._time_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
        ms = int((ts - secs) * 1000)
        return self._time_prefix + (_MS_SUFFIX[ms] if ms >= 0 else f".{ms:03d}Z")

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

        The hot path of every event. The usual draft (a session event holding only ``type``,
        ``agent``, ``session``, ``subject``, ``run``, ``id``, ``time``, ``capture`` and ``data``, with
        ``capture`` and ``data`` set) is stamped with one look-up of its session's lane (seq,
        ``source``, epoch) and the envelope built in one dict display, in the key order of the
        general path (``_stamp_general``), which every other draft takes (a stamped event too:
        ``aep`` and ``source`` are not usual keys).
        """
        # Subscripts are cheaper look-ups than get; a missing key or an unhashable type or agent goes
        # the general way.
        try:
            etype = draft["type"]
            capture = draft["capture"]
            data = draft["data"]
            agent = draft["agent"]
            session = draft["session"]
            if self._types.get(etype) != 0 or not capture or data is None or not session:
                return self._stamp_general(draft, now)
            if type(session) is not str:
                session = str(session)
            key = (agent, session)
            lane = self._lanes.get(key)
        except (KeyError, TypeError):
            return self._stamp_general(draft, now)
        # The five keys above are there: the draft is usual if its other keys are among the three
        # optional usual ones (cheaper than a subset test of its keys).
        n = len(draft)
        if n == 5:
            subject = run = uid = when = None
        else:
            if n != 5 + ("subject" in draft) + ("run" in draft) + ("id" in draft) + ("time" in draft):
                return self._stamp_general(draft, now)
            get = draft.get
            subject, run, uid, when = get("subject"), get("run"), get("id"), get("time")
        if lane is None:
            # Only a non-empty str agent gets a lane, and only a str equals one: a hit needs no check.
            if not isinstance(agent, str) or not agent:
                raise StampError(f"draft of type {etype} has no agent")
            lane = self._new_lane(key)
        elif lane is not self._last_lane:  # a hook stream mostly repeats its session: no move then
            self._lanes.move_to_end(key)
            self._last_lane = lane
        ts = time.time() if now is None else now
        # An id minted earlier (attention correlation needs the request id before stamping) is kept.
        if uid is None or not (isinstance(uid, str) and uid):
            uid = self.ids.new_unlocked(int(ts * 1000))
        if type(when) is str and when:  # a time the mapping took from its record (OTLP)
            stamp_time = when
        else:
            secs = int(ts)
            if secs != self._time_sec:
                self._time_sec = secs
                self._time_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
            ms = int((ts - secs) * 1000)
            stamp_time = self._time_prefix + (_MS_SUFFIX[ms] if ms >= 0 else f".{ms:03d}Z")
        seq = lane.next
        lane.next = seq + 1
        high = lane.high
        if seq >= high[0]:
            high[0] = seq + 1
        # One display per shape (subject, run present or not): the dict is sized once, no resize.
        if run is None or run == "":
            if subject is None or subject == "":
                return {"aep": AEP_VERSION, "id": uid, "type": etype, "time": stamp_time, "source": lane.source,
                        "agent": agent, "session": session, "seq": seq, "epoch": lane.epoch, "capture": capture,
                        "data": data}
            return {"aep": AEP_VERSION, "id": uid, "type": etype,
                    "subject": subject if type(subject) is str else str(subject), "time": stamp_time,
                    "source": lane.source, "agent": agent, "session": session, "seq": seq, "epoch": lane.epoch,
                    "capture": capture, "data": data}
        if type(run) is not str:
            run = str(run)
        if subject is None or subject == "":
            return {"aep": AEP_VERSION, "id": uid, "type": etype, "time": stamp_time, "source": lane.source,
                    "agent": agent, "session": session, "run": run, "seq": seq, "epoch": lane.epoch,
                    "capture": capture, "data": data}
        return {"aep": AEP_VERSION, "id": uid, "type": etype,
                "subject": subject if type(subject) is str else str(subject), "time": stamp_time,
                "source": lane.source, "agent": agent, "session": session, "run": run, "seq": seq,
                "epoch": lane.epoch, "capture": capture, "data": data}

    def _stamp_general(self, draft: Event, now: float | None) -> Event:
        """``stamp`` for any draft: agent-scoped and command types, optionals, extension attributes."""
        if draft.__class__ is not dict and not isinstance(draft, Mapping):
            # Only a buggy processor hands on such a value: refused like any unstampable draft.
            raise StampError(f"a processor passed on a {type(draft).__name__}, not a draft")
        if "aep" in draft and "id" in draft and "source" in draft:
            return _public(draft)  # already stamped (a redelivered ack): never re-stamp
        get = draft.get
        usual = _USUAL_KEYS.issuperset(draft)
        etype = get("type")
        kind = self._types.get(etype)
        if kind is None:
            kind = self._type_kind(etype)
        agent = get("agent")
        if not isinstance(agent, str) or not agent:
            raise StampError(f"draft of type {etype} has no agent")
        ts = time.time() if now is None else now
        pre = get("id")
        ev: dict[str, Any] = {"aep": AEP_VERSION,
                              "id": pre if isinstance(pre, str) and pre else self.ids.new_unlocked(int(ts * 1000)),
                              "type": etype}
        subject = get("subject")
        if subject is not None and subject != "":
            ev["subject"] = subject if type(subject) is str else str(subject)
        when = get("time")
        ev["time"] = when if type(when) is str and when else self._time(ts)
        if kind == 1:
            ev["source"] = self._sources.get((agent, None)) or self._source(agent, None)
            ev["agent"] = agent
        else:
            session = get("session") or UNKNOWN_SESSION
            if type(session) is not str:
                session = str(session)
            lane = self._lane(agent, session) if kind == 0 or kind == 3 else None
            ev["source"] = lane.source if lane is not None else (
                self._sources.get((agent, session)) or self._source(agent, session))
            ev["agent"] = agent
            ev["session"] = session
            run = get("run")
            if run is not None and run != "":
                ev["run"] = run if type(run) is str else str(run)
            if not usual:
                step = get("step")
                if step is not None and step != "":
                    ev["step"] = step if type(step) is str else str(step)
            if lane is not None:
                ev["seq"] = self._take_seq(lane)
                ev["epoch"] = lane.epoch
                if kind == 3:
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


def _public(event: Event) -> Event:
    return {k: v for k, v in event.items() if not k.startswith("_")}
