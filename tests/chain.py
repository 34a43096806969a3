"""The processing chain of one pipeline, in-process and synchronous: signals in, stamped events out.

mapping → runs → capture → the stamper, exactly the components a default pipeline builds, with
no receiver and no exporter in between, so stream properties can be checked on many sequences fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CaptureConfig, CaptureProcessor
from aep_collector.processors.mapping import MappingProcessor
from aep_collector.processors.runs import RunsProcessor

from tests.received import received


class Chain:
    def __init__(self, state_dir: Path, ceiling: str = "metadata") -> None:
        self.processors = [MappingProcessor(), RunsProcessor(), CaptureProcessor(CaptureConfig(ceiling=ceiling))]
        self.stamper = Stamper(state_dir, host="test-host")

    def feed(self, agent: str, name: str, payload: Any, **fields: Any) -> list[dict[str, Any]]:
        """``payload`` as the agent's receiver decodes it; ``fields``: the typed Signal fields a
        receiver would set besides (``hold``, ``mode``, ...)."""
        return self.feed_signal(received(agent, name, payload, **fields))

    def feed_signal(self, signal: Signal) -> list[dict[str, Any]]:
        batch: list[Any] = [signal]
        for p in self.processors:
            batch = p(batch)
        return [self.stamper.stamp(d) for d in batch if isinstance(d, dict)]
