"""The shim-hook entries every hook-family registration writes: one hook's command line and its
vendor-side timeout, and the TOML string form of a command (``aep-collector hooks VENDOR``)."""

from __future__ import annotations

import json
from typing import Any

from aep_collector.receivers.hook_vendors.surface import vendor_timeout
from aep_collector.receivers.registration import declaration, hold_wait, shim_command

SHORT_TIMEOUT = 10
"""Seconds a vendor allows a hook that is never held (above the shim's ``SHORT_WAIT``)."""


def shim_hook(vendor: str, event: str, url: str | None, cfg: Any, hold: float | None = None) -> tuple[str, int]:
    """One registered hook: the shim's command line and the vendor-side timeout (seconds).

    ``url`` (``--url``) or else the config's endpoint is passed on unless it is the shim's default.
    ``hold`` is the hold window of a hook the receiver may hold: the shim waits past it and the
    vendor's timeout leaves room above both; ``None`` for a hook that is never held.
    """
    if url is None and cfg is not None:
        url = f"http://{cfg.endpoint}"
    if hold is None:
        return shim_command(vendor, event, url), SHORT_TIMEOUT
    return shim_command(vendor, event, url, held_wait(vendor, cfg)), vendor_timeout(hold)


def toml_str(text: str) -> str:
    """A TOML basic string (JSON string escapes are a subset TOML accepts)."""
    return json.dumps(text, ensure_ascii=False)


def held_wait(vendor: str, cfg: Any) -> float | None:
    """``--wait`` for a held hook, only when the config's hold window moves it off the shim's default."""
    if cfg is None or not hasattr(cfg, "attention_timeout"):
        return None
    wait = hold_wait(cfg.attention_timeout)
    return None if wait == declaration(vendor).hold_wait else wait
