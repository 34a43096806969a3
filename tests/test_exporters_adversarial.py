"""Adversarial cases of the JSONL, OTLP and CloudEvents exporters and of plug-in loading."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aep_collector.exporters.cloudevents import CloudEventsConfig, CloudEventsExporter
from aep_collector.exporters.jsonl import JsonlConfig, JsonlExporter, repair_torn_tail
from aep_collector.exporters.otlp import OtlpExporter, OtlpExporterConfig
from aep_collector.exporters.otlp.wire import records_of
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.jsonl_files import iter_lines, session_files
from aiohttp import web
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.helpers import ROOT, serve


def ev(seq: int, session: str = "s1", time: str = "2026-01-01T00:00:00.000Z", **kw):
    return {"aep": "0.1", "id": f"id{seq}", "type": "run.started", "time": time,
            "source": "aep://h/agent/a/session/s", "agent": "a", "session": session, "seq": seq, **kw}


async def make(tmp_path: Path, **cfg) -> tuple[JsonlExporter, Host]:
    exp = JsonlExporter(CreateSettings(id="jsonl"), JsonlConfig(directory=str(tmp_path / "logs"), **cfg))
    host = Host(state_dir=tmp_path)
    await exp.start(host)
    return exp, host


def seqs(path: Path) -> list[int]:
    return [json.loads(line)["seq"] for line in iter_lines(path)]


# --- JSONL ------------------------------------------------------------------------------------


async def test_rotating_a_file_someone_moved_away_loses_no_event(tmp_path):
    """logrotate (or a user) moved the session file away: the rotation that falls due next has
    nothing to rename, and the batch goes to a fresh file instead of being dropped."""
    exp, host = await make(tmp_path, rotate_bytes=300, compress=False)
    active = tmp_path / "logs" / "a" / "s1.jsonl"
    assert exp.export_now([ev(0)]) == []
    active.rename(tmp_path / "moved.jsonl")
    assert exp.export_now([ev(1)]) == []  # the open descriptor still writes to the moved file
    for seq in range(2, 6):
        assert exp.export_now([ev(seq)]) == []
    await exp.shutdown()
    written = seqs(tmp_path / "moved.jsonl") + seqs(active)
    assert sorted(written) == list(range(6))
    assert "dropped" not in json.dumps(host.health.snapshot())


async def test_old_stamped_events_do_not_rotate_the_file_on_every_batch(tmp_path):
    """A gateway catching up on a backlog writes events stamped long ago: once a file is closed for
    age, the file that replaces it counts its age from when it was started, not from its first
    event's stamp, or every batch would close a file."""
    exp, _ = await make(tmp_path, rotate_age=3600, compress=False)
    old = "2020-01-01T00:00:00.000Z"
    for seq in range(0, 20, 2):
        assert exp.export_now([ev(seq, time=old), ev(seq + 1, time=old)]) == []
    await exp.shutdown()
    active = tmp_path / "logs" / "a" / "s1.jsonl"
    files = session_files(active)
    assert len(files) == 2  # the file started with the backlog's first batch, closed once
    assert seqs(active) == list(range(20))


async def test_a_reopened_file_keeps_the_age_it_was_started_with(tmp_path):
    """The open-file bound closes and reopens files all the time: a file started after a rotation
    must not take its first (old) event's stamp as its age when it is reopened."""
    exp, _ = await make(tmp_path, rotate_age=3600, compress=False, max_open_files=1)
    old = "2020-01-01T00:00:00.000Z"
    for seq in range(0, 20, 2):
        exp.export_now([ev(seq, time=old)])
        exp.export_now([ev(seq + 1, session="other", time=old)])  # evicts s1's descriptor
    await exp.shutdown()
    assert len(session_files(tmp_path / "logs" / "a" / "s1.jsonl")) == 2
    assert seqs(tmp_path / "logs" / "a" / "s1.jsonl") == list(range(0, 20, 2))


async def test_opening_never_cuts_a_line_another_live_writer_is_still_writing(tmp_path):
    """A second collector on the same directory is mid-way through appending a long line (a reader
    can see part of it): that is not a crash's torn tail. Cutting it would lose the record once its
    write completes; the live writer's shared lock says it is alive."""
    root = tmp_path / "logs" / "a"
    root.mkdir(parents=True)
    path = root / "s1.jsonl"
    line = json.dumps(ev(0)).encode() + b"\n"
    other = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(other, fcntl.LOCK_SH)  # what every live JSONL writer holds on its file
        os.write(other, line[:20])  # the part of its one write a reader sees so far
        # What opening the file does first (``JsonlExporter._open``), while that write is under way.
        assert repair_torn_tail(path) is False
        os.write(other, line[20:])  # the write completes
    finally:
        os.close(other)
    exp, _ = await make(tmp_path)
    assert exp.export_now([ev(1)]) == []
    await exp.shutdown()
    assert seqs(path) == [0, 1]
    assert not list(root.glob("*.torn-*"))


async def test_a_torn_tail_nobody_holds_is_still_cut(tmp_path):
    """The lock check does not stop the repair a crash needs: no live writer, the tail is cut."""
    root = tmp_path / "logs" / "a"
    root.mkdir(parents=True)
    path = root / "s1.jsonl"
    path.write_bytes(json.dumps(ev(0)).encode() + b"\n" + b'{"aep":"0.1","id":"to')
    exp, _ = await make(tmp_path)
    exp.export_now([ev(1)])
    await exp.shutdown()
    assert seqs(path) == [0, 1]
    assert [p.read_bytes() for p in root.glob("s1.jsonl.torn-*")] == [b'{"aep":"0.1","id":"to']


# --- OTLP and CloudEvents: the capture ceiling in the bytes a real peer receives ---------------

SECRET_SUBJECT = "cat /home/alice/.aws/credentials AKIAIOSFODNN7EXAMPLE password=hunter2"


def full_event() -> dict:
    return {"aep": "0.1", "id": "01J00000000000000000000000", "type": "tool.started",
            "time": "2026-01-01T00:00:00.000Z", "source": "aep://h/agent/a/session/s", "agent": "a",
            "session": "s", "seq": 1, "capture": "full", "subject": SECRET_SUBJECT,
            "data": {"tool": "Bash", "input": {"command": "echo hunter2"}}}


async def capture_peer() -> tuple[Any, str, list[bytes]]:
    """A loopback HTTP peer that takes every POST (2xx) and keeps its body."""
    bodies: list[bytes] = []

    async def take(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/{tail:.*}", take)
    runner, port = await serve(app)
    return runner, f"http://127.0.0.1:{port}", bodies


async def test_otlp_screens_the_envelope_of_an_event_above_its_ceiling(tmp_path):
    """Above ``max_capture`` the OTLP exporter drops the data; the subject (a command line, a key)
    must not leave verbatim either: it is screened as the CloudEvents exporter's hop screens it."""
    runner, url, bodies = await capture_peer()
    exp = OtlpExporter(CreateSettings(id="otlp"), OtlpExporterConfig(protocol="http", endpoint=f"{url}/v1/logs"))
    await exp.start(Host(state_dir=tmp_path))
    try:
        await exp.deliver([full_event()])
    finally:
        await exp.shutdown()
        await runner.cleanup()
    (body,) = bodies
    (record,) = records_of(ExportLogsServiceRequest.FromString(body))
    assert record["attributes"]["aep.event_id"] == "01J00000000000000000000000"  # it was delivered
    for secret in (b"AKIAIOSFODNN7EXAMPLE", b"hunter2", b"/home/alice"):
        assert secret not in body
    assert "body" not in record


async def test_cloudevents_and_otlp_leave_the_same_subject_above_the_ceiling(tmp_path):
    runner, url, bodies = await capture_peer()
    otlp = OtlpExporter(CreateSettings(id="otlp"), OtlpExporterConfig(protocol="http", endpoint=f"{url}/v1/logs"))
    ce = CloudEventsExporter(CreateSettings(id="cloudevents"), CloudEventsConfig(endpoint=f"{url}/ce"))
    host = Host(state_dir=tmp_path)
    await otlp.start(host)
    await ce.start(host)
    try:
        await otlp.deliver([full_event()])
        await ce.deliver([full_event()])
    finally:
        await otlp.shutdown()
        await ce.shutdown()
        await runner.cleanup()
    (record,) = records_of(ExportLogsServiceRequest.FromString(bodies[0]))
    (cloudevent,) = json.loads(bodies[1])
    assert record["attributes"]["aep.subject"] == cloudevent["subject"] != SECRET_SUBJECT


# --- Plug-ins -----------------------------------------------------------------------------------

BAD_PLUGINS = '''
import dataclasses
from dataclasses import dataclass
from aep_collector.api import exporter_factory


class Exp:
    async def start(self, host): ...
    async def export(self, events): ...
    async def shutdown(self): ...


@dataclass
class NeedsUrl:
    url: str  # no default: there is no default config


class NotADataclass:
    pass


@dataclass
class Fine:
    path: str = "/tmp/x"


NO_DEFAULT = exporter_factory("no_default", NeedsUrl, lambda s, c: Exp())
NOT_DATACLASS = exporter_factory("not_dataclass", NotADataclass, lambda s, c: Exp())
SLASHED = exporter_factory("my/exporter", Fine, lambda s, c: Exp())
GOOD = exporter_factory("good_one", Fine, lambda s, c: Exp())

from aep_collector.receivers.claude_code import DECLARATION

# Another receiver type declaring the built-in claude-code vendor with a mapping of its own.
HIJACK = dataclasses.replace(DECLARATION, receiver_type="cc_copy", mapping="aep_bad_plugins").factory()
'''


def bad_site(tmp_path: Path, entries: dict[str, str], modules: dict[str, str]) -> dict[str, str]:
    """An installed distribution (dist-info and modules) whose entry points are ``entries``."""
    site = tmp_path / "site"
    dist = site / "aep_bad-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: aep-bad\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[aep_collector.components]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    for name, text in modules.items():
        (site / f"{name}.py").write_text(text)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def test_a_plugin_that_exits_on_import_is_reported_not_fatal(tmp_path):
    env = bad_site(tmp_path, {"quits": "aep_quits:FACTORY", "good": "aep_bad_plugins:GOOD"},
                   {"aep_quits": "import sys\nsys.exit(3)\n", "aep_bad_plugins": BAD_PLUGINS})
    res = cli(env, "components")
    assert res.returncode == 0, res.stderr
    assert "warning: plug-in quits" in res.stderr and "SystemExit" in res.stderr
    assert "good_one" in res.stdout and "claude_code" in res.stdout


def test_plugins_whose_config_has_no_default_are_reported_and_left_out(tmp_path):
    env = bad_site(tmp_path, {"no_default": "aep_bad_plugins:NO_DEFAULT", "not_dc": "aep_bad_plugins:NOT_DATACLASS",
                              "slashed": "aep_bad_plugins:SLASHED", "good": "aep_bad_plugins:GOOD"},
                   {"aep_bad_plugins": BAD_PLUGINS})
    res = cli(env, "components", "--json")
    assert res.returncode == 0, res.stderr
    exporters = json.loads(res.stdout)["exporters"]
    assert exporters["good_one"]["default_config"] == {"path": "/tmp/x"}
    assert not {"no_default", "not_dataclass", "my/exporter"} & exporters.keys()
    for name in ("no_default", "not_dc", "slashed"):
        assert f"warning: plug-in {name}" in res.stderr
    assert "is not a dataclass" in res.stderr and "needs a default" in res.stderr
    # A config naming the refused type is a config error naming it, not a traceback.
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({
        "receivers": {"claude_code": {"endpoint": "127.0.0.1:0"}}, "processors": {"mapping": None},
        "exporters": {"not_dataclass": None},
        "service": {"state_dir": str(tmp_path / "state"), "pipelines": {"a": {
            "receivers": ["claude_code"], "processors": ["mapping"], "exporters": ["not_dataclass"]}}}}))
    res = cli(env, "validate", "--config", str(config))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "not_dataclass" in res.stderr


def test_a_plugin_cannot_take_over_a_built_in_vendor(tmp_path):
    env = bad_site(tmp_path, {"hijack": "aep_bad_plugins:HIJACK"}, {"aep_bad_plugins": BAD_PLUGINS})
    probe = ("from aep_collector.pipeline.component import Kind\n"
             "from aep_collector.pipeline.registry import build_registry\n"
             "registry, problems = build_registry()\n"
             "print(registry.vendors()['claude-code'].mapping)\n"
             "print(registry.get(Kind.RECEIVER, 'cc_copy'))\n"
             "print(problems)\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=120, check=True)
    mapping, copy, problems = res.stdout.splitlines()
    assert mapping != "aep_bad_plugins" and copy == "None"
    assert "plug-in hijack" in problems and "already declared" in problems


@pytest.mark.parametrize("make", [
    lambda url: CloudEventsConfig(endpoint=url),
    lambda url: OtlpExporterConfig(protocol="http", endpoint=url),
    lambda url: OtlpExporterConfig(protocol="grpc", endpoint=url),
], ids=["cloudevents", "otlp-http", "otlp-grpc"])
@pytest.mark.parametrize("url", ["http://ops:s3cret-pw@127.0.0.1:99999/v1?access_token=s3cret-tok",
                                 "ops:s3cret-pw@127.0.0.1:99999"])
def test_a_bad_endpoint_is_named_without_its_credentials(make: Any, url: str) -> None:
    # The error reaches the terminal and the log: the password and a query token stay out of it.
    with pytest.raises(ValueError) as refused:
        make(url).validate()
    assert "s3cret" not in str(refused.value) and "127.0.0.1" in str(refused.value)
