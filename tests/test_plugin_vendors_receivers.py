"""The five receivers' HTTP contract: ports, naming, refusals, healthz, declared control, config keys."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aep_collector.pipeline.config import ConfigError, parse
from aep_collector.pipeline.control import RESPOND
from aep_collector.pipeline.registry import build_registry
from aep_collector.receivers.plugin_vendors import FACTORIES
from aep_collector.receivers.plugin_vendors import cline as cline_rx
from aep_collector.receivers.plugin_vendors import hermes as hermes_rx
from aep_collector.receivers.plugin_vendors import pi as pi_rx
from aep_collector.receivers.plugin_vendors.bus import loopback_url

from tests.conftest import corpus
from tests.helpers import running
from tests.plugin_vendors_support import VENDORS, Env, config

PORTS = {"opencode": 8390, "kilocode": 8391, "cline": 8392, "hermes": 8393, "pi": 8396}
NAMELESS = {  # a payload that does not name its moment, per vendor
    "opencode": {"input": {"tool": "bash", "sessionID": "s1", "callID": "c1"}, "output": {"args": {"x": 1}}},
    "kilocode": {"input": {"tool": "bash", "sessionID": "s1", "callID": "c1"}, "output": {"args": {"x": 1}}},
    "cline": {"taskId": "t1", "tool_call": {"id": "c1", "name": "read_file", "input": {"x": 1}}, "iteration": 1},
    "hermes": {"tool_name": "terminal", "tool_input": {"x": 1}, "session_id": "s1", "extra": {"tool_call_id": "c1"}},
    "pi": {"session": {"id": "s1"}, "event": {"toolCallId": "c1", "toolName": "bash", "args": {"x": 1}}},
}
NAMES = {"opencode": "tool.execute.before", "kilocode": "tool.execute.before", "cline": "tool_call",
         "hermes": "pre_tool_call", "pi": "tool_execution_start"}
NEUTRAL = {"opencode": {}, "kilocode": {}, "cline": {}, "hermes": {}, "pi": None}


@pytest.fixture
async def env(tmp_path):
    async with running(config(tmp_path)) as service:
        yield Env(service, tmp_path)


def test_factories_are_registered_with_the_reference_ports() -> None:
    registry, problems = build_registry(load_plugins=False)
    assert problems == []
    for factory in FACTORIES:
        assert registry.get(factory.kind, factory.type) is factory
        assert factory.default_config().endpoint == f"127.0.0.1:{PORTS[factory.type]}"
    assert sorted(f.type for f in FACTORIES) == sorted(VENDORS)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("how", ["query", "hook-query", "wrapper"])
async def test_a_nameless_payload_can_be_named(env: Env, vendor: str, how: str) -> None:
    body: Any = copy.deepcopy(NAMELESS[vendor])
    params = None
    if how == "query":
        params = {"name": NAMES[vendor]}
    elif how == "hook-query":
        params = {"hook": NAMES[vendor]}
    else:
        body = {"name": NAMES[vendor], "payload": body}
    assert await env.post(vendor, body, params=params) == (200, NEUTRAL[vendor])
    (event,) = env.events(vendor)
    assert event["type"] == "tool.requested" and event["data"]["tool"]["call_id"] == "c1"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_an_unnamed_moment_is_refused_with_the_way_to_name_it(env: Env, vendor: str) -> None:
    status, body = await env.post(vendor, NAMELESS[vendor])
    assert status == 400 and body["error"] == "invalid-payload"
    assert "?name=" in body["detail"] and env.events(vendor) == []


@pytest.mark.parametrize("vendor", VENDORS)
async def test_root_path_takes_hooks_and_errors_are_json(env: Env, vendor: str) -> None:
    assert await env.post(vendor, NAMELESS[vendor], params={"name": NAMES[vendor]}, path="/") == (200, NEUTRAL[vendor])
    status, body = await env.post(vendor, {"x": 1}, path="/nope")
    assert status == 404 and body["error"] == "not-found"
    status, body = await env.post(vendor, [1, 2])
    assert status == 400 and body["error"] == "invalid-payload"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_healthz_and_the_declared_control_block(env: Env, vendor: str) -> None:
    health = await env.get(vendor, "/healthz")
    assert health["ok"] is True and health["relay"] is False
    if vendor in ("hermes", "pi"):
        assert health["control"] is False  # the gate is off by default
    else:
        assert "control" not in health
    declared = env.router.accepts(vendor)
    assert declared == ([RESPOND] if vendor in ("opencode", "kilocode") else [])


@pytest.mark.parametrize("vendor", ["hermes", "pi"])
async def test_gate_on_is_declared_and_reported_while_honoured(tmp_path, vendor: str) -> None:
    async with running(config(tmp_path, **{vendor: {"control": True}})) as service:
        e = Env(service, tmp_path)
        assert e.router.accepts(vendor) == [RESPOND]
        assert (await e.get(vendor, "/healthz"))["control"] is False  # declared, but no route can answer
        e.router.set_route(vendor, True)
        assert (await e.get(vendor, "/healthz"))["control"] is True
        e.router.set_route(vendor, False)
        assert (await e.get(vendor, "/healthz"))["control"] is False


async def test_cline_replies_never_carry_agent_mutating_fields(env: Env) -> None:
    for name, case in corpus("mappings/cline.json")["hooks"].items():
        status, reply = await env.post("cline", case["input"])
        assert status == 200 and isinstance(reply, dict), name
        assert not (set(reply) & cline_rx.CONTROL_FIELDS), name


def test_config_keys_defaults_and_refusals() -> None:
    registry, _ = build_registry(load_plugins=False)

    def receiver(rtype: str, raw: dict[str, Any]) -> Any:
        cfg = parse({"receivers": {rtype: raw}, "processors": {"mapping": None},
                     "exporters": {"jsonl": {"directory": "/tmp/x"}},
                     "service": {"pipelines": {"p": {"receivers": [rtype], "processors": ["mapping"],
                                                     "exporters": ["jsonl"]}}}},
                    registry, "t.yaml")
        return cfg.receivers[rtype][1]

    assert receiver("hermes", {}).control is False and receiver("hermes", {}).gate_tools == ".*"
    assert receiver("hermes", {"control": "1"}).control is True
    assert receiver("pi", {"control": "off", "deltas": "yes"}).deltas is True
    assert receiver("kilocode", {}).reply_routes is True and receiver("kilocode", {}).attention_timeout == 55.0
    for rtype, raw, needle in [("hermes", {"control": "maybe"}, "control"), ("pi", {"gate_tools": "("}, "gate_tools"),
                               ("opencode", {"attention_timeout": 0}, "attention_timeout"),
                               ("kilocode", {"reply_route_timeout": -1}, "reply_route_timeout"),
                               ("cline", {"control": True}, "unknown key")]:
        with pytest.raises(ConfigError, match=needle):
            receiver(rtype, raw)


@pytest.mark.parametrize(("url", "want"), [
    ("http://127.0.0.1:4096", "http://127.0.0.1:4096"), ("http://localhost:4096/", "http://localhost:4096"),
    ("http://[::1]:4096", "http://[::1]:4096"), ("https://127.0.0.2:1/base/", "https://127.0.0.2:1/base"),
    ("http://10.0.0.5:4096", None), ("http://example.com", None), ("file:///etc/passwd", None), ("", None),
    ("not a url", None), (None, None),
])
def test_answers_only_go_to_a_loopback_vendor_server(url: Any, want: str | None) -> None:
    assert loopback_url(url) == want


def test_the_readme_config_table_matches_the_config_classes() -> None:
    import dataclasses
    import re

    from tests.helpers import ROOT

    text = (ROOT / "receivers" / "plugin_vendors" / "README.md").read_text(encoding="utf-8")
    table = text[text.index("| Receiver | Key |"):]
    defaults = {f.type: dataclasses.asdict(f.default_config()) for f in FACTORIES}
    receiver, checked = None, 0
    for row in re.findall(r"^\| (`\w+`|) *\| `(\w+)` \| `([^`]*)` \|", table, re.M):
        receiver = row[0].strip("`") or receiver
        key, default = row[1], row[2]
        want = defaults[receiver][key]
        assert str(want).lower() == default.lower() if isinstance(want, bool) else str(want) == default, (receiver, key)
        checked += 1
    assert checked == 15  # every row with a single key


BATCHING = {"opencode": "mappings/opencode.json", "kilocode": "mappings/kilocode.json", "pi": "mappings/pi.json"}


def moments(vendor: str, *names: str) -> list[dict[str, Any]]:
    fixture = corpus(BATCHING[vendor])["moments"]
    return [copy.deepcopy(fixture[n]["input"]) for n in names]


@pytest.mark.parametrize("vendor", list(BATCHING))
async def test_a_batch_maps_each_item_in_order_and_reports_the_bad_ones(env: Env, vendor: str) -> None:
    pair = ("tool_before", "tool_after") if vendor != "pi" else ("tool_execution_start", "tool_execution_end_ok")
    good = moments(vendor, *pair)
    status, body = await env.post(vendor, {"batch": [good[0], {"nameless": True}, 7, good[1]]})
    assert status == 200 and body["accepted"] == 2
    assert [(e["index"], e["error"]) for e in body["errors"]] == [(1, "invalid-payload"), (2, "invalid-payload")]
    assert [e["type"] for e in env.events(vendor)] == ["tool.requested", "tool.completed"]
    assert (await env.get(vendor, "/healthz"))["ok"] is True


@pytest.mark.parametrize("vendor", list(BATCHING))
@pytest.mark.parametrize("batch", [[], {"a": 1}, [1, "x"]], ids=["empty", "object", "all-bad"])
async def test_a_batch_with_nothing_to_accept_is_refused(env: Env, vendor: str, batch: Any) -> None:
    status, body = await env.post(vendor, {"batch": batch})
    assert status == 400 and body["error"] == "invalid-payload"
    assert env.events(vendor) == []


async def test_a_moment_that_waits_for_its_reply_is_refused_inside_a_batch(env: Env) -> None:
    ask, before = moments("opencode", "permission_ask", "tool_before")
    pi_call = {"session": {"id": "s1"}, "event": {"type": "tool_call", "toolCallId": "c1", "toolName": "bash"}}
    status, body = await env.post("opencode", {"batch": [ask, before]})
    assert status == 200 and body["accepted"] == 1 and body["errors"][0]["index"] == 0
    assert "POST it alone" in body["errors"][0]["detail"]
    status, body = await env.post("pi", {"batch": [pi_call]})
    assert status == 400 and "POST it alone" in body["errors"][0]["detail"]


async def test_vendors_without_a_batching_plugin_do_not_take_batches(env: Env) -> None:
    # Cline and Hermes run the shim, one moment per process: a {"batch"} body is just a nameless one.
    for vendor in ("cline", "hermes"):
        status, body = await env.post(vendor, {"batch": [NAMELESS[vendor]]})
        assert status == 400, vendor


# --- replies (what the vendor gets back lives with its receiver) ---------------------------------


def test_neutral_replies() -> None:
    assert cline_rx.NEUTRAL_REPLY == {} and not cline_rx.CONTROL_FIELDS & set(cline_rx.NEUTRAL_REPLY)
    assert hermes_rx.NEUTRAL_REPLY == {}
    assert pi_rx.NEUTRAL_REPLY is None  # the extension handler returns nothing


def test_deny_replies_are_the_vendor_block_directives() -> None:
    assert hermes_rx.deny_reply("not on prod") == {"action": "block", "message": "not on prod"}
    assert pi_rx.deny_reply("not on prod") == {"block": True, "reason": "not on prod"}
    # Both vendors need a non-empty reason; a blank one gets a stated default, never "".
    assert hermes_rx.deny_reply("  ")["message"] and hermes_rx.deny_reply(None)["action"] == "block"
    assert pi_rx.deny_reply("")["reason"] and pi_rx.deny_reply(None)["block"] is True


def test_hermes_context_reply_is_steering_or_neutral() -> None:
    assert hermes_rx.context_reply("use pnpm") == {"context": "use pnpm"}
    assert hermes_rx.context_reply("   ") == {} and hermes_rx.context_reply(None) == {}
