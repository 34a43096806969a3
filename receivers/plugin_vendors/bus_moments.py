"""What an OpenCode-family plug-in POSTs, decoded into the moment its mapping reads.

The shipped plug-in (``js/opencode-plugin.js``, ``js/kilocode-plugin.js``) posts the fixture-shaped
moments of ``conformance/fixtures/mappings/opencode.json``: ``{kind: "bus", event}``,
``{kind: "tool.before"|"tool.after", input, output}``, ``{kind: "permission.ask", permission}``.
Anything else (a hook name as ``kind``, a bare bus event, a payload named only by ``?name=``) is
decoded here, once, so the mapping reads ``Signal.payload`` as a moment and never the wire.

``decode`` also reads what the receiver needs to find a moment's holds and answer its asks, and
hands it on as typed ``Signal`` fields the mapping draws from: the session (``session_of``, the
fixtures' ``identity.session_from``), the options a bus ``permission.asked`` card offers (Kilo's
reply enum, ``bus_replies.REPLY_ROUTE_OPTIONS``) and the form a ``question.asked`` card carries.
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Form, Signal
from aep_collector.pipeline.payload import get_dict, get_str

from .bus_replies import REPLY_ROUTE_OPTIONS

HOOK_KINDS = {
    "tool.execute.before": "tool.before",
    "tool.execute.after": "tool.after",
    "permission.ask": "permission.ask",
}
"""Plug-in hook name -> the moment kind it posts."""
HOOK_NAMES = {kind: hook for hook, kind in HOOK_KINDS.items()}
"""Moment kind -> the plug-in hook it came from (the ``Signal.name`` of a hook moment)."""
KINDS = frozenset({"bus", "tool.before", "tool.after", "permission.ask"})


def as_moment(name: str, payload: Any) -> dict[str, Any]:
    """The fixture-shaped moment for a POST: the payload's own ``kind`` first, else the signal name."""
    body = payload if isinstance(payload, dict) else {}
    kind = body.get("kind") if isinstance(body.get("kind"), str) else None
    kind = HOOK_KINDS.get(kind, kind) if kind is not None else None
    if kind in KINDS:
        return {**body, "kind": kind}
    hook = HOOK_KINDS.get(name)
    if hook == "permission.ask":
        perm = body.get("permission") if isinstance(body.get("permission"), dict) else body
        return {"kind": hook, "permission": perm}
    if hook is not None:
        return {"kind": hook, "input": get_dict(body, "input"), "output": get_dict(body, "output")}
    event = body.get("event")
    if isinstance(event, dict):
        return {"kind": "bus", "event": event}
    if isinstance(body.get("type"), str):
        return {"kind": "bus", "event": body}
    return {"kind": "bus", "event": {"type": name, "properties": get_dict(body, "properties")}}


def session_of(moment: dict[str, Any]) -> str | None:
    """identity.session_from: properties.sessionID | properties.info.sessionID | properties.info.id | ..."""
    kind = moment.get("kind")
    if kind == "permission.ask":
        return get_str(moment.get("permission"), "sessionID")
    if kind in ("tool.before", "tool.after"):
        return get_str(moment.get("input"), "sessionID")
    event = get_dict(moment, "event")
    props = get_dict(event, "properties")
    info = get_dict(props, "info")
    found = get_str(props, "sessionID") or get_str(info, "sessionID")
    if found is None and str(event.get("type", "")).startswith("session."):
        # info.id is the session only on session.* events (on message.updated it is a message id).
        found = get_str(info, "id")
    return found


def question_form(agent: str, props: dict[str, Any]) -> Form:
    """A bus ``question.asked`` as a form (kilocode.json ``question_asked``): one select per question,
    1-based ids for questions and choices, so an answer maps back to the vendor's labels."""
    fields: list[dict[str, Any]] = []
    raw = props.get("questions")
    for i, q in enumerate(raw if isinstance(raw, list) else []):
        q = q if isinstance(q, dict) else {}
        header, text = get_str(q, "header"), get_str(q, "question")
        spec: dict[str, Any] = {
            "id": str(i + 1),
            "type": "select",
            "label": f"{header}: {text}" if header and text else (text or header or str(i + 1)),
            "required": True,
        }
        opts = q.get("options")
        choices = [
            {"id": str(j + 1), "label": get_str(o, "label") or str(j + 1)}
            for j, o in enumerate(opts if isinstance(opts, list) else [])
        ]
        if q.get("multiple") is True:
            spec["multi"] = True
        if q.get("custom") is not False:
            spec["other"] = True  # vendor `custom` (default true) -> other
        if choices:
            spec["choices"] = choices
        else:
            # A select needs choices (schema if/then); with none, the only answer is free text.
            spec["type"] = "string"
            spec.pop("multi", None)
            spec.pop("other", None)
        fields.append(spec)
    n = len(fields)
    prompt = f"{agent} asks {n} question" + ("" if n == 1 else "s")
    return Form(prompt, fields, prompt)


def decode(agent: str, name: str, body: Any) -> Signal:
    """A POST (its body, the moment's name) as the Signal the mapping reads: the moment, its session,
    and what a bus ask offers (every family vendor answers them over its reply routes)."""
    moment = as_moment(name, body)
    signal = Signal(agent=agent, name=name, payload=moment, session=session_of(moment))
    event = get_dict(moment, "event") if moment["kind"] == "bus" else {}
    if event.get("type") == "permission.asked":
        signal.options = REPLY_ROUTE_OPTIONS
    elif event.get("type") == "question.asked":
        signal.form = question_form(agent, get_dict(event, "properties"))
    return signal
