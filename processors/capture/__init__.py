"""The capture processor: caps every draft at its configured capture level (AEP-0003 §9).

Mappings hand over drafts at full content; this processor is where the operator's ceiling is
enforced, so nothing above it ever reaches the stamper or an exporter. See ``README.md``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.component import Factory, Kind
from aep_collector.pipeline.model import Batch, Event

from .ceiling import (
    CAPTURE_HINTS,
    DEFAULT_CEILING,
    DEFAULT_OVERRIDES,
    LEVELS,
    NONE,
    CapturePolicy,
    _screen,
    _screen_envelope,
    apply_cap,
    cap_draft,
    cap_form_values,
    downlevel,
    honest_claim,
    load_annotations,
    synthesized_prompt,
)
from .redact import Redactor

log = logging.getLogger("aep.processor.capture")

__all__ = [
    "FACTORY",
    "LEVELS",
    "CaptureConfig",
    "CapturePolicy",
    "CaptureProcessor",
    "Redactor",
    "downlevel",
    "honest_claim",
    "cap_draft",
    "cap_form_values",
    "load_annotations",
    "synthesized_prompt",
]


@dataclass
class CaptureConfig:
    """Config of the ``capture`` processor; the defaults are the AEP-0003 §9.1 posture."""

    ceiling: str = DEFAULT_CEILING
    """Capture level of every event type no override names."""
    overrides: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_OVERRIDES))
    """``category`` / ``category.*`` / exact type -> level (may be above or below the ceiling)."""
    secret_env: list[str] = field(default_factory=list)
    """Names of environment variables whose values are secrets (§9.4 rule b)."""
    secret_values: list[str] = field(default_factory=list)
    """Literal secret values (§9.4 rule b; values shorter than 4 characters are ignored)."""
    pii: bool = True
    """Redact emails and phone numbers at ``redacted`` (§9.4 rule d)."""
    home: str | None = None
    """Home directory replaced by ``~`` (§9.4 rule c); ``None`` means the user's home."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the key for anything the processor could not honour."""
        if self.ceiling not in LEVELS:
            raise ValueError(
                f"capture processor: ceiling {self.ceiling!r} is not a capture level "
                f"(expected one of {', '.join(LEVELS)})"
            )
        if not isinstance(self.overrides, dict):
            raise ValueError("capture processor: overrides must map a category, glob or type to a level")
        for key, level in self.overrides.items():
            if level not in LEVELS:
                raise ValueError(
                    f"capture processor: overrides.{key} {level!r} is not a capture level "
                    f"(expected one of {', '.join(LEVELS)})"
                )
        try:
            self.policy()
        except ValueError as exc:
            raise ValueError(f"capture processor: {exc}") from None
        for name, items in (("secret_env", self.secret_env), ("secret_values", self.secret_values)):
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ValueError(f"capture processor: {name} must be a list of strings")
        if not isinstance(self.pii, bool):
            raise ValueError("capture processor: pii must be true or false")
        if self.home is not None and not isinstance(self.home, str):
            raise ValueError("capture processor: home must be a path")

    def policy(self) -> CapturePolicy:
        """The ceiling and overrides as a ``CapturePolicy``."""
        return CapturePolicy(ceiling=self.ceiling, overrides=dict(self.overrides))

    def redactor(self) -> Redactor:
        """The §9.4 pipeline with this config's secrets (environment read now), PII switch and home."""
        values = list(self.secret_values)
        values += [os.environ[name] for name in self.secret_env if os.environ.get(name)]
        return Redactor(secret_values=values, pii=self.pii, home=self.home)


_UNGATED = frozenset({"data", "subject"})  # what a draft the gate failed on loses


def _is_stamped(item: Event) -> bool:
    return "aep" in item and "id" in item and "source" in item


class CaptureProcessor:
    """Caps every draft of a batch at its capture level; signals pass through untouched."""

    def __init__(self, config: CaptureConfig | None = None, component: str = "processor/capture") -> None:
        self.config = config or CaptureConfig()
        self.config.validate()
        self.routes: dict[Any, Any] = {}  # per-type capture decisions (``apply_cap``)
        self._policy = self.config.policy()
        self._redactor = self.config.redactor()
        self.failures = 0
        self.component = component
        self.health: Any = None

    # The routes hold decisions made under the policy and the redactor: replacing either drops them,
    # so no event is capped by a ceiling no longer in force (the policy itself is immutable).
    @property
    def policy(self) -> CapturePolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: CapturePolicy) -> None:
        self.routes = {}
        self._policy = policy

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    @redactor.setter
    def redactor(self, redactor: Redactor) -> None:
        self.routes = {}
        self._redactor = redactor

    async def start(self, host: Any) -> None:
        """Failures are counted and shown in ``/healthz`` and the metrics, not only logged."""
        self.health = host.health

    def __call__(self, batch: Batch) -> Batch:
        out: Batch = []
        for item in batch:
            if not isinstance(item, dict):
                out.append(item)
            elif "aep" in item and "id" in item and "source" in item:  # stamped (``_is_stamped``)
                # An envelope someone else already capped (a redelivered ack, a forwarded event): we
                # hold no original content, so only the hop rule may apply (AEP-0001 §8.2(e)). Its
                # claim is trusted only as far as its content keeps it: a plug-in receiver's event
                # claiming ``metadata`` over a secret would otherwise pass any ceiling untouched.
                try:
                    out.append(downlevel(item, self._policy.level_for(str(item.get("type", ""))),
                                         source=honest_claim(item)))
                except Exception as exc:
                    out.append(self._failed(item, exc))
            else:
                try:  # ``cap``, inlined: this runs for every draft
                    out.append(apply_cap(item, self._policy, self._redactor, self.routes))
                except Exception as exc:
                    out.append(self._failed(item, exc))
        return out

    def cap(self, draft: Event) -> Event:
        """``cap_draft`` under this processor's policy; a draft it cannot cap loses its data."""
        try:
            return apply_cap(draft, self._policy, self._redactor, self.routes)
        except Exception as exc:
            return self._failed(draft, exc)

    def _failed(self, draft: Event, exc: Exception) -> Event:
        """Fail closed: the moment survives, its content never leaks."""
        self.failures += 1
        log.error("capture of %s failed: %s: %.200s", draft.get("type"), type(exc).__name__, exc)
        if self.health is not None:
            self.health.count(self.component, "failed")
            self.health.incident(self.component, "gating-failed", f"{type(exc).__name__} (data dropped)")
        # ``subject`` goes too: it is content (a command line, a path) the failed gate never screened.
        kept = {k: v for k, v in draft.items() if k not in _UNGATED and k not in CAPTURE_HINTS}
        kept["capture"] = "none"
        # What stays is screened as any envelope at ``none`` is: ids, ``source``, ``cause`` and
        # extension attributes leave as their digests when they hold content.
        try:
            _screen_envelope(kept, _screen(NONE, self._redactor), self._redactor)
        except Exception:  # not even the envelope can be screened: only what names the moment stays
            kept = {k: kept[k] for k in ("type", "agent", "capture") if k in kept}
        return kept


FACTORY = Factory(
    kind=Kind.PROCESSOR,
    type="capture",
    config_class=CaptureConfig,
    create=lambda settings, cfg: CaptureProcessor(cfg, f"processor/{settings.id}"),
    description="Caps event payloads at the capture ceiling: drops fields above it, redacts, synthesizes",
)
