"""Structure vs content below ``full`` (issue #12): token-classed fields, x.* families, the envelope.

Each case runs a real vendor payload through its mapping and the capture processor, and checks the
three levels: an enumerated / id-like value stays at ``metadata``; free text in the same field is
replaced by its opaque digest at ``metadata``, redacted at ``redacted``, verbatim only at ``full``.
"""

from __future__ import annotations

from typing import Any

import pytest
from aep_collector.pipeline.canonical import digest
from aep_collector.pipeline.model import Signal
from aep_collector.processors.capture import CapturePolicy, cap_draft
from aep_collector.processors.capture.structure import OPAQUE_PREFIX, is_token, opaque
from aep_collector.processors.mapping import MappingProcessor, codex_otel, hermes, vscode_otel

from tests.helpers import base_config, collector, read_jsonl
from tests.received import received


def gated(drafts: list[dict[str, Any]], ceiling: str) -> list[dict[str, Any]]:
    return [cap_draft(d, CapturePolicy(ceiling=ceiling, overrides={})) for d in drafts]


def claude(name: str, **fields: Any) -> list[dict[str, Any]]:
    payload = {"session_id": "s1", "hook_event_name": name, **fields}
    return MappingProcessor()([received("claude-code", name, payload)])


FREE_TEXT = "API Error: overloaded, ask ops@example.com or see /home/alice/notes.txt"


@pytest.mark.parametrize(("hook", "fields", "type_", "path", "structural"), [
    ("StopFailure", {"error": "{}"}, "run.failed", ("reason",), "rate_limit"),
    ("PermissionDenied", {"tool_name": "Bash", "rule": "{}"}, "tool.denied", ("rule",), "Bash(rm:*)"),
    ("SubagentStart", {"agent_id": "a1", "agent_type": "{}"}, "delegation.subagent.started", ("agent_type",),
     "general-purpose"),
    ("SubagentStop", {"agent_id": "a1", "agent_type": "{}"}, "delegation.subagent.stopped", ("agent_type",), "Explore"),
])
def test_free_text_in_a_metadata_field_is_content(hook, fields, type_, path, structural) -> None:
    def event(value: str, ceiling: str) -> Any:
        drafts = claude(hook, **{k: (value if v == "{}" else v) for k, v in fields.items()})
        (d,) = [d for d in gated(drafts, ceiling) if d["type"] == type_]
        return d["data"][path[0]]

    # An enumerated or id-like value is structure: it stays at metadata (the pins rely on it).
    assert event(structural, "metadata") == structural
    # Free text in the same field is content.
    assert event(FREE_TEXT, "metadata") == opaque(FREE_TEXT)
    assert event(FREE_TEXT, "redacted") == "API Error: overloaded, ask [REDACTED:pii] or see ~/notes.txt"
    assert event(FREE_TEXT, "full") == FREE_TEXT
    # A value shaped like an id but holding a secret is content too.
    assert event("AKIAIOSFODNN7EXAMPLE", "metadata") == opaque("AKIAIOSFODNN7EXAMPLE")
    assert event("AKIAIOSFODNN7EXAMPLE", "redacted") == "[REDACTED:secret]"


def test_the_subject_is_a_token_and_the_synthesized_prompt_uses_the_gated_one() -> None:
    secret_tool = "deploy sk-proj-AbCdEf123456GhIjKl789012MnOp"
    drafts = claude("PermissionRequest", tool_name=secret_tool, tool_input={"command": "ls"})
    (meta,) = gated(drafts, "metadata")
    assert meta["subject"] == opaque(secret_tool)
    assert meta["data"]["prompt"] == f"claude-code requests permission: {opaque(secret_tool)}"
    (red,) = gated(drafts, "redacted")
    assert red["subject"] == "deploy [REDACTED:secret]"
    assert "sk-proj" not in str(red)
    (plain,) = gated(claude("PermissionRequest", tool_name="Bash", tool_input={"command": "ls"}), "metadata")
    assert plain["subject"] == "Bash"


@pytest.mark.parametrize("ceiling", ["none", "metadata", "redacted"])
def test_an_envelope_id_holding_a_secret_is_replaced_consistently(ceiling: str) -> None:
    session = "jane@example.com"
    drafts = MappingProcessor()([Signal("claude-code", "Stop", {"session_id": session, "hook_event_name": "Stop"})])
    (d,) = gated(drafts, ceiling)
    assert d["session"] == opaque(session) and d["session"].startswith(OPAQUE_PREFIX)
    (full,) = gated(drafts, "full")
    assert full["session"] == session


def test_an_x_fallback_keeps_tokens_and_gates_text() -> None:
    def api_error(reason: str, ceiling: str) -> dict[str, Any]:
        payload = {"hook_event_name": "api_request_error", "session_id": "s",
                   "extra": {"status_code": 429, "retry_count": 3, "reason": reason}}
        (d,) = gated(hermes.map_hook(payload), ceiling)
        assert d["type"] == "x.hermes.api.error"
        return d["data"]

    assert api_error("rate_limited", "metadata") == {"status_code": 429, "retry_count": 3, "reason": "rate_limited"}
    text = "quota exceeded for key sk-proj-AbCdEf123456GhIjKl789012MnOp"
    assert api_error(text, "metadata")["reason"] == opaque(text)
    assert api_error(text, "redacted")["reason"] == "quota exceeded for key [REDACTED:secret]"


def test_a_hint_cannot_declare_an_extension_field_below_token_or_a_schema_field_below_its_minimum() -> None:
    text = "please refactor the billing module"
    x = {"type": "x.acme.thing.seen", "data": {"note": text}, "_capture": {"note": "metadata"}}
    assert cap_draft(x, CapturePolicy())["data"]["note"] == opaque(text)
    core = {"type": "run.started", "data": {"prompt": text}, "_capture": {"prompt": "metadata"}}
    assert "prompt" not in cap_draft(core, CapturePolicy())["data"]


# --- the OTel channels: undeclared attributes are content ----------------------------------------

LEAKS = {"prompt": "please fix the login bug in auth.py", "user.email": "dev@example.com",
         "error.message": "ENOENT: no such file", "file.path": "src/secret/plan.ts"}


@pytest.mark.parametrize("mode", ["companion", "primary"])
def test_vscode_undeclared_attributes_never_leave_at_metadata(mode: str) -> None:
    records = [{"event.name": "copilot_chat.agent.turn", "turn.index": 2, **LEAKS},
               {"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "readFile", "success": False,
                "error.type": "ToolCallError", **LEAKS}]
    for attrs in records:
        flat = {"resource": {"session.id": "s"}, "attributes": attrs}
        for d in gated(vscode_otel.map_record(flat, mode), "metadata"):
            assert not set(LEAKS) & set(d["data"]), d
            assert not any(v in str(d) for v in LEAKS.values())
        (red,) = gated(vscode_otel.map_record(flat, "companion"), "redacted")
        assert red["data"]["user.email"] == "[REDACTED:pii]" and red["data"]["prompt"] == LEAKS["prompt"]
    (turn,) = gated(vscode_otel.map_record({"resource": {"session.id": "s"}, "attributes": records[0]}), "metadata")
    assert turn["data"] == {"turn.index": 2}


def test_codex_undeclared_attributes_never_leave_at_metadata() -> None:
    attrs = {"event.name": "codex.tool_result", "conversation.id": "c", "tool_name": "shell", "success": "true",
             "duration_ms": "12", "cwd": "/srv/app", "arguments": "rm -rf /", **LEAKS}
    (d,) = gated(codex_otel.map_record({"resource": {}, "attributes": attrs}), "metadata")
    assert d["data"] == {"tool_name": "shell", "success": "true", "duration_ms": "12"}
    (red,) = gated(codex_otel.map_record({"resource": {}, "attributes": attrs}), "redacted")
    assert "arguments" not in red["data"] and "user.email" not in red["data"]  # full-only content
    assert red["data"]["cwd"] == "/srv/app"


def test_the_issue_case_through_the_real_otlp_receiver_and_the_default_config(tmp_path) -> None:
    """The reported leak, end to end: OTel SDK exporter -> OTLP/HTTP -> default config -> JSONL bytes."""
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    from tests.test_e2e_otlp import emit

    receivers = {"otlp/vscode": {"profile": "vscode", "http": {"endpoint": "127.0.0.1:0"}}}
    cfg = base_config(tmp_path, receivers=receivers)
    cfg["processors"]["capture"] = None  # the shipped defaults: metadata, attention redacted
    records = [{"event.name": "copilot_chat.agent.turn", "turn.index": 1, "prompt": LEAKS["prompt"]},
               {"event.name": "copilot_chat.tool.call", "gen_ai.tool.name": "readFile", "success": False,
                "user.email": LEAKS["user.email"], "error.message": LEAKS["error.message"],
                "file.path": LEAKS["file.path"]}]
    with collector(cfg, tmp_path) as c:
        port = c.ports["receiver/otlp/vscode:http"]
        emit(OTLPLogExporter(endpoint=f"http://127.0.0.1:{port}/v1/logs"), "vs-leak", records)
        assert c.stop() == 0
    path = tmp_path / "logs" / "vscode" / "vs-leak.jsonl"
    raw = path.read_text(encoding="utf-8")
    assert [e["type"] for e in read_jsonl(path)] == ["x.vscode.otel.agent.turn", "x.vscode.otel.tool.call"]
    assert all(e["capture"] == "metadata" for e in read_jsonl(path))
    for value in LEAKS.values():
        assert value not in raw
    assert '"gen_ai.tool.name":"readFile"' in raw


def test_token_shape() -> None:
    for ok in ("rate_limit", "Bash(rm:*)", "gpt-5.2-codex", "2026-07-12T10:15:00.123456", "req_fix_1", "200"):
        assert is_token(ok), ok
    for bad in ("", "two words", "line\nbreak", "-leading", "x" * 129, '{"a":1}'):
        assert not is_token(bad), bad
    assert opaque("x") == OPAQUE_PREFIX + digest("x")
