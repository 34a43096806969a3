"""Qwen Code hooks -> AEP drafts (AEP-0002 Annex A.4; fixture ``mappings/qwen-code.json``).

The Claude-Code-shaped sibling: runs synthesized per UserPromptSubmit/Stop (no turn id),
``tool_use_id`` pairing, PermissionRequest as a held permission card with the ``permission_prompt``
notification suppressed, compaction once at PostCompact, todo hooks as ``progress.task.*``.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

from aep_collector.pipeline.model import Event, Signal
from aep_collector.processors.mapping import hook_vendors as hf
from aep_collector.processors.mapping.drafting import draft, get_str

AGENT = "qwen-code"


MAX_OPEN_PROMPTS = 10_000
"""Sessions whose open ``prompt_id`` is remembered (least recently used forgotten)."""


class QwenState:
    """The ``prompt_id`` of each session's open run, so a repeated UserPromptSubmit continues it.

    Qwen Code 0.24.4 fires UserPromptSubmit again (``prompt: ""``, the same ``prompt_id``) when it
    sends a tool result back to the model (seen live: ``tests/live/test_live_hooks.py``). That is
    the same turn continuing, not a new run; a new user prompt gets a new ``prompt_id``.
    """

    def __init__(self) -> None:
        self.open: OrderedDict[str, str] = OrderedDict()

    def continues(self, session: str, prompt_id: str | None) -> bool:
        """True if ``prompt_id`` is the session's open run; otherwise it becomes the open one."""
        if prompt_id is not None and self.open.get(session) == prompt_id:
            self.open.move_to_end(session)
            return True
        if prompt_id is None:
            self.open.pop(session, None)
        else:
            self.open[session] = prompt_id
            self.open.move_to_end(session)
            while len(self.open) > MAX_OPEN_PROMPTS:
                self.open.popitem(last=False)
        return False


def new_state() -> QwenState:
    """Runs are synthesized downstream and tools carry ids; only the open prompt is remembered."""
    return QwenState()


def _todo(type_: str, payload: hf.Payload, _state: Any) -> Event | None:
    # Fixture TodoCreated_validation: every todo write fires twice; the validation firing is the
    # silent pre-moment, postWrite is the persisted fact. An absent or unknown phase emits.
    if get_str(payload, "phase") == "validation":
        return None
    data: hf.Payload = {}
    content = get_str(payload, "todo_content")
    if content:
        data["todo_content"] = content  # all_todos is deliberately not forwarded (fixture $comment)
    return hf.merge_capture(draft(type_, data, get_str(payload, "todo_id")), todo_content=hf.REDACTED)


HOOKS: dict[str, hf.Handler] = {
    "SessionStart": hf.session_start_handler(AGENT),
    **hf.LIFECYCLE_HOOKS,
    "PermissionRequest": hf.permission_request,
    # Not in the fixture's sixteen: the newer vendor hook carries the Claude Code tool.denied rule.
    "PermissionDenied": hf.tool_denied,
    "SubagentStart": hf.subagent_started,
    "SubagentStop": hf.subagent_stopped,
    # Documented deviation (fixture): compaction is emitted once, at PostCompact.
    "PreCompact": hf.nothing,
    "PostCompact": hf.compacted,
    # Deduplicated against the first-class PermissionRequest hook (fixture Notification_permission).
    "Notification": partial(hf.notification, suppress=hf.DUPLICATE_NOTIFICATIONS),
    "TodoCreated": partial(_todo, "progress.task.planned"),
    "TodoCompleted": partial(_todo, "progress.task.completed"),
}


map_hook, _ = hf.table_mapping(AGENT, HOOKS)
"""One Qwen Code hook firing -> drafts."""


_RUN_ENDS = ("Stop", "StopFailure", "SessionEnd")


def map_signal(signal: Signal, state: QwenState | None) -> list[Event]:
    """Map a received Qwen Code hook call; its permission card is keyed for the attention book."""
    name, payload = hf.hook_call(signal)
    if state is not None:
        if name == "UserPromptSubmit":
            if state.continues(hf.session_of(payload) or "", get_str(payload, "prompt_id")):
                return []  # the open run continuing after a tool result, not a new run
        elif name in _RUN_ENDS:
            state.open.pop(hf.session_of(payload) or "", None)
    return hf.map_table(AGENT, HOOKS, name, payload, keyed=signal)
