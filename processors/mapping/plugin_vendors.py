"""Pieces the Cline, Hermes and pi mappings share: dotted fallbacks, envelope steps, tool trio drafts.

Named after the receivers it serves (``aep_collector.receivers.plugin_vendors``).
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.control import attention_key
from aep_collector.pipeline.model import Event

from .drafting import PERMISSION_OPTIONS, digest, draft, gate_card, snake_case

__all__ = ["ABSENT", "dotted_fallback", "step_of", "number", "usage", "tool_requested", "tool_completed",
           "tool_failed", "gate_request_draft"]

ABSENT: Any = object()
"""Marks a vendor value that was not sent at all (distinct from a JSON ``null`` that was)."""


def dotted_fallback(agent: str, name: Any) -> str:
    """``x.{agent}.{name with underscores as dots}`` (Cline/Hermes pins), at least two segments deep."""
    # AEP-0001 §6 + fixtures cline/hermes fallback: `some_future_hook` -> `x.cline.some.future.hook`.
    parts = [p for p in snake_case(name if isinstance(name, str) else "").split("_") if p]
    if len(parts) < 2:
        parts.append("event")  # the envelope grammar needs two segments after the vendor token
    return f"x.{agent}." + ".".join(parts)


def step_of(value: Any) -> str | None:
    """A vendor counter as the envelope ``step`` string (``0`` stays ``"0"``); None when not a counter."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def number(value: Any) -> int | float | None:
    """A non-negative JSON number as sent (booleans are not numbers), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if value >= 0 else None


def usage(input_tokens: Any, output_tokens: Any) -> dict[str, Any]:
    """AEP-0002 §5.2 usage: flat ``gen_ai.usage.*`` keys, only the counts that were sent."""
    out: dict[str, Any] = {}
    if number(input_tokens) is not None:
        out["gen_ai.usage.input_tokens"] = input_tokens
    if number(output_tokens) is not None:
        out["gen_ai.usage.output_tokens"] = output_tokens
    return out


def tool_requested(ref: dict[str, str], args: Any = ABSENT, **attrs: Any) -> Event:
    """``tool.requested``: the digest at metadata, the whole args at full (the capture processor builds the twin)."""
    data: dict[str, Any] = {"tool": ref}
    if args is not ABSENT:
        data["args_digest"] = digest(args)  # AEP-0003 §9.3: over the original value
        data["args"] = args
    return draft("tool.requested", data, subject=ref["name"], **attrs)


def tool_completed(ref: dict[str, str], *, duration_ms: Any = None, result: Any = ABSENT, **attrs: Any) -> Event:
    """``tool.completed`` with the duration and the result digest (result itself at full)."""
    data: dict[str, Any] = {"tool": ref}
    if number(duration_ms) is not None:
        data["duration_ms"] = duration_ms
    if result is not ABSENT:
        data["result_digest"] = digest(result)
        data["result"] = result
    return draft("tool.completed", data, subject=ref["name"], **attrs)


def tool_failed(ref: dict[str, str], error_type: str, *, message: Any = None, duration_ms: Any = None,
                **attrs: Any) -> Event:
    """``tool.failed``: the schema requires ``error``; its type is metadata, its message redacted."""
    data: dict[str, Any] = {"tool": ref}
    if number(duration_ms) is not None:
        data["duration_ms"] = duration_ms
    error: dict[str, Any] = {"type": error_type}
    if isinstance(message, str) and message:
        error["message"] = message
    data["error"] = error
    return draft("tool.failed", data, subject=ref["name"], **attrs)


def gate_request_draft(tool: str | None, detail: str | None, call_id: str | None, session: str | None,
                       run: str | None, expires_at: str | None) -> Event:
    """The answerable Allow/Deny request an opt-in tool gate raises (Hermes ``pre_tool_call``, pi
    ``tool_call``), keyed ``gate:{call id}`` as the receiver holds it."""
    data = gate_card(tool or "tool", detail, PERMISSION_OPTIONS, expires_at=expires_at)
    return draft("attention.requested", data, subject=tool or "tool", severity="notice", session=session, run=run,
                 _attention_key=attention_key("gate", call_id))
