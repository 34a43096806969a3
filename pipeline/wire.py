"""The one place events become bytes, so a re-sent event is byte-identical to the first send."""

from __future__ import annotations

import json
from typing import Any


def dumps(event: dict[str, Any]) -> str:
    """Compact JSON, UTF-8 left unescaped; the JSONL line and the WebSocket frame of an event."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"))
