"""The control router (AEP-0004): owned by the pipeline, not by any exporter or receiver.

Receivers declare which command types they can honour for an agent and register what they
hold open; duplex exporters hand inbound commands here. The router decides once per command.
"""

from __future__ import annotations

import logging
from typing import Any

from .host import Health

log = logging.getLogger("aep.control")


class ControlRouter:
    """Routes inbound commands to whatever a receiver holds; see ``submit``."""

    def __init__(self, health: Health) -> None:
        self.health = health
        self.pipelines: dict[str, Any] = {}
        self.specs: dict[str, Any] = {}
        self._accepts: dict[str, set[str]] = {}

    def bind_pipelines(self, pipelines: dict[str, Any], specs: dict[str, Any]) -> None:
        self.pipelines, self.specs = pipelines, specs

    def declare(self, agent: str, command_types: list[str]) -> None:
        """A receiver states the command types it honours for ``agent`` (hello ``control.accepts``)."""
        self._accepts.setdefault(agent, set()).update(command_types)

    def accepts(self, agent: str) -> list[str]:
        return sorted(self._accepts.get(agent, ()))

    async def shutdown(self) -> None:
        return None
