"""The ``otlp`` receiver: OTLP logs (gRPC and HTTP) from VS Code Copilot Chat or Codex.

See ``README.md`` in this folder for every config key, a sample config and the vendor settings.
"""

from __future__ import annotations

from aep_collector.pipeline.component import Factory, Kind

from .config import MODES, PROFILES, GrpcConfig, HttpConfig, OtlpConfig
from .flatten import any_value, flatten_record, flatten_request
from .receiver import OtlpReceiver

__all__ = ["FACTORY", "MODES", "PROFILES", "GrpcConfig", "HttpConfig", "OtlpConfig", "OtlpReceiver",
           "any_value", "flatten_record", "flatten_request"]

FACTORY = Factory(
    kind=Kind.RECEIVER,
    type="otlp",
    config_class=OtlpConfig,
    create=lambda settings, cfg, next_consumer: OtlpReceiver(settings, cfg, next_consumer),
    description="OTLP logs (gRPC LogsService/Export, HTTP POST /v1/logs) from the VS Code Copilot Chat "
                "or Codex OTel channel; one vendor profile per instance",
)
