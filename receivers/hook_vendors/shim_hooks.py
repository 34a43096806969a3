"""The shim-hook entries every hook-family registration writes: one hook's command line and its
vendor-side timeout, and the TOML string form of a command (``aep-collector hooks VENDOR``)."""

from __future__ import annotations

import json
from typing import Any

from aep_collector.receivers.hook_vendors.surface import vendor_timeout
from aep_collector.receivers.registration import declaration, hold_wait, mapped_hooks, shim_command

SHORT_TIMEOUT = 10
"""Seconds a vendor allows a hook that is never held (above the shim's ``SHORT_WAIT``)."""


def registered(vendor: str, url: str | None, cfg: Any,
               leave_out: frozenset[str] = frozenset()) -> list[tuple[str, str, int]]:
    """What a shim-driven registration wires: each hook the vendor's mapping maps (less
    ``leave_out``), in the table's order, with its shim command line and vendor-side timeout."""
    return [(name, *shim_hook(vendor, name, url, cfg)) for name in mapped_hooks(vendor, leave_out)]


def shim_hook(vendor: str, event: str, url: str | None, cfg: Any) -> tuple[str, int]:
    """One registered hook: the shim's command line and the vendor-side timeout (seconds).

    ``url`` (``--url``) or else the config's endpoint is passed on unless it is the shim's default.
    A hook the vendor's declaration holds: the shim waits past the hold window and the vendor's
    timeout leaves room above both.
    """
    if url is None and cfg is not None:
        url = f"http://{cfg.endpoint}"
    if hold_window(vendor, event, cfg) is None:
        return shim_command(vendor, event, url), SHORT_TIMEOUT
    return shim_command(vendor, event, url, held_wait(vendor, cfg)), hook_timeout(vendor, event, cfg)


def hold_window(vendor: str, event: str, cfg: Any) -> float | None:
    """Seconds ``event`` may be held (the config's ``attention_timeout``, else the default); ``None``
    for a hook the vendor's declaration never holds."""
    decl = declaration(vendor)
    if event not in decl.held_hooks:
        return None
    return float((cfg if cfg is not None else decl.config_class()).attention_timeout)


def hook_timeout(vendor: str, event: str, cfg: Any) -> int:
    """The vendor-side timeout of a registered hook: room above the hold window, else ``SHORT_TIMEOUT``."""
    hold = hold_window(vendor, event, cfg)
    return SHORT_TIMEOUT if hold is None else vendor_timeout(hold)


def toml_str(text: str) -> str:
    """A TOML basic string (JSON string escapes are a subset TOML accepts)."""
    return json.dumps(text, ensure_ascii=False)


def held_wait(vendor: str, cfg: Any) -> float | None:
    """``--wait`` for a held hook, only when the config's hold window moves it off the shim's default."""
    if cfg is None or not hasattr(cfg, "attention_timeout"):
        return None
    wait = hold_wait(cfg.attention_timeout)
    return None if wait == declaration(vendor).hold_wait else wait
