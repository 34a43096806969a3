"""Plug-ins: a real package, installed with pip, registers components through entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import ROOT, base_config, collector, read_jsonl

PLUGIN = Path(__file__).parent / "plugin_exporter"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(PLUGIN)], check=True, capture_output=True, text=True)
    return target


def env_with(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def fake_plugin(site: Path, name: str, target: str, source: str | None = None) -> Path:
    """A plug-in distribution ``aep-<name>`` in ``site`` whose entry point ``name`` is ``target``
    (``module:attribute``); ``source``, if given, is the module ``aep_<name>.py``. Returns ``site``."""
    dist = site / f"aep_{name}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: aep-{name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[aep_collector.components]\n{name} = {target}\n")
    if source is not None:
        (site / f"aep_{name}.py").write_text(source)
    return site


def test_components_lists_the_plugin_with_its_origin(plugin_site):
    out = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "components"], capture_output=True, text=True,
                         cwd=ROOT, env=env_with(plugin_site), check=True).stdout
    assert "ndjson_file" in out and "plug-in ndjson_file" in out and "aep-plugin-sample" in out
    assert "shout" in out
    js = json.loads(subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "components", "--json"],
                                   capture_output=True, text=True, cwd=ROOT, env=env_with(plugin_site),
                                   check=True).stdout)
    assert js["exporters"]["ndjson_file"]["default_config"] == {"path": "/tmp/aep-plugin-sample.txt"}


def test_a_pipeline_runs_through_the_plugin_exporter_and_processor(plugin_site, tmp_path):
    out_file = tmp_path / "plugin-out.txt"
    cfg = base_config(tmp_path)
    cfg["processors"]["shout"] = {"mark": "hello"}
    cfg["exporters"]["ndjson_file"] = {"path": str(out_file)}
    pipe = cfg["service"]["pipelines"]["agents"]
    pipe["processors"].append("shout")
    pipe["exporters"].append("ndjson_file")
    with collector(cfg, tmp_path, env={"PYTHONPATH": env_with(plugin_site)["PYTHONPATH"]}) as c:
        port = c.ports["receiver/claude_code"]
        for name in ("SessionStart", "UserPromptSubmit", "Stop"):
            body = json.dumps({"session_id": "p1", "hook_event_name": name}).encode()
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/hook", data=body), timeout=10)
        assert c.stop() == 0
    lines = out_file.read_text().splitlines()
    assert lines == ["session.started p1 0 hello", "run.started p1 1 hello", "run.finished p1 2 hello"]
    events = read_jsonl(tmp_path / "logs" / "claude-code" / "p1.jsonl")
    assert [e["pluginmark"] for e in events] == ["hello"] * 3  # the extension reached the durable record too


def test_a_broken_plugin_is_reported_not_fatal(tmp_path):
    site = fake_plugin(tmp_path / "broken", "broken", "aep_broken_missing:FACTORY")
    res = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "components"], capture_output=True, text=True,
                         cwd=ROOT, env=env_with(site))
    assert res.returncode == 0
    assert "warning: plug-in broken" in res.stderr and "ModuleNotFoundError" in res.stderr
    assert "claude_code" in res.stdout


UNRESOLVED = '''\
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aep_collector.api import exporter_factory

if TYPE_CHECKING:
    from pathlib import Path


@dataclass
class Config:
    path: Path | None = None


FACTORY = exporter_factory("late_hints", Config, lambda settings, config: None)
'''


def test_a_plugin_whose_config_types_do_not_resolve_is_reported_at_load(tmp_path):
    # Its factory loaded and `components` listed it, then validate and run died with a NameError
    # traceback: the config reads each field's annotation, here imported only for type checkers.
    site = fake_plugin(tmp_path / "late", "late", "aep_late:FACTORY", UNRESOLVED)
    cfg = base_config(tmp_path)
    cfg["exporters"]["late_hints"] = None
    cfg["service"]["pipelines"]["agents"]["exporters"].append("late_hints")
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    res = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "validate", "--config", str(path)],
                         capture_output=True, text=True, cwd=ROOT, env=env_with(site))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "warning: plug-in late" in res.stderr
    assert "exporter type 'late_hints': the field types of its config cannot be resolved (NameError" in res.stderr
    assert f"error: {path}: exporters.late_hints: unknown exporter type 'late_hints'" in res.stderr


CRASHING_CHECK = '''\
from dataclasses import dataclass

from aep_collector.api import exporter_factory


@dataclass
class Config:
    limit: int = 1

    def validate(self) -> None:
        if self.limit > "10":  # the plug-in's bug: TypeError, not the ValueError of a finding
            raise ValueError("limit must be at most 10")


FACTORY = exporter_factory("odd_check", Config, lambda settings, config: None)
'''


def test_a_plugin_config_check_that_crashes_is_an_error_naming_the_component(tmp_path):
    # validate and run printed the TypeError's traceback; a crashing create was already named.
    site = fake_plugin(tmp_path / "odd", "odd", "aep_odd:FACTORY", CRASHING_CHECK)
    cfg = base_config(tmp_path)
    cfg["exporters"]["odd_check"] = {"limit": 3}
    cfg["service"]["pipelines"]["agents"]["exporters"].append("odd_check")
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    for command in (["validate", "--config", str(path)], ["--config", str(path)]):
        res = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", *command],
                             capture_output=True, text=True, cwd=ROOT, env=env_with(site), timeout=120)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert (f"error: {path}: exporters.odd_check: its config check failed: TypeError: '>' not supported"
                in res.stderr)


HALF_CLASHING = '''\
from dataclasses import dataclass

from aep_collector.api import exporter_factory, processor_factory


@dataclass
class Config:
    mark: str = ""


FACTORIES = [processor_factory("half_ok", Config, lambda settings, config: (lambda batch: batch)),
             exporter_factory("jsonl", Config, lambda settings, config: None)]  # a built-in's type
'''


def test_a_plugin_whose_second_factory_clashes_registers_none_of_them(tmp_path):
    # The first factory stayed registered under a "cannot load" warning: components listed
    # half_ok, and a config could use half a plug-in said not to be loaded.
    site = fake_plugin(tmp_path / "half", "half", "aep_half:FACTORIES", HALF_CLASHING)
    res = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "components"], capture_output=True,
                         text=True, cwd=ROOT, env=env_with(site))
    assert res.returncode == 0
    assert "warning: plug-in half" in res.stderr and "exporter type 'jsonl'" in res.stderr
    assert "half_ok" not in res.stdout and "jsonl" in res.stdout


@pytest.mark.parametrize("command", [["components"], ["validate", "--config", str(ROOT / "config" / "default.yaml")]])
def test_a_broken_plugin_is_told_once(tmp_path, command):
    # Each problem was printed twice: the registry's own log line ("cannot load plug-in ...", bare,
    # logging not yet set up) and the CLI's "warning: plug-in ..." line.
    site = fake_plugin(tmp_path / "broken", "broken", "aep_broken_missing:FACTORY")
    res = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", *command], capture_output=True,
                         text=True, cwd=ROOT, env=env_with(site))
    assert res.returncode == 0, res.stderr
    told = [line for line in res.stderr.splitlines() if "aep_broken_missing" in line]
    assert len(told) == 1 and told[0].startswith("warning: plug-in broken"), res.stderr
