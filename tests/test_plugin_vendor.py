"""A third-party vendor added through entry points alone (the Done-when of issue #14).

``tests/plugin_vendor/`` is a separate distribution, installed here with pip: one mapping module,
one receiver module whose ``VendorDeclaration`` its factory carries, one entry point. Nothing in
the collector names it, and the pipeline config has no ``extra_vendors``. It gets
``aep-collector hooks quill``, the shim's copy knows it (its neutral reply when the collector is
down), and its hook calls arrive end to end as mapped AEP events in the JSONL log. Every part is
real: the pip-installed package, the CLI and the collector as subprocesses, the registered
command run with ``/bin/sh`` exactly as Quill would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, base_config, collector, read_jsonl

PLUGIN = Path(__file__).parent / "plugin_vendor"
NEUTRAL = b'{"proceed": true}'


@pytest.fixture(scope="module")
def vendor_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("vendor-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                    str(PLUGIN)], check=True, capture_output=True, text=True)
    return target


def env_with(site: Path, hook_dir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "AEP_HOOK_DIR": str(hook_dir)}


def cli(site: Path, hook_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env_with(site, hook_dir), timeout=120)


def run_hook(command: str, payload: dict[str, str]) -> tuple[int, bytes]:
    """The registered command as the vendor runs it: ``/bin/sh -c``, payload on stdin, a bare environment."""
    out = subprocess.run(command, shell=True, input=json.dumps(payload).encode(), capture_output=True,
                         env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=60)
    return out.returncode, out.stdout


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_components_lists_the_vendor_receiver(vendor_site: Path, hook_dir: Path) -> None:
    out = cli(vendor_site, hook_dir, "components", "--json")
    assert out.returncode == 0, out.stderr
    receivers = json.loads(out.stdout)["receivers"]
    assert receivers["quill"]["default_config"]["endpoint"] == "127.0.0.1:8499"  # from the declaration


def test_hooks_prints_the_wiring_and_the_shim_answers_neutrally_when_down(vendor_site: Path, hook_dir: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    out = cli(vendor_site, hook_dir, "hooks", "quill", "--url", url)
    assert out.returncode == 0, out.stderr
    assert "~/.quill/hooks.json" in out.stderr  # the declaration's renderer's advice
    hooks = json.loads(out.stdout)["hooks"]
    assert sorted(hooks) == ["ask", "begin", "done", "end"]
    # The copy and its table, generated from the declarations, plug-ins included.
    table = (hook_dir / "bin" / "aep_collector_hook_vendors.py").read_text()
    assert "'quill': {'port': 8499, 'neutral': b'{\"proceed\": true}'" in table
    # Nothing listens: the registered command prints Quill's declared neutral reply and exits 0.
    assert run_hook(hooks["begin"], {"event": "begin", "session": "q0"}) == (0, NEUTRAL)
    # The shim copy itself (not the /bin/sh fallback) knows the vendor from its table.
    code = "import sys;sys.path[:0]=[sys.argv.pop(1)];import aep_collector_hook as s;sys.exit(s.main())"
    shim = subprocess.run([sys.executable, "-S", "-I", "-c", code, str(hook_dir / "bin"), "quill", "ask",
                           "--url", url], input=b'{"event": "ask"}', capture_output=True, timeout=60)
    assert (shim.returncode, shim.stdout) == (0, NEUTRAL)


def test_hook_calls_arrive_end_to_end_as_mapped_events(vendor_site: Path, hook_dir: Path, tmp_path: Path) -> None:
    cfg = base_config(tmp_path, receivers={"quill": {"endpoint": "127.0.0.1:0"}})
    assert "extra_vendors" not in json.dumps(cfg)  # the mapping is found through the declaration
    env = {k: v for k, v in env_with(vendor_site, hook_dir).items() if k in ("PYTHONPATH", "AEP_HOOK_DIR")}
    with collector(cfg, tmp_path, env=env) as c:
        url = f"http://127.0.0.1:{c.ports['receiver/quill']}"
        out = cli(vendor_site, hook_dir, "hooks", "quill", "--install", "--url", url, "--home", str(tmp_path))
        assert out.returncode == 0, out.stderr
        hooks = json.loads((tmp_path / ".quill" / "hooks.json").read_text())["hooks"]
        for event, extra in (("begin", {}), ("ask", {"prompt": "hi"}), ("done", {}), ("end", {})):
            rc, reply = run_hook(hooks[event], {"event": event, "session": "q1", **extra})
            assert (rc, json.loads(reply)) == (0, {"proceed": True})  # the receiver's own (compact) reply
        assert c.stop() == 0
    events = read_jsonl(tmp_path / "logs" / "quill" / "q1.jsonl")
    assert [e["type"] for e in events] == ["session.started", "run.started", "run.finished", "session.ended"]
    assert {e["agent"] for e in events} == {"quill"}
    assert events[0]["data"]["client"] == {"name": "quill"}
