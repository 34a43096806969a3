"""Config of the ``relay_server`` exporter; its defaults are the default config."""

from __future__ import annotations

from dataclasses import dataclass

from aep_collector.pipeline.body import DEFAULT_BODY_TIMEOUT, validate_body_timeout


@dataclass
class RelayServerConfig:
    """The collector's own AEP relay role (AEP-0003 consumer side, AEP-0004 routing)."""

    endpoint: str = "127.0.0.1:8787"
    """host:port the relay role listens on (loopback by default)."""
    token: str | None = None
    """Bearer token consumers present; empty means: read (or create) ``token_file``."""
    token_file: str = ""
    """Where the token lives when ``token`` is empty; default ``<state_dir>/relay.token`` (mode 0600)."""
    buffer: int = 10000
    """Replay depth per session (oldest evicted first, with a ``replay-exhausted`` marker)."""
    max_sessions: int = 500
    """Sessions buffered at once; the least recently written one is dropped beyond it."""
    max_from: int = 500
    """Resume positions one subscription may name (``limit-exceeded`` / SSE 400 beyond)."""
    max_subscriptions: int = 64
    """Subscriptions one WebSocket connection may hold at once (``limit-exceeded`` beyond)."""
    max_body: int = 16 * 1024 * 1024
    """Bytes one ``POST /events`` may carry (413 beyond)."""
    max_batch: int = 10000
    """Events one NDJSON batch may carry (413 beyond, nothing ingested)."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds one ``POST /events`` body may take to arrive whole (408 beyond), as for the receivers."""
    soft_limit: int = 1024 * 1024
    """Bytes queued for one subscriber beyond which its debug/info events are shed."""
    hard_limit: int = 8 * 1024 * 1024
    """Bytes queued for one subscriber beyond which it is disconnected."""
    ping_interval: float = 25.0
    """Seconds between SSE ``: ping`` comments and WebSocket ``ping`` frames."""
    max_capture: str = "redacted"
    """Ceiling on every subscriber, whatever it asks: events above it (e.g. ``full`` events POSTed by
    another emitter) are down-levelled before they leave, so the role never serves more content
    than the collector's own gating would."""
    ack_window_ms: int = 10000
    """Declared for the collector's own agents in the roster (AEP-0004 §3)."""
    command_queue: int = 100
    """Commands from consumers waiting for the control router at once; one that finds this many
    waiting is answered ``control.rejected`` ``busy`` instead (AEP-0004 §3, §7)."""

    def __post_init__(self) -> None:
        if self.token is not None and not self.token.strip():
            self.token = None

    def listens(self) -> dict[str, str]:
        """Where it listens, by key (the config checks no two listeners share a port)."""
        return {"endpoint": self.endpoint}

    def validate(self) -> None:
        host, _, port = self.endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"endpoint must be host:port such as 127.0.0.1:8787, got {self.endpoint!r}")
        for name in ("buffer", "max_sessions", "max_from", "max_subscriptions", "max_body", "max_batch", "soft_limit", "ack_window_ms",
                     "command_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        validate_body_timeout(self.body_timeout)
        if self.hard_limit < self.soft_limit:
            raise ValueError("hard_limit must be at least soft_limit")
        if self.ping_interval <= 0:
            raise ValueError("ping_interval must be positive")
        if self.max_capture not in ("none", "metadata", "redacted", "full"):
            raise ValueError(f"max_capture must be none, metadata, redacted or full, got {self.max_capture!r}")
        if self.token is not None and len(self.token) < 8:
            raise ValueError("token must be at least 8 characters")
