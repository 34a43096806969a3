"""``VendorDeclaration``: everything the collector knows of one coding-agent vendor, written once.

Each vendor declares itself in its receiver module (``DECLARATION = VendorDeclaration(...)``,
``FACTORY = DECLARATION.factory()``); the rest is derived from the declarations the component
registry holds (built-ins and plug-ins alike, ``Registry.vendors``): the receiver factory, the
``aep-collector hooks VENDOR`` renderers, the mapping processor's vendor lookup, the plug-in
files' ports and the command shim's vendor table (``shim_entry``, written beside the shim's copy).
The core itself knows no vendor: nothing here names one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .component import Factory, Kind

HELD_WAIT_MARGIN = 5.0
"""Seconds the command shim waits on a held hook beyond the receiver's default hold window."""
SHORT_WAIT = 6.0
"""Seconds the command shim waits for a hook that is never held (``shim.SHORT_WAIT``)."""


@dataclass(frozen=True)
class VendorDeclaration:
    """One vendor: identity, receiver, replies, shim facts, mapping and registration.

    ``surface(config, component_id)`` builds the vendor's side of the shared hook server (a
    ``HookSurface``: ``signal``, ``neutral``, ``handle``); ``factory()`` wraps it in the receiver
    factory. ``registration(url, config)`` returns the ``Wiring`` that ``aep-collector hooks
    AGENT`` prints and whose targets ``--install`` merges (``url`` is ``--url`` or ``None``,
    ``config`` the configured receiver's or ``None`` for the defaults).
    """

    agent: str
    """The AEP agent identity and the name users type (``aep-collector hooks codex``)."""
    receiver_type: str
    """The receiver's component type in a config (``receivers: {codex: ...}``)."""
    port: int
    """The default port on 127.0.0.1; the config class's endpoint default reads it (``endpoint``)."""
    config_class: type
    """The receiver's config dataclass (its defaults are the default config)."""
    surface: Callable[[Any, str], Any]
    """(config, component id) -> the vendor's ``HookSurface``."""
    mapping: str
    """Dotted path of the mapping module (``AGENT``, ``new_state``, ``map_signal``)."""
    registration: Callable[[str | None, Any], Any]
    """(url, receiver config or None) -> the ``Wiring`` ``aep-collector hooks`` prints / installs."""
    description: str = ""
    hooks: tuple[str, ...] = ()
    """The hooks the registration wires, where the receiver lists them (the hook family's
    registrations wire every hook their mapping's table maps, ``registration.mapped_hooks``)."""
    held_hooks: frozenset[str] = frozenset()
    """Hooks the receiver may hold for an operator (the shim waits past the hold window)."""
    neutral_reply: Mapping[str, Any] | None = field(default_factory=dict)
    """The fail-open reply body; ``None``: an empty reply (the vendor reads stdout as text)."""
    neutral_by_event: Mapping[str, bytes] = field(default_factory=dict)
    """Byte-pinned fail-open replies per hook (any case), where they differ from ``neutral_reply``."""
    needs_event: bool = False
    """The payload does not name its hook: the shim must be given EVENT (sent as ``?hook=``)."""
    detached: frozenset[str] = frozenset()
    """Hooks whose reply the vendor ignores and whose process it may kill early: the shim answers
    at once and delivers from a detached child."""
    stability: str = "development"

    @property
    def endpoint(self) -> str:
        """The config's default ``endpoint``: loopback on the declared port."""
        return f"127.0.0.1:{self.port}"

    @property
    def hold_wait(self) -> float:
        """Seconds the shim waits on a held hook: the default hold window plus a margin."""
        attention = getattr(self.config_class(), "attention_timeout", None)
        if not self.held_hooks or attention is None:
            return SHORT_WAIT
        return float(attention) + HELD_WAIT_MARGIN

    def neutral_bytes(self, event: str | None = None) -> bytes:
        """The fail-open stdout for ``event``, byte for byte what the vendor is pinned to."""
        if event:
            pinned = {k.lower(): v for k, v in self.neutral_by_event.items()}.get(event.strip().lower())
            if pinned is not None:
                return pinned
        return b"" if self.neutral_reply is None else json.dumps(dict(self.neutral_reply)).encode()

    def shim_entry(self) -> dict[str, Any]:
        """The keyword arguments of the shim's ``Vendor`` (only literals: the table is Python source)."""
        return {"port": self.port, "neutral": None if self.neutral_reply is None else self.neutral_bytes(),
                "by_event": {k.lower(): v for k, v in sorted(self.neutral_by_event.items())},
                "held": tuple(sorted(self.held_hooks)), "wait": self.hold_wait,
                "needs_event": self.needs_event, "detached": tuple(sorted(h.lower() for h in self.detached))}

    def factory(self) -> Factory:
        """The receiver factory: the shared hook server around this vendor's surface."""

        def create(settings: Any, config: Any, next_consumer: Any) -> Any:
            # Imported here: the core does not depend on the receivers package at import time.
            from aep_collector.receivers.hook_http import HookServer

            return HookServer(settings, config, next_consumer, self.surface(config, f"receiver/{settings.id}"))

        description = f"{self.description} (default endpoint {self.endpoint})"
        return Factory(Kind.RECEIVER, self.receiver_type, self.config_class, create, description,
                       self.stability, vendor=self)
