"""An exporter appending ``<type> <session> <seq>`` lines to a file, and a processor tagging drafts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aep_collector.api import CreateSettings, exporter_factory, processor_factory


@dataclass
class NdjsonFileConfig:
    path: str = "/tmp/aep-plugin-sample.txt"

    def validate(self) -> None:
        if not self.path:
            raise ValueError("path must not be empty")


class NdjsonFileExporter:
    def __init__(self, config: NdjsonFileConfig) -> None:
        self.config = config

    async def start(self, host: Any) -> None:
        open(self.config.path, "a").close()

    async def export(self, events: list[dict[str, Any]]) -> None:
        with open(self.config.path, "a", encoding="utf-8") as fh:
            for ev in events:
                fh.write(f"{ev['type']} {ev.get('session', '-')} {ev.get('seq', '-')} {ev.get('pluginmark', '')}\n")

    async def shutdown(self) -> None:
        return None


@dataclass
class ShoutConfig:
    mark: str = "seen"


class Shout:
    """Adds an extension attribute to every draft (a legal AEP extension: short, lowercase, scalar)."""

    def __init__(self, config: ShoutConfig) -> None:
        self.mark = config.mark

    def __call__(self, batch: list[Any]) -> list[Any]:
        for item in batch:
            if isinstance(item, dict):
                item["pluginmark"] = self.mark
        return batch


def create_exporter(settings: CreateSettings, config: NdjsonFileConfig) -> NdjsonFileExporter:
    return NdjsonFileExporter(config)


def create_processor(settings: CreateSettings, config: ShoutConfig) -> Shout:
    return Shout(config)


FACTORY = exporter_factory("ndjson_file", NdjsonFileConfig, create_exporter,
                           description="sample plug-in: one text line per event")
PROCESSOR_FACTORY = processor_factory("shout", ShoutConfig, create_processor,
                                      description="sample plug-in: tags drafts with an extension attribute")
