"""``aep-collector hooks VENDOR``: the block a vendor's own config needs to reach its receiver.

Also the pieces every vendor's block is rendered from: the shim's command line and its waits.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline import shim
from pipeline.component import Kind

HELD_WAIT_MARGIN = 5.0
"""Seconds the shim waits on a held hook beyond the hold window (``pipeline.shim.VENDORS[...].wait``)."""


def hold_wait(attention_timeout: float) -> float:
    """Seconds the command shim waits on a held hook: the receiver answers first."""
    return attention_timeout + HELD_WAIT_MARGIN


def hook_url(url: str | None, endpoint: str) -> str:
    """The receiver's ``/hook`` URL: ``url`` (``/hook`` appended when it names no path), else ``endpoint``'s."""
    url = (url or f"http://{endpoint}").rstrip("/")
    return url if url.endswith("/hook") else url + "/hook"


def shim_argv(vendor: str, event: str | None = None, url: str | None = None,
              wait: float | None = None) -> list[str]:
    """The hook command as argv: this interpreter, ``-S -I`` (no site, no environment), importing the shim.

    The shim needs only the standard library, so it runs without the venv's site machinery; it
    is imported (from its cached bytecode) rather than run as a file (compiled on every start),
    the fastest way to start it (``bench/bench_shim.py``). Absolute paths keep it independent of
    the vendor's PATH; ``aep-collector-hook VENDOR [EVENT]`` is the same program as a console script.
    ``--url`` is left out when ``url`` is the shim's own default for ``vendor``.
    """
    root = str(Path(shim.__file__).resolve().parent.parent)
    code = f"import sys;sys.path[:0]=[{json.dumps(root)}];import pipeline.shim as s;sys.exit(s.main())"
    parts = [sys.executable, "-S", "-I", "-c", code, vendor]
    if event:
        parts.append(event)
    default = f"http://127.0.0.1:{shim.VENDORS[vendor].port}"
    if url and url.rstrip("/") not in (default, default + "/hook"):
        parts += ["--url", url]
    if wait is not None:
        parts += ["--wait", f"{wait:g}"]
    return parts


def shim_command(vendor: str, event: str | None = None, url: str | None = None, wait: float | None = None,
                 posix: bool = os.name != "nt") -> str:
    """``shim_argv`` as one command line: for a POSIX shell, else for cmd.exe / PowerShell."""
    parts = shim_argv(vendor, event, url, wait)
    return " ".join(shlex.quote(p) for p in parts) if posix else subprocess.list2cmdline(parts)


def _claude_code(url: str | None, cfg: Any) -> str:
    from receivers.claude_code import settings_block

    endpoint = cfg.endpoint if cfg is not None else "127.0.0.1:8377"
    timeout = cfg.attention_timeout if cfg is not None else 55.0
    block = settings_block(url or f"http://{endpoint}/hook", timeout)
    return ("// Merge into ~/.claude/settings.json (or .claude/settings.json in a project):\n"
            + json.dumps(block, indent=2))


def _hook_vendor(module: str) -> Any:
    """A renderer for a hook-family vendor: ``receivers.hook_vendors.<module>.registration``, imported lazily."""

    def render_block(url: str | None, cfg: Any) -> str:
        import importlib

        return importlib.import_module(f"receivers.hook_vendors.{module}").registration(url, cfg)

    return render_block


def _plugin_vendor(vendor: str) -> Any:
    """A renderer for a plugin/shell-hook vendor: ``receivers.plugin_vendors.install``, imported lazily."""

    def render_block(url: str | None, cfg: Any) -> str:
        from receivers.plugin_vendors import install

        return install.render(vendor, url, cfg)

    return render_block


# vendor name (as typed by users) -> (receiver type, renderer). Other vendors register here.
RENDERERS: dict[str, tuple[str, Any]] = {
    "claude-code": ("claude_code", _claude_code),
    "codex": ("codex", _hook_vendor("codex")),
    "gemini-cli": ("gemini_cli", _hook_vendor("gemini_cli")),
    "qwen-code": ("qwen_code", _hook_vendor("qwen_code")),
    "vscode": ("vscode", _hook_vendor("vscode")),
    "antigravity": ("antigravity", _hook_vendor("antigravity")),
    "kimi-code": ("kimi_code", _hook_vendor("kimi_code")),
    "opencode": ("opencode", _plugin_vendor("opencode")),
    "kilocode": ("kilocode", _plugin_vendor("kilocode")),
    "cline": ("cline", _plugin_vendor("cline")),
    "hermes": ("hermes", _plugin_vendor("hermes")),
    "pi": ("pi", _plugin_vendor("pi")),
}


def render(vendor: str, url: str | None = None, config_path: str | None = None, registry: Any = None) -> str:
    """The registration text for ``vendor``; with a config, endpoint and timeouts come from it."""
    key = vendor.lower().replace("_", "-")
    if key not in RENDERERS:
        raise KeyError(f"unknown vendor {vendor!r} (known: {', '.join(sorted(RENDERERS))})")
    rtype, fn = RENDERERS[key]
    cfg = None
    if config_path is not None:
        from pipeline.config import load

        sc = load(config_path, registry)
        for _cid, (factory, ccfg) in sc.components(Kind.RECEIVER).items():
            if factory.type == rtype:
                cfg = ccfg
                break
        if cfg is None:
            raise ValueError(f"{config_path}: no {rtype} receiver is configured")
    return fn(url, cfg)
