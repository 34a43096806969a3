"""The fail-open delivery a hook waits on: events when the pipeline answers in time, the neutral
path (None) when it is slow or fails, and a slow batch still finishes behind the reply."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aep_collector.pipeline.host import Health
from aep_collector.receivers.hook_http import FailOpenDelivery

COMPONENT = "receiver/test"


class Consumer:
    """A real consumer: waits ``turns`` loop turns (or until ``release`` is set), then returns one event per item."""

    def __init__(self, turns: int = 0, release: asyncio.Event | None = None, fail: bool = False,
                 cancel: bool = False) -> None:
        self.turns, self.release, self.fail, self.cancel = turns, release, fail, cancel
        self.consumed: list[Any] = []

    async def consume(self, batch: list[Any]) -> list[dict[str, Any]]:
        for _ in range(self.turns):
            await asyncio.sleep(0)
        if self.release is not None:
            await self.release.wait()
        if self.fail:
            raise RuntimeError("exporter down")
        if self.cancel:  # e.g. a plug-in stage whose own await was cancelled
            raise asyncio.CancelledError
        self.consumed += batch
        return [{"type": "x", "n": item} for item in batch]


def problems(health: Health) -> dict[str, str]:
    return health.snapshot().get("problems", {}).get(COMPONENT, {})


async def test_a_pipeline_that_never_suspends_answers_with_its_events() -> None:
    health, consumer = Health(), Consumer()
    deliver = FailOpenDelivery(COMPONENT, consumer, health, timeout=5.0)
    assert await deliver([1, 2]) == [{"type": "x", "n": 1}, {"type": "x", "n": 2}]
    assert consumer.consumed == [1, 2] and problems(health) == {}
    assert health.counters[(COMPONENT, "accepted")] == 2


async def test_a_pipeline_that_suspends_but_finishes_in_time_answers_with_its_events() -> None:
    health = Health()
    deliver = FailOpenDelivery(COMPONENT, Consumer(turns=5), health, timeout=5.0)
    assert await deliver([7]) == [{"type": "x", "n": 7}]
    assert problems(health) == {}


async def test_a_slow_pipeline_gets_the_neutral_path_and_its_batch_still_finishes() -> None:
    health, release = Health(), asyncio.Event()
    consumer = Consumer(release=release)
    deliver = FailOpenDelivery(COMPONENT, consumer, health, timeout=0.05)
    assert await deliver([3]) is None  # release is never set before the deadline
    assert "pipeline-slow" in problems(health) and consumer.consumed == []
    release.set()
    await deliver.drain(5.0)
    assert consumer.consumed == [3] and not deliver.pending  # slow is not lost


async def test_a_failing_pipeline_gets_the_neutral_path_and_is_reported() -> None:
    for turns in (0, 3):  # failing at once, or after suspending
        health = Health()
        deliver = FailOpenDelivery(COMPONENT, Consumer(turns=turns, fail=True), health, timeout=5.0)
        assert await deliver([1]) is None
        assert "RuntimeError: exporter down" in problems(health)["pipeline-error"]
        await deliver.drain(1.0)


async def test_a_pipeline_cancelled_under_the_hook_gets_the_neutral_path_and_is_reported() -> None:
    # The hook's own task is not being cancelled: it must still get an answer (None: neutral).
    for turns in (0, 3):  # cancelled in its first step (the sleep(0) fast path), or later
        health = Health()
        deliver = FailOpenDelivery(COMPONENT, Consumer(turns=turns, cancel=True), health, timeout=5.0)
        assert await deliver([1]) is None
        assert "pipeline-cancelled" in problems(health)
        await deliver.drain(1.0)


async def test_a_hook_cancelled_while_waiting_leaves_its_batch_running() -> None:
    for turns in (1, 3):  # cancelled on the fast path's loop turn, or while waiting on the deadline
        health, release = Health(), asyncio.Event()
        consumer = Consumer(release=release)
        deliver = FailOpenDelivery(COMPONENT, consumer, health, timeout=5.0)
        hook = asyncio.ensure_future(deliver([4]))
        for _ in range(turns):
            await asyncio.sleep(0)
        hook.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hook
        assert hook.cancelled()  # the hook's own cancellation is not swallowed
        release.set()
        await deliver.drain(5.0)
        assert consumer.consumed == [4] and problems(health) == {}


async def test_a_suspended_batch_cancelled_from_outside_is_cancelled_inside_and_the_hook_answers() -> None:
    # The first step runs in the hook's task; the rest in a task of its own that carries a
    # cancellation (shutdown, say) into the pipeline's coroutine, whose cleanup runs.
    cleaned: list[str] = []

    class Holding(Consumer):
        async def consume(self, batch: list[Any]) -> list[dict[str, Any]]:
            try:
                await asyncio.Event().wait()  # never set
            finally:
                cleaned.append("cleanup ran")
            return []

    health = Health()
    deliver = FailOpenDelivery(COMPONENT, Holding(), health, timeout=5.0)
    hook = asyncio.ensure_future(deliver([5]))
    await asyncio.sleep(0)
    (batch,) = deliver.pending
    batch.cancel()
    assert await hook is None
    assert cleaned == ["cleanup ran"] and batch.cancelled()
    assert "pipeline-cancelled" in problems(health)


async def test_a_pipeline_that_suspends_gets_what_it_awaited() -> None:
    # Values a suspended pipeline awaits reach it through the task that finishes it.
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()

    class Awaiting(Consumer):
        async def consume(self, batch: list[Any]) -> list[dict[str, Any]]:
            n = await answer
            return [{"type": "x", "n": n + item} for item in batch]

    deliver = FailOpenDelivery(COMPONENT, Awaiting(), Health(), timeout=5.0)
    hook = asyncio.ensure_future(deliver([1, 2]))
    await asyncio.sleep(0)
    answer.set_result(40)
    assert await hook == [{"type": "x", "n": 41}, {"type": "x", "n": 42}]
    assert not deliver.pending
