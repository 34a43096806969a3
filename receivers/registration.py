"""``aep-collector hooks VENDOR``: each vendor's registration (``aep_collector.receivers.wiring.Wiring``).

Also the pieces every vendor's registration is rendered from: the shim's copy in ``~/.aep/bin``,
the command line that runs it, and its waits.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from aep_collector.pipeline import shim
from aep_collector.pipeline.component import Kind

HELD_WAIT_MARGIN = 5.0
"""Seconds the shim waits on a held hook beyond the hold window (``aep_collector.pipeline.shim.VENDORS[...].wait``)."""


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
    code = f"import sys;sys.path[:0]=[{json.dumps(root)}];import aep_collector.pipeline.shim as s;sys.exit(s.main())"
    parts = [sys.executable, "-S", "-I", "-c", code, vendor]
    if event:
        parts.append(event)
    default = f"http://127.0.0.1:{shim.VENDORS[vendor].port}"
    if url and url.rstrip("/") not in (default, default + "/hook"):
        parts += ["--url", url]
    if wait is not None:
        parts += ["--wait", f"{wait:g}"]
    return parts


HOOK_FILE = "aep_collector_hook.py"
"""The shim's stable copy, in ``<hook dir>/bin``: registered commands name it, never the checkout."""
_HOME: ContextVar[Path | None] = ContextVar("aep_hook_home", default=None)


def hook_dir() -> Path:
    """Where the shim copy and the install records live: ``<--home>/.aep``, else ``$AEP_HOOK_DIR``, else ``~/.aep``."""
    home = _HOME.get()
    if home is not None:
        return home / ".aep"
    env = os.environ.get("AEP_HOOK_DIR")
    return Path(env) if env else Path.home() / ".aep"


@contextmanager
def using_home(home: Path | None) -> Iterator[None]:
    """Render and install as if ``home`` were the user's home (``hooks --home DIR``)."""
    token = _HOME.set(home)
    try:
        yield
    finally:
        _HOME.reset(token)


def ensure_shim() -> Path:
    """Copy the stdlib-only shim to ``<hook dir>/bin/aep_collector_hook.py`` (only when it differs).

    The copy outlives the checkout, the venv and ``pip install -e``: the registered command runs
    it with whichever Python 3 it finds, so no installation step can turn a hook into an error.
    """
    target = hook_dir() / "bin" / HOOK_FILE
    source = Path(shim.__file__).read_bytes()
    if not target.is_file() or target.read_bytes() != source:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(source)
        os.replace(tmp, target)
    return target


def pythons() -> list[str]:
    """Interpreters the hook command tries, in order: this one's base (a venv's own python dies with
    the venv; its base does not), then whatever ``python3`` is on the vendor's PATH."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return [os.path.realpath(base), "python3"] if base else ["python3"]


# POSIX sh: $1 the shim's folder, $2 the neutral reply, the rest the shim's arguments. Each
# interpreter that exists is tried; one that fails to start leaves stdin unread for the next; if
# none ran, stdin is drained (cat, else the read builtin: a vendor writing to a closed pipe may
# crash on EPIPE) and the neutral reply printed. Exit status 0 on every path.
_CHAIN = ('d=$1 n=$2; shift 2; for p in {pythons}; do '
          'if [ -r "$d/{file}" ] && command -v "$p" >/dev/null 2>&1; then '
          '"$p" -S -I -c "import sys;sys.path[:0]=[sys.argv.pop(1)];import {module} as s;sys.exit(s.main())" '
          '"$d" "$@" && exit 0; fi; done; cat >/dev/null 2>&1 || while IFS= read -r _; do :; done; '
          'printf %s "$n"; exit 0')


def shim_command(vendor: str, event: str | None = None, url: str | None = None, wait: float | None = None,
                 posix: bool = os.name != "nt") -> str:
    """The registered hook command: ``/bin/sh -c`` running the shim copy in ``<hook dir>/bin``.

    It survives a reinstall, ``pip install -e``, a moved checkout and a new venv (nothing of the
    checkout or venv is named), and it exits 0 with the vendor's neutral reply whatever is
    missing. One argv, so vendors that split it with shlex and run no shell (Hermes) run it too.
    Off POSIX: ``shim_argv`` for cmd.exe / PowerShell.
    """
    parts = shim_argv(vendor, event, url, wait)
    if not posix:
        return subprocess.list2cmdline(parts)
    chain = _CHAIN.format(pythons=" ".join(shlex.quote(p) for p in pythons()), file=HOOK_FILE,
                          module=HOOK_FILE[:-3])
    neutral = shim.neutral(shim.VENDORS.get(vendor), event).decode()
    argv = ["/bin/sh", "-c", chain, "aep-collector-hook", str(hook_dir() / "bin"), neutral, *parts[5:]]
    return " ".join(shlex.quote(p) for p in argv)


def _claude_code(url: str | None, cfg: Any) -> Any:
    from aep_collector.receivers.claude_code import COMMAND_HOOKS, settings_block
    from aep_collector.receivers.wiring import Wiring, json_target

    endpoint = cfg.endpoint if cfg is not None else "127.0.0.1:8377"
    timeout = cfg.attention_timeout if cfg is not None else 55.0
    target = hook_url(url, endpoint)
    # Moments Claude Code fires for command hooks only go through the shim, to the same receiver.
    commands = {name: shim_command("claude-code", url=target) for name in COMMAND_HOOKS}
    block = settings_block(target, timeout, commands)
    return Wiring("claude-code", [json_target(".claude/settings.json", block)], [
        "merge into ~/.claude/settings.json (or .claude/settings.json in a project), "
        "or run: aep-collector hooks claude-code --install"])


def _hook_vendor(module: str) -> Any:
    """A renderer for a hook-family vendor: ``aep_collector.receivers.hook_vendors.<module>.registration``, imported lazily."""

    def render_block(url: str | None, cfg: Any) -> str:
        import importlib

        return importlib.import_module(f"aep_collector.receivers.hook_vendors.{module}").registration(url, cfg)

    return render_block


def _plugin_vendor(vendor: str) -> Any:
    """A renderer for a plugin/shell-hook vendor: ``aep_collector.receivers.plugin_vendors.install``, imported lazily."""

    def render_block(url: str | None, cfg: Any) -> str:
        from aep_collector.receivers.plugin_vendors import install

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


def wiring(vendor: str, url: str | None = None, config_path: str | None = None, registry: Any = None) -> Any:
    """The ``aep_collector.receivers.wiring.Wiring`` for ``vendor``; with a config, endpoint and timeouts come from it.

    Copies the shim to ``<hook dir>/bin`` first: the commands it returns run that copy.
    """
    key = vendor.lower().replace("_", "-")
    if key not in RENDERERS:
        raise KeyError(f"unknown vendor {vendor!r} (known: {', '.join(sorted(RENDERERS))})")
    rtype, fn = RENDERERS[key]
    cfg = None
    if config_path is not None:
        from aep_collector.pipeline.config import load

        sc = load(config_path, registry)
        for _cid, (factory, ccfg) in sc.components(Kind.RECEIVER).items():
            if factory.type == rtype:
                cfg = ccfg
                break
        if cfg is None:
            raise ValueError(f"{config_path}: no {rtype} receiver is configured")
    ensure_shim()
    return fn(url, cfg)


def render(vendor: str, url: str | None = None, config_path: str | None = None, registry: Any = None) -> str:
    """What ``aep-collector hooks VENDOR`` prints: the content of the file the vendor reads."""
    return wiring(vendor, url, config_path, registry).text()
