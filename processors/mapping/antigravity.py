"""Antigravity: the five-hook ``hooks.json`` command system (AEP-0002 Annex A.11).

No payload names its own hook, so the hook name is ``Signal.name`` (the shim's argv or ``?hook=``).
``map_hook`` is the pure mapping pinned by ``conformance/fixtures/mappings/antigravity.json``; the
PostToolUse join result is a parameter. ``map_signal`` owns what the fixture calls runtime state:
the bounded (conversationId, stepIdx) join table, session.started on first sight, the synthesized
run (opened by the first PreInvocation, closed by Stop) and the envelope step of the open invocation.
The byte-pinned replies Antigravity gets back are the receiver's (``aep_collector.receivers.hook_vendors.antigravity``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.model import Event, Signal

from .drafting import digest, draft, get_dict, get_str

__all__ = ["AGENT", "HOOKS", "canonical_hook", "AntigravityState", "new_state", "map_hook", "map_signal"]

AGENT = "antigravity"

HOOKS = ("PreToolUse", "PostToolUse", "PreInvocation", "PostInvocation", "Stop")
_CANONICAL = {h.lower(): h for h in HOOKS}

# Bounds on runtime state (design record: "entries clear on join and at Stop (bounded memory)").
MAX_JOINS = 4096
MAX_CONVERSATIONS = 4096

_NON_TOKEN = re.compile(r"[^a-z0-9_]+")
_STOP_FINISHED = ("model_stop", "max_steps_exceeded")


def canonical_hook(name: Any) -> str:
    """The documented spelling of a hook name given in any case; other names pass through."""
    if not isinstance(name, str):
        return ""
    return _CANONICAL.get(name.strip().lower(), name.strip())


def _int(value: Any) -> int | None:
    """An integer that is not a bool (``isinstance(True, int)`` holds in Python)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_text(value: Any) -> str | None:
    """PostToolUse/Stop ``error``: empty means success; anything else is the failure fact."""
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else str(value)


def _fallback_type(hook: str) -> str:
    # Pinned spelling: lower-cased, NOT snake-cased, under `hook` (fixture fallback).
    token = _NON_TOKEN.sub("_", hook.lower()).strip("_")
    return f"x.antigravity.hook.{token or 'unnamed'}"


def map_hook(hook: str, payload: Any, join: dict[str, Any] | None = None) -> list[Event]:
    """One hook call -> drafts (pure); ``join`` is the PreToolUse found for a PostToolUse, if any."""
    p = payload if isinstance(payload, dict) else {}
    hook = canonical_hook(hook)
    step_idx = _int(p.get("stepIdx"))

    if hook == "PreToolUse":
        call = get_dict(p, "toolCall")
        name = get_str(call, "name")
        if name is None:
            # deviation: a nameless tool call cannot be a tool.requested (name is required) and a
            # name is never invented; keep the moment in the vendor namespace.
            return [draft(_fallback_type(hook), _step_idx({}, step_idx))]
        data: dict[str, Any] = {"tool": {"name": name}}  # the wire keeps no call id
        _step_idx(data, step_idx)  # the join key, said so
        if "args" in call:
            data["args_digest"] = digest(call["args"])
            if isinstance(call["args"], dict):
                data["args"] = call["args"]
        # Interaction tools (ask_question, ask_permission) stay tools: the answer is not hook-visible.
        return [draft("tool.requested", data, name)]

    if hook == "PostToolUse":
        error = _error_text(p.get("error"))
        name = get_str(join, "name") if isinstance(join, dict) else None
        if name is None:
            # The thin payload has no tool name and the registry requires one: honest-absence fallback.
            data = _step_idx({"failed": error is not None}, step_idx)
            if error is not None:
                data["error"] = error
            return [draft("x.antigravity.step.completed", data, _capture={"error": "redacted"} if error else None)]
        data = _step_idx({"tool": {"name": name}}, step_idx)
        if error is None:
            return [draft("tool.completed", data, name)]
        data["error"] = {"type": "tool_error", "message": error}
        return [draft("tool.failed", data, name)]

    if hook in ("PreInvocation", "PostInvocation"):
        num = _int(p.get("invocationNum"))
        step = None if num is None else str(num)
        if hook == "PostInvocation":
            # Wire-identical to PreInvocation; the argv is the discriminator, the mapping claims the boundary.
            return [draft("run.step.finished", {}, step=step)]
        data = {}
        initial = _int(p.get("initialNumSteps"))
        if initial is not None and initial >= 0:
            data["initial_num_steps"] = initial
        return [draft("run.step.started", data, step=step)]

    if hook == "Stop":
        reason = get_str(p, "terminationReason")
        error = _error_text(p.get("error"))
        meta: dict[str, Any] = {}
        if _int(p.get("executionNum")) is not None:
            meta["execution_num"] = p["executionNum"]
        if isinstance(p.get("fullyIdle"), bool):
            meta["fully_idle"] = p["fullyIdle"]  # false = background tasks still running: a fact, not a terminal
        if reason == "error" or (reason not in _STOP_FINISHED and reason is not None and error is not None):
            token = _NON_TOKEN.sub("_", reason.lower()).strip("_") or "error"
            err = {"type": token}
            if error is not None:
                err["message"] = error
            return [draft("run.failed", {"reason": token, "error": err, **meta})]
        # Bounded terminations are completions, the reason riding as metadata (fixture stop_*).
        # deviation: an unknown or missing reason without an error is also taken as a completion.
        data = {"termination_reason": reason, **meta} if reason else meta
        return [draft("run.finished", data)]

    return [draft(_fallback_type(hook or "unnamed"), {})]


def _step_idx(data: dict[str, Any], step_idx: int | None) -> dict[str, Any]:
    if step_idx is not None:
        data["step_idx"] = step_idx
    return data


# --- runtime state -----------------------------------------------------------------------------------


@dataclass
class Conversation:
    """What the daemon knows about one conversationId."""

    run_open: bool = False
    invocation: int | None = None
    """invocationNum of the open invocation: the envelope step of events inside it."""


@dataclass
class AntigravityState:
    """Conversations seen (LRU-bounded) and the PreToolUse join table (FIFO-bounded)."""

    conversations: OrderedDict[str, Conversation] = field(default_factory=OrderedDict)
    joins: OrderedDict[tuple[str, int], str] = field(default_factory=OrderedDict)
    max_conversations: int = MAX_CONVERSATIONS
    max_joins: int = MAX_JOINS

    def conversation(self, conv: str) -> tuple[Conversation, bool]:
        """The record for ``conv`` and whether this is its first sight."""
        rec = self.conversations.get(conv)
        if rec is not None:
            self.conversations.move_to_end(conv)
            return rec, False
        rec = self.conversations[conv] = Conversation()
        while len(self.conversations) > self.max_conversations:
            # The least recently active conversation is forgotten; seen again it counts as new.
            self.conversations.popitem(last=False)
        return rec, True

    def put_join(self, conv: str, step_idx: int, name: str) -> None:
        key = (conv, step_idx)
        self.joins[key] = name
        self.joins.move_to_end(key)
        while len(self.joins) > self.max_joins:
            # Oldest PreToolUse first: a PostToolUse that never came (denied, dangling) goes away.
            self.joins.popitem(last=False)

    def take_join(self, conv: str, step_idx: int) -> str | None:
        return self.joins.pop((conv, step_idx), None)

    def drop_joins(self, conv: str) -> None:
        for key in [k for k in self.joins if k[0] == conv]:
            del self.joins[key]


def new_state() -> AntigravityState:
    """Fresh runtime state for one Antigravity daemon."""
    return AntigravityState()


def _session_started(payload: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    # The host marker is the app data directory (`~/.gemini/antigravity` desktop, `.../antigravity-cli`).
    m = re.search(r"\.gemini/(antigravity[a-z0-9-]*)/", get_str(payload, "transcriptPath") or "")
    if m:
        data["client"] = {"name": m.group(1)}  # client is an OBJECT (design record)
    paths = payload.get("workspacePaths")
    if isinstance(paths, list) and paths and isinstance(paths[0], str) and paths[0]:
        data["cwd"] = paths[0]  # a machine path: redacted+ by the schema, no digest
    return data


def map_signal(signal: Signal, state: AntigravityState) -> list[Event]:
    """One hook call (name from ``signal.name``) -> drafts, updating ``state``."""
    payload = signal.payload if isinstance(signal.payload, dict) else {}
    hook = canonical_hook(signal.name)
    conv = get_str(payload, "conversationId")  # identity.session_from, verbatim
    lane = conv or ""
    step_idx = _int(payload.get("stepIdx"))
    rec, first = state.conversation(lane)
    drafts: list[Event] = []

    if first and conv is not None:
        # No session hook exists: synthesized on first sight, and no session.ended ever.
        drafts.append(draft("session.started", _session_started(payload)))

    join = None
    if hook == "PostToolUse" and step_idx is not None:
        name = state.take_join(lane, step_idx)  # cleared on join
        join = {"name": name} if name else None
    mapped = map_hook(hook, payload, join=join)

    if hook == "PreToolUse" and step_idx is not None and mapped[0]["type"] == "tool.requested":
        state.put_join(lane, step_idx, mapped[0]["subject"])
    elif hook == "PreInvocation":
        num = _int(payload.get("invocationNum"))
        if not rec.run_open or num == 0:
            # The first invocation of an execution opens the run (invocationNum 0, or first sight on a
            # mid-run attach). deviation: invocationNum 0 while a run is still open means its Stop was
            # missed; the stale run drains as run.cancelled (the runs processor honours `_drain`).
            drafts.append(draft("run.started", {}, _drain="cancelled"))
            rec.run_open = True
        rec.invocation = num
    elif hook == "Stop":
        rec.run_open = False
        rec.invocation = None
        state.drop_joins(lane)  # a dangling PreToolUse synthesizes nothing, and is forgotten here

    for d in mapped:
        # Events inside an invocation carry its number as the envelope step (a string).
        if "step" not in d and rec.invocation is not None and not d["type"].startswith("run."):
            d["step"] = str(rec.invocation)
        drafts.append(d)
    for d in drafts:
        d["session"] = conv
    return drafts
