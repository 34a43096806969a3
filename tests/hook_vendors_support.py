"""What the hook-family control tests share: each receiver type's agent, and the control posture
each declares (``control.accepts``: exactly the gates that are on; ``None``: no control block)."""

from __future__ import annotations

import pytest
from aep_collector.pipeline.control import RESPOND

AGENTS = {"codex": "codex", "qwen_code": "qwen-code", "vscode": "vscode", "kimi_code": "kimi-code",
          "gemini_cli": "gemini-cli", "antigravity": "antigravity"}

POSTURES = [
    pytest.param("codex", {}, [RESPOND], id="codex"),
    pytest.param("qwen_code", {}, [RESPOND], id="qwen"),
    pytest.param("vscode", {}, [], id="vscode-off"),
    pytest.param("vscode", {"control": True}, [RESPOND], id="vscode-on"),
    pytest.param("kimi_code", {}, [], id="kimi-off"),
    pytest.param("kimi_code", {"control": True}, [RESPOND], id="kimi-on"),
    pytest.param("gemini_cli", {}, None, id="gemini"),
    pytest.param("antigravity", {}, None, id="antigravity"),
]
"""(receiver type, receiver config, the ``control.accepts`` it declares)."""
