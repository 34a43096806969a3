"""Codex OTel channel (``codex.*`` log records) -> AEP drafts.

Pinned by ``conformance/fixtures/mappings/codex-otel.json``; taxonomy digest §3.3, bridges
digest §1.5. Session = the RECORD attribute ``conversation.id``. Primary mode emits exactly
``{session.started, tool.completed, tool.failed, tool.denied}``; prompts and transport
internals stay ``x.codex.otel.*`` in both modes (they fail the fleet-observer test).
"""

from __future__ import annotations

from typing import Any

from aep_collector.pipeline.model import Event

from . import otlp_vendors
from .drafting import draft, tool_ref
from .otlp_vendors import Profile, add_result, parse_bool, parse_count, text

AGENT = "codex"
NEUTRAL_REPLY = None  # the OTLP response is the receiver's; this channel has no vendor reply

KNOWN_SUFFIXES = ("conversation_starts", "api_request", "sse_event", "websocket_request",
                  "websocket_event", "user_prompt", "tool_decision", "tool_result")

# The one place the deny matcher lives: the fixture pins "deny"; the vendor's ReviewDecision
# spells it "denied" (and "abort" = deny and stop), values refined at live validation.
DENY_DECISIONS = frozenset({"deny", "denied", "abort"})
# Who decided -> tool.denied.by. A "user" deny is a human decision already made in the CLI,
# not a policy block: primary emits nothing for it (fixture tool_decision_user_deny).
DENIED_BY = {"config": "policy", "automation": "runtime"}

# Codex's prompt attribute when otel.log_user_prompt is off (fixture user_prompt).
_PROMPT_WITHHELD = "[REDACTED]"


def _scrub(data: dict[str, Any]) -> dict[str, Any]:
    # Two guards on the prompt: the vendor flag (off = the literal marker, which is not the
    # prompt and must never be forwarded as if it were) AND a redacted+ ceiling (capture map).
    if data.get("prompt") == _PROMPT_WITHHELD:
        data = {k: v for k, v in data.items() if k != "prompt"}
    return data


def _tool_decision(attrs: dict[str, Any]) -> list[Event] | None:
    name = text(attrs, "tool_name")
    decision = (text(attrs, "decision") or "").lower()
    source = (text(attrs, "source") or "").lower()
    if name is None or decision not in DENY_DECISIONS:
        return None  # approvals (unpinned) and nameless decisions stay in the channel family
    if source == "user":
        return []  # a human deny is not a policy block; tool.denied would misreport it
    by = DENIED_BY.get(source)
    if by is None:
        return None  # an unknown decider: never guess who blocked it
    return [draft("tool.denied", {"tool": tool_ref(name), "by": by}, subject=name)]


def _tool_result(attrs: dict[str, Any]) -> list[Event] | None:
    name = text(attrs, "tool_name")
    success = parse_bool(attrs.get("success"))
    if name is None or success is None:
        return None
    if not success:
        # The channel carries free text, not an error taxonomy: the type is synthesized, the text
        # rides as error.message (redacted-gated); fixture tool_result_fail pins no duration_ms.
        error: dict[str, Any] = {"type": "tool_error"}
        message = text(attrs, "error")
        if message:
            error["message"] = message
        return [draft("tool.failed", {"tool": tool_ref(name), "error": error}, subject=name)]
    data: dict[str, Any] = {"tool": tool_ref(name)}
    duration = parse_count(attrs.get("duration_ms"))  # "412" -> 412 in core payloads only
    if duration is not None:
        data["duration_ms"] = duration
    add_result(data, attrs.get("output"))
    return [draft("tool.completed", data, subject=name)]


PROFILE = Profile(
    agent=AGENT,
    # Envelope identity / emitter metadata, never data (bridges digest §1.5).
    identity_keys=frozenset({"event.name", "conversation.id", "app.version", "originator"}),
    capture={
        "prompt": "redacted",
        "error": "redacted",
        "error.message": "redacted",
        "arguments": "full",
        "output": "full",
        # PII: allowed at full only (bridges digest §1.5).
        "user.email": "full",
        "user.account_id": "full",
    },
    known={f"codex.{suffix}": suffix for suffix in KNOWN_SUFFIXES},
    # Declared structure per record: the fixture's pinned keys plus the ids, counts and statuses
    # the vendor documents for the same records. Everything else (the prompt, error text, tool
    # arguments and output, account identity) is content.
    structural={
        "conversation_starts": frozenset({"model", "provider_name", "approval_policy", "sandbox_policy",
                                          "reasoning_effort", "reasoning_summary", "context_window",
                                          "max_output_tokens", "auto_compact_token_limit"}),
        "api_request": frozenset({"status", "duration_ms", "attempts"}),
        "sse_event": frozenset({"kind", "success", "duration_ms", "input_token_count", "output_token_count",
                                "cached_token_count", "reasoning_token_count", "tool_token_count"}),
        "websocket_request": frozenset({"status", "success", "duration_ms"}),
        "websocket_event": frozenset({"kind", "success", "duration_ms"}),
        "user_prompt": frozenset({"prompt_length"}),
        "tool_decision": frozenset({"tool_name", "call_id", "decision", "source"}),
        "tool_result": frozenset({"tool_name", "call_id", "success", "duration_ms"}),
        "unknown": frozenset({"event.name"}),
    },
    primary={
        # Fixture conversation_starts.primary: model is renamed; the policies stay companion-only.
        "codex.conversation_starts": otlp_vendors.session_started(AGENT, "model"),
        "codex.tool_decision": _tool_decision,
        "codex.tool_result": _tool_result,
    },
    scrub=_scrub,
)


new_state = otlp_vendors.new_state
map_record = PROFILE.map_record
map_signal = PROFILE.map_signal
