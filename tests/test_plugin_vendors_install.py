"""``aep-collector hooks opencode|kilocode|pi|cline|hermes``: the printed text is the file the vendor
reads (the plugin or extension itself, Cline's hook script, Hermes' YAML), with honest timeouts."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from aep_collector.receivers.plugin_vendors import install
from aep_collector.receivers.plugin_vendors.hermes import HermesConfig
from aep_collector.receivers.plugin_vendors.kilocode import KiloCodeConfig
from aep_collector.receivers.plugin_vendors.opencode import OpenCodeConfig
from aep_collector.receivers.plugin_vendors.pi import PiConfig
from aep_collector.receivers.registration import declaration, render

from tests.plugin_vendors_support import NODE


@pytest.mark.parametrize("vendor", ["opencode", "kilocode", "pi", "cline", "hermes"])
def test_every_vendor_has_a_renderer_for_its_receiver_type(vendor: str) -> None:
    assert declaration(vendor).receiver_type == vendor
    assert render(vendor)  # no config: the reference ports


@pytest.mark.parametrize("vendor", ["opencode", "kilocode", "pi"])
def test_the_plugin_is_printed_whole_with_the_default_url(vendor: str) -> None:
    assert render(vendor) == install.js_path(vendor).read_text(encoding="utf-8")


@pytest.mark.parametrize(("vendor", "cfg"), [("opencode", OpenCodeConfig(endpoint="127.0.0.1:9390")),
                                             ("kilocode", KiloCodeConfig(endpoint="127.0.0.1:9391")),
                                             ("pi", PiConfig(endpoint="127.0.0.1:9396"))])
def test_another_endpoint_becomes_the_plugins_default_url(vendor: str, cfg: object, tmp_path: Path) -> None:
    reg = install.render(vendor, None, cfg)
    text = reg.text()
    port = cfg.endpoint.rsplit(":", 1)[1]  # type: ignore[attr-defined]
    assert f'url: "http://127.0.0.1:{port}/hook"' in text and f'url: "{install.default_url(vendor)}"' not in text
    assert not any("URL=" in line for line in reg.advice)  # nothing left for the environment to carry
    module = tmp_path / "plugin.mjs"
    module.write_text(text)
    out = subprocess.run([NODE, "--check", str(module)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr  # still a module node parses


def test_a_longer_hold_is_advised_for_the_environment() -> None:
    reg = install.render("opencode", None, OpenCodeConfig(attention_timeout=100.0))
    assert "AEP_OPENCODE_HOLD_MS=110000" in " ".join(reg.advice)
    assert not any("HOLD_MS" in a for a in install.render("kilocode", None, KiloCodeConfig()).advice)


def test_plugins_go_where_each_host_discovers_them() -> None:
    paths = {v: install.render(v, None, None).targets[0] for v in ("opencode", "kilocode", "pi")}
    assert (paths["opencode"].base, paths["opencode"].path) == ("XDG_CONFIG_HOME:.config",
                                                                "opencode/plugins/aep-collector.js")
    assert (paths["kilocode"].base, paths["kilocode"].path) == ("XDG_CONFIG_HOME:.config",
                                                                "kilo/plugins/aep-collector.js")
    assert (paths["pi"].base, paths["pi"].path) == ("PI_CODING_AGENT_DIR:.pi/agent", "extensions/aep-collector.js")


def test_cline_hook_files_are_the_names_its_loader_maps() -> None:
    reg = install.render("cline", None, None)
    assert [t.path for t in reg.targets] == [f".cline/hooks/{n}" for n in install.CLINE_HOOK_FILES]
    assert "PreCompact" not in install.CLINE_HOOK_FILES  # the loader maps PreCompact to no event
    assert all(t.mode == 0o755 and t.text == reg.text() for t in reg.targets)
    script = reg.text()
    assert script.startswith("#!/bin/sh\nexec /bin/sh -c ")
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    assert "--url" not in shlex.split(script.splitlines()[1])  # the reference port needs no flag


@pytest.mark.parametrize(("attention", "wait", "timeout"), [(55.0, 60, 85), (300.0, 305, 300)])
def test_hermes_timeouts_stay_above_the_hold_and_within_the_vendor_clamp(attention: float, wait: int,
                                                                         timeout: int) -> None:
    reg = install.render("hermes", None, HermesConfig(attention_timeout=attention))
    hooks = yaml.safe_load(reg.text())["hooks"]
    assert hooks == reg.targets[0].data["hooks"]
    assert sorted(hooks) == sorted(install.HERMES_HOOKS)
    held = hooks["pre_tool_call"][0]
    assert re.search(rf"--wait {wait}\b", held["command"]) and held["timeout"] == timeout
    assert all(h[0]["timeout"] == install.HERMES_SHORT_TIMEOUT and "--wait" not in h[0]["command"]
               for name, h in hooks.items() if name != "pre_tool_call")
    assert any("warning" in a for a in reg.advice) == (attention == 300.0)
    assert any("--accept-hooks" in a for a in reg.advice)  # Hermes asks consent: say how to give it
