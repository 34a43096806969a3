"""Whatever order a vendor's moments arrive in, every exported stream passes validate-events.

Hypothesis draws sequences (repeats, reorderings, and interleavings of two sessions: each moment
is also replayed under a second session id) of each vendor's mapping-fixture inputs — plus, for Claude Code, whose fixture pins only its two forms, a realistic session's
hooks — and runs them through the real chain: the receiver's own signal extraction, then
mapping → runs → capture → stamping (tests/chain.py). Every event must pass the envelope, payload
and stream rules of ``validate-events``, at the default ceiling and at ``full``. The two OTLP
profiles' fixture records go in as the OTLP receiver hands them on (flattened records, in
companion and primary mode).
"""

from __future__ import annotations

import copy
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline.component import CreateSettings, Kind
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.validate import StreamValidator, envelope_errors, payload_errors
from aep_collector.processors.mapping import MappingProcessor
from aiohttp.test_utils import make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chain import Chain
from tests.conftest import corpus

REGISTRY, _ = build_registry(load_plugins=False)

# receiver type -> (fixture, sections holding {"input": ...} entries)
FIXTURES = {
    "codex": ("codex", ["hooks", "fallback"]),
    "gemini_cli": ("gemini-cli", ["hooks", "fallback"]),
    "qwen_code": ("qwen-code", ["hooks", "fallback"]),
    "vscode": ("vscode", ["hooks", "fallback"]),
    "kimi_code": ("kimi-code", ["hooks", "fallback"]),
    "antigravity": ("antigravity", ["hooks", "fallback"]),
    "opencode": ("opencode", ["moments", "fallback"]),
    "kilocode": ("kilocode", ["moments", "fallback"]),
    "cline": ("cline", ["hooks", "fallback"]),
    "hermes": ("hermes", ["hooks", "fallback"]),
    "pi": ("pi", ["moments", "fallback"]),
    "claude_code": ("claude-code", []),
}


def _claude_code_inputs() -> list[tuple[dict[str, Any], str | None]]:
    fx = corpus("mappings/claude-code.json")
    base = {"session_id": "s_fix_1", "cwd": "/home/user/proj", "permission_mode": "default"}

    def hook(name: str, **kw: Any) -> dict[str, Any]:
        return {**base, "hook_event_name": name, **kw}

    bash = {"command": "make test"}
    elicit = copy.deepcopy(fx["elicitation"]["input"])
    return [(p, None) for p in [
        hook("SessionStart", source="startup", model="claude-sonnet-4-5"),
        hook("UserPromptSubmit", prompt="fix the build"),
        hook("PreToolUse", tool_name="Bash", tool_input=bash, tool_use_id="toolu_1"),
        hook("PermissionRequest", tool_name="Bash", tool_input=bash, tool_use_id="toolu_1"),
        hook("PostToolUse", tool_name="Bash", tool_input=bash, tool_response={"stdout": "ok"}, tool_use_id="toolu_1"),
        hook("PostToolUseFailure", tool_name="Bash", tool_input=bash, tool_use_id="toolu_1", error="exit 1"),
        hook("PermissionRequest", tool_name="AskUserQuestion", tool_use_id="toolu_q",
             tool_input=copy.deepcopy(fx["ask_user_question"]["input"])),
        hook("PostToolUse", tool_name="AskUserQuestion", tool_use_id="toolu_q", tool_input={}, tool_response={}),
        hook("Elicitation", mcp_server_name="deploy", elicitation_id="el_1", **elicit),
        hook("ElicitationResult", mcp_server_name="deploy", elicitation_id="el_1", action="accept",
             content={"environment": "staging", "confirm": True}),
        hook("ElicitationResult", mcp_server_name="deploy", elicitation_id="el_1", action="accept", content={}),
        hook("ElicitationResult", mcp_server_name="deploy", elicitation_id="el_1", action="decline"),
        hook("SubagentStart", agent_id="a1", agent_type="general-purpose"),
        hook("SubagentStop", agent_id="a1", agent_type="general-purpose"),
        hook("PostCompact", trigger="auto"),
        hook("Notification", message="waiting", notification_type="idle_prompt"),
        hook("Stop", stop_hook_active=False),
        hook("StopFailure", error="rate_limit"),
        hook("SessionEnd", reason="exit"),
    ]]


def inputs(rtype: str) -> list[tuple[dict[str, Any], str | None]]:
    """(payload, ?hook= value) for every fixture moment of a receiver."""
    if rtype == "claude_code":
        return _claude_code_inputs()
    fixture, sections = FIXTURES[rtype]
    doc = corpus(f"mappings/{fixture}.json")
    out = []
    for section in sections:
        entries = [doc[section]] if section == "fallback" else [
            e for k, e in doc[section].items() if not k.startswith("$")]
        for e in entries:
            if isinstance(e, dict) and isinstance(e.get("input"), dict):
                out.append((e["input"], e.get("hook")))
    return out


# OTLP profile -> its fixture; records arrive flattened, one Signal each, in the receiver's mode.
OTLP = {"otlp/vscode": "vscode-otel", "otlp/codex": "codex-otel"}


def _otlp_inputs(fixture: str) -> list[dict[str, Any]]:
    doc = corpus(f"mappings/{fixture}.json")
    return [e["input"] for e in [*doc["records"].values(), doc["unknown"]] if isinstance(e, dict)]


def surface(rtype: str) -> Any:
    factory = REGISTRY.get(Kind.RECEIVER, rtype)
    return factory.create(CreateSettings(id=rtype), factory.default_config(), None).surface


SURFACES = {r: surface(r) for r in FIXTURES}
STATE = Path(tempfile.mkdtemp(prefix="aep-stream-property-"))


@functools.cache
def _request(path: str) -> Any:
    return make_mocked_request("POST", path)  # built once per path: it is slow, and only read


def signal(rtype: str, payload: dict[str, Any], hook: str | None) -> Signal:
    # The receiver's own extraction (hook name, query, attributes), on an aiohttp request object.
    return SURFACES[rtype].signal(copy.deepcopy(payload), _request("/hook" + (f"?hook={hook}" if hook else "")))


def two_sessions(rtype: str, items: list[tuple[dict[str, Any], str | None]]) -> list[tuple[dict[str, Any], str | None]]:
    """The moments again in a second session, so draws interleave two sessions of one agent.

    The session a moment lands in is what the mapping says it is; the copy has that id (wherever
    the payload spells it: a key, a path, a turn id) replaced by another.
    """
    chain = MappingProcessor()
    out = list(items)
    for payload, hook in items:
        sessions = {d.get("session") for d in chain([signal(rtype, payload, hook)]) if isinstance(d, dict)}
        sid = next((x for x in sessions if isinstance(x, str) and len(x) >= 4), None)
        if sid is not None:
            text = json.dumps(payload).replace(json.dumps(sid)[1:-1], json.dumps(sid + "-b")[1:-1])
            out.append((json.loads(text), hook))
    return out


INPUTS = {r: two_sessions(r, inputs(r)) for r in FIXTURES}


def test_every_vendor_has_inputs():
    for rtype, items in INPUTS.items():
        assert len(items) >= 10, rtype
        sessions = {d.get("session") for p, h in items for d in MappingProcessor()([signal(rtype, p, h)])}
        assert len(sessions - {None}) >= 2, (rtype, sessions)  # two sessions to interleave
    for fixture in OTLP.values():
        assert len(_otlp_inputs(fixture)) >= 5, fixture


def draw_order(data: st.DataObject, n: int) -> list[int]:
    """Every moment once, in any order, then repeats of any of them spliced in anywhere."""
    order = list(data.draw(st.permutations(range(n)), label="order"))
    for at, i in data.draw(st.lists(st.tuples(st.integers(0, n), st.integers(0, n - 1)), max_size=n), label="repeats"):
        order.insert(at, i)
    return order


def check(chain: Chain, stream: StreamValidator, signal: Signal, what: Any) -> None:
    for event in chain.feed_signal(signal):
        problems = envelope_errors(event) + payload_errors(event) + stream.feed(event)
        assert problems == [], (what, event, problems)


@pytest.mark.parametrize("rtype", sorted(FIXTURES))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), ceiling=st.sampled_from(["metadata", "full"]))
def test_any_order_of_a_vendors_moments_gives_a_valid_stream(rtype: str, data: st.DataObject, ceiling: str):
    items = INPUTS[rtype]
    order = draw_order(data, len(items))
    chain, stream = Chain(STATE, ceiling=ceiling), StreamValidator()
    for i in order:
        check(chain, stream, signal(rtype, *items[i]), (rtype, order))


@pytest.mark.parametrize("receiver", sorted(OTLP))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), ceiling=st.sampled_from(["metadata", "full"]),
       mode=st.sampled_from(["companion", "primary"]))
def test_any_order_of_otlp_records_gives_a_valid_stream(receiver: str, data: st.DataObject, ceiling: str,
                                                        mode: str):
    factory = REGISTRY.get(Kind.RECEIVER, "otlp")
    agent = factory.config_class(profile=receiver.split("/")[1]).agent
    records = _otlp_inputs(OTLP[receiver])
    chain, stream = Chain(STATE, ceiling=ceiling), StreamValidator()
    for i in draw_order(data, len(records)):
        flat = copy.deepcopy(records[i])
        name = flat["attributes"].get("event.name")
        check(chain, stream, Signal(agent=agent, name=name if isinstance(name, str) else "", payload=flat,
                                    mode=mode), (receiver, mode, i))
