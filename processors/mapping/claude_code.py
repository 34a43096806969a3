"""Claude Code hooks -> AEP drafts (AEP-0002 Annex A.1; fixture ``mappings/claude-code.json``).

Only the two form mappings (AskUserQuestion, Elicitation) are fixture-pinned; every other row
follows the Annex A.1 key rules and the taxonomy digest §3.1 table. Runs are synthesized by the
``runs`` processor (no turn id exists): ``UserPromptSubmit`` opens one, ``Stop``/``StopFailure``
close it. What Claude Code gets back (neutral and decision replies) is the receiver's
(``aep_collector.receivers.claude_code``); the two forms are drawn here and read by it.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aep_collector.pipeline.control import elicitation_key
from aep_collector.pipeline.model import Event, Signal
from aep_collector.processors.mapping import hook_vendors as hf
from aep_collector.processors.mapping.drafting import draft, get_dict, get_str

AGENT = "claude-code"

ASK_USER_QUESTION = "AskUserQuestion"
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


# --- the two pinned form mappings (AEP-0006) -----------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def ask_user_question_form(tool_input: Any, content_ok: bool) -> dict[str, Any]:
    """AskUserQuestion input -> ``{prompt, fields}``; labels are ids when ``content_ok`` is false."""
    questions = tool_input.get("questions") if isinstance(tool_input, dict) else None
    fields: list[dict[str, Any]] = []
    for i, q in enumerate(questions if isinstance(questions, list) else [], start=1):
        if not isinstance(q, dict):
            continue
        fid = str(i)  # fixture: 1-based index ids keep answer.values structural at any ceiling
        header, text = get_str(q, "header"), get_str(q, "question") or ""
        choices = []
        options = q.get("options")
        for j, opt in enumerate(options if isinstance(options, list) else [], start=1):
            label = get_str(opt, "label") if isinstance(opt, dict) else opt if isinstance(opt, str) else None
            choices.append({"id": str(j), "label": (label or str(j)) if content_ok else str(j)})
        spec: dict[str, Any] = {
            "id": fid,
            "type": "select",
            "label": (f"{header}: {text}" if header else text or fid) if content_ok else fid,
            "required": True,
            "other": True,  # Claude Code always offers a free-text "Other" answer
            "choices": choices,
        }
        if q.get("multiSelect") is True:  # fixture: `multi` only when true, key omitted otherwise
            spec["multi"] = True
        fields.append(spec)
    # Fixture: the same structural prompt at both ceilings.
    return {"prompt": f"{AGENT} asks {_plural(len(fields), 'question')}", "fields": fields}


def _schema_of(payload: Any) -> dict[str, Any]:
    # The fixture spells the MCP name (`requestedSchema`); the hook payload sends `requested_schema`.
    return get_dict(payload, "requested_schema") or get_dict(payload, "requestedSchema")


def _enum_choices(prop: dict[str, Any], content_ok: bool) -> list[dict[str, str]] | None:
    """Closed choices of an MCP enum property (``enum`` + ``enumNames``, or titled ``oneOf`` consts)."""
    if isinstance(prop.get("enum"), list):
        names = prop.get("enumNames") if isinstance(prop.get("enumNames"), list) else []
        out = []
        for i, value in enumerate(prop["enum"]):
            name = names[i] if i < len(names) and isinstance(names[i], str) else None
            out.append({"id": str(value), "label": (name or str(value)) if content_ok else str(value)})
        return out
    if isinstance(prop.get("oneOf"), list):
        out = []
        for item in prop["oneOf"]:
            if isinstance(item, dict) and "const" in item:
                title = get_str(item, "title")
                out.append({"id": str(item["const"]),
                            "label": (title or str(item["const"])) if content_ok else str(item["const"])})
        return out or None
    return None


def elicitation_form(payload: Any, content_ok: bool) -> dict[str, Any]:
    """Elicitation payload -> ``{prompt, fields}`` from the MCP requested schema (property order kept)."""
    schema = _schema_of(payload)
    props = get_dict(schema, "properties")
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    fields: list[dict[str, Any]] = []
    for key, prop in props.items():
        prop = prop if isinstance(prop, dict) else {}
        spec: dict[str, Any] = {"id": key}
        items = get_dict(prop, "items")
        choices = _enum_choices(prop, content_ok)
        if choices is None and prop.get("type") == "array":
            choices = _enum_choices(items, content_ok)
            if choices is not None:
                spec["multi"] = True
        if choices is not None:
            spec["type"] = "select"  # fixture: MCP enums are closed, so no `other`
            spec["choices"] = choices
        elif prop.get("type") in ("integer", "number"):
            spec["type"] = "number"
            for src, dst in (("minimum", "min"), ("maximum", "max")):
                if isinstance(prop.get(src), (int, float)) and not isinstance(prop.get(src), bool):
                    spec[dst] = prop[src]
        elif prop.get("type") == "boolean":
            spec["type"] = "boolean"
        else:
            spec["type"] = "string"
        title = get_str(prop, "title")
        spec["label"] = (title or key) if content_ok else key
        spec["required"] = key in required  # fixture: the key is always present
        fields.append(spec)
    message = get_str(payload, "message")
    structural = f"{AGENT} requests input ({_plural(len(fields), 'field')})"
    return {"prompt": message if content_ok and message else structural, "fields": fields}


def _form_draft(form: dict[str, Any], structural: dict[str, Any], subject: str | None) -> Event:
    """The form ``attention.requested``: full labels in data, structural prompt and specs as hints."""
    data = {"kind": "form", **form, "respond_via": ["control"]}
    d = draft("attention.requested", data, subject)
    d["_structural"] = {"prompt": structural["prompt"]}
    d["_fields"] = copy.deepcopy(form["fields"])
    return d


# --- hooks ---------------------------------------------------------------------------------


def _session_started(payload: hf.Payload, _state: Any) -> Event:
    return hf.session_started(AGENT, payload)


def _permission_request(payload: hf.Payload, _state: Any) -> Event:
    if get_str(payload, "tool_name") == ASK_USER_QUESTION:
        # AEP-0006 pin: one form for the whole 1-4 question batch, not a permission card.
        tool_input = payload.get("tool_input")
        return _form_draft(ask_user_question_form(tool_input, True),
                           ask_user_question_form(tool_input, False), ASK_USER_QUESTION)
    return hf.permission_request(payload)


def _elicitation_key(payload: hf.Payload) -> str:
    """The key pairing an Elicitation with its ElicitationResult (and with an operator's answer)."""
    return elicitation_key(get_str(payload, "elicitation_id"), get_str(payload, "mcp_server_name"))


def _elicitation(payload: hf.Payload, state: ClaudeCodeState | None) -> Event:
    key = _elicitation_key(payload)
    d = _form_draft(elicitation_form(payload, True), elicitation_form(payload, False), key)
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
    "PermissionRequest": _permission_request,
    "Elicitation": _elicitation,
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


def map_hook(name: str, payload: Any, state: ClaudeCodeState | None = None) -> list[Event]:
    """One Claude Code hook firing -> drafts; ``state`` pairs Elicitation with ElicitationResult."""
    return hf.map_table(AGENT, HOOKS, name, payload, state)


def map_signal(signal: Signal, state: ClaudeCodeState) -> list[Event]:
    """Map a received hook call (the payload's ``hook_event_name`` names the hook).

    Every card a PermissionRequest raises (a permission, an AskUserQuestion form) is keyed for the
    attention book like Codex's: one nobody answers over control is still closed before
    ``session.ended`` (AEP-0002 §7.1); the receiver holds it under the same key.
    """
    drafts = map_hook(hf.hook_name(signal), hf.payload_of(signal), state)
    for d in drafts:
        if d.get("type") == "attention.requested" and "_attention_key" not in d:
            d["_attention_key"] = hf.card_key(signal)
    return drafts
