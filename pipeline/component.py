"""The component model, after the OpenTelemetry Collector.

Every component type is a ``Factory``: a type name, a config dataclass whose defaults are the
default config, and a create function. The service only ever talks to factories and to the three
interfaces below; it never imports a concrete receiver, processor or exporter.
"""

from __future__ import annotations

import builtins
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .model import Batch, Event

if TYPE_CHECKING:
    from .host import Host
    from .vendor import VendorDeclaration


class Kind(enum.Enum):
    RECEIVER = "receiver"
    PROCESSOR = "processor"
    EXPORTER = "exporter"

    @property
    def plural(self) -> str:
        return self.value + "s"


class Consumer(Protocol):
    """The one interface between components: consume this batch.

    Returns the AEP events the batch became once stamped (possibly none), so that a receiver that
    holds a vendor's reply open can learn the id of the attention request it is holding.
    """

    async def consume(self, batch: Batch) -> list[Event]: ...


@runtime_checkable
class Receiver(Protocol):
    """Listens to a vendor and pushes signals into its next consumer."""

    async def start(self, host: Host) -> None: ...

    async def shutdown(self) -> None: ...


@runtime_checkable
class Processor(Protocol):
    """A callable over a batch: data in, data out. State, if any, is an explicit attribute."""

    def __call__(self, batch: Batch) -> Batch: ...


@runtime_checkable
class Exporter(Protocol):
    """Delivers stamped events somewhere."""

    async def start(self, host: Host) -> None: ...

    async def export(self, events: list[Event]) -> int | list[Event] | None:
        """Send ``events``; return how many it left out (or those events), counted by itself under
        why (``dropped``, ...), so they are not counted ``exported``. None: every one went."""

    async def shutdown(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CreateSettings:
    """What every create function is given besides its config."""

    id: str
    """The component id from the config: ``type`` or ``type/name``."""
    pipeline: str | None = None
    """The pipeline this instance belongs to (processors are one instance per pipeline)."""


@dataclass(frozen=True, slots=True)
class Factory:
    """Type name, config dataclass (its defaults are the default config) and create function.

    ``create`` is called as ``create(settings, config)`` for processors and exporters and as
    ``create(settings, config, next_consumer)`` for receivers.
    """

    kind: Kind
    type: str
    # builtins.type: the `type` field above shadows the builtin inside this class body.
    config_class: builtins.type
    create: Callable[..., Any]
    description: str = ""
    stability: str = "development"
    emits_signals: bool = True
    """Receivers: what they deliver is vendor ``Signal``s, which need a ``mapping`` processor in
    every pipeline they feed (``validate`` makes a pipeline without one an error). A receiver that
    delivers finished event drafts sets it False."""
    vendor: VendorDeclaration | None = None
    """The ``aep_collector.pipeline.vendor.VendorDeclaration`` a vendor receiver's factory carries."""

    def default_config(self) -> Any:
        return self.config_class()


@dataclass
class Registry:
    """Factories by kind and type name: the built-in ones plus those plug-ins register."""

    factories: dict[Kind, dict[str, Factory]] = field(
        default_factory=lambda: {k: {} for k in Kind}
    )
    origins: dict[tuple[Kind, str], str] = field(default_factory=dict)

    def register(self, factory: Factory, origin: str = "builtin") -> None:
        existing = self.factories[factory.kind].get(factory.type)
        if existing is not None and existing is not factory:
            prior = self.origins.get((factory.kind, factory.type), "builtin")
            raise ValueError(
                f"{factory.kind.value} type {factory.type!r} from {origin} is already registered by {prior}"
            )
        if factory.vendor is not None:
            # One declaration per agent: a second would silently take over the first's mapping,
            # hooks and shim entry (``vendors`` keeps the last), whatever its receiver type.
            for other in self.factories[Kind.RECEIVER].values():
                if other is not factory and other.vendor is not None and other.vendor.agent == factory.vendor.agent:
                    prior = self.origins.get((Kind.RECEIVER, other.type), "builtin")
                    raise ValueError(f"vendor {factory.vendor.agent!r} of receiver type {factory.type!r} from "
                                     f"{origin} is already declared by receiver type {other.type!r} from {prior}")
        self.factories[factory.kind][factory.type] = factory
        self.origins[(factory.kind, factory.type)] = origin

    def get(self, kind: Kind, type_name: str) -> Factory | None:
        return self.factories[kind].get(type_name)

    def types(self, kind: Kind) -> list[str]:
        return sorted(self.factories[kind])

    def vendors(self) -> dict[str, VendorDeclaration]:
        """The vendor declarations the receiver factories carry, by agent identity."""
        return {f.vendor.agent: f.vendor for f in self.factories[Kind.RECEIVER].values() if f.vendor is not None}
