"""The ``otlp`` exporter: AEP events as OTLP LogRecords over gRPC or HTTP/protobuf (AEP-0005 §3).

It sits behind the persistent sending queue (``deliver``): a batch becomes one
``ExportLogsServiceRequest``. Retries follow the OTLP specification: gRPC ``CANCELLED``,
``DEADLINE_EXCEEDED``, ``ABORTED``, ``OUT_OF_RANGE``, ``UNAVAILABLE``, ``DATA_LOSS`` (and
``RESOURCE_EXHAUSTED`` when the server sends ``RetryInfo``) and HTTP 429/502/503/504 are retried,
honouring ``RetryInfo`` / ``Retry-After``; any other refusal drops the batch (counted, logged), a
redirect too (not followed).
A request refused for its size (HTTP 413, gRPC ``RESOURCE_EXHAUSTED`` "larger than max") is split
in halves until each part fits; only a record too large alone is dropped. A partial success
(``rejected_log_records``) is counted and logged, never retried. An event that
cannot be projected is left out (counted ``dropped``). ``deliver`` returns how many of the batch
the receiver did not take (left out or rejected), so the queue counts only the rest ``exported``.
"""

from __future__ import annotations

import gzip
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import grpc
from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.model import Event
from aep_collector.pipeline.sending_queue import (
    Permanent,
    RetryLater,
    TooLarge,
    headers_problem,
    http_failure,
    redirected,
    retry_after,
    send_in_parts,
    shown_url,
    url_problem,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import LogsServiceStub

from .projection import CAPTURE_ORDER, above, to_otlp
from .wire import log_record, request

__all__ = ["FACTORY", "OtlpExporter", "OtlpExporterConfig", "retry_after"]

log = logging.getLogger("aep.exporter.otlp")

RETRYABLE_GRPC = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
                            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS})
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
# How gRPC servers word a message over their receive limit (C core and Go: "larger than max",
# Java: "exceeds maximum size"): RESOURCE_EXHAUSTED for the request's size, not a quota.
_TOO_LARGE = re.compile(r"larger than max|exceeds maximum size", re.IGNORECASE)


DEFAULT_ENDPOINT = {"grpc": "127.0.0.1:4317", "http": "http://127.0.0.1:4318/v1/logs"}


@dataclass
class OtlpExporterConfig:
    """Config of the ``otlp`` exporter."""

    protocol: Literal["grpc", "http"] = "grpc"
    endpoint: str | None = None
    """gRPC: ``host:port`` (``https://host:port`` for TLS); HTTP: the full URL of ``/v1/logs``.
    Default ``127.0.0.1:4317`` / ``http://127.0.0.1:4318/v1/logs``."""
    headers: dict[str, str] = field(default_factory=dict)
    """Sent with every export (gRPC metadata keys are lowercased), e.g. an API key."""
    timeout: float = 10.0
    compression: Literal["none", "gzip"] = "none"
    max_capture: Literal["none", "metadata", "redacted", "full"] = "metadata"
    """The exporter's capture ceiling: an event declaring more goes without its data (no body,
    no ``gen_ai.*`` attributes), whatever the pipeline let through."""

    def __post_init__(self) -> None:
        if not self.endpoint:
            self.endpoint = DEFAULT_ENDPOINT[self.protocol]

    def validate(self) -> None:
        if self.timeout <= 0:
            raise ValueError("timeout must be positive")
        if self.max_capture not in CAPTURE_ORDER:
            raise ValueError(f"max_capture must be one of {', '.join(CAPTURE_ORDER)}")
        problem = headers_problem(self.headers, grpc=self.protocol == "grpc")
        if problem:
            raise ValueError(problem)
        assert self.endpoint is not None
        if self.protocol == "http":
            problem = url_problem(self.endpoint)
            if problem:
                raise ValueError(f"endpoint must be an http(s) URL such as {DEFAULT_ENDPOINT['http']}, "
                                 f"got {shown_url(self.endpoint)!r}: {problem}")
        else:
            problem = _grpc_target_problem(self.endpoint)
            if problem:
                raise ValueError(f"endpoint must be host:port or http(s)://host:port, "
                                 f"got {shown_url(self.endpoint)!r}: {problem}")


def _grpc_target_problem(endpoint: str) -> str | None:
    """Why a gRPC ``endpoint`` cannot be dialled as written, or None. gRPC itself takes a path or a
    bad port as a name it fails to resolve on every export (retried for good), reads port 99999 as
    34463, and dials 443 when none is given: each is refused here instead."""
    if endpoint.startswith(("unix:", "unix-abstract:")):
        return None  # a local socket, as gRPC names it: no host or port to check
    scheme, sep, rest = endpoint.rpartition("://")
    if sep and scheme not in ("http", "https"):
        return f"unknown scheme {scheme!r}"
    try:
        parts = urlsplit("//" + rest)
    except ValueError as exc:  # an unclosed IPv6 bracket
        return str(exc)
    if not parts.hostname:
        return "no host"
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username is not None:
        return "a gRPC endpoint has no path, query or user info (the service path is fixed)"
    try:
        port = parts.port
    except ValueError:
        return "the port is not a number from 1 to 65535"
    if port is None and scheme != "https":
        return "no port (the OTLP/gRPC port is 4317)"
    if port == 0:
        return "the port is not a number from 1 to 65535"
    return None


class OtlpExporter:
    """Sends each delivered batch as one OTLP logs export request."""

    def __init__(self, settings: CreateSettings, config: OtlpExporterConfig) -> None:
        config.validate()
        self.id = f"exporter/{settings.id}"
        self.config = config
        self.health = Health()
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self, host: Host) -> None:
        self.health = host.health
        cfg = self.config
        assert cfg.endpoint is not None
        if cfg.protocol == "grpc":
            target = cfg.endpoint
            secure = target.startswith("https://")
            target = target.split("://", 1)[-1].rstrip("/")  # validate() allowed one trailing slash
            options = [("grpc.enable_http_proxy", 0)]  # loopback or a named collector: never a proxy
            compression = grpc.Compression.Gzip if cfg.compression == "gzip" else None
            self._channel = (grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(), options, compression)
                             if secure else grpc.aio.insecure_channel(target, options, compression))
            self._stub = LogsServiceStub(self._channel)
        else:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=cfg.timeout), trust_env=False)

    async def export(self, events: list[Event]) -> int:
        return await self.deliver(events)

    async def deliver(self, events: list[Event]) -> int:
        """One export request for ``events``; raises to retry, ``Permanent`` to drop (see module doc).

        Returns how many of ``events`` the receiver did not take: left out here or rejected by it."""
        records: list[tuple[dict[str, Any], Any]] = []  # each projected record, with its LogRecord
        ceiling = self.config.max_capture
        for event in events:
            try:
                if above(event.get("capture", "metadata"), ceiling):
                    event = _screened(event, ceiling)
                record = to_otlp(event, ceiling)
                # Protobuf refuses some JSON values (a lone surrogate a plug-in left in a string):
                # found here, one event is left out; in the whole request, the batch raised for good.
                records.append((record, log_record(record)))
            except (KeyError, ValueError, TypeError) as exc:  # not a stamped event: never retried
                self.health.incident(self.id, "unprojectable", f"{event.get('id')}: {type(exc).__name__}: {exc}")
        # Counted once the batch is settled: a retried batch would count them again on every attempt.
        left_out = len(events) - len(records)
        if not records:
            self.health.count(self.id, "dropped", left_out)
            return left_out
        results, refusals = await send_in_parts(records, self._export)
        rejected, refused = sum(results), len(refusals)
        why = str(refusals[0]) if refusals else ""
        if refused == len(records):
            raise Permanent(why)  # not even one record alone fits: the queue drops the batch, as for any refusal
        if left_out:
            self.health.count(self.id, "dropped", left_out)
        if rejected:
            self.health.count(self.id, "rejected", rejected)
        if refused:
            self.health.count(self.id, "failed", refused)
            self.health.fail(self.id, "export-refused", f"{refused} of {len(records)} records too large alone: {why}")
            log.error("%s: dropped %d of %d records the receiver refused as too large even alone: %s", self.id,
                      refused, len(records), why)
        return left_out + rejected + refused

    async def _export(self, part: list[tuple[dict[str, Any], Any]]) -> int:
        """Export ``part`` (records, each with its built ``LogRecord``) as one request: how many the
        receiver rejected. ``TooLarge`` when it is over the receiver's size limit (4 MiB by default):
        ``deliver`` sends it in parts (``send_in_parts``). A failure to retry raises: the whole batch
        is retried."""
        records = [record for record, _ in part]
        body = request(records, [built for _, built in part])
        response = await (self._grpc(body) if self.config.protocol == "grpc" else self._http(body))
        rejected = response.partial_success.rejected_log_records if response.HasField("partial_success") else 0
        # A receiver's count is taken within what was sent: past it (or below 0) it would count
        # more events rejected than the batch held, and ``dropped + rejected + exported`` would lie.
        rejected = min(max(rejected, 0), len(records))
        if rejected:
            log.warning("%s: the OTLP receiver rejected %d of %d records: %s", self.id, rejected, len(records),
                        response.partial_success.error_message or "no reason given")
        return rejected

    async def _grpc(self, body: Any) -> ExportLogsServiceResponse:
        metadata = tuple((k.lower(), v) for k, v in self.config.headers.items()) or None
        try:
            return await self._stub.Export(body, timeout=self.config.timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            delay = _retry_info(exc)
            what = f"OTLP/gRPC export failed: {code.name}: {exc.details()}"
            if code in RETRYABLE_GRPC or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None):
                if delay is not None:
                    raise RetryLater(delay, what) from None
                raise ConnectionError(what) from None
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _TOO_LARGE.search(exc.details() or ""):
                raise TooLarge(what) from None
            raise Permanent(what) from None

    async def _http(self, body: Any) -> ExportLogsServiceResponse:
        assert self._session is not None and self.config.endpoint is not None
        data = body.SerializeToString()
        headers = {"Content-Type": "application/x-protobuf", **self.config.headers}
        if self.config.compression == "gzip":
            data = gzip.compress(data)
            headers["Content-Encoding"] = "gzip"
        # Not followed: aiohttp turns a POST answered 301/302/303 into a bodiless GET, whose 2xx
        # would count the batch delivered, and would send ``headers`` to wherever it points.
        async with self._session.post(self.config.endpoint, data=data, headers=headers, allow_redirects=False) as resp:
            payload = await resp.read()
            if 200 <= resp.status < 300:
                out = ExportLogsServiceResponse()
                if payload and resp.content_type == "application/x-protobuf":
                    try:
                        out.ParseFromString(payload)
                    except Exception:  # noqa: BLE001 -- a 2xx is a delivery, whatever its body
                        pass
                return out
            if resp.status == 413:
                raise TooLarge("OTLP/HTTP export got HTTP 413")
            raise http_failure(resp.status, resp.headers.get("Retry-After"), f"OTLP/HTTP export got HTTP {resp.status}{redirected(resp)}",
                               retryable=resp.status in RETRYABLE_HTTP)

    async def shutdown(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def _screened(event: Event, ceiling: str) -> Event:
    """``event`` (above ``ceiling``) with its envelope screened as a hop screens it (AEP-0001 §8.2):
    a subject or id holding content leaves as its digest. Its data goes anyway (``to_otlp``), and
    ``aep.capture`` keeps saying what the event declared."""
    from aep_collector.processors.capture.ceiling import downlevel

    out = downlevel({k: v for k, v in event.items() if k != "data"}, ceiling)
    out["capture"] = event.get("capture", "metadata")
    return out


def _retry_info(exc: grpc.aio.AioRpcError) -> float | None:
    """The server's ``google.rpc.RetryInfo`` delay from the status details, if it sent one."""
    try:
        from google.rpc import error_details_pb2, status_pb2
    except ImportError:  # the protos ship with the OTel exporters; without them, plain backoff
        return None
    for key, value in exc.trailing_metadata() or ():
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except Exception:  # noqa: BLE001 -- unreadable details mean no RetryInfo
            return None
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


FACTORY = Factory(
    kind=Kind.EXPORTER,
    type="otlp",
    config_class=OtlpExporterConfig,
    create=lambda settings, cfg: OtlpExporter(settings, cfg),
    description="Sends events as OTLP LogRecords (AEP-0005 §3) over gRPC or HTTP/protobuf",
)
