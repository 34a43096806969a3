"""The Signal a receiver hands the pipeline for a raw vendor input (what the corpus holds).

A mapping reads typed ``Signal`` fields that only its receiver decodes (Claude Code's question
forms, the OTLP channels' and the OpenCode family's sessions, a bus ask's options, ...). A test that maps a raw input goes through that
receiver's own decoder, so the corpus pins what runs: the receiver's decoding and the mapping
together, never a copy of either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aep_collector.pipeline.model import Signal
from aep_collector.receivers import claude_code
from aep_collector.receivers.otlp.config import PROFILES
from aep_collector.receivers.otlp.identity import SESSION_FROM, session_of
from aep_collector.receivers.plugin_vendors import bus_moments


def _claude_code(name: str, payload: Any) -> Signal:
    if not isinstance(payload, dict):
        return Signal(claude_code.AGENT, name, payload)
    named = payload.get("hook_event_name")  # what the receiver names a hook by
    return claude_code.decode(Signal(claude_code.AGENT, named if isinstance(named, str) and named else name, payload))


def _bus(agent: str) -> Callable[[str, Any], Signal]:
    return lambda name, body: bus_moments.decode(agent, name, body)


def _otlp(profile: str) -> Callable[[str, Any], Signal]:
    def decode(name: str, flat: Any) -> Signal:
        return Signal(PROFILES[profile], name, flat, session=session_of(SESSION_FROM[profile], flat))

    return decode


DECODERS: dict[str, Callable[[str, Any], Signal]] = {
    claude_code.AGENT: _claude_code,
    **{agent: _otlp(profile) for profile, agent in PROFILES.items()},
    **{agent: _bus(agent) for agent in ("opencode", "kilocode")},
}
"""Agent -> its receiver's decoding of (name, raw payload); other agents' signals carry the raw payload only."""


def received(agent: str, name: str, payload: Any, **fields: Any) -> Signal:
    """``payload`` as ``agent``'s receiver decodes it, plus the typed ``fields`` a receiver sets."""
    decode = DECODERS.get(agent)
    signal = decode(name, payload) if decode is not None else Signal(agent, name, payload)
    for key, value in fields.items():
        setattr(signal, key, value)
    return signal
