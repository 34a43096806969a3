"""Building the component registry: built-in factories plus plug-ins from entry points.

A plug-in package declares, in its own ``pyproject.toml``::

    [project.entry-points."aep_collector.components"]
    my_exporter = "my_package.module:FACTORY"

The entry point may name one ``Factory`` or a list of them.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

from .component import Factory, Registry

log = logging.getLogger("aep.registry")

ENTRY_POINT_GROUP = "aep_collector.components"
CAPTURE_TYPE = "capture"
"""The processor type every pipeline ends with (the service appends one if a config does not)."""

# Built-in component modules, each exposing FACTORY (or FACTORIES). Listed, not discovered, so
# a missing module is an error here and not a silently absent component type.
BUILTINS = (
    "processors.mapping",
    "processors.runs",
    "processors.capture",
    "exporters.jsonl",
    "exporters.relay",
    "exporters.relay_server",
    "exporters.nats",
    "exporters.otlp",
    "exporters.cloudevents",
    "receivers.claude_code",
    "receivers.hook_vendors",
    "receivers.plugin_vendors",
    "receivers.otlp",
    "receivers.nats",
)


def _factories(obj: object) -> list[Factory]:
    if isinstance(obj, Factory):
        return [obj]
    if isinstance(obj, (list, tuple)) and all(isinstance(f, Factory) for f in obj):
        return list(obj)
    raise TypeError(f"expected a Factory or a list of Factory, got {type(obj).__name__}")


def build_registry(load_plugins: bool = True) -> tuple[Registry, list[str]]:
    """Return the registry and a list of problems met while loading plug-ins (never fatal)."""
    registry = Registry()
    problems: list[str] = []
    for name in BUILTINS:
        module = importlib.import_module(name)  # a missing built-in is a packaging bug: fail loudly
        found = getattr(module, "FACTORIES", None) or getattr(module, "FACTORY", None)
        for factory in _factories(found):
            registry.register(factory, "builtin")
    if load_plugins:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            origin = f"plug-in {ep.name} ({ep.value}, from {getattr(ep.dist, 'name', '?')})"
            try:
                for factory in _factories(ep.load()):
                    registry.register(factory, origin)
            except Exception as exc:  # a broken plug-in must not take the collector down
                problems.append(f"{origin}: {type(exc).__name__}: {exc}")
                log.error("cannot load %s: %s: %s", origin, type(exc).__name__, exc)
    return registry, problems
