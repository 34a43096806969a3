"""The mapping hooks this issue's receivers rely on: Cline lanes, gate requests, pi's per-signal deltas."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aep_collector.pipeline.control import attention_key
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.mapping import MappingProcessor, cline, hermes, pi
from aep_collector.processors.runs import RunsProcessor

from tests.conftest import corpus

CLINE = corpus("mappings/cline.json")["hooks"]
HERMES = corpus("mappings/hermes.json")["hooks"]
PI = corpus("mappings/pi.json")["moments"]


def hook(name: str, **changes: Any) -> dict[str, Any]:
    payload = copy.deepcopy(CLINE[name]["input"])
    payload.update(changes)
    return payload


def chain(*payloads: dict[str, Any]) -> list[dict[str, Any]]:
    mapping, runs = MappingProcessor(), RunsProcessor()
    out: list[dict[str, Any]] = []
    for p in payloads:
        out.extend(runs(mapping([Signal("cline", p["hookName"], p)])))
    return out


def test_cline_subagent_runs_on_its_own_lane_and_the_parent_run_stays_open() -> None:
    events = chain(hook("agent_start"), hook("agent_start_parented"),
                   hook("tool_call", agent_id="agent_child", parent_agent_id="agent_root"),
                   hook("agent_end_parented"), hook("tool_call"), hook("agent_end"))
    types = [e["type"] for e in events]
    assert types == ["run.started", "delegation.subagent.started", "run.started", "tool.requested",
                     "run.finished", "delegation.subagent.stopped", "tool.requested", "run.finished"]
    parent, child = events[0]["run"], events[2]["run"]
    assert parent != child
    assert [e["run"] for e in events] == [parent, parent, child, child, child, parent, parent, parent]
    assert events[2]["_lane"] == "agent_child" and "_lane" not in events[1] and "_lane" not in events[0]


def test_cline_lane_is_only_on_parented_payloads() -> None:
    assert all("_lane" not in d for d in cline.map_hook(CLINE["tool_call"]["input"]))
    drafts = cline.map_hook(CLINE["agent_end_parented"]["input"])
    assert [(d["type"], d.get("_lane")) for d in drafts] == [("run.finished", "agent_child"),
                                                            ("delegation.subagent.stopped", None)]


def tool_call(call: str = "call_9", tool: str = "bash") -> dict[str, Any]:
    return {"session": {"id": "s1"}, "event": {"type": "tool_call", "toolCallId": call, "toolName": tool,
                                                 "input": {"command": "rm -rf build"}}}


def test_pi_tool_call_maps_to_nothing_unless_held() -> None:
    assert pi.map_signal(Signal("pi", "tool_call", tool_call()), pi.new_state()) == []


def test_pi_held_tool_call_is_the_gate_request() -> None:
    sig = Signal("pi", "tool_call", tool_call(), hold="gate:call_9", expires_at="2030-01-01T00:00:00.000Z")
    (d,) = pi.map_signal(sig, pi.new_state())
    assert d["_attention_key"] == attention_key("gate", "call_9") == "gate:call_9"
    assert d["session"] == "s1" and d["subject"] == "bash" and d["severity"] == "notice"
    assert d["data"] == {"kind": "permission", "prompt": "Permission requested: bash \u2014 rm -rf build",
                         "options": [{"id": "allow", "label": "Allow"}, {"id": "deny", "label": "Deny"}],
                         "respond_via": ["control"], "expires_at": "2030-01-01T00:00:00.000Z"}
    # The default posture (attention.* redacted) keeps the command in the prompt, as the OpenCode
    # permission_ask pin does; at a plain metadata ceiling the prompt is synthesized without it.
    assert cap_draft(d, CapturePolicy())["data"]["prompt"] == d["data"]["prompt"]
    assert "rm -rf" not in cap_draft(d, CapturePolicy(overrides={}))["data"]["prompt"]


@pytest.mark.parametrize(("attr", "state_default", "want"), [
    (None, False, []), (None, True, ["x.pi.message.delta"]),
    (True, False, ["x.pi.message.delta"]), (False, True, []),
], ids=["unset-off", "unset-on", "attr-on", "attr-off-beats-env"])
def test_pi_deltas_come_from_the_signal_before_the_state(attr: Any, state_default: bool, want: list[str]) -> None:
    sig = Signal("pi", "message_update", copy.deepcopy(PI["message_update"]["input"]))
    if attr is not None:
        sig.deltas = attr
    assert [d["type"] for d in pi.map_signal(sig, pi.new_state(deltas=state_default))] == want


def test_pi_deltas_env_is_only_the_state_default(monkeypatch) -> None:
    monkeypatch.setenv(pi.DELTAS_ENV, "1")
    assert pi.new_state().deltas is True
    monkeypatch.setenv(pi.DELTAS_ENV, "0")
    assert pi.new_state().deltas is False


def test_hermes_held_pre_tool_call_adds_the_gate_request_after_the_tool() -> None:
    payload = copy.deepcopy(HERMES["pre_tool_call"]["input"])
    assert [d["type"] for d in hermes.map_signal(Signal("hermes", "pre_tool_call", payload), hermes.new_state())] == [
        "tool.requested"]
    held = Signal("hermes", "pre_tool_call", payload, hold="gate:tc_1")
    tool, req = hermes.map_signal(held, hermes.new_state())
    assert tool["type"] == "tool.requested"
    assert req["type"] == "attention.requested" and req["_attention_key"] == attention_key("gate", "tc_1")
    assert req["run"] == payload["extra"]["turn_id"] and req["session"] == "s_fix_1"
    assert req["data"]["options"] == [{"id": "allow", "label": "Allow"}, {"id": "deny", "label": "Deny"}]
    assert req["data"]["respond_via"] == ["control"] and "expires_at" not in req["data"]


def test_gate_requests_degrade_on_odd_shapes() -> None:
    for payload in ({}, {"event": "x"}, {"event": {"toolName": 3}}):
        d = pi.gate_request(payload)
        assert d["subject"] == "tool" and "_attention_key" not in d
    d = hermes.gate_request({"tool_name": None, "extra": [], "tool_input": "x"})
    assert d["subject"] == "tool" and d["data"]["prompt"] == "Permission requested: tool"
