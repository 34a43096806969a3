"""The capture processor as a component: config, factory, and the batch it is handed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from aep_collector.pipeline.component import CreateSettings, Kind
from aep_collector.pipeline.config import ConfigError, build_dataclass
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import FACTORY, CaptureConfig, CapturePolicy, CaptureProcessor
from aep_collector.processors.capture.redact import SECRET

HERE = Path(__file__).resolve().parent.parent / "processors" / "capture"
TESTDATA = HERE / "testdata"
AWS = "AKIAIOSFODNN7EXAMPLE"


def load(name: str) -> CaptureConfig:
    raw = yaml.safe_load((TESTDATA / name).read_text(encoding="utf-8"))
    return build_dataclass(CaptureConfig, raw, name, "aep_collector.processors.capture")


def test_defaults_are_the_recommended_posture() -> None:
    cfg = CaptureConfig()
    assert (cfg.ceiling, cfg.overrides, cfg.secret_env, cfg.secret_values, cfg.pii, cfg.home) == (
        "metadata", {"attention": "redacted"}, [], [], True, None)
    assert cfg.policy() == CapturePolicy() and FACTORY.default_config() == cfg


def test_factory_builds_the_processor() -> None:
    proc = FACTORY.create(CreateSettings(id="capture"), CaptureConfig(ceiling="redacted"))
    assert FACTORY.kind is Kind.PROCESSOR and FACTORY.type == "capture" and FACTORY.config_class is CaptureConfig
    assert isinstance(proc, CaptureProcessor) and proc.policy.ceiling == "redacted"


def test_testdata_configs_load() -> None:
    assert load("default.yaml") == CaptureConfig()
    cfg = load("content.yaml")
    assert cfg.policy().level_for("tool.requested") == "redacted" and cfg.policy().level_for("x.acme.session.a") == "none"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bad_ceiling.yaml", "ceiling 'verbose' is not a capture level"),
        ("bad_override_level.yaml", "overrides.attention 'readable' is not a capture level"),
        ("bad_override_key.yaml", "capture override '*'"),
        ("typo.yaml", "unknown key"),
        ("bad_secret_env.yaml", "secret_env"),
    ],
)
def test_bad_configs_are_errors(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(name)


def test_validate_speaks_the_users_language() -> None:
    with pytest.raises(ValueError, match=r"capture processor: ceiling 'high' is not a capture level \(expected one of none, metadata, redacted, full\)"):
        CaptureConfig(ceiling="high").validate()


def test_readme_sample_is_a_valid_config() -> None:
    text = (HERE / "README.md").read_text(encoding="utf-8")
    snippets = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert snippets, "README.md has no yaml sample"
    for snippet in snippets:
        body = yaml.safe_load(snippet)["processors"]["capture"]
        build_dataclass(CaptureConfig, body, "README.md", "aep_collector.processors.capture")


def test_signals_pass_through_untouched() -> None:
    signal = Signal(agent="codex", name="Stop", payload={"prompt": AWS})
    assert CaptureProcessor()([signal])[0] is signal


def test_every_draft_of_a_batch_is_gated() -> None:
    batch = [{"type": "run.started", "agent": "codex", "data": {"prompt": AWS}},
             {"type": "tool.requested", "agent": "codex", "data": {"tool": {"name": "Bash"}, "args": {"k": AWS}}}]
    out = CaptureProcessor()(batch)
    assert out == [{"type": "run.started", "agent": "codex", "data": {}, "capture": "metadata"},
                   {"type": "tool.requested", "agent": "codex", "data": {"tool": {"name": "Bash"}}, "capture": "metadata"}]


def test_configured_secret_values_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_TOKEN", "plain-looking-env-value")
    proc = CaptureProcessor(CaptureConfig(ceiling="redacted", secret_env=["DEPLOY_TOKEN", "UNSET_VAR_X"],
                                          secret_values=["s3cr3t-deploy-key-value", "abc"]))
    draft = {"type": "run.started", "agent": "a",
             "data": {"prompt": "plain-looking-env-value then s3cr3t-deploy-key-value, abc"}}
    assert proc([draft])[0]["data"]["prompt"] == f"{SECRET} then {SECRET}, abc"


def test_home_and_pii_switches() -> None:
    proc = CaptureProcessor(CaptureConfig(ceiling="redacted", pii=False, home="/srv/me"))
    draft = {"type": "session.started", "agent": "a", "data": {"cwd": "/srv/me/work", "label": "mail ops@example.com"}}
    assert proc([draft])[0]["data"] == {"cwd": "~/work", "label": "mail ops@example.com"}


def test_default_home_is_the_users_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    proc = CaptureProcessor(CaptureConfig(ceiling="redacted"))
    draft = {"type": "session.started", "agent": "a", "data": {"cwd": f"{tmp_path}/proj"}}
    assert proc([draft])[0]["data"] == {"cwd": "~/proj"}


def test_a_stamped_envelope_gets_only_the_hop_rule() -> None:
    envelope = {"aep": "0.1", "id": "E1", "type": "tool.failed", "time": "2026-07-03T10:00:00Z",
                "source": "aep://h/agent/a", "agent": "a", "session": "s", "seq": 1, "capture": "full",
                "data": {"tool": {"name": "Bash"}, "error": {"type": "Exec", "message": AWS}}}
    out = CaptureProcessor(CaptureConfig(ceiling="redacted", overrides={}))([envelope])[0]
    assert out == {**envelope, "capture": "metadata", "data": {"tool": {"name": "Bash"}, "error": {"type": "Exec"}}}


def test_an_already_gated_envelope_is_forwarded_as_is() -> None:
    ack = {"aep": "0.1", "id": "A1", "type": "control.accepted", "time": "2026-07-03T10:00:00Z",
           "source": "aep://h/agent/a", "agent": "a", "session": "s", "seq": 2, "capture": "metadata", "data": {}}
    assert CaptureProcessor()([ack]) == [ack]


def test_a_draft_that_cannot_be_gated_loses_its_data() -> None:
    class Unpicklable:
        def __deepcopy__(self, memo: dict) -> object:
            raise RuntimeError("cannot copy")

    proc = CaptureProcessor()
    draft = {"type": "run.started", "agent": "a", "data": {"trigger": Unpicklable()}, "_capture": {}, "_hold": "h"}
    assert proc([draft]) == [{"type": "run.started", "agent": "a", "_hold": "h", "capture": "none"}]
    assert proc.failures == 1


def test_a_policy_changed_after_gating_is_honoured_not_the_kept_routes() -> None:
    """The processor keeps per-type routes: a policy replaced after events were gated must not leak
    past its new ceiling through them, and the policy in use cannot be edited in place."""
    import dataclasses

    proc = CaptureProcessor(CaptureConfig(ceiling="full", overrides={}))
    draft = {"type": "tool.requested", "agent": "codex", "session": "s",
             "data": {"tool": {"name": "Bash"}, "input": {"command": "cat notes.txt"}}}
    assert proc([dict(draft)])[0]["data"]["input"] == {"command": "cat notes.txt"}
    proc.policy = CapturePolicy(ceiling="none", overrides={})
    out = proc([dict(draft)])[0]
    assert out["capture"] == "none" and "data" not in out
    with pytest.raises(dataclasses.FrozenInstanceError):
        proc.policy.ceiling = "full"  # type: ignore[misc]
    with pytest.raises(TypeError):
        proc.policy.overrides["tool"] = "full"  # type: ignore[index]
    assert "data" not in proc([dict(draft)])[0]


def test_a_stamped_envelope_whose_claim_its_content_breaks_is_capped_as_full() -> None:
    """A plug-in receiver's envelope claiming ``metadata`` over a secret must not pass a ``metadata``
    ceiling because of its claim: the hop takes it at what it holds (``honest_claim``)."""
    envelope = {"aep": "0.1", "id": "E2", "type": "tool.failed", "time": "2026-07-03T10:00:00Z",
                "source": "aep://h/agent/a", "agent": "a", "session": "s", "seq": 1, "capture": "metadata",
                "data": {"tool": {"name": "Bash"}, "error": {"type": "Exec", "message": AWS}}}
    proc = CaptureProcessor(CaptureConfig(ceiling="metadata", overrides={}))
    out = proc([envelope])[0]
    assert AWS not in repr(out)
    assert out["capture"] == "metadata" and out["data"] == {"tool": {"name": "Bash"}, "error": {"type": "Exec"}}
    honest = {**envelope, "data": {"tool": {"name": "Bash"}, "error": {"type": "Exec"}}}
    assert proc([honest]) == [honest]  # a claim the content keeps is forwarded as it is


def test_a_stamped_envelope_the_hop_cannot_judge_fails_closed() -> None:
    envelope = {"aep": "0.1", "id": "E3", "type": "tool.failed", "time": "2026-07-03T10:00:00Z",
                "source": "aep://h/agent/a", "agent": "a", "session": "s", "seq": 1, "capture": "metadata",
                "subject": f"aws s3 cp --key {AWS}", "data": {"tool": {"name": "Bash"}, "error": AWS.encode()}}
    proc = CaptureProcessor(CaptureConfig(ceiling="metadata", overrides={}))
    out = proc([envelope])[0]  # the batch goes on; the event keeps its moment, not its content
    assert out["capture"] == "none" and "data" not in out and "subject" not in out
    assert out["id"] == "E3" and proc.failures == 1


@pytest.mark.parametrize("ceiling", ["none", "metadata", "redacted"])
def test_values_no_json_decoder_makes_are_gated_or_fail_closed(ceiling: str) -> None:
    """A plug-in mapping's tuple is an array on the wire (orjson writes it as one), so it is gated as
    one; bytes, a set or an object cannot be looked into, and below ``full`` they fail the draft
    closed instead of passing the gate unscreened."""
    proc = CaptureProcessor(CaptureConfig(ceiling=ceiling, overrides={}))
    for foreign in [(AWS,), AWS.encode(), {AWS}, frozenset([AWS]), bytearray(AWS.encode())]:
        draft = {"type": "tool.failed", "agent": "a", "session": "s", "subject": f"cp --key {AWS}",
                 "data": {"tool": {"name": "Bash"}, "error": {"type": "Exec", "message": foreign}, "x": [foreign]}}
        out = proc([draft])[0]
        assert AWS not in repr(out) and AWS.encode() not in repr(out).encode(), (ceiling, foreign, out)
    # the tuple was gated; the other four failed closed (at ``none`` no data is looked into at all)
    assert proc.failures == (0 if ceiling == "none" else 4)


def test_a_tuple_at_full_leaves_as_an_array() -> None:
    proc = CaptureProcessor(CaptureConfig(ceiling="full", overrides={}))
    draft = {"type": "tool.failed", "agent": "a", "session": "s", "data": {"tool": {"name": "Bash"}, "error": ("a", 1)}}
    assert proc([draft])[0]["data"]["error"] == ["a", 1] and proc.failures == 0
