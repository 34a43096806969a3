"""What an OpenCode-family plugin (OpenCode, Kilo Code) gets back, and how an answer reaches the vendor.

Reply contract (daemon -> plugin), the plugin applies it and nothing else:

* ``permission.ask(input, output)``: the hook's output is ``{status: "ask" | "deny" | "allow"}``
  (``@opencode-ai/plugin`` ``Hooks["permission.ask"]``, anomalyco/opencode
  ``packages/plugin/src/index.ts`` @0149423; identical in Kilo-Org/kilocode
  ``packages/plugin/src/index.ts`` @00cb0d2). The daemon answers ``{"status": "allow"}`` or
  ``{"status": "deny"}`` (``allow_reply()`` / ``deny_reply()`` / ``permission_reply(option)``)
  and the plugin sets ``output.status`` to that value only when it is ``allow`` or ``deny``.
  ``NEUTRAL_REPLY`` (``{}``, also the timeout and every error path) means: leave ``output``
  untouched, so the vendor's own prompt takes over.
* every other moment is observe-only: the reply is ``NEUTRAL_REPLY`` and the plugin ignores it.
* Kilo Code >=7.4.6 has no held hook: answers go over the server's REST routes
  (``permission_route``/``permission_route_body``, ``question_route``/``question_route_body``).
  Permissions go to ``POST /permission/{id}/reply`` ``{reply, message?}``: OpenCode 1.18.33 and
  Kilo 7.7.7 still serve the deprecated ``POST /session/{id}/permissions/{id}``, but its payload is
  ``{response}`` alone and a ``message`` there is dropped (seen live: the operator's guidance never
  reached the rejected tool call).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aep_collector.pipeline.payload import get_str

NEUTRAL_REPLY: dict[str, Any] = {}
"""Fail-open reply: the plugin leaves the hook's ``output`` untouched."""
REPLY_ROUTE_OPTIONS: list[dict[str, str]] = [
    {"id": "once", "label": "Allow once"},
    {"id": "always", "label": "Always allow"},
    {"id": "reject", "label": "Reject"},
]
"""Kilo >=7.4.6 reply enum, verbatim (kilocode.json ``permission_asked``; Permission.Reply in the
fork): the options a bus ``permission.asked`` card offers, which ``permission_route_body`` answers with."""


def allow_reply() -> dict[str, str]:
    """``permission.ask`` reply that grants: the plugin sets ``output.status = "allow"``."""
    return {"status": "allow"}


def deny_reply() -> dict[str, str]:
    """``permission.ask`` reply that refuses: the plugin sets ``output.status = "deny"``."""
    return {"status": "deny"}


def permission_reply(option: str | None) -> dict[str, str]:
    """Reply for an applied option; anything but ``allow`` refuses (AEP-0008: never grant on the unknown)."""
    return allow_reply() if option == "allow" else deny_reply()


def permission_route(permission_id: str) -> str:
    """The permission reply route of Kilo >=7.4.6 and OpenCode 1.18 (the one that takes a message)."""
    return f"/permission/{quote(permission_id, safe='')}/reply"


def permission_route_body(option: str | None, text: str | None = None) -> dict[str, str]:
    """``{reply, message?}``; unmatched options refuse with the free text as the reject message."""
    if option in ("once", "always"):
        return {"reply": option}
    body = {"reply": "reject"}
    if text:
        # kilocode.json permission_asked: guidance reaches the vendor as the reject message.
        body["message"] = text
    return body


def question_route(request_id: str) -> str:
    """Kilo >=7.4.6 question reply route."""
    return f"/question/{quote(request_id, safe='')}/reply"


def question_route_body(questions: Any, values: Any) -> dict[str, list[list[str]]]:
    """``{answers: string[][]}`` in question order, choice ids resolved back to the ORIGINAL labels."""
    qs = questions if isinstance(questions, list) else []
    vals = values if isinstance(values, dict) else {}
    answers: list[list[str]] = []
    for i, q in enumerate(qs):
        labels = [get_str(o, "label") or "" for o in (q.get("options") if isinstance(q, dict) else None) or []]
        raw = vals.get(str(i + 1))
        picked = raw if isinstance(raw, list) else [] if raw is None else [raw]
        out: list[str] = []
        for item in picked:
            text = str(item)
            # Choice ids are ASCII digits; "²" passes isdigit() but int() refuses it (Other text).
            idx = int(text) - 1 if text.isascii() and text.isdigit() else -1
            # A choice id maps to its vendor label; anything else is the "Other" free text, verbatim.
            out.append(labels[idx] if 0 <= idx < len(labels) else text)
        answers.append(out)
    return {"answers": answers}
