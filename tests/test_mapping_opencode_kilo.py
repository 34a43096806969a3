"""OpenCode and Kilo Code mappings: every fixture pin, runtime state and odd shapes.

The fixtures' ``sse_modes`` (a read-only SSE bridge profile) are not pinned: no receiver reads the
vendors' SSE bus, so that mapping was removed rather than kept untested in practice."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline.control import attention_key
from aep_collector.pipeline.envelope import COMMAND_TYPE, SEVERITIES, TYPE_GRAMMAR, Stamper
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.payload import get_dict, get_str
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.mapping import MappingProcessor, kilocode, load_vendor, opencode, plugin_bus
from aep_collector.receivers.plugin_vendors import bus_replies
from aep_sdk.gen import PAYLOAD_MODELS
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import corpus
from tests.received import received

VENDORS = {"opencode": (opencode, "mappings/opencode.json"), "kilocode": (kilocode, "mappings/kilocode.json")}
FIXTURES = {agent: corpus(path) for agent, (_, path) in VENDORS.items()}
HOOK_NAMES = {"tool.before": "tool.execute.before", "tool.after": "tool.execute.after",
              "permission.ask": "permission.ask"}


def strip(expected: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if expected is None else {k: v for k, v in expected.items() if k != "$comment"}


def project(d: dict[str, Any] | None, policy: CapturePolicy | None = None) -> dict[str, Any] | None:
    """Cap at the pinned posture and keep what the fixtures compare: {type, data, subject?}."""
    if d is None:
        return None
    g = cap_draft(d, policy or CapturePolicy())
    out = {"type": g["type"], "data": g.get("data")}
    if "subject" in g:
        out["subject"] = g["subject"]
    return out


def signal_for(agent: str, moment: dict[str, Any], received_ns: int = 0, **kw: Any) -> Signal:
    """The Signal a plugin POST becomes, decoded by the receiver (session, a bus ask's options or
    form): name = bus type or hook name, payload = the fixture input."""
    kind = moment.get("kind")
    name = moment["event"]["type"] if kind == "bus" else HOOK_NAMES[kind]
    return received(agent, name, copy.deepcopy(moment), received_ns=received_ns, **kw)


def pure(agent: str, moment: Any) -> dict[str, Any] | None:
    """The pure mapping of one moment as the receiver decodes it (no runtime state)."""
    kind = moment.get("kind") if isinstance(moment, dict) else None
    name = get_str(get_dict(moment, "event"), "type") if kind == "bus" else HOOK_NAMES.get(str(kind), "")
    return VENDORS[agent][0].map_moment(received(agent, name or "", copy.deepcopy(moment)))


def cases(section: str) -> list[Any]:
    out = []
    for agent, fx in FIXTURES.items():
        for name, case in fx[section].items():
            if name != "$comment":
                out.append(pytest.param(agent, name, case, id=f"{agent}-{name}"))
    return out


# --- the pins ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("agent", "name", "case"), cases("moments"))
def test_moment_matches_pin(agent: str, name: str, case: dict[str, Any]) -> None:
    assert project(pure(agent, case["input"])) == strip(case["expected"])


# session_idle/todo_updated depend on runtime state by design; they are covered by the sequences below.
STATEFUL = {"session_idle", "todo_updated"}


@pytest.mark.parametrize(("agent", "name", "case"), [c for c in cases("moments") if c.values[1] not in STATEFUL])
def test_signal_path_matches_pin(agent: str, name: str, case: dict[str, Any]) -> None:
    mod = VENDORS[agent][0]
    drafts = mod.map_signal(signal_for(agent, case["input"]), mod.new_state())
    expected = strip(case["expected"])
    assert [project(d) for d in drafts] == ([] if expected is None else [expected])


@pytest.mark.parametrize(("agent", "name", "case"), [c for c in cases("moments") if c.values[1] not in STATEFUL])
def test_signal_name_alone_finds_the_moment(agent: str, name: str, case: dict[str, Any]) -> None:
    # A POST that lost its `kind` still maps: the receiver decodes it by the signal name.
    mod = VENDORS[agent][0]
    name = signal_for(agent, case["input"]).name
    signal = received(agent, name, {k: v for k, v in copy.deepcopy(case["input"]).items() if k != "kind"})
    expected = strip(case["expected"])
    assert [project(d) for d in mod.map_signal(signal, mod.new_state())] == ([] if expected is None else [expected])


@pytest.mark.parametrize("agent", list(VENDORS))
def test_todos_diff_matches_pin(agent: str) -> None:
    fx = FIXTURES[agent]["todos"]  # the family's diff, against each vendor's pin
    got = [project(d) for d in plugin_bus.diff_todos(fx["input"]["prev"], fx["input"]["next"])]
    assert got == [strip(e) for e in fx["expected"]]


@pytest.mark.parametrize("agent", list(VENDORS))
def test_fallback_matches_pin(agent: str) -> None:
    mod, fx = VENDORS[agent][0], FIXTURES[agent]["fallback"]
    assert project(pure(agent, fx["input"])) == strip(fx["expected"])
    drafts = mod.map_signal(signal_for(agent, fx["input"]), mod.new_state())
    assert [project(d) for d in drafts] == [strip(fx["expected"])]


# --- every output is a valid envelope at every posture ------------------------------------------


def all_drafts(agent: str) -> list[dict[str, Any]]:
    fx = FIXTURES[agent]
    out = [pure(agent, c["input"]) for c in fx["moments"].values()]
    out += plugin_bus.diff_todos(fx["todos"]["input"]["prev"], fx["todos"]["input"]["next"])
    out.append(pure(agent, fx["fallback"]["input"]))
    return [d for d in out if d is not None]


@pytest.mark.parametrize("ceiling", ["none", "metadata", "redacted", "full"])
@pytest.mark.parametrize("agent", list(VENDORS))
def test_outputs_stamp_and_validate(agent: str, ceiling: str, tmp_path: Path) -> None:
    stamper = Stamper(tmp_path, host="test")
    for d in all_drafts(agent):
        gated = cap_draft({**d, "agent": agent}, CapturePolicy(ceiling=ceiling, overrides={}))
        ev = stamper.stamp(gated)
        assert TYPE_GRAMMAR.match(ev["type"]) and not COMMAND_TYPE.match(ev["type"])
        assert ev.get("severity", "info") in SEVERITIES
        model = PAYLOAD_MODELS.get(ev["type"])
        if model is not None and "data" in ev:
            model.model_validate(ev["data"])


def full(d: dict[str, Any]) -> dict[str, Any]:
    return cap_draft(d, CapturePolicy(ceiling="full", overrides={}))["data"]


def redacted(d: dict[str, Any]) -> dict[str, Any]:
    return cap_draft(d, CapturePolicy(ceiling="redacted", overrides={}))["data"]


def moment(agent: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(FIXTURES[agent]["moments"][name]["input"])


def test_content_rides_at_its_schema_field_for_the_capture_gate() -> None:
    assert full(pure("opencode", moment("opencode", "tool_before")))["args"] == {"command": "npm test"}
    after = full(pure("opencode", moment("opencode", "tool_after")))
    assert after["result"] == "ok 42 tests" and after["title"] == "npm test"
    started = redacted(pure("opencode", moment("opencode", "session_created")))
    assert started["label"] == "fix the build" and started["cwd"].endswith("/proj")
    assert redacted(pure("opencode", moment("opencode", "session_status_retry")))["message"] == "rate limited"
    assert redacted(pure("opencode", moment("opencode", "session_error")))["message"] == "upstream 500"
    assert redacted(pure("opencode", moment("opencode", "command_executed")))["arguments"] == "--watch"
    assert redacted(pure("opencode", moment("opencode", "file_edited")))["file"].endswith("src/a.ts")
    fx = FIXTURES["opencode"]["todos"]["input"]
    planned = plugin_bus.diff_todos(fx["prev"], fx["next"])[1]
    assert redacted(planned) == {"task": {"title": "ship it"}}


def test_tool_args_twin_is_built_at_redacted() -> None:
    data = redacted(pure("opencode", moment("opencode", "tool_before")))
    assert data["args_redacted"] == {"command": "npm test"} and "args" not in data


def test_kilo_form_degrades_structurally_below_redacted() -> None:
    d = pure("kilocode", moment("kilocode", "question_asked"))
    assert d["_fields"] == d["data"]["fields"]
    g = cap_draft({**d, "agent": "kilocode"}, CapturePolicy(overrides={}))  # attention at metadata too
    assert g["data"]["prompt"] == "kilocode asks 1 question"
    field = g["data"]["fields"][0]
    assert field["label"] == "1" and [c["label"] for c in field["choices"]] == ["1", "2"]


def test_kilo_form_shapes() -> None:
    props = {"id": "que_9", "sessionID": "s", "questions": [
        {"question": "Pick", "header": "H", "options": [{"label": "a"}, {"label": "b"}], "multiple": True,
         "custom": False},
        {"question": "Free?", "header": "F", "options": []},
        {"question": "Default", "options": [{"label": "x"}]},  # `custom` absent: the vendor default is true
    ]}
    d = pure("kilocode", {"kind": "bus", "event": {"type": "question.asked", "properties": props}})
    first, second, third = d["data"]["fields"]
    assert d["data"]["prompt"] == "kilocode asks 3 questions" and d["subject"] == "que_9"
    assert third["other"] is True and third["label"] == "Default" and "multi" not in third
    assert first["multi"] is True and "other" not in first and first["label"] == "H: Pick"
    assert second == {"id": "2", "type": "string", "label": "F: Free?", "required": True}


# --- stateful sequences through map_signal -------------------------------------------------------


def bus(agent: str, type_: str, **props: Any) -> Signal:
    return received(agent, type_, {"kind": "bus", "event": {"type": type_, "properties": props}})


def user(agent: str, session: str, msg: str) -> Signal:
    return bus(agent, "message.updated", info={"id": msg, "sessionID": session, "role": "user"})


def types(drafts: list[dict[str, Any]]) -> list[str]:
    return [d["type"] for d in drafts]


@pytest.mark.parametrize("mod", [opencode, kilocode], ids=["opencode", "kilocode"])
def test_runs_open_on_first_user_message_and_close_on_idle(mod: Any) -> None:
    a, st_ = mod.AGENT, mod.new_state()
    assert types(mod.map_signal(bus(a, "session.created", info={"id": "s1", "version": "1"}), st_)) == [
        "session.started"]
    assert mod.map_signal(bus(a, "session.idle", sessionID="s1"), st_) == []  # no run open yet
    opened = mod.map_signal(user(a, "s1", "m1"), st_)
    assert types(opened) == ["run.started"] and opened[0]["session"] == "s1"
    # The same message updating again, and a second user message (steering), never open a second run.
    for again in (user(a, "s1", "m1"), user(a, "s1", "m2")):
        out = mod.map_signal(again, st_)
        assert types(out) == [f"x.{a}.message.updated"] and out[0]["data"] == {"role": "user"}
    assert types(mod.map_signal(bus(a, "session.idle", sessionID="s1"), st_)) == ["run.finished"]
    assert mod.map_signal(bus(a, "session.idle", sessionID="s1"), st_) == []  # one terminal per run
    # The opener re-updating after the boundary is not a new prompt; a new message is.
    assert types(mod.map_signal(user(a, "s1", "m2"), st_)) == [f"x.{a}.message.updated"]
    assert types(mod.map_signal(user(a, "s1", "m3"), st_)) == ["run.started"]


def test_runs_are_per_session() -> None:
    st_ = opencode.new_state()
    assert types(opencode.map_signal(user("opencode", "s1", "m1"), st_)) == ["run.started"]
    assert types(opencode.map_signal(user("opencode", "s2", "m9"), st_)) == ["run.started"]
    assert types(opencode.map_signal(bus("opencode", "session.idle", sessionID="s2"), st_)) == ["run.finished"]
    assert types(opencode.map_signal(user("opencode", "s1", "m2"), st_)) == ["x.opencode.message.updated"]


def test_session_created_resets_and_deleted_forgets() -> None:
    st_ = opencode.new_state()
    opencode.map_signal(user("opencode", "s1", "m1"), st_)
    assert types(opencode.map_signal(bus("opencode", "session.deleted", info={"id": "s1"}), st_)) == [
        "session.ended"]
    assert "s1" not in st_.sessions
    opencode.map_signal(bus("opencode", "session.created", info={"id": "s1"}), st_)
    assert st_.sessions["s1"].run_open is False


def tool(agent: str, kind: str, call: str | None, received_ns: int, name: str | None = "bash",
         **output: Any) -> Signal:
    inp: dict[str, Any] = {"sessionID": "s1"}
    if call is not None:
        inp["callID"] = call
    if name is not None:
        inp["tool"] = name
    m = {"kind": kind, "input": inp, "output": output}
    return signal_for(agent, m, received_ns=received_ns)


@pytest.mark.parametrize("mod", [opencode, kilocode], ids=["opencode", "kilocode"])
def test_tools_pair_by_call_id(mod: Any) -> None:
    a, st_ = mod.AGENT, mod.new_state()
    first = mod.map_signal(tool(a, "tool.before", "c1", 1_000_000_000, args={"command": "ls"}), st_)
    assert types(first) == ["tool.requested"] and first[0]["data"]["tool"] == {"name": "bash", "call_id": "c1"}
    mod.map_signal(tool(a, "tool.before", "c2", 1_500_000_000, name="read", args={"path": "x"}), st_)
    # Out of order, and the after hook lost its tool name: the callID finds it.
    second = mod.map_signal(tool(a, "tool.after", "c2", 1_750_000_000, name=None, output="body"), st_)
    assert second[0]["data"]["tool"] == {"name": "read", "call_id": "c2"}
    assert second[0]["subject"] == "read" and second[0]["data"]["duration_ms"] == 250
    done = mod.map_signal(tool(a, "tool.after", "c1", 3_000_000_000, output="ok"), st_)
    assert types(done) == ["tool.completed"] and done[0]["data"]["duration_ms"] == 2000
    assert st_.pending_tools == {}
    # An after with no before is still the completion it reports, with nothing invented.
    orphan = mod.map_signal(tool(a, "tool.after", "c9", 4_000_000_000, output="ok"), st_)
    assert types(orphan) == ["tool.completed"] and "duration_ms" not in orphan[0]["data"]
    # Never tool.failed: this surface has no error (opencode.json tool_after).
    assert all(d["type"] != "tool.failed" for d in first + second + done + orphan)


def todo_signal(agent: str, todos: list[dict[str, Any]]) -> Signal:
    return bus(agent, "todo.updated", sessionID="s1", todos=todos)


@pytest.mark.parametrize("mod", [opencode, kilocode], ids=["opencode", "kilocode"])
def test_todos_diff_across_three_snapshots(mod: Any) -> None:
    a, st_ = mod.AGENT, mod.new_state()

    def step(*items: tuple[str, str]) -> list[tuple[str, str]]:
        todos = [{"id": i, "content": f"task {i}", "status": s} for i, s in items]
        return [(d["type"].rsplit(".", 1)[1], d["subject"]) for d in mod.map_signal(todo_signal(a, todos), st_)]

    assert step(("a", "pending"), ("b", "pending")) == [("planned", "a"), ("planned", "b")]
    assert step(("a", "completed"), ("b", "in_progress"), ("c", "completed")) == [
        ("completed", "a"), ("planned", "c"), ("completed", "c")]
    # a removed (silent), b completes, d is new, c stays done (no repeat).
    assert step(("b", "completed"), ("c", "completed"), ("d", "pending")) == [("completed", "b"), ("planned", "d")]
    assert step(("b", "completed"), ("c", "completed"), ("d", "pending")) == []


def test_todo_snapshots_are_per_session() -> None:
    st_ = opencode.new_state()
    one = [{"id": "t", "status": "pending"}]
    assert len(opencode.map_signal(bus("opencode", "todo.updated", sessionID="s1", todos=one), st_)) == 1
    assert len(opencode.map_signal(bus("opencode", "todo.updated", sessionID="s2", todos=one), st_)) == 1


@pytest.mark.parametrize(("mod", "ask", "settle", "key", "tag"), [
    (opencode, "permission.updated", "permission.replied", "permissionID", "permission"),
    (kilocode, "permission.asked", "permission.replied", "requestID", "permission"),
    (kilocode, "question.asked", "question.replied", "requestID", "question"),
], ids=["opencode-permission", "kilocode-permission", "kilocode-question"])
def test_bus_settle_pairs_with_its_card_and_a_late_echo_is_dropped(mod: Any, ask: str, settle: str, key: str,
                                                                   tag: str) -> None:
    # The attention book (not the mapping) pairs an ask with its settle by the shared _attention_key.
    proc = MappingProcessor()
    if ask == "permission.updated":  # OpenCode's card is the held hook; the bus copy is suppressed
        card = signal_for("opencode", {"kind": "permission.ask", "permission": {"id": "v1", "type": "bash",
                                                                              "sessionID": "s1"}})
    else:
        card = bus(mod.AGENT, ask, id="v1", sessionID="s1", type="bash", questions=[])
    (req,) = proc([card])
    assert req["type"] == "attention.requested" and req["_attention_key"] == attention_key(tag, "v1")
    (res,) = proc([bus(mod.AGENT, settle, sessionID="s1", **{key: "v1"})])
    assert res["type"] == "attention.resolved" and res["subject"] == req["id"] and res["cause"] == req["id"]
    # The card is closed: a second settle (our loop already answered, then the vendor echoed) is an orphan.
    assert proc([bus(mod.AGENT, settle, sessionID="s1", **{key: "v1"})]) == []
    assert proc.attention.orphans == 1


def test_permission_ask_is_held_through_the_mapping_processor() -> None:
    proc = MappingProcessor()
    sig = signal_for("opencode", moment("opencode", "permission_ask"), hold="h-1")
    (d,) = proc([sig])
    assert d["type"] == "attention.requested" and d["_hold"] == "h-1" and d["agent"] == "opencode"
    assert d["session"] == "s_fix_1" and d["severity"] == "notice"
    assert proc([bus("opencode", "permission.updated", **moment("opencode", "permission_updated")["event"][
        "properties"])]) == []
    assert proc.failures == 0


@pytest.mark.parametrize("agent", list(VENDORS))
def test_module_contract(agent: str) -> None:
    mod = load_vendor(agent)
    assert mod is VENDORS[agent][0] and mod.AGENT == agent
    assert isinstance(mod.new_state(), plugin_bus.BusState)
    assert not hasattr(mod, "NEUTRAL_REPLY")  # what the plugin gets back is the receiver's (bus_replies)


# --- identity ----------------------------------------------------------------------------------


def test_session_comes_from_each_moment_shape() -> None:
    st_ = opencode.new_state()
    for name in ("session_created", "session_status_retry", "message_assistant", "permission_ask", "tool_before"):
        (d,) = opencode.map_signal(signal_for("opencode", moment("opencode", name)), st_)
        assert d["session"] == "s_fix_1", name
    (child,) = opencode.map_signal(signal_for("opencode", moment("opencode", "session_created_child")), st_)
    assert child["session"] == "s_fix_child" and child["data"]["parent"] == {"session": "s_fix_1"}
    (srv,) = opencode.map_signal(signal_for("opencode", moment("opencode", "server_connected")), st_)
    assert "session" not in srv
    # info.id names a session only on session.* events: a message id is never a session.
    (m,) = opencode.map_signal(bus("opencode", "message.updated", info={"id": "msg_1", "role": "assistant"}), st_)
    assert "session" not in m


# --- Kilo's two permission surfaces and the fallback names ---------------------------------------


def test_both_families_map_the_bus_ask_with_the_reply_route_options() -> None:
    # OpenCode 1.18.33 asks on the bus like Kilo >=7.4.6 and answers on the same route (seen live).
    asked = moment("kilocode", "permission_asked")
    for agent in VENDORS:
        card = pure(agent, asked)
        assert card is not None
        assert card["type"] == "attention.requested" and card["data"]["respond_via"] == ["control"]
        assert card["data"]["options"] == bus_replies.REPLY_ROUTE_OPTIONS
    question = pure("opencode", moment("kilocode", "question_asked"))
    assert question["data"]["respond_via"] == ["control"] and question["data"]["kind"] == "form"


def test_a_bus_ask_no_receiver_decoded_is_informational() -> None:
    # Without the options or form the receiver decodes, nothing could check or deliver an answer.
    asked = moment("kilocode", "permission_asked")
    card = opencode.map_moment(Signal(agent="opencode", name="permission.asked", payload=asked))
    assert card is not None and card["data"]["respond_via"] == ["oob"] and "options" not in card["data"]
    question = moment("kilocode", "question_asked")
    fallback = opencode.map_moment(Signal(agent="opencode", name="question.asked", payload=question))
    assert fallback is not None and fallback["type"] == "x.opencode.question.asked"  # fields are never guessed


def test_a_rejected_call_fails_from_its_error_part() -> None:
    # OpenCode 1.18.33 `run` with permission.bash "ask": tool.execute.before, then the bus ask,
    # its auto-reject, and the tool part in state "error"; tool.execute.after never fires (live).
    state = opencode.new_state()
    before = {"kind": "tool.before", "input": {"tool": "bash", "sessionID": "s", "callID": "call_1"},
              "output": {"args": {"command": "echo hi"}}}

    def part(status: str, call: str = "call_1") -> Signal:
        props = {"sessionID": "s", "part": {"type": "tool", "tool": "bash", "callID": call, "state": {
            "status": status, "input": {"command": "echo hi"}, "error": "The user rejected permission"}}}
        return received("opencode", "message.part.updated",
                        {"kind": "bus", "event": {"type": "message.part.updated", "properties": props}})

    assert [d["type"] for d in opencode.map_signal(received("opencode", "tool.execute.before",
                                                            before), state)] == ["tool.requested"]
    assert [d["type"] for d in opencode.map_signal(part("running"), state)] == ["x.opencode.message.part.updated"]
    (failed,) = opencode.map_signal(part("error"), state)
    assert failed["type"] == "tool.failed" and failed["subject"] == "bash"
    assert failed["data"]["tool"] == {"name": "bash", "call_id": "call_1"}
    assert failed["data"]["error"] == {"type": "tool_error", "message": "The user rejected permission"}
    # Once closed (or for a call never requested), an error part is just a part update.
    assert [d["type"] for d in opencode.map_signal(part("error"), state)] == ["x.opencode.message.part.updated"]


def test_kilo_runtime_permission_shape() -> None:
    # The shipped >=7.4.6 Request is {permission, patterns, tool}; the prompt reads the same.
    props = {"id": "per_1", "sessionID": "s", "permission": "bash", "patterns": ["rm -rf build"],
             "metadata": {}, "always": ["rm *"], "tool": {"messageID": "m", "callID": "c"}}
    d = pure("kilocode", {"kind": "bus", "event": {"type": "permission.asked", "properties": props}})
    assert project(d) == strip(FIXTURES["kilocode"]["moments"]["permission_asked"]["expected"])
    resolved = pure("kilocode", {"kind": "bus", "event": {"type": "permission.replied", "properties": {
        "sessionID": "s", "requestID": "per_1", "reply": "once"}}})
    assert resolved["subject"] == "per_1" and resolved["data"] == {"resolution": "answered"}


def test_kilo_question_rejected_dismisses_the_card() -> None:
    d = pure("kilocode", {"kind": "bus", "event": {"type": "question.rejected",
                                                      "properties": {"sessionID": "s", "requestID": "que_1"}}})
    assert project(d) == {"type": "attention.resolved", "data": {"resolution": "dismissed"}, "subject": "que_1"}


@pytest.mark.parametrize(("bus_type", "expected"), [
    ("some.future.event", "x.opencode.some.future.event"),
    ("tui.toastShow", "x.opencode.tui.toast_show"),
    ("installation.update-available", "x.opencode.installation.update_available"),
    ("heartbeat", "x.opencode.heartbeat.event"),
    ("", "x.opencode.unknown.event"),
    (None, "x.opencode.unknown.event"),
    ("..", "x.opencode.unknown.event"),
    ("control.cancel", "x.opencode.bus.control.cancel"),
    ("Session.Weird Thing", "x.opencode.session.weird_thing"),
])
def test_fallback_names_are_valid_types(bus_type: Any, expected: str) -> None:
    name = plugin_bus.bus_fallback("opencode", bus_type)
    assert name == expected and TYPE_GRAMMAR.match(name) and not COMMAND_TYPE.match(name)


def test_machinery_plane_is_debug_and_unknown_is_not() -> None:
    assert pure("opencode", {"kind": "bus", "event": {"type": "lsp.updated"}})["severity"] == "debug"
    assert pure("opencode", moment("opencode", "session_error"))["severity"] == "error"
    assert "severity" not in pure("opencode", {"kind": "bus", "event": {"type": "vcs.branch.updated"}})


# --- replies -----------------------------------------------------------------------------------


def test_permission_ask_replies() -> None:
    assert bus_replies.allow_reply() == {"status": "allow"} and bus_replies.deny_reply() == {"status": "deny"}
    assert bus_replies.permission_reply("allow") == {"status": "allow"}
    for refused in ("deny", "ALLOW", "always", "", None):
        assert bus_replies.permission_reply(refused) == {"status": "deny"}  # never grant on the unknown
    reply = bus_replies.allow_reply()
    reply["status"] = "deny"
    assert bus_replies.allow_reply() == {"status": "allow"} and bus_replies.NEUTRAL_REPLY == {}


def test_kilo_rest_permission_body() -> None:
    assert bus_replies.permission_route("per/1") == "/permission/per%2F1/reply"
    assert bus_replies.permission_route_body("once") == {"reply": "once"}
    assert bus_replies.permission_route_body("always", "ignored") == {"reply": "always"}
    assert bus_replies.permission_route_body("reject") == {"reply": "reject"}
    assert bus_replies.permission_route_body(None, "use X instead") == {"reply": "reject", "message": "use X instead"}
    assert bus_replies.permission_route_body("allow") == {"reply": "reject"}  # not an option of this surface


def test_kilo_rest_question_body_uses_original_labels() -> None:
    questions = moment("kilocode", "question_asked")["event"]["properties"]["questions"]
    assert bus_replies.question_route("que_1") == "/question/que_1/reply"
    assert bus_replies.question_route_body(questions, {"1": "2"}) == {"answers": [["SQLite"]]}
    assert bus_replies.question_route_body(questions, {"1": ["1", "2"]}) == {"answers": [["PostgreSQL", "SQLite"]]}
    assert bus_replies.question_route_body(questions, {"1": "MySQL please"}) == {"answers": [["MySQL please"]]}
    assert bus_replies.question_route_body(questions, {}) == {"answers": [[]]}
    assert bus_replies.question_route_body("junk", "junk") == {"answers": []}


# --- odd shapes never crash --------------------------------------------------------------------

ODD_PAYLOADS = [
    None, "text", 7, [], [1, 2], {}, {"kind": 5}, {"kind": "bus"}, {"kind": "bus", "event": "x"},
    {"kind": "bus", "event": {"type": 3, "properties": []}},
    {"kind": "bus", "event": {"type": "message.updated", "properties": {"info": "str"}}},
    {"kind": "bus", "event": {"type": "message.updated", "properties": {"info": {"role": "assistant",
                                                                                  "tokens": {"input": "9"}}}}},
    {"kind": "bus", "event": {"type": "session.status", "properties": {"status": "busy"}}},
    {"kind": "bus", "event": {"type": "session.error", "properties": {"error": "boom"}}},
    {"kind": "bus", "event": {"type": "todo.updated", "properties": {"todos": [1, None, {"id": 5}, {}]}}},
    {"kind": "bus", "event": {"type": "question.asked", "properties": {"questions": {"a": 1}}}},
    {"kind": "bus", "event": {"type": "question.asked", "properties": {"questions": [None, {"options": "x"}]}}},
    {"kind": "bus", "event": {"type": "permission.asked", "properties": {"patterns": [1, None]}}},
    {"kind": "tool.before", "input": [], "output": "x"},
    {"kind": "tool.after", "input": {"callID": 4}, "output": {"output": [1, 2], "title": 3}},
    {"kind": "permission.ask", "permission": "nope"},
    {"kind": "tool.execute.before", "input": {"tool": "bash"}, "output": {"args": None}},
]
NAMES = ["session.idle", "tool.execute.before", "tool.execute.after", "permission.ask", "todo.updated",
         "question.asked", "", "weird"]


def assert_valid(drafts: list[dict[str, Any]]) -> None:
    for d in drafts:
        assert TYPE_GRAMMAR.match(d["type"]), d["type"]
        assert isinstance(d["data"], dict)
        cap_draft(d, CapturePolicy())


@pytest.mark.parametrize("payload", ODD_PAYLOADS, ids=[f"odd{i}" for i in range(len(ODD_PAYLOADS))])
@pytest.mark.parametrize("mod", [opencode, kilocode], ids=["opencode", "kilocode"])
def test_odd_shapes_degrade(mod: Any, payload: Any) -> None:
    st_ = mod.new_state()
    for name in NAMES:
        assert_valid(mod.map_signal(received(mod.AGENT, name, copy.deepcopy(payload)), st_))
    out = pure(mod.AGENT, copy.deepcopy(payload))
    assert_valid([] if out is None else [out])


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["kind", "event", "type", "properties", "info", "input", "output", "permission", "id",
                         "sessionID", "role", "callID", "tool", "todos", "questions", "options", "status",
                         "error", "name", "title", "patterns", "tokens", "args", "output"]) | st.text(max_size=4),
        inner, max_size=5),
    max_leaves=20,
)
KINDS = st.sampled_from(["bus", "tool.before", "tool.after", "permission.ask", "other"])
TYPES = st.sampled_from(["session.created", "session.status", "session.error", "message.updated", "todo.updated",
                         "permission.asked", "permission.replied", "question.asked", "question.replied",
                         "command.executed", "file.edited", "x"]) | st.text(max_size=10)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(NAMES) | st.text(max_size=10), payload=JSON, kind=KINDS, bus_type=TYPES, props=JSON)
def test_arbitrary_payloads_never_crash(name: str, payload: Any, kind: str, bus_type: str, props: Any) -> None:
    for mod in (opencode, kilocode):
        st_ = mod.new_state()
        assert_valid(mod.map_signal(received(mod.AGENT, name, payload), st_))
        shaped = {"kind": kind, "event": {"type": bus_type, "properties": props}, "input": props,
                  "output": props, "permission": props}
        assert_valid(mod.map_signal(received(mod.AGENT, name, shaped), st_))


def test_runtime_tables_stay_bounded() -> None:
    st_ = opencode.new_state()
    kept = plugin_bus._KEPT
    for i in range(kept + 10):
        opencode.map_signal(tool("opencode", "tool.before", f"c{i}", i), st_)  # afters never come
        opencode.map_signal(user("opencode", "s1", f"m{i}"), st_)
    assert len(st_.pending_tools) == kept and "c0" not in st_.pending_tools and f"c{kept + 9}" in st_.pending_tools
    assert len(st_.sessions["s1"].users) == kept
