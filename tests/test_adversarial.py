"""Adversarial input against every hook receiver of the real collector binary (hypothesis).

Whatever arrives — arbitrary JSON, wrong types in known fields, missing fields, huge strings,
deep nesting, bytes that are not UTF-8 — a receiver answers with its neutral reply or a clear 4xx,
never a 5xx, never a crash, and every event it emits passes the validator.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from aep_collector.pipeline.component import Kind
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.validate import StreamValidator, envelope_errors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import Collector, read_jsonl

REGISTRY, _ = build_registry(load_plugins=False)
# otlp has its own case below; nats takes AEP events from a stream, not vendor payloads over HTTP.
HOOK_RECEIVERS = [t for t in REGISTRY.types(Kind.RECEIVER) if t not in ("otlp", "nats")]
KNOWN_KEYS = ["hook_event_name", "session_id", "tool_name", "tool_input", "tool_response", "tool_use_id",
              "prompt", "turn_id", "notification_type", "kind", "event", "hookName", "taskId", "conversationId",
              "stepIdx", "toolCall", "questions", "requested_schema", "mcp_server_name", "extra", "type"]
HOOK_NAMES = ["SessionStart", "SessionEnd", "UserPromptSubmit", "Stop", "PreToolUse", "PostToolUse",
              "PostToolUseFailure", "PermissionRequest", "Notification", "Elicitation", "ElicitationResult",
              "PreCompact", "PostCompact", "SubagentStart", "TeammateIdle", "BeforeAgent", "AfterTool",
              "agent_start", "tool_call", "pre_tool_call", "on_session_end", "SomethingNew", ""]

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)
payload = st.fixed_dictionaries({}, optional={k: json_value for k in KNOWN_KEYS}).flatmap(
    lambda d: st.just(d) | st.builds(lambda n, s: {**d, "hook_event_name": n, "session_id": s},
                                     st.sampled_from(HOOK_NAMES), st.text(min_size=0, max_size=40)))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adversarial")
    receivers: dict = {t: {"endpoint": "127.0.0.1:0"} for t in HOOK_RECEIVERS}
    receivers["otlp/vscode"] = {"profile": "vscode", "mode": "primary", "http": {"endpoint": "127.0.0.1:0"}}
    cfg = {"receivers": receivers,
           "processors": {"mapping": None, "runs": None, "capture": None},
           "exporters": {"jsonl": {"directory": str(tmp / "logs"), "fsync": "never"}},
           "service": {"state_dir": str(tmp / "state"), "pipelines": {"all": {
               "receivers": list(receivers), "processors": ["mapping", "runs", "capture"], "exporters": ["jsonl"]}}}}
    c = Collector(cfg, tmp).start()
    yield c, tmp
    assert c.stop() == 0, "".join(c.log)[-3000:]


def post(port: int, data: bytes, query: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/hook{query}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def check_reply(status: int, body: bytes) -> None:
    assert status in (200, 400, 413), (status, body[:300])
    if body:
        parsed = json.loads(body)
        if status != 200:
            assert isinstance(parsed.get("error"), str) and isinstance(parsed.get("detail"), str)


@pytest.mark.parametrize("receiver", HOOK_RECEIVERS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=payload, hook=st.sampled_from(HOOK_NAMES))
def test_arbitrary_payloads_get_a_neutral_reply_or_a_clear_4xx(stack, receiver, body, hook):
    c, _ = stack
    port = c.ports[f"receiver/{receiver}"]
    status, reply = post(port, json.dumps(body).encode(), f"?hook={hook}")
    check_reply(status, reply)


@pytest.mark.parametrize("receiver", HOOK_RECEIVERS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes_never_5xx(stack, receiver, raw):
    c, _ = stack
    check_reply(*post(c.ports[f"receiver/{receiver}"], raw))


@pytest.mark.parametrize("receiver", HOOK_RECEIVERS)
def test_huge_deep_and_non_utf8_bodies(stack, receiver):
    c, _ = stack
    port = c.ports[f"receiver/{receiver}"]
    deep = ("[" * 5000 + '"x"' + "]" * 5000).encode()
    cases = [
        json.dumps({"hook_event_name": "PreToolUse", "session_id": "s", "tool_input": {"a": "x" * 900_000}}).encode(),
        b'{"hook_event_name": "PreToolUse", "session_id": "s", "tool_input": ' + deep + b"}",
        b'{"hook_event_name": "PreToolUse", "session_id": "s", "tool_input": {"a": ' + deep[:1900] + b"]" * 0 + b"}}",
        b'{"hook_event_name": "Stop", "session_id": "\xff\xfe"}',
        b"x" * (2 << 20),
    ]
    for raw in cases:
        check_reply(*post(port, raw, "?hook=PreToolUse"))
    # Still serving afterwards.
    status, _ = post(port, json.dumps({"hook_event_name": "SessionStart", "session_id": "alive"}).encode(),
                     "?hook=SessionStart")
    assert status == 200


def post_otlp(port: int, data: bytes, ctype: str) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/logs", data=data, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=json_value, raw=st.binary(max_size=400),
       ctype=st.sampled_from(["application/json", "application/x-protobuf", "text/plain"]))
def test_the_otlp_receiver_never_5xx(stack, body, raw, ctype):
    c, _ = stack
    port = c.ports["receiver/otlp/vscode:http"]
    for data in (json.dumps(body).encode(), raw,
                 json.dumps({"resourceLogs": [{"resource": {"attributes": body}, "scopeLogs": body}]}).encode()):
        assert post_otlp(port, data, ctype) in (200, 400, 413, 415)


def test_every_emitted_event_is_valid(stack):
    c, tmp = stack
    # Run after the property tests in this module (pytest keeps file order).
    files = list(Path(tmp / "logs").rglob("*.jsonl"))
    assert files, "the adversarial tests produced no events at all"
    for f in files:
        stream = StreamValidator()
        for ev in read_jsonl(f):
            assert envelope_errors(ev) == [], (f, ev)
            assert stream.feed(ev) == [], (f, ev)
