"""Pieces the plugin/shell-hook receivers share for one moment: naming it, observing it."""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Signal
from aep_collector.receivers.hook_http import FailOpenDelivery, HookError
from aiohttp import web

NAME_PARAMS = ("name", "hook")
"""Query parameters that may name a moment whose payload does not (``?name=tool.execute.before``)."""


def unwrap(payload: dict[str, Any], request: web.Request) -> tuple[dict[str, Any], str | None]:
    """The vendor payload and the name given beside it: a ``{name, payload}`` wrapper, else ``?name=``."""
    inner = payload.get("payload")
    if set(payload) == {"name", "payload"} and isinstance(payload.get("name"), str) and isinstance(inner, dict):
        return inner, payload["name"] or None
    for param in NAME_PARAMS:
        value = request.query.get(param)
        if value:
            return payload, value
    return payload, None


def need_name(name: str | None, what: str) -> str:
    """Refuse a moment nobody named (400), saying where a name can come from."""
    if not name:
        raise HookError(400, "invalid-payload", f"{what} is missing; or name the moment with ?name=NAME "
                        "or post {\"name\": NAME, \"payload\": {...}}")
    return name




async def observe(signal: Signal, deliver: FailOpenDelivery, reply: Any) -> Any:
    """Deliver an observe-only moment and give the vendor its neutral reply."""
    await deliver([signal])
    return reply
