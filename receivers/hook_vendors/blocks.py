"""Pieces of the ``aep-collector hooks VENDOR`` registration blocks the hook-family vendors share."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline import shim
from receivers.hook_vendors.surface import hold_wait

SHORT_TIMEOUT = 10
"""Seconds a vendor allows a hook that is never held (above the shim's ``SHORT_WAIT``)."""


def receiver_url(vendor: str, url: str | None, cfg: Any) -> str | None:
    """The receiver URL the shim must be told about, or ``None`` when it is the vendor's default."""
    if url is None and cfg is not None:
        url = f"http://{cfg.endpoint}"
    default = f"http://127.0.0.1:{shim.VENDORS[vendor].port}"
    if url is None or url.rstrip("/") in (default, default + "/hook"):
        return None
    return url


def _quote(parts: list[str]) -> str:
    if os.name == "nt":  # cmd.exe / PowerShell command lines
        return subprocess.list2cmdline(parts)
    return " ".join(shlex.quote(p) for p in parts)


def shim_argv(vendor: str, event: str | None = None, url: str | None = None,
              wait: float | None = None) -> list[str]:
    """The hook command as argv: this interpreter, ``-S -I`` (no site, no environment), importing the shim.

    The shim needs only the standard library, so it runs without the venv's site machinery; it
    is imported (from its cached bytecode) rather than run as a file (compiled on every start),
    the fastest way to start it (``bench/bench_shim.py``). Absolute paths keep it independent of
    the vendor's PATH; ``aep-collector-hook VENDOR [EVENT]`` is the same program as a console script.
    """
    root = str(Path(shim.__file__).resolve().parent.parent)
    code = f"import sys;sys.path[:0]=[{json.dumps(root)}];import pipeline.shim as s;sys.exit(s.main())"
    parts = [sys.executable, "-S", "-I", "-c", code, vendor]
    if event:
        parts.append(event)
    if url:
        parts += ["--url", url]
    if wait is not None:
        parts += ["--wait", f"{wait:g}"]
    return parts


def shim_command(vendor: str, event: str | None = None, url: str | None = None,
                 wait: float | None = None) -> str:
    """``shim_argv`` as one command line for the vendor's shell."""
    return _quote(shim_argv(vendor, event, url, wait))


def toml_str(text: str) -> str:
    """A TOML basic string (JSON string escapes are a subset TOML accepts)."""
    return json.dumps(text, ensure_ascii=False)


def held_wait(vendor: str, cfg: Any) -> float | None:
    """``--wait`` for a held hook, only when the config's hold window moves it off the shim's default."""
    if cfg is None or not hasattr(cfg, "attention_timeout"):
        return None
    wait = hold_wait(cfg.attention_timeout)
    return None if wait == shim.VENDORS[vendor].wait else wait
