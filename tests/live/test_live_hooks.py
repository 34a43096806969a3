"""Live: Claude Code, Codex, Gemini CLI and Qwen Code, wired as a user wires them, run one shell call.

Each CLI runs one non-interactive prompt against the fake model, which calls the vendor's shell
tool once (``echo``) and then answers text. The collector's JSONL must hold the session, run and
tool lifecycle Annex A promises for that surface (``Live.check``), and the tool's output must have
reached the model (the hook path never got in the agent's way).

What each surface cannot deliver in a non-interactive run, and so is not asserted:
- Qwen Code 0.24.4 fires no SessionEnd in ``-p`` mode (no ``session.ended``).
- Claude Code 2.1.328 fires SessionStart only for ``command`` hooks, never for ``http`` ones: it
  reaches the collector through the command shim (registered by ``hooks claude-code``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.live.fakemodel import shell, text
from tests.live.harness import SPECS, Live, types

MARK = "aep-live-marker-7"


def one_shell_session(vendor: str, tmp: Path) -> tuple[Live, list[dict[str, Any]] | None]:
    live = Live(SPECS[vendor], tmp, [shell(f"echo {MARK}"), text("all done")])
    with live:
        live.run(f"run echo {MARK}")
        live.stop()
    return live, live.events()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One session per vendor, run lazily and shared by the assertions below."""
    cache: dict[str, Any] = {}

    def get(vendor: str) -> tuple[Live, list[dict[str, Any]]]:
        if vendor not in cache:
            cache[vendor] = one_shell_session(vendor, tmp_path_factory.mktemp(vendor))
        return cache[vendor]

    return get  # type: ignore[return-value]


def tool_output_reached_model(live: Live) -> None:
    results = live.model.tool_results()
    assert len(results) == 1 and MARK in results[0], (results, live.describe())


def test_claude_code_lifecycle(sessions: Any) -> None:
    live, _ = sessions("claude_code")
    events = live.check()  # session.started: SessionStart comes through the command shim
    tool_output_reached_model(live)
    [done] = [e for e in events if e["type"] == "tool.completed"]
    assert done["data"]["tool"]["name"] == "Bash"
    assert isinstance(done["data"].get("duration_ms"), int)  # 2.1.328 sends it on PostToolUse


def test_claude_code_session_started(sessions: Any) -> None:
    live, events = sessions("claude_code")
    assert types(events)[0] == "session.started", types(events)


def test_codex_lifecycle(sessions: Any) -> None:
    live, _ = sessions("codex")
    events = live.check()  # SessionEnd (0.169) → session.ended
    tool_output_reached_model(live)
    run = {e["run"] for e in events if e["type"] in ("run.started", "tool.requested", "tool.completed",
                                                     "run.finished")}
    assert len(run) == 1  # turn_id is the run: every event of the turn is in it


def test_gemini_cli_lifecycle(sessions: Any) -> None:
    live, _ = sessions("gemini_cli")
    live.check()
    tool_output_reached_model(live)


def test_qwen_code_lifecycle(sessions: Any) -> None:
    live, _ = sessions("qwen_code")
    events = live.check(ended=False)  # no SessionEnd in -p
    tool_output_reached_model(live)
    # The second UserPromptSubmit (same prompt_id, after the tool result) continues the run.
    assert types(events).count("run.started") == 1, types(events)
    [done] = [e for e in events if e["type"] == "tool.completed"]
    assert isinstance(done["data"].get("duration_ms"), int)
