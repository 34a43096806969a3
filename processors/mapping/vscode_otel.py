"""VS Code Copilot Chat OTel channel (``copilot_chat.*`` log records) -> AEP drafts.

Pinned by ``conformance/fixtures/mappings/vscode-otel.json``; taxonomy digest §3.7, bridges
digest §1.4. Session = the RESOURCE attribute ``session.id``. Primary mode emits exactly
``{session.started, tool.completed, tool.failed}``: the hook decision tier never reaches OTel
(no ``tool.denied``) and the editor has no session end (no ``session.ended``).
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Event

from . import otlp_vendors
from .drafting import draft, tool_ref
from .otlp_vendors import Profile, add_result, parse_bool, parse_count, text

AGENT = "vscode"
NEUTRAL_REPLY = None  # the OTLP response is the receiver's; this channel has no vendor reply


def _tool_outcome(attrs: dict[str, Any]) -> list[Event] | None:
    name = text(attrs, "gen_ai.tool.name")
    success = parse_bool(attrs.get("success"))
    if name is None or success is None:
        return None  # no tool name or no outcome: stay in the channel family, never guess
    data: dict[str, Any] = {"tool": tool_ref(name)}
    if not success:
        # The vendor's own error.type token (OTel semconv, structural); unpinned when absent:
        # "tool_error", the same synthesized class the Codex profile uses.
        data["error"] = {"type": text(attrs, "error.type") or "tool_error"}
    duration = parse_count(attrs.get("duration_ms"))
    if duration is not None:
        data["duration_ms"] = duration
    if success:
        add_result(data, attrs.get("gen_ai.tool.call.result"))
    return [draft("tool.completed" if success else "tool.failed", data, subject=name)]


PROFILE = Profile(
    agent=AGENT,
    identity_keys=frozenset({"event.name", "session.id"}),
    # OTel GenAI content attributes (present only with github.copilot.chat.otel.captureContent):
    # free text, gated like gen_ai.input.messages (fixture inference_details).
    capture={
        "gen_ai.input.messages": "redacted",
        "gen_ai.output.messages": "redacted",
        "gen_ai.system_instructions": "redacted",
        "gen_ai.tool.definitions": "redacted",
        "gen_ai.tool.call.arguments": "full",
        "gen_ai.tool.call.result": "full",
    },
    known={
        "copilot_chat.session.start": "session.start",
        "copilot_chat.tool.call": "tool.call",
        "copilot_chat.agent.turn": "agent.turn",
        "copilot_chat.edit.feedback": "edit.feedback",
        # Fixture inference_details: a fixed suffix, not derived from the GenAI event name.
        "gen_ai.client.inference.operation.details": "inference_details",
    },
    # Declared structure per record (names, ids, counts, durations, statuses): the fixture's pinned
    # keys plus the OTel GenAI semconv ids and counts of the same records. Everything else a
    # record carries (a `prompt`, `user.email`, `error.message`, `file.path`, …) is content.
    structural={
        "session.start": frozenset({"gen_ai.request.model", "gen_ai.agent.name"}),
        "tool.call": frozenset({"gen_ai.tool.name", "gen_ai.tool.call.id", "duration_ms", "success", "error.type"}),
        "agent.turn": frozenset({"turn.index", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                                 "tool_call_count", "gen_ai.request.model", "gen_ai.response.model"}),
        "inference_details": frozenset({"gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model",
                                        "gen_ai.response.id", "gen_ai.response.finish_reasons",
                                        "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"}),
        "edit.feedback": frozenset({"outcome", "language_id", "participant", "request_id", "edit_surface",
                                    "has_remaining_edits", "is_notebook"}),
        "unknown": frozenset({"event.name"}),
    },
    primary={
        # Fixture session_start.primary: client is the profile's agent, gen_ai.agent.name is dropped.
        "copilot_chat.session.start": otlp_vendors.session_started(AGENT, "gen_ai.request.model"),
        "copilot_chat.tool.call": _tool_outcome,
        # agent.turn stays vendor-namespaced: no run identity exists on this channel.
    },
)


new_state = otlp_vendors.new_state
map_record = PROFILE.map_record
map_signal = PROFILE.map_signal
