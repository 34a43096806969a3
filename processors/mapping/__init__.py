"""The mapping processor: vendor signals in, AEP event drafts out.

Each vendor's mapping is a module in this package exposing::

    AGENT: str                                   # the AEP agent identity, e.g. "codex"
    def new_state() -> object                    # explicit runtime state (joins, snapshots)
    def map_signal(signal: Signal, state) -> list[dict]   # drafts, see aep_collector.pipeline.model

The modules are pure apart from the state object they are handed, and are pinned by the
conformance fixtures. The processor only dispatches, fills ``agent``, tags held requests and
turns a mapping failure into an honest ``error.raised`` instead of losing the moment.

Later stages extend batches and set keys on drafts in place, so the processor hands downstream only
lists and drafts it owns. The modules of this package return a new list of new drafts on every call
(``tests/test_mapping_ownership.py`` holds them to it), taken as they are; a plug-in's mapping may
return a module-level list or the same draft twice, so its list and drafts are copied (one level:
the processor replaces a draft's ``data`` rather than editing it).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from aep_collector.pipeline.component import Factory, Kind
from aep_collector.pipeline.model import Batch, Event, Signal

from .attention import AttentionBook

log = logging.getLogger("aep.processor.mapping")

# Agent identities whose signals come from no vendor receiver: the OTLP profiles (module in this
# package). Every vendor receiver names its mapping in its declaration (``declared_vendors``).
OTLP_VENDORS: dict[str, str] = {
    "codex-otel": "codex_otel",
    "vscode-otel": "vscode_otel",
}


def load_vendor(agent: str, extra: dict[str, str] | None = None) -> ModuleType:
    """Import the mapping module for ``agent``: ``extra`` (``extra_vendors``: a module in this
    package or a dotted path) first, then the OTLP profiles, then the vendor declarations
    (built-in and plug-in receivers)."""
    target = (extra or {}).get(agent) or OTLP_VENDORS.get(agent)
    if target is None:
        from aep_collector.pipeline.registry import declared_vendors

        declared = declared_vendors().get(agent)
        if declared is None:
            raise KeyError(f"no mapping for agent {agent!r}")
        target = declared.mapping
    name = target if "." in target else f"{__name__}.{target}"
    return importlib.import_module(name)


@dataclass
class MappingConfig:
    """Config of the ``mapping`` processor."""

    extra_vendors: dict[str, str] = field(default_factory=dict)
    """Additional ``agent: dotted.module`` mappings provided by plug-in packages."""

    def validate(self) -> None:
        for agent, module in self.extra_vendors.items():
            if not isinstance(module, str) or not module:
                raise ValueError(f"extra_vendors.{agent} must name a Python module")


class MappingProcessor:
    """Maps every ``Signal`` of a batch; drafts already in the batch pass through unchanged."""

    def __init__(self, config: MappingConfig | None = None, component: str = "processor/mapping") -> None:
        self.component = component
        self.health: Any = None
        self.config = config or MappingConfig()
        self.states: dict[str, Any] = {}
        self._modules: dict[str, ModuleType] = {}
        self._routes: dict[str, tuple[Any, Any, str, bool]] = {}
        self.failures = 0
        self._logged: set[tuple[str, str, str]] = set()
        self.attention = AttentionBook()

    async def start(self, host: Any) -> None:
        """Mapping failures and orphan attention legs are counted where ``/healthz`` and metrics see them."""
        self.health = host.health

    def module(self, agent: str) -> ModuleType:
        mod = self._modules.get(agent)
        if mod is None:
            mod = load_vendor(agent, self.config.extra_vendors)
            self._modules[agent] = mod
            self.states[agent] = mod.new_state()
        return mod

    def _route(self, agent: str) -> tuple[Any, Any, str, bool]:
        """(``map_signal``, state, ``AGENT``, whether its drafts are copied: a plug-in's) of an
        agent's mapping, looked up once per agent."""
        mod = self.module(agent)
        foreign = not mod.__name__.startswith(__name__ + ".")
        route = self._routes[agent] = (mod.map_signal, self.states[agent], mod.AGENT, foreign)
        return route

    def __call__(self, batch: Batch) -> Batch:
        drafts: list[Event]
        passthrough: Batch = []
        if len(batch) == 1 and isinstance(batch[0], Signal):  # a hook delivers its call alone
            drafts, booked = self._map(batch[0])
            if not booked:
                # Nothing for the attention book: ``apply`` would return the same drafts in the
                # same order, so its walk (and its list) are skipped. The common case.
                return drafts  # type: ignore[return-value]  # a list of drafts we own (module docstring)
        else:
            drafts = []
            booked = False
            for item in batch:
                if isinstance(item, Signal):
                    mapped, for_book = self._map(item)
                    drafts.extend(mapped)
                    booked = booked or for_book
                elif isinstance(item, dict):
                    drafts.append(item)  # e.g. lifecycle legs a held control loop emits
                    booked = booked or "_attention_key" in item or item.get("type") == "session.ended"
                else:
                    passthrough.append(item)
            if not booked:  # as for one signal: ``apply`` would hand back the same drafts
                drafts.extend(passthrough)  # type: ignore[arg-type]  # batches keep what they do not map
                return drafts  # type: ignore[return-value]
        orphans, invalid = self.attention.orphans, self.attention.invalid
        out: Batch = self.attention.apply(drafts)  # type: ignore[assignment]  # a new list of drafts
        if passthrough:
            out.extend(passthrough)
        if self.health is not None:
            # Legs of a request never seen (or already settled) are dropped by rule, and counted;
            # so are answers that do not satisfy their form.
            if self.attention.orphans != orphans:
                self.health.count(self.component, "orphaned", self.attention.orphans - orphans)
            if self.attention.invalid != invalid:
                self.health.count(self.component, "invalid-answer", self.attention.invalid - invalid)
        return out

    def map_one(self, signal: Signal) -> list[Event]:
        """The drafts of one signal, before the attention book."""
        return self._map(signal)[0]

    def _map(self, signal: Signal) -> tuple[list[Event], bool]:
        """(``map_one``, whether any draft is for the attention book: it carries
        ``_attention_key`` or ends a session). One walk of the drafts decides both."""
        try:
            route = self._routes.get(signal.agent) or self._route(signal.agent)
            drafts = route[0](signal, route[1])
            if route[3]:  # a plug-in's: any iterable, of objects it may hand back again (module docstring)
                drafts = [_owned_draft(d) for d in drafts]
            elif drafts.__class__ is not list:
                drafts = list(drafts)
        except Exception as exc:  # a vendor shape we did not foresee must not lose the moment
            return [self._failure(signal, exc)], False
        booked = False
        name = route[2]
        for d in drafts:
            if "agent" not in d:
                d["agent"] = name
            etype = d.get("type")
            if "_attention_key" in d or etype == "session.ended":
                booked = True
            if etype == "attention.requested":
                if signal.hold is not None:
                    d["_hold"] = signal.hold
                # The receiver knows whether a control route is live; the pure mapping cannot.
                respond_via = signal.respond_via
                data = d.get("data")
                if respond_via is not None and isinstance(data, dict) and "respond_via" in data:
                    data = d["data"] = {**data, "respond_via": list(respond_via)}  # replaced, not edited
                    # A held request says when the hold gives up (operators see the time left).
                    if signal.expires_at and "control" in respond_via:
                        data.setdefault("expires_at", signal.expires_at)
        return drafts, booked

    def _failure(self, signal: Signal, exc: Exception) -> Event:
        self.failures += 1
        if self.health is not None:
            self.health.count(self.component, "failed")
        key = (signal.agent, signal.name, type(exc).__name__)
        if key not in self._logged:  # once per cause, not once per event
            self._logged.add(key)
            # The exception text may quote the payload: bounded, never a whole prompt in the log.
            log.error("mapping %s/%.64s failed: %s: %.200s", signal.agent, signal.name, type(exc).__name__, exc)
        session = None
        payload = signal.payload if isinstance(signal.payload, dict) else {}
        for k in ("session_id", "sessionId", "sessionID", "conversationId", "taskId"):
            if isinstance(payload.get(k), str) and payload[k]:
                session = payload[k]
                break
        return {
            "type": "error.raised",
            "agent": signal.agent,
            "session": session,
            "data": {"error": {"type": "mapping_error"}, "code": type(exc).__name__},
        }


def _owned_draft(draft: Any) -> Event:
    """A copy of a plug-in's draft; anything but a dict is the mapping's failure, raised here where it
    is counted (a list or a set has ``copy`` too, and would fail later, out of the pipeline)."""
    if not isinstance(draft, dict):
        raise TypeError(f"a mapping's draft must be a dict, got {type(draft).__name__}")
    return draft.copy()


FACTORY = Factory(
    kind=Kind.PROCESSOR,
    type="mapping",
    config_class=MappingConfig,
    create=lambda settings, cfg: MappingProcessor(cfg, f"processor/{settings.id}"),
    description="Maps vendor hook calls and log records to AEP event drafts (one pure module per vendor)",
)
