"""The machine-readable summary line every benchmark prints last: ``RESULT {json}``.

``bench/run_all.py`` collects these lines from one run to print issue 16's verdicts and to write
the README performance table (``--markdown``); a human reads the tables above them.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "RESULT "


def emit(bench: str, **figures: Any) -> None:
    """Print one ``RESULT`` line naming the benchmark and its figures (JSON, one line)."""
    print(PREFIX + json.dumps({"bench": bench, **figures}, separators=(",", ":")), flush=True)


def parse(line: str) -> dict[str, Any] | None:
    """The figures of a ``RESULT`` line, or None for any other line."""
    if not line.startswith(PREFIX):
        return None
    try:
        value = json.loads(line[len(PREFIX):])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
