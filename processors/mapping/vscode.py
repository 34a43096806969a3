"""VS Code agent (Copilot) hooks -> AEP drafts (AEP-0002 Annex A.5; fixture ``mappings/vscode.json``).

The 8-event Preview surface. ``session_id`` is optional (missing -> the ``unknown`` lane), runs are
synthesized per UserPromptSubmit/Stop, ``tool_use_id`` pairs tools. Stated absences: there is no
SessionEnd, no PostToolUse failure twin and no StopFailure, so this module never emits
``session.ended``, ``tool.failed`` or ``run.failed``: such hook names, should they appear, take the
fallback. ``transcript_path`` and the envelope ``timestamp`` are never forwarded. What VS Code gets
back (the gate's options and reply) is the receiver's (``aep_collector.receivers.hook_vendors.vscode``).
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Event, Signal
from aep_collector.processors.mapping import hook_vendors as hf
from aep_collector.processors.mapping.drafting import PERMISSION_OPTIONS, draft, gate_card, get_str

AGENT = "vscode"


new_state = hf.no_state


HOOKS: dict[str, hf.Handler] = {
    "SessionStart": hf.session_start_handler(AGENT),
    "UserPromptSubmit": hf.run_started,
    "PreToolUse": hf.tool_requested,
    # Success only on this surface: tool.failed has no vendor moment (fixture PostToolUse $comment).
    "PostToolUse": hf.tool_completed,
    # Documented deviation (fixture): no PostCompact exists here, so the pre moment carries the fact.
    "PreCompact": hf.compacted,
    "SubagentStart": hf.subagent_started,
    "SubagentStop": hf.subagent_stopped,
    "Stop": hf.run_finished,
}


map_hook, _ = hf.table_mapping(AGENT, HOOKS)
"""One VS Code agent hook firing -> drafts (session None when the vendor sent none)."""


def map_signal(signal: Signal, state: None) -> list[Event]:
    """Map a received VS Code agent hook call; a PreToolUse the receiver holds also raises the gate card."""
    name, payload = hf.hook_call(signal)
    drafts = hf.map_table(AGENT, HOOKS, name, payload)
    if name == "PreToolUse" and signal.hold is not None:
        card = gate_request(payload, signal.hold, signal.options)  # held under the receiver's key
        card["session"] = hf.session_of(payload)
        drafts.append(card)
    return drafts


# --- opt-in held PreToolUse gate (reference stack §1.5, AEP_VSCODE_CONTROL) --------------------------


def gate_request(payload: Any, key: str | None = None, options: list[dict[str, str]] | None = None) -> Event:
    """The answerable permission card a held PreToolUse raises (the receiver's options, respond_via control)."""
    p = payload if isinstance(payload, dict) else {}
    tool = get_str(p, "tool_name") or "unknown"
    detail, description = hf.permission_detail(p.get("tool_input"))
    return draft("attention.requested", gate_card(tool, detail, options or PERMISSION_OPTIONS, description), tool,
                 _attention_key=key)
