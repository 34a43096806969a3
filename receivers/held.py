"""The attention holder every control-capable receiver shares (``AttentionHolder``).

A receiver that can let an operator decide (a permission, a form) delivers the vendor's request,
and when a control route is live keeps the vendor's reply open on a ``Hold`` until a
``control.attention.respond`` settles it, the hold times out, or the agent moves on (dismissal).
This module emits the lifecycle legs (``attention.answered``/``resolved``/``timeout``) into each
pipeline the request went through, with the request's id as subject. What the answer means for
the vendor's reply is the receiver's business; AEP-0008's text rule for permissions is here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aep_collector.pipeline.control import PERMISSION_OPTIONS, RESPOND, ControlRouter, Hold, Outcome
from aep_collector.pipeline.envelope import rfc3339_ms
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Event, Signal
from aep_collector.receivers.hook_http import CURRENT_REQUEST, connection_gone

GONE_POLL = 0.1
"""Seconds between checks that the vendors of held requests are still waiting (one check for all)."""
DENY_MESSAGE = "Denied via AEP attention loop"
"""The canned reason of a plain deny (reference stack §1.1), shared by every held permission."""

log = logging.getLogger("aep.receiver.held")

Validator = Callable[[dict[str, Any]], "str | None"]
Follow = Callable[["Applied", Event, Event | None], "Event | None"]
"""(applied, request, answered) -> one more draft for that lane (e.g. ``tool.denied``), or None."""


@dataclass(frozen=True)
class Applied:
    """What a permission answer means: the option applied and any guidance text that rides along."""

    option: str
    text: str | None = None


@dataclass(frozen=True)
class PermissionEnd:
    """How one held permission card ended (``AttentionHolder.hold_permission``)."""

    hold: Hold | None
    """None: nothing was held (no live route), the vendor decides alone."""
    how: str = "unheld"
    """The hold's outcome: ``answered``, ``timeout``, ``dismissed``, ``cancelled``, ``oob``, ..."""
    applied: Applied | None = None
    """Set only when an operator answered: the option applied (its legs are already emitted)."""


def recorded(applied: Applied) -> dict[str, Any]:
    """``attention.answered.answer``: what was APPLIED (AEP-0008); guidance text rides along."""
    return {"option": applied.option, "text": applied.text} if applied.text else {"option": applied.option}


def permission_choice(answer: dict[str, Any], options: list[dict[str, str]],
                      refusing: str = "deny") -> Applied:
    """AEP-0008 for ``kind: permission``: option ids as given; text equal to an option id (trimmed,
    any case) or to exactly one label is that option; any other text applies the refusing option
    and keeps the text as guidance; empty applies the refusing option. Never a grant from text."""
    ids = [o["id"] for o in options]
    option = answer.get("option")
    text = answer.get("text")
    if isinstance(option, str) and option in ids:
        # A refusal may say why (``respond --deny REASON``); a grant carries no guidance.
        reason = text.strip() if option == refusing and isinstance(text, str) and text.strip() else None
        return Applied(option, reason)
    if isinstance(text, str):
        word = text.strip()
        if not word:
            return Applied(refusing)
        for oid in ids:
            if word.lower() == oid.lower():
                return Applied(oid)
        by_label = [o["id"] for o in options if str(o.get("label", "")).strip().lower() == word.lower()]
        if len(by_label) == 1:
            return Applied(by_label[0])
        return Applied(refusing, word)
    return Applied(refusing)


def permission_validator(options: list[dict[str, str]]) -> Validator:
    """Refuse shapes a permission card cannot take (a foreign option id, form values)."""
    ids = {o["id"] for o in options}

    def validate(answer: dict[str, Any]) -> str | None:
        option = answer.get("option")
        # Type first: a list or object is no option id (and could not even be looked up).
        if option is not None and (not isinstance(option, str) or option not in ids):
            return f"option must be one of {sorted(ids)}"
        if "values" in answer and option is None and answer.get("text") is None:
            return "a permission request takes an option or text, not form values"
        text = answer.get("text")
        if text is not None and not isinstance(text, str):
            return "text must be a string"
        return None

    return validate


class AttentionHolder:
    """Per-receiver helper: open holds, wait, emit the legs. One instance per receiver."""

    def __init__(self, agent: str, component: str, timeout: float) -> None:
        self.agent, self.component, self.timeout = agent, component, timeout
        self.router: ControlRouter | None = None
        self.deliver: Any = None
        self._watched: dict[int, tuple[Hold, Callable[[], bool]]] = {}
        """Holds being waited on -> how to tell their vendor hung up (scanned by ``_watch``)."""
        self._watcher: asyncio.Future[None] | None = None

    def bind(self, host: Host, deliver: Any, accepts: list[str] | None, consumer: Any) -> None:
        """At receiver start: register what this receiver honours and how events leave it."""
        self.router = host.control
        self.deliver = deliver
        if self.router is not None:
            self.router.register(self.agent, accepts, consumer)

    def live(self) -> bool:
        """A control route is up and respond is declared: worth keeping the agent waiting."""
        r = self.router
        return r is not None and r.route_live(self.agent) and RESPOND in (r.accepts(self.agent) or [])

    async def request(self, signal: Signal, validate: Validator, key: str | None = None,
                      vendor_ui: bool = False) -> Hold | None:
        """Deliver ``signal``; if it became an attention request and a route is live, hold it.

        ``vendor_ui``: the agent shows its own prompt for this request at the same time (Kilo's
        bus asks), so the request is answerable both ways: ``respond_via: ["control", "oob"]``.
        """
        live = self.live() and self.router is not None and self.router.can_hold()
        # AEP-0008 respond_via is authoritative: without a route only the agent's own UI can answer.
        signal.respond_via = (["control", "oob"] if vendor_ui else ["control"]) if live else ["oob"]
        if live:
            signal.expires_at = rfc3339_ms(time.time() + self.timeout)
        lanes = await self.deliver.lanes([signal])
        if not live or lanes is None or self.router is None:
            return None
        requests = [(p, e) for p, events in lanes for e in events if e.get("type") == "attention.requested"]
        if not requests:
            return None
        session = requests[0][1].get("session", "unknown")
        return self.router.open(self.agent, session, requests, validate, key)

    async def held(self, signal: Signal, validate: Validator, key: str | None,
                   calls: dict[Any, Hold] | None = None, call: Any = None) -> tuple[Hold, Outcome] | None:
        """``request`` then ``wait``; while waiting the hold is ``calls[call]``, so the hook naming
        the same call (the tool ran in the vendor) can dismiss it. None: nothing was held."""
        hold = await self.request(signal, validate, key)
        if hold is None:
            return None
        if calls is not None:
            calls[call] = hold
        try:
            return hold, await self.wait(hold)
        finally:
            if calls is not None and calls.get(call) is hold:
                del calls[call]

    async def hold_permission(self, signal: Signal, key: str | None,
                              options: list[dict[str, str]] = PERMISSION_OPTIONS,
                              validate: Validator | None = None, calls: dict[Any, Hold] | None = None,
                              call: Any = None, follow: Follow | None = None) -> PermissionEnd:
        """Hold one permission card (Claude Code, the hook vendors, the bus vendors, every tool gate).

        An operator's answer is applied by AEP-0008 (``permission_choice``) and recorded in the
        ``attention.answered`` legs; ``follow`` may add one event per lane, cause-linked by it to
        that lane's answer. What the vendor gets back is the caller's: this says how it ended.
        """
        held = await self.held(signal, validate or permission_validator(options), key, calls, call)
        if held is None:
            return PermissionEnd(None)
        hold, outcome = held
        if outcome.how != "answered" or outcome.answer is None:
            return PermissionEnd(hold, outcome.how)
        applied = permission_choice(outcome.answer, options)
        then = None if follow is None else (lambda request, answered: follow(applied, request, answered))
        await self.answered(hold, outcome, recorded(applied), follow=then)
        return PermissionEnd(hold, "answered", applied)

    async def wait(self, hold: Hold, gone: Callable[[], bool] | None = None) -> Outcome:
        """Wait for the answer, a dismissal or the timeout (which emits ``attention.timeout``).

        If the vendor hangs up first (``gone()``: a shim gave up, a plugin aborted its fetch),
        nobody will read the reply: the request is resolved ``dismissed`` and a later answer refused.
        By default ``gone`` watches the connection of the hook request being handled; a holder
        whose vendor is not on that request (a background hold) passes its own (or one that is
        always false).

        One timer per hold (the deadline) and one shared watcher per receiver for hang-ups: no
        per-hold polling, so thousands of holds cost nothing while they wait and each times out
        on time.
        """
        if gone is None:
            gone = connection_gone(CURRENT_REQUEST.get())
        self._watched[id(hold)] = (hold, gone)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch())
        try:
            try:
                outcome = await asyncio.wait_for(asyncio.shield(hold.future), self.timeout)
            except TimeoutError:
                outcome = Outcome("timeout")
                if hold.settle(outcome):
                    after = int((time.monotonic() - hold.opened) * 1000)
                    await self.emit(hold, "attention.timeout", {"after_ms": after}, cause_request=True)
                else:
                    outcome = hold.future.result()
        finally:
            self._watched.pop(id(hold), None)
            if self.router is not None:
                self.router.close(hold)
        if outcome.how in ("shutdown", "cancelled"):
            await self.emit(hold, "attention.resolved", {"resolution": "dismissed"}, cause_request=True)
        return outcome

    async def _watch(self) -> None:
        """Every ``GONE_POLL`` seconds while anything is held: dismiss the holds whose vendor hung up."""
        while self._watched:
            await asyncio.sleep(GONE_POLL)
            for key, (hold, gone) in list(self._watched.items()):
                if hold.settled:
                    continue
                try:
                    hung_up = gone()
                except Exception:
                    hung_up = False
                if hung_up:
                    self._watched.pop(key, None)
                    try:
                        await self.dismiss(hold)
                    except Exception as exc:  # the holder still gets its outcome; the cause is counted
                        log.warning("%s: dismissing a hold failed: %s: %s", self.component,
                                    type(exc).__name__, exc)

    async def answered(self, hold: Hold, outcome: Outcome, answer: dict[str, Any],
                       fields: list[dict[str, Any]] | None = None,
                       follow: Callable[[Event, Event | None], Event | None] | None = None) -> None:
        """Emit ``attention.answered`` (what was applied) then ``attention.resolved`` in every lane.

        ``follow(request, answered)`` may return one more draft per lane (e.g. the ``tool.denied``
        a commanded deny causes), cause-linked by the caller to that lane's answer.
        """
        assert outcome.command is not None
        latency = int((time.monotonic() - hold.opened) * 1000)
        for pipeline, request in hold.lanes:
            draft = self._leg(hold, request, "attention.answered", {"answer": answer, "via": "control"})
            draft["cause"] = outcome.command["id"]
            if fields is not None:
                draft["_fields"] = fields
            stamped = await pipeline.consume([draft])
            answered_id = next((e["id"] for e in stamped if e.get("type") == "attention.answered"), None)
            resolved = self._leg(hold, request, "attention.resolved",
                                 {"resolution": "answered", "latency_ms": latency})
            resolved["cause"] = answered_id or outcome.command["id"]
            await pipeline.consume([resolved])
            if follow is not None:
                answered = next((e for e in stamped if e.get("type") == "attention.answered"), None)
                extra = follow(request, answered)
                if extra is not None:
                    await pipeline.consume([extra])

    async def dismiss(self, hold: Hold) -> bool:
        """The agent moved on without us (e.g. the tool ran): one ``resolved{dismissed}``, hook freed."""
        if not hold.settle(Outcome("dismissed")):
            return False
        await self.emit(hold, "attention.resolved", {"resolution": "dismissed"}, cause_request=True)
        return True

    async def sweep(self, session: str | None) -> None:
        """AEP-0002 §7.1: dismiss every hold of ``session`` before its ``session.ended`` is delivered."""
        for hold in self.pending(session or "unknown"):
            await self.dismiss(hold)

    def settle_oob(self, hold: Hold) -> bool:
        """The answer came through the agent's own UI; the mapping already emitted its legs."""
        return hold.settle(Outcome("oob"))

    async def emit(self, hold: Hold, type_: str, data: dict[str, Any], cause_request: bool = False) -> None:
        for pipeline, request in hold.lanes:
            draft = self._leg(hold, request, type_, data)
            if cause_request:
                draft["cause"] = request["id"]
            await pipeline.consume([draft])

    def _leg(self, hold: Hold, request: Event, type_: str, data: dict[str, Any]) -> Event:
        draft: Event = {"type": type_, "agent": self.agent, "session": request.get("session"),
                        "subject": request["id"], "data": dict(data)}
        if request.get("run"):
            draft["run"] = request["run"]
        if hold.key is not None:
            draft["_attention_key"] = hold.key  # closes the correlation book's entry too
        return draft

    def cancelled(self, session: str) -> bool:
        """True once after an operator's ``control.cancel`` ended a run of ``session``."""
        return self.router is not None and self.router.take_cancel(self.agent, session)

    def pending(self, session: str | None = None) -> list[Hold]:
        return [] if self.router is None else self.router.pending(self.agent, session)
