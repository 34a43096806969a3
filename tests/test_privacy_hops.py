"""Content that reached a hop or the relay role by another way than the capture processor's own walk.

An adversarial pass (2026-12-07) found four: an operator's command text fanned out verbatim to
subscribers at `metadata` (a command that states no `capture` claims `metadata`); a down-level that
pruned fields by annotation only, so a vendor's prose kept in a token field at `redacted` left
labelled `metadata`; a `full` event posted by another emitter with secrets in structural places
reaching a `metadata` subscriber; and envelope values a plug-in may hand on (a list as `subject`,
an extension attribute) leaving unscreened even at `none`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.pipeline.envelope import Stamper
from aep_collector.processors.capture import CapturePolicy, Redactor, downlevel, honest_claim
from aep_collector.processors.capture.ceiling import apply_cap
from aep_sdk.aio import ControlClient, subscribe

from tests.helpers import running
from tests.test_relay_server import TOKEN, Stack, config, next_of

KEY = "sk-proj-AbCdEf123456GhIjKl789012MnOp"
MAIL = "alice.planted@example.com"
HOME_PATH = "/home/alice/payroll/export.csv"
PROSE = "Blocked because Alice Jones said never to touch the payroll database"
SECRETS = (KEY, MAIL, "/home/alice", "Alice Jones")


def leaks(obj: Any) -> list[str]:
    text = json.dumps(obj)
    return [s for s in SECRETS if s in text]


def event(type_: str, data: dict, **envelope: Any) -> dict:
    return {"aep": "0.1", "id": "01JX0000000000000000000001", "type": type_, "time": "2026-12-07T00:00:00.000Z",
            "source": "aep://h/agent/other/session/s9", "agent": "other", "session": "s9", "seq": 1, "epoch": 1,
            "data": data, **envelope}


# --- the hop ----------------------------------------------------------------------------------


def test_a_down_level_screens_what_it_keeps_as_the_emitter_would() -> None:
    # A pipeline at `redacted` keeps a vendor's deny prose in the token field `rule` (after §9.4);
    # a hop to `metadata` must not label it metadata as it is.
    denied = event("tool.denied", {"tool": {"name": "Bash", "call_id": "toolu_1"}, "rule": PROSE},
                   capture="redacted", subject=f"deploy {KEY}")
    out = downlevel(denied, "metadata")
    assert out["capture"] == "metadata" and leaks(out) == []
    assert out["data"]["rule"].startswith("sha256-") and out["data"]["tool"] == {"name": "Bash", "call_id": "toolu_1"}
    assert out["subject"].startswith("sha256-")
    # A rule that is a rule stays one.
    kept = downlevel(event("tool.denied", {"tool": {"name": "Bash"}, "rule": "Bash(rm:*)"}, capture="redacted"),
                     "metadata")
    assert kept["data"]["rule"] == "Bash(rm:*)"


def test_a_down_level_takes_the_values_of_credential_named_keys_and_ids_with_secrets() -> None:
    ev = event("tool.requested", {"tool": {"name": "Bash", "call_id": MAIL, "cwd": HOME_PATH},
                                  "api_key": "plain-looking-value"}, capture="full", run=f"run-{MAIL}")
    out = downlevel(ev, "metadata")
    assert leaks(out) == [] and "plain-looking-value" not in json.dumps(out)
    assert out["run"].startswith("sha256-") and out["data"]["tool"]["name"] == "Bash"


def test_a_claim_the_content_breaks_is_taken_as_full() -> None:
    cancel = {"aep": "0.1", "id": "C1", "type": "control.cancel", "time": "2026-12-07T00:00:00.000Z",
              "source": "aep://ops/agent/aep-operator", "agent": "aep-operator", "session": "s9",
              "data": {"reason": f"use {KEY}"}}
    assert honest_claim(cancel) == "full"  # states nothing, i.e. metadata, and carries text
    assert honest_claim({**cancel, "capture": "redacted"}) == "full"  # text §9.4 would still change
    assert honest_claim({**cancel, "capture": "redacted", "data": {"reason": "use make test"}}) == "redacted"
    assert honest_claim({**cancel, "data": {}}) == "metadata"
    assert honest_claim({**cancel, "capture": "full"}) == "full"
    assert honest_claim({**cancel, "capture": "nonsense"}) == "full"
    structural = event("tool.requested", {"tool": {"name": "Bash", "call_id": MAIL}})
    assert honest_claim(structural) == "full"  # an email where only an id belongs
    assert honest_claim(event("tool.requested", {"tool": {"name": "Bash", "call_id": "toolu_1"}})) == "metadata"
    assert honest_claim(event("tool.requested", {}, capture="none")) == "full"  # data at none
    none = event("tool.requested", {}, capture="none")
    del none["data"]
    assert honest_claim(none) == "none"


# --- the emitter's envelope -------------------------------------------------------------------


@pytest.mark.parametrize("ceiling", ["none", "metadata", "redacted"])
def test_envelope_values_a_plug_in_hands_on_are_screened_at_every_level_below_full(tmp_path: Path,
                                                                                    ceiling: str) -> None:
    draft = {"type": "tool.requested", "agent": "quill", "subject": ["deploy", KEY], "session": [MAIL],
             "run": {"r": HOME_PATH}, "note": f"user {MAIL} key {KEY}", "cause": f"because {KEY}",
             "data": {"tool": {"name": "Bash"}}}
    capped = apply_cap(draft, CapturePolicy(ceiling=ceiling, overrides={}), Redactor(home="/home/alice"), None)
    stamped = Stamper(tmp_path, "h").stamp(capped)
    assert leaks(stamped) == [] and stamped["capture"] == ceiling
    assert "note" in stamped  # screened, not silently dropped: the attribute still says something was there


def test_full_passes_envelope_values_verbatim(tmp_path: Path) -> None:
    draft = {"type": "tool.requested", "agent": "quill", "subject": "deploy", "session": "s1", "note": "two words",
             "data": {"tool": {"name": "Bash"}}}
    capped = apply_cap(draft, CapturePolicy(ceiling="full", overrides={}), Redactor(), None)
    assert capped["note"] == "two words"


# --- the relay role ---------------------------------------------------------------------------


async def _posted(st: Stack, ev: dict) -> None:
    async with aiohttp.ClientSession() as http, http.post(
            f"{st.url}/events", json=ev, headers={"Authorization": f"Bearer {TOKEN}", "AEP-Version": "0.1"}) as r:
        assert r.status == 202, await r.text()


async def _close(sub: Any) -> None:
    closing = sub.close()
    if asyncio.iscoroutine(closing):
        await closing


async def test_an_operator_command_reaches_subscribers_only_at_what_their_ceiling_allows(tmp_path: Path) -> None:
    async with running(config(tmp_path, max_capture="full")) as service:
        st = Stack(service)
        low = await subscribe(st.url, filter={"session": "rs-privacy"}, capture="metadata", token=TOKEN)
        mid = await subscribe(st.url, filter={"session": "rs-privacy"}, capture="redacted", token=TOKEN)
        high = await subscribe(st.url, filter={"session": "rs-privacy"}, capture="full", token=TOKEN)
        operator = ControlClient(st.url, agent="aep-console", host="ops-host", token=TOKEN)
        await operator.connect()
        try:
            assert await st.post({"session_id": "rs-privacy", "hook_event_name": "UserPromptSubmit",
                                  "prompt": "hi"}) == (200, {})
            run = (await asyncio.wait_for(next_of(low, "run.started"), 10))["run"]
            reason = f"stop: use the key {KEY}, mail {MAIL}, see {HOME_PATH}"
            # The SDK states no capture: the command claims metadata while carrying an operator's text.
            ack = await operator.send("control.cancel", "rs-privacy", run=run, data={"reason": reason})
            assert ack["type"] == "control.accepted"
            for sub in (low, mid):
                cmd = await asyncio.wait_for(next_of(sub, "control.cancel"), 10)
                assert cmd["capture"] == "metadata" and leaks(cmd) == [] and "reason" not in cmd.get("data", {})
            verbatim = await asyncio.wait_for(next_of(high, "control.cancel"), 10)
            assert verbatim["data"]["reason"] == reason  # the operator opted this subscriber into full
        finally:
            await operator.close()
            for sub in (low, mid, high):
                await _close(sub)


async def test_a_full_event_from_another_emitter_leaves_structure_only_at_metadata(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        sub = await subscribe(st.url, filter={"session": "s9"}, capture="metadata", token=TOKEN)
        try:
            await _posted(st, event("tool.requested", {"tool": {"name": "Bash", "call_id": MAIL, "cwd": HOME_PATH},
                                                       "args": {"command": KEY}},
                                    capture="full", subject=KEY))
            got = await asyncio.wait_for(next_of(sub, "tool.requested"), 10)
            assert got["capture"] == "metadata" and leaks(got) == [] and "args" not in got["data"]
            assert got["data"]["tool"]["name"] == "Bash"
        finally:
            await _close(sub)


async def test_a_replay_applies_the_same_trust_as_live_delivery(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        # Claims metadata, carries an email where an id belongs: buffered, then replayed.
        await _posted(st, event("tool.requested", {"tool": {"name": "Bash", "call_id": MAIL}}))
        sub = await subscribe(st.url, filter={"session": "s9"}, capture="metadata", from_="all", token=TOKEN)
        try:
            got = await asyncio.wait_for(next_of(sub, "tool.requested"), 10)
            assert leaks(got) == [] and got["data"]["tool"]["call_id"].startswith("sha256-")
        finally:
            await _close(sub)


def test_the_operator_cli_states_the_level_of_what_it_sends() -> None:
    from aep_collector.pipeline.operator_cli import _capture_of

    assert _capture_of({"option": "allow"}) == "metadata"
    assert _capture_of({"option": "deny", "text": "use make test"}) == "redacted"
    assert _capture_of({"text": "yes"}) == "redacted"
    assert _capture_of({"values": {"n": 3, "ok": True}}) == "metadata"
    assert _capture_of({"values": {"db": "postgres"}}) == "redacted"


@pytest.mark.parametrize("drop", ["data", "type", None])
def test_an_extension_attribute_is_screened_whatever_else_the_draft_lacks(tmp_path: Path, drop: str | None) -> None:
    # The processor counts keys to skip the envelope check on usual drafts: one missing a usual key
    # must not let an extra one through uncounted.
    draft = {"type": "tool.requested", "agent": "quill", "session": "s1", "data": {}, "note": f"key {KEY}"}
    if drop:
        del draft[drop]
    capped = apply_cap(draft, CapturePolicy(ceiling="metadata", overrides={}), Redactor(), None)
    assert KEY not in json.dumps(capped) and capped["note"].startswith("sha256-")


def test_the_hop_screens_extension_attributes_as_the_emitter_does() -> None:
    ev = event("tool.requested", {"tool": {"name": "Bash"}}, capture="full", note=f"key {KEY}", cause="c-1")
    out = downlevel(ev, "metadata")
    assert leaks(out) == [] and out["note"].startswith("sha256-") and out["cause"] == "c-1"
    claimed = {**ev, "capture": "metadata"}
    assert honest_claim(claimed) == "full"  # a secret beside the payload breaks the claim too
    assert honest_claim({**claimed, "note": "plain-token"}) == "metadata"
