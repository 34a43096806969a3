"""Run synthesis: give every session event the run it happened in.

Driven by type, so vendor mappings stay pure: ``run.started`` opens a run (minting an id when the
vendor names none), ``run.finished|failed|cancelled`` close it, and every other session event
between them carries the open run's id. A ``run.started`` with ``_drain: "cancelled"`` first closes
a still-open run as ``run.cancelled`` (the Codex/Kimi interrupt-drain rule). ``_runs: "none"``
opts a draft out (OTLP channels never synthesize runs). ``_lane`` keeps a nested agent loop that
shares its parent's session (a Cline subagent in the parent's task) from replacing the parent's
open run: runs are tracked per ``(agent, session, lane)``. State is explicit: ``RunState``.

The same lifecycle rule holds for sessions: at most one ``session.ended`` per session (AEP-0002
§2.5). A vendor that fires its end hook twice (a retry, a resumed session ending again) gets the
second one as ``x.{agent}.session.ended_again`` — degraded, never dropped, never invalid.

Runs get the same treatment (AEP-0002 §2: one terminal per run, across every epoch). Runs that
ended are remembered per ``(agent, session)``: a second terminal of an ended run becomes
``x.{agent}.run.{finished|failed|cancelled}_again``, a second ``run.started`` naming an open or
ended run becomes ``x.{agent}.run.started_again``, and any other event still naming it (a tool that fires after
Codex's ``Stop`` for the same ``turn_id``) loses its ``run`` and stays a session event — late
session events after a terminal are legal, an event inside a finished run is not.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass

from aep_collector.pipeline.component import Factory, Kind
from aep_collector.pipeline.model import Batch

TERMINALS = frozenset({"run.finished", "run.failed", "run.cancelled"})
_LIFECYCLE = TERMINALS | {"run.started", "session.ended"}
_AGENT_SCOPED = object()


def mint_run_id() -> str:
    """A fresh run id inside ``[A-Za-z0-9._-]`` (AEP-0003 §9.6), sortable by creation time."""
    return f"r_{int(time.time() * 1000):x}{os.urandom(4).hex()}"


@dataclass
class RunsConfig:
    """Config of the ``runs`` processor."""

    max_sessions: int = 10_000
    """Open-run entries kept; the least recently used session beyond this is forgotten."""

    def validate(self) -> None:
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")


class RunState:
    """Open run per ``(agent, session, lane)`` and the sessions already ended, both bounded LRU."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.open: OrderedDict[tuple[str, ...], str] = OrderedDict()
        self.ended: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.finished: OrderedDict[tuple[str, str, str], None] = OrderedDict()  # (agent, session, run)
        self.max_sessions = max_sessions
        # The keys of ``open`` that name a lane: while there are none (nearly always), a session's
        # end closes its one lane-less key instead of scanning every open run for its session.
        self.laned: set[tuple[str, ...]] = set()

    def finish(self, key: tuple[str, str, str]) -> bool:
        """Record a run terminal; False if this run had already reached one."""
        if key in self.finished:
            self.finished.move_to_end(key)
            return False
        self.finished[key] = None
        # Bounded like the rest: a run forgotten here can only be re-ended after this many others.
        while len(self.finished) > self.max_sessions:
            self.finished.popitem(last=False)
        return True

    def is_finished(self, key: tuple[str, str, str]) -> bool:
        return key in self.finished

    def end(self, key: tuple[str, str]) -> bool:
        """Record a session end; False if this session had already ended."""
        if key in self.ended:
            self.ended.move_to_end(key)
            return False
        self.ended[key] = None
        while len(self.ended) > self.max_sessions:
            self.ended.popitem(last=False)
        return True

    def get(self, key: tuple[str, ...]) -> str | None:
        run = self.open.get(key)
        if run is not None:
            self.open.move_to_end(key)
        return run

    def set(self, key: tuple[str, ...], run: str) -> None:
        self.open[key] = run
        self.open.move_to_end(key)
        if key[2]:
            self.laned.add(key)
        while len(self.open) > self.max_sessions:
            self.laned.discard(self.open.popitem(last=False)[0])

    def close(self, key: tuple[str, ...]) -> None:
        self.open.pop(key, None)
        self.laned.discard(key)

    def close_session(self, agent: str, session: str) -> None:
        """Close every open run of a session, whatever its lane."""
        if self.laned:
            for k in [k for k in self.open if k[0] == agent and k[1] == session]:
                self.close(k)
        else:
            self.open.pop((agent, session, ""), None)


class RunsProcessor:
    """The run-synthesis step of the chain."""

    def __init__(self, config: RunsConfig | None = None, state: RunState | None = None) -> None:
        self.config = config or RunsConfig()
        self.state = state or RunState(self.config.max_sessions)
        self._kinds: dict[str, object] = {}  # type -> what this step does with it, cached

    def _classify(self, etype: str) -> object:
        """``_AGENT_SCOPED``, True (a run or session boundary) or False (an event inside a run)."""
        if not isinstance(etype, str):
            return _AGENT_SCOPED  # not a type this step knows: passed on as it is, never cached
        kind: object = _AGENT_SCOPED if etype.startswith("agent.") else etype in _LIFECYCLE
        if len(self._kinds) < 10_000:  # vendor fallback types are open-ended: a cache, bounded
            self._kinds[etype] = kind
        return kind

    def __call__(self, batch: Batch) -> Batch:
        out: Batch = []
        append = out.append
        state = self.state
        opened, finished = state.open, state.finished
        kinds = self._kinds
        for item in batch:
            try:
                # ``item.get("_runs") == "none"`` with no call when the hint is absent (nearly always).
                if not isinstance(item, dict):
                    append(item)
                    continue
                if "_runs" in item and item["_runs"] == "none":
                    # The hint is this step's alone: taken off once honoured, so the stamper sees the
                    # usual draft shape (its fast path) and not a key it must filter out.
                    del item["_runs"]
                    append(item)
                    continue
                etype = item.get("type", "")
                lifecycle = kinds.get(etype)
                if lifecycle is None:
                    lifecycle = self._classify(etype)
                if lifecycle is _AGENT_SCOPED or "agent" not in item:
                    append(item)
                    continue
                agent = item["agent"]
                session = item.get("session") or "unknown"
                if "_lane" in item:
                    lane = item["_lane"]
                    key = (agent, session, str(lane) if lane else "")
                else:
                    key = (agent, session, "")
                current = opened.get(key)  # RunState.get, inlined: this runs for every event
                if current is not None:
                    opened.move_to_end(key)
                named = item.get("run")
                if not lifecycle:  # most events: carry the open run, or lose a finished one
                    if isinstance(named, str):
                        if (agent, session, named) in finished:
                            del item["run"]  # late: a session event after the run's terminal
                    elif current is not None:
                        item["run"] = current
                elif etype == "run.started":
                    if isinstance(named, str) and (named == current or state.is_finished((agent, session, named))):
                        # A run starts once: a repeat of an open run or of an ended one is never a new run.
                        item["type"] = f"x.{_vendor_token(agent)}.run.started_again"
                        append(item)
                        continue
                    if current is not None and item.get("_drain") == "cancelled" and current != named:
                        # A run left open when the next prompt arrives was interrupted.
                        append({"type": "run.cancelled", "agent": agent, "session": item.get("session"),
                                "run": current, "data": {}})
                        state.finish((agent, session, current))
                    run = named or mint_run_id()
                    item["run"] = run
                    state.set(key, run)
                elif etype in TERMINALS:
                    run = named or current
                    if run is not None:
                        item["run"] = run
                        if not state.finish((agent, session, run)):
                            item["type"] = f"x.{_vendor_token(agent)}.{etype}_again"
                    if run == current:
                        state.close(key)
                else:  # session.ended
                    state.close_session(agent, session)  # the end of a session is not part of any run
                    if not state.end((agent, session)):
                        item["type"] = f"x.{_vendor_token(agent)}.session.ended_again"
                append(item)
            except (TypeError, AttributeError):
                # A plug-in's draft with a type, agent or session no JSON decoder would make (a list,
                # a number): not placed in any run, and not the end of the batch; the stamper and
                # the capture gate judge it. ``try`` costs nothing in 3.11 until something raises.
                append(item)
        return out


def _vendor_token(agent: str) -> str:
    token = re.sub(r"[^a-z0-9_-]+", "-", agent.lower()).strip("-")
    return token or "unknown"


FACTORY = Factory(
    kind=Kind.PROCESSOR,
    type="runs",
    config_class=RunsConfig,
    create=lambda settings, cfg: RunsProcessor(cfg),
    description="Synthesizes runs from run.started/terminal boundaries and stamps the open run on events",
)
