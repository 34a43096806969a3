"""The plug-in API: everything a third-party component needs, and nothing else.

A plug-in imports only from here, so the collector can move its internals without breaking it.
The typed factory helpers below state the create signature of each kind, which the plain
``Factory`` cannot: mypy checks a plug-in's create function against its config class.

    from aep_collector.api import CreateSettings, exporter_factory

    @dataclass
    class MyConfig:
        path: str = "/tmp/out.txt"

    def create(settings: CreateSettings, config: MyConfig) -> MyExporter: ...

    FACTORY = exporter_factory("my_exporter", MyConfig, create)

A vendor (a coding agent whose hooks become AEP events) is one mapping module and one receiver
module holding its ``VendorDeclaration``; ``FACTORY = DECLARATION.factory()`` is the entry point,
and ``aep-collector hooks``, the command shim and the mapping processor find the vendor through
it. The receiver side builds on the shared hook server: ``HookReceiverConfig`` (the keys every
hook receiver has), ``HookError`` (a refused request), ``hook_signal`` (the Signal of a payload
that names its hook, the refusal when none does), and for the registration ``Wiring``,
``Target``, ``json_target``, ``hook_url`` and ``shim_command`` (the fail-open command a vendor
runs per hook). ``tests/plugin_vendor/`` is a complete, tested example.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from aep_collector.pipeline.component import (
    Consumer,
    CreateSettings,
    Exporter,
    Factory,
    Kind,
    Processor,
    Receiver,
)
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Batch, Event, Signal
from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.receivers.hook_http import HookError, HookReceiverConfig, hook_signal
from aep_collector.receivers.registration import hook_url, shim_command
from aep_collector.receivers.wiring import Target, Wiring, json_target

__all__ = [
    "Batch",
    "Consumer",
    "CreateSettings",
    "Event",
    "Exporter",
    "Factory",
    "HookError",
    "HookReceiverConfig",
    "Host",
    "Kind",
    "Processor",
    "Receiver",
    "Signal",
    "Target",
    "VendorDeclaration",
    "Wiring",
    "exporter_factory",
    "hook_signal",
    "hook_url",
    "json_target",
    "processor_factory",
    "receiver_factory",
    "shim_command",
]

C = TypeVar("C")


def receiver_factory(
    type_name: str,
    config_class: type[C],
    create: Callable[[CreateSettings, C, Consumer], Receiver],
    *,
    description: str = "",
    stability: str = "development",
) -> Factory:
    """A receiver factory: ``create(settings, config, next_consumer)`` returns the receiver."""
    return Factory(Kind.RECEIVER, type_name, config_class, create, description, stability)


def processor_factory(
    type_name: str,
    config_class: type[C],
    create: Callable[[CreateSettings, C], Processor],
    *,
    description: str = "",
    stability: str = "development",
) -> Factory:
    """A processor factory: ``create(settings, config)`` returns a callable over a batch."""
    return Factory(Kind.PROCESSOR, type_name, config_class, create, description, stability)


def exporter_factory(
    type_name: str,
    config_class: type[C],
    create: Callable[[CreateSettings, C], Exporter],
    *,
    description: str = "",
    stability: str = "development",
) -> Factory:
    """An exporter factory: ``create(settings, config)`` returns the exporter."""
    return Factory(Kind.EXPORTER, type_name, config_class, create, description, stability)
