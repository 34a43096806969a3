"""The ``relay_server`` exporter: the collector serves the consumer side of AEP itself.

Consumers (``aep-collector tail``, the official SDK, live.js) attach to this process on a loopback
port: SSE and WebSocket streams with filters, resume and capture ceilings, HTTP ingest from other
emitters, the roster, and the control profile. A command for a session one of our pipelines
emitted goes to the control router in this same process (the held hook answers); a command for a
session a WebSocket emitter claims is forwarded to it; anything else gets ``no-route``.

Auth: a bearer token from ``token`` (``AEP_TOKEN`` in the default config) or, when that is empty,
from ``<state_dir>/relay.token``, created 0600 on first start. ``<state_dir>/relay.json`` tells the
operator CLI where the role listens and where the token is. While at least one authenticated
consumer is attached (a WebSocket consumer, or a live SSE stream such as ``aep-collector tail``,
whose operator answers with ``aep-collector respond``), the router is told a route is live, so
receivers hold permission requests for an operator; with none attached they answer at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import sys
from collections import OrderedDict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aep_collector.pipeline.atomic import atomic_write
from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.control import BusyAnswers
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.http_refusals import JsonRefusalRunner
from aep_collector.pipeline.model import Event
from aiohttp import web

from .config import RelayServerConfig
from .match import served_problem
from .server import Surface

__all__ = ["FACTORY", "RelayServer", "RelayServerConfig", "read_token", "DISCOVERY_FILE"]

log = logging.getLogger("aep.exporter.relay_server")

DISCOVERY_FILE = "relay.json"
TOKEN_FILE = "relay.token"
MAX_OWNED = 100_000
"""Sessions remembered as ours for command routing (oldest forgotten first)."""


def _named(ev: Any, key: str) -> str:
    """``ev[key]`` for a health detail, whatever its type, at most 64 characters."""
    value = ev.get(key) if isinstance(ev, dict) else None
    return (value if isinstance(value, str) else repr(value))[:64]


def read_token(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def ensure_token_file(path: Path) -> str:
    """The token in ``path``, creating it (mode 0600, never readable by others) when absent."""
    token = read_token(path)
    if token is not None:
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return token


class RelayServer:
    """Exporter side: every stamped event is buffered and fanned out to subscribers."""

    persistent_queue = False
    """Fan-out is in-process and history is the JSONL record: a disk queue would only replay stale
    events into live streams after a restart."""

    def __init__(self, settings: CreateSettings, config: RelayServerConfig) -> None:
        config.validate()
        self.id = f"exporter/{settings.id}"
        self.config = config
        self.instance = f"{socket.gethostname()}/{os.getpid()}"
        self.host = Host()
        self.token = config.token or ""
        self.token_path: Path | None = None
        self.surface = Surface(self)
        self.owned: OrderedDict[str, dict[str, None]] = OrderedDict()
        """Session -> the agents of ours that emitted it (session ids are unique per agent only)."""
        self.consumers = 0
        self._routed: set[str] = set()
        self._runner: web.AppRunner | None = None
        self._beat: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """Commands handed to the control router and not yet decided: at most ``command_queue``."""
        self._busy = BusyAnswers(self, "WebSocket consumers", log)
        self.port = 0
        self.discovery_path: Path | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self, host: Host) -> None:
        self.host = host
        if not self.token:
            self.token_path = Path(self.config.token_file).expanduser() if self.config.token_file \
                else Path(host.state_dir) / TOKEN_FILE
            self.token = ensure_token_file(self.token_path)
        host_name, _, port = self.config.endpoint.rpartition(":")
        # A request aiohttp cannot parse gets a JSON body naming the problem, as every refusal here.
        self._runner = JsonRefusalRunner(self.surface.app(), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host_name.strip("[]"), int(port), reuse_address=True)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            self._runner = None
            raise
        self.port = self._runner.addresses[0][1]
        self._beat = asyncio.get_running_loop().create_task(self.surface.heartbeat())
        host.health.set_flag(self.id, "relay", True)
        watch = getattr(host.control, "watch", None)
        if watch is not None:
            watch(self._agent_registered)
        self._write_discovery(host)
        where = f"token file {self.token_path}" if self.token_path else "token from the config (AEP_TOKEN)"
        log.info("relay role listening on %s (%s)", self.url, where)
        print(f"aep-collector: relay role on {self.url}; {where}", file=sys.stderr, flush=True)

    @property
    def url(self) -> str:
        host_name = self.config.endpoint.rpartition(":")[0]
        return f"http://{host_name}:{self.port}"

    def _write_discovery(self, host: Host) -> None:
        path = Path(host.state_dir) / DISCOVERY_FILE
        doc = {"endpoint": self.url, "token_file": str(self.token_path) if self.token_path else None,
               "pid": os.getpid(), "instance": self.instance}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(doc) + "\n")
            self.discovery_path = path
        except OSError as exc:
            host.health.fail(self.id, "discovery-file", f"cannot write {path}: {exc}")

    async def export(self, events: list[Event]) -> int:
        """Buffer and fan out each event; one the relay cannot serve is left out, counted and shown
        in ``/healthz``, and the rest of the batch is still delivered. Returns how many it left
        out, so the memory queue counts only the rest ``exported``."""
        left_out = 0
        for ev in events:
            problem = served_problem(ev)
            if problem is not None:
                self._left_out(ev, "invalid-event", problem)
                left_out += 1
                continue
            session = ev.get("session")
            if session is not None and "seq" in ev:  # served_problem: a str session, a str agent
                self.owned.setdefault(session, {})[ev["agent"]] = None
                self.owned.move_to_end(session)
                if len(self.owned) > MAX_OWNED:
                    self.owned.popitem(last=False)
            try:
                self.surface.publish(ev)
            except Exception as exc:  # e.g. a plug-in's value that is not JSON: only this event is lost
                self._left_out(ev, "unservable-event", f"{type(exc).__name__}: {exc}")
                left_out += 1
        return left_out

    def _left_out(self, ev: Any, cause: str, problem: str) -> None:
        """Count an event subscribers will not get and raise an incident naming it (logged once per
        cause while it recurs, by ``Health.incident``); the pipeline's JSONL record, written first, has it."""
        self.host.health.count(self.id, "dropped")
        self.host.health.incident(self.id, cause, f"event {_named(ev, 'id')} ({_named(ev, 'type')}) "
                                                  f"not served to subscribers: {problem[:300]}")

    async def shutdown(self) -> None:
        self.surface.close_all()
        for agent in list(self._routed):
            self._set_route(agent, False)
        if self._beat is not None:
            self._beat.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.discovery_path is not None:
            with contextlib.suppress(OSError):
                doc = json.loads(self.discovery_path.read_text(encoding="utf-8"))
                if doc.get("pid") == os.getpid():
                    self.discovery_path.unlink()
        self.host.health.set_flag(self.id, "relay", False)

    # -- what the surface asks of the collector ---------------------------------------------------

    def owners_of(self, session: str) -> list[str]:
        """Our agents that emitted ``session``, each once per collector claiming it (a gateway learns
        the edges holding a session from its events): more than one is an ``ambiguous`` route (AEP-0004 §4)."""
        claimants = getattr(self.host.control, "claimants", None)
        owners: list[str] = []
        for agent in self.owned.get(session, ()):
            owners.extend([agent] * max(len(claimants(agent, session)) if claimants is not None else 0, 1))
        return owners

    def contested(self, session: str) -> None:
        """A command met an ambiguous route: have the claims checked, so a retry finds a collector gone."""
        recheck = getattr(self.host.control, "recheck", None)
        if recheck is not None:
            for agent in self.owned.get(session, ()):
                recheck(agent, session)

    def submit(self, cmd: dict[str, Any], agent: str) -> Coroutine[Any, Any, None] | None:
        """Hand ``cmd`` to the control router off the reading path. With ``command_queue`` commands
        still undecided it is answered ``busy`` instead: returned is that answer, for the reader to
        await before its next frame, so a consumer sending commands faster than they are decided
        waits in its socket rather than in this process's memory."""
        submit = getattr(self.host.control, "submit", None)
        if submit is None:
            return None
        if len(self._tasks) >= self.config.command_queue:
            return self._busy.answer(cmd, agent, len(self._tasks))
        self._busy.queued(cmd)
        task = asyncio.get_running_loop().create_task(submit(cmd, agent))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._decided(done, cmd))
        return None

    def _decided(self, task: asyncio.Task[None], cmd: dict[str, Any]) -> None:
        self._tasks.discard(task)
        self._busy.taken(cmd, not self._tasks)

    def accepts_union(self) -> list[str]:
        control = self.host.control
        out: set[str] = set()
        for agent in list(getattr(control, "agents", {}) or {}):
            out.update(control.accepts(agent) or [])
        return sorted(out)

    def own_roster(self) -> list[dict[str, Any]]:
        control = self.host.control
        entries = []
        for session, agents in self.owned.items():
            for agent in agents:  # one entry per claimant, never merged (AEP-0003 §4.1)
                entry: dict[str, Any] = {"session": session, "agent": agent, "instance": self.instance}
                accepts = control.accepts(agent) if control is not None else None
                if accepts is not None:
                    entry["control"] = {"accepts": accepts, "ack_window_ms": self.config.ack_window_ms}
                entries.append(entry)
        return entries

    def health_snapshot(self) -> dict[str, Any]:
        return self.host.health.snapshot()

    def report_shed(self, detail: str) -> None:
        self.host.health.count(self.id, "shed")
        self.host.health.incident(self.id, "slow-consumer", detail)  # shown for a while, then cleared

    # -- route liveness: hold only while an operator could answer ----------------------------------

    def consumer_joined(self) -> None:
        self.consumers += 1
        if self.consumers == 1:
            for agent in self._control_agents():
                self._set_route(agent, True)

    def consumer_left(self) -> None:
        self.consumers = max(self.consumers - 1, 0)
        if self.consumers == 0:
            for agent in list(self._routed):
                self._set_route(agent, False)

    def _agent_registered(self, agent: str) -> None:
        if self.consumers > 0:
            self._set_route(agent, True)

    def _control_agents(self) -> list[str]:
        control = self.host.control
        return [a for a in list(getattr(control, "agents", {}) or {}) if control.accepts(a) is not None]

    def _set_route(self, agent: str, live: bool) -> None:
        if live == (agent in self._routed):
            return
        set_route = getattr(self.host.control, "set_route", None)
        if set_route is None:
            return
        set_route(agent, live)
        if live:
            self._routed.add(agent)
        else:
            self._routed.discard(agent)


FACTORY = Factory(
    kind=Kind.EXPORTER,
    type="relay_server",
    config_class=RelayServerConfig,
    create=lambda settings, cfg: RelayServer(settings, cfg),
    description="Serves the AEP relay role itself: SSE/WebSocket streams, replay, ingest, "
                "and command routing to held hooks",
)
