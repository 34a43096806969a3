"""What the Claude-Code-shaped hook vendors get back for a held ``PermissionRequest``.

Claude Code, Codex and Qwen Code read the same decision body (their receivers build it here):

* Claude Code hooks reference (code.claude.com/docs/en/hooks, "PermissionRequest decision control");
* Codex ``PermissionRequestHookSpecificOutputWire`` (openai/codex ``codex-rs/hooks``):
  ``updatedInput`` / ``updatedPermissions`` / ``interrupt`` are reserved there and fail closed, so
  never sent to Codex;
* Qwen Code hooks docs (PermissionRequest "Output Options"): ``hookSpecificOutput`` must name
  ``hookEventName``; ``updatedInput`` / ``updatedPermissions`` / ``interrupt`` stay unused.
"""

from __future__ import annotations

from typing import Any


def permission_reply(behavior: str, message: str | None = None) -> dict[str, Any]:
    """``{"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {behavior, message?}}}``."""
    if behavior not in ("allow", "deny"):
        raise ValueError(f"permission behavior must be 'allow' or 'deny', not {behavior!r}")
    decision: dict[str, Any] = {"behavior": behavior}
    if behavior == "deny" and message:  # the vendors read `message` as the deny reason only
        decision["message"] = message
    return {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}}
