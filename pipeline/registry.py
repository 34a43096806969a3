"""Building the component registry: built-in factories plus plug-ins from entry points.

A plug-in package declares, in its own ``pyproject.toml``::

    [project.entry-points."aep_collector.components"]
    my_exporter = "my_package.module:FACTORY"

The entry point may name one ``Factory`` or a list of them. A vendor receiver's factory carries
its ``VendorDeclaration`` (``DECLARATION.factory()``): the vendor then has ``aep-collector hooks``,
the command shim and its mapping with no further registration (``declared_vendors``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import typing
from collections.abc import Callable
from importlib.metadata import entry_points

from .component import Factory, Kind, Registry
from .vendor import VendorDeclaration

log = logging.getLogger("aep.registry")

ENTRY_POINT_GROUP = "aep_collector.components"
CAPTURE_TYPE = "capture"
"""The processor type every pipeline ends with (the service appends one if a config does not)."""

# Built-in component modules, each exposing FACTORY (or FACTORIES). Listed, not discovered, so
# a missing module is an error here and not a silently absent component type.
BUILTINS = (
    "aep_collector.processors.mapping",
    "aep_collector.processors.runs",
    "aep_collector.processors.capture",
    "aep_collector.exporters.jsonl",
    "aep_collector.exporters.relay",
    "aep_collector.exporters.relay_server",
    "aep_collector.exporters.nats",
    "aep_collector.exporters.otlp",
    "aep_collector.exporters.cloudevents",
    "aep_collector.receivers.claude_code",
    "aep_collector.receivers.hook_vendors",
    "aep_collector.receivers.plugin_vendors",
    "aep_collector.receivers.otlp",
    "aep_collector.receivers.nats",
)


def _factories(obj: object) -> list[Factory]:
    if isinstance(obj, Factory):
        return [obj]
    if isinstance(obj, (list, tuple)) and all(isinstance(f, Factory) for f in obj):
        return list(obj)
    raise TypeError(f"expected a Factory or a list of Factory, got {type(obj).__name__}")


def _check_plugin(factory: Factory) -> None:
    """What the config and ``components`` rely on of a factory, checked when a plug-in is loaded so a
    broken one is reported there (and left out) instead of failing ``validate`` or ``components``."""
    if not isinstance(factory.kind, Kind):
        raise TypeError(f"factory {factory.type!r}: kind must be a Kind, got {factory.kind!r}")
    if not isinstance(factory.type, str) or not factory.type or "/" in factory.type:
        # Component ids are ``type`` or ``type/name``: a type with a slash could never be named.
        raise ValueError(f"{factory.kind.value} type {factory.type!r}: must be a non-empty name without '/'")
    if not dataclasses.is_dataclass(factory.config_class):
        raise TypeError(f"{factory.kind.value} type {factory.type!r}: config_class "
                        f"{getattr(factory.config_class, '__name__', factory.config_class)!r} is not a dataclass")
    try:
        _resolve_hints(factory.config_class)
    except Exception as exc:
        # The config reads the annotations to coerce every key: unresolved, validate and run crashed.
        raise TypeError(f"{factory.kind.value} type {factory.type!r}: the field types of its config cannot be "
                        f"resolved ({type(exc).__name__}: {exc}); import them at run time, not only under "
                        "TYPE_CHECKING") from None
    try:
        factory.default_config()  # the defaults are the default config: every field needs one
    except Exception as exc:
        raise TypeError(f"{factory.kind.value} type {factory.type!r}: its default config cannot be built "
                        f"({type(exc).__name__}: {exc}); every config field needs a default") from None


def _resolve_hints(cls: type, seen: set[type] | None = None) -> None:
    """Resolve the annotations of config class ``cls`` and of the config classes nested in them."""
    seen = set() if seen is None else seen
    if cls in seen:
        return
    seen.add(cls)
    stack = list(typing.get_type_hints(cls).values())
    while stack:
        tp = stack.pop()
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            _resolve_hints(tp, seen)
        stack.extend(typing.get_args(tp))


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
                factories = _factories(ep.load())
                for factory in factories:
                    _check_plugin(factory)
                # All of an entry point's factories or none: one that clashes (with a built-in, say)
                # left those before it registered under a "cannot load" warning.
                trial = Registry({k: dict(v) for k, v in registry.factories.items()}, dict(registry.origins))
                for factory in factories:
                    trial.register(factory, origin)
                registry.factories, registry.origins = trial.factories, trial.origins
            # SystemExit too: a plug-in module that calls sys.exit() on import (a missing dependency,
            # say) must not end the collector, silently, with the plug-in's exit code.
            except (Exception, SystemExit) as exc:  # a broken plug-in must not take the collector down
                problems.append(f"{origin}: {type(exc).__name__}: {exc}")
    return registry, problems


_told: set[str] = set()


def tell(problems: list[str], say: Callable[[str], None]) -> None:
    """``say`` each plug-in problem not yet told in this process: the CLI and the vendor lookup
    both load the plug-ins, and each problem was printed twice (a bare log line and a warning)."""
    for problem in problems:
        if problem not in _told:
            _told.add(problem)
            say(problem)


@functools.cache
def declared_vendors(load_plugins: bool = True) -> dict[str, VendorDeclaration]:
    """Every vendor declaration the registry's receiver factories carry, by agent identity.

    Read once per process: entry points do not change under a running one.
    """
    registry, problems = build_registry(load_plugins)
    tell(problems, lambda problem: log.error("cannot load %s", problem))
    return registry.vendors()
