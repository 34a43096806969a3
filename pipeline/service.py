"""The service: builds components from a validated config, starts and stops them in order."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from .component import CreateSettings
from .config import ConfigError, ServiceConfig
from .envelope import Stamper
from .host import Health, Host
from .pipeline import Fanout, Pipeline, QueuedExporter
from .sending_queue import SendingQueue, SendingQueueConfig, deliver_of, queue_directory

log = logging.getLogger("aep.service")


def final_capture(cfg: ServiceConfig, spec: Any) -> tuple[Any, Any] | None:
    """The capture processor the service appends when a pipeline does not end with one.

    Every exported byte must honour a capture ceiling, whatever a config (or a plug-in processor
    placed after it) does: a pipeline whose last processor is not ``capture`` gets one, with
    the config of its last listed capture processor, or the defaults (``metadata``) if it has none.
    """
    from .registry import CAPTURE_TYPE

    listed = [cfg.processors[pid] for pid in spec.processors if cfg.processors[pid][0].type == CAPTURE_TYPE]
    if spec.processors and cfg.processors[spec.processors[-1]][0].type == CAPTURE_TYPE:
        return None
    if listed:
        return listed[-1]
    from aep_collector.processors.capture import FACTORY

    return FACTORY, FACTORY.default_config()


STOP_LIMIT = 30.0
"""Seconds one component's ``shutdown`` may take. Above every built-in's own bound (the JSONL
exporter waits up to 10 s for compression, a hook server up to ``reply_timeout`` for its hooks in
flight; bodies still arriving are ended at once), so only a shutdown that hangs (a plug-in's, say)
meets it."""


async def _stop_within(what: str, stop: Callable[[], Any]) -> None:
    """``await stop()`` within ``STOP_LIMIT``: a component whose shutdown hangs or fails is logged
    and left, so SIGTERM still ends the collector and the other components still stop."""
    try:
        await asyncio.wait_for(stop(), STOP_LIMIT)
    except TimeoutError:
        log.error("%s did not shut down within %gs; left as it is", what, STOP_LIMIT)
    except Exception as exc:
        log.error("%s failed to shut down cleanly: %s: %s", what, type(exc).__name__, exc)


def freeze_startup_heap() -> int:
    """Take every object alive now out of the cyclic garbage collector's scans; once per process.

    What start-up builds (modules, aiohttp, grpc, protobuf, compiled capture plans: ~50k tracked
    objects) lives as long as the process, and every full collection walked all of it again
    (~30 ms of CPU on the project's machine, a stall for every hook in flight; ~1 ms frozen; in
    batches of 1,000 events ~4 µs an event of collection time, ~1 µs frozen).
    Reference counting still frees a frozen object that is dropped; only a frozen object caught
    in a reference cycle is never collected. Hence garbage is collected first, and only the first
    start-up heap is frozen: a later call, or one after anything else in the process froze, does
    nothing. Returns how many objects this call froze.
    """
    if gc.get_freeze_count():
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


YOUNG_THRESHOLD = 10_000
"""Allocations (net of frees) of tracked objects between two generation-0 collections, once started."""


def raise_young_threshold() -> None:
    """Let the cyclic collector's young generation grow to ``YOUNG_THRESHOLD`` objects (700 by default).

    Per event the pipeline frees by reference counting nearly all it allocates; what the collector
    saw were objects of the batch in flight, alive while it scanned them, promoted for nothing. At
    batches of 1,000 events that was ~1,000 collections per 100k events, 0.6-0.8 µs an event; none
    at this threshold. On the hook path (bench_memory, 30k hooks): 30-50 collections, 10-13 ms, down
    to none; resident memory the same (59.3 vs 59.4 MB with 1,000 live sessions). The older
    generations keep their thresholds. Set once started, as the start-up heap is frozen.
    """
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


_NEEDS = {"receivers": ("start", "shutdown"), "processors": ("__call__",), "exporters": ("start", "shutdown")}
"""The methods the service and the pipelines call on each kind of component (an exporter also
needs ``export`` or ``deliver``)."""


class Service:
    """Owns every component. Start: exporters, processors, receivers. Stop: the reverse."""

    def __init__(self, config: ServiceConfig, host_name: str | None = None) -> None:
        self.config = config
        self.health = Health(window=config.telemetry.health_window)
        self.host = Host(health=self.health, state_dir=config.state_dir)
        self.stamper = Stamper(config.state_dir, host_name, max_sessions=config.limits.max_sessions)
        self.stamper.epochs.report = lambda detail: self.health.fail("stamper", "state-dir", detail)
        self.exporters: dict[str, Any] = {}
        self.processors: dict[tuple[str, str], Any] = {}
        self.receivers: dict[str, Any] = {}
        self.pipelines: dict[str, Pipeline] = {}
        self.queues: list[QueuedExporter | SendingQueue] = []
        self._stop = asyncio.Event()
        self._built = False
        self.metrics: Any = None

    def build(self) -> None:
        """Create every component (no I/O yet): one exporter instance shared by the pipelines that
        list it, one processor instance per pipeline (processor state is per pipeline), one receiver
        instance feeding every pipeline that lists it."""
        from .control import ControlRouter  # the router is the pipeline's, not any component's

        self.host.control = ControlRouter(self.health, max_decisions=self.config.limits.max_remembered_commands,
                                          max_holds=self.config.limits.max_held_requests)
        cfg = self.config
        used_exporters = {e for p in cfg.pipelines.values() for e in p.exporters}
        for cid, (factory, ccfg) in cfg.exporters.items():
            if cid in used_exporters:
                self.exporters[cid] = self._made("exporters", cid, factory.create, CreateSettings(id=cid), ccfg)
        queues: dict[str, QueuedExporter | SendingQueue] = {}
        for name, spec in cfg.pipelines.items():
            procs, pids = [], []
            for pid in spec.processors:
                factory, pcfg = cfg.processors[pid]
                proc = self._made("processors", pid, factory.create, CreateSettings(id=pid, pipeline=name), pcfg)
                self.processors[(name, pid)] = proc
                procs.append(proc)
                pids.append(f"processor/{pid}")
            final = final_capture(cfg, spec)
            if final is not None:  # privacy is structural: nothing leaves a pipeline ungated
                factory, pcfg = final
                proc = factory.create(CreateSettings(id="capture/final", pipeline=name), pcfg)
                self.processors[(name, "capture/final")] = proc
                procs.append(proc)
                pids.append("processor/capture/final")
            durable, queued = [], []
            for eid in spec.exporters:
                exp = self.exporters[eid]
                if getattr(exp, "durable", False) and hasattr(exp, "export_now"):
                    durable.append((f"exporter/{eid}", exp))
                    if eid in cfg.sending_queues:
                        log.warning("exporters.%s.sending_queue: ignored, %s writes durably inline", eid, eid)
                else:
                    q = queues.get(eid)
                    if q is None:
                        q = queues[eid] = self._queue(eid, exp)
                    queued.append(q)
            self.pipelines[name] = Pipeline(name, procs, self.stamper, self.health, durable, queued, pids)
        self.queues = list(queues.values())
        for cid, (factory, rcfg) in cfg.receivers.items():
            feeds = [self.pipelines[n] for n, spec in cfg.pipelines.items() if cid in spec.receivers]
            if not feeds:
                continue
            self.receivers[cid] = self._made("receivers", cid, factory.create, CreateSettings(id=cid), rcfg, Fanout(feeds))
        self.host.control.bind_pipelines(self.pipelines, cfg.pipelines)
        self._built = True

    def _made(self, section: str, cid: str, create: Callable[..., Any], *args: Any) -> Any:
        """What ``create(*args)`` made for ``section.cid``; a ``ConfigError`` naming the component if it
        raised or made something the pipeline cannot drive (a plug-in's bug is reported, not a
        traceback, and not an AttributeError later, far from its cause)."""
        try:
            made = create(*args)
        except Exception as exc:
            raise ConfigError(self.config.file, f"{section}.{cid}",
                              f"cannot be created: {type(exc).__name__}: {exc}") from exc
        needs = _NEEDS[section]
        missing = [name for name in needs if not callable(getattr(made, name, None))]
        if section == "exporters" and not any(callable(getattr(made, n, None)) for n in ("export", "deliver")):
            missing.append("export")
        if missing:
            raise ConfigError(self.config.file, f"{section}.{cid}",
                              f"its create function returned {type(made).__name__}, which has no "
                              f"{', '.join(missing)}")
        return made

    def _queue(self, eid: str, exporter: Any) -> QueuedExporter | SendingQueue:
        """The persistent sending queue in front of ``exporter`` (the memory one if it is turned off)."""
        cid = f"exporter/{eid}"
        qcfg = self.config.sending_queues.get(eid) or SendingQueueConfig()
        # An exporter with nothing to lose in a crash (in-process fan-out, or switched off) says
        # ``persistent_queue = False``: it keeps the memory queue, no segment files for it.
        if not qcfg.enabled or getattr(exporter, "persistent_queue", True) is False:
            return QueuedExporter(cid, exporter, self.health)
        return SendingQueue(cid, queue_directory(self.config.state_dir, cid, qcfg), qcfg, deliver_of(exporter),
                            self.health)

    async def start(self) -> None:
        self.stamper.epochs.check()  # an unwritable state directory stops the start, named
        if not self._built:
            self.build()
        try:
            for cid, exp in self.exporters.items():
                await self._starting(f"exporters.{cid}", exp.start(self.host))
            for q in self.queues:
                q.start()
            for (_, pid), proc in self.processors.items():
                start = getattr(proc, "start", None)
                if start is not None:
                    await self._starting(f"processors.{pid}", start(self.host))
            for cid, rec in self.receivers.items():
                await self._starting(f"receivers.{cid}", rec.start(self.host))
            if self.config.telemetry.metrics_endpoint:
                from .metrics import MetricsServer

                self.metrics = MetricsServer(self, self.config.telemetry.metrics_endpoint)
                await self._starting("service.telemetry.metrics", self.metrics.start())
        except BaseException:
            await self.shutdown()
            raise
        log.info("aep-collector started: %d receivers, %d pipelines, %d exporters",
                 len(self.receivers), len(self.pipelines), len(self.exporters))

    async def _starting(self, where: str, start: Awaitable[Any]) -> None:
        """``await start``; an ``OSError`` (a port taken, say) becomes a ``ConfigError`` naming the
        component, which a bare "address already in use" among a dozen listeners did not."""
        try:
            await start
        except OSError as exc:
            raise ConfigError(self.config.file, where, f"cannot start: {exc}") from exc

    async def shutdown(self, grace: float = 5.0) -> None:
        """Free held hooks, stop receivers (no new input, in-flight requests finish), flush exporters."""
        if self.metrics is not None:
            await self.metrics.stop()
            self.metrics = None
        if self.host.control is not None:
            await self.host.control.shutdown()  # a held hook must not delay shutdown for its timeout
        for cid, rec in reversed(list(self.receivers.items())):
            await _stop_within(f"receiver {cid}", rec.shutdown)
        for (_, pid), proc in self.processors.items():
            stop = getattr(proc, "shutdown", None)
            if stop is not None:
                await _stop_within(f"processor {pid}", stop)
        for q in self.queues:
            await q.drain(grace)
        for cid, exp in reversed(list(self.exporters.items())):
            await _stop_within(f"exporter {cid}", exp.shutdown)

    def request_stop(self) -> None:
        self._stop.set()

    async def run_until_signalled(self) -> None:
        """Start, wait for SIGINT/SIGTERM/SIGHUP, drain and stop: the life of a collector process."""
        loop = asyncio.get_running_loop()
        # SIGHUP too: a closed terminal otherwise killed the collector where it stood, its held
        # hooks reset instead of answered neutrally and its queues not flushed. It does not reload.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        # Here, not in start(): a process that starts services of its own (tests, embedding) keeps
        # its heap collectable; the collector process freezes what its start-up built and lets the
        # young generation grow (both process-wide).
        frozen = freeze_startup_heap()
        raise_young_threshold()
        if frozen:
            log.debug("start-up heap frozen: %d objects out of the cyclic collector's scans", frozen)
        try:
            await self._stop.wait()
        finally:
            log.info("aep-collector stopping: draining in-flight events")
            await self.shutdown()
            log.info("aep-collector stopped")
