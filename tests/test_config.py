"""Config loading: good configs build, bad ones fail naming file, key path and expectation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from aep_collector.pipeline.config import (
    ConfigError,
    ConfigErrors,
    load,
    parse,
    parse_endpoint,
    substitute_env,
)
from aep_collector.pipeline.registry import build_registry

DATA = Path(__file__).parent / "testdata" / "config"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def registry():
    reg, problems = build_registry(load_plugins=False)
    assert problems == []
    return reg


def test_good_config_builds_pipelines_and_typed_configs(registry, monkeypatch):
    monkeypatch.setenv("TEST_LOG_DIR", "/tmp/from-env")
    cfg = load(DATA / "good_full.yaml", registry)
    assert sorted(cfg.pipelines) == ["metadata", "redacted"]
    assert cfg.pipelines["metadata"].receivers == ["claude_code", "claude_code/second"]
    _, second = cfg.receivers["claude_code/second"]
    assert second.attention_timeout == 20.0 and isinstance(second.attention_timeout, float)
    _, jsonl = cfg.exporters["jsonl"]
    assert jsonl.directory == "/tmp/from-env" and jsonl.fsync == "always"
    assert cfg.telemetry.log_level == "debug"
    assert cfg.warnings == []


def test_default_applies_when_env_unset(registry, monkeypatch):
    monkeypatch.delenv("TEST_LOG_DIR", raising=False)
    cfg = load(DATA / "good_full.yaml", registry)
    assert cfg.exporters["jsonl"][1].directory == "/tmp/aep-test-logs"


@pytest.mark.parametrize(
    ("name", "path", "needle"),
    [
        ("bad_unknown_type.yaml", "receivers.claude_codex", "unknown receiver type 'claude_codex'"),
        ("bad_unknown_key.yaml", "receivers.claude_code.endpont", "unknown key"),
        ("bad_wrong_type.yaml", "receivers.claude_code.attention_timeout", "expected a number, got string 'soon'"),
        ("bad_undefined_component.yaml", "service.pipelines.p.processors[0]", "processor 'capture' is not defined"),
        ("bad_empty.yaml", "", "the config is empty"),
        ("bad_no_pipelines.yaml", "service.pipelines", "expected at least one pipeline"),
        ("bad_fsync.yaml", "exporters.jsonl.fsync", "expected 'always' or 'interval' or 'never'"),
        ("bad_endpoint.yaml", "receivers.claude_code.endpoint", "expected host:port"),
        ("bad_env.yaml", "receivers.claude_code.endpoint", "AEP_TEST_SURELY_UNSET_VAR is not set"),
        ("bad_yaml.yaml", "", "not valid YAML"),
    ],
)
def test_bad_configs_name_file_key_and_expectation(registry, name, path, needle):
    with pytest.raises(ConfigError) as info:
        load(DATA / name, registry)
    err = info.value
    assert err.file.endswith(name)
    assert err.path == path
    assert needle in err.message
    assert str(err).startswith(str(DATA / name))


def test_unused_component_warns(registry):
    cfg = load(DATA / "warn_unused.yaml", registry)
    assert any("exporters.jsonl/unused: defined but not used" in w for w in cfg.warnings)


def test_env_substitution_forms():
    env = {"A": "1", "EMPTY": ""}
    assert substitute_env("x${env:A}y", "f", "k", env) == "x1y"
    assert substitute_env("${env:B:-dflt}", "f", "k", env) == "dflt"
    assert substitute_env("${env:EMPTY:-dflt}", "f", "k", env) == ""
    assert substitute_env("$${env:A}", "f", "k", env) == "${env:A}"
    with pytest.raises(ConfigError, match="unsupported substitution"):
        substitute_env("${A}", "f", "k", env)


def test_pipeline_without_exporter_is_an_error(registry):
    raw = {"receivers": {"claude_code": None}, "exporters": {"jsonl": None},
           "service": {"pipelines": {"p": {"receivers": ["claude_code"]}}}}
    with pytest.raises(ConfigError, match="needs at least one exporter"):
        parse(raw, registry, "mem.yaml")


def test_unknown_top_level_key(registry):
    with pytest.raises(ConfigError) as info:
        parse({"recievers": {}}, registry, "mem.yaml")
    assert info.value.path == "recievers"


@pytest.mark.parametrize(("text", "expected"), [("127.0.0.1:8377", ("127.0.0.1", 8377)),
                                                ("[::1]:0", ("::1", 0)), ("localhost:80", ("localhost", 80))])
def test_parse_endpoint(text, expected):
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize("text", ["8377", "127.0.0.1:99999", "a:b", ""])
def test_parse_endpoint_rejects(text):
    with pytest.raises(ConfigError):
        parse_endpoint(text)


def test_cli_validate_exit_codes():
    exe = [sys.executable, "-m", "aep_collector.pipeline.cli"]
    ok = subprocess.run([*exe, "validate", "--config", str(ROOT / "config" / "default.yaml")],
                        capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "valid" in ok.stdout
    bad = subprocess.run([*exe, "validate", "--config", str(DATA / "bad_unknown_key.yaml")],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1
    assert "receivers.claude_code.endpont: unknown key" in bad.stderr


@pytest.mark.parametrize(("text", "value"), [("1", True), ("true", True), ("On", True), ("yes", True),
                                             ("0", False), ("", False), ("false", False), ("off", False)])
def test_booleans_accept_the_words_env_substitution_yields(registry, text, value):
    raw = {"receivers": {"claude_code": None}, "processors": {"mapping": None},
           "exporters": {"jsonl": {"directory": "/tmp/x"}},
           "service": {"pipelines": {"p": {"receivers": ["claude_code"], "processors": ["mapping"],
                                           "exporters": ["jsonl"]}}}}
    from aep_collector.pipeline.config import coerce
    assert coerce(bool, text, "f", "k") is value
    with pytest.raises(ConfigError, match="expected a boolean"):
        coerce(bool, "maybe", "f", "k")
    assert parse(raw, registry, "m.yaml")


THREE_TYPOS = """\
receivers:
  claude_code:
    endpont: 127.0.0.1:8377
processors:
  mapping:
  runs:
    max_sesions: 10
exporters:
  jsonl:
    fsync: sometimes
service:
  pipelines:
    p: {receivers: [claude_code], processors: [mapping, runs], exporters: [jsonl]}
"""


def test_every_error_of_a_file_is_reported_at_once(registry, tmp_path):
    path = tmp_path / "typos.yaml"
    path.write_text(THREE_TYPOS)
    with pytest.raises(ConfigErrors) as info:
        load(path, registry)
    assert [(e.path, e.message.split(" (")[0]) for e in info.value.errors] == [
        ("receivers.claude_code.endpont", "unknown key"),
        ("processors.runs.max_sesions", "unknown key"),
        ("exporters.jsonl.fsync", "expected 'always' or 'interval' or 'never', got string 'sometimes'"),
    ]
    assert info.value.path == "receivers.claude_code.endpont"  # a ConfigError still, naming the first
    out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "validate", "--config", str(path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 3 and all(str(path) in line for line in lines), out.stderr
    assert f"{path}: 3 errors" in out.stderr


def test_a_broken_component_does_not_also_fail_the_pipelines_naming_it(registry):
    raw = {"receivers": {"claude_code": {"attention_timeout": "soon"}}, "processors": {"maping": None},
           "exporters": {"jsonl": None},
           "service": {"pipelines": {"p": {"receivers": ["claude_code"], "processors": ["maping"],
                                           "exporters": ["jsonl", "relay"]}}}}
    with pytest.raises(ConfigErrors) as info:
        parse(raw, registry, "mem.yaml")
    assert [e.path for e in info.value.errors] == [
        "receivers.claude_code.attention_timeout", "processors.maping", "service.pipelines.p.exporters[1]"]


@pytest.mark.parametrize("processors", [[], ["runs", "capture"]])
def test_a_pipeline_of_hook_receivers_without_mapping_is_an_error(registry, processors):
    raw = {"receivers": {"claude_code": None, "codex": None}, "processors": {"runs": None, "capture": None},
           "exporters": {"jsonl": None},
           "service": {"pipelines": {"p": {"receivers": ["claude_code", "codex"], "processors": processors,
                                           "exporters": ["jsonl"]}}}}
    with pytest.raises(ConfigError) as info:
        parse(raw, registry, "mem.yaml")
    assert info.value.path == "service.pipelines.p.processors"
    assert "claude_code, codex" in info.value.message and "'mapping' processor" in info.value.message


def test_a_receiver_that_delivers_events_needs_no_mapping(registry):
    import dataclasses

    from aep_collector.pipeline.component import Registry

    reg = Registry()
    for kind in registry.factories:
        for f in registry.factories[kind].values():
            reg.register(dataclasses.replace(f, emits_signals=False) if f.type == "claude_code" else f)
    raw = {"receivers": {"claude_code": None}, "exporters": {"jsonl": None},
           "service": {"pipelines": {"p": {"receivers": ["claude_code"], "exporters": ["jsonl"]}}}}
    assert parse(raw, reg, "mem.yaml").pipelines["p"].processors == []


def test_an_unset_variable_is_one_error_not_a_cascade(registry):
    with pytest.raises(ConfigError) as info:
        load(DATA / "bad_env.yaml", registry)
    assert [e.path for e in info.value.errors] == ["receivers.claude_code.endpoint"]


def test_service_section_is_checked_like_a_component_and_with_the_pipelines(registry):
    raw = {"receivers": {"claude_code": None}, "processors": {"mapping": None}, "exporters": {"jsonl": None},
           "service": {"stat_dir": "/x", "limits": {"max_sessions": 0},
                       "telemetry": {"logs": {"level": "loud"}, "metrics": {"endpoint": "nope"},
                                     "health": {"window": 0, "span": 1}},
                       "pipelines": {"p": {"receivers": ["claude_code"], "processors": ["mapping"],
                                           "exporters": ["jsonl", "relay"]}}}}
    with pytest.raises(ConfigErrors) as info:
        parse(raw, registry, "mem.yaml")
    assert [(e.path, e.message) for e in info.value.errors] == [
        ("service.stat_dir", "unknown key (known keys: limits, pipelines, state_dir, telemetry)"),
        ("service.limits.max_sessions", "max_sessions must be at least 1"),
        ("service.telemetry.logs.level", "expected debug, info, warning or error"),
        ("service.telemetry.metrics.endpoint", "expected host:port, got 'nope'"),
        ("service.telemetry.health.span", "unknown key (known keys: window)"),
        # the unknown key beside it does not hide the value check
        ("service.telemetry.health.window", "expected a positive number of seconds"),
        ("service.pipelines.p.exporters[1]", "exporter 'relay' is not defined under exporters:"),
    ]


def test_service_section_values_reach_the_config(registry):
    raw = {"receivers": {"claude_code": None}, "processors": {"mapping": None}, "exporters": {"jsonl": None},
           "service": {"state_dir": "~/elsewhere", "limits": {"max_held_requests": 7},
                       "telemetry": {"logs": {"level": "DEBUG"}, "metrics": {"endpoint": "127.0.0.1:0"},
                                     "health": {"window": 5}},
                       "pipelines": {"p": {"receivers": ["claude_code"], "processors": ["mapping"],
                                           "exporters": ["jsonl"]}}}}
    cfg = parse(raw, registry, "mem.yaml")
    assert cfg.state_dir == Path("~/elsewhere").expanduser()
    assert cfg.limits.max_held_requests == 7 and cfg.limits.max_sessions == 100_000
    assert (cfg.telemetry.log_level, cfg.telemetry.metrics_endpoint) == ("debug", "127.0.0.1:0")
    assert cfg.telemetry.health_window == 5.0 and isinstance(cfg.telemetry.health_window, float)


NESTED_DEFAULT = """\
receivers:
  claude_code: {endpoint: "127.0.0.1:0"}
processors: {mapping: , runs: , capture: }
exporters:
  jsonl: {directory: "DIR/logs"}
service:
  state_dir: ${env:AEP_TEST_UNSET_STATE_DIR:-${env:HOME}/aep}
  pipelines:
    p: {receivers: [claude_code], processors: [mapping, runs, capture], exporters: [jsonl]}
"""


def test_a_nested_substitution_is_an_error_not_a_folder_named_after_it(tmp_path):
    # It was read as the default "${env:HOME" plus a literal "}": state went to a folder named
    # "${env:HOME}/aep" under the working directory, and validate said the file was valid.
    path = tmp_path / "nested.yaml"
    path.write_text(NESTED_DEFAULT.replace("DIR", str(tmp_path)))
    out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "validate", "--config", str(path)],
                         capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 1, out.stdout
    assert f"error: {path}: service.state_dir: substitutions do not nest" in out.stderr


def test_a_default_spells_a_dollar_as_the_rest_of_the_file_does():
    assert substitute_env("${env:B:-pa$$word}", "f", "k", {}) == "pa$word"
    assert substitute_env("${env:B:-a$b}", "f", "k", {}) == "a$b"
    assert substitute_env("${env:B:-{x}}", "f", "k", {}) == "{x}"
    with pytest.raises(ConfigError, match="do not nest"):
        substitute_env("${env:B:-${env:C:-x}}", "f", "k", {"C": "1"})


def test_a_folder_setting_left_empty_is_an_error_not_the_working_directory(tmp_path):
    # AEP_STATE_DIR= (set, empty) gave state_dir "": the relay token, the epochs and the queues went
    # to whatever folder the collector was started in, and the operator commands looked in ~/.aep.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AEP_STATE_DIR": "", "AEP_LOG_DIR": " "}
    out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "validate",
                          "--config", str(ROOT / "config" / "default.yaml")],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 1, out.stdout
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert [e.split(": ")[2] for e in errors] == ["exporters.jsonl.directory", "service.state_dir"], out.stderr
    assert all("is empty: it must name a folder" in e for e in errors)
    assert list(tmp_path.iterdir()) == []


SHARED_PORTS = """\
receivers:
  claude_code: {endpoint: "127.0.0.1:PORT1"}
  codex: {endpoint: "127.0.0.1:PORT1"}
  gemini_cli: {endpoint: "127.0.0.1:0"}
  qwen_code: {endpoint: "127.0.0.1:0"}
  otlp:
    profile: codex
    grpc: {endpoint: "localhost:PORT2"}
processors: {mapping: , runs: , capture: }
exporters:
  jsonl: {directory: "DIR/logs"}
  relay_server: {endpoint: "0.0.0.0:PORT2"}
  relay_server/unused: {endpoint: "127.0.0.1:PORT1"}
service:
  state_dir: DIR/state
  telemetry: {metrics: {endpoint: "127.0.0.1:PORT1"}}
  pipelines:
    p:
      receivers: [claude_code, codex, gemini_cli, qwen_code, otlp]
      processors: [mapping, runs, capture]
      exporters: [jsonl, relay_server]
"""


def validate_errors(path) -> tuple[list[str], str]:
    """``aep-collector validate --config path``, which must fail: its error lines (file prefix cut)
    and the whole of its stderr."""
    out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "validate", "--config", str(path)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1, out.stdout
    return [line.removeprefix(f"error: {path}: ") for line in out.stderr.splitlines()
            if line.startswith("error: ")], out.stderr


def test_two_listeners_on_one_port_are_an_error_naming_both(tmp_path):
    # validate called this valid; at start the second bind failed with a bare "address already in
    # use" that named neither component. Port 0 never collides; an unused component never listens.
    path = tmp_path / "ports.yaml"
    path.write_text(SHARED_PORTS.replace("DIR", str(tmp_path)).replace("PORT1", "18471").replace("PORT2", "18472"))
    errors, stderr = validate_errors(path)
    assert errors == [
        "receivers.codex.endpoint: 127.0.0.1:18471: receivers.claude_code.endpoint listens on this port too; "
        "give each listener its own port",
        "exporters.relay_server.endpoint: 0.0.0.0:18472: receivers.otlp.grpc.endpoint listens on this port too; "
        "give each listener its own port",
        "service.telemetry.metrics.endpoint: 127.0.0.1:18471: receivers.claude_code.endpoint listens on this "
        "port too; give each listener its own port",
    ], stderr


INFINITE = """\
receivers:
  claude_code: {endpoint: "127.0.0.1:8377", attention_timeout: VALUE}
processors: {mapping: , runs: , capture: }
exporters:
  jsonl: {directory: "DIR/logs"}
service:
  state_dir: DIR/state
  pipelines:
    p: {receivers: [claude_code], processors: [mapping, runs, capture], exporters: [jsonl]}
"""


@pytest.mark.parametrize(("value", "got"), [(".inf", "number inf"), (".nan", "number nan"),
                                            ('"${env:AEP_TEST_UNSET_T:-1e999}"', "string '1e999'")])
def test_a_number_that_is_not_finite_is_an_error(tmp_path, value, got):
    # It passed every "must be positive" check (nan compares false, inf is positive): validate said
    # valid, and `hooks claude-code --config` died with an OverflowError traceback (inf) or
    # "error: cannot convert float NaN to integer", naming no key.
    path = tmp_path / "c.yaml"
    path.write_text(INFINITE.replace("DIR", str(tmp_path)).replace("VALUE", value))
    exe = [sys.executable, "-m", "aep_collector.pipeline.cli"]
    for command in (["validate", "--config", str(path)],
                    ["hooks", "claude-code", "--config", str(path), "--home", str(tmp_path)]):
        out = subprocess.run([*exe, *command], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert (f"{path}: receivers.claude_code.attention_timeout: expected a finite number, got {got}"
                in out.stderr), out.stderr


TWICE = """\
receivers:
  claude_code: {endpoint: "127.0.0.1:0"}
  codex: {endpoint: "127.0.0.1:0"}
processors: {mapping: , runs: , capture: , capture/none: {ceiling: none}}
exporters:
  jsonl: {directory: "DIR/logs"}
  jsonl/other: {directory: "DIR/other"}
service:
  state_dir: DIR/state
  pipelines:
    a: {receivers: [claude_code], processors: [mapping, runs, capture], exporters: [jsonl]}
    b: {receivers: [codex, claude_code], processors: [mapping, runs, capture/none], exporters: [jsonl/other, jsonl]}
    c: {receivers: [codex], processors: [mapping, runs, capture], exporters: [jsonl/other]}
"""


def test_one_receiver_reaching_one_exporter_through_two_pipelines_is_an_error(tmp_path):
    # Each pipeline maps and stamps what the receiver sends: the exporter wrote every moment twice,
    # under two ids, a session file with two session.started (validate-events: invalid). validate
    # called the config valid.
    path = tmp_path / "twice.yaml"
    path.write_text(TWICE.replace("DIR", str(tmp_path)))
    errors, stderr = validate_errors(path)
    assert errors == [
        "service.pipelines.b.exporters[1]: exporter 'jsonl' already gets what receiver claude_code sends, through "
        "pipeline a: every event would reach it twice, under two ids (a session started twice); give one pipeline "
        "its own exporter",
        "service.pipelines.c.exporters[0]: exporter 'jsonl/other' already gets what receiver codex sends, through "
        "pipeline b: every event would reach it twice, under two ids (a session started twice); give one pipeline "
        "its own exporter",
    ], stderr
