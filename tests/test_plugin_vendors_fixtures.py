"""Every fixture input of the five vendors POSTed to its running receiver; the JSONL holds the pin.

The pins are the pure mapping at the default posture. Through a receiver the runtime rules apply
on top, and each is stated here where it changes what a case emits: a run closes only when one is
open (so ``session_idle`` and pi's ``agent_end_*`` get their opening moment first), attention legs
pair with a card the collector saw (so answers and settles get their card first, and their subject
becomes that card's event id, AEP-0002 §7.1), an observed answer is followed by
``resolved{answered}``, a card that no control route can answer says ``respond_via: ["oob"]``
(AEP-0008), and a todo snapshot is diffed against the session's previous one.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.conftest import corpus
from tests.helpers import running
from tests.plugin_vendors_support import FIXTURES, VENDORS, Env, config, project, strip

SECTIONS = {"opencode": "moments", "kilocode": "moments", "pi": "moments", "cline": "hooks", "hermes": "hooks"}
DATA = {v: corpus(FIXTURES[v]) for v in VENDORS}
NEUTRAL = {"opencode": {}, "kilocode": {}, "cline": {}, "hermes": {}, "pi": None}


def entry(vendor: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(DATA[vendor][SECTIONS[vendor]][name])


def as_list(expected: Any) -> list[dict[str, Any]]:
    if expected is None:
        return []
    return strip(expected) if isinstance(expected, list) else [strip(expected)]


def approval_card(case_input: dict[str, Any]) -> dict[str, Any]:
    """The pre_approval_request an approval response answers (same pattern and command)."""
    card = entry("hermes", "pre_approval_request")["input"]
    for key in ("pattern_key", "command", "session_key"):
        card["extra"][key] = case_input["extra"][key]
    return card


def setup_for(vendor: str, name: str, case_input: dict[str, Any]) -> list[dict[str, Any]]:
    """The moments a case needs first (see the module docstring)."""
    if vendor in ("opencode", "kilocode"):
        if name == "session_idle":
            return [entry(vendor, "message_user")["input"]]
        if name == "permission_replied":
            return [entry(vendor, "permission_ask" if vendor == "opencode" else "permission_asked")["input"]]
        if name == "question_replied":
            return [entry(vendor, "question_asked")["input"]]
    if vendor == "pi" and name.startswith("agent_end"):
        return [entry("pi", "agent_start")["input"]]
    if vendor == "hermes":
        if name.startswith("post_approval_response"):
            return [entry("hermes", "on_session_start")["input"], approval_card(case_input)]
        if name.startswith("post_tool_call (clarify"):
            return [entry("hermes", "pre_tool_call (clarify: the form overlay, vendor choice normalization)")["input"]]
    return []


def runtime_expected(vendor: str, name: str, expected: list[dict[str, Any]], card_id: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in expected:
        e = copy.deepcopy(e)
        if e["type"] == "attention.requested" and "respond_via" in e["data"]:
            e["data"]["respond_via"] = ["oob"]  # no control route is up in this test
        if e["type"] in ("attention.answered", "attention.resolved", "attention.timeout") and card_id:
            e["subject"] = card_id
        out.append(e)
        if e["type"] == "attention.answered":
            out.append({"type": "attention.resolved", "data": {"resolution": "answered"}, "subject": card_id})
    if vendor in ("opencode", "kilocode") and name == "todo_updated":
        # The first snapshot of a session: every id is new, so it is planned (content is redacted+).
        out = [{"type": "progress.task.planned", "data": {}, "subject": "td_1"}]
    return out


def cases() -> list[Any]:
    out = []
    for vendor in VENDORS:
        for name in DATA[vendor][SECTIONS[vendor]]:
            if not name.startswith("$"):
                out.append(pytest.param(vendor, name, id=f"{vendor}-{name}"))
        out.append(pytest.param(vendor, "fallback", id=f"{vendor}-fallback"))
    return out


@pytest.fixture
async def env(tmp_path):
    async with running(config(tmp_path)) as service:
        yield Env(service, tmp_path)


@pytest.mark.parametrize(("vendor", "name"), cases())
async def test_fixture_input_through_the_receiver(env: Env, vendor: str, name: str) -> None:
    case = copy.deepcopy(DATA[vendor]["fallback"]) if name == "fallback" else entry(vendor, name)
    card_id = None
    for body in setup_for(vendor, name, case["input"]):
        seen = env.ids(vendor)
        status, reply = await env.post(vendor, body)
        assert (status, reply) == (200, NEUTRAL[vendor])
        cards = [e for e in env.since(vendor, seen) if e["type"] == "attention.requested"]
        card_id = cards[-1]["id"] if cards else card_id
    seen = env.ids(vendor)
    status, reply = await env.post(vendor, case["input"])
    assert (status, reply) == (200, NEUTRAL[vendor])
    got = [project(e) for e in env.since(vendor, seen)]
    assert got == runtime_expected(vendor, name, as_list(case["expected"]), card_id)


@pytest.mark.parametrize("vendor", ["opencode", "kilocode"])
async def test_todo_snapshots_are_diffed_as_pinned(env: Env, vendor: str) -> None:
    todos = DATA[vendor]["todos"]
    props = {"sessionID": "s_todo"}
    await env.post(vendor, {"kind": "bus", "event": {"type": "todo.updated",
                                                     "properties": {**props, "todos": todos["input"]["prev"]}}})
    seen = env.ids(vendor)
    await env.post(vendor, {"kind": "bus", "event": {"type": "todo.updated",
                                                     "properties": {**props, "todos": todos["input"]["next"]}}})
    assert [project(e) for e in env.since(vendor, seen)] == strip(todos["expected"])


@pytest.mark.parametrize("name", ["message_update", "tool_execution_update"])
async def test_pi_stream_updates_follow_the_receivers_deltas_switch(tmp_path, name: str) -> None:
    case = entry("pi", name)
    for deltas, want in ((False, None), (True, case["deltas_expected"])):
        d = tmp_path / str(deltas)
        async with running(config(d, pi={"deltas": deltas})) as service:
            e = Env(service, d)
            assert await e.post("pi", case["input"]) == (200, None)
            assert [project(x) for x in e.events("pi")] == as_list(want)


async def test_pi_deltas_switch_takes_the_env_words(tmp_path) -> None:
    async with running(config(tmp_path, pi={"deltas": "1"})) as service:
        e = Env(service, tmp_path)
        await e.post("pi", entry("pi", "message_update")["input"])
        assert [x["type"] for x in e.events("pi")] == ["x.pi.message.delta"]
