"""The per-agent outbox: events waiting for a hello-complete socket, in order, bounded."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from aep_collector.pipeline.model import Event
from aep_collector.pipeline.wire import dumps

Overflow = Literal["drop_oldest", "drop_newest"]

# AEP-0003 §8.4: under backpressure only debug/info may be dropped silently, so they go first.
LOW_SEVERITIES = frozenset({"debug", "info"})


@dataclass(frozen=True, slots=True)
class Pending:
    """One event as it will go on the wire: the frame text is fixed once, so a resend is byte-identical."""

    text: str
    type: str
    session: str | None
    low: bool
    """True for debug/info (an absent severity is info): what overflow drops first."""
    ticket: Ticket | None = None
    """Set for events of a ``deliver`` call: told when the relay confirmed (or lost) this one."""


class Ticket:
    """One ``deliver`` call's wait: done when every event of it is confirmed or lost."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.lost = 0
        self.refused = 0
        """Events the relay can never take (too big for it): left out of the batch, not retried."""
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if n == 0:
            self.done.set_result(None)

    def settle(self, delivered: bool = True) -> None:
        self.left -= 1
        self.lost += not delivered
        if self.left <= 0 and not self.done.done():
            self.done.set_result(None)


    def refuse(self) -> None:
        self.left -= 1
        self.refused += 1
        if self.left <= 0 and not self.done.done():
            self.done.set_result(None)


def settle(items: Iterable[Pending], delivered: bool = True) -> None:
    for item in items:
        if item.ticket is not None:
            item.ticket.settle(delivered)


def pending(event: Event, ticket: Ticket | None = None) -> Pending:
    """The outbox entry for a stamped event (serialized by ``aep_collector.pipeline.wire.dumps``, the one serializer)."""
    session = event.get("session")
    return Pending(
        text=dumps(event),
        type=str(event.get("type", "")),
        session=session if isinstance(session, str) else None,
        low=event.get("severity", "info") in LOW_SEVERITIES,
        ticket=ticket,
    )


class Outbox:
    """A FIFO of ``Pending`` bounded by ``capacity``; ``push`` returns what overflow dropped.

    Both policies drop a debug/info entry before any notice-or-above one (AEP-0003 §8.4); only a
    queue holding nothing else loses a notice-or-above event, and that too is returned (counted
    and reported by the caller, never silent). ``drop_oldest`` keeps the newest events,
    ``drop_newest`` keeps the oldest.
    """

    def __init__(self, capacity: int, policy: Overflow = "drop_oldest") -> None:
        if capacity < 1:
            raise ValueError("outbox capacity must be at least 1")
        self.capacity = capacity
        self.policy = policy
        self._items: deque[Pending] = deque()
        self._low = 0

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Pending]:
        return iter(self._items)

    def push(self, item: Pending) -> list[Pending]:
        """Append ``item``; return the entries dropped to stay within capacity (maybe ``item`` itself)."""
        self._items.append(item)
        self._low += item.low
        return self._trim()

    def push_front(self, items: Iterable[Pending]) -> list[Pending]:
        """Put ``items`` (in their order) back before everything queued: they were older."""
        items = list(items)
        self._items.extendleft(reversed(items))
        self._low += sum(i.low for i in items)
        return self._trim()

    def pop(self) -> Pending:
        item = self._items.popleft()
        self._low -= item.low
        return item

    def sessions(self) -> set[str]:
        return {i.session for i in self._items if i.session is not None}

    def _trim(self) -> list[Pending]:
        dropped: list[Pending] = []
        while len(self._items) > self.capacity:
            dropped.append(self._drop_one())
        return dropped

    def _drop_one(self) -> Pending:
        newest = self.policy == "drop_newest"
        if self._low:
            indices = range(len(self._items) - 1, -1, -1) if newest else range(len(self._items))
            index = next(i for i in indices if self._items[i].low)
        else:
            index = len(self._items) - 1 if newest else 0
        item = self._items[index]
        del self._items[index]
        self._low -= item.low
        return item
