"""The live tier: every test in this folder drives a real agent CLI and is marked ``live``.

Run the tier alone with ``pytest -m live``, or leave it out with ``pytest -m "not live"``. The CLIs
come from ``bash tests/live/setup``; a missing one skips loudly outside CI and fails with
``CI=true`` (``tests/live/clis.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.live)
