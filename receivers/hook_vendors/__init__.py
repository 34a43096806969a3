"""The hook-family receivers: Codex, Gemini CLI, Qwen Code, VS Code agent, Antigravity, Kimi Code.

One shared surface (``surface.py``) configured per vendor; see ``README.md`` for every key.
"""

from __future__ import annotations

from aep_collector.receivers.hook_vendors import antigravity, codex, gemini_cli, kimi_code, qwen_code, vscode

FACTORIES = [codex.FACTORY, gemini_cli.FACTORY, qwen_code.FACTORY, vscode.FACTORY, antigravity.FACTORY,
             kimi_code.FACTORY]
