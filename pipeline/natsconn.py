"""What the ``nats`` exporter (edge) and ``nats`` receiver (gateway) agree on: connection and
stream settings, subject naming and the message headers of the fleet protocol.

Wire protocol (one JetStream stream, core NATS request/reply for control):

- every event is one message on ``<prefix>.<agent>.<session>`` (tokens escaped by ``token``;
  agent-scoped events use the session token ``~``), its body the event's wire bytes
  (``aep_collector.pipeline.wire``), header ``Nats-Msg-Id`` = the event id so JetStream drops a resend within
  its duplicate window;
- a collector that serves control adds ``Aep-Control`` (its per-collector request subject) and
  ``Aep-Accepts`` (the command types the event's agent honours there) to every event: that is how
  a gateway learns which collector holds which session;
- a command goes to that subject as a request with header ``Aep-Agent`` (the target agent); the
  reply body is the ack events the collector's control router recorded for it, one per line,
  byte-identical on every retransmission (empty while a first copy is still being decided).
- a request with header ``Aep-Probe`` (no command) is answered empty at once: a gateway asks it of
  the collectors claiming one session, and "no responders" tells it which of them is gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

CONTROL_HEADER = "Aep-Control"
ACCEPTS_HEADER = "Aep-Accepts"
AGENT_HEADER = "Aep-Agent"
ERROR_HEADER = "Aep-Error"
MSG_ID_HEADER = "Nats-Msg-Id"
PROBE_HEADER = "Aep-Probe"
"""On a request to a control subject instead of a command: is anyone still answering there?"""
NO_SESSION = "~"
CONNECTING = "connecting"
"""Health cause a component shows from its start until its first connection is up: a client whose
first attempt is still in flight (a host that drops packets holds it for ``connect_timeout``)
has reached nothing yet, so ``/healthz`` must not read ok meanwhile."""

log = logging.getLogger("aep.nats")

# Subject tokens: NATS separates on '.', treats '*' and '>' as wildcards and whitespace as a
# protocol delimiter. Only this set passes through; every other byte becomes '~XX' (and '~'
# itself is escaped), so distinct names always give distinct tokens and none can inject.
_SAFE = re.compile(r"[A-Za-z0-9_-]+")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def token(name: str) -> str:
    """``name`` as one safe subject token (reversible; the empty name is ``~``)."""
    if not name:
        return NO_SESSION
    if _SAFE.fullmatch(name):
        return name
    return _UNSAFE.sub(lambda m: "".join(f"~{b:02X}" for b in m.group().encode("utf-8")), name)


def event_subject(prefix: str, agent: str, session: str | None) -> str:
    return f"{prefix}.{token(agent)}.{token(session) if session else NO_SESSION}"


async def answered(nc: Any, subject: str, timeout: float) -> bool | None:
    """Whether a collector answers on the control ``subject`` (a request with ``PROBE_HEADER``):
    True if one replied, False if NATS said no responders, None if nothing can be told (a timeout,
    a reconnect): a slow collector, or one gone that NATS has not noticed yet."""
    from nats.errors import NoRespondersError

    try:
        await nc.request(subject, b"", timeout=timeout, headers={PROBE_HEADER: "1"})
    except NoRespondersError:
        return False
    except Exception:
        return None
    return True


def default_collector(state_dir: Path) -> str:
    """A collector name stable across restarts and distinct per state directory on one host."""
    digest = hashlib.sha256(str(state_dir.expanduser().resolve()).encode()).hexdigest()[:8]
    return f"{socket.gethostname()}-{digest}"


@dataclass
class NatsConnection:
    """Where and how to connect: servers, TLS and one of token, user/password, NKey or creds."""

    servers: list[str] = field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    name: str | None = None
    """Connection name shown in the server's monitoring; default ``aep-collector``."""
    token: str | None = None
    user: str | None = None
    password: str | None = None
    nkey_seed: str | None = None
    """Path of an NKey seed file (``SU...``)."""
    creds: str | None = None
    """Path of a ``.creds`` file (user JWT and NKey seed), as ``nsc`` writes it."""
    tls_ca: str | None = None
    """CA bundle to verify the server with; setting any ``tls_*`` (``tls_hostname`` too) turns TLS on."""
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    tls: bool = False
    """Use TLS with the system CAs (implied by any ``tls_*`` key or a ``tls://`` server)."""
    connect_timeout: float = 5.0
    reconnect_wait: float = 1.0

    def __post_init__(self) -> None:
        # ``${env:NATS_TOKEN:-}`` yields "" when unset: that means none.
        for key in ("name", "token", "user", "password", "nkey_seed", "creds", "tls_ca", "tls_cert",
                    "tls_key", "tls_hostname"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                setattr(self, key, None)

    def validate(self) -> None:
        if not self.servers:
            raise ValueError("servers must name at least one nats:// or tls:// URL")
        for url in self.servers:
            if not re.match(r"^(nats|tls)://[^/\s]+$", url):
                raise ValueError(f"servers: expected nats://host:port or tls://host:port, got {url!r}")
        chosen = [k for k in ("token", "nkey_seed", "creds") if getattr(self, k)] + (["user"] if self.user else [])
        if len(chosen) > 1:
            raise ValueError(f"choose one authentication method, got {', '.join(chosen)}")
        if self.password and not self.user:
            raise ValueError("password needs user")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together (client certificate and its key)")
        for key in ("nkey_seed", "creds", "tls_ca", "tls_cert", "tls_key"):
            path = getattr(self, key)
            if path and not Path(path).expanduser().is_file():
                raise ValueError(f"{key}: no such file {path!r}")
        if self.connect_timeout <= 0 or self.reconnect_wait <= 0:
            raise ValueError("connect_timeout and reconnect_wait must be positive")
        # A CA bundle or key pair TLS cannot load would otherwise surface only when the link first
        # connects, in its background task, leaving the component "connecting" with no reason given.
        self._ssl()

    def wants_tls(self) -> bool:
        return bool(self.tls or self.tls_ca or self.tls_cert or self.tls_key or self.tls_hostname
                    or any(u.startswith("tls://") for u in self.servers))

    def _ssl(self) -> ssl.SSLContext | None:
        """The TLS context, or None without TLS; ``ValueError`` naming the key whose file is unusable."""
        if not self.wants_tls():
            return None
        try:
            ctx = ssl.create_default_context(cafile=str(Path(self.tls_ca).expanduser()) if self.tls_ca else None)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"tls_ca {self.tls_ca!r}: not a CA bundle TLS can use ({exc})") from None
        if self.tls_cert and self.tls_key:
            try:
                ctx.load_cert_chain(str(Path(self.tls_cert).expanduser()), str(Path(self.tls_key).expanduser()))
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(f"tls_cert {self.tls_cert!r} and tls_key {self.tls_key!r}: not a certificate "
                                 f"and its private key ({exc})") from None
        return ctx

    def options(self, **callbacks: Any) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``: reconnect forever, report through ``callbacks``."""
        opts: dict[str, Any] = {
            "servers": list(self.servers),
            "name": self.name or "aep-collector",
            "connect_timeout": self.connect_timeout,
            "reconnect_time_wait": self.reconnect_wait,
            "max_reconnect_attempts": -1,
            # A collector starting while NATS is down keeps trying instead of failing its start.
            "allow_reconnect": True,
            **callbacks,
        }
        tls = self._ssl()
        if tls is not None:
            opts["tls"] = tls
            if self.tls_hostname:
                opts["tls_hostname"] = self.tls_hostname
        if self.token:
            opts["token"] = self.token
        if self.user:
            opts["user"], opts["password"] = self.user, self.password or ""
        if self.nkey_seed:
            opts["nkeys_seed"] = str(Path(self.nkey_seed).expanduser())
        if self.creds:
            opts["user_credentials"] = str(Path(self.creds).expanduser())
        return opts


@dataclass
class NatsStream:
    """The JetStream stream every collector publishes to; created if absent."""

    name: str = "AEP_EVENTS"
    subject_prefix: str = "aep.events"
    """Events go to ``<subject_prefix>.<agent>.<session>``; the stream binds ``<subject_prefix>.>``."""
    create: bool = True
    """Create the stream when it does not exist (an existing one is used as it is)."""
    replicas: int = 1
    retention: Literal["limits", "interest", "workqueue"] = "limits"
    storage: Literal["file", "memory"] = "file"
    max_age: float = 7 * 86400.0
    """Seconds an event is kept; 0 keeps it until another limit drops it."""
    max_bytes: int = -1
    max_msgs: int = -1
    duplicate_window: float = 120.0
    """Seconds JetStream remembers a ``Nats-Msg-Id``: a resend inside it is stored once."""

    def validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", self.name):
            raise ValueError(f"stream name {self.name!r}: letters, digits, '_' and '-' only")
        if not _PREFIX.fullmatch(self.subject_prefix):
            raise ValueError(f"subject_prefix {self.subject_prefix!r}: dot-separated tokens of letters, "
                             "digits, '_' and '-'")
        if self.replicas not in (1, 3, 5):
            raise ValueError("replicas must be 1, 3 or 5 (JetStream clusters use odd quorums)")
        if self.max_age < 0 or self.duplicate_window <= 0:
            raise ValueError("max_age must be >= 0 and duplicate_window positive")

    def config(self) -> Any:
        from nats.js import api

        return api.StreamConfig(
            name=self.name, subjects=[f"{self.subject_prefix}.>"],
            retention=api.RetentionPolicy(self.retention), storage=api.StorageType(self.storage),
            num_replicas=self.replicas, max_age=self.max_age or None, max_bytes=self.max_bytes,
            max_msgs=self.max_msgs, duplicate_window=self.duplicate_window)

    async def ensure(self, js: Any) -> None:
        """Create the stream if absent and allowed; an existing stream is never changed, but one
        that does not bind ``<subject_prefix>.>`` is refused by name (every publish to it would
        only time out with "no response from stream")."""
        from nats.js.errors import NotFoundError

        try:
            info = await js.stream_info(self.name)
        except NotFoundError:
            if not self.create:
                raise
            await js.add_stream(self.config())
            return
        subjects = list(info.config.subjects or [])
        if not any(_covers(s, self.subject_prefix) for s in subjects):
            raise ValueError(f"stream {self.name} exists but binds {subjects}, not {self.subject_prefix}.>: "
                             "add that subject to it, or configure another stream.name or subject_prefix")


def _covers(pattern: str, prefix: str) -> bool:
    """Whether the stream subject ``pattern`` matches every ``<prefix>.<agent>.<session>``."""
    want = [*prefix.split("."), "*", "*"]
    tokens = pattern.split(".")
    for i, tok in enumerate(tokens):
        if tok == ">":
            return i < len(want)
        if i >= len(want) or (tok != "*" and (want[i] == "*" or tok != want[i])):
            return False
    return len(tokens) == len(want)


def _insist_on_tls(nc: Any) -> None:
    """Make ``nc`` refuse a server that does not require TLS. nats-py upgrades only when the
    server's INFO asks for it and otherwise carries on in plaintext, credentials and events
    included, whatever TLS settings it was given; the check runs before it sends CONNECT."""
    from nats.errors import Error

    plain = nc._process_info

    async def checked(info: dict[str, Any], initial_connection: bool = False) -> None:
        if initial_connection and not info.get("tls_required"):
            raise Error("nats: TLS is configured but the server does not require it; "
                        "not connecting in plaintext")
        await plain(info, initial_connection=initial_connection)

    nc._process_info = checked


class _LinkClosed(Exception):
    """Raised from the client's error callback to end its connect loop once the link is closed."""


async def _settle(aw: Awaitable[Any], timeout: float) -> bool:
    """Await ``aw`` for at most ``timeout`` seconds; never waits on a cancellation the client may
    swallow (nats-py does, in its connect loop and in drain), so a stuck client cannot hang a
    shutdown. True when it finished (its outcome, error or not, is consumed)."""
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        return False
    if not task.cancelled():
        task.exception()
    return True


class Link:
    """One NATS connection kept up for a component: connects in the background (never blocking
    its start), lets the client reconnect forever, and reports each change through ``up`` and
    ``down(detail)``; ``ready`` is set while connected."""

    def __init__(self, conn: NatsConnection, up: Callable[[Any], Awaitable[None]],
                 down: Callable[[str], None]) -> None:
        self.conn, self._up, self._down = conn, up, down
        self.nc: Any = None
        self.ready = asyncio.Event()
        self.stopped = False
        self._task: asyncio.Task[None] | None = None

    @property
    def servers(self) -> str:
        """The configured servers, as shown in logs and ``/healthz``."""
        return ", ".join(self.conn.servers)

    @property
    def pending(self) -> str:
        """The detail of ``CONNECTING``."""
        return f"not yet connected to NATS at {self.servers} since start"

    def start(self, name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(self._connect(), name=name)

    async def _connect(self) -> None:
        import nats

        servers = self.servers
        opts = self.conn.options(disconnected_cb=self._disconnected, reconnected_cb=self._reconnected,
                                 error_cb=self._error, closed_cb=self._closed)
        attempt = 0
        while not self.stopped:
            try:
                nc = nats.NATS()
                if self.conn.wants_tls():
                    _insist_on_tls(nc)
                await nc.connect(**opts)
                self.nc = nc
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. a bad creds file: reported, retried with backoff
                if self.stopped:  # closed meanwhile (_LinkClosed, or a cancellation the client swallowed)
                    break
                self._lost(f"cannot connect to {servers}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(min(self.conn.reconnect_wait * 2 ** min(attempt, 4), 10.0))
                attempt += 1
        if not self.stopped:
            await self._reconnected()

    def _lost(self, detail: str) -> None:
        self.ready.clear()
        if not self.stopped:
            self._down(detail)

    async def _disconnected(self) -> None:
        self._lost("disconnected from NATS; reconnecting")

    async def _reconnected(self) -> None:
        if self.nc is not None and not self.stopped:
            try:  # the owner's setup (JetStream context, subscriptions) comes before ``ready``
                await self._up(self.nc)
            except Exception as exc:
                self._down(f"setting up the NATS connection failed: {type(exc).__name__}: {exc}")
            self.ready.set()

    async def _closed(self) -> None:
        self._lost("the NATS connection closed")

    async def _error(self, exc: Exception) -> None:
        # The client retries a refused connect forever and reports each failure here. It can
        # swallow the cancellation ``close`` sends (then it would retry for ever after): raising
        # here, outside the errors it retries on, is what ends its loop once the link is closed.
        if self.stopped and self.nc is None:
            raise _LinkClosed("the NATS link is closed")
        if not self.ready.is_set():
            self._lost(f"cannot reach NATS at {self.servers}: {type(exc).__name__}: {exc}")

    async def wait(self, timeout: float) -> Any:
        """The connection, once up; ``ConnectionError`` after ``timeout`` seconds without one."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:
            raise ConnectionError("NATS is not connected") from None
        return self.nc

    async def close(self) -> None:
        """Stop connecting and close the connection; bounded even when the client does not
        honour cancellation."""
        self.stopped = True
        self.ready.clear()
        if self._task is not None:
            self._task.cancel()
            # An attempt in flight ends within connect_timeout; its error callback then ends the loop.
            if not await _settle(self._task, self.conn.connect_timeout + self.conn.reconnect_wait + 1.0):
                log.warning("NATS connect loop did not stop on close; left behind")
        if self.nc is not None:
            await _settle(self.nc.drain(), 2.0)
            if not await _settle(self.nc.close(), 2.0):
                log.warning("NATS connection did not close within 2 s; left behind")
