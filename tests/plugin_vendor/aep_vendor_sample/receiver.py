"""The ``quill`` receiver, and the one declaration of the Quill vendor.

Quill runs ``aep-collector-hook quill EVENT`` per hook firing with ``{"event", "session", ...}``
on stdin; the shim POSTs it here. Every reply is ``{"proceed": true}``, which is also what the
shim prints when the collector is down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aep_collector.api import (
    HookReceiverConfig,
    Signal,
    VendorDeclaration,
    Wiring,
    hook_signal,
    hook_url,
    json_target,
    shim_command,
)

AGENT = "quill"
HOOKS = ("begin", "ask", "done", "end")
NEUTRAL_REPLY: dict[str, Any] = {"proceed": True}


@dataclass
class QuillConfig(HookReceiverConfig):
    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)


class QuillSurface:
    """Quill's side of the shared hook server: name the moment, deliver it, reply neutrally."""

    agent = AGENT

    def __init__(self, config: QuillConfig, component: str) -> None:
        self.config = config

    def signal(self, payload: dict[str, Any], request: Any) -> Signal:
        return hook_signal(AGENT, payload, "event", request)  # a 400 when neither names the hook

    def neutral(self, signal: Signal | None) -> Any:
        return NEUTRAL_REPLY

    async def handle(self, signal: Signal, deliver: Any) -> Any:
        await deliver([signal])
        return NEUTRAL_REPLY


def registration(url: str | None, cfg: Any) -> Wiring:
    """``~/.quill/hooks.json``: one shim command per hook."""
    target = hook_url(url, cfg.endpoint if cfg is not None else DECLARATION.endpoint)
    hooks = {name: shim_command(AGENT, name, target) for name in HOOKS}
    return Wiring(AGENT, [json_target(".quill/hooks.json", {"hooks": hooks})], [
        "merge into ~/.quill/hooks.json, or run: aep-collector hooks quill --install"])


DECLARATION = VendorDeclaration(
    agent=AGENT, receiver_type="quill", port=8499, config_class=QuillConfig, surface=QuillSurface,
    mapping="aep_vendor_sample.mapping", registration=registration, hooks=HOOKS, neutral_reply=NEUTRAL_REPLY,
    description="Quill command hooks via aep-collector-hook (POST /hook) on 127.0.0.1:8499",
)
FACTORY = DECLARATION.factory()
