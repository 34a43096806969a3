"""A plug-in-style mapping whose output is not always a list of drafts (the signal's name picks the
shape). ``tests/test_mapping_ownership.py`` holds the processor to counting each odd one as a
mapping failure, with an ``error.raised`` in its place, rather than raising out of the pipeline."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

AGENT = "odd-output"


def new_state() -> None:
    return None


def _drafts() -> Iterator[dict[str, Any]]:
    yield {"type": "progress.note", "session": "s1", "data": {"note": "generated"}}


def map_signal(signal: Any, state: None) -> Any:
    return {
        "None": None,
        "Generator": _drafts(),
        "Strings": ["progress.note"],
        "Lists": [["progress.note"]],
        "Sets": [{"progress.note"}],
        "Dict": {"type": "progress.note", "session": "s1", "data": {}},
    }[signal.name]
