"""The machine-readable summary line every benchmark prints last: ``RESULT {json}``.

``bench/run_all.py`` collects these lines from one run to print issue 16's verdicts and to write
the README performance table (``--markdown``); a human reads the tables above them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

PREFIX = "RESULT "


def emit(bench: str, **figures: Any) -> None:
    """Print one ``RESULT`` line naming the benchmark and its figures (JSON, one line)."""
    print(PREFIX + json.dumps({"bench": bench, **figures}, separators=(",", ":")), flush=True)


def parse(line: str) -> dict[str, Any] | None:
    """The figures of a ``RESULT`` line, or None for any other line."""
    if not line.startswith(PREFIX):
        return None
    try:
        value = json.loads(line[len(PREFIX):])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def callgrind(args: list[str], cwd: Path, env: dict[str, str]) -> int:
    """Instructions valgrind's callgrind counts for one whole ``python args...`` process."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={Path(tmp) / 'cg.out'}", "--dump-line=no",
               *args]
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"callgrind run failed ({r.returncode}):\n{r.stderr[-2000:]}")
        m = re.search(r"Collected\s*:\s*(\d+)", r.stderr)
        if m is None:
            raise SystemExit(f"no instruction count in callgrind output:\n{r.stderr[-2000:]}")
        return int(m.group(1))


def stolen_ms() -> float:
    """CPU time the hypervisor has taken from this machine's CPUs since boot, in ms (``/proc/stat``'s
    steal, summed over all of them; 0 where it is not counted). Read before and after a run: a run
    during which it grew was slowed from outside, whatever the code under test did."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") * 1000
    except (OSError, IndexError, ValueError):
        return 0.0
