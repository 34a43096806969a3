"""The control router (AEP-0004): owned by the pipeline, not by any exporter or receiver.

Receivers ``register`` an agent with the command types they honour and the consumer their
events flow through, and ``open`` a ``Hold`` for every attention request they keep the vendor
waiting on. Duplex exporters ``submit`` inbound commands and report whether a route is live.
The router makes exactly one ack decision per command (deduped on ``(source, id)``), emits the
ack through the pipeline like any event, and re-sends the recorded ack byte-identically when a
command is retransmitted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .canonical import digest
from .host import Health
from .model import Event

log = logging.getLogger("aep.control")

RESPOND = "control.attention.respond"
CANCEL = "control.cancel"
PERMISSION_OPTIONS: list[dict[str, str]] = [
    {"id": "allow", "label": "Allow"},
    {"id": "deny", "label": "Deny"},
]
"""Taxonomy digest §2.5: the standard options of a held binary permission card (the mappings draw
the card with them, the receivers apply an answer against them)."""
Validator = Callable[[dict[str, Any]], "str | None"]


def attention_key(kind: str, vendor_id: str | None) -> str | None:
    """The correlation key a card and its legs share, ``{kind}:{vendor id}`` (None without an id).

    The mapping tags the card with it and the receiver holds the card under it, so both build it here.
    """
    return f"{kind}:{vendor_id}" if vendor_id else None


def permission_key(tool: str | None, tool_input: Any) -> str:
    """What a permission is about when the vendor names no call id: the tool and its input.

    Digests only: a tool name can carry content (a secret in it must not ride along, even internally).
    A held card and the hook that makes it moot (the tool ran) are paired on this.
    """
    return f"permission:{digest(tool or 'unknown')}:{digest(tool_input)}"


def card_key(tool: str | None, tool_input: Any, received_ns: int) -> str:
    """The attention key of ONE permission card: ``permission_key`` plus the moment it was received.

    Unique per card, so asking the same thing twice opens two cards rather than one overwriting the
    other in the attention book (which pairs a held loop's legs and sweeps unanswered cards before
    ``session.ended`` on it, AEP-0002 §7.1). The mapping tags the card with it (with or without a
    receiver) and the receiver holds the card under it. Opaque: it rides on the draft as a hint.
    """
    return f"card:{digest(permission_key(tool, tool_input))}@{received_ns}"


def elicitation_key(elicitation_id: str | None, server: str | None) -> str:
    """The key an MCP elicitation, its result and an operator's answer share: its id, else its server's name."""
    return elicitation_id or server or "elicitation"

BUSY_DETAIL = "the collector is taking commands slower than they arrive; try again"
"""The detail of a ``busy`` answer to a command that found a transport's command queue full."""
BUSY_REMEMBERED = 1024
"""``busy`` acks kept while a command queue stays full, to re-send to a copy of the command."""

Lanes = list[tuple[Any, list[Event]]]
"""A command's recorded ack: ``(pipeline, ack events)`` for each pipeline the ack went through."""

Forward = Callable[[Event, str], Awaitable["list[Event] | None"]]
"""Sends a command to the collector that holds its session; returns that collector's acks, or
``None`` when it could not be reached."""


@dataclass
class Outcome:
    """How a hold ended: ``answered`` (with the command's answer), ``timeout``, ``dismissed``, ``oob``,
    ``cancelled`` (a ``control.cancel`` ended its run: ``command`` is the cancel) or ``shutdown``."""

    how: str
    answer: dict[str, Any] | None = None
    command: Event | None = None


@dataclass
class Hold:
    """One attention request a receiver keeps its vendor waiting on."""

    agent: str
    session: str
    lanes: list[tuple[Any, Event]]
    """(pipeline, stamped attention.requested) — one per pipeline the request went through."""
    validate: Validator
    key: str | None = None
    opened: float = field(default_factory=time.monotonic)
    future: asyncio.Future[Outcome] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def ids(self) -> list[str]:
        return [ev["id"] for _, ev in self.lanes]

    @property
    def settled(self) -> bool:
        return self.future.done()

    def settle(self, outcome: Outcome) -> bool:
        if self.future.done():
            return False
        self.future.set_result(outcome)
        return True


@dataclass
class _Agent:
    accepts: list[str] | None
    consumer: Any


class ControlRouter:
    """Decides every inbound command once; see the module docstring."""

    def __init__(self, health: Health, max_decisions: int = 10_000, max_holds: int = 1_000) -> None:
        self.health = health
        self.agents: dict[str, _Agent] = {}
        self.routes: dict[str, int] = {}
        self.holds: dict[str, Hold] = {}
        self.max_holds = max_holds
        # (source, id) -> the recorded ack lanes, or None while the decision is being made.
        self.decisions: OrderedDict[tuple[str, str], list[tuple[Any, list[Event]]] | None] = OrderedDict()
        self.max_decisions = max_decisions
        # (target agent, session, command id) -> the source whose command owns that ack cause.
        self.causes: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        self.pipelines: dict[str, Any] = {}
        self.specs: dict[str, Any] = {}
        self._watchers: list[Callable[[str], None]] = []
        # (agent, session) -> the collectors claiming that session (a gateway learns them from the
        # events it takes in), by name, with how to reach each: more than one is ambiguous.
        self.remotes: OrderedDict[tuple[str, str], dict[str, Forward]] = OrderedDict()
        self._rechecks: set[asyncio.Task[Any]] = set()
        self.ended: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        """(agent, session, claimant): that collector sent ``session.ended`` as its last word on the session."""
        self.max_remotes = max(max_decisions, 10_000)
        self.cancelled: OrderedDict[tuple[str, str], None] = OrderedDict()
        """Sessions whose run was cancelled and whose agent has not been told to stop yet."""
        self.closed = False
        """Shutting down: nothing more is held (a hold opened now would outlive its receiver)."""

    # -- wiring ---------------------------------------------------------------------------------

    def bind_pipelines(self, pipelines: dict[str, Any], specs: dict[str, Any]) -> None:
        self.pipelines, self.specs = pipelines, specs

    def register(self, agent: str, accepts: list[str] | None, consumer: Any) -> None:
        """A receiver states what it honours for ``agent`` (``None``: no control leg at all)."""
        current = self.agents.get(agent)
        if current is not None and current.accepts is not None and accepts is not None:
            accepts = sorted(set(current.accepts) | set(accepts))
        elif current is not None and accepts is None:
            accepts = current.accepts
        self.agents[agent] = _Agent(accepts if accepts is None else sorted(set(accepts)), consumer)
        if accepts is not None:
            for watcher in self._watchers:
                watcher(agent)

    def watch(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(agent)`` for every agent with a control leg, now and when one registers.

        A duplex exporter uses it to connect early, so a route is live before the agent's first
        attention request (which would otherwise not be held).
        """
        self._watchers.append(callback)
        for agent, a in list(self.agents.items()):
            if a.accepts is not None:
                callback(agent)

    def accepts(self, agent: str) -> list[str] | None:
        """The hello's ``control.accepts`` for ``agent``; ``None`` means omit the control block."""
        a = self.agents.get(agent)
        return None if a is None or a.accepts is None else list(a.accepts)

    def set_route(self, agent: str, live: bool) -> None:
        """A duplex exporter reports a hello-complete connection for ``agent`` coming or going."""
        n = self.routes.get(agent, 0) + (1 if live else -1)
        self.routes[agent] = max(n, 0)

    def route_live(self, agent: str) -> bool:
        """Whether an operator's answer could reach us now (if not, receivers do not hold)."""
        return self.routes.get(agent, 0) > 0

    def remote(self, agent: str, session: str, forward: Forward, claimant: str = "", ended: bool = False) -> None:
        """``session`` of ``agent`` is held on the collector ``claimant``: its commands go through ``forward``.

        A gateway learns this from the events it takes in; that collector decides the command
        (dedupe and byte-identical re-acks included) and its acks come back through ``forward``.
        A second collector claiming the session makes it ambiguous (AEP-0004 §4: never guess which,
        never both) until one of them is found gone: a forward with a ``probe`` says whether its
        collector still answers, and the others are probed when a new claimant appears. A claimant
        whose session ended there (``ended``: it sent ``session.ended``) yields to one where it has
        not, until it sends another event of that session (a session resumed on another host).
        """
        key = (agent, session)
        claims = self.remotes.get(key)
        if claims is None:
            claims = self.remotes[key] = {}
        else:
            self.remotes.move_to_end(key)
        fresh = claimant not in claims
        claims[claimant] = forward
        if ended:
            self.ended[(agent, session, claimant)] = None
            while len(self.ended) > self.max_remotes:
                self.ended.popitem(last=False)
        elif self.ended:
            self.ended.pop((agent, session, claimant), None)
        while len(self.remotes) > self.max_remotes:
            self.remotes.popitem(last=False)
        if fresh and len(claims) > 1:
            self.recheck(agent, session)

    def claimants(self, agent: str, session: str) -> list[str]:
        """The collectors claiming ``session`` of ``agent`` (more than one: an ambiguous route)."""
        return list(self._claims((agent, session)))

    def _claims(self, key: tuple[str, str]) -> dict[str, Forward]:
        """The claims of ``key`` that count: those of collectors where the session has not ended,
        if there are any (a session that ended everywhere still goes to its one claimant)."""
        claims = self.remotes.get(key) or {}
        if len(claims) < 2 or not self.ended:
            return claims
        open_ = {n: f for n, f in claims.items() if (*key, n) not in self.ended}
        return open_ or claims

    def recheck(self, agent: str, session: str) -> None:
        """Drop, in the background, the claimants of a contested session whose collector is gone."""
        task = asyncio.get_running_loop().create_task(self._live_claims((agent, session)))
        self._rechecks.add(task)
        task.add_done_callback(self._rechecks.discard)

    async def _live_claims(self, key: tuple[str, str]) -> dict[str, Forward]:
        """The claims of ``key`` once every claimant that no longer answers is dropped (while
        more than one claims it: a lone claimant keeps its claim, gone or not)."""
        claims = self.remotes.get(key, {})
        if len(self._claims(key)) < 2:
            return self._claims(key)
        names = list(claims)
        probes = [getattr(claims[n], "probe", None) for n in names]
        alive = await asyncio.gather(*(p() if p is not None else _alive() for p in probes))
        for name, up in zip(names, alive, strict=True):
            if not up and len(claims) > 1 and name in claims:
                del claims[name]
                log.info("control: %s no longer answers; its claim on a session of %s is dropped", name, key[0])
        return self._claims(key)

    # -- holds ------------------------------------------------------------------------------------

    def can_hold(self) -> bool:
        """Room for one more held request (checked before the request is emitted, so its
        ``respond_via`` never promises an answer path the bound then refuses)."""
        if self.closed:
            return False
        if len(self.holds) < self.max_holds:
            return True
        self.health.count("control", "refused")
        self.health.fail("control", "holds-full", f"{self.max_holds} held requests pending; not holding more")
        return False

    def open(self, agent: str, session: str, lanes: list[tuple[Any, Event]], validate: Validator,
             key: str | None = None) -> Hold | None:
        """Register a held request; ``None`` when the bound on pending holds is reached (do not hold)."""
        if self.closed:
            return None
        if len(self.holds) >= self.max_holds:
            self.health.count("control", "refused")
            self.health.fail("control", "holds-full", f"{self.max_holds} held requests pending; not holding more")
            return None
        hold = Hold(agent, session, lanes, validate, key)
        for rid in hold.ids:
            self.holds[rid] = hold
        return hold

    def close(self, hold: Hold) -> None:
        for rid in hold.ids:
            if self.holds.get(rid) is hold:
                del self.holds[rid]
        if len(self.holds) < self.max_holds:  # room again: the next request is held, so no longer full
            self.health.recover("control", "holds-full")

    def pending(self, agent: str, session: str | None = None) -> list[Hold]:
        # By identity: a hold is listed once per lane, and dataclass equality would compare whole
        # events, quadratically, across thousands of holds.
        seen: dict[int, Hold] = {}
        for h in self.holds.values():
            if h.agent == agent and (session is None or h.session == session):
                seen.setdefault(id(h), h)
        return list(seen.values())

    # -- commands ---------------------------------------------------------------------------------

    async def submit(self, command: Event, target_agent: str) -> list[Event]:
        """Decide one inbound command; never raises (a bad command is a nack, not a crash).

        Returns the ack events recorded for the command (the same objects, so the same bytes, on
        every retransmission), or none while its first copy is still being decided: a transport
        that answers a command with its ack (NATS request/reply) replies with these.
        """
        session = command.get("session")
        try:
            # Only a string session can be held anywhere (an object one is malformed: _submit says so).
            claims = self._claims((target_agent, session)) if isinstance(session, str) else None
            if claims and isinstance(session, str) and not self.pending(target_agent, session):
                if len(claims) > 1:
                    claims = await self._live_claims((target_agent, session))
                if len(claims) > 1:
                    return await self._ambiguous(command, target_agent, list(claims))
                return await self._forward(next(iter(claims.values())), command, target_agent)
            await self._submit(command, target_agent)
            source, cid = command.get("source"), command.get("id")
            recorded = self.decisions.get((source, cid)) if isinstance(source, str) and isinstance(cid, str) else None
        except Exception as exc:
            self.health.incident("control", "submit-error", f"{type(exc).__name__}: {exc}")
            log.exception("control: command handling failed")
            self._undecided(command)
            return []
        return [e for _, events in recorded or [] for e in events]

    def _undecided(self, command: Event) -> None:
        """Forget a decision that failed half-way: its retransmission is decided afresh, never
        ignored for good as "still deciding" (AEP-0004 §3: every command gets its ack)."""
        source, cid = command.get("source"), command.get("id")
        if isinstance(source, str) and isinstance(cid, str) and (source, cid) in self.decisions \
                and self.decisions[(source, cid)] is None:
            del self.decisions[(source, cid)]

    async def _forward(self, forward: Forward, command: Event, agent: str) -> list[Event]:
        acks = await forward(command, agent)
        if acks is not None:
            self.health.count("control", "forwarded")
            return acks
        cid, source = command.get("id"), command.get("source")
        if not (isinstance(cid, str) and cid and isinstance(source, str) and source):
            await self._submit(command, agent)  # malformed: counted and dropped as any other
            return []
        # Not remembered: a retransmission tries that collector again.
        recorded = await self._busy_unremembered((source, cid), command, agent,
                                                 "the collector holding this session cannot be reached now; try again")
        return [e for _, events in recorded or [] for e in events]

    async def _ambiguous(self, command: Event, agent: str, names: list[str]) -> list[Event]:
        """More than one live collector claims the session: sent to none (AEP-0004 §4). A transport
        that can refuse on the sender's connection (the relay role's ``ambiguous`` error frame) does
        so before it gets here; any other gets ``busy``, not remembered, so a retry once the claim
        resolves is decided afresh."""
        self.health.count("control", "ambiguous")
        self.health.incident("control", "ambiguous-session",
                             f"{len(names)} collectors claim one session of {agent[:64]} "
                             f"({', '.join(n[:64] for n in names)}); its commands go to none")
        cid, source = command.get("id"), command.get("source")
        if not (isinstance(cid, str) and cid and isinstance(source, str) and source):
            await self._submit(command, agent)  # malformed: counted and dropped as any other
            return []
        recorded = await self._busy_unremembered(
            (source, cid), command, agent,
            f"{len(names)} collectors claim this session; not choosing one: try again once one is gone")
        return [e for _, events in recorded or [] for e in events]

    async def busy(self, command: Event, agent: str, detail: str = BUSY_DETAIL) -> tuple[str, Lanes | None]:
        """Answer ``command`` ``control.rejected`` ``busy`` now, outside the router's queue (a
        transport whose command queue is full), sequenced in its session like every ack.

        Returns the outcome with the ack's lanes: ``busy``; ``known`` (already decided, its recorded
        ack re-sent byte-identical, or still being decided: its one decision answers this copy too);
        or why no ack could be made. As ``_forward`` does for an edge it cannot reach, the decision
        is not remembered (the caller keeps it while its queue stays full), so a retry with the same
        id is decided afresh once there is room (AEP-0004 §3 lets a target forget a command).
        """
        cid, source, session = command.get("id"), command.get("source"), command.get("session")
        if not (isinstance(cid, str) and cid and isinstance(source, str) and source
                and isinstance(session, str) and session):
            return "it has no id, source or session to address an ack to", None
        key = (source, cid)
        if key in self.decisions:
            # AEP-0004 §3: a redelivery gets the recorded ack again, byte-identical (none while deciding).
            for pipeline, events in self.decisions[key] or []:
                pipeline.deliver(events, redelivery=True)
            return "known", None
        owner = self.causes.get((agent, session, cid))
        if owner is not None and owner != source:
            return "its id is already used in this session by another sender", None
        recorded = await self._busy_unremembered(key, command, agent, detail)
        if not any(events for _, events in recorded or []):
            return "no pipeline took the ack", None
        return "busy", recorded

    async def _busy_unremembered(self, key: tuple[str, str], command: Event, agent: str,
                                 detail: str) -> Lanes | None:
        """A ``busy`` ack for ``command``, its decision forgotten at once; returns its lanes."""
        try:
            await self._ack(key, command, agent, None, "busy", detail)
        finally:
            recorded = self.decisions.pop(key, None)
        return recorded

    async def _submit(self, command: Event, target_agent: str) -> None:
        cid, source, session = command.get("id"), command.get("source"), command.get("session")
        ctype = command.get("type")
        # Spelled out (not all(...)) so the checker sees four non-empty strings below.
        if not (isinstance(cid, str) and cid and isinstance(source, str) and source
                and isinstance(session, str) and session and isinstance(ctype, str) and ctype):
            # Without id, source and session no ack can be correlated or placed: count and log it.
            self.health.count("control", "rejected")
            self.health.incident("control", "malformed-command",
                                 "a command without id/source/session/type was dropped")
            return
        key = (source, cid)
        claim = (target_agent, session, cid)
        owner = self.causes.get(claim)
        if owner is not None and owner != source:
            # AEP-0001: an ack's bare-id `cause` resolves inside one session's view. A second
            # sender reusing a decided id there could only get a second ack with the same cause
            # (two decisions for one cause, AEP-0004 §3), so it gets none: counted and shown.
            self.health.count("control", "collided")
            self.health.incident("control", "command-id-collision",
                                 f"command id already used in session by another sender ({owner})")
            return
        if key in self.decisions:
            recorded = self.decisions[key]
            if recorded is not None:  # AEP-0004 §7: re-send the recorded ack, byte-identical
                for pipeline, events in recorded:
                    pipeline.deliver(events, redelivery=True)
            return  # still deciding: a duplicate gets no second ack
        self.decisions[key] = None
        self.causes[claim] = source
        while len(self.decisions) > self.max_decisions:
            self.decisions.popitem(last=False)
        while len(self.causes) > self.max_decisions:
            self.causes.popitem(last=False)
        agent = self.agents.get(target_agent)
        if agent is None or agent.accepts is None or ctype not in agent.accepts:
            await self._ack(key, command, target_agent, None, "unsupported",
                            f"{ctype} is not accepted by {target_agent}")
            return
        if ctype == RESPOND:
            await self._respond(key, command, target_agent)
            return
        if ctype == CANCEL:
            await self._cancel(key, command, target_agent)
            return
        # Declared but not implemented here would be a bug in a receiver's declaration.
        await self._ack(key, command, target_agent, None, "unsupported", f"{ctype} has no handler")

    async def _respond(self, key: tuple[str, str], command: Event, agent: str) -> None:
        subject = command.get("subject")
        hold = self.holds.get(subject) if isinstance(subject, str) else None
        if hold is None or hold.settled or hold.session != command["session"] or hold.agent != agent:
            await self._ack(key, command, agent, None, "refused",
                            f"no pending attention request {subject!r} in this session")
            return
        data = command.get("data")
        answer = data.get("answer") if isinstance(data, dict) else None
        if not isinstance(answer, dict):
            await self._ack(key, command, agent, hold, "invalid", "data.answer must be an object")
            return
        try:
            problem = hold.validate(answer)
        except Exception as exc:  # a receiver's validator that chokes on a shape still gets a decision
            log.warning("control: checking an answer failed: %s: %s", type(exc).__name__, exc)
            problem = "the answer could not be checked against the request"
        if problem is not None:  # AEP-0006: invalid answers leave the request pending
            await self._ack(key, command, agent, hold, "invalid", problem)
            return
        await self._ack(key, command, agent, hold, None, None)
        hold.settle(Outcome("answered", answer, command))

    def open_runs(self, agent: str, session: str) -> list[str]:
        """The runs the pipelines' run synthesis holds open for ``(agent, session)``."""
        runs: list[str] = []
        for pipeline in self.pipelines.values():
            for proc in getattr(pipeline, "processors", []):
                state = getattr(getattr(proc, "state", None), "open", None)
                if isinstance(state, dict):
                    runs.extend(r for k, r in state.items() if k[:2] == (agent, session) and r not in runs)
        return runs

    async def _cancel(self, key: tuple[str, str], command: Event, agent: str) -> None:
        """AEP-0004 §5: accept a cancel of a live run, then exactly one ``run.cancelled`` per run
        (cause = the command), and free the run's held requests (``Outcome("cancelled")``)."""
        data = raw if isinstance(raw := command.get("data"), dict) else {}
        scope, run, session = data.get("scope", "run"), command.get("run"), command["session"]
        if scope not in ("run", "session"):
            await self._ack(key, command, agent, None, "invalid", "data.scope must be 'run' or 'session'")
            return
        if scope == "run" and not isinstance(run, str):
            await self._ack(key, command, agent, None, "invalid", "a run-scoped cancel names its run")
            return
        live = self.open_runs(agent, session)
        targets = [run] if scope == "run" and run in live else live if scope == "session" else []
        if not targets:
            what = f"run {run!r}" if scope == "run" else "no run"
            await self._ack(key, command, agent, None, "refused", f"{what} is not live in this session")
            return
        await self._ack(key, command, agent, None, None, None)
        consumer = self.agents[agent].consumer if agent in self.agents else None
        for target in targets:
            outcome: Event = {"type": "run.cancelled", "agent": agent, "session": session, "run": target,
                              "cause": command["id"], "data": {"by": "control"}}
            if isinstance(data.get("reason"), str):
                outcome["data"]["reason"] = data["reason"]
            if consumer is not None:
                await consumer.consume_each([outcome])
        self.cancelled[(agent, session)] = None
        while len(self.cancelled) > self.max_holds:
            self.cancelled.popitem(last=False)
        for hold in self.pending(agent, session):
            if scope == "session" or any(ev.get("run") in targets for _, ev in hold.lanes):
                hold.settle(Outcome("cancelled", None, command))

    def take_cancel(self, agent: str, session: str) -> bool:
        """True once after a run of ``(agent, session)`` was cancelled: the agent's next hook is told to stop."""
        if (agent, session) in self.cancelled:
            del self.cancelled[(agent, session)]
            return True
        return False

    async def _ack(self, key: tuple[str, str], command: Event, agent: str, hold: Hold | None,
                   reason: str | None, detail: str | None) -> None:
        draft: Event = {"type": "control.accepted" if reason is None else "control.rejected",
                        "agent": agent, "session": command["session"], "cause": command["id"],
                        "data": {} if reason is None else {"reason": reason}}
        if detail and reason is not None:
            draft["data"]["detail"] = detail
        # Not the command's ``run``: the golden acks carry none, even for a run-scoped cancel, and a
        # rejected cancel's run may never have existed (a consumer would draw a phantom run from
        # it). Run synthesis still gives the ack the session's open run, as every other event.
        recorded: list[tuple[Any, list[Event]]] = []
        if hold is not None:
            for pipeline, _ in hold.lanes:
                recorded.append((pipeline, await pipeline.consume([dict(draft, data=dict(draft["data"]))])))
        else:
            consumer = self.agents[agent].consumer if agent in self.agents else None
            if consumer is None:
                consumer = next(iter(a.consumer for a in self.agents.values()), None)
            if consumer is not None:
                recorded.extend(await consumer.consume_each([draft]))
        self.decisions[key] = recorded
        self.health.count("control", "accepted" if reason is None else "rejected")
        if reason is not None:
            log.info("control: rejected %s %s (%s): %s", command.get("type"), command["id"], reason, detail)

    async def shutdown(self) -> None:
        """Free every hold (the receivers answer their vendors neutrally) and hold nothing more: a
        hook that arrives while the receivers are still stopping is answered at once, not held
        past its receiver's end (which would cut it off with no reply and its request open)."""
        self.closed = True
        for task in list(self._rechecks):
            task.cancel()
        for hold in list({id(h): h for h in self.holds.values()}.values()):
            hold.settle(Outcome("shutdown"))


async def _alive() -> bool:
    return True


def command_key(command: Event) -> tuple[Any, Any]:
    """What the router dedupes a command on: ``(source, id)``."""
    return command.get("source"), command.get("id")


class BusyAnswers:
    """The bookkeeping of a transport's bounded command queue (commands waiting for the router).

    A command that finds the queue full is answered ``busy`` at once through
    ``ControlRouter.busy`` (AEP-0004 §3, §7: every command gets its ack, never dropped unanswered),
    counted ``commands-busy`` (``commands-unanswered`` when no ack can be addressed) and shown as
    the incident ``command-overflow``. A copy of a queued command gets no answer of its own (its one
    forthcoming decision answers both); a copy arriving while the queue stays full gets the same
    busy ack again; once the queue drains busy is forgotten, so a retry is decided afresh.
    The transport says what enters (``queued``) and leaves (``taken``) its queue.
    """

    def __init__(self, owner: Any, label: str, logger: logging.Logger) -> None:
        # The owning component (its ``id`` and ``host``), read at each use: its host is replaced
        # when it starts, after this was made.
        self.owner, self.label, self.log = owner, label, logger
        self.queued_ids: Counter[tuple[Any, Any]] = Counter()
        """``(source, id)`` of each queued command: a copy arriving meanwhile is answered by its decision."""
        self.episode = 0
        """Commands turned away since the queue last filled."""
        self.acks: OrderedDict[tuple[Any, Any], Lanes] = OrderedDict()
        """The ``busy`` acks of this overflow episode: a copy of such a command gets the same ack again."""
        self._unanswered_logged = False

    def queued(self, command: Event) -> None:
        """``command`` entered the queue: the router decides it afresh."""
        key = command_key(command)
        self.queued_ids[key] += 1
        self.acks.pop(key, None)

    def taken(self, command: Event, empty: bool) -> None:
        """``command`` left the queue; ``empty``: nothing waits any more, so the overflow is over."""
        key = command_key(command)
        self.queued_ids[key] -= 1
        if self.queued_ids[key] <= 0:
            del self.queued_ids[key]
        if self.episode and empty:
            self.log.warning("%s: command queue for %s drained; %d commands were turned away while it was full",
                             self.owner.id, self.label, self.episode)
            self.episode = 0
            self.acks.clear()  # forgotten: a retry with the same id is decided afresh

    async def answer(self, command: Event, agent: str, waiting: int) -> None:
        """Answer ``command``, which found the queue full (``waiting`` commands in it), ``busy`` now."""
        key = command_key(command)
        if all(isinstance(k, str) for k in key) and key in self.queued_ids:
            return  # a copy of a queued command: AEP-0004 §3, its one forthcoming ack answers both
        recorded = self.acks.get(key)
        if recorded is not None:  # AEP-0004 §3: one decision per command, re-sent byte-identical
            for pipeline, events in recorded:
                pipeline.deliver(events, redelivery=True)
            return
        outcome: str
        try:
            busy = getattr(self.owner.host.control, "busy", None)
            if busy is None:
                outcome, recorded = "no control router that can answer it", None
            else:
                outcome, recorded = await busy(command, agent)
        except Exception as exc:  # the router's fault is reported; the transport keeps reading
            outcome = f"{type(exc).__name__}: {exc}"
        if outcome == "known":  # the router re-sent its recorded ack, or is still deciding
            return
        self.episode += 1
        if outcome == "busy" and recorded:
            self.acks[key] = recorded
            if len(self.acks) > BUSY_REMEMBERED:
                self.acks.popitem(last=False)
            self.owner.host.health.count(self.owner.id, "commands-busy")
        else:
            self.owner.host.health.count(self.owner.id, "commands-unanswered")
            if not self._unanswered_logged:
                self._unanswered_logged = True
                self.log.warning("%s: %s: a %s command found the command queue full and could not be answered: "
                                 "%s (counted as commands-unanswered)", self.owner.id, self.label,
                                 command.get("type"), outcome)
        if self.episode == 1:
            self.log.warning("%s: command queue for %s is full (%d commands wait for the control router); "
                             "answering busy until it has room", self.owner.id, self.label, waiting)
        self.owner.host.health.incident(self.owner.id, "command-overflow",
                             f"{self.label}: {waiting} commands wait for the control router; "
                             f"{self.episode} that arrived since it filled were turned away, each "
                             f"answered busy where an ack could be addressed")
