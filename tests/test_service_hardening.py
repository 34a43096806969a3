"""The service against components that misbehave: a create function that raises or makes
something the pipeline cannot drive is a config error naming the component, and a shutdown that
hangs is left after ``STOP_LIMIT`` so the collector still stops (both typical of a plug-in's bug)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline import cli
from aep_collector.pipeline import service as service_module
from aep_collector.pipeline.component import Factory, Kind
from aep_collector.pipeline.config import ConfigError, parse
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.service import Service

from tests.helpers import base_config, running


@dataclass
class NoConfig:
    pass


class Hangs:
    """An exporter whose shutdown never returns."""

    async def start(self, host: Any) -> None:
        return None

    async def export(self, events: list[dict[str, Any]]) -> None:
        return None

    async def shutdown(self) -> None:
        await asyncio.Event().wait()


def boom(settings: Any, cfg: Any) -> Any:
    raise RuntimeError("missing API key for the sink")


def registry_with(kind: Kind, create: Any) -> Any:
    registry, _ = build_registry(load_plugins=False)
    registry.register(Factory(kind=kind, type="odd", config_class=NoConfig, create=create), "plug-in odd")
    return registry


def config_using(tmp_path: Path, kind: Kind) -> dict[str, Any]:
    raw = base_config(tmp_path)
    spec = raw["service"]["pipelines"]["agents"]
    if kind is Kind.EXPORTER:
        raw["exporters"]["odd"] = None
        spec["exporters"].append("odd")
    else:
        raw["processors"]["odd"] = None
        spec["processors"].insert(0, "odd")
    return raw


@pytest.mark.parametrize("kind, create, says", [
    (Kind.EXPORTER, boom, "exporters.odd: cannot be created: RuntimeError: missing API key for the sink"),
    (Kind.EXPORTER, lambda settings, cfg: None, "exporters.odd: its create function returned NoneType, which has "
                                                "no start, shutdown, export"),
    (Kind.PROCESSOR, lambda settings, cfg: "not callable", "processors.odd: its create function returned str, "
                                                           "which has no __call__"),
], ids=["raises", "exporter-none", "processor-not-callable"])
async def test_a_component_that_cannot_be_created_is_a_config_error_naming_it(tmp_path: Path, kind: Kind,
                                                                              create: Any, says: str) -> None:
    registry = registry_with(kind, create)
    svc = Service(parse(config_using(tmp_path, kind), registry, "test.yaml"), host_name="test-host")
    with pytest.raises(ConfigError) as caught:
        await svc.start()
    assert str(caught.value) == f"test.yaml: {says}"


def test_run_prints_it_as_an_error_and_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    registry = registry_with(Kind.EXPORTER, boom)
    monkeypatch.setattr(cli, "_registry", lambda: registry)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config_using(tmp_path, Kind.EXPORTER)))
    assert cli.cmd_run(str(path)) == 1
    err = capsys.readouterr().err
    assert "error: " in err and "exporters.odd: cannot be created: RuntimeError" in err
    assert "Traceback" not in err


async def test_a_shutdown_that_hangs_is_left_and_the_rest_still_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(service_module, "STOP_LIMIT", 0.2)
    registry = registry_with(Kind.EXPORTER, lambda settings, cfg: Hangs())
    caplog.set_level(logging.ERROR)
    stopped: list[str] = []
    async with running(config_using(tmp_path, Kind.EXPORTER), registry) as svc:
        jsonl = svc.exporters["jsonl"]
        real = jsonl.shutdown

        async def shutdown() -> None:
            await real()
            stopped.append("jsonl")

        jsonl.shutdown = shutdown
    # Out of ``running``: shutdown returned (a hang would stop the test at its timeout), and the
    # JSONL exporter, listed before the hanging one and so stopped after it, was stopped too.
    assert stopped == ["jsonl"]
    assert any("exporter odd did not shut down within 0.2s" in r.getMessage() for r in caplog.records)


def test_a_port_another_program_holds_is_named_with_its_component(tmp_path: Path) -> None:
    # It was "error: cannot start: [Errno 98] ... address already in use": which of the default
    # config's fourteen listeners, the user had to work out from the port.
    import socket
    import subprocess
    import sys

    import yaml

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        raw = base_config(tmp_path, receivers={"claude_code": {"endpoint": f"127.0.0.1:{port}"}})
        path = tmp_path / "taken.yaml"
        path.write_text(yaml.safe_dump(raw))
        out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(path)],
                             capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 1
    assert f"error: {path}: receivers.claude_code: cannot start: " in out.stderr, out.stderr
    assert "address already in use" in out.stderr and "Traceback" not in out.stderr
