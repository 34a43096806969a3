"""``aep-collector hooks opencode|kilocode|pi|cline|hermes``: what each vendor's own side needs.

The JavaScript halves ship in ``js/`` and are used in place or copied; the printed text names the
absolute path of the installed file, the command or config entry that loads it, and the settings
that differ from the plugin's defaults. Cline and Hermes run the shared shim (``pipeline/shim.py``)
as their hook command. Nothing here writes a file: the output is meant to be read, then pasted or
run (``aep-collector hooks cline | sh`` creates the hook files, for instance).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from receivers.registration import hold_wait, hook_url, shim_command

JS_DIR = Path(__file__).resolve().parent / "js"
JS_FILES = {"opencode": "opencode-plugin.js", "kilocode": "kilocode-plugin.js", "pi": "pi-extension.js"}
PORTS = {"opencode": 8390, "kilocode": 8391, "cline": 8392, "hermes": 8393, "pi": 8396}
DEFAULT_ATTENTION = 55.0
HOLD_MARGIN = 10.0
"""Seconds a plugin's held request outlives the collector's hold, so the collector always answers first."""

# Cline hook files by the names its loader maps to typed events (cline/cline sdk/packages/core/src/
# hooks/hook-file-config.ts HOOK_CONFIG_FILE_EVENT_MAP); PreCompact maps to no event there: not installed.
CLINE_HOOK_FILES = ("TaskStart", "TaskResume", "TaskCancel", "TaskComplete", "TaskError", "PreToolUse",
                    "PostToolUse", "UserPromptSubmit", "SessionShutdown")
# The twelve Hermes hooks the mapping reads (reference stack §1.10).
HERMES_HOOKS = ("on_session_start", "pre_llm_call", "pre_tool_call", "post_tool_call", "pre_approval_request",
                "post_approval_response", "on_session_end", "on_session_finalize", "on_session_reset",
                "subagent_start", "subagent_stop", "api_request_error")
HERMES_MAX_TIMEOUT = 300  # agent/shell_hooks.py MAX_TIMEOUT_SECONDS: larger values are clamped
HERMES_SHORT_TIMEOUT = 10  # above the shim's wait for a hook that is never held


def js_path(vendor: str) -> Path:
    """The installed vendor-side file for ``vendor``."""
    return JS_DIR / JS_FILES[vendor]


def receiver_url(vendor: str, url: str | None, cfg: Any) -> str:
    """The receiver's ``/hook`` URL: ``--url``, else the config's endpoint, else the reference port."""
    return hook_url(url, getattr(cfg, "endpoint", None) or f"127.0.0.1:{PORTS[vendor]}")


def hold_ms(cfg: Any) -> int:
    """The plugin's bound on a held request: the collector's attention window plus a margin."""
    return int((getattr(cfg, "attention_timeout", DEFAULT_ATTENTION) + HOLD_MARGIN) * 1000)


def _opencode(url: str, cfg: Any) -> str:
    src = js_path("opencode")
    lines = [
        "# OpenCode loads every file in .opencode/plugins/ (project) or ~/.config/opencode/plugins/ (global).",
        "# Copy the plugin there (or symlink it to follow upgrades of aep-collector):",
        "mkdir -p .opencode/plugins",
        f"cp {shlex.quote(str(src))} .opencode/plugins/aep-collector.js",
        "#",
        "# The plugin reads its settings from OpenCode's environment:",
        f"export AEP_OPENCODE_URL={shlex.quote(url)}",
        f"export AEP_OPENCODE_HOLD_MS={hold_ms(cfg)}  # above the receiver's attention_timeout",
    ]
    return "\n".join(lines)


def _kilocode(url: str, cfg: Any) -> str:
    entry = [js_path("kilocode").as_uri(), {"url": url, "holdMs": hold_ms(cfg)}]
    block = {"plugin": [entry]}
    return ("// Merge into .kilo/kilo.jsonc (project) or ~/.config/kilo/kilo.jsonc (global); keep any\n"
            "// plugins already listed. Options: url, holdMs (above the receiver's attention_timeout),\n"
            "// timeoutMs, retryMs, maxBodyBytes.\n" + json.dumps(block, indent=2))


def _pi(url: str, cfg: Any) -> str:
    path = str(js_path("pi"))
    lines = [
        "// pi loads a .js extension only by explicit path: add it to the \"extensions\" array of pi's",
        "// settings.json (~/.pi/agent/settings.json, or .pi/settings.json in a project):",
        json.dumps({"extensions": [path]}, indent=2),
        f"// or run it once: pi -e {shlex.quote(path)}",
        "//",
        "// The extension reads its settings from pi's environment:",
        f"//   AEP_PI_URL={url}",
        f"//   AEP_PI_HOLD_MS={hold_ms(cfg)}   (above the receiver's attention_timeout)",
        "//   AEP_PI_CONTROL=1   registers the tool_call gate (the receiver needs control: true as well)",
        "//   AEP_PI_DELTAS=1    forwards stream updates; the receiver maps them with deltas: true",
    ]
    return "\n".join(lines)


def _cline(url: str, cfg: Any) -> str:
    command = shim_command("cline", url=url, posix=True)  # the hook file is a /bin/sh script
    script = f"#!/bin/sh\nexec {command}\n"
    lines = [
        "# Cline runs one hook file per event from .cline/hooks/ (project) or ~/.cline/hooks/ (global).",
        "# Run this in the project (or pipe it to sh) to create them:",
        "mkdir -p .cline/hooks",
        f"for hook in {' '.join(CLINE_HOOK_FILES)}; do",
        f"  printf '%s' {shlex.quote(script)} > .cline/hooks/$hook",
        "  chmod +x .cline/hooks/$hook",
        "done",
    ]
    return "\n".join(lines)


def _hermes(url: str, cfg: Any) -> str:
    attention = getattr(cfg, "attention_timeout", DEFAULT_ATTENTION)
    held_wait = hold_wait(attention)  # what the shim waits for a held pre_tool_call
    held_timeout = min(HERMES_MAX_TIMEOUT, int(held_wait) + 25)  # the vendor kills the hook after this
    out = ["# Merge into ~/.hermes/config.yaml. Hermes asks once per (event, command) before running a",
           "# hook: approve at the prompt, or start it with --accept-hooks. pre_tool_call may be held",
           "# by the opt-in gate (receiver control: true), so its timeout is above the hold window.",
           "hooks:"]
    for hook in HERMES_HOOKS:
        held = hook == "pre_tool_call"
        command = shim_command("hermes", url=url, wait=held_wait if held else None)
        out += [f"  {hook}:", f"    - command: {json.dumps(command)}",
                f"      timeout: {held_timeout if held else HERMES_SHORT_TIMEOUT}"]
    if held_timeout < held_wait + 5:
        out.append(f"# warning: attention_timeout {attention:g}s leaves no margin under Hermes' "
                   f"{HERMES_MAX_TIMEOUT}s hook limit")
    return "\n".join(out)


RENDER = {"opencode": _opencode, "kilocode": _kilocode, "pi": _pi, "cline": _cline, "hermes": _hermes}


def render(vendor: str, url: str | None, cfg: Any) -> str:
    """The vendor-side text for ``vendor`` (``opencode``, ``kilocode``, ``pi``, ``cline``, ``hermes``)."""
    return RENDER[vendor](receiver_url(vendor, url, cfg), cfg)
