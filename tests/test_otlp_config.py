"""The ``otlp`` receiver's config: defaults, validation in the user's words, YAML through the loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from aep_collector.pipeline.component import CreateSettings, Kind
from aep_collector.pipeline.config import ConfigError, parse
from aep_collector.pipeline.registry import build_registry
from aep_collector.receivers.otlp import FACTORY, GrpcConfig, HttpConfig, OtlpConfig, OtlpReceiver


class Sink:
    async def consume(self, batch: list[Any]) -> list[Any]:
        return []


def test_defaults() -> None:
    cfg = FACTORY.default_config()
    assert (cfg.profile, cfg.mode, cfg.grpc, cfg.http, cfg.max_request_bytes) == ("", "companion", None,
                                                                                   None, 4 * 1024 * 1024)
    assert GrpcConfig().endpoint == "127.0.0.1:4317" and HttpConfig().endpoint == "127.0.0.1:4318"
    assert FACTORY.kind is Kind.RECEIVER and FACTORY.type == "otlp"


@pytest.mark.parametrize("kwargs,message", [
    ({"http": {}}, "profile is required"),
    ({"profile": "copilot", "http": {}}, "unknown profile 'copilot'"),
    ({"profile": "vscode", "mode": "auto", "http": {}}, "unknown mode 'auto'"),
    ({"profile": "vscode"}, "must specify at least one protocol"),
    ({"profile": "codex", "grpc": {"endpont": "127.0.0.1:1"}}, "grpc: expected a mapping with the key(s) endpoint"),
    ({"profile": "codex", "http": {"endpoint": "4318"}}, "http.endpoint: expected host:port"),
    ({"profile": "codex", "http": {"endpoint": "127.0.0.1:70000"}}, "out of range"),
    ({"profile": "codex", "grpc": {"endpoint": "127.0.0.1:4319"}, "http": {"endpoint": "127.0.0.1:4319"}},
     "give each protocol its own port"),
    ({"profile": "codex", "http": {}, "max_request_bytes": 0}, "max_request_bytes must be a positive integer"),
], ids=["no-profile", "bad-profile", "bad-mode", "no-protocol", "typo-key", "bad-endpoint", "bad-port",
        "same-port", "zero-limit"])
def test_validate_names_the_problem(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OtlpConfig(**kwargs).validate()


def test_sections_given_as_dicts_in_code_become_dataclasses() -> None:
    cfg = OtlpConfig(profile="vscode", grpc={}, http={"endpoint": "127.0.0.1:0"})
    cfg.validate()
    assert cfg.grpc == GrpcConfig() and cfg.http == HttpConfig(endpoint="127.0.0.1:0")
    assert cfg.agent == "vscode-otel"
    assert OtlpConfig(profile="codex", grpc={"endpoint": "127.0.0.1:0"}, http={"endpoint": "127.0.0.1:0"}).agent \
        == "codex-otel"  # two port-0 listeners are fine: the OS picks two ports


def test_factory_creates_the_receiver_for_its_profile() -> None:
    cfg = OtlpConfig(profile="codex", mode="primary", http={"endpoint": "127.0.0.1:0"})
    receiver = FACTORY.create(CreateSettings(id="otlp/codex"), cfg, Sink())
    assert isinstance(receiver, OtlpReceiver)
    assert (receiver.id, receiver.agent) == ("receiver/otlp/codex", "codex-otel")
    assert receiver.session_key == "record attribute conversation.id"  # the codex identity rule


def service_yaml(receivers: str) -> Any:
    return yaml.safe_load(f"""
receivers:
{receivers}
processors:
  mapping:
exporters:
  jsonl: {{directory: /tmp/aep-otlp-config-test}}
service:
  pipelines:
    agents: {{receivers: [{yaml.safe_load(receivers).__iter__().__next__()}], processors: [mapping],
              exporters: [jsonl]}}
""")


def test_readme_sample_loads_through_the_service_config() -> None:
    registry, _ = build_registry(load_plugins=False)
    assert registry.get(Kind.RECEIVER, "otlp") is FACTORY
    cfg = parse(service_yaml("  otlp/vscode: {profile: vscode, http: {endpoint: 127.0.0.1:4318}}"), registry,
                env={})
    factory, rcfg = cfg.receivers["otlp/vscode"]
    assert factory is FACTORY
    assert rcfg == OtlpConfig(profile="vscode", http=HttpConfig("127.0.0.1:4318"))


def test_empty_mapping_takes_the_default_endpoint_through_the_loader() -> None:
    registry, _ = build_registry(load_plugins=False)
    cfg = parse(service_yaml("  otlp/codex: {profile: codex, mode: primary, grpc: {}}"), registry, env={})
    rcfg = cfg.receivers["otlp/codex"][1]
    assert rcfg.grpc == GrpcConfig() and rcfg.http is None and rcfg.mode == "primary"


@pytest.mark.parametrize("body,where,message", [
    # The loader reports an Optional section's inner error at the section (lead: see report).
    ("  otlp/v: {profile: vscode, http: {endpont: 127.0.0.1:4318}}", "receivers.otlp/v.http", ""),
    ("  otlp/v: {http: {}}", "receivers.otlp/v", "profile is required"),
    ("  otlp/v: {profile: vscode, protocols: {http: {}}}", "receivers.otlp/v.protocols", "unknown key"),
    ("  otlp/v: {profile: vscode, http: {endpoint: nowhere}}", "receivers.otlp/v.http.endpoint",
     "expected host:port"),
    ("  otlp/v: {profile: vscode, http: {}, max_request_bytes: lots}", "receivers.otlp/v.max_request_bytes",
     "expected an integer"),
], ids=["typo", "no-profile", "collector-protocols-nesting", "bad-endpoint", "bad-limit"])
def test_bad_yaml_is_a_config_error_with_its_key_path(body: str, where: str, message: str) -> None:
    registry, _ = build_registry(load_plugins=False)
    with pytest.raises(ConfigError) as err:
        parse(service_yaml(body), registry, env={})
    assert err.value.path.startswith(where) and message in err.value.message


def test_the_readme_sample_config_is_valid() -> None:
    readme = (Path(__file__).resolve().parent.parent / "receivers" / "otlp" / "README.md").read_text()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    registry, _ = build_registry(load_plugins=False)
    cfg = parse(yaml.safe_load(block), registry, env={})
    vscode, codex = cfg.receivers["otlp/vscode"][1], cfg.receivers["otlp/codex"][1]
    assert (vscode.profile, vscode.mode, vscode.http, vscode.grpc) == ("vscode", "companion",
                                                                      HttpConfig("127.0.0.1:4318"), None)
    assert (codex.profile, codex.mode, codex.grpc) == ("codex", "primary", GrpcConfig("127.0.0.1:4317"))
