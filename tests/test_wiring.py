"""``aep-collector hooks VENDOR`` printing and ``--install`` / ``--uninstall`` / ``--dry-run`` into a
scratch home, for every vendor: stdout is the file (read back with the vendor format's real parser),
installing merges without touching anything else, twice is the same bytes, uninstalling restores."""

from __future__ import annotations

import json
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from aep_collector.pipeline.cli import main
from aep_collector.receivers import wiring
from aep_collector.receivers.registration import declarations, using_home
from aep_collector.receivers.registration import wiring as registration

from tests.plugin_vendors_support import NODE

VENDORS = sorted(declarations())

# What a user already has in each vendor's home: none of it may change.
SEED: dict[str, dict[str, str]] = {
    "claude-code": {".claude/settings.json": json.dumps({
        "model": "opus", "permissions": {"allow": ["Bash(ls)"]},
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}]}}, indent=4)},
    "codex": {".codex/hooks.json": json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command",
                                                                              "command": "say done"}]}]}}),
              ".codex/config.toml": 'model_provider = "fake"\n\n[projects."/w"]\ntrust_level = "trusted"\n'},
    "gemini-cli": {".gemini/settings.json": '{\n  // auth\n  "security": {"auth": {"selectedType": "gemini-api-key"},},\n'
                                            '  "ui": {"theme": "dark"}\n}\n'},
    "qwen-code": {".qwen/settings.json": json.dumps({"security": {"auth": {"selectedType": "openai"}},
                                                     "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
                                                         {"type": "command", "command": "audit"}]}]}})},
    "vscode": {"project/.github/hooks/team.json": json.dumps({"hooks": {"Stop": [{"type": "command",
                                                                                  "command": "x"}]}})},
    "kimi-code": {".kimi-code/config.toml": 'default_model = "fake"\n\n[providers.fake]\ntype = "openai"\n\n'
                                            '[[hooks]]\nevent = "Stop"\ncommand = "say done"\n'},
    "antigravity": {".gemini/config/hooks.json": json.dumps({"mine": {"Stop": [{"type": "command",
                                                                               "command": "x"}]}})},
    "opencode": {".config/opencode/opencode.json": '{"model": "fake/fake-model"}\n',
                 ".config/opencode/plugins/other.js": "export default {};\n"},
    "kilocode": {".config/kilo/kilo.json": '{"model": "fake/fake-model"}\n'},
    "pi": {".pi/agent/models.json": '{"providers": {}}\n'},
    "cline": {".cline/data/settings/providers.json": "{}\n"},
    "hermes": {".hermes/config.yaml": "# my model\nmodel:\n  default: fake  # keep this comment\n"
                                      "hooks_auto_accept: true\n"},
}


# Where each vendor's CLI reads its registration (tests/live runs the CLIs on these files).
WRITES = {
    "claude-code": [".claude/settings.json"], "codex": [".codex/hooks.json"],
    "gemini-cli": [".gemini/settings.json"], "qwen-code": [".qwen/settings.json"],
    "vscode": ["project/.github/hooks/aep-collector.json"], "kimi-code": [".kimi-code/config.toml"],
    "antigravity": [".gemini/config/hooks.json"], "opencode": [".config/opencode/plugins/aep-collector.js"],
    "kilocode": [".config/kilo/plugins/aep-collector.js"], "pi": [".pi/agent/extensions/aep-collector.js"],
    "cline": [f".cline/hooks/{e}" for e in ("TaskStart", "TaskResume", "TaskCancel", "TaskComplete", "TaskError",
                                          "PreToolUse", "PostToolUse", "UserPromptSubmit", "SessionShutdown")],
    "hermes": [".hermes/config.yaml"],
}


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` except the shim copy and the install records (``.aep``)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".aep" not in p.relative_to(root).parts}


def seed(home: Path, vendor: str) -> dict[str, bytes]:
    for rel, text in SEED[vendor].items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    (home / "project").mkdir(exist_ok=True)
    return snapshot(home)


def hooks(home: Path, vendor: str, *flags: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The real CLI entry point, in-process: ``aep-collector hooks VENDOR --home HOME ...``."""
    capsys.readouterr()
    code = main(["hooks", vendor, "--home", str(home), "--project", str(home / "project"), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def reg_in(home: Path, vendor: str) -> wiring.Wiring:
    """The registration as ``--home HOME`` renders it (its commands name HOME/.aep/bin)."""
    with using_home(home):
        return registration(vendor)


def parse(target: wiring.Target, text: str) -> Any:
    """Read ``text`` as the vendor would: the format's real parser (node for plugins, sh for scripts)."""
    if target.kind == "json" or target.path.endswith(".json"):
        return json.loads(text)
    if target.kind == "toml":
        return tomllib.loads(text)
    if target.kind == "yaml":
        return yaml.safe_load(text)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / ("plugin.mjs" if target.path.endswith(".js") else "hook.sh")
        path.write_text(text)
        check = [NODE, "--check"] if target.path.endswith(".js") else ["sh", "-n"]
        out = subprocess.run([*check, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return text


def contains(big: Any, small: Any) -> bool:
    """``small`` is kept inside ``big``: mappings key by key, lists item by item, scalars equal."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and contains(big[k], v) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and all(any(contains(b, s) for b in big) for s in small)
    return big == small


@pytest.mark.parametrize("vendor", VENDORS)
def test_stdout_is_the_file_and_advice_goes_to_stderr(vendor: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = hooks(tmp_path, vendor, capsys=capsys)
    assert code == 0
    reg = reg_in(tmp_path, vendor)
    assert out == reg.text()
    if not reg.targets[0].path.endswith(".js"):  # JavaScript comments are JavaScript; JSON's are not
        assert not any(line.startswith("//") for line in out.splitlines())
    parsed = parse(reg.targets[0], out)
    if reg.targets[0].data is not None:
        assert parsed == reg.targets[0].data
    assert err and all(line.startswith("# ") for line in err.splitlines())


@pytest.mark.parametrize("vendor", VENDORS)
def test_install_into_an_empty_home_writes_what_is_printed(vendor: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, printed, _ = hooks(tmp_path, vendor, capsys=capsys)
    assert hooks(tmp_path, vendor, "--install", capsys=capsys)[0] == 0
    assert sorted(snapshot(tmp_path)) == sorted(WRITES[vendor])  # exactly where the vendor reads it
    reg = reg_in(tmp_path, vendor)
    for target in reg.targets:
        path = wiring.resolve(target, tmp_path, tmp_path / "project")
        text = path.read_text()
        if target.kind in ("json", "file"):
            assert text == printed if target is reg.targets[0] else text == target.text
        else:  # appended as a marked block: the same data
            assert parse(target, text) == parse(target, printed)
        if target.mode is not None:
            assert path.stat().st_mode & 0o777 == target.mode


@pytest.mark.parametrize("vendor", VENDORS)
def test_install_merges_is_idempotent_and_uninstall_restores(vendor: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    before = seed(tmp_path, vendor)
    code, out, _ = hooks(tmp_path, vendor, "--install", "--dry-run", capsys=capsys)
    assert code == 0 and "would " in out
    assert snapshot(tmp_path) == before and not (tmp_path / ".aep" / "installed").exists()  # dry: nothing

    code, out, err = hooks(tmp_path, vendor, "--install", capsys=capsys)
    assert code == 0, err
    assert any(w in out for w in ("created", "updated"))
    reg = reg_in(tmp_path, vendor)
    for target in reg.targets:
        path = wiring.resolve(target, tmp_path, tmp_path / "project")
        data = parse(target, path.read_text())
        if target.data is not None:
            assert contains(data, target.data)  # ours is in
    for rel, text in SEED[vendor].items():  # theirs is kept
        path = tmp_path / rel
        if rel.endswith((".json", ".toml", ".yaml")):
            kind = "json" if rel.endswith(".json") else rel.rsplit(".", 1)[1]
            original = wiring.load(kind, text, path)[0]
            assert contains(wiring.load(kind, path.read_text(), path)[0], original), rel
        if reg.targets[0].kind == "yaml":
            assert "# keep this comment" in path.read_text()  # appended, not re-dumped
    installed = snapshot(tmp_path)
    record = json.loads((tmp_path / ".aep" / "installed" / f"{vendor}.json").read_text())
    assert {t["path"] for t in record["targets"]} == {
        str(wiring.resolve(t, tmp_path, tmp_path / "project")) for t in reg.targets}

    code, out, _ = hooks(tmp_path, vendor, "--install", capsys=capsys)
    assert code == 0 and set(out.split()) <= {"unchanged"} | {str(p) for p in map(Path, record_paths(record))}
    assert snapshot(tmp_path) == installed  # twice = the same bytes

    code, out, _ = hooks(tmp_path, vendor, "--uninstall", "--dry-run", capsys=capsys)
    assert code == 0 and snapshot(tmp_path) == installed

    code, out, _ = hooks(tmp_path, vendor, "--uninstall", capsys=capsys)
    assert code == 0 and ("restored" in out or "removed" in out)
    assert snapshot(tmp_path) == before  # byte for byte, backups gone
    assert not (tmp_path / ".aep" / "installed" / f"{vendor}.json").exists()


def record_paths(record: dict[str, Any]) -> list[str]:
    return [t["path"] for t in record["targets"]]


def test_uninstall_after_an_edit_removes_only_ours(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed(tmp_path, "claude-code")
    hooks(tmp_path, "claude-code", "--install", capsys=capsys)
    path = tmp_path / ".claude" / "settings.json"
    data = json.loads(path.read_text())
    data["theme"] = "dark"  # the user's edit after the install
    data["hooks"]["Stop"].append({"hooks": [{"type": "command", "command": "beep"}]})
    path.write_text(json.dumps(data))
    code, out, _ = hooks(tmp_path, "claude-code", "--uninstall", capsys=capsys)
    assert code == 0 and "cleaned" in out
    after = json.loads(path.read_text())
    original = json.loads(SEED["claude-code"][".claude/settings.json"])
    assert after == {**original, "theme": "dark", "hooks": {"Stop": [
        *original["hooks"]["Stop"], {"hooks": [{"type": "command", "command": "beep"}]}]}}


def test_uninstall_after_an_edit_puts_back_a_scalar_we_set(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / ".gemini" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"hooksConfig": {"enabled": false}}')
    hooks(tmp_path, "gemini-cli", "--install", capsys=capsys)
    data = json.loads(path.read_text())
    assert data["hooksConfig"] == {"enabled": True}  # hooks do not run otherwise
    path.write_text(json.dumps({**data, "theme": "x"}))
    hooks(tmp_path, "gemini-cli", "--uninstall", capsys=capsys)
    assert json.loads(path.read_text()) == {"hooksConfig": {"enabled": False}, "theme": "x"}


@pytest.mark.parametrize("vendor", ["kimi-code", "hermes"])
def test_uninstall_after_an_edit_strips_our_block(vendor: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    seed(tmp_path, vendor)
    hooks(tmp_path, vendor, "--install", capsys=capsys)
    (rel, text), = SEED[vendor].items()
    path = tmp_path / rel
    path.write_text("# the user's line\n" + path.read_text())
    assert hooks(tmp_path, vendor, "--uninstall", capsys=capsys)[0] == 0
    assert path.read_text() == "# the user's line\n" + text


def test_a_symlinked_config_is_written_through_the_link(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    dotfiles = tmp_path / "dotfiles" / "settings.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text('{"model": "opus"}')
    link = tmp_path / "home" / ".claude" / "settings.json"
    link.parent.mkdir(parents=True)
    link.symlink_to(dotfiles)
    hooks(tmp_path / "home", "claude-code", "--install", capsys=capsys)
    assert link.is_symlink() and "hooks" in json.loads(dotfiles.read_text())
    hooks(tmp_path / "home", "claude-code", "--uninstall", capsys=capsys)
    assert link.is_symlink() and dotfiles.read_text() == '{"model": "opus"}'


def test_a_changed_url_replaces_our_entries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hooks(tmp_path, "qwen-code", "--install", capsys=capsys)
    hooks(tmp_path, "qwen-code", "--install", "--url", "http://127.0.0.1:9999", capsys=capsys)
    data = json.loads((tmp_path / ".qwen" / "settings.json").read_text())
    urls = {h["url"] for entries in data["hooks"].values() for e in entries for h in e["hooks"]}
    assert urls == {"http://127.0.0.1:9999/hook"}


def test_a_lost_record_does_not_duplicate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hooks(tmp_path, "codex", "--install", capsys=capsys)
    first = (tmp_path / ".codex" / "hooks.json").read_bytes()
    (tmp_path / ".aep" / "installed" / "codex.json").unlink()
    hooks(tmp_path, "codex", "--install", capsys=capsys)
    assert (tmp_path / ".codex" / "hooks.json").read_bytes() == first  # shim entries are recognised as ours


def test_a_file_that_does_not_parse_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"model": ')
    code, _, err = hooks(tmp_path, "claude-code", "--install", capsys=capsys)
    assert code == 1 and "does not parse" in err and "nothing was changed" in err
    assert path.read_text() == '{"model": ' and not (tmp_path / ".aep" / "installed").exists()


def test_a_key_of_another_shape_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / ".qwen" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"hooks": "off"}')
    code, _, err = hooks(tmp_path, "qwen-code", "--install", capsys=capsys)
    assert code == 1 and "hooks is a str" in err and path.read_text() == '{"hooks": "off"}'


def test_uninstall_without_an_install_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed(tmp_path, "hermes")
    before = snapshot(tmp_path)
    code, out, err = hooks(tmp_path, "hermes", "--uninstall", capsys=capsys)
    assert code == 0 and out == "" and "nothing of aep-collector found" in err
    assert snapshot(tmp_path) == before  # not even reformatted


@pytest.mark.parametrize("vendor", ["claude-code", "codex", "kimi-code", "cline", "pi"])
def test_uninstall_without_a_record_removes_what_is_recognisably_ours(
        vendor: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = seed(tmp_path, vendor)
    hooks(tmp_path, vendor, "--install", capsys=capsys)
    (tmp_path / ".aep" / "installed" / f"{vendor}.json").unlink()  # pasted by hand, or the record lost
    for backup in tmp_path.rglob("*.aep-backup"):
        backup.unlink()
    code, out, err = hooks(tmp_path, vendor, "--uninstall", capsys=capsys)
    assert code == 0 and out
    after = snapshot(tmp_path)
    for rel, data in before.items():  # every file of the user's holds what it held (formatting aside)
        kind = "json" if rel.endswith(".json") else rel.rsplit(".", 1)[-1]
        if kind in ("json", "toml", "yaml"):
            assert wiring.load(kind, after[rel].decode(), Path(rel))[0] == wiring.load(kind, data.decode(),
                                                                                       Path(rel))[0], rel
        else:
            assert after[rel] == data, rel
    assert set(after) == set(before)  # files of ours are gone


def test_jsonc_comments_and_trailing_commas_are_read() -> None:
    text = '{\n  // c\n  "a": "http://x//y", /* b */ "b": [1, 2,],\n}\n'
    assert json.loads(wiring.strip_jsonc(text)) == {"a": "http://x//y", "b": [1, 2]}


def test_vendor_env_homes_are_honoured_without_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "cx"))
    target = registration("codex").targets[0]
    assert wiring.resolve(target, None, None) == tmp_path / "cx" / "hooks.json"
    assert wiring.resolve(target, tmp_path / "h", None) == tmp_path / "h" / ".codex" / "hooks.json"


@pytest.mark.parametrize("vendor", ["codex", "gemini-cli", "hermes"])
def test_trust_requirements_are_stated(vendor: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = hooks(tmp_path, vendor, "--install", capsys=capsys)
    assert {"codex": "--dangerously-bypass-hook-trust", "gemini-cli": "trustedFolders.json",
            "hermes": "--accept-hooks"}[vendor] in err


@pytest.mark.parametrize(("url", "why"), [
    ("127.0.0.1:9999", "only http:// receiver URLs are supported"),
    ("https://127.0.0.1:9999", "only http:// receiver URLs are supported"),
    ("http://localhost", "the receiver URL must name its port"),
])
@pytest.mark.parametrize("flag", ["--install", None])
def test_a_url_the_hook_commands_cannot_reach_is_refused(tmp_path: Path, url: str, why: str, flag: str | None,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # It was printed (and installed, exit 0); at every hook the shim refused the URL and answered
    # neutrally, so the agent ran as if unwired and no event ever reached the collector.
    code, out, err = hooks(tmp_path, "codex", *([flag] if flag else []), "--url", url, capsys=capsys)
    assert code == 1 and out == ""
    assert err.strip().splitlines()[-1] == (f"error: --url {url!r}: {why}; the receivers speak plain HTTP, "
                                            "e.g. http://127.0.0.1:8378")
    assert not (tmp_path / ".codex").exists()


def test_an_unknown_vendor_is_one_plain_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = hooks(tmp_path, "claude", capsys=capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: unknown vendor 'claude' (known: "), err  # not the KeyError's quoted repr
