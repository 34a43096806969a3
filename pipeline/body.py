"""Reading a request body, the same way for every HTTP surface: the hook receivers, OTLP/HTTP and
the relay role's ingest (``POST /events``). Here, not in ``receivers/``, so an exporter may use it
without importing a receiver module.

A body must arrive whole within ``body_timeout`` seconds of the request's headers, and no larger
than the surface's limit. A client that sends headers and then stalls (or trickles one byte at a
time) gets 408 when the time is up. At shutdown a server ends the bodies still arriving at once
(``BodyDeadlines.end``: 503 ``shutting-down``): no event was accepted from them, so nothing is lost
by not waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from aiohttp import web

DEFAULT_BODY_TIMEOUT = 10.0


def validate_body_timeout(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError("body_timeout must be a positive number of seconds")


class BodyError(Exception):
    """A body that could not be read: HTTP status, a short cause and a detail for the JSON reply.

    ``cause`` is what the logs and ``aep_collector_request_errors_total`` count it under.
    """

    def __init__(self, status: int, cause: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.cause, self.detail, self.extra = status, cause, detail, extra


UNREAD_BODY = frozenset({"body-timeout", "shutting-down"})
"""Causes after which the rest of the body was never read: the reply must close the connection
(``reply_and_close``), or aiohttp would go on reading it first."""


class BodyDeadlines:
    """The deadlines of one server's bodies still arriving, so its shutdown can end them at once.

    Only a body that did not come with its headers arms a deadline (``read_body``), so only those
    are here; a request whose body is in belongs to the pipeline, and shutdown lets it finish.
    """

    def __init__(self) -> None:
        self.armed: set[asyncio.Timeout] = set()
        self.stopping = False

    def end(self) -> None:
        """Give up every body still arriving, and any that starts to (``read_body``: 503)."""
        self.stopping = True
        now = asyncio.get_running_loop().time()
        for deadline in self.armed:
            if not deadline.expired():
                deadline.reschedule(now)  # it fires on the next loop turn, as if body_timeout had passed

    @contextlib.contextmanager
    def tracking(self, deadline: asyncio.Timeout) -> Iterator[None]:
        self.armed.add(deadline)
        if self.stopping:  # a request on a kept-alive connection, begun after the shutdown did
            deadline.reschedule(asyncio.get_running_loop().time())
        try:
            yield
        finally:
            self.armed.discard(deadline)


async def read_body(request: web.Request, limit: int, timeout: float,
                    deadlines: BodyDeadlines | None = None) -> bytes:
    """The whole body, or ``BodyError`` (408 too slow, 413 too large, 400 broken framing,
    ``client-disconnected`` when the client hung up before sending it, 503 ``shutting-down`` when
    ``deadlines`` were ended while it was still arriving)."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyError(413, "payload-too-large", f"body over {limit} bytes", max_bytes=limit)
    try:
        if request.content.is_eof():
            # The whole body arrived with the headers (a hook's usually does): reading it cannot
            # wait, so no deadline is armed (or tracked) on the hook's critical path.
            return await request.read()
        async with asyncio.timeout(timeout) as deadline:
            if deadlines is None:
                return await request.read()
            with deadlines.tracking(deadline):
                return await request.read()
    except TimeoutError:
        if deadlines is not None and deadlines.stopping:
            raise BodyError(503, "shutting-down", "the collector is shutting down; the request body "
                            "had not arrived whole, so nothing of it was accepted") from None
        raise BodyError(408, "body-timeout", f"request body not received within {timeout:g}s",
                        body_timeout=timeout) from None
    except web.HTTPRequestEntityTooLarge:
        raise BodyError(413, "payload-too-large", f"body over {limit} bytes", max_bytes=limit) from None
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        raise BodyError(400, "client-disconnected", f"connection closed before the body was complete: "
                        f"{type(exc).__name__}") from None
    except Exception as exc:  # aiohttp's payload errors (bad chunked framing, short Content-Length)
        raise BodyError(400, "invalid-body", f"request body could not be read: {type(exc).__name__}") from None


async def reply_and_close(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """Send ``response`` and close the connection: the rest of a stalled body is not waited for
    (aiohttp would otherwise linger up to 10 s reading it before closing)."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    protocol = request.protocol
    if protocol is not None:
        protocol.force_close()  # the transport flushes what was written, then closes
    return response
