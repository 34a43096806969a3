"""Config of the ``otlp`` receiver: one vendor profile, one mode, gRPC and/or HTTP listeners."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from aep_collector.pipeline.config import ConfigError, parse_endpoint
from aep_collector.receivers.body import DEFAULT_BODY_TIMEOUT, validate_body_timeout

# profile -> mapping key (Signal.agent). Bridges digest §1.1: one vendor profile per receiver
# instance, never dispatch by service.name: one connection must not speak for two agents.
PROFILES: dict[str, str] = {"vscode": "vscode-otel", "codex": "codex-otel"}
MODES = ("companion", "primary")
DEFAULT_MAX_REQUEST_BYTES = 4 << 20
# 32x the OTel SDKs' batch (BatchLogRecordProcessor exports at most 512 records per request) and 2x
# the Collector batch processor's 8192, yet a few hundred ms of work: without it, 4 MiB of empty
# records (2 bytes each) is 2 million events, tens of seconds of CPU and gigabytes of JSONL.
DEFAULT_MAX_REQUEST_RECORDS = 16384


@dataclass
class GrpcConfig:
    """OTLP/gRPC listener (``LogsService/Export``)."""

    endpoint: str = "127.0.0.1:4317"


@dataclass
class HttpConfig:
    """OTLP/HTTP listener (``POST /v1/logs``)."""

    endpoint: str = "127.0.0.1:4318"


def _section(cls: type, value: Any) -> Any:
    """A dict given in code becomes the dataclass; anything odd is left for ``validate`` to name."""
    if isinstance(value, dict) and set(value) <= {f.name for f in fields(cls)}:
        return cls(**value)
    return value


@dataclass
class OtlpConfig:
    """Config of the ``otlp`` receiver. ``profile`` is required and at least one protocol is."""

    profile: str = ""
    """``vscode`` or ``codex``: whose records these are. Required, no default: a wrong profile
    would stamp one vendor's records with another's identity."""
    mode: str = "companion"
    """``companion`` (only ``x.<vendor>.otel.*``; a hook receiver owns core types) or ``primary``."""
    grpc: GrpcConfig | None = None
    """OTLP/gRPC listener; ``{}`` listens on 127.0.0.1:4317, absent or null disables it."""
    http: HttpConfig | None = None
    """OTLP/HTTP listener; ``{}`` listens on 127.0.0.1:4318, absent or null disables it."""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """Largest request accepted, on the wire and after gunzip (413 / RESOURCE_EXHAUSTED beyond)."""
    max_request_records: int = DEFAULT_MAX_REQUEST_RECORDS
    """Most log records accepted in one request (413 / RESOURCE_EXHAUSTED beyond)."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds an OTLP/HTTP request body may take to arrive whole (else 408)."""

    def __post_init__(self) -> None:
        self.grpc = _section(GrpcConfig, self.grpc)
        self.http = _section(HttpConfig, self.http)

    @property
    def agent(self) -> str:
        """The mapping key the receiver's signals carry (``vscode-otel`` / ``codex-otel``)."""
        return PROFILES[self.profile]

    def listens(self) -> dict[str, str]:
        """Where it listens, by key (the config checks no two listeners share a port)."""
        return {f"{name}.endpoint": section.endpoint for name, section in (("grpc", self.grpc), ("http", self.http))
                if isinstance(section, GrpcConfig | HttpConfig) and isinstance(section.endpoint, str)}

    def validate(self) -> None:
        """Raise ``ValueError`` (``ConfigError`` for a nested key) in the user's terms."""
        known = ", ".join(PROFILES)
        if not self.profile:
            raise ValueError(f"profile is required: one of {known} (one vendor per receiver instance)")
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r} (expected one of {known})")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r} (expected companion or primary)")
        if self.grpc is None and self.http is None:
            raise ValueError("must specify at least one protocol when using the OTLP receiver: "
                             "grpc: {endpoint: 127.0.0.1:4317} and/or http: {endpoint: 127.0.0.1:4318} "
                             "({} takes the default endpoint)")
        bound = []
        for name, section, cls in (("grpc", self.grpc, GrpcConfig), ("http", self.http, HttpConfig)):
            if section is None:
                continue
            if not isinstance(section, cls):
                keys = ", ".join(f.name for f in fields(cls))
                raise ConfigError("<config>", name, f"expected a mapping with the key(s) {keys}, "
                                  f"got {section!r}")
            if not isinstance(section.endpoint, str):
                raise ConfigError("<config>", f"{name}.endpoint", "expected host:port")
            bound.append((name, parse_endpoint(section.endpoint, path=f"{name}.endpoint")))
        if len(bound) == 2 and bound[0][1] == bound[1][1] and bound[0][1][1] != 0:
            raise ValueError(f"grpc.endpoint and http.endpoint are both {self.grpc.endpoint}: "  # type: ignore[union-attr]
                             "give each protocol its own port")
        if (not isinstance(self.max_request_bytes, int) or isinstance(self.max_request_bytes, bool)
                or self.max_request_bytes < 1):
            raise ValueError("max_request_bytes must be a positive integer")
        if (not isinstance(self.max_request_records, int) or isinstance(self.max_request_records, bool)
                or self.max_request_records < 1):
            raise ValueError("max_request_records must be a positive integer")
        validate_body_timeout(self.body_timeout)
