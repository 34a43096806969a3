"""Adversarial cases on the vendor surfaces other than Claude Code: hook vendors, plugin vendors,
their registrations and mappings. Each test pins a defect found by attacking the running parts."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from aep_collector.processors.mapping import opencode, plugin_bus
from aep_collector.receivers.plugin_vendors.bus_moments import decode

from tests.conftest import corpus
from tests.helpers import running
from tests.plugin_vendors_support import Env, KiloServer, config, headers, respond

KILO = corpus("mappings/kilocode.json")["moments"]
OPENCODE = corpus("mappings/opencode.json")["moments"]
SID = "s_fix_1"


@pytest.fixture
async def env(tmp_path):
    async with running(config(tmp_path)) as service:
        e = Env(service, tmp_path)
        for agent in ("opencode", "kilocode", "hermes", "pi"):
            e.router.set_route(agent, True)
        yield e


async def _legs_until_resolved(env: Env, rid: str) -> list[tuple[str, Any]]:
    for _ in range(1000):
        legs = [(e["type"], e["data"]) for e in env.session("kilocode", SID) if e.get("subject") == rid]
        if legs and legs[-1][0] == "attention.resolved":
            return legs
        await asyncio.sleep(0.01)
    raise AssertionError(f"the question card {rid} was never resolved")


@pytest.mark.parametrize("other", ["²", "١", "10"], ids=["superscript", "arabic-indic-one", "past-the-choices"])
async def test_a_question_answered_with_digit_like_other_text_reaches_kilo_verbatim(env: Env, other: str) -> None:
    # "²".isdigit() is true but int("²") raises: the background settle died, Kilo never got the
    # answer and the card stayed open with no leg. Choice ids are ASCII ("١" is not choice 1):
    # other text goes back verbatim.
    async with KiloServer() as server:
        await env.post("kilocode", KILO["question_asked"]["input"], headers=headers(server))
        (rid,) = await env.held()
        await env.router.submit(respond(rid, SID, values={"1": other}), "kilocode")
        await server.called()
        legs = await _legs_until_resolved(env, rid)
    assert server.calls[0][:2] == ("/question/que_1/reply", {"answers": [[other]]})
    assert [t for t, _ in legs] == ["attention.answered", "attention.resolved"]


def test_the_opencode_family_state_forgets_the_least_recently_active_sessions() -> None:
    # A collector lives for weeks and `opencode run` never deletes its session: one SessionTrack
    # (message ids, the todo snapshot) per session ever seen grew without bound.
    bound = getattr(plugin_bus, "MAX_SESSIONS", 4096)
    state = opencode.new_state()
    prompt = copy.deepcopy(OPENCODE["message_user"]["input"])
    for i in range(bound + 50):
        sid = f"ses_{i}"
        created = {"kind": "bus", "event": {"type": "session.created", "properties": {"info": {"id": sid}}}}
        opencode.map_signal(decode("opencode", "session.created", created), state)
        if i == 0:
            first = copy.deepcopy(prompt)
            first["event"]["properties"]["info"]["sessionID"] = sid
            opencode.map_signal(decode("opencode", "message.updated", first), state)
    assert len(state.sessions) == bound
    assert "ses_0" not in state.sessions and f"ses_{bound + 49}" in state.sessions
    # A session still in use stays tracked: its open run is not reopened by a re-update.
    live = copy.deepcopy(prompt)
    live["event"]["properties"]["info"]["sessionID"] = f"ses_{bound + 49}"
    assert [d["type"] for d in opencode.map_signal(decode("opencode", "message.updated", live), state)] == [
        "run.started"]
    again = [d["type"] for d in opencode.map_signal(decode("opencode", "message.updated", live), state)]
    assert again == ["x.opencode.message.updated"]


def _qwen_urls(path) -> list[str]:
    import json

    hooks = json.loads(path.read_text())["hooks"]
    return sorted({h["url"] for groups in hooks.values() for g in groups for h in g["hooks"]})


@pytest.mark.parametrize("how", ["reinstall", "uninstall"])
def test_a_pasted_qwen_block_is_replaced_or_removed_whatever_its_url(tmp_path, monkeypatch, how: str) -> None:
    # Qwen's native http handlers name no shim file: without an install record (the printed block
    # pasted by hand, or a lost record) a reinstall at another URL kept the old handler beside the
    # new one (every hook posted twice, once to a dead port), and uninstall left it.
    from aep_collector.receivers.registration import wiring
    from aep_collector.receivers.wiring import install, resolve, uninstall

    monkeypatch.setenv("AEP_HOOK_DIR", str(tmp_path / ".aep"))
    pasted = wiring("qwen-code")
    path = resolve(pasted.targets[0], tmp_path, None)
    path.parent.mkdir(parents=True)
    path.write_text(pasted.text())
    assert _qwen_urls(path) == ["http://127.0.0.1:8380/hook"]
    if how == "reinstall":
        install(wiring("qwen-code", url="http://127.0.0.1:9380"), home=tmp_path)
        assert _qwen_urls(path) == ["http://127.0.0.1:9380/hook"]
    else:
        uninstall("qwen-code", unrecorded=wiring("qwen-code", url="http://127.0.0.1:9380"), home=tmp_path)
        assert "http" not in path.read_text()
