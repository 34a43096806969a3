"""Claude Code hooks -> AEP drafts (AEP-0002 Annex A.1; fixture ``mappings/claude-code.json``).

Only the two form mappings (AskUserQuestion, Elicitation) are fixture-pinned; every other row
follows the Annex A.1 key rules and the taxonomy digest §3.1 table. Runs are synthesized by the
``runs`` processor (no turn id exists): ``UserPromptSubmit`` opens one, ``Stop``/``StopFailure``
close it. What Claude Code gets back (neutral and decision replies) is the receiver's
(``aep_collector.receivers.claude_code``), and so is decoding a question into its form: it answers
by the form's fields, so it draws them once and puts them on ``Signal.form``; the card is drawn
here from that form.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aep_collector.pipeline.control import elicitation_key
from aep_collector.pipeline.model import Event, Form, Signal
from aep_collector.processors.mapping import hook_vendors as hf
from aep_collector.processors.mapping.drafting import draft, get_str

AGENT = "claude-code"

_PENDING_CAP = 256  # elicitations whose result never arrives must not grow the state forever


@dataclass
class ClaudeCodeState:
    """Elicitations awaiting their ``ElicitationResult``: (session, key) -> the request's field specs."""

    pending: OrderedDict[tuple[str | None, str], dict[str, Any]] = field(default_factory=OrderedDict)

    def hold(self, session: str | None, key: str, entry: dict[str, Any]) -> None:
        """Remember a raised elicitation until its result (or the control plane) settles it."""
        self.pending[(session, key)] = entry
        while len(self.pending) > _PENDING_CAP:
            self.pending.popitem(last=False)

    def take(self, session: str | None, key: str, server: str | None = None) -> dict[str, Any] | None:
        """Pop the pending elicitation for ``key`` (or the only one from ``server``), if any."""
        entry = self.pending.pop((session, key), None)
        if entry is None and server:
            hits = [k for k, v in self.pending.items() if k[0] == session and v.get("server") == server]
            if len(hits) == 1:
                entry = self.pending.pop(hits[0])
        return entry

    def forget(self, session: str | None, key: str) -> None:
        """Drop a request the control plane already answered, so its vendor echo emits nothing."""
        self.pending.pop((session, key), None)


def new_state() -> ClaudeCodeState:
    """Fresh runtime state (no pending elicitations)."""
    return ClaudeCodeState()


# --- the two pinned forms (AEP-0006): drawn from the form the receiver decoded -------------


def _form_draft(form: Form, subject: str | None) -> Event:
    """The form ``attention.requested``: full labels in data, structural prompt and specs as hints."""
    data = {"kind": "form", "prompt": form.prompt, "fields": copy.deepcopy(form.fields), "respond_via": ["control"]}
    d = draft("attention.requested", data, subject)
    d["_structural"] = {"prompt": form.structural}
    d["_fields"] = copy.deepcopy(form.fields)
    return d


# --- hooks ---------------------------------------------------------------------------------


def _session_started(payload: hf.Payload, _state: Any) -> Event:
    return hf.session_started(AGENT, payload)


def _ask_user_question(form: Form, payload: hf.Payload, _state: Any) -> Event:
    # AEP-0006 pin: one form for the whole 1-4 question batch, not a permission card.
    return _form_draft(form, get_str(payload, "tool_name"))


def _elicitation_key(payload: hf.Payload) -> str:
    """The key pairing an Elicitation with its ElicitationResult (and with an operator's answer)."""
    return elicitation_key(get_str(payload, "elicitation_id"), get_str(payload, "mcp_server_name"))


def _elicitation(form: Form, payload: hf.Payload, state: ClaudeCodeState | None) -> Event:
    key = _elicitation_key(payload)
    d = _form_draft(form, key)
    d["_attention_key"] = key  # the result (or an operator's answer) settles it by this key
    if state is not None:
        state.hold(hf.session_of(payload), key,
                   {"fields": d["_fields"], "server": get_str(payload, "mcp_server_name")})
    return d


def _elicitation_result(payload: hf.Payload, state: ClaudeCodeState | None) -> list[Event] | None:
    key = _elicitation_key(payload)
    entry = state.take(hf.session_of(payload), key, get_str(payload, "mcp_server_name")) if state else None
    if entry is None:
        return None  # an orphan result (never seen, or already settled over control) emits nothing
    action = get_str(payload, "action")
    if action != "accept":
        # decline/cancel carry no answer to record: the user dismissed the form in Claude Code.
        return [draft("attention.resolved", {"resolution": "dismissed"}, key, _attention_key=key)]
    content = payload.get("content") if isinstance(payload.get("content"), dict) else {}
    answered = draft("attention.answered", {"answer": {"values": copy.deepcopy(content)}, "via": "oob"}, key,
                     _attention_key=key)
    answered["_fields"] = entry["fields"]
    return [answered, draft("attention.resolved", {"resolution": "answered"}, key, _attention_key=key)]


def _task(type_: str, payload: hf.Payload, _state: Any) -> Event:
    task: dict[str, Any] = {}
    for key, out in (("task_id", "id"), ("task_subject", "title"), ("task_description", "description")):
        value = get_str(payload, key)
        if value:
            task[out] = value
    d = draft(type_, {"task": task} if task else {}, get_str(payload, "task_id"))
    return hf.merge_capture(d, **{"task.description": hf.REDACTED})


def _teammate_idle(payload: hf.Payload, _state: Any) -> Event:
    # Agent-scoped (`agent.idle`): map_table leaves session/run off it.
    return draft("agent.idle", {}, get_str(payload, "teammate_name"))


HOOKS: dict[str, hf.Handler] = {
    "SessionStart": _session_started,
    **hf.LIFECYCLE_HOOKS,
    "PermissionDenied": hf.tool_denied,
    # The two questions are drawn from the receiver's form (``_asks``). Without one (a signal no
    # receiver decoded): a PermissionRequest is the permission card it is underneath, and an
    # Elicitation stays in the vendor namespace rather than be drawn with guessed fields.
    "PermissionRequest": hf.permission_request,
    "Elicitation": lambda _payload, _state: hf.fallback(AGENT, "Elicitation"),
    "ElicitationResult": _elicitation_result,
    "SubagentStart": hf.subagent_started,
    "SubagentStop": hf.subagent_stopped,
    # Documented deviation (Annex A.1 / digest §3.1): compaction is one fact, emitted once at PostCompact.
    "PreCompact": hf.nothing,
    "PostCompact": hf.compacted,
    "TaskCreated": partial(_task, "progress.task.planned"),
    "TaskCompleted": partial(_task, "progress.task.completed"),
    # Deduplicated against the first-class PermissionRequest / Elicitation hooks.
    "Notification": partial(hf.notification, suppress=hf.DUPLICATE_NOTIFICATIONS),
    "TeammateIdle": _teammate_idle,
}


def _asks(form: Form) -> dict[str, hf.Handler]:
    """The hooks that ask a question, drawing its card from the receiver's decoded ``form``."""
    return {"PermissionRequest": partial(_ask_user_question, form), "Elicitation": partial(_elicitation, form)}


def map_hook(name: str, payload: Any, state: ClaudeCodeState | None = None, form: Form | None = None) -> list[Event]:
    """One Claude Code hook firing -> drafts; ``state`` pairs Elicitation with ElicitationResult,
    ``form`` is the question the receiver decoded from it (``Signal.form``)."""
    return hf.map_table(AGENT, HOOKS if form is None else {**HOOKS, **_asks(form)}, name, payload, state)


def map_signal(signal: Signal, state: ClaudeCodeState) -> list[Event]:
    """Map a received hook call (the payload's ``hook_event_name`` names the hook).

    Every card a PermissionRequest raises (a permission, an AskUserQuestion form) is keyed for the
    attention book like Codex's: one nobody answers over control is still closed before
    ``session.ended`` (AEP-0002 §7.1); the receiver holds it under the same key.
    """
    name, payload = hf.hook_call(signal)  # hook_name and payload_of in one step
    form = signal.form
    # map_hook, without its call (every hook of the stream takes this path).
    drafts = hf.map_table(AGENT, HOOKS if form is None else {**HOOKS, **_asks(form)}, name, payload, state)
    for d in drafts:
        if d.get("type") == "attention.requested" and "_attention_key" not in d:
            d["_attention_key"] = hf.card_key(signal)
    return drafts
