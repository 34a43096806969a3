"""Pieces the five plugin/shell-hook receivers share: naming, switches, held waits, session sweeps."""

from __future__ import annotations

import asyncio
import contextvars
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from pipeline.control import Hold, Outcome
from pipeline.model import Signal
from receivers.held import HeldLoop
from receivers.hook_http import Deliver, HookError

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})
NAME_PARAMS = ("name", "hook")
"""Query parameters that may name a moment whose payload does not (``?name=tool.execute.before``)."""
GONE_POLL = 0.1
"""Seconds between checks that the vendor side of a held request is still connected."""

# The request being handled, for the surface's ``handle`` (HookServer calls ``signal`` then
# ``handle`` in the same task, so a context variable is exact per request).
CURRENT_REQUEST: contextvars.ContextVar[web.Request | None] = contextvars.ContextVar(
    "aep_plugin_vendor_request", default=None)


def switch(value: bool | str, key: str) -> bool:
    """A config switch: a boolean, or the words an env substitution yields (``1``/``0``, ``true``/``false``)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{key} must be a boolean (or one of 1/0, true/false, yes/no, on/off), got {value!r}")


def unwrap(payload: dict[str, Any], request: web.Request) -> tuple[dict[str, Any], str | None]:
    """The vendor payload and the name given beside it: a ``{name, payload}`` wrapper, else ``?name=``."""
    CURRENT_REQUEST.set(request)
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


def expires_at(timeout: float) -> str:
    """RFC 3339 UTC time ``timeout`` seconds from now (``attention.requested.expires_at``)."""
    at = datetime.fromtimestamp(time.time() + timeout, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _gone(request: web.Request | None) -> bool:
    if request is None:
        return False
    transport = request.transport
    return transport is None or transport.is_closing()


async def wait_or_gone(loop: HeldLoop, hold: Hold, request: web.Request | None = None) -> Outcome:
    """``loop.wait(hold)``, dismissing the hold if the vendor hangs up first.

    A plugin's bounded fetch or a shim's timeout closes the connection: nobody will read our
    reply, so the request is resolved ``dismissed`` and a later answer is refused.
    """
    waiter = asyncio.ensure_future(loop.wait(hold))
    try:
        while not waiter.done():
            await asyncio.wait({waiter}, timeout=GONE_POLL)
            if not waiter.done() and _gone(request):
                await loop.dismiss(hold)
        return waiter.result()
    finally:
        if not waiter.done():
            waiter.cancel()


async def sweep(loop: HeldLoop, session: str | None) -> None:
    """AEP-0002 §7.1: free every hold of ``session`` before its ``session.ended`` is delivered."""
    for hold in loop.pending(session or "unknown"):
        await loop.dismiss(hold)


async def observe(signal: Signal, deliver: Deliver, reply: Any) -> Any:
    """Deliver an observe-only moment and give the vendor its neutral reply."""
    await deliver([signal])
    return reply
