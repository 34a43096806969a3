"""Reading a request body, the same way for every HTTP receiver (hook servers and OTLP/HTTP).

The reader itself (``read_body``, ``BodyDeadlines``, ``reply_and_close``) is ``pipeline/body.py``,
shared with the relay role's ingest; it is re-exported here. A body must arrive whole within
``body_timeout`` seconds of the request's headers, and no larger than the receiver's limit. A
client that sends headers and then stalls (or trickles one byte at a time) gets 408 when the time
is up; the receivers read the body before a request takes one of the ``max_concurrent_requests``
slots, so stalled bodies never starve the hooks that arrive whole. This bound is separate from a
held hook's hold window, which starts once the body is in. At shutdown a server ends the bodies
still arriving at once (``BodyDeadlines.end``: 503 ``shutting-down``): no event was accepted from
them, so nothing is lost by not waiting.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from aep_collector.pipeline.body import (  # noqa: F401  (re-exported)
    DEFAULT_BODY_TIMEOUT,
    UNREAD_BODY,
    BodyDeadlines,
    BodyError,
    read_body,
    reply_and_close,
    validate_body_timeout,
)
from aep_collector.pipeline.http_refusals import JsonRefusalRunner  # noqa: F401  (re-exported)


class ProtocolLog(logging.LoggerAdapter):
    """aiohttp's per-connection logger for one receiver (``AppRunner(..., logger=...)``).

    aiohttp logs every request it cannot parse (a malformed request line or header, broken
    chunked framing) and every handler error as an ERROR with a traceback. Here each becomes a
    counted request error of the receiver, logged one line per cause (throttled, see
    ``Health.request_error``); the traceback goes nowhere above ``debug``, and even there as one line.
    """

    def __init__(self, health: Any, component: str) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.health, self.component = health, component

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        what = f"{type(exc).__name__}: {exc}" if exc is not None else str(msg)
        self.health.request_error(self.component, "bad-http", what)
        self.logger.debug("%s: %s", self.component, " ".join(what.split())[:300])

    error = exception

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("exc_info"):  # a request that is not HTTP at all: counted like the others
            self.exception(msg, *args, **kwargs)
        else:
            self.logger.debug(msg, *args, **kwargs)
