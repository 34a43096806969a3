"""The ``claude_code`` receiver: Claude Code's native ``http`` hooks on ``127.0.0.1:8377``.

Claude Code POSTs each hook's JSON input to ``POST /hook``; the hook's ``hook_event_name`` names
the moment. The reply is Claude Code's hook output JSON; ``{}`` is the neutral reply (no
decision, Claude Code carries on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from pipeline.component import Factory, Kind
from pipeline.model import Signal
from receivers.hook_http import Deliver, HookError, HookReceiverConfig, HookServer

AGENT = "claude-code"
NEUTRAL_REPLY: dict[str, Any] = {}

# Every hook Annex A.1 maps, registered by `aep-collector hooks claude-code`.
HOOKS = (
    "SessionStart", "SessionEnd", "UserPromptSubmit", "Stop", "StopFailure", "PreToolUse",
    "PostToolUse", "PostToolUseFailure", "PermissionDenied", "PermissionRequest", "Elicitation",
    "ElicitationResult", "SubagentStart", "SubagentStop", "PreCompact", "PostCompact",
    "TaskCreated", "TaskCompleted", "Notification", "TeammateIdle",
)
TOOL_HOOKS = frozenset({"PreToolUse", "PostToolUse", "PostToolUseFailure", "PermissionRequest",
                        "PermissionDenied"})
HELD_HOOKS = frozenset({"PermissionRequest", "Elicitation"})


@dataclass
class ClaudeCodeConfig(HookReceiverConfig):
    """Config of the ``claude_code`` receiver."""

    endpoint: str = "127.0.0.1:8377"
    attention_timeout: float = 55.0
    """Seconds a held PermissionRequest/Elicitation waits for an operator before ``{}``."""

    def validate(self) -> None:
        super().validate()
        if self.attention_timeout <= 0:
            raise ValueError("attention_timeout must be positive")


class ClaudeCodeSurface:
    """Claude Code's side of the shared hook server."""

    agent = AGENT

    def __init__(self, config: ClaudeCodeConfig) -> None:
        self.config = config

    def signal(self, payload: dict[str, Any], request: web.Request) -> Signal:
        name = payload.get("hook_event_name")
        if not isinstance(name, str) or not name:
            raise HookError(400, "invalid-payload", "hook_event_name is missing or not a string")
        return Signal(agent=AGENT, name=name, payload=payload)

    def neutral(self, signal: Signal | None) -> Any:
        return NEUTRAL_REPLY

    async def handle(self, signal: Signal, deliver: Deliver) -> Any:
        await deliver([signal])
        return NEUTRAL_REPLY


def settings_block(url: str = "http://127.0.0.1:8377/hook", attention_timeout: float = 55.0) -> dict[str, Any]:
    """The ``~/.claude/settings.json`` ``hooks`` block pointing every mapped hook at the receiver.

    Held hooks get a vendor-side timeout above our hold window, so Claude Code never cancels a
    hook we are still holding for an operator.
    """
    held = int(attention_timeout) + 30
    hooks: dict[str, Any] = {}
    for name in HOOKS:
        entry: dict[str, Any] = {"hooks": [{"type": "http", "url": url,
                                            "timeout": held if name in HELD_HOOKS else 10}]}
        if name in TOOL_HOOKS:
            entry = {"matcher": "*", **entry}
        hooks[name] = [entry]
    return {"hooks": hooks}


FACTORY = Factory(
    kind=Kind.RECEIVER,
    type="claude_code",
    config_class=ClaudeCodeConfig,
    create=lambda settings, cfg, next_consumer: HookServer(settings, cfg, next_consumer,
                                                           ClaudeCodeSurface(cfg)),
    description="Claude Code native http hooks (POST /hook) on 127.0.0.1:8377",
)


