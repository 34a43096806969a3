"""A tiny in-memory exporter for tests: records every export call (redeliveries included)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aep_collector.pipeline.component import Factory, Kind

SINKS: dict[str, list[dict[str, Any]]] = {}


@dataclass
class MemoryConfig:
    name: str = "default"


class MemoryExporter:
    def __init__(self, cfg: MemoryConfig) -> None:
        self.events = SINKS.setdefault(cfg.name, [])

    async def start(self, host: Any) -> None:
        return None

    async def export(self, events: list[dict[str, Any]]) -> None:
        self.events.extend(events)

    async def shutdown(self) -> None:
        return None


FACTORY = Factory(kind=Kind.EXPORTER, type="memory", config_class=MemoryConfig,
                  create=lambda settings, cfg: MemoryExporter(cfg), description="test sink")
