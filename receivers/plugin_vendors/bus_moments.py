"""What an OpenCode-family plug-in POSTs, decoded into the moment its mapping reads.

The shipped plug-in (``js/opencode-plugin.js``, ``js/kilocode-plugin.js``) posts the fixture-shaped
moments of ``conformance/fixtures/mappings/opencode.json``: ``{kind: "bus", event}``,
``{kind: "tool.before"|"tool.after", input, output}``, ``{kind: "permission.ask", permission}``.
Anything else (a hook name as ``kind``, a bare bus event, a payload named only by ``?name=``) is
decoded here, once, so the mapping reads ``Signal.payload`` as a moment and never the wire.
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.payload import get_dict

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
