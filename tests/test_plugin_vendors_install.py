"""``aep-collector hooks opencode|kilocode|pi|cline|hermes``: the text names real files and honest timeouts."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from receivers.plugin_vendors import install
from receivers.plugin_vendors.hermes import HermesConfig
from receivers.plugin_vendors.kilocode import KiloCodeConfig
from receivers.plugin_vendors.opencode import OpenCodeConfig
from receivers.plugin_vendors.pi import PiConfig
from receivers.registration import RENDERERS, render


def json_block(text: str) -> Any:
    body = "\n".join(line for line in text.splitlines() if not line.startswith("//"))
    return json.loads(body[body.index("{"):body.rindex("}") + 1])


@pytest.mark.parametrize("vendor", ["opencode", "kilocode", "pi", "cline", "hermes"])
def test_every_vendor_has_a_renderer_for_its_receiver_type(vendor: str) -> None:
    assert RENDERERS[vendor][0] == vendor
    assert render(vendor)  # no config: the reference ports


def test_opencode_names_the_shipped_file_and_the_hold_above_the_window() -> None:
    text = install.render("opencode", None, OpenCodeConfig(endpoint="127.0.0.1:9390", attention_timeout=100.0))
    (cp,) = [line for line in text.splitlines() if line.startswith("cp ")]
    src = Path(shlex.split(cp)[1])
    assert src.is_file() and src.name == "opencode-plugin.js"
    assert "export AEP_OPENCODE_URL=http://127.0.0.1:9390/hook" in text
    assert "export AEP_OPENCODE_HOLD_MS=110000 " in text


def test_kilocode_is_a_plugin_array_entry_with_options() -> None:
    block = json_block(install.render("kilocode", "http://127.0.0.1:7000", KiloCodeConfig(attention_timeout=20.0)))
    ((uri, options),) = block["plugin"]
    assert uri.startswith("file://") and Path(uri[len("file://"):]).is_file()
    assert options == {"url": "http://127.0.0.1:7000/hook", "holdMs": 30000}


def test_pi_is_an_explicit_path_with_its_switches() -> None:
    text = install.render("pi", None, PiConfig(attention_timeout=55.0))
    (path,) = json_block(text)["extensions"]
    assert Path(path).is_file() and path.endswith("pi-extension.js")
    assert f"pi -e {path}" in text and "AEP_PI_HOLD_MS=65000" in text and "AEP_PI_CONTROL=1" in text


def test_cline_hook_files_are_the_names_its_loader_maps() -> None:
    text = install.render("cline", None, None)
    assert "PreCompact" not in text  # the loader maps PreCompact to no event
    (names,) = re.findall(r"^for hook in (.*); do$", text, re.M)
    assert names.split() == list(install.CLINE_HOOK_FILES)
    assert "--url" not in text  # the reference port needs no flag


@pytest.mark.parametrize(("attention", "wait", "timeout"), [(55.0, 60, 85), (300.0, 305, 300)])
def test_hermes_timeouts_stay_above_the_hold_and_within_the_vendor_clamp(attention: float, wait: int,
                                                                         timeout: int) -> None:
    text = install.render("hermes", None, HermesConfig(attention_timeout=attention))
    hooks = yaml.safe_load(text)["hooks"]
    assert sorted(hooks) == sorted(install.HERMES_HOOKS)
    held = hooks["pre_tool_call"][0]
    assert re.search(rf"--wait {wait}\b", held["command"]) and held["timeout"] == timeout
    assert all(h[0]["timeout"] == install.HERMES_SHORT_TIMEOUT and "--wait" not in h[0]["command"]
               for name, h in hooks.items() if name != "pre_tool_call")
    assert ("warning" in text) == (attention == 300.0)
