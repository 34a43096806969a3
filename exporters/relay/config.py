"""Config of the ``relay`` exporter; its defaults are the default config."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from aep_collector.pipeline.sending_queue import shown_url

from .outbox import Overflow


@dataclass
class RelayConfig:
    """Config of the ``relay`` exporter (AEP-0003 §3.5 WebSocket binding, emitter role)."""

    endpoint: str = "ws://127.0.0.1:8787/socket"
    """The relay's WebSocket URL, ``ws://`` or ``wss://``; an empty path means ``/socket``.
    Empty: the exporter is off (the default config sets it only when ``AEP_RELAY_URL`` is set)."""
    token: str | None = None
    """Bearer token sent as ``Authorization: Bearer <token>``; empty means none."""
    outbox_size: int = 10000
    """Events held per agent connection while it is down or before its hello completes."""
    overflow: Overflow = "drop_oldest"
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    connect_timeout: float = 5.0
    hello_timeout: float = 5.0
    """Wait for the relay's hello; also bounds the wait for the answer to a delivery-confirming ping."""
    ping_interval: float = 25.0
    ack_window_ms: int = 10000
    """Declared in the hello's control block (AEP-0004 §3): how long a sender waits for our ack."""
    command_queue: int = 100
    """Inbound commands held per agent connection while the control router is busy with an earlier
    one; one that finds it full is answered ``control.rejected`` ``busy`` instead of waiting."""
    instance: str | None = None
    """``identity.instance`` of every hello; default ``<hostname>/<pid>``."""

    def __post_init__(self) -> None:
        # ``${env:AEP_TOKEN:-}`` yields "" when the variable is unset: that means no token. A token
        # never has surrounding blanks; a YAML block scalar or a pasted file adds a newline.
        if self.token is not None:
            self.token = self.token.strip() or None
        if self.instance is not None and not self.instance.strip():
            self.instance = None

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint.strip())

    def validate(self) -> None:
        if not self.enabled:
            return
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("ws", "wss"):
            raise ValueError(f"endpoint must be a ws:// or wss:// URL such as ws://127.0.0.1:8787/socket, "
                             f"got {self.endpoint!r}")
        if not parts.hostname:
            raise ValueError(f"endpoint {self.endpoint!r} names no host")
        try:
            parts.port  # noqa: B018 -- urlsplit checks the port only when asked
        except ValueError:
            raise ValueError(f"endpoint {self.endpoint!r} has an invalid port") from None
        if self.token is not None and not all("!" <= c <= "~" for c in self.token):
            # Never echoed: the upgrade would fail with the whole header (token included) in its message.
            raise ValueError("token must be printable ASCII without spaces or control characters "
                             "(it goes in an Authorization header)")
        if self.overflow not in ("drop_oldest", "drop_newest"):
            raise ValueError(f"overflow must be 'drop_oldest' or 'drop_newest', got {self.overflow!r}")
        if self.outbox_size < 1:
            raise ValueError("outbox_size must be at least 1")
        if self.backoff_initial <= 0 or self.backoff_max < self.backoff_initial:
            raise ValueError("backoff_initial must be positive and backoff_max at least backoff_initial")
        for name in ("connect_timeout", "hello_timeout", "ping_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.ack_window_ms < 1:
            raise ValueError("ack_window_ms must be at least 1")
        if self.command_queue < 1:
            raise ValueError("command_queue must be at least 1")

    @property
    def shown(self) -> str:
        """``url`` as logs and ``/healthz`` show it: without user info and query, where a password or
        an ``access_token`` would be (AEP-0003 §8.1: a query-string token MUST NOT be logged)."""
        return shown_url(self.url)

    def scrub(self, text: str) -> str:
        """``text`` (an error message) with the configured URL in it replaced by ``shown``."""
        for raw in (self.endpoint, self.url):
            text = text.replace(raw, self.shown)
        return text

    @property
    def url(self) -> str:
        """The URL connected to: ``endpoint`` with ``/socket`` when it names no path."""
        parts = urlsplit(self.endpoint)
        if parts.path in ("", "/"):
            parts = parts._replace(path="/socket")
        return urlunsplit(parts)
