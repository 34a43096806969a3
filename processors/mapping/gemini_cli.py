"""Gemini CLI hooks -> AEP drafts (AEP-0002 Annex A.3; fixture ``mappings/gemini-cli.json``).

Observe-only: no hook here can be answered, so nothing maps to ``attention.*`` (Notification is a
``progress.status``). Runs are synthesized per BeforeAgent/AfterAgent; Gemini exposes no tool call
id, so tool refs carry only ``name`` (pairing by session and tool is runtime state).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from aep_collector.pipeline.model import Event
from aep_collector.processors.mapping import hook_vendors as hf
from aep_collector.processors.mapping.drafting import draft, get_dict, get_str, hook_fallback

AGENT = "gemini-cli"


new_state = hf.no_state


def _after_tool(payload: hf.Payload, _state: Any) -> Event:
    error = get_dict(payload, "tool_response").get("error")
    if error:
        # Annex A.3: `tool_response.error` is an honest failure -> tool.failed (unlike Codex).
        if isinstance(error, dict):
            return hf.tool_failed(payload, get_str(error, "type") or "tool_error", error.get("message"),
                                  call_ids=False)
        return hf.tool_failed(payload, "tool_error", error, call_ids=False)
    return hf.tool_completed(payload, call_ids=False)


def _model_plane(severity: str | None, payload: hf.Payload, _state: Any) -> Event:
    # By design (fixture): the model plane has no core equivalent; the model id rides at metadata.
    name = get_str(payload, "hook_event_name") or "model"
    model = get_str(get_dict(payload, "llm_request"), "model")
    return draft(hook_fallback(AGENT, name), {"model": model} if model else {}, severity=severity)


HOOKS: dict[str, hf.Handler] = {
    "SessionStart": hf.session_start_handler(AGENT),
    "SessionEnd": hf.session_ended,
    "BeforeAgent": hf.run_started,
    # The response text is message-stream territory (AEP-0007): not captured on the terminal.
    "AfterAgent": hf.run_finished,
    "BeforeTool": partial(hf.tool_requested, call_ids=False),
    "AfterTool": _after_tool,
    "BeforeModel": partial(_model_plane, None),
    "AfterModel": partial(_model_plane, "debug"),  # fires per streamed chunk
    "BeforeToolSelection": partial(_model_plane, None),
    # Documented deviation (fixture): the vendor exposes only the pre moment, so it carries the fact.
    "PreCompress": hf.compacted,
    # Never attention (Annex A.3): the hook can neither grant nor deny, and nothing is suppressed.
    "Notification": hf.notification,
}


map_hook, map_signal = hf.table_mapping(AGENT, HOOKS)
"""One Gemini CLI hook firing (by name, or as a received Signal) -> drafts."""
