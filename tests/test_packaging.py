"""The wheel, not the checkout: a real non-editable ``pip install .`` into a fresh venv, then
``aep-collector`` with no flags from an empty folder. Catches data files missing from the package
(the default config, the capture annotations, the plug-in sources) that an editable install hides.

The fresh venv takes the third-party dependencies from the test venv through a ``.pth`` line (no
network, seconds not minutes); ``aep-collector`` itself is built and installed from the sources.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import time
import venv
from pathlib import Path

from tests.conftest import ROOT


def test_pip_install_then_run_with_no_flags_from_anywhere(tmp_path: Path) -> None:
    env_dir, home, cwd = tmp_path / "venv", tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    cwd.mkdir()
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # Dependencies only: the test venv's site-packages, whose .pth files (the editable install of
    # this checkout among them) are NOT processed from here, so the checkout stays invisible.
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    build = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(ROOT)],
                           capture_output=True, text=True, cwd=cwd)
    assert build.returncode == 0, build.stdout + build.stderr
    exe = env_dir / "bin" / "aep-collector"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEP_") and k != "PYTHONPATH"}
    env.update(HOME=str(home), AEP_RELAY_SERVER_ENDPOINT="127.0.0.1:0",
               **{f"AEP_{n}_ENDPOINT": "127.0.0.1:0" for n in (
                   "CLAUDE_CODE", "CODEX", "GEMINI_CLI", "QWEN_CODE", "VSCODE", "ANTIGRAVITY", "KIMI_CODE",
                   "OPENCODE", "KILOCODE", "CLINE", "HERMES", "PI", "OTLP_GRPC", "OTLP_HTTP")})
    where = subprocess.run([str(py), "-c", "import aep_collector.pipeline as pipeline, aep_collector.processors.capture.ceiling as g; print(pipeline.__file__); "
                            "print(len(g.load_annotations()))"], capture_output=True, text=True, cwd=cwd, env=env)
    assert where.returncode == 0, where.stderr
    module_file, n_annotations = where.stdout.split()
    assert module_file.startswith(str(env_dir)) and int(n_annotations) > 40  # the installed copy, with its data
    # Exactly one top-level package: every file the wheel installed into site-packages is under
    # aep_collector/ (or its own dist-info); the scripts go to bin/ (``../../../bin``).
    (record,) = Path(purelib).glob("aep_collector-*.dist-info/RECORD")
    tops = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines() if line}
    assert tops == {"aep_collector", record.parent.name, ".."}, tops
    for old in ("pipeline", "receivers", "processors", "exporters"):  # one top-level package only
        gone = subprocess.run([str(py), "-c", f"import {old}"], capture_output=True, text=True, cwd=cwd, env=env)
        assert gone.returncode == 1 and "ModuleNotFoundError" in gone.stderr, (old, gone.stderr)
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, cwd=cwd, env=env)
    assert version.returncode == 0 and version.stdout.startswith("aep-collector 0."), version.stderr

    proc = subprocess.Popen([str(exe)], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "aep-collector started" in line:
                break
        log = "".join(lines)
        assert "aep-collector started" in log, log
        assert "13 receivers" in log and "relay role on http://127.0.0.1:" in log, log
        assert "WARNING" not in log and "ERROR" not in log, log  # no "relay unreachable" at start-up
        doc = json.loads((home / ".aep" / "relay.json").read_text())
        assert doc["pid"] == proc.pid
        status = subprocess.run([str(exe), "status"], capture_output=True, text=True, cwd=cwd, env=env, timeout=60)
        assert status.returncode == 0 and "collector: running" in status.stdout, status.stdout + status.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode == 0
