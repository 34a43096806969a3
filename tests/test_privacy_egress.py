"""Egress an adversarial privacy pass (2026-12-07, second) found carrying content past the ceiling.

- A hop screened an event's ``session`` (a detector hit leaves as its digest) but kept its
  ``source``, which embeds that same session: a subscriber below the event's level read the
  session id the screen had just replaced. The ``id`` and ``agent`` another emitter chooses were
  not screened at all.
- An SSE subscriber below an event's level got the event down-levelled, its session screened, but
  the frame's ``id:`` line (the resume position) still spelt the session as it came.
- The relay role's authorized ``/healthz`` (what ``aep-collector status`` prints) listed the last
  event per agent with its session as stored, not as any subscriber below ``full`` may see it.
- An operator's answer that a closed form field refuses was quoted in the rejection's detail, which
  the control router logs at INFO: an operator's free text in the collector's log whatever the
  ceiling (``respond --text`` on an MCP enum field, say).
- A draft the capture processor could not gate (a plug-in's set or bytes in ``data``) lost its
  ``data`` and ``subject`` and claimed ``none``, but kept its session, run, step, ``cause`` and
  extension attributes as they came: unscreened, where every gated draft has them screened.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.wire import dumps
from aep_collector.processors.capture import CaptureProcessor, downlevel, honest_claim
from aep_collector.processors.mapping import MappingConfig, MappingProcessor
from aep_collector.processors.runs import RunsProcessor
from aep_sdk.aio import ControlClient, subscribe
from aep_sdk.control import NackError

from tests.helpers import running
from tests.test_relay_server import TOKEN, Stack, config, next_of

KEY = "ghp_AbCdEf1234567890GhIjKl1234567890MnOp"
MAIL = "alice.planted@example.com"


def _event(session: str, **envelope: Any) -> dict[str, Any]:
    return {"aep": "0.1", "id": "01JX0000000000000000000001", "type": "tool.requested",
            "time": "2026-12-07T00:00:00.000Z", "source": f"aep://h/agent/other/session/{quote(session, safe='')}",
            "agent": "other", "session": session, "seq": 1, "epoch": 1, "data": {"tool": {"name": "Bash"}},
            **envelope}


async def _close(sub: Any) -> None:
    closing = sub.close()
    if asyncio.iscoroutine(closing):
        await closing


def test_a_hop_screens_the_session_inside_the_source_too() -> None:
    for session in (f"s-{KEY}", f"{MAIL}:/srv/x"):
        ev = _event(session, capture="full")
        out = downlevel(ev, "metadata")
        text = json.dumps(out)
        assert out["session"].startswith("sha256-")
        assert KEY not in text and "alice.planted" not in text, out["source"]
        assert out["source"].endswith(quote(out["session"], safe=""))  # still names the (screened) session
        # A claim the source breaks is no claim: the event is taken as full.
        assert honest_claim({**ev, "capture": "metadata", "session": "s9"}) == "full"
    # Another emitter chooses its id, agent and source freely: screened as ids are.
    out = downlevel(_event("s9", capture="full", id=f"id-{KEY}", agent=MAIL,
                           source=f"aep://u:{KEY}@h/agent/x"), "metadata")
    assert KEY not in json.dumps(out) and MAIL not in json.dumps(out), out
    assert out["source"].startswith("urn:aep:sha256-") and out["id"].startswith("sha256-")


async def test_a_foreign_event_s_source_reaches_no_subscriber_with_its_session(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        st = Stack(service)
        sub = await subscribe(st.url, filter={"agent": "other"}, capture="metadata", token=TOKEN)
        try:
            async with aiohttp.ClientSession() as http, http.post(
                    f"{st.url}/events", json=_event(f"s-{KEY}"),
                    headers={"Authorization": f"Bearer {TOKEN}", "AEP-Version": "0.1"}) as r:
                assert r.status == 202, await r.text()
            got = await asyncio.wait_for(next_of(sub, "tool.requested"), 10)
            assert got["session"].startswith("sha256-") and KEY not in json.dumps(got), got
        finally:
            await _close(sub)


async def test_a_full_pipeline_s_event_leaves_a_metadata_subscriber_without_its_session(tmp_path: Path) -> None:
    # The pipeline keeps everything (ceiling full); the relay role down-levels for its subscriber.
    cfg = config(tmp_path, max_capture="full")
    cfg["processors"]["capture"] = {"ceiling": "full", "overrides": {}}
    async with running(cfg) as service:
        st = Stack(service)
        sub = await subscribe(st.url, filter={"agent": "claude-code"}, capture="metadata", token=TOKEN)
        try:
            assert await st.post({"session_id": f"{MAIL}:/srv/x", "hook_event_name": "UserPromptSubmit",
                                  "prompt": "hi"}) == (200, {})
            got = await asyncio.wait_for(next_of(sub, "run.started"), 10)
            text = json.dumps(got)
            assert got["capture"] == "metadata" and "alice.planted" not in text and "alice.planted%40" not in text, got
        finally:
            await _close(sub)


# A plug-in mapping (this module, named in ``extra_vendors``) that hands on a value no JSON decoder
# makes, with the vendor's session id and an extension attribute as they came.
AGENT = "leaky-plugin"


def new_state() -> None:
    return None


def map_signal(signal: Signal, state: None) -> list[dict[str, Any]]:
    p = signal.payload
    return [{"type": "tool.requested", "session": p["session_id"], "run": p["run"], "cause": p["note"],
             "note": p["note"], "subject": p["note"], "data": {"tool": {"name": "Bash"}, "tags": {"a", "b"}}}]


def test_a_draft_the_gate_fails_on_leaves_its_envelope_screened(tmp_path: Path) -> None:
    chain = [MappingProcessor(MappingConfig(extra_vendors={AGENT: "tests.test_privacy_egress"})), RunsProcessor(),
             CaptureProcessor()]
    payload = {"session_id": f"s-{KEY}", "run": f"/home/alice/{MAIL}", "note": f"Bearer {KEY}"}
    batch: list[Any] = [Signal(AGENT, "Anything", payload)]
    for step in chain:
        batch = step(batch)
    assert chain[2].failures == 1  # the set cannot be gated: the draft fails closed
    (ev,) = [Stamper(tmp_path, "h").stamp(d) for d in batch]
    wire = dumps(ev)
    assert ev["capture"] == "none" and "data" not in ev and "subject" not in ev
    assert KEY not in wire and "alice" not in wire, wire
    assert ev["session"].startswith("sha256-") and ev["run"].startswith("sha256-")


async def _sse_frames(url: str, query: dict[str, str], want: int) -> list[str]:
    """The first ``want`` SSE frames of ``/stream`` as sent (``event:``, ``data:`` and ``id:`` lines)."""
    frames: list[str] = []
    async with aiohttp.ClientSession() as http, http.get(
            f"{url}/stream", params=query, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 200
        block: list[str] = []
        async for raw in r.content:
            line = raw.decode().rstrip("\n")
            if line:
                block.append(line)
            elif block:
                if any(b.startswith("data:") for b in block):
                    frames.append("\n".join(block))
                block = []
                if len(frames) >= want:
                    break
    return frames


async def test_an_sse_frame_s_resume_id_never_spells_a_screened_session(tmp_path: Path) -> None:
    cfg = config(tmp_path, max_capture="full")
    cfg["processors"]["capture"] = {"ceiling": "full", "overrides": {}}
    async with running(cfg) as service:
        st = Stack(service)
        session = f"{MAIL}:/srv/x"
        assert await st.post({"session_id": session, "hook_event_name": "UserPromptSubmit",
                              "prompt": "hi"}) == (200, {})
        async with aiohttp.ClientSession() as http, http.post(
                f"{st.url}/events", json=_event(f"s-{KEY}"),
                headers={"Authorization": f"Bearer {TOKEN}", "AEP-Version": "0.1"}) as r:
            assert r.status == 202, await r.text()
        # Replayed and live alike: the replay renders through the same function.
        frames = await asyncio.wait_for(_sse_frames(st.url, {"capture": "metadata", "from": "all"}, 2), 10)
        text = "\n".join(frames)
        assert "alice.planted" not in text and KEY not in text, text
        # Below the event's level the session is screened, and the frame carries no resume position
        # (one with the digest would resume nothing); at full the position is there.
        full = await asyncio.wait_for(_sse_frames(st.url, {"capture": "full", "from": "all"}, 1), 10)
        assert "\nid: " in full[0]


async def test_healthz_last_events_shows_the_session_as_subscribers_see_it(tmp_path: Path) -> None:
    cfg = config(tmp_path)  # max_capture redacted: no subscriber sees a full event's session as it came
    cfg["processors"]["capture"] = {"ceiling": "full", "overrides": {}}
    async with running(cfg) as service:
        st = Stack(service)
        assert await st.post({"session_id": f"{MAIL}:/srv/x", "hook_event_name": "UserPromptSubmit",
                              "prompt": "hi"}) == (200, {})
        headers = {"Authorization": f"Bearer {TOKEN}", "AEP-Version": "0.1"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{st.url}/events", json=_event(f"s-{KEY}"), headers=headers) as r:
                assert r.status == 202, await r.text()
            async with http.get(f"{st.url}/healthz", headers=headers) as r:
                body = await r.json()
    last = body["last_events"]
    assert KEY not in json.dumps(body) and "alice.planted" not in json.dumps(body), last
    assert set(last) == {"claude-code", "other"} and last["other"]["type"] == "tool.requested"
    assert all(ev["session"].startswith("sha256-") for ev in last.values())


async def test_a_refused_form_answer_is_not_quoted_in_the_log(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)  # the router logs a rejection at INFO
    prose = "use the payroll copy Alice Jones keeps"
    cfg = config(tmp_path)
    cfg["processors"]["capture"] = {"ceiling": "redacted", "overrides": {}}  # the ack's detail is kept
    async with running(cfg) as service:
        st = Stack(service)
        sub = await subscribe(st.url, filter={"session": "elicit-1"}, token=TOKEN)
        operator = ControlClient(st.url, agent="aep-console", host="ops-host", token=TOKEN)
        await operator.connect()
        try:
            hook = asyncio.create_task(st.post({
                "session_id": "elicit-1", "hook_event_name": "Elicitation", "mcp_server_name": "db",
                "message": "Which copy?", "requested_schema": {"type": "object", "properties": {
                    "copy": {"type": "string", "enum": ["prod", "staging"]}}, "required": ["copy"]}}))
            req = await asyncio.wait_for(next_of(sub, "attention.requested"), 10)
            acks = []
            for answer in ({"values": {"copy": prose}}, {"text": prose}):
                with pytest.raises(NackError) as info:
                    await operator.send("control.attention.respond", "elicit-1", subject=req["id"],
                                        data={"answer": answer}, retries=0)
                assert info.value.reason == "invalid"
                acks.append(await asyncio.wait_for(next_of(sub, "control.rejected"), 10))
            await operator.send("control.attention.respond", "elicit-1", subject=req["id"],
                                data={"answer": {"values": {"copy": "staging"}}})
            assert (await asyncio.wait_for(hook, 10))[0] == 200
        finally:
            await operator.close()
            await _close(sub)
    logged = [r.getMessage() for r in caplog.records]
    assert any("rejected control.attention.respond" in m for m in logged), logged
    assert not [m for m in logged if "Alice" in m], logged
    # The ack still says which field and what it takes (its detail is redacted-gated: kept here).
    assert all("'copy' takes only its choices" in a["data"]["detail"] and "Alice" not in json.dumps(a) for a in acks)
