"""Reading vendor JSON without crashing, and the AEP ``tool_ref`` it names.

Vendors send odd shapes; a wrong type reads as absent, never as an exception. Both sides of a
vendor use these: its receiver (what a hook names, what to hold) and its mapping (the drafts).
"""

from __future__ import annotations

from typing import Any


def get_str(obj: Any, key: str) -> str | None:
    """``obj[key]`` when obj is a dict and the value is a non-empty string, else None."""
    if isinstance(obj, dict):
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def get_dict(obj: Any, key: str) -> dict[str, Any]:
    """``obj[key]`` when it is a dict, else an empty dict (vendors send odd shapes; never crash)."""
    if isinstance(obj, dict):
        value = obj.get(key)
        if isinstance(value, dict):
            return value
    return {}


def tool_ref(name: str | None, call_id: str | None = None) -> dict[str, str]:
    """``tool_ref`` = ``{name, call_id?}``; a missing name becomes ``unknown`` (the field is required)."""
    ref = {"name": name or "unknown"}
    if call_id:
        ref["call_id"] = call_id
    return ref
