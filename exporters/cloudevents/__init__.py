"""The ``cloudevents`` exporter: AEP events as CloudEvents 1.0 over HTTP (AEP-0005 §2).

``mode: batched`` POSTs each delivered batch as one ``application/cloudevents-batch+json`` array;
``mode: structured`` POSTs one ``application/cloudevents+json`` event per request. It sits behind the
persistent sending queue: 2xx delivers; 408, 429 and 5xx are retried (``Retry-After`` honoured);
any other answer drops the batch (counted, logged); in structured mode only the events refused. A
redirect is not followed: that answer too. A batch answered 413 is split until each part fits. A receiver dedupes a retried copy on
``(source, id)``. An event whose ``capture`` is above ``max_capture`` is down-levelled to it first
(AEP-0001 §8.2, the same hop rule a relay applies), so nothing above the ceiling leaves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
from aep_collector.pipeline.component import CreateSettings, Factory, Kind
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.model import Event
from aep_collector.pipeline.sending_queue import (
    Permanent,
    TooLarge,
    headers_problem,
    http_failure,
    redirected,
    send_in_parts,
    shown_url,
    url_problem,
)
from aep_collector.pipeline.wire import dumps_bytes

from .projection import to_cloudevent

__all__ = ["FACTORY", "CloudEventsConfig", "CloudEventsExporter"]

log = logging.getLogger("aep.exporter.cloudevents")

CAPTURE_ORDER = ("none", "metadata", "redacted", "full")
STRUCTURED = "application/cloudevents+json; charset=utf-8"
BATCH = "application/cloudevents-batch+json; charset=utf-8"


@dataclass
class CloudEventsConfig:
    """Config of the ``cloudevents`` exporter."""

    endpoint: str = "http://127.0.0.1:8080/"
    """The URL events are POSTed to."""
    mode: Literal["batched", "structured"] = "batched"
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 10.0
    max_capture: Literal["none", "metadata", "redacted", "full"] = "metadata"
    """The exporter's capture ceiling: an event declaring more is down-levelled to it."""

    def validate(self) -> None:
        problem = url_problem(self.endpoint)
        if problem:
            raise ValueError(f"endpoint must be an http(s) URL, got {shown_url(self.endpoint)!r}: {problem}")
        if self.timeout <= 0:
            raise ValueError("timeout must be positive")
        problem = headers_problem(self.headers)
        if problem:
            raise ValueError(problem)
        if self.max_capture not in CAPTURE_ORDER:
            raise ValueError(f"max_capture must be one of {', '.join(CAPTURE_ORDER)}")


class EventRefused(Permanent):
    """The receiver refused what was POSTed for its content (400, 422): another event may pass."""


def capped(event: Event, ceiling: str) -> Event:
    """``event`` as it may leave under ``ceiling``: down-levelled when it declares more."""
    declared = event.get("capture", "metadata")
    if declared in CAPTURE_ORDER and CAPTURE_ORDER.index(declared) <= CAPTURE_ORDER.index(ceiling):
        return event
    # The AEP-0001 §8.2 hop algorithm, shared with the capture processor (a pure function).
    from aep_collector.processors.capture.ceiling import downlevel

    return downlevel(event, ceiling)


class CloudEventsExporter:
    def __init__(self, settings: CreateSettings, config: CloudEventsConfig) -> None:
        config.validate()
        self.id = f"exporter/{settings.id}"
        self.config = config
        self.health = Health()
        self._session: aiohttp.ClientSession | None = None

    async def start(self, host: Host) -> None:
        self.health = host.health
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.timeout),
                                              trust_env=False)

    async def export(self, events: list[Event]) -> int:
        return await self.deliver(events)

    async def deliver(self, events: list[Event]) -> int:
        """POST ``events``; how many were left out as not CloudEvents-projectable (counted ``dropped``)."""
        ces = []
        for event in events:
            try:
                ces.append(dumps_bytes(to_cloudevent(capped(event, self.config.max_capture))))
            except (KeyError, ValueError, TypeError) as exc:
                # Not a stamped event (a damaged queue line): retrying cannot mend it, and raising
                # would have the queue retry the whole batch for good, holding up every later one.
                ident = event.get("id") if isinstance(event, dict) else None
                self.health.incident(self.id, "unprojectable", f"{ident}: {type(exc).__name__}: {exc}")
        left_out = len(events) - len(ces)
        refused = 0
        if ces:
            refusals = await (self._post_batches(ces) if self.config.mode == "batched" else self._post_each(ces))
            refused = self._refused(refusals, len(ces))
        # Counted once the batch is settled: a retried batch would count them again on every attempt.
        if left_out:
            self.health.count(self.id, "dropped", left_out)
        return left_out + refused

    async def _post_each(self, bodies: list[bytes]) -> list[Permanent]:
        """POST each of ``bodies`` on its own; the refusals of those the receiver refused for good.

        A failure to retry raises, and the whole batch is retried: the receiver dedupes the copies.
        One event refused for its content (400, 413, 422) is that event's loss, not its batch's: the
        rest are still POSTed. A refusal of the request itself (401, 403, 404, a redirect) would
        refuse every event alike: it raises at once, and the queue drops the batch as before."""
        refusals: list[Permanent] = []
        for body in bodies:
            try:
                await self._post(body, STRUCTURED)
            except (EventRefused, TooLarge) as exc:
                refusals.append(exc)
        return refusals

    async def _post_batches(self, bodies: list[bytes]) -> list[Permanent]:
        """POST ``bodies`` as one batch, in parts if it is refused for its size (413); the refusals of
        events too large alone. Any other refusal raises (the whole batch's), as does a failure to retry."""
        _, refusals = await send_in_parts(bodies, lambda part: self._post(b"[" + b",".join(part) + b"]", BATCH))
        return list(refusals)

    def _refused(self, refusals: list[Permanent], total: int) -> int:
        """Count and show ``refusals`` of ``total`` events; all of them go to the queue as one refusal."""
        if not refusals:
            return 0
        if len(refusals) == total:
            raise refusals[0]
        self.health.count(self.id, "failed", len(refusals))
        self.health.fail(self.id, "export-refused", f"{len(refusals)} of {total} events refused: {refusals[0]}")
        log.error("%s: dropped %d of %d events the receiver refused for good: %s", self.id, len(refusals),
                  total, refusals[0])
        return len(refusals)

    async def _post(self, body: bytes, content_type: str) -> None:
        assert self._session is not None
        headers = {"Content-Type": content_type, **self.config.headers}
        # Not followed: aiohttp turns a POST answered 301/302/303 into a bodiless GET, whose 2xx
        # would count the batch delivered, and would send ``headers`` to wherever it points.
        async with self._session.post(self.config.endpoint, data=body, headers=headers, allow_redirects=False) as resp:
            await resp.read()
            if 200 <= resp.status < 300:
                return
            if resp.status == 413:
                raise TooLarge("CloudEvents POST got HTTP 413")
            if resp.status in (400, 422):
                raise EventRefused(f"CloudEvents POST got HTTP {resp.status}")
            raise http_failure(resp.status, resp.headers.get("Retry-After"),
                               f"CloudEvents POST got HTTP {resp.status}{redirected(resp)}",
                               retryable=resp.status in (408, 429) or resp.status >= 500)

    async def shutdown(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


FACTORY = Factory(
    kind=Kind.EXPORTER,
    type="cloudevents",
    config_class=CloudEventsConfig,
    create=lambda settings, cfg: CloudEventsExporter(settings, cfg),
    description="POSTs events as CloudEvents 1.0 JSON (AEP-0005 §2), batched or structured",
)
