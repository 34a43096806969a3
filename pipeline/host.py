"""What the service offers every component at start: health, metrics, control routing."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .logs import Throttle

if TYPE_CHECKING:
    from .control import ControlRouter

log = logging.getLogger("aep.health")


class Health:
    """Per-component health and counters, read by every ``/healthz`` and the metrics endpoint.

    A component reports a problem with ``fail(component, cause, detail)``; the problem is logged
    once per cause (not once per event) and stays visible until ``recover(component, cause)``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.problems: dict[str, dict[str, str]] = {}
        self.flags: dict[str, dict[str, Any]] = {}
        self.counters: dict[tuple[str, str], int] = {}
        self.request_errors: dict[tuple[str, str], int] = {}
        """(receiver, cause) -> requests refused or lost for that cause (``/metrics``)."""
        self._throttle = Throttle(logging.getLogger("aep.request"))

    def fail(self, component: str, cause: str, detail: str = "") -> None:
        with self._lock:
            causes = self.problems.setdefault(component, {})
            fresh = cause not in causes
            causes[cause] = detail or cause
        if fresh:
            log.error("%s: %s%s", component, cause, f": {detail}" if detail else "")

    def recover(self, component: str, cause: str | None = None) -> None:
        with self._lock:
            causes = self.problems.get(component)
            if not causes:
                return
            gone = list(causes) if cause is None else [cause] if cause in causes else []
            for c in gone:
                del causes[c]
            if not causes:
                del self.problems[component]
        for c in gone:
            log.warning("%s: recovered from %s", component, c)

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
        """The ``/healthz`` body: ``{"ok", "relay", "problems"?, "dropped"?}``."""
        with self._lock:
            problems = {c: dict(p) for c, p in self.problems.items() if p}
            dropped = {c: n for (c, what), n in self.counters.items() if what == "dropped" and n}
        body: dict[str, Any] = {"ok": not problems, "relay": self.flag_any("relay")}
        if problems:
            body["problems"] = problems
        if dropped:
            body["dropped"] = dropped
        return body


@dataclass
class Host:
    """Handed to every component's ``start``: the only shared surface between components."""

    health: Health = field(default_factory=Health)
    control: ControlRouter | None = None
    state_dir: Path = field(default_factory=lambda: Path("~/.aep").expanduser())
