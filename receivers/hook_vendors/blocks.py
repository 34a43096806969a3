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


def shim_command(vendor: str, event: str | None = None, url: str | None = None,
                 wait: float | None = None) -> str:
    """The hook command: this interpreter running the shim as a file, ``-S -I`` (no site, no env).

    The shim needs only the standard library, so it runs without the venv's site machinery,
    the fastest way to start it (``bench/bench_shim.py``); absolute paths keep it independent of
    the vendor's PATH. ``aep-collector-hook VENDOR [EVENT]`` is the same program as a console script.
    """
    parts = [sys.executable, "-S", "-I", str(Path(shim.__file__).resolve()), vendor]
    if event:
        parts.append(event)
    if url:
        parts += ["--url", url]
    if wait is not None:
        parts += ["--wait", f"{wait:g}"]
    return _quote(parts)


def toml_str(text: str) -> str:
    """A TOML basic string (JSON string escapes are a subset TOML accepts)."""
    return json.dumps(text, ensure_ascii=False)


def held_wait(vendor: str, cfg: Any) -> float | None:
    """``--wait`` for a held hook, only when the config's hold window moves it off the shim's default."""
    if cfg is None or not hasattr(cfg, "attention_timeout"):
        return None
    wait = hold_wait(cfg.attention_timeout)
    return None if wait == shim.VENDORS[vendor].wait else wait
