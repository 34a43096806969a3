"""``aep-collector hooks opencode|kilocode|pi|cline|hermes``: what each vendor's own side needs.

OpenCode, Kilo and pi discover a plugin or extension by its folder: the registration is the
shipped JavaScript file itself (``js/``), with the receiver's URL as its built-in default, copied
into that folder. Cline runs one executable file per event, each the shared shim's command;
Hermes takes the shim's commands in its ``config.yaml``. ``aep_collector.receivers.wiring`` prints or installs
what these return.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from aep_collector.receivers.registration import declaration, hold_wait, hook_url, shim_command
from aep_collector.receivers.wiring import Target, Wiring

JS_DIR = Path(__file__).resolve().parent / "js"
JS_FILES = {"opencode": "opencode-plugin.js", "kilocode": "kilocode-plugin.js", "pi": "pi-extension.js"}
DEFAULT_ATTENTION = 55.0
HOLD_MARGIN = 10.0
"""Seconds a plugin's held request outlives the collector's hold, so the collector always answers first."""
DEFAULT_HOLD_MS = int((DEFAULT_ATTENTION + HOLD_MARGIN) * 1000)
"""The plugins' built-in hold bound (``holdMs`` in their DEFAULTS)."""

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
    return hook_url(url, getattr(cfg, "endpoint", None) or declaration(vendor).endpoint)


def hold_ms(cfg: Any) -> int:
    """The plugin's bound on a held request: the collector's attention window plus a margin."""
    return int((getattr(cfg, "attention_timeout", DEFAULT_ATTENTION) + HOLD_MARGIN) * 1000)


def plugin_text(vendor: str, url: str) -> str:
    """The shipped file with ``url`` as its built-in default, so the installed copy needs no environment."""
    text = js_path(vendor).read_text(encoding="utf-8")
    return text.replace(f"url: {json.dumps(default_url(vendor))}", f"url: {json.dumps(url)}", 1)  # DEFAULTS


def default_url(vendor: str) -> str:
    return f"http://{declaration(vendor).endpoint}/hook"


def env_prefix(vendor: str) -> str:
    """The prefix of the environment variables a plugin file reads (``AEP_OPENCODE_URL``, ...)."""
    return "AEP_" + vendor.upper().replace("-", "_") + "_"


def _plugin(vendor: str, path: str, base: str, where: str) -> Any:
    """A plugin or extension file the host discovers by its folder: the file itself is the registration."""

    def render(url: str, cfg: Any) -> Wiring:
        text = plugin_text(vendor, url)
        advice = [f"save as {where}, or run: aep-collector hooks {vendor} --install"]
        if url != default_url(vendor) and f"url: {json.dumps(url)}" not in text:
            advice.append(f"set {env_prefix(vendor)}URL={url} in the agent's environment")
        if hold_ms(cfg) != DEFAULT_HOLD_MS:
            advice.append(f"set {env_prefix(vendor)}HOLD_MS={hold_ms(cfg)} in the agent's environment "
                          "(above the receiver's attention_timeout)")
        if vendor == "pi":
            advice.append("AEP_PI_CONTROL=1 registers the tool_call gate (the receiver needs control: true as "
                          "well); AEP_PI_DELTAS=1 forwards stream updates (mapped with deltas: true)")
        return Wiring(vendor, [Target(path, "file", text, base=base)], advice)

    return render


def _cline(url: str, cfg: Any) -> Wiring:
    command = shim_command("cline", url=url, posix=True)  # the hook file is a /bin/sh script
    script = f"#!/bin/sh\nexec {command}\n"
    targets = [Target(f".cline/hooks/{name}", "file", script, mode=0o755) for name in CLINE_HOOK_FILES]
    return Wiring("cline", targets, [
        f"save as ~/.cline/hooks/EVENT (executable) for each EVENT in {' '.join(CLINE_HOOK_FILES)} "
        "(or .cline/hooks/ in a project), or run: aep-collector hooks cline --install"])


def _hermes(url: str, cfg: Any) -> Wiring:
    attention = getattr(cfg, "attention_timeout", DEFAULT_ATTENTION)
    held_wait = hold_wait(attention)  # what the shim waits for a held pre_tool_call
    held_timeout = min(HERMES_MAX_TIMEOUT, int(held_wait) + 25)  # the vendor kills the hook after this
    hooks: dict[str, Any] = {}
    for hook in HERMES_HOOKS:
        held = hook == "pre_tool_call"
        command = shim_command("hermes", url=url, wait=held_wait if held else None)
        hooks[hook] = [{"command": command, "timeout": held_timeout if held else HERMES_SHORT_TIMEOUT}]
    text = yaml.safe_dump({"hooks": hooks}, sort_keys=False, width=1 << 16)
    advice = ["merge into ~/.hermes/config.yaml, or run: aep-collector hooks hermes --install",
              "Hermes asks once per (event, command) before running a hook: approve at the prompt, start it "
              "with --accept-hooks, or set hooks_auto_accept: true in ~/.hermes/config.yaml",
              "pre_tool_call may be held by the opt-in gate (receiver control: true), so its timeout is above "
              "the hold window"]
    if held_timeout < held_wait + 5:
        advice.append(f"warning: attention_timeout {attention:g}s leaves no margin under Hermes' "
                      f"{HERMES_MAX_TIMEOUT}s hook limit")
    return Wiring("hermes", [Target("config.yaml", "yaml", text, {"hooks": hooks},
                                    base="HERMES_HOME:.hermes")], advice)


# OpenCode and Kilo discover plugins in <config>/plugins/ (XDG_CONFIG_HOME, default ~/.config);
# pi 0.73.1 discovers *.ts and *.js in <agent dir>/extensions/ (PI_CODING_AGENT_DIR, default ~/.pi/agent).
RENDER = {
    "opencode": _plugin("opencode", "opencode/plugins/aep-collector.js", "XDG_CONFIG_HOME:.config",
                        "~/.config/opencode/plugins/aep-collector.js (or .opencode/plugins/ in a project)"),
    "kilocode": _plugin("kilocode", "kilo/plugins/aep-collector.js", "XDG_CONFIG_HOME:.config",
                        "~/.config/kilo/plugins/aep-collector.js (or .kilo/plugins/ in a project)"),
    "pi": _plugin("pi", "extensions/aep-collector.js", "PI_CODING_AGENT_DIR:.pi/agent",
                  "~/.pi/agent/extensions/aep-collector.js (or .pi/extensions/ in a project)"),
    "cline": _cline,
    "hermes": _hermes,
}


def renderer(vendor: str) -> Any:
    """The ``registration`` of ``vendor``'s declaration: ``(url, cfg) -> Wiring``."""
    return lambda url, cfg: render(vendor, url, cfg)


def render(vendor: str, url: str | None, cfg: Any) -> Wiring:
    """The registration of ``vendor`` (``opencode``, ``kilocode``, ``pi``, ``cline``, ``hermes``)."""
    return RENDER[vendor](receiver_url(vendor, url, cfg), cfg)
