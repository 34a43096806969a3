"""cap_draft and CapturePolicy in isolation: build a draft, cap it, compare."""

from __future__ import annotations

import copy

import pytest
from aep_collector.processors.capture import CapturePolicy, Redactor, cap_draft
from aep_collector.processors.capture.redact import SECRET

RED = Redactor(home="/home/dev")
META = CapturePolicy()  # the default posture: metadata, attention.* redacted
REDACTED = CapturePolicy(ceiling="redacted")
FULL = CapturePolicy(ceiling="full", overrides={})

AWS = "AKIAIOSFODNN7EXAMPLE"

# One secret planted in each free-text field the contract names: (draft, path to the text).
PLANTED = {
    "run.started.prompt": (
        {"type": "run.started", "agent": "codex", "data": {"trigger": "user", "prompt": f"deploy with {AWS}"}},
        ("prompt",),
    ),
    "tool.requested.args": (
        {"type": "tool.requested", "agent": "codex", "subject": "Bash",
         "data": {"tool": {"name": "Bash"}, "args": {"command": f"aws s3 ls --key {AWS}"}, "args_digest": "d" * 32}},
        ("args", "command"),
    ),
    "error.raised error.message": (
        {"type": "error.raised", "agent": "codex", "data": {"error": {"type": "Auth", "message": f"bad key {AWS}"}}},
        ("error", "message"),
    ),
    "tool.failed error.message": (
        {"type": "tool.failed", "agent": "codex",
         "data": {"tool": {"name": "Bash"}, "error": {"type": "Exec", "message": f"bad key {AWS}"}}},
        ("error", "message"),
    ),
}


def dig(data: dict, path: tuple[str, ...]) -> object:
    for key in path:
        data = data[key]
    return data


def has(data: dict, path: tuple[str, ...]) -> bool:
    try:
        dig(data, path)
    except KeyError:
        return False
    return True


@pytest.mark.parametrize("name", PLANTED)
def test_planted_secret_is_absent_at_metadata(name: str) -> None:
    draft, path = PLANTED[name]
    out = cap_draft(draft, META, RED)
    assert AWS not in repr(out) and not has(out["data"], path) and out["capture"] == "metadata"


@pytest.mark.parametrize("name", PLANTED)
def test_planted_secret_is_redacted_at_redacted(name: str) -> None:
    draft, path = PLANTED[name]
    out = cap_draft(draft, REDACTED, RED)
    # tool.requested carries its args as the args_redacted twin at redacted, never as args.
    twin = (path[0] + "_redacted",) + path[1:] if path[0] == "args" else path
    assert AWS not in repr(out) and SECRET in dig(out["data"], twin) and out["capture"] == "redacted"


@pytest.mark.parametrize("name", PLANTED)
def test_planted_secret_is_verbatim_only_at_full(name: str) -> None:
    draft, path = PLANTED[name]
    out = cap_draft(draft, FULL, RED)
    assert dig(out["data"], path) == dig(draft["data"], path) and out["capture"] == "full"


def test_home_path_in_cwd_at_each_level() -> None:
    draft = {"type": "session.started", "agent": "codex",
             "data": {"cwd": "/home/dev/secret-project", "client": {"name": "cli"}}}
    assert cap_draft(draft, META, RED)["data"] == {"client": {"name": "cli"}}
    assert cap_draft(draft, REDACTED, RED)["data"] == {"cwd": "~/secret-project", "client": {"name": "cli"}}
    assert cap_draft(draft, FULL, RED)["data"]["cwd"] == "/home/dev/secret-project"


def test_twins_only_at_redacted_originals_only_at_full() -> None:
    draft = {"type": "tool.completed", "agent": "a",
             "data": {"tool": {"name": "Bash"}, "result": "token=abcd1234 ok", "result_digest": "r" * 32}}
    assert cap_draft(draft, META, RED)["data"] == {"tool": {"name": "Bash"}, "result_digest": "r" * 32}
    assert cap_draft(draft, REDACTED, RED)["data"] == {
        "tool": {"name": "Bash"}, "result_digest": "r" * 32, "result_redacted": f"token={SECRET} ok"}
    assert cap_draft(draft, FULL, RED)["data"] == draft["data"]


def test_document_and_citation_twins_inside_arrays() -> None:
    draft = {"type": "resource.retrieval.returned", "agent": "a",
             "data": {"documents": [{"id": "d1", "content": "mail ops@example.com"}], "count": 1}}
    out = cap_draft(draft, REDACTED, RED)
    assert out["data"] == {"documents": [{"id": "d1", "content_redacted": "mail [REDACTED:pii]"}], "count": 1}


def test_digests_survive_any_annotation_or_hint() -> None:
    draft = {"type": "x.acme.tool.ran", "agent": "a", "data": {"input_digest": "i" * 32}, "_capture": {"input_digest": "full"}}
    assert cap_draft(draft, META, RED)["data"] == {"input_digest": "i" * 32}


def test_full_ceiling_with_attention_override() -> None:
    policy = CapturePolicy(ceiling="full", overrides={"attention": "redacted"})
    request = {"type": "attention.requested", "agent": "codex", "subject": "Bash",
               "data": {"kind": "permission", "prompt": f"Permission requested: Bash — export {AWS}",
                        "context": {"raw": AWS}}}
    out = cap_draft(request, policy, RED)
    assert out["capture"] == "redacted" and out["data"] == {
        "kind": "permission", "prompt": f"Permission requested: Bash — export {SECRET}"}
    assert cap_draft(PLANTED["run.started.prompt"][0], policy, RED)["capture"] == "full"


def test_ceiling_none_drops_data_keeps_envelope() -> None:
    draft = {"type": "tool.requested", "agent": "a", "subject": "Bash", "run": "r1",
             "data": {"tool": {"name": "Bash"}}, "_capture": {}, "_hold": "h1"}
    out = cap_draft(draft, CapturePolicy(ceiling="none", overrides={}), RED)
    assert out == {"type": "tool.requested", "agent": "a", "subject": "Bash", "run": "r1", "_hold": "h1", "capture": "none"}


def test_vendor_type_with_capture_hint() -> None:
    draft = {"type": "x.cline.prompt.submitted", "agent": "cline",
             "data": {"title": f"use {AWS}", "chars": 12}, "_capture": {"title": "redacted"}}
    assert cap_draft(draft, META, RED) == {"type": "x.cline.prompt.submitted", "agent": "cline",
                                             "data": {"chars": 12}, "capture": "metadata"}
    assert cap_draft(draft, REDACTED, RED)["data"] == {"title": f"use {SECRET}", "chars": 12}


def test_vendor_fields_without_hint_count_as_metadata() -> None:
    draft = {"type": "x.acme.session.thing", "agent": "acme", "data": {"mode": "plan"}}
    assert cap_draft(draft, META, RED)["data"] == {"mode": "plan"}


def test_hint_inside_arrays() -> None:
    draft = {"type": "x.pi.message.end", "agent": "pi",
             "data": {"parts": [{"kind": "text", "text": "hello"}]}, "_capture": {"parts[].text": "redacted"}}
    assert cap_draft(draft, META, RED)["data"] == {"parts": [{"kind": "text"}]}


def test_hint_cannot_lower_a_schema_minimum() -> None:
    draft = {"type": "run.started", "agent": "a", "data": {"prompt": "hi"}, "_capture": {"prompt": "metadata"}}
    assert cap_draft(draft, META, RED)["data"] == {}


def test_unreadable_hint_level_fails_closed() -> None:
    draft = {"type": "x.acme.session.thing", "agent": "a", "data": {"note": "text"}, "_capture": {"note": "medium"}}
    assert cap_draft(draft, REDACTED, RED)["data"] == {}


def test_form_values_gated_through_fields_hint() -> None:
    fields = [{"id": "name", "type": "string", "label": "Name"},
              {"id": "n", "type": "number", "label": "N"},
              {"id": "db", "type": "select", "label": "DB", "choices": [{"id": "1", "label": "pg"}], "other": True}]
    draft = {"type": "attention.answered", "agent": "a", "subject": "R1", "_fields": fields,
             "data": {"answer": {"values": {"name": "ops@example.com", "n": 3, "db": "1", "x": 1}}}}
    out = cap_draft(draft, CapturePolicy(overrides={}), RED)
    assert out["data"] == {"answer": {"values": {"n": 3, "db": "1"}}} and "_fields" not in out
    assert cap_draft(draft, META, RED)["data"] == {"answer": {"values": {"name": "[REDACTED:pii]", "n": 3, "db": "1"}}}


def test_text_in_a_number_field_is_not_structural() -> None:
    fields = [{"id": "n", "type": "number", "label": "N"}, {"id": "ok", "type": "boolean", "label": "OK"}]
    draft = {"type": "attention.answered", "agent": "a", "_fields": fields,
             "data": {"answer": {"values": {"n": "my secret text", "ok": 1}}}}
    assert cap_draft(draft, CapturePolicy(overrides={}), RED)["data"] == {"answer": {"values": {}}}


def test_form_values_without_fields_keep_numbers_and_booleans_only() -> None:
    draft = {"type": "control.attention.respond", "agent": "mc",
             "data": {"answer": {"text": "go", "values": {"flag": True, "n": 0, "s": "x", "ids": ["1"], "obj": {}}}}}
    assert cap_draft(draft, CapturePolicy(overrides={}), RED)["data"] == {"answer": {"values": {"flag": True, "n": 0}}}


def test_answer_text_is_redacted_gated() -> None:
    draft = {"type": "attention.answered", "agent": "a", "data": {"answer": {"option": "deny", "text": f"no, {AWS}"}}}
    assert cap_draft(draft, CapturePolicy(overrides={}), RED)["data"] == {"answer": {"option": "deny"}}
    assert cap_draft(draft, META, RED)["data"] == {"answer": {"option": "deny", "text": f"no, {SECRET}"}}


def test_control_rejected_detail_is_redacted_gated() -> None:
    draft = {"type": "control.rejected", "agent": "a", "data": {"reason": "invalid", "detail": "missing /home/dev/x"}}
    assert cap_draft(draft, META, RED)["data"] == {"reason": "invalid"}
    assert cap_draft(draft, REDACTED, RED)["data"] == {"reason": "invalid", "detail": "missing ~/x"}


PERMISSION = {"type": "attention.requested", "agent": "qwen-code", "subject": "Bash",
              "data": {"kind": "permission", "prompt": "Permission requested: Bash — rm -rf /home/dev/build",
                       "options": [{"id": "allow", "label": "Allow"}, {"id": "deny", "label": "Deny"}],
                       "respond_via": ["control"]}}


def test_attention_below_redacted_synthesizes_prompt_and_labels() -> None:
    out = cap_draft(PERMISSION, CapturePolicy(overrides={}), RED)
    assert out["capture"] == "metadata" and out["data"] == {
        "kind": "permission", "prompt": "qwen-code requests permission: Bash",
        "options": [{"id": "allow", "label": "allow"}, {"id": "deny", "label": "deny"}], "respond_via": ["control"]}


def test_attention_at_redacted_redacts_prompt() -> None:
    assert cap_draft(PERMISSION, META, RED)["data"]["prompt"] == "Permission requested: Bash — rm -rf ~/build"


def test_synthesized_prompt_without_subject() -> None:
    draft = {"type": "attention.requested", "agent": "gemini-cli", "data": {"kind": "input", "prompt": "Tell me"}}
    assert cap_draft(draft, CapturePolicy(overrides={}), RED)["data"]["prompt"] == "gemini-cli requests input"


def test_structural_prompt_and_form_labels_below_redacted() -> None:
    draft = {"type": "attention.requested", "agent": "claude-code", "subject": "Elicitation",
             "_structural": {"prompt": "claude-code requests input (1 fields)"},
             "data": {"kind": "form", "prompt": "Configure the target",
                      "fields": [{"id": "env", "type": "select", "label": "Environment",
                                  "choices": [{"id": "staging", "label": "Staging"}]}]}}
    assert cap_draft(draft, CapturePolicy(overrides={}), RED)["data"] == {
        "kind": "form", "prompt": "claude-code requests input (1 fields)",
        "fields": [{"id": "env", "type": "select", "label": "env", "choices": [{"id": "staging", "label": "staging"}]}]}
    assert cap_draft(draft, META, RED)["data"] == draft["data"]  # at redacted the real text stays


def test_structural_value_restores_a_gated_token_below_redacted() -> None:
    # A machine token in a redacted-gated field (OpenHands run.cancelled reason "deleting").
    draft = {"type": "run.cancelled", "agent": "a", "data": {"reason": "deleting"}, "_structural": {"reason": "deleting"}}
    assert cap_draft(draft, META, RED)["data"] == {"reason": "deleting"}


def test_credential_named_key_never_carries_a_value_below_full() -> None:
    draft = {"type": "x.acme.session.login", "agent": "a", "data": {"user_id": "u1", "auth": {"token": "plain0"}}}
    assert cap_draft(draft, META, RED)["data"] == {"user_id": "u1", "auth": {"token": SECRET}}
    assert cap_draft(draft, FULL, RED)["data"] == draft["data"]


def test_capture_is_set_hints_removed_other_underscore_keys_kept() -> None:
    draft = {"type": "run.finished", "agent": "a", "data": {"duration_ms": 5},
             "_capture": {}, "_structural": {}, "_fields": [], "_hold": "h", "_runs": "close"}
    assert cap_draft(draft, META, RED) == {"type": "run.finished", "agent": "a", "data": {"duration_ms": 5},
                                             "_hold": "h", "_runs": "close", "capture": "metadata"}


def test_a_lower_declared_capture_is_never_raised() -> None:
    draft = {"type": "run.started", "agent": "a", "capture": "metadata", "data": {"prompt": "hi"}}
    assert cap_draft(draft, FULL, RED) == {"type": "run.started", "agent": "a", "capture": "metadata", "data": {}}


def test_cap_draft_never_mutates_its_input() -> None:
    for draft in [PERMISSION, *(d for d, _ in PLANTED.values())]:
        before = copy.deepcopy(draft)
        for policy in (META, REDACTED, FULL, CapturePolicy(overrides={})):
            cap_draft(draft, policy, RED)
        assert draft == before


def test_default_redactor_is_used_when_none_is_given() -> None:
    out = cap_draft(PLANTED["run.started.prompt"][0], REDACTED)
    assert out["data"]["prompt"] == f"deploy with {SECRET}"


# --- CapturePolicy ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "event_type", "level"),
    [
        ({"attention": "redacted"}, "attention.requested", "redacted"),
        ({"attention": "redacted"}, "attention", "redacted"),
        ({"attention": "redacted"}, "tool.requested", "metadata"),
        ({"attention": "redacted"}, "x.claude-code.attention.notice", "redacted"),
        ({"attention": "redacted"}, "x.attention.session.thing", "metadata"),
        ({"attention.*": "redacted"}, "attention.answered", "redacted"),
        ({"attention.*": "redacted"}, "x.acme.attention.asked", "redacted"),
        ({"attention": "redacted", "attention.answered": "none"}, "attention.answered", "none"),
        ({"attention": "full", "attention.*": "redacted"}, "attention.timeout", "redacted"),
        ({"run.step.*": "full", "run.*": "redacted"}, "run.step.started", "full"),
        ({"run.step.*": "full", "run.*": "redacted"}, "run.started", "redacted"),
        ({"x.acme.*": "none"}, "x.acme.session.blob", "none"),
        ({"x.acme.*": "none"}, "x.other.session.blob", "metadata"),
        ({}, "attention.requested", "metadata"),
    ],
)
def test_level_for(overrides: dict, event_type: str, level: str) -> None:
    assert CapturePolicy(ceiling="metadata", overrides=overrides).level_for(event_type) == level


def test_policy_defaults() -> None:
    assert CapturePolicy() == CapturePolicy(ceiling="metadata", overrides={"attention": "redacted"})
    assert CapturePolicy().overrides is not CapturePolicy().overrides


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ceiling": "secret"}, "unknown capture level 'secret'"),
        ({"overrides": {"attention": "verbose"}}, "capture override 'attention'"),
        ({"overrides": {"*": "full"}}, "capture override '\\*'"),
        ({"overrides": {"Attention": "full"}}, "capture override 'Attention'"),
    ],
)
def test_policy_rejects_bad_levels_and_keys(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CapturePolicy(**kwargs)


def test_reserved_message_types_are_content_without_a_schema() -> None:
    draft = {"type": "message.user.submitted", "agent": "a", "data": {"text": f"hi {AWS}", "chars": 5}}
    assert cap_draft(draft, META, RED)["data"] == {}
    assert cap_draft(draft, REDACTED, RED)["data"] == {"text": f"hi {SECRET}", "chars": 5}
