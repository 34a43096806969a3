"""The service takes its start-up heap out of the cyclic garbage collector's scans, once per process,
and lets the young generation grow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from aep_collector.pipeline.service import YOUNG_THRESHOLD

ROOT = Path(__file__).resolve().parent.parent

# Runs in its own interpreter: freezing is process-wide and for good, so it must not touch the
# test runner's heap. Two collectors start and stop one after the other in that one process.
SCRIPT = r"""
import asyncio, gc, json, logging, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from helpers import base_config
from aep_collector.pipeline.config import parse
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.service import Service


class Started(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen = asyncio.Event()

    def emit(self, record):
        if record.getMessage().startswith("aep-collector started"):
            self.seen.set()


async def life(tmp):
    started = Started()
    logging.getLogger("aep.service").addHandler(started)
    logging.getLogger("aep.service").setLevel(logging.INFO)
    registry, _ = build_registry(load_plugins=False)
    service = Service(parse(base_config(tmp), registry, "test.yaml"), host_name="test-host")
    run = asyncio.get_running_loop().create_task(service.run_until_signalled())
    await asyncio.wait_for(started.seen.wait(), 20)
    frozen = gc.get_freeze_count()
    young = gc.get_threshold()
    scanned = any(o is service.pipelines for o in gc.get_objects())
    service.request_stop()
    await run
    logging.getLogger("aep.service").removeHandler(started)
    return frozen, scanned, young


before = gc.get_freeze_count()
threshold_before = gc.get_threshold()
first, first_scanned, first_threshold = asyncio.run(life(Path(sys.argv[1]) / "one"))
second, second_scanned, second_threshold = asyncio.run(life(Path(sys.argv[1]) / "two"))
print(json.dumps({"before": before, "first": first, "first_scanned": first_scanned,
                  "second": second, "second_scanned": second_scanned, "threshold_before": threshold_before,
                  "first_threshold": first_threshold, "second_threshold": second_threshold}))
"""


def run_script(tmp_path: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(ROOT / "tests")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_started_service_raises_the_young_threshold_only(tmp_path: Path) -> None:
    r = run_script(tmp_path)
    # The interpreter's default before start; once started, generation 0 collects at YOUNG_THRESHOLD
    # objects and the older generations keep theirs; a second start sets the same again.
    assert r["threshold_before"][0] < YOUNG_THRESHOLD
    assert r["first_threshold"] == [YOUNG_THRESHOLD, *r["threshold_before"][1:]]
    assert r["second_threshold"] == r["first_threshold"]


def test_started_service_heap_is_frozen_once(tmp_path: Path) -> None:
    r = run_script(tmp_path)
    assert r["before"] == 0
    # The first start froze what it built: its own pipelines are no longer among the scanned objects.
    assert isinstance(r["first"], int) and r["first"] > 0
    assert r["first_scanned"] is False
    # A second service in the same process freezes nothing more (a frozen cycle is never
    # collected, so only the first start-up heap is frozen): its pipelines stay scanned, and the
    # frozen count only shrinks, as reference counting frees frozen objects that were dropped.
    assert r["second_scanned"] is True
    assert isinstance(r["second"], int) and 0 < r["second"] <= r["first"]
