"""An unwritable state directory (where the per-agent epochs are persisted) never costs an event:
known at start, the collector refuses to start and names the path; broken later, stamping goes on
with an unpersisted epoch and /healthz says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from aep_collector.pipeline.config import ServiceConfig
from aep_collector.pipeline.envelope import EpochStore
from aep_collector.pipeline.service import Service


def test_a_state_dir_that_cannot_be_created_stops_the_start_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where the state directory should be")
    state = tmp_path / "file" / "aep"
    env = {**os.environ, "AEP_STATE_DIR": str(state)}
    run = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "run"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert f"state directory {state / 'epochs'} is not writable" in run.stderr, run.stderr


def test_a_state_dir_broken_at_runtime_keeps_stamping_and_shows_in_health(tmp_path: Path) -> None:
    assert EpochStore(tmp_path).epoch("codex") == 0  # a previous run persisted epoch 0
    service = Service(ServiceConfig(file="test", state_dir=tmp_path))
    service.stamper.epochs.check()  # writable at start
    lock = tmp_path / "epochs" / "codex.lock"  # then the folder breaks (as root, chmod would not stop us)
    lock.unlink()
    lock.mkdir()
    events = [service.stamper.stamp({"type": "session.started", "agent": "codex", "session": "s1"}),
              service.stamper.stamp({"type": "tool.started", "agent": "codex", "session": "s1"})]
    assert [(e["epoch"], e["seq"]) for e in events] == [(1, 0), (1, 1)]  # the next epoch, not a reused one
    detail = service.health.problems["stamper"]["state-dir"]
    assert str(tmp_path / "epochs") in detail and "'codex': 1" in detail
