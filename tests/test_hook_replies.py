"""What the hook-family vendors get back, built by their receivers (the reply side lives there,
issue #14): neutral replies, PermissionRequest decisions, Claude Code's form answers.

Bodies are pinned against each vendor's hooks reference; the control tests drive the same builders
through a held hook end to end.
"""

from __future__ import annotations

import copy
import json
from types import ModuleType

import pytest
from aep_collector.receivers import claude_code as cc
from aep_collector.receivers.hook_vendors import antigravity, codex, gemini_cli, kimi_code, qwen_code, vscode

from tests.conftest import corpus

FIXTURE = corpus("mappings/claude-code.json")


# --- Claude Code ---------------------------------------------------------------------------


def test_neutral_reply_is_an_empty_object() -> None:
    assert cc.NEUTRAL_REPLY == {}
    assert cc.DECLARATION.neutral_reply == {}


def test_claude_code_permission_reply_shapes() -> None:
    assert cc.permission_reply("allow", None) == {
        "hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}}
    assert cc.permission_reply("deny", "Denied via AEP attention loop") == {
        "hookSpecificOutput": {"hookEventName": "PermissionRequest",
                               "decision": {"behavior": "deny", "message": "Denied via AEP attention loop"}}}
    assert cc.permission_reply("allow", "ignored")["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
    with pytest.raises(ValueError):
        cc.permission_reply("ask", None)


def test_ask_user_question_reply_maps_ids_back_to_labels() -> None:
    tool_input = copy.deepcopy(FIXTURE["ask_user_question"]["input"])
    reply = cc.ask_user_question_reply(tool_input, {"1": "2", "2": ["1", "2"]})
    decision = reply["hookSpecificOutput"]["decision"]
    assert reply["hookSpecificOutput"]["hookEventName"] == "PermissionRequest"
    assert decision["behavior"] == "allow"
    assert decision["updatedInput"]["questions"] == FIXTURE["ask_user_question"]["input"]["questions"]
    assert decision["updatedInput"]["answers"] == {
        "Which database should the new service use?": "SQLite",
        "Which regions should we roll out to?": "us-east, eu-west",
    }
    other = cc.ask_user_question_reply(tool_input, {"1": "MariaDB"})["hookSpecificOutput"]["decision"]
    assert other["updatedInput"]["answers"] == {"Which database should the new service use?": "MariaDB"}
    assert tool_input == FIXTURE["ask_user_question"]["input"]  # the caller's input is not mutated


def test_elicitation_reply_accepts_with_the_values_verbatim() -> None:
    values = {"environment": "production", "replicas": 3, "confirm": True}
    assert cc.elicitation_reply(values) == {
        "hookSpecificOutput": {"hookEventName": "Elicitation", "action": "accept", "content": values}}


def test_cancel_reply_denies_and_interrupts() -> None:
    assert cc.cancel_reply() == {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {
        "behavior": "deny", "message": cc.CANCEL_MESSAGE, "interrupt": True}}}


# --- Codex, Qwen Code: the same PermissionRequest decision ----------------------------------


@pytest.mark.parametrize("mod", [codex, qwen_code], ids=["codex", "qwen-code"])
def test_codex_qwen_permission_reply_shapes(mod: ModuleType) -> None:
    reply = mod.HANDLING.permission_reply
    assert reply is not None
    assert reply("allow", None) == {
        "hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}}
    assert reply("deny", "use a dry run") == {
        "hookSpecificOutput": {"hookEventName": "PermissionRequest",
                               "decision": {"behavior": "deny", "message": "use a dry run"}}}
    with pytest.raises(ValueError):
        reply("maybe", None)


@pytest.mark.parametrize("mod", [codex, gemini_cli, qwen_code, vscode, kimi_code, antigravity],
                         ids=lambda m: m.VENDOR)
def test_neutral_replies(mod: ModuleType) -> None:
    assert mod.DECLARATION.neutral_reply == {}


def test_gemini_is_observe_only() -> None:
    assert gemini_cli.HANDLING.permission_reply is None and gemini_cli.HANDLING.gate is None
    assert antigravity.HANDLING.permission_reply is None and antigravity.HANDLING.gate is None


# --- VS Code: the three-way PreToolUse gate -------------------------------------------------


@pytest.mark.parametrize("decision", ["allow", "deny", "ask"])
def test_vscode_pretool_reply(decision: str) -> None:
    assert vscode.pretool_reply(decision, "policy says so") == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": decision, "permissionDecisionReason": "policy says so"}}
    assert vscode.pretool_reply(decision, None) == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": decision}}


def test_vscode_pretool_reply_refuses_unknown_decisions() -> None:
    with pytest.raises(ValueError):
        vscode.pretool_reply("defer", None)


# --- Kimi Code: four options onto a binary reply, a silent UserPromptSubmit -----------------


def test_kimi_gate_maps_four_options_onto_the_binary_reply() -> None:
    assert [o["id"] for o in kimi_code.GATE_OPTIONS] == ["allow", "allow_session", "deny", "cancel"]
    assert [kimi_code.gate_decision(o) for o in ("allow", "allow_session", "deny", "cancel", "maybe")] == [
        "allow", "allow", "deny", "deny", "deny"]  # never grant on the unknown (AEP-0008)
    assert kimi_code.pretool_reply("allow") == {}
    assert kimi_code.pretool_reply("deny", "not here") == {"hookSpecificOutput": {
        "permissionDecision": "deny", "permissionDecisionReason": "not here"}}
    assert kimi_code.pretool_reply("deny")["hookSpecificOutput"]["permissionDecisionReason"] == "Denied by operator"
    with pytest.raises(ValueError):
        kimi_code.pretool_reply("ask")


def test_kimi_user_prompt_submit_is_answered_with_nothing() -> None:
    assert kimi_code.neutral_reply("UserPromptSubmit") is None
    assert kimi_code.neutral_reply("PreToolUse") == {}
    assert kimi_code.DECLARATION.neutral_bytes("UserPromptSubmit") == b""


# --- Antigravity: byte-pinned neutral replies ------------------------------------------------


def test_antigravity_neutral_replies_byte_exact() -> None:
    assert antigravity.NEUTRAL_REPLIES == {"PreToolUse": {"decision": ""}, "Stop": {"decision": ""}}
    for hook in ("PreToolUse", "Stop", "pretooluse"):
        assert json.dumps(antigravity.neutral_reply(hook)) == '{"decision": ""}'
    for hook in ("PostToolUse", "PreInvocation", "PostInvocation", "SomeFutureHook", ""):
        assert json.dumps(antigravity.neutral_reply(hook)) == "{}"
    antigravity.neutral_reply("Stop")["decision"] = "continue"  # a copy: the constant stays neutral
    assert antigravity.NEUTRAL_REPLIES["Stop"] == {"decision": ""}


def test_antigravity_names_hooks_as_its_mapping_does() -> None:
    assert antigravity.canonical("pretooluse") == "PreToolUse" and antigravity.canonical("Odd") == "Odd"
