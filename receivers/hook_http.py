"""The HTTP hook server every hook-style receiver shares (the Collector's ``receiverhelper``).

``POST /hook`` (and ``POST /``) takes the vendor's native payload; ``GET /healthz`` reports the
collector's health. The vendor-specific part is a ``HookSurface``. Hooks block the agent, so the
server fails open: whatever goes wrong after the body is read, the vendor gets its neutral reply
within ``reply_timeout``; the failure shows in the logs and ``/healthz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import re
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Protocol

from aep_collector.pipeline import wire
from aep_collector.pipeline.component import Consumer, CreateSettings
from aep_collector.pipeline.config import parse_endpoint
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.model import Event, Signal
from aep_collector.pipeline.shim import Failed as ShimFailed
from aep_collector.pipeline.shim import slim_payload
from aep_collector.receivers.body import (
    DEFAULT_BODY_TIMEOUT,
    UNREAD_BODY,
    BodyDeadlines,
    BodyError,
    JsonRefusalRunner,
    ProtocolLog,
    read_body,
    reply_and_close,
    validate_body_timeout,
)
from aiohttp import web

log = logging.getLogger("aep.receiver")

# The HTTP request being handled in this task, so a held loop can notice the vendor hanging up
# (a shim's timeout, a plugin's aborted fetch) without every surface passing it around.
CURRENT_REQUEST: contextvars.ContextVar[web.Request | None] = contextvars.ContextVar(
    "aep_hook_request", default=None)


def vendor_gone() -> bool:
    """True when the vendor side of the current hook request has closed its connection."""
    return connection_gone(CURRENT_REQUEST.get())()


def connection_gone(request: web.Request | None) -> Callable[[], bool]:
    """A check that ``request``'s client has closed its connection (always false without one)."""
    if request is None:
        return _never

    def gone() -> bool:
        transport = request.transport  # None once the connection is lost
        return transport is None or transport.is_closing()

    return gone


def _never() -> bool:
    return False

JSON = "application/json"
SLIM_AT_ONCE = 2
"""Bodies over ``max_body_bytes`` read at once per receiver: each may be ``max_slim_bytes``, so this
bounds their memory; past it such a body gets the 413 it got before slimming existed."""


@dataclass
class HookReceiverConfig:
    """Keys every hook receiver has. Vendor receivers subclass it with their default endpoint."""

    endpoint: str = "127.0.0.1:0"
    """``host:port`` to listen on; loopback by default (hooks carry prompts and commands)."""
    max_body_bytes: int = 1 << 20
    """The largest body passed on whole; a larger one is slimmed (``max_slim_bytes``) or refused (413)."""
    max_slim_bytes: int = 16 << 20
    """A body over ``max_body_bytes`` and up to this is read whole and slimmed to ``max_body_bytes``
    (its bulkiest top-level values dropped, as the shim does), so its event still arrives; 0 refuses
    every body over ``max_body_bytes`` with 413. The reference ingest's cap."""
    reply_timeout: float = 5.0
    """Seconds the pipeline may take before the vendor gets its neutral reply anyway."""
    max_concurrent_requests: int = 512
    """Hook requests in flight at once (held ones included); beyond it a request gets 503 at once."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds a request body may take to arrive whole (else 408); separate from any hold window."""

    def listens(self) -> dict[str, str]:
        """Where it listens, by key (the config checks no two listeners share a port)."""
        return {"endpoint": self.endpoint}

    def validate(self) -> None:
        if self.max_concurrent_requests < 1:
            raise ValueError("max_concurrent_requests must be at least 1")
        parse_endpoint(self.endpoint, path="endpoint")
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be positive")
        if self.max_slim_bytes < 0:
            raise ValueError("max_slim_bytes must be 0 (off) or a number of bytes")
        if self.reply_timeout <= 0:
            raise ValueError("reply_timeout must be positive")
        validate_body_timeout(self.body_timeout)


def vendor_config(agent: str, keys: type, port: int, module: str, name: str | None = None) -> type:
    """A vendor receiver's config class: ``keys`` (``HookReceiverConfig`` or a subclass with the
    vendor's own keys) with the ``endpoint`` default on ``port``, so the port is written once, in
    the declaration. Named ``name``, else after the agent (``qwen-code`` -> ``QwenCodeConfig``), and
    placed in the vendor's receiver ``module`` (which exports it under that name)."""
    name = name or "".join(part.capitalize() for part in agent.replace("-", "_").split("_")) + "Config"
    config_class = make_dataclass(name, [("endpoint", str, field(default=f"127.0.0.1:{port}"))], bases=(keys,))
    config_class.__doc__ = f"Config of the ``{agent.replace('-', '_')}`` receiver (its keys: ``{keys.__name__}``)."
    config_class.__module__ = module
    return config_class


class HookError(Exception):
    """A request the receiver refuses, with its HTTP status and JSON body."""

    def __init__(self, status: int, error: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.body = {"error": error, "detail": detail, **extra}


HOOK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
"""What a ``?hook=`` may name: the query is the shim's EVENT argument, never free text."""


def query_hook(request: web.Request) -> str | None:
    """The ``?hook=`` name, stripped; None without one. A 400 ``invalid-hook`` unless it is a hook
    name (``HOOK_NAME``): the one rule for every receiver that takes the shim's EVENT argument."""
    name = request.query.get("hook")
    if name is None:
        return None
    name = name.strip()
    if not HOOK_NAME.fullmatch(name):
        raise HookError(400, "invalid-hook", "?hook= must be a hook event name "
                        "(a letter, then letters, digits, '_', '.', '-'; at most 64)")
    return name


def hook_signal(agent: str, payload: dict[str, Any], key: str, request: web.Request | None = None) -> Signal:
    """The Signal of a hook whose payload names it in ``key``; with ``request``, a ``?hook=`` name
    serves a payload that does not (a 400 ``invalid-hook`` unless it is a hook name, ``HOOK_NAME``).
    No name is a 400 ``invalid-payload`` saying where one goes."""
    name = payload.get(key)
    if (not isinstance(name, str) or not name) and request is not None:
        name = query_hook(request)
    if not isinstance(name, str) or not name:
        where = " (or pass ?hook=<EventName>)" if request is not None else ""
        raise HookError(400, "invalid-payload", f"{key} is missing or not a string{where}")
    return Signal(agent=agent, name=name, payload=payload)


class HookSurface(Protocol):
    """What a vendor contributes to the shared server."""

    agent: str
    """Mapping key of the vendor (``Signal.agent``)."""

    def signal(self, payload: dict[str, Any], request: web.Request) -> Signal:
        """Turn a parsed body into a Signal (raise ``HookError`` for a refusal)."""
        ...

    def neutral(self, signal: Signal | None) -> Any:
        """The vendor's fail-open reply body for this hook (``None``: an empty 200)."""
        ...

    async def handle(self, signal: Signal, deliver: FailOpenDelivery) -> Any:
        """Deliver the signal and return the reply body (held loops wait here)."""
        ...


class BatchSurface(HookSurface, Protocol):
    """A surface whose vendor side may send ``{"batch": [moment, ...]}`` (the plug-in files do)."""

    def awaits_reply(self, signal: Signal) -> bool:
        """True for a moment whose reply the vendor reads: it must come alone, never in a batch."""
        ...


class FailOpenDelivery:
    """Pushes a batch into the pipeline with the fail-open deadline; never raises."""

    def __init__(self, component: str, consumer: Consumer, health: Health, timeout: float) -> None:
        self.component, self.consumer, self.health, self.timeout = component, consumer, health, timeout
        self.pending: set[asyncio.Task[Any]] = set()

    async def __call__(self, batch: list[Any]) -> list[Event] | None:
        """The stamped events, or ``None`` when the pipeline failed or was too slow to wait for."""
        lanes = await self.lanes(batch)
        return None if lanes is None else [e for _, events in lanes for e in events]

    async def lanes(self, batch: list[Any]) -> list[tuple[Any, list[Event]]] | None:
        """Like calling it, but per pipeline: what held loops need to answer in each lane."""
        each = getattr(self.consumer, "consume_each", None)
        if each is not None:
            coro = each(batch)
        else:
            coro = _single_lane(self.consumer, batch)
        # The pipeline's first step runs here, in the hook's own task (the eager start Python 3.12
        # has as a task factory): a pipeline that never suspends (the built-in one) is then done,
        # with no task, loop turn, deadline timer, shield or waiter on the hook's critical path.
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            events = stop.value
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return self._failed(None)
        except Exception as exc:
            return self._failed(exc)
        else:
            # It suspended: the rest runs as a task of its own, so a slow batch finishes behind
            # the neutral reply instead of being lost with the hook.
            events = await self._wait(_Started(coro, yielded))
            if events is None:
                return None
        self.health.count(self.component, "accepted", len(batch))
        return events

    async def _wait(self, rest: Coroutine[Any, Any, Any]) -> Any:
        """The rest of a suspended batch as a task, awaited until the fail-open deadline; None if
        it failed, was cancelled under the hook, or is still running when the deadline passes."""
        loop = asyncio.get_running_loop()
        task = loop.create_task(rest)
        self.pending.add(task)
        task.add_done_callback(self._done)
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.timeout)
        except TimeoutError:
            # The batch keeps going in the background: slow is not lost.
            self.health.incident(self.component, "pipeline-slow",
                             f"pipeline took over {self.timeout}s; replied neutral")
            return None
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not task.cancelled() or (current is not None and current.cancelling()):
                raise  # the hook itself is being cancelled (its client left, shutdown): not ours to swallow
            # The batch was cancelled under a hook still waiting: that hook gets its neutral reply.
            return self._failed(None)
        except Exception as exc:
            return self._failed(exc)

    def _failed(self, exc: Exception | None) -> None:
        """Show why a hook got its neutral reply: the pipeline raised ``exc``, or (None) was cancelled."""
        if exc is None:
            self.health.incident(self.component, "pipeline-cancelled", "the pipeline's batch was cancelled; "
                                 "replied neutral")
        else:
            self.health.incident(self.component, "pipeline-error", f"{type(exc).__name__}: {exc}")

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.pending.discard(task)
        if task.cancelled():  # also behind a reply already sent (slow path): shown, not silent
            self.health.incident(self.component, "pipeline-cancelled", "the pipeline's batch was cancelled")
        elif task.exception() is not None:
            exc = task.exception()
            self.health.incident(self.component, "pipeline-error", f"{type(exc).__name__}: {exc}")

    async def drain(self, timeout: float) -> None:
        if self.pending:
            await asyncio.wait(list(self.pending), timeout=timeout)


async def _single_lane(consumer: Consumer, batch: list[Any]) -> list[tuple[Any, list[Event]]]:
    return [(consumer, await consumer.consume(batch))]


class _Started(Coroutine[Any, Any, Any]):
    """A coroutine whose first step already ran (yielding ``yielded``), as a coroutine a task can
    finish: its first ``send`` hands the task that yield; everything else goes to ``coro``, so a
    task cancelled even before its first step still cancels ``coro`` (its cleanup runs)."""

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self._coro = coro
        self._first: tuple[Any] | None = (yielded,)

    def send(self, value: Any) -> Any:
        if self._first is not None:
            (first,), self._first = self._first, None
            return first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._first = None
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._first = None
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        raise TypeError("_Started is run by a task, not awaited")


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
"""``json.dumps`` with these options would build a new encoder per reply. No ``NaN``/``Infinity``:
they are not JSON (RFC 8259), and a vendor's parser refuses the whole reply (``ValueError`` here)."""


def json_response(body: Any, status: int = 200) -> web.Response:
    """A JSON reply; ``bytes`` go out exactly as given (for replies whose bytes a vendor's docs pin)."""
    if body is None:
        return web.Response(status=status, body=b"", content_type=JSON)
    if isinstance(body, bytes):
        return web.Response(status=status, body=body, content_type=JSON)
    if type(body) is dict and not body:  # the usual neutral reply
        return web.Response(status=status, body=b"{}", content_type=JSON)
    text = _ENCODER.encode(body)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a reply (a message quoting input): escape it
        data = json.dumps(body, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    return web.Response(status=status, body=data, content_type=JSON)


class HookServer:
    """The receiver component: an aiohttp server around a ``HookSurface``."""

    def __init__(self, settings: CreateSettings, config: HookReceiverConfig, next_consumer: Consumer,
                 surface: HookSurface) -> None:
        self.id = f"receiver/{settings.id}"
        self.config = config
        self.consumer = next_consumer
        self.surface = surface
        self.health = Health()
        self.host: Host | None = None
        self.deliver: FailOpenDelivery | None = None
        self.runner: web.AppRunner | None = None
        self.port: int | None = None
        self.inflight: set[asyncio.Task[Any]] = set()
        self.bodies = BodyDeadlines()
        self.slimming = 0  # bodies over max_body_bytes being read at once (each up to max_slim_bytes)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/hook", self._hook)
        app.router.add_post("/", self._hook)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    async def start(self, host: Host) -> None:
        self.host, self.health = host, host.health
        self.bodies = BodyDeadlines()
        self.deliver = FailOpenDelivery(self.id, self.consumer, self.health, self.config.reply_timeout)
        on_start = getattr(self.surface, "on_start", None)
        if on_start is not None:
            await on_start(host, self)
        addr, port = parse_endpoint(self.config.endpoint)
        self.runner = JsonRefusalRunner(self.app(), access_log=None, handle_signals=False,
                                        logger=ProtocolLog(self.health, self.id))
        await self.runner.setup()
        site = web.TCPSite(self.runner, addr, port, reuse_address=True)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # the bound port when 0 was asked for
        self.port = sockets[0].getsockname()[1] if sockets else port
        log.info("%s listening on %s:%s", self.id, addr, self.port)

    async def shutdown(self) -> None:
        on_stop = getattr(self.surface, "on_stop", None)
        if on_stop is not None:
            with contextlib.suppress(Exception):
                await on_stop()
        if self.runner is not None:
            # Stop listening first, let in-flight hooks finish, then close.
            for site in list(self.runner.sites):
                with contextlib.suppress(Exception):
                    await site.stop()
            # A body still arriving is no hook yet (nothing accepted from it): its client gets 503
            # now instead of holding the shutdown up to body_timeout.
            self.bodies.end()
            if self.inflight:
                await asyncio.wait(list(self.inflight), timeout=self.config.reply_timeout + 1)
            await self.runner.cleanup()
            self.runner = None
        if self.deliver is not None:
            await self.deliver.drain(self.config.reply_timeout)

    async def _not_found(self, request: web.Request) -> web.Response:
        if request.path in ("/hook", "/"):
            return json_response({"error": "method-not-allowed", "detail": f"use POST {request.path}"}, 405)
        if request.path == "/healthz":
            return json_response({"error": "method-not-allowed", "detail": "use GET /healthz"}, 405)
        return json_response({"error": "not-found", "detail": f"no route {request.method} {request.path}; "
                              "hooks go to POST /hook"}, 404)

    async def _healthz(self, request: web.Request) -> web.Response:
        body = self.health.snapshot()
        extra = getattr(self.surface, "health_extra", None)
        if extra is not None:
            body.update(extra())
        # Probes (`curl -f`, a container healthcheck) read the status, not the body.
        return json_response(body, 200 if body.get("ok") else 503)

    async def _hook(self, request: web.Request) -> web.Response:
        CURRENT_REQUEST.set(request)
        # The body is read before the request takes a slot: a client that stalls mid-body is
        # bounded by body_timeout and never keeps a whole hook from being served.
        try:
            payload = await self._read_json(request)
        except HookError as exc:
            response = self._refuse(exc)
            return await reply_and_close(request, response) if exc.body["error"] in UNREAD_BODY else response
        if len(self.inflight) >= self.config.max_concurrent_requests:
            # Explicit, counted and visible: never an unbounded pile of waiting agents.
            self.health.count(self.id, "refused")
            self.health.request_error(self.id, "busy", f"over {self.config.max_concurrent_requests} in flight")
            self.health.fail(self.id, "overloaded",
                             f"over {self.config.max_concurrent_requests} hook requests in flight")
            return json_response({"error": "busy", "detail": f"over {self.config.max_concurrent_requests} "
                                  "hook requests in flight; try again"}, 503)
        task = asyncio.current_task()
        if task is not None:
            self.inflight.add(task)
        try:
            return await self._hook_inner(request, payload)
        finally:
            if task is not None:
                self.inflight.discard(task)
            # Its slot is free again, so a request now would be served: no longer overloaded.
            self.health.recover(self.id, "overloaded")

    async def _hook_inner(self, request: web.Request, payload: dict[str, Any]) -> web.Response:
        if len(payload) == 1 and "batch" in payload and hasattr(self.surface, "awaits_reply"):
            return await self._batch(payload["batch"], request)
        signal: Signal | None = None
        try:
            signal = self.surface.signal(payload, request)
            assert self.deliver is not None
            body = await self.surface.handle(signal, self.deliver)
        except HookError as exc:
            return self._refuse(exc)
        except Exception as exc:  # fail open: the agent gets its neutral reply, the log gets the cause
            self.health.incident(self.id, "hook-error", f"{type(exc).__name__}: {exc}")
            self.health.request_error(self.id, "hook-error", f"{type(exc).__name__}: {exc}; replied neutral")
            log.debug("%s: hook failed; replied neutral", self.id, exc_info=True)
            body = self._neutral(signal)
        try:
            return json_response(body)
        except ValueError as exc:  # not JSON (a NaN from an answer): the vendor could not read it
            self.health.incident(self.id, "reply-not-json", f"{exc}; replied neutral")
            self.health.request_error(self.id, "reply-not-json", f"{exc}; replied neutral")
            return json_response(self._neutral(signal))

    def _refuse(self, exc: HookError) -> web.Response:
        self.health.count(self.id, "refused")
        self.health.request_error(self.id, exc.body["error"], exc.body["detail"])
        return json_response(exc.body, exc.status)

    async def _batch(self, items: Any, request: web.Request) -> web.Response:
        """Each item as if POSTed alone, in order; a bad item is reported and never stops the rest."""
        if not isinstance(items, list) or not items:
            return self._refuse(HookError(400, "invalid-payload", "batch must be a non-empty array"))
        surface: BatchSurface = self.surface  # type: ignore[assignment]
        assert self.deliver is not None
        accepted, errors = 0, []
        for index, item in enumerate(items):
            try:
                if not isinstance(item, dict):
                    raise HookError(400, "invalid-payload", f"expected a JSON object, got {type(item).__name__}")
                signal = surface.signal(item, request)
                if surface.awaits_reply(signal):
                    raise HookError(400, "invalid-payload", f"{signal.name} waits for a reply: POST it alone")
                await surface.handle(signal, self.deliver)
                accepted += 1
            except HookError as exc:
                self.health.count(self.id, "refused")
                self.health.request_error(self.id, exc.body["error"], f"batch item {index}: {exc.body['detail']}")
                errors.append({"index": index, **exc.body})
            except Exception as exc:  # fail open, as for a lone moment; the rest still goes in
                self.health.incident(self.id, "hook-error", f"{type(exc).__name__}: {exc}")
                self.health.request_error(self.id, "hook-error", f"batch item {index}: {type(exc).__name__}: {exc}")
                log.debug("%s: batch item %d failed", self.id, index, exc_info=True)
                errors.append({"index": index, "error": "hook-error", "detail": f"{type(exc).__name__}"})
        if not accepted:
            return json_response({"error": "invalid-payload", "detail": "no item of the batch was accepted",
                                  "errors": errors}, 400)
        return json_response({"accepted": accepted, "errors": errors})

    def _neutral(self, signal: Signal | None) -> Any:
        try:
            return self.surface.neutral(signal)
        except Exception:
            return {}

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        limit, cap = self.config.max_body_bytes, self.config.max_slim_bytes
        length = request.content_length
        try:
            if cap > limit and (length is None or length > limit) and self.slimming < SLIM_AT_ONCE:
                # Maybe over the limit: read it under the larger cap (a clone carries aiohttp's own
                # cap for this request only), a bounded number at a time.
                self.slimming += 1
                try:
                    raw = await read_body(request.clone(client_max_size=cap), cap, self.config.body_timeout,
                                          self.bodies)
                finally:
                    self.slimming -= 1
            else:
                raw = await read_body(request, limit, self.config.body_timeout, self.bodies)
            payload = wire.loads(raw)
        except BodyError as exc:
            raise HookError(exc.status, exc.cause, exc.detail, **exc.extra) from None
        except wire.DecodeError as exc:
            raise HookError(400, "invalid-json", str(exc)) from None
        if not isinstance(payload, dict):
            raise HookError(400, "invalid-payload", f"expected a JSON object, got {type(payload).__name__}")
        if len(raw) > limit:
            self._slim(payload, len(raw))
        return payload

    def _slim(self, payload: dict[str, Any], size: int) -> None:
        """``payload`` (``size`` bytes as sent) cut to ``max_body_bytes`` in place, as the shim would
        have sent it after a 413: a tool's huge output must not cost the session its event. What
        was dropped is counted (``slimmed``) and logged; a payload that cannot fit is a 413."""
        limit = self.config.max_body_bytes
        if len(payload) == 1 and "batch" in payload:  # a batch's items are not slimmed one by one
            raise HookError(413, "payload-too-large", f"batch body of {size} bytes over {limit} bytes; "
                            "send its items in smaller batches", max_bytes=limit)
        keys = list(payload)
        try:
            slim_payload(payload, limit)
        except ShimFailed as exc:
            raise HookError(413, "payload-too-large", f"body of {size} bytes over {limit} bytes, "
                            f"and {exc}", max_bytes=limit) from None
        # The keys are the vendor's, so each is quoted, escaped and cut: one log line, of bounded length.
        dropped = [ascii(key)[:40] for key in keys if key not in payload]
        self.health.count(self.id, "slimmed")
        log.warning("%s: a %d-byte hook body was over max_body_bytes (%d); passed on without %s%s",
                    self.id, size, limit, ", ".join(dropped[:8]) or "nothing (only its spelling was over)",
                    f" and {len(dropped) - 8} more" if len(dropped) > 8 else "")
