"""What the service offers every component at start: health, metrics, control routing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .logs import Throttle

if TYPE_CHECKING:
    from .control import ControlRouter

log = logging.getLogger("aep.health")


DEFAULT_WINDOW = 60.0


class Health:
    """Per-component health and counters, read by every ``/healthz`` and the metrics endpoint.

    Two kinds of problem, both logged once when they appear (not once per event):

    - a *condition* (``fail``) is a current state — an unwritable log directory, a full disk, a
      relay that cannot be reached. It stays until its component calls ``recover`` or, when it was
      raised with ``clears``, until that probe says the cause is gone (checked on every read).
    - an *incident* (``incident``) is something that happened — a hook that failed, a malformed
      command. It is shown for ``window`` seconds after its last occurrence, then cleared: one bad
      frame must not make the process unhealthy for good.
    """

    def __init__(self, window: float = DEFAULT_WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self.problems: dict[str, dict[str, str]] = {}
        self.flags: dict[str, dict[str, Any]] = {}
        self.counters: dict[tuple[str, str], int] = {}
        self.request_errors: dict[tuple[str, str], int] = {}
        """(receiver, cause) -> requests refused or lost for that cause (``/metrics``)."""
        self._throttle = Throttle(logging.getLogger("aep.request"))
        self.window = window
        self.clock = clock
        self._until: dict[tuple[str, str], float] = {}  # incident -> clock time it clears
        self._clears: dict[tuple[str, str], Callable[[], bool]] = {}  # condition -> "cause gone?" probe
        self._quiet: set[tuple[str, str]] = set()  # conditions logged at INFO (``fail(quiet=True)``)

    def fail(self, component: str, cause: str, detail: str = "",
             clears: Callable[[], bool] | None = None, quiet: bool = False) -> None:
        """Report a condition; ``clears()`` (if given) returning True means its cause is gone.

        ``quiet``: an expected state (not yet connected, at start), unhealthy while it lasts but
        logged at INFO when it appears and clears, so every normal start does not log an ERROR."""
        with self._lock:
            causes = self.problems.setdefault(component, {})
            fresh = cause not in causes
            causes[cause] = detail or cause
            self._until.pop((component, cause), None)
            if clears is not None:
                self._clears[(component, cause)] = clears
            else:
                self._clears.pop((component, cause), None)
            if quiet:
                self._quiet.add((component, cause))
            else:
                self._quiet.discard((component, cause))
        if fresh:
            log.log(logging.INFO if quiet else logging.ERROR, "%s: %s%s", component, cause,
                    f": {detail}" if detail else "")

    def incident(self, component: str, cause: str, detail: str = "") -> None:
        """Report something that happened; shown until ``window`` seconds pass without a repeat."""
        with self._lock:
            causes = self.problems.setdefault(component, {})
            fresh = cause not in causes
            causes[cause] = detail or cause
            self._until[(component, cause)] = self.clock() + self.window
            self._clears.pop((component, cause), None)
        if fresh:
            log.error("%s: %s%s", component, cause, f": {detail}" if detail else "")

    def recover(self, component: str, cause: str | None = None) -> None:
        if component not in self.problems:
            # The usual call (a hook, a delivery) has nothing to recover from. Read without the
            # lock: a problem another thread reports meanwhile is kept, as if it came just after.
            return
        with self._lock:
            gone = self._drop(component, cause)
        for c in gone:
            if (component, c) in self._quiet:
                self._quiet.discard((component, c))
                log.info("%s: no longer %s", component, c)
            else:
                log.warning("%s: recovered from %s", component, c)

    def _drop(self, component: str, cause: str | None) -> list[str]:
        causes = self.problems.get(component)
        if not causes:
            return []
        gone = list(causes) if cause is None else [cause] if cause in causes else []
        for c in gone:
            del causes[c]
            self._until.pop((component, c), None)
            self._clears.pop((component, c), None)
        if not causes:
            del self.problems[component]
        return gone

    def refresh(self) -> None:
        """Clear incidents past their window and conditions whose probe says the cause is gone."""
        now = self.clock()
        with self._lock:
            expired = [k for k, until in self._until.items() if until <= now]
            for component, cause in expired:
                self._drop(component, cause)
            probes = list(self._clears.items())
        for (component, cause), probe in probes:
            try:
                gone = probe()
            except Exception:  # a probe that cannot tell leaves the condition standing
                gone = False
            if gone:
                with self._lock:
                    if self._clears.get((component, cause)) is probe:
                        self._drop(component, cause)
                log.warning("%s: recovered from %s", component, cause)
        for component, cause in expired:
            log.info("%s: %s not seen for %gs; cleared", component, cause, self.window)

    def set_flag(self, component: str, name: str, value: Any) -> None:
        with self._lock:
            self.flags.setdefault(component, {})[name] = value

    def flag_any(self, name: str) -> bool:
        """True when any component reports ``name`` true (e.g. ``relay``)."""
        with self._lock:
            return any(bool(f.get(name)) for f in self.flags.values())

    def count(self, component: str, what: str, n: int = 1) -> None:
        with self._lock:
            key = (component, what)
            self.counters[key] = self.counters.get(key, 0) + n

    def request_error(self, component: str, cause: str, detail: str = "") -> None:
        """A malformed request or a client that hung up: counted, logged one line per cause (throttled).

        Not a health problem: a bad request says nothing about the collector's own state.
        """
        with self._lock:
            key = (component, cause)
            self.request_errors[key] = self.request_errors.get(key, 0) + 1
        self._throttle(component, cause, detail)

    def snapshot(self) -> dict[str, Any]:
        """The ``/healthz`` body: ``{"ok", "relay", "problems"?, "incidents"?, "dropped"?}``.

        ``problems`` names every open condition and incident (``component: {cause: detail}``);
        ``incidents`` says which of them are incidents and in how many seconds each clears.
        """
        self.refresh()
        now = self.clock()
        with self._lock:
            problems = {c: dict(p) for c, p in self.problems.items() if p}
            incidents: dict[str, dict[str, float]] = {}
            for (c, cause), until in self._until.items():
                incidents.setdefault(c, {})[cause] = round(max(until - now, 0.0), 1)
            dropped = {c: n for (c, what), n in self.counters.items() if what == "dropped" and n}
        body: dict[str, Any] = {"ok": not problems, "relay": self.flag_any("relay")}
        if problems:
            body["problems"] = problems
        if incidents:
            body["incidents"] = incidents
        if dropped:
            body["dropped"] = dropped
        return body


@dataclass
class Host:
    """Handed to every component's ``start``: the only shared surface between components."""

    health: Health = field(default_factory=Health)
    control: ControlRouter | None = None
    state_dir: Path = field(default_factory=lambda: Path("~/.aep").expanduser())
