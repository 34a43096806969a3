"""Codex hooks -> AEP drafts (AEP-0002 Annex A.2; fixture ``mappings/codex.json``).

Identity pin: ``session_id`` (the Codex thread) is the session and ``turn_id`` is a REAL run id,
so drafts carry ``run`` and the runs processor synthesizes nothing. A run left open when the next
prompt arrives was interrupted: ``run.started`` asks the runs processor to drain it as
``run.cancelled`` first. Codex 0.169 fires ``SessionEnd`` (seen live: ``tests/live/test_live_hooks.py``),
which the fixture predates; it closes the session as it does for the other hook vendors.
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Event, Signal
from aep_collector.processors.mapping import hook_vendors as hf
from aep_collector.processors.mapping.drafting import get_str

AGENT = "codex"


new_state = hf.no_state


def _run_started(payload: hf.Payload, _state: Any) -> Event:
    d = hf.run_started(payload)
    d["_drain"] = "cancelled"  # Annex A.2 interrupt-drain: a stale open run closes as run.cancelled
    return d


HOOKS: dict[str, hf.Handler] = {
    "SessionStart": hf.session_start_handler(AGENT),
    "SessionEnd": hf.session_ended,
    "UserPromptSubmit": _run_started,
    "Stop": hf.run_finished,
    "PreToolUse": hf.tool_requested,
    # Codex has no failure twin: a non-zero exit also lands here (fixture PostToolUse $comment).
    "PostToolUse": hf.tool_completed,
    "PermissionRequest": hf.permission_request,
    "SubagentStart": hf.subagent_started,
    "SubagentStop": hf.subagent_stopped,
    # Documented deviation (fixture): compaction is emitted once, at PostCompact.
    "PreCompact": hf.nothing,
    "PostCompact": hf.compacted,
}


_SESSION_SCOPED = ("SessionStart", "SessionEnd")  # never inside a run, whatever turn_id says


def map_hook(name: str, payload: Any) -> list[Event]:
    """One Codex hook firing -> drafts, each in the run its ``turn_id`` names."""
    run = get_str(payload, "turn_id") if isinstance(payload, dict) and name not in _SESSION_SCOPED else None
    return hf.map_table(AGENT, HOOKS, name, payload, run=run)


def map_signal(signal: Signal, state: None) -> list[Event]:
    """Map a received Codex hook call; its permission card is keyed for the attention book."""
    name, payload = hf.hook_call(signal)  # ``map_hook`` inlined (per event), keying in the same walk
    run = None if name in _SESSION_SCOPED else get_str(payload, "turn_id")
    return hf.map_table(AGENT, HOOKS, name, payload, run=run, keyed=signal)
