"""The CLI's promises under hostile input: a config that is not UTF-8, has duplicate keys or many
errors at once; a damaged ``.jsonl.gz``; a wrong relay token given to ``status``; ``${env:...}`` in
number keys. Each goes through the real CLI (``main()`` or the installed executable) and real files.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from aep_collector.pipeline import operator_cli
from aep_collector.pipeline.cli import main
from aep_collector.pipeline.config import ConfigError, build_dataclass, load, parse
from aep_collector.pipeline.registry import build_registry

EXE = Path(sys.executable).with_name("aep-collector")


@pytest.fixture(scope="module")
def registry() -> Any:
    reg, problems = build_registry(load_plugins=False)
    assert problems == []
    return reg


def _config_text(tmp: Path) -> str:
    return ("receivers: {claude_code: {endpoint: '127.0.0.1:0'}}\n"
            "processors: {mapping: , runs: , capture: }\n"
            f"exporters: {{jsonl: {{directory: '{tmp}/logs'}}}}\n"
            f"service: {{state_dir: '{tmp}/state', pipelines: {{a: {{receivers: [claude_code], "
            "processors: [mapping, runs, capture], exporters: [jsonl]}}}\n")


def _errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error: ")]


# -- 1. a config that is not UTF-8 -----------------------------------------------------------------


@pytest.mark.parametrize(("encode", "needle"), [
    (lambda t: ("# du collecteur \u00e9t\u00e9\n" + t).encode("latin-1"), "not UTF-8: byte 0xe9 at line 1, column 17"),
    (lambda t: t.encode("utf-16"), "is UTF-16"),                 # with its byte order mark
    (lambda t: t.encode("utf-16-le"), "contains NUL bytes"),     # without one
])
@pytest.mark.parametrize("command", [["validate", "--config"], ["--config"]])
def test_a_config_that_is_not_utf8_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     encode: Any, needle: str, command: list[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(encode(_config_text(tmp_path)))
    assert main([*command, str(path)]) == 1
    (line,) = _errors(capsys)
    assert line.startswith(f"error: {path}: ") and needle in line and "save" in line


def test_a_utf8_config_with_a_byte_order_mark_still_loads(tmp_path: Path, registry: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + _config_text(tmp_path).encode())
    assert list(load(path, registry).pipelines) == ["a"]


def test_a_yaml_syntax_error_names_the_file_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("receivers:\n  claude_code: {endpoint: [1\nexporters: {}\n")
    assert main(["validate", "--config", str(path)]) == 1
    (line,) = _errors(capsys)
    assert line.startswith(f"error: {path}: not valid YAML: line 3, column 10: ")
    assert "<unicode string>" not in line


# -- 2. a corrupt rotated .jsonl.gz ----------------------------------------------------------------


def _session_with_corrupt_archive(tmp: Path) -> tuple[Path, Path]:
    ev = {"aep": "0.1", "type": "tool.requested", "time": "2025-01-01T00:00:00.000Z",
          "source": "aep://h/agent/a/session/s", "agent": "a", "session": "s", "epoch": 0}
    lines = b"".join((json.dumps({**ev, "seq": i, "id": f"01JX{i:022d}"}) + "\n").encode() for i in range(1, 2000))
    data = bytearray(gzip.compress(lines))
    for i in range(200, 260):  # media corruption inside the deflate stream
        data[i] ^= 0x55
    with pytest.raises(zlib.error):  # the damage this test is about, not a short read or a bad CRC
        gzip.decompress(bytes(data))
    archive = tmp / "s@20250101T000000.000000Z.jsonl.gz"
    archive.write_bytes(bytes(data))
    live = tmp / "s.jsonl"
    live.write_bytes(b"")
    return live, archive


def test_validate_events_reports_a_corrupt_archive_as_unreadable(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    live, archive = _session_with_corrupt_archive(tmp_path)
    for target in (live, archive):  # through the session's live file, and the archive alone
        assert main(["validate-events", str(target)]) == 2
        out = capsys.readouterr()
        assert out.out == "" and "Traceback" not in out.err
        (line,) = out.err.splitlines()
        assert f"cannot read {target}" in line and f"{archive}: compressed file is corrupt" in line


@pytest.mark.parametrize("args", [["timeline", "s"], ["tail"]])
def test_operator_file_reads_report_a_corrupt_archive_as_bad_input(tmp_path: Path, args: list[str]) -> None:
    live, archive = _session_with_corrupt_archive(tmp_path)
    env = {**os.environ, "AEP_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.run([str(EXE), *args, "--file", str(live)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == operator_cli.USAGE, p.stderr
    (line,) = p.stderr.splitlines()
    assert line.startswith(f"error: cannot read {live}: {archive}: compressed file is corrupt")


def test_an_unexpected_error_is_named_once(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    async def broken(args: Any) -> int:
        raise zlib.error("Error -3 while decompressing data")

    monkeypatch.setitem(operator_cli.COMMANDS, "pending", broken)
    assert main(["pending"]) == operator_cli.REJECTED
    assert capsys.readouterr().err == "error: zlib.error: Error -3 while decompressing data\n"


# -- 3. every error of the file at once ------------------------------------------------------------


def test_validate_lists_key_type_and_value_errors_together(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"""receivers:
  claude_code: {{endpoint: "127.0.0.1:notaport", bogus: 1}}
processors: {{mapping: , runs: , capture: }}
exporters:
  jsonl: {{directory: {tmp_path}/logs}}
  cloudevents: {{endpoint: "ftp://x", timeout: -1, sending_queue: {{batch_size: 0, max_bytes: 1, unknown: 1}}}}
service:
  pipelines:
    a: {{receivers: [claude_code], processors: [mapping, runs, capture], exporters: [jsonl, cloudevents]}}
""")
    assert main(["validate", "--config", str(path)]) == 1
    found = [line.removeprefix(f"error: {path}: ").split(" (known keys")[0] for line in _errors(capsys)]
    assert found == [
        "receivers.claude_code.bogus: unknown key",
        "receivers.claude_code.endpoint: expected host:port, got '127.0.0.1:notaport'",
        "exporters.cloudevents.sending_queue.unknown: unknown key",
        # one validate() that stops at its first problem still shows them all, each at its key
        "exporters.cloudevents.sending_queue.max_bytes: max_bytes must be at least 65536",
        "exporters.cloudevents.sending_queue.batch_size: batch_size must be at least 1",
        "exporters.cloudevents.endpoint: endpoint must be an http(s) URL, got 'ftp://x': not an http(s) URL with a host",
        "exporters.cloudevents.timeout: timeout must be positive",
    ]


@dataclasses.dataclass
class _Range:
    lo: int = 10
    hi: int = 20
    step: float = 1.0

    def validate(self) -> None:
        if self.lo < 0:
            raise ValueError("lo must not be negative")
        if self.hi < self.lo:
            raise ValueError("hi must be at least lo")
        if self.step <= 0:
            raise ValueError("step must be positive")


def _problems(raw: dict[str, Any], cls: type = _Range) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        build_dataclass(cls, raw, "f.yaml", "exporters.x")
    return [(e.path, e.message) for e in info.value.errors]


def test_a_default_standing_in_for_a_bad_value_does_not_invent_errors() -> None:
    # lo=-5 is reported; re-checked with lo's default (10), hi=3 fails "hi must be at least lo",
    # which with the file's lo it does not: fallout, not reported. step's own problem still is.
    assert _problems({"lo": -5, "hi": 3, "step": 0}) == [
        ("exporters.x.lo", "lo must not be negative"), ("exporters.x.step", "step must be positive")]
    # A key of the wrong type is one error; the default standing in for it is not judged.
    assert _problems({"lo": "many", "step": -1}) == [
        ("exporters.x.lo", "expected an integer, got string 'many'"), ("exporters.x.step", "step must be positive")]


@dataclasses.dataclass
class _Listing:
    url: str = ""
    tries: int = 1

    def validate(self) -> None:  # the way to report several problems with no framework import
        raise ExceptionGroup("config", [ValueError("url is required"), ValueError("tries must be at most 0")])


def test_validate_may_raise_every_problem_as_an_exception_group() -> None:
    assert _problems({"tries": 3, "spare": 1}, _Listing) == [
        ("exporters.x.spare", "unknown key (known keys: tries, url)"),
        ("exporters.x.url", "url is required"), ("exporters.x.tries", "tries must be at most 0")]


# -- 4. duplicate keys -----------------------------------------------------------------------------


def test_duplicate_keys_are_errors_naming_path_and_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(_config_text(tmp_path) + "\n".join([
        "# ... much later in a long file",
        "processors:",
        "  capture: {ceiling: metadata, ceiling: full}",
    ]) + "\n")
    for command in (["validate", "--config"], ["--config"]):  # run refuses it as validate does
        assert main([*command, str(path)]) == 1
        assert _errors(capsys) == [
            f"error: {path}: processors: duplicate key (line 2, again at line 6): keys must be unique; "
            "the later one would silently replace the first",
            f"error: {path}: processors.capture.ceiling: duplicate key (line 7, column 13, again at column 32): "
            "keys must be unique; the later one would silently replace the first"]


def test_merge_keys_and_aliases_are_not_duplicates(tmp_path: Path, registry: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"""base: &b {{directory: {tmp_path}/x, fsync: never}}
receivers: {{claude_code: {{endpoint: '127.0.0.1:0'}}}}
processors: {{mapping: , runs: , capture: }}
exporters:
  jsonl: &j {{directory: {tmp_path}/logs}}
  jsonl/two:
    <<: *b
    directory: {tmp_path}/y
  jsonl/three: *j
service: {{pipelines: {{a: {{receivers: [claude_code], processors: [mapping, runs, capture],
                            exporters: [jsonl, jsonl/two, jsonl/three]}}}}}}
""")
    with pytest.raises(ConfigError) as info:
        load(path, registry)
    # the only problem: the override of a merged key and the alias are no duplicates
    assert [(e.path, e.message.split(" (")[0]) for e in info.value.errors] == [("base", "unknown top-level key")]


# -- 5. status with a wrong token ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_says_the_token_was_refused(tmp_path: Path) -> None:
    state, relay = tmp_path / "state", _free_port()
    cfg = yaml.safe_load(_config_text(tmp_path))
    cfg["receivers"]["claude_code"]["endpoint"] = f"127.0.0.1:{_free_port()}"
    cfg["exporters"]["relay_server"] = {"endpoint": f"127.0.0.1:{relay}"}
    cfg["service"]["pipelines"]["a"]["exporters"].append("relay_server")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_")}
    env.update(AEP_STATE_DIR=str(state), HOME=str(tmp_path))
    collector = subprocess.Popen([str(EXE), "--config", str(path)], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{relay}/healthz", timeout=1).close()
                if (state / "relay.json").exists():
                    break
            except OSError:
                pass
            assert collector.poll() is None and time.monotonic() < deadline, "the collector did not start"
            time.sleep(0.1)

        def status(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(EXE), "status", "--config", str(path), *args], env=env,
                                  capture_output=True, text=True, timeout=60)

        wrong = status("--token", "WRONG")
        assert wrong.returncode == operator_cli.UNREACHABLE, wrong.stdout + wrong.stderr
        assert f"relay role: http://127.0.0.1:{relay}: token refused" in wrong.stdout
        assert wrong.stderr == "error: the collector refused the token: check AEP_TOKEN or --token\n"
        right = status()  # the token file relay.json names
        assert right.returncode == operator_cli.OK, right.stdout + right.stderr
        assert "0 sessions" in right.stdout and "refused" not in right.stdout + right.stderr
    finally:
        collector.terminate()
        collector.wait(timeout=30)


# -- 6. ${env:...} in number keys ------------------------------------------------------------------


def test_env_values_fill_number_keys_like_integer_and_boolean_ones(tmp_path: Path, registry: Any) -> None:
    raw = yaml.safe_load(_config_text(tmp_path))
    raw["receivers"]["claude_code"].update(reply_timeout="${env:RT:-5}", max_body_bytes="${env:MB:-1048576}")
    raw["exporters"]["jsonl"].update(fsync_interval="${env:FI:-1.5}", compress="${env:C:-true}")
    cfg = parse(raw, registry, "mem.yaml", env={"FI": " 2.5e-1 "})
    receiver, jsonl = cfg.receivers["claude_code"][1], cfg.exporters["jsonl"][1]
    assert receiver.reply_timeout == 5.0 and isinstance(receiver.reply_timeout, float)
    assert jsonl.fsync_interval == 0.25 and jsonl.compress is True
    with pytest.raises(ConfigError) as info:
        parse(raw, registry, "mem.yaml", env={"FI": "soon", "RT": "inf"})
    assert [(e.path, e.message) for e in info.value.errors] == [
        ("receivers.claude_code.reply_timeout", "expected a number, got string 'inf'"),
        ("exporters.jsonl.fsync_interval", "expected a number, got string 'soon'")]


PORT_CONFIG = """\
receivers:
  codex: {endpoint: "127.0.0.1:9378"}
processors: {mapping: , runs: , capture: }
exporters:
  jsonl: {directory: "DIR/logs"}
service:
  state_dir: DIR/state
  pipelines:
    p: {receivers: [codex], processors: [mapping, runs, capture], exporters: [jsonl]}
"""


def test_a_config_given_before_the_command_is_the_one_it_reads(tmp_path: Path) -> None:
    # `aep-collector --config FILE hooks codex` printed the registration for the default port 8378
    # (the hooks then reached no receiver of this config) and `--config FILE status` checked the
    # default config's ports: the --config before the command was dropped without a word.
    path = tmp_path / "c.yaml"
    path.write_text(PORT_CONFIG.replace("DIR", str(tmp_path)))
    exe = [sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(path)]
    env = {**os.environ, "HOME": str(tmp_path), "AEP_STATE_DIR": str(tmp_path / "state")}
    hooks = subprocess.run([*exe, "hooks", "codex", "--home", str(tmp_path)], capture_output=True, text=True,
                           env=env)
    assert hooks.returncode == 0, hooks.stderr
    assert "--url http://127.0.0.1:9378" in hooks.stdout
    status = subprocess.run([*exe, "status"], capture_output=True, text=True, env=env)
    listed = [line.split()[:2] for line in status.stdout.splitlines() if line.startswith("    ")]
    assert ["codex", "127.0.0.1:9378"] in listed and ["claude_code", "127.0.0.1:8377"] not in listed, status.stdout
    validate = subprocess.run([*exe, "validate"], capture_output=True, text=True, env=env)
    assert validate.returncode == 0 and f"{path}: valid" in validate.stdout, validate.stderr
    ignored = subprocess.run([*exe, "components"], capture_output=True, text=True, env=env)
    assert ignored.returncode == 2 and "--config does not apply to components" in ignored.stderr



def _block_config(tmp: Path, receiver: str) -> str:
    return (f"receivers:\n  claude_code:\n{receiver}"
            "processors: {mapping: , runs: , capture: }\n"
            f"exporters: {{jsonl: {{directory: '{tmp}/logs'}}}}\n"
            f"service: {{state_dir: '{tmp}/state', pipelines: {{a: {{receivers: [claude_code], "
            "processors: [mapping, runs, capture], exporters: [jsonl]}}}\n")


@pytest.mark.parametrize(("value", "needle"), [
    ("2026-02-30", "line 4, column 20: 2026-02-30 reads as a date and is not one (day is out of range for month); "
                   "quote it if it is text"),
    ("1" + "0" * 5000, "line 4, column 20: 1000000000000000000000000000000000000000... reads as an integer and is "
                       "not one (Exceeds the limit (4300 digits)"),
])
def test_a_plain_value_yaml_cannot_build_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           value: str, needle: str) -> None:
    # An unquoted 2026-02-30 (a header value, a token) matches YAML's date pattern, and building the
    # date raised ValueError: validate and run printed a traceback naming neither file nor line.
    path = tmp_path / "c.yaml"
    path.write_text(_block_config(tmp_path, f"    # a comment\n    reply_timeout: {value}\n"))
    assert main(["validate", "--config", str(path)]) == 1
    (line,) = _errors(capsys)
    assert line.startswith(f"error: {path}: not valid YAML: {needle}"), line


def test_a_whole_number_too_big_for_a_float_key_is_an_error_at_its_key(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"  # float(10**400) raised OverflowError out of validate
    path.write_text(_block_config(tmp_path, f"    reply_timeout: 1{'0' * 400}\n"))
    assert main(["validate", "--config", str(path)]) == 1
    (line,) = _errors(capsys)
    assert line.startswith(f"error: {path}: receivers.claude_code.reply_timeout: expected a finite number"), line


def test_ctrl_c_while_the_config_is_read_exits_130_without_a_traceback(tmp_path: Path) -> None:
    # Before the collector's own signal handler is in place (the config read, plug-ins imported),
    # SIGINT raised KeyboardInterrupt out of main: a traceback. The config here is a FIFO no one
    # writes (as `--config <(envsubst < tpl)` is while the writer works), so the read blocks.
    import errno
    import signal

    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(fifo)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    writer = None
    try:
        while writer is None:  # a non-blocking open for writing succeeds once the reader has it open
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO and proc.poll() is None
                time.sleep(0.01)
        # Then wait until it sleeps in read(): a signal that lands just before that read is only
        # acted on once the read returns (Python checks for signals between bytecodes).
        wchan = Path(f"/proc/{proc.pid}/wchan")
        while "pipe_read" not in wchan.read_text():
            assert proc.poll() is None
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
