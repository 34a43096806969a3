"""An unwritable state directory (where the epoch is persisted) never costs an event:
known at start, the collector refuses to start and names the path; broken later, nothing changes
(the epoch was taken at start); a stamper that cannot persist its epoch seeds it from the clock,
so it cannot repeat, and /healthz says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from aep_collector.pipeline.config import ServiceConfig
from aep_collector.pipeline.envelope import EpochStore, Stamper
from aep_collector.pipeline.service import Service


def test_a_state_dir_that_cannot_be_created_stops_the_start_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file where the state directory should be")
    state = tmp_path / "file" / "aep"
    env = {**os.environ, "AEP_STATE_DIR": str(state)}
    run = subprocess.run([sys.executable, "-m", "aep_collector.pipeline.cli", "run"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert f"state directory {state / 'epochs'} is not writable" in run.stderr, run.stderr


def test_a_state_dir_broken_at_runtime_changes_nothing_the_epoch_was_taken_at_start(tmp_path: Path) -> None:
    assert EpochStore(tmp_path).epoch("codex") == 0  # a previous run persisted epoch 0
    service = Service(ServiceConfig(file="test", state_dir=tmp_path))
    service.stamper.epochs.check()  # the start: epoch 1, persisted
    _break(tmp_path)
    events = [service.stamper.stamp({"type": "session.started", "agent": "codex", "session": "s1"}),
              service.stamper.stamp({"type": "tool.started", "agent": "claude-code", "session": "s2"})]
    assert [(e["epoch"], e["seq"]) for e in events] == [(1, 0), (1, 0)]
    assert "stamper" not in service.health.problems


def test_a_stamper_restarted_on_a_broken_state_dir_never_repeats_a_position(tmp_path: Path) -> None:
    """Epochs that could not be persisted: restarts on the broken folder, then on the repaired
    one; no (session, epoch, seq) twice (consumers resume and dedupe on those)."""
    first = Stamper(tmp_path, host="h")
    first.epochs.check()
    seen = [first.stamp({"type": "session.started", "agent": "claude-code", "session": "s0"})]
    _break(tmp_path)  # then an agent is first seen: its epoch cannot be persisted any more
    seen += [first.stamp({"type": "progress.note", "agent": "codex", "session": "s1", "data": {}}) for _ in range(3)]
    logs = []
    for _ in range(3):  # restarted (a new process), the folder still broken, used without the start check
        run = subprocess.run([sys.executable, "-c", _RESTART, str(tmp_path)], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        seen += [json.loads(line) for line in run.stdout.splitlines()]
        logs.append(run.stderr)
    positions = [(e["source"], e["epoch"], e["seq"]) for e in seen]
    assert len(set(positions)) == len(positions), positions
    per_session: dict[str, list[int]] = {}
    for e in seen:
        per_session.setdefault(e["source"], []).append(e["epoch"])
    assert all(epochs == sorted(epochs) for epochs in per_session.values())  # and never back in a session
    assert all("cannot persist the epoch" in log for log in logs)  # said, each time


_RESTART = """
import json, logging, sys
from aep_collector.pipeline.envelope import Stamper
logging.basicConfig()
stamper = Stamper(sys.argv[1], host="h")
for agent, session in [("codex", "s1"), ("claude-code", "s0"), ("codex", "s1")]:
    print(json.dumps(stamper.stamp({"type": "progress.note", "agent": agent, "session": session, "data": {}})))
"""


def _break(state_dir: Path) -> None:
    """Make the epochs folder unusable (as root, chmod would not stop us): a file in its place."""
    import shutil

    shutil.rmtree(state_dir / "epochs")
    (state_dir / "epochs").write_text("not a folder")
