"""The one place events become bytes, so a re-sent event is byte-identical to the first send."""

from __future__ import annotations

import json
import re
from typing import Any

# Characters str.splitlines() and some JSONL readers treat as line breaks; JSON lets us escape
# them, so one event is always exactly one line for every reader.
_LINE_BREAKS = re.compile("[\u0085\u2028\u2029\x1c\x1d\x1e\x0b\x0c]")


def dumps(event: dict[str, Any]) -> str:
    """Compact JSON, UTF-8 left unescaped except line-breaking characters; the JSONL line and the
    WebSocket frame of an event."""
    text = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    if _LINE_BREAKS.search(text):
        text = _LINE_BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text
