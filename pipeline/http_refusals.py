"""An aiohttp runner whose connections refuse what aiohttp cannot parse with a JSON body.

Shared by every HTTP surface the collector serves (hook receivers, OTLP/HTTP, the relay role), so a
malformed request gets the same ``{"error", "detail"}`` body as every other refusal.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler


class _JsonRefusals(RequestHandler):
    """aiohttp's per-connection protocol, answering what aiohttp refuses itself (a request it
    cannot parse: bad framing, an over-long line, a negative ``Content-Length``; a handler that
    raised) with a JSON body naming the problem, like every other refusal, not its text page."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        page = super().handle_error(request, status, exc, message)  # logs it; raises if a reply began
        if status == 400:
            error = "bad-http"
            detail = "malformed HTTP request: " + " ".join(str(message or exc or "").split())[:300]
        else:  # a handler's failure: its traceback stays in the debug log, not in the reply
            error, detail = "internal-error" if status == 500 else "http-error", page.reason
        body = json.dumps({"error": error, "detail": detail}, ensure_ascii=True).encode("ascii")
        response = web.Response(status=page.status, body=body, content_type="application/json")
        response.force_close()  # as aiohttp does: after a request it could not parse, nothing is framed
        return response


class _JsonRefusalServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonRefusals(self, loop=self._loop, **self._kwargs)


class JsonRefusalRunner(web.AppRunner):
    """``web.AppRunner`` whose connections refuse unparsable requests with a JSON body.

    aiohttp answers those before any handler or middleware runs, and has no public hook for the
    reply (aio-libs/aiohttp#3287): the app's own server is rebuilt with the same arguments, its
    per-connection protocol being ``_JsonRefusals``.
    """

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _JsonRefusalServer(server.request_handler, request_factory=server.request_factory,
                                  handler_cancellation=server.handler_cancellation, loop=server._loop,
                                  **server._kwargs)
