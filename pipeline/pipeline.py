"""A pipeline: its processors in order, the shared stamper, then its exporters (fan-out)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from types import FunctionType
from typing import Any

from .envelope import Stamper, StampError
from .host import Health
from .model import Batch, Event, Signal
from .sending_queue import left_out
from .wire import dumps_line

log = logging.getLogger("aep.pipeline")

CHUNK = 128
"""The most items of a batch the processors take at once (``Pipeline.consume``)."""
SLICE = 1024
"""The most events ``Pipeline.consume_acked`` stamps and delivers between two yields to the loop."""


class NotDurable(Exception):
    """Some events of a batch are not in the durable record (``Pipeline.consume_acked``).

    ``sessions`` holds the ``session`` of every event not written; ``failed`` counts them.
    ``lanes`` (``Fanout.consume_each_acked``) are the events of the other sessions, per pipeline.
    """

    def __init__(self, failed: int, total: int, sessions: set[Any], events: list[Event] | None = None,
                 lanes: list[tuple[Pipeline, list[Event]]] | None = None) -> None:
        super().__init__(f"{failed} of {total} events not written to the durable record")
        self.failed, self.total, self.sessions = failed, total, sessions
        self.events = events or []
        """Every event stamped for the batch, those of ``sessions`` included."""
        self.lanes = lanes or []


class QueuedExporter:
    """The Collector's sending queue: a bounded FIFO and one worker in front of an exporter.

    A slow or broken exporter never holds up the hook reply or the other exporters; order is
    kept; overflow drops the oldest batch and is counted and reported, never silent.
    """

    def __init__(self, cid: str, exporter: Any, health: Health, max_batches: int = 10_000) -> None:
        self.id, self.exporter, self.health = cid, exporter, health
        self.queue: asyncio.Queue[list[Event] | None] = asyncio.Queue()
        self.max_batches = max_batches
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"queue:{self.id}")

    def put(self, events: list[Event]) -> None:
        if self.queue.qsize() >= self.max_batches:
            dropped = self.queue.get_nowait()
            n = len(dropped or [])
            self.health.count(self.id, "dropped", n)
            self.health.incident(self.id, "queue-full", f"sending queue over {self.max_batches} batches; oldest dropped")
        self.queue.put_nowait(events)

    async def _run(self) -> None:
        while True:
            events = await self.queue.get()
            if events is None:
                return
            try:
                result = await self.exporter.export(events)
                # What the exporter left out it counted itself (``sending_queue.left_out``).
                taken = len(events) - left_out(result, len(events))
                if taken:
                    self.health.count(self.id, "exported", taken)
            except Exception as exc:  # reported, not fatal: the next batch is tried
                self.health.count(self.id, "failed", len(events))
                self.health.incident(self.id, "export-failed", f"{type(exc).__name__}: {exc}")

    async def drain(self, timeout: float) -> None:
        """Let the worker finish what is queued, then stop it."""
        if self.task is None:
            return
        self.queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except TimeoutError:
            left = self.queue.qsize()
            self.health.fail(self.id, "shutdown-timeout", f"{left} batches undelivered at shutdown")
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


class Pipeline:
    """Consumes batches: processors, then stamping, then the exporters.

    Durable exporters (``durable = True``, e.g. JSONL) are called inline, in order, before the
    call returns: an accepted event is on disk before anything else sees it. Every other exporter
    sits behind a queue with ``put``: the persistent ``aep_collector.pipeline.sending_queue.SendingQueue`` by
    default, this module's memory ``QueuedExporter`` when that is turned off.
    """

    def __init__(self, name: str, processors: Sequence[Any], stamper: Stamper, health: Health,
                 durable: Sequence[tuple[str, Any]], queued: Sequence[Any],
                 processor_ids: Sequence[str] | None = None) -> None:
        self.name = name
        self.processors = list(processors)
        # What ``/healthz`` calls a processor that raised: its config id (the service passes them),
        # else its own ``component`` or class name. The caller (a receiver) reports the batch's
        # loss under its own name; this says which step lost it.
        self.processor_ids = list(processor_ids) if processor_ids is not None else [
            str(getattr(p, "component", None) or f"processor/{type(p).__name__}") for p in self.processors]
        self.stamper = stamper
        self.health = health
        self.durable = list(durable)
        self.queued = list(queued)
        self.component = f"pipeline/{name}"
        # A consumer with ``takes_lines = True`` accepts the events' lines (``wire.dumps_line`` of
        # each) beside them. With two or more (the JSONL record and a sending queue), the events
        # are serialized once here, after the capture ceiling and stamping, and every consumer
        # gets the same bytes instead of serializing the same event again.
        takers = [e for _, e in self.durable] + self.queued
        self._share_lines = sum(getattr(c, "takes_lines", False) is True for c in takers) >= 2
        # Per batch, each processor is called through its class's own ``__call__``, bound once here:
        # calling the instance goes through the type's call slot (an argument tuple and a nested
        # interpreter call per processor, per batch: a hook's batch is one signal). Same calls, same
        # order; the list of processors is fixed once the pipeline is built.
        self._steps: list[Callable[[Batch], Batch]] = [_bound_call(p) for p in self.processors]

    async def consume(self, batch: Batch) -> list[Event]:
        events: list[Event] = []
        if len(batch) <= CHUNK:
            self._stamp_into(self._process(batch), events)
        else:
            # A big batch (an OTLP request of 1,000 records) goes through the processors CHUNK
            # items at a time, so each finds the chunk's objects still in the core's cache.
            # Stamping and delivery come after every chunk, as for a small batch: a processor that
            # raises part-way consumes no seq and delivers nothing (bench/NOTES.md: the OTLP path).
            drafts: Batch = []
            for at in range(0, len(batch), CHUNK):
                drafts.extend(self._process(batch[at:at + CHUNK]))
            self._stamp_into(drafts, events)
        if events:
            self.deliver(events)
        return events

    async def consume_acked(self, batch: Batch) -> list[Event]:
        """``consume`` for a sender that resends what it is not acknowledged (an OTLP exporter).

        The loop is not held for a whole batch: the processors take it CHUNK items at a time with a
        yield between chunks, then it is stamped and delivered SLICE events at a time with a yield
        between slices. No yield falls between a slice's stamping and its delivery, so the durable
        record and the queues still get every session's events in seq order. Processing is done for
        the whole batch before anything is stamped, as in ``consume``: a processor that raises
        part-way has delivered nothing, so the sender's retry duplicates nothing.

        Raises ``NotDurable`` when the durable record did not take every event. The events it did
        not take go to no other exporter (a durable record first, then delivery): the sender is
        told to retry and they come again. Hooks use ``consume``, which fails open instead.
        """
        drafts: Batch = []
        for at in range(0, len(batch), CHUNK):
            if at:
                await asyncio.sleep(0)
            drafts.extend(self._process(batch[at:at + CHUNK]))
        events: list[Event] = []
        lost: set[Any] = set()
        failed = 0
        for at in range(0, len(drafts), SLICE):
            if at:
                await asyncio.sleep(0)
            stamped: list[Event] = []
            self._stamp_into(drafts[at:at + SLICE], stamped)
            if stamped:
                failed += self.deliver(stamped, lost=lost)
                events.extend(stamped)
        if failed:
            raise NotDurable(failed, len(events), lost, events)
        return events

    def _process(self, batch: Batch) -> Batch:
        at = 0
        try:
            for step in self._steps:
                batch = step(batch)
                at += 1
        except Exception as exc:
            cid = self.processor_ids[at]
            self.health.count(cid, "failed")
            self.health.incident(cid, "processor-failed", f"{type(exc).__name__}: {str(exc)[:300]}")
            raise
        return batch

    def _stamp_into(self, batch: Batch, events: list[Event]) -> None:
        """Stamp each draft of ``batch`` onto ``events``; what cannot be stamped is counted."""
        for item in batch:
            if isinstance(item, Signal):
                # A receiver fed a pipeline with no mapping for it: counted and shown, not hidden.
                self.health.count(self.component, "dropped")
                self.health.incident(self.component, "unmapped-signal",
                                 f"a {item.agent} signal reached the end of the pipeline unmapped; "
                                 "add the mapping processor")
                continue
            try:
                events.append(self.stamper.stamp(item))
            except StampError as exc:
                self.health.count(self.component, "rejected")
                self.health.incident(self.component, "invalid-draft", str(exc))

    def deliver(self, events: list[Event], redelivery: bool = False, lost: set[Any] | None = None) -> int:
        """Hand stamped events to the exporters; a redelivery skips the durable record it already has.

        With ``lost`` (``consume_acked``: a sender that resends what is not acknowledged), what the
        durable record did not take is learnt (``export_now`` returns the events it did not write,
        a raise loses them all): their sessions are added to ``lost`` and none of those sessions'
        events is queued, since they come again; returns how many events that held back. Without
        it (hooks), every event is queued whatever the durable record did: nobody would resend.
        """
        lines = None
        if self._share_lines:
            try:
                lines = [dumps_line(e) for e in events]
            except (TypeError, ValueError):  # not JSON (a plug-in's value): each consumer fails as before
                lines = None
        missing: set[Any] | None = set() if lost is not None else None  # no set built on a hook's path
        if not redelivery:
            health = self.health
            for cid, exporter in self.durable:
                try:
                    if lines is not None and getattr(exporter, "takes_lines", False) is True:
                        unwritten = exporter.export_now(events, lines)
                    else:
                        unwritten = exporter.export_now(events)
                except Exception as exc:
                    health.count(cid, "failed", len(events))
                    health.incident(cid, "export-failed", f"{type(exc).__name__}: {exc}")
                    if missing is not None:
                        missing.update(e.get("session") for e in events)
                    continue
                if missing is not None and unwritten:
                    missing.update(e.get("session") for e in unwritten)
                # What it did not write it counted itself (``dropped``); on a hook's path too.
                written = len(events) - left_out(unwritten, len(events))
                if written:
                    health.count(cid, "exported", written)
        queued, queued_lines = events, lines
        if missing and lost is not None:
            lost |= missing
            keep = [i for i, e in enumerate(events) if e.get("session") not in missing]
            queued = [events[i] for i in keep]
            queued_lines = None if lines is None else [lines[i] for i in keep]
        if queued:
            for q in self.queued:
                if queued_lines is not None and getattr(q, "takes_lines", False) is True:
                    q.put(queued, queued_lines)
                else:
                    q.put(queued)
        return len(events) - len(queued)


def _bound_call(processor: Any) -> Callable[[Batch], Batch]:
    """``processor``'s ``__call__`` bound to it when its class defines one in Python, else itself
    (a function, a partial, a builtin: called as it is)."""
    call = next((c.__dict__["__call__"] for c in type(processor).__mro__ if "__call__" in c.__dict__), None)
    if isinstance(call, FunctionType):
        return call.__get__(processor)  # what ``processor.__call__`` gives
    return processor


class Fanout:
    """The consumer a receiver is handed when it feeds several pipelines."""

    def __init__(self, pipelines: Sequence[Pipeline]) -> None:
        self.pipelines = list(pipelines)

    async def consume(self, batch: Batch) -> list[Event]:
        return [e for _, events in await self.consume_each(batch) for e in events]

    async def consume_each(self, batch: Batch) -> list[tuple[Pipeline, list[Event]]]:
        """Like ``consume``, keeping which pipeline stamped which events (held loops need it)."""
        out = []
        for p in self.pipelines:
            # Each pipeline maps its own copy: processors may rewrite drafts in place.
            out.append((p, await p.consume([dict(i) if isinstance(i, dict) else i for i in batch])))
        return out

    async def consume_each_acked(self, batch: Batch) -> list[tuple[Pipeline, list[Event]]]:
        """``consume_each`` for a sender that resends what it is not acknowledged (a JetStream
        consumer): ``Pipeline.consume_acked`` on every pipeline, then ``NotDurable`` naming the
        sessions some durable record did not take, with the lanes of the other sessions' events."""
        out: list[tuple[Pipeline, list[Event]]] = []
        failed, lost = 0, set[Any]()
        for p in self.pipelines:
            try:
                out.append((p, await p.consume_acked([dict(i) if isinstance(i, dict) else i for i in batch])))
            except NotDurable as exc:
                failed, lost = failed + exc.failed, lost | exc.sessions
                out.append((p, exc.events))
        if failed:
            lanes = [(p, [e for e in events if e.get("session") not in lost]) for p, events in out]
            raise NotDurable(failed, sum(len(events) for _, events in out), lost, lanes=lanes)
        return out

    async def consume_acked(self, batch: Batch) -> list[Event]:
        """``Pipeline.consume_acked`` on every pipeline; ``NotDurable`` once all had the batch,
        naming the sessions some pipeline's durable record did not take."""
        out: list[Event] = []
        failed, total, lost = 0, 0, set[Any]()
        for p in self.pipelines:
            try:
                out.extend(await p.consume_acked([dict(i) if isinstance(i, dict) else i for i in batch]))
            except NotDurable as exc:
                failed, total, lost = failed + exc.failed, total + exc.total, lost | exc.sessions
        if failed:
            raise NotDurable(failed, total + len(out), lost)
        return out
