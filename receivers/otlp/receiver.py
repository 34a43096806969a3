"""The ``otlp`` receiver: OTLP/gRPC ``LogsService/Export`` and OTLP/HTTP ``POST /v1/logs``.

Both transports decode and flatten the request's records (``flatten.py``) and push one batch
of ``Signal``s per export request. Answers follow the OTLP specification: success (with ``partial_success`` for records refused), 400 /
INVALID_ARGUMENT for a body that cannot be decoded (never retried), 413 / RESOURCE_EXHAUSTED
over the size or record-count limit, 415 for an unsupported content type or encoding, and 503 /
UNAVAILABLE (retryable) while the pipeline is failing or the durable record did not take a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from typing import Any

import grpc
from aep_collector.pipeline.component import Consumer, CreateSettings
from aep_collector.pipeline.config import parse_endpoint
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.http_refusals import JsonRefusalRunner
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.pipeline import SLICE, NotDurable
from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from ..body import UNREAD_BODY, BodyDeadlines, BodyError, ProtocolLog, read_body, reply_and_close
from . import wire
from .config import OtlpConfig
from .flatten import flatten_protobuf, flatten_request
from .identity import SESSION_FROM, describe, session_of

log = logging.getLogger("aep.receiver.otlp")

LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
# Signals this receiver does not turn into events. VS Code exports traces and metrics to the same
# endpoint as logs; refusing them would make the extension log an export error every interval.
IGNORED_SERVICES = ("opentelemetry.proto.collector.trace.v1.TraceService",
                    "opentelemetry.proto.collector.metrics.v1.MetricsService")
IGNORED_PATHS = ("/v1/traces", "/v1/metrics")
# Requests answered 503 after the durable record took some of their sessions: an exporter's retry
# resends the same bytes, and those sessions are then not written twice. Bounded, and forgotten
# after the longest an OTLP exporter keeps retrying (the Collector's exporterhelper: 300 s).
WRITTEN_ENTRIES = 256
WRITTEN_SECONDS = 600.0


GRPC_MAX_MESSAGE = 2**31 - 1
"""The largest ``grpc.max_receive_message_length`` grpc takes (and the largest message it carries)."""

_CAUSES = {400: "invalid-request", 413: "payload-too-large", 415: "unsupported-media-type"}


class BodyWireError(wire.WireError):
    """A body that could not be read (``aep_collector.receivers.body``), keeping its cause for the counters."""

    def __init__(self, status: int, code: int, message: str, cause: str) -> None:
        super().__init__(status, code, message)
        self.cause = cause


class PipelineUnavailable(Exception):
    """The next consumer failed: answer retryable (503 / UNAVAILABLE)."""


class OtlpReceiver:
    """OTLP logs in, one ``Signal`` batch per export request out."""

    def __init__(self, settings: CreateSettings, config: OtlpConfig, next_consumer: Consumer) -> None:
        config.validate()
        self.id = f"receiver/{settings.id}"
        self.config = config
        self.consumer = next_consumer
        self.agent = config.agent
        self.health = Health()
        self.grpc_server: grpc.aio.Server | None = None
        self.runner: web.AppRunner | None = None
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self._session_at = SESSION_FROM[config.profile]  # the profile's identity rule
        self.session_key = describe(self._session_at)
        """Where the identity rule looks first, in words (the refusal message says it)."""
        # consume_acked tells us what the durable record did not take (and yields to the loop on a
        # big batch); a consumer without it (a test double) is called as any consumer.
        self._consume = getattr(next_consumer, "consume_acked", None) or next_consumer.consume
        self._written: OrderedDict[bytes, tuple[float, frozenset[str]]] = OrderedDict()
        """Digest of a request answered 503 -> (when, the sessions the durable record took)."""
        self.bodies = BodyDeadlines()
        """OTLP/HTTP bodies still arriving, ended at shutdown (nothing of them was accepted)."""

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, host: Host) -> None:
        self.health = host.health
        self.bodies = BodyDeadlines()
        try:
            if self.config.grpc is not None:
                await self._start_grpc(self.config.grpc.endpoint)
            if self.config.http is not None:
                await self._start_http(self.config.http.endpoint)
        except BaseException:
            await self.shutdown()
            raise

    async def shutdown(self) -> None:
        if self.grpc_server is not None:
            server, self.grpc_server = self.grpc_server, None
            with contextlib.suppress(Exception):
                await server.stop(grace=2.0)  # in-flight exports finish, new ones are refused
        if self.runner is not None:
            runner, self.runner = self.runner, None
            # A body still arriving would hold the cleanup up to body_timeout: its client gets a
            # retryable 503 now, and resends to whichever collector answers next.
            self.bodies.end()
            with contextlib.suppress(Exception):
                await runner.cleanup()

    async def _start_grpc(self, endpoint: str) -> None:
        host, port = parse_endpoint(endpoint, path="grpc.endpoint")
        server = grpc.aio.server(options=[
            # A C int in grpc (a larger value fails start with OverflowError), and no gRPC message
            # is larger anyway; max_request_bytes still bounds OTLP/HTTP as configured.
            ("grpc.max_receive_message_length", min(self.config.max_request_bytes, GRPC_MAX_MESSAGE)),
            # grpc enables SO_REUSEPORT by default: a second receiver on the same port would then
            # bind "successfully" and silently take half the traffic.
            ("grpc.so_reuseport", 0),
        ])
        # Raw bytes in and out (no deserializer): a malformed body is then ours to answer with
        # INVALID_ARGUMENT, where grpc's own deserializer would report INTERNAL.
        handlers = [grpc.method_handlers_generic_handler(LOGS_SERVICE, {
            "Export": grpc.unary_unary_rpc_method_handler(self._grpc_export)})]
        handlers += [grpc.method_handlers_generic_handler(name, {
            "Export": grpc.unary_unary_rpc_method_handler(self._grpc_ignored)}) for name in IGNORED_SERVICES]
        server.add_generic_rpc_handlers(tuple(handlers))
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"{self.id}: cannot listen on {endpoint} (gRPC): {exc}") from None
        if not bound:
            raise OSError(f"{self.id}: cannot listen on {endpoint} (gRPC)")
        await server.start()
        self.grpc_server, self.grpc_port = server, bound
        log.info("%s: OTLP/gRPC on %s:%s (profile %s, %s mode)", self.id, host, bound,
                 self.config.profile, self.config.mode)

    async def _start_http(self, endpoint: str) -> None:
        host, port = parse_endpoint(endpoint, path="http.endpoint")
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app.router.add_post("/v1/logs", self._http_logs)
        for path in IGNORED_PATHS:
            app.router.add_post(path, self._http_ignored)
        app.router.add_route("*", "/{tail:.*}", self._http_not_found)
        # Gzip is undone here, bounded by max_request_bytes, so that a body that is not gzip gets
        # an OTLP error body instead of aiohttp's bare 400 (and a gzip bomb cannot blow up).
        # JsonRefusalRunner: a request aiohttp cannot parse gets a JSON body naming the problem,
        # like every other refusal (no content type was read to answer in).
        self.runner = JsonRefusalRunner(app, access_log=None, handle_signals=False, auto_decompress=False,
                                        logger=ProtocolLog(self.health, self.id))
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # the bound port when 0 was asked for
        self.http_port = sockets[0].getsockname()[1] if sockets else port
        log.info("%s: OTLP/HTTP on http://%s:%s/v1/logs (profile %s, %s mode)", self.id, host,
                 self.http_port, self.config.profile, self.config.mode)

    # -- the transport-independent part --------------------------------------------------------

    async def ingest(self, records: list[dict[str, Any]], body: bytes | None = None) -> ExportLogsServiceResponse:
        """Refuse flattened records without a session, push one batch; the OTLP response.

        ``body`` (the decoded request) identifies a retry of a request answered 503 part-written.
        """
        batch: list[Signal | dict[str, Any]] = []
        rejected = 0
        mode, agent, places = self.config.mode, self.agent, self._session_at
        where, key = places[0]
        for at in range(0, len(records), SLICE):
            if at:
                await asyncio.sleep(0)  # other receivers' requests run between slices of a big batch
            for flat in records[at:at + SLICE]:
                # A non-empty string where the identity rule looks first is what session_of would
                # return (read once here per record, not through a call); anything else asks it.
                sid = flat[where].get(key)
                if type(sid) is not str or not sid:
                    sid = session_of(places, flat)
                    if sid is None:
                        # Bridges digest §1.6: a record with no session key cannot form a valid
                        # session-scoped envelope; refuse it visibly rather than invent an id.
                        rejected += 1
                        continue
                name = flat["attributes"].get("event.name")
                batch.append(Signal(agent, name if isinstance(name, str) else "", flat, mode, session=sid))
        if batch:
            await self._push(batch, body)
        response = ExportLogsServiceResponse()
        if rejected:
            self.health.count(self.id, "rejected", rejected)
            response.partial_success.rejected_log_records = rejected
            response.partial_success.error_message = (
                f"{rejected} of {len(records)} log records carry no {self.session_key} "
                f"(the {self.config.profile} profile's session key) and were rejected")
        return response

    async def _push(self, batch: list[Signal | dict[str, Any]], body: bytes | None) -> None:
        """Push ``batch``; raise ``PipelineUnavailable`` unless the durable record took all of it."""
        accepted = len(batch)
        key = None
        if self._written and body is not None:  # a digest only while a part-written request waits
            key = hashlib.blake2b(body, digest_size=16).digest()
            done = self._written_for(key)
            if done:
                batch = [s for s in batch if not (isinstance(s, Signal) and s.session in done)]
        try:
            if batch:
                await self._consume(batch)
        except NotDurable as exc:
            sessions = {s.session for s in batch if isinstance(s, Signal)}
            written = frozenset(sessions - exc.sessions)
            if written and body is not None:
                self._remember(key or hashlib.blake2b(body, digest_size=16).digest(), written)
            detail = f"{exc.failed} of {exc.total} events not in the durable record; the sender is told to retry"
            self.health.incident(self.id, "not-durable", detail)
            raise PipelineUnavailable(f"pipeline unavailable: {detail}") from exc
        except Exception as exc:
            self.health.incident(self.id, "pipeline-error", f"{type(exc).__name__}: {exc}")
            raise PipelineUnavailable(f"pipeline unavailable: {type(exc).__name__}") from exc
        if key is not None:
            self._written.pop(key, None)  # the retry got through: nothing left to skip
        self.health.recover(self.id, "pipeline-error")
        self.health.recover(self.id, "not-durable")
        self.health.count(self.id, "accepted", accepted)

    def _written_for(self, key: bytes) -> frozenset[str]:
        """The sessions an earlier attempt of this request got into the durable record."""
        now = time.monotonic()
        while self._written:
            oldest = next(iter(self._written.values()))
            if now - oldest[0] <= WRITTEN_SECONDS:
                break
            self._written.popitem(last=False)
        entry = self._written.get(key)
        return entry[1] if entry else frozenset()

    def _remember(self, key: bytes, sessions: frozenset[str]) -> None:
        # A retry that fails again keeps what both attempts wrote (done | newly written).
        earlier = self._written.pop(key, None)
        self._written[key] = (time.monotonic(), (sessions | earlier[1]) if earlier else sessions)
        if len(self._written) > WRITTEN_ENTRIES:
            self._written.popitem(last=False)

    def _refused(self, transport: str, error: wire.WireError, cause: str = "") -> None:
        self.health.count(self.id, "refused")
        # One line per cause, throttled, and counted in /metrics (never one line per request).
        cause = cause or _CAUSES.get(error.status, f"http-{error.status}")
        self.health.request_error(self.id, cause,
                                  f"refused an OTLP/{transport} request ({error.status}): {error.message}")

    # -- OTLP/gRPC -------------------------------------------------------------------------------

    async def _grpc_export(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        code, message = None, ""
        try:
            response = await self.ingest(flatten_protobuf(body, self.config.max_request_records), body)
            return response.SerializeToString()
        except wire.WireError as exc:
            self._refused("gRPC", exc)
            code = (grpc.StatusCode.RESOURCE_EXHAUSTED if exc.code == wire.RESOURCE_EXHAUSTED
                    else grpc.StatusCode.INVALID_ARGUMENT)
            message = exc.message
        except PipelineUnavailable as exc:
            code, message = grpc.StatusCode.UNAVAILABLE, str(exc)
        except Exception as exc:  # a receiver bug must never stop the server; INTERNAL is not retried
            self.health.incident(self.id, "internal-error", f"OTLP/gRPC export: {type(exc).__name__}: {exc}")
            self.health.request_error(self.id, "internal-error", f"OTLP/gRPC export: {type(exc).__name__}: {exc}")
            log.debug("%s: OTLP/gRPC export failed", self.id, exc_info=True)
            code, message = grpc.StatusCode.INTERNAL, f"{type(exc).__name__}"
        await context.abort(code, message)  # raises: the status is the answer
        return b""

    async def _grpc_ignored(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.health.count(self.id, "ignored_requests")
        return b""  # an empty Export*ServiceResponse: accepted, nothing to do

    # -- OTLP/HTTP -------------------------------------------------------------------------------

    async def _http_logs(self, request: web.Request) -> web.Response:
        ctype = request.content_type.lower()
        if ctype not in wire.CONTENT_TYPES:
            self.health.count(self.id, "refused")
            self.health.request_error(self.id, "unsupported-media-type", f"Content-Type {request.content_type!r}")
            return web.Response(status=415, text=f"unsupported Content-Type {request.content_type!r}: "
                                "OTLP/HTTP takes application/x-protobuf or application/json")
        try:
            body = await self._read_body(request, ctype)
            limit = self.config.max_request_records
            if ctype == wire.JSON:
                records = flatten_request(wire.parse_json(body, limit))  # counts the records as it walks
            else:
                records = flatten_protobuf(body, limit)
            response = await self.ingest(records, body)
        except wire.WireError as exc:  # only reading and decoding raise it, never ingest
            self._refused("HTTP", exc, getattr(exc, "cause", ""))
            out = self._status_response(exc.status, exc.code, exc.message, ctype)
            if exc.status == 503:
                out.headers["Retry-After"] = "1"
            # The rest of an unread body would be read before the next request: close instead.
            return await reply_and_close(request, out) if getattr(exc, "cause", "") in UNREAD_BODY else out
        except PipelineUnavailable as exc:
            # OTLP/HTTP: 503 is retryable; Retry-After paces the exporter's retries.
            out = self._status_response(503, wire.UNAVAILABLE, str(exc), ctype)
            out.headers["Retry-After"] = "1"
            return out
        except Exception as exc:  # a receiver bug must never stop the server; 500 is not retried
            self.health.incident(self.id, "internal-error", f"OTLP/HTTP export: {type(exc).__name__}: {exc}")
            self.health.request_error(self.id, "internal-error", f"OTLP/HTTP export: {type(exc).__name__}: {exc}")
            log.debug("%s: OTLP/HTTP export failed", self.id, exc_info=True)
            return self._status_response(500, wire.INTERNAL, type(exc).__name__, ctype)
        return web.Response(status=200, body=wire.encode_message(response, ctype), content_type=ctype)

    async def _read_body(self, request: web.Request, ctype: str) -> bytes:
        limit = self.config.max_request_bytes
        coding = (request.headers.get("Content-Encoding") or "identity").strip().lower()
        if coding not in ("identity", "gzip"):
            raise wire.WireError(415, wire.INVALID_ARGUMENT,
                                 f"unsupported Content-Encoding {coding!r}: use gzip or none")
        try:
            body = await read_body(request, limit, self.config.body_timeout, self.bodies)
        except BodyError as exc:
            code = (wire.RESOURCE_EXHAUSTED if exc.status == 413 else wire.UNAVAILABLE if exc.status == 503
                    else wire.INVALID_ARGUMENT)
            message = f"request {exc.detail}" if exc.status == 413 else exc.detail  # the others say "request body"
            raise BodyWireError(exc.status, code, message, exc.cause) from None
        return wire.gunzip(body, limit) if coding == "gzip" else body

    def _status_response(self, status: int, code: int, message: str, ctype: str) -> web.Response:
        return web.Response(status=status, body=wire.encode_status(code, message, ctype), content_type=ctype)

    async def _http_ignored(self, request: web.Request) -> web.Response:
        self.health.count(self.id, "ignored_requests")
        ctype = request.content_type.lower()
        ctype = ctype if ctype in wire.CONTENT_TYPES else wire.PROTOBUF
        return web.Response(status=200, body=b"{}" if ctype == wire.JSON else b"", content_type=ctype)

    async def _http_not_found(self, request: web.Request) -> web.Response:
        if request.path in ("/v1/logs", *IGNORED_PATHS):
            return web.Response(status=405, text=f"use POST {request.path}", headers={"Allow": "POST"})
        return web.Response(status=404, text=f"no route {request.method} {request.path}; "
                            "OTLP logs go to POST /v1/logs")
