"""Pieces every vendor mapping builds drafts with: drafts, fallback names, payload fields, cards."""

from __future__ import annotations

import re
from typing import Any

from aep_collector.pipeline.canonical import digest
from aep_collector.pipeline.control import PERMISSION_OPTIONS
from aep_collector.pipeline.model import Event
from aep_collector.pipeline.payload import get_dict, get_str, tool_ref

__all__ = ["gate_card", "json_copy", "digest", "draft", "snake_case", "hook_fallback", "PERMISSION_OPTIONS", "get_str",
           "get_dict", "tool_ref", "permission_prompt"]


_CAMEL_1 = re.compile(r"(.)([A-Z][a-z]+)")
_CAMEL_2 = re.compile(r"([a-z0-9])([A-Z])")
_NON_TOKEN = re.compile(r"[^a-z0-9_]+")


_SCALARS = (str, int, float, bool, type(None))


def json_copy(value: Any) -> Any:
    """A deep copy of parsed JSON (dicts, lists, scalars) — several times faster than deepcopy,
    which it replaces on the per-event path (tool arguments and results); anything else deepcopies."""
    if value.__class__ is dict:
        # A plain dict is copied in one C call, then only its containers are replaced by copies of
        # their own (most values of a payload are scalars): no comprehension frame, no re-insert.
        out = value.copy()
        for k, v in out.items():
            if not isinstance(v, _SCALARS):
                out[k] = json_copy(v)  # replaces a value: the dict's size, so the iteration, stands
        return out
    if isinstance(value, dict):
        # Scalars are taken as they are without a call per value (most values of a payload are).
        return {k: v if isinstance(v, _SCALARS) else json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [v if isinstance(v, _SCALARS) else json_copy(v) for v in value]
    if isinstance(value, _SCALARS):
        return value
    import copy

    return copy.deepcopy(value)


_RUNS = re.compile(r"_+")
# snake_case results by name: a vendor repeats the same few unmapped names (Gemini's model-plane
# hooks fire on every model call) and four regex passes cost more than the rest of their mapping.
_SNAKE: dict[str, str] = {}
_SNAKE_LIMIT = 4096
_SNAKE_NAME_LIMIT = 256


def snake_case(name: str) -> str:
    """CamelCase or anything else -> a type segment ``[a-z0-9_]+`` (never empty)."""
    out = _SNAKE.get(name)
    if out is None:
        s = _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", name)).lower()
        s = _NON_TOKEN.sub("_", s).strip("_")
        out = _RUNS.sub("_", s) or "unnamed"
        if len(_SNAKE) < _SNAKE_LIMIT and len(name) <= _SNAKE_NAME_LIMIT:
            _SNAKE[name] = out
    return out


def hook_fallback(agent: str, hook: str) -> str:
    """AEP-0001 §6: an unmapped hook degrades to ``x.{agent}.session.{snake_case(hook)}``."""
    return f"x.{agent}.session.{snake_case(hook)}"


def draft(type_: str, data: dict[str, Any] | None = None, subject: Any = None, **attrs: Any) -> Event:
    """A draft with only the keys that have values (absent optionals are omitted, never null)."""
    out: Event = {"type": type_, "data": {} if data is None else data}
    if subject is not None and subject != "":
        out["subject"] = subject if subject.__class__ is str else str(subject)
    if attrs:
        for key, value in attrs.items():
            if value is not None:
                out[key] = value
    return out


def permission_prompt(tool: str, detail: str | None, description: str | None = None) -> str:
    """Taxonomy digest §2.4: ``Permission requested: {tool} — {detail}`` (em dash) ``({description})``."""
    text = f"Permission requested: {tool}"
    if detail:
        text += f" \u2014 {detail}"
    if description:
        text += f" ({description})"
    return text


def gate_card(tool: str, detail: str | None, options: list[dict[str, str]], description: str | None = None,
              expires_at: str | None = None) -> dict[str, Any]:
    """The data of the answerable permission card an opt-in tool gate raises (every gated vendor)."""
    data: dict[str, Any] = {"kind": "permission", "prompt": permission_prompt(tool, detail, description),
                            "options": [dict(o) for o in options], "respond_via": ["control"]}
    if expires_at:
        data["expires_at"] = expires_at
    return data
