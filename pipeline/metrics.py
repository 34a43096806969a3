"""The collector's own metrics, in Prometheus text format, on ``service.telemetry.metrics.endpoint``.

``aep_collector_items_total{component, outcome}`` counts what each component accepted,
exported, dropped, rejected or refused; gauges show health problems, relay liveness, held
requests, tracked sessions and each persistent sending queue's bytes and events. Loopback by default, like every other listener.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from .config import parse_endpoint

log = logging.getLogger("aep.metrics")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(service: Any) -> str:
    """The metrics page for a running ``Service``."""
    health = service.health
    lines = ["# HELP aep_collector_items_total Items handled per component and outcome.",
             "# TYPE aep_collector_items_total counter"]
    health.refresh()  # incidents past their window and conditions whose cause is gone are not counted
    with health._lock:
        counters = sorted(health.counters.items())
        problems = {c: len(p) for c, p in health.problems.items()}
        request_errors = sorted(health.request_errors.items())
    for (component, outcome), n in counters:
        lines.append(f'aep_collector_items_total{{component="{_label(component)}",outcome="{_label(outcome)}"}} {n}')
    lines += ["# HELP aep_collector_request_errors_total Requests refused or lost per receiver and cause "
              "(malformed input, slow bodies, client disconnects).",
              "# TYPE aep_collector_request_errors_total counter"]
    for (component, cause), n in request_errors:
        lines.append(f'aep_collector_request_errors_total{{receiver="{_label(component)}",cause="{_label(cause)}"}} {n}')
    lines += ["# HELP aep_collector_problems Open health problems per component.",
              "# TYPE aep_collector_problems gauge"]
    for component, n in sorted(problems.items()):
        lines.append(f'aep_collector_problems{{component="{_label(component)}"}} {n}')
    lines += ["# HELP aep_collector_up 1 while every component is healthy.", "# TYPE aep_collector_up gauge",
              f"aep_collector_up {0 if problems else 1}",
              "# HELP aep_collector_relay_connected 1 while a hello-complete relay connection is live.",
              "# TYPE aep_collector_relay_connected gauge",
              f"aep_collector_relay_connected {1 if health.flag_any('relay') else 0}"]
    control = service.host.control
    if control is not None:
        holds = len({id(h) for h in control.holds.values()})
        lines += ["# HELP aep_collector_held_requests Attention requests held open for an operator.",
                  "# TYPE aep_collector_held_requests gauge", f"aep_collector_held_requests {holds}"]
    queues = [q for q in getattr(service, "queues", []) if hasattr(q, "pending_bytes")]
    if queues:
        lines += ["# HELP aep_collector_queue_bytes Bytes of the persistent sending queue's segments on disk.",
                  "# TYPE aep_collector_queue_bytes gauge"]
        lines += [f'aep_collector_queue_bytes{{component="{_label(q.id)}"}} {q.pending_bytes}' for q in queues]
        lines += ["# HELP aep_collector_queue_events Events waiting in the persistent sending queue.",
                  "# TYPE aep_collector_queue_events gauge"]
        lines += [f'aep_collector_queue_events{{component="{_label(q.id)}"}} {q.pending_events}' for q in queues]
        lines += ["# HELP aep_collector_queue_max_bytes The sending queue's bound on bytes on disk.",
                  "# TYPE aep_collector_queue_max_bytes gauge"]
        lines += [f'aep_collector_queue_max_bytes{{component="{_label(q.id)}"}} {q.config.max_bytes}'
                  for q in queues]
    lines += ["# HELP aep_collector_sessions Sessions whose seq counter is in memory.",
              "# TYPE aep_collector_sessions gauge", f"aep_collector_sessions {service.stamper.sessions}"]
    return "\n".join(lines) + "\n"


class MetricsServer:
    """A tiny aiohttp server for ``GET /metrics``."""

    def __init__(self, service: Any, endpoint: str) -> None:
        self.service, self.endpoint = service, endpoint
        self.runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        host, port = parse_endpoint(self.endpoint, path="service.telemetry.metrics.endpoint")
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port
        log.info("metrics listening on %s:%s", host, self.port)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=render(self.service), content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
