"""The ``claude_code`` receiver: Claude Code's native ``http`` hooks.

Claude Code POSTs each hook's JSON input to ``POST /hook``; the hook's ``hook_event_name`` names
the moment. The reply is Claude Code's hook output JSON; ``{}`` is the neutral reply (no
decision, Claude Code carries on). What Claude Code gets back is built here (reply bodies follow
the Claude Code hooks reference, code.claude.com/docs/en/hooks). A hook that asks a question
(AskUserQuestion, Elicitation) is decoded once into its form (``forms.py``, fixture-pinned), carried
on ``Signal.form``: the mapping draws the card from it, an answer is checked against its fields.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from aep_collector.pipeline.control import CANCEL, RESPOND, Hold, card_key, elicitation_key, permission_key
from aep_collector.pipeline.host import Host
from aep_collector.pipeline.model import Form, Signal
from aep_collector.pipeline.payload import get_str
from aep_collector.pipeline.vendor import VendorDeclaration
from aep_collector.receivers.forms import form_validator, form_values
from aep_collector.receivers.held import AttentionHolder, Validator
from aep_collector.receivers.hook_http import FailOpenDelivery, HookReceiverConfig, HookServer, hook_signal
from aep_collector.receivers.hook_replies import permission_reply
from aep_collector.receivers.registration import hook_url, mapped_hooks, shim_command
from aep_collector.receivers.wiring import Wiring, json_target
from aiohttp import web

from .forms import ASK_USER_QUESTION, form_of, schema_problem, schema_properties

AGENT = "claude-code"
MAPPING = "aep_collector.processors.mapping.claude_code"
# Hooks reference, "HTTP response handling": a 2xx with an empty body (or `{}`) is "no decision".
NEUTRAL_REPLY: dict[str, Any] = {}
DENY_MESSAGE = "Denied via AEP attention loop"
CANCEL_MESSAGE = "Run cancelled via AEP control"
# Claude Code's common hook output: stop the agent loop (control.cancel, AEP-0004 §5).
STOP_REPLY: dict[str, Any] = {"continue": False, "stopReason": CANCEL_MESSAGE}

TOOL_HOOKS = frozenset({"PreToolUse", "PostToolUse", "PostToolUseFailure", "PermissionRequest",
                        "PermissionDenied"})
HELD_HOOKS = frozenset({"PermissionRequest", "Elicitation"})
# Claude Code 2.1.328 skips `http` hooks for SessionStart and Setup ("HTTP hooks are not supported
# for SessionStart", in its debug log; checked live): SessionStart is registered as the command shim,
# which POSTs the same payload to the same receiver. Setup is not a mapped hook.
COMMAND_HOOKS = frozenset({"SessionStart"})


@dataclass
class ClaudeCodeConfig(HookReceiverConfig):
    """Config of the ``claude_code`` receiver."""

    endpoint: str = field(default_factory=lambda: DECLARATION.endpoint)
    attention_timeout: float = 55.0
    """Seconds a held PermissionRequest/Elicitation waits for an operator before ``{}``."""

    def validate(self) -> None:
        super().validate()
        if self.attention_timeout <= 0:
            raise ValueError("attention_timeout must be positive")


class ClaudeCodeSurface:
    """Claude Code's side of the shared hook server, with its three held loops.

    PermissionRequest (a permission card, or AskUserQuestion as one form per call) and
    Elicitation are held open while a control route is live; an operator's
    ``control.attention.respond`` decides them. Without a route nothing is held: the hook gets
    ``{}`` at once and the request says ``respond_via: ["oob"]``.
    """

    agent = AGENT

    def __init__(self, config: ClaudeCodeConfig, component: str = "receiver/claude_code") -> None:
        self.config = config
        self.loop = AttentionHolder(AGENT, component, config.attention_timeout)
        self.calls: dict[tuple[str, str], Hold] = {}

    async def on_start(self, host: Host, server: HookServer) -> None:
        assert server.deliver is not None
        self.loop.bind(host, server.deliver, [RESPOND, CANCEL], server.consumer)

    def signal(self, payload: dict[str, Any], request: web.Request) -> Signal:
        return decode(hook_signal(AGENT, payload, "hook_event_name"))

    def neutral(self, signal: Signal | None) -> Any:
        return NEUTRAL_REPLY

    async def handle(self, signal: Signal, deliver: FailOpenDelivery) -> Any:
        p, name = signal.payload, signal.name
        session = _session(p)
        if name == "PermissionRequest":
            if signal.form is not None:  # AskUserQuestion: one form for the whole batch
                return await self._ask_user_question(signal, signal.form)
            return await self._permission(signal)
        if name == "Elicitation" and signal.form is not None:
            return await self._elicitation(signal, signal.form, deliver)
        if name in ("PostToolUse", "PostToolUseFailure", "PermissionDenied"):
            # The tool ran (or was refused) in Claude Code itself: the held card is moot. Claude Code's
            # PermissionRequest names no tool_use_id, so its card is found by the tool and its input.
            hold = self.calls.pop((session, _call_key(p)), None) or self.calls.pop((session, _about(p)), None)
            if hold is not None:
                await self.loop.dismiss(hold)
        elif name == "SessionEnd":
            await self.loop.sweep(session)  # AEP-0002 §7.1: nothing left open at session.ended
        stop = name not in ("SessionStart", "SessionEnd") and self.loop.cancelled(session)
        await deliver([signal])
        if name == "ElicitationResult":
            key = _elicitation_key(p)
            for hold in self.loop.pending(session):
                if hold.key == key:
                    self.loop.settle_oob(hold)  # answered in Claude Code's own dialog
        if stop and name != "UserPromptSubmit":  # a new prompt starts a new run: nothing to stop
            return STOP_REPLY
        return NEUTRAL_REPLY

    def _call(self, signal: Signal) -> tuple[str, str]:
        """Pairs a held request with the PostToolUse of the same call (which dismisses it)."""
        return _session(signal.payload), _call_key(signal.payload)

    async def _permission(self, signal: Signal) -> Any:
        # The mapping keys the card with the same key: the hold's legs close the book's entry.
        end = await self.loop.hold_permission(signal, _card_key(signal), calls=self.calls, call=self._call(signal))
        if end.how == "cancelled" and end.hold is not None:
            self.loop.cancelled(end.hold.session)  # this reply is the stop: the next hook runs normally
            return cancel_reply()
        if end.applied is None:
            return NEUTRAL_REPLY  # no route, timeout, dismissal: no decision, Claude Code asks the user itself
        if end.applied.option == "allow":
            return permission_reply("allow")
        return permission_reply("deny", end.applied.text or DENY_MESSAGE)

    async def _ask_user_question(self, signal: Signal, form: Form) -> Any:
        tool_input = signal.payload.get("tool_input")
        fields = form.fields  # full labels: a text answer may name one
        held = await self.loop.held(signal, form_validator(fields, legacy=len(fields) == 1), _card_key(signal),
                                    self.calls, self._call(signal))
        if held is None:
            return NEUTRAL_REPLY
        hold, outcome = held
        if outcome.how == "cancelled":  # a question is a PermissionRequest too: denied with interrupt
            self.loop.cancelled(hold.session)
            return cancel_reply()
        if outcome.how != "answered" or outcome.answer is None:
            return NEUTRAL_REPLY  # the whole form times out together: Claude Code re-asks
        values = form_values(outcome.answer, fields)
        await self.loop.answered(hold, outcome, {"values": values}, fields)
        return ask_user_question_reply(tool_input, values)

    async def _elicitation(self, signal: Signal, form: Form, deliver: FailOpenDelivery) -> Any:
        if signal.payload.get("mode") == "url":
            # A URL the user must open (a sign-in): Claude Code hands a hook's accept straight to the
            # MCP server and never shows the URL, so only its own prompt can answer. Not held.
            signal.respond_via = ["oob"]
            await deliver([signal])
            return NEUTRAL_REPLY
        fields = form.fields
        key = _elicitation_key(signal.payload)
        validate = mcp_checked(form_validator(fields, legacy=len(fields) == 1), fields,
                               schema_properties(signal.payload))
        hold = await self.loop.request(signal, validate, key)
        if hold is None:
            return NEUTRAL_REPLY
        outcome = await self.loop.wait(hold)
        if outcome.how == "cancelled":  # not handed to Claude Code's dialog: nobody may be there
            self.loop.cancelled(hold.session)
            return elicitation_cancel_reply()
        if outcome.how != "answered" or outcome.answer is None:
            return NEUTRAL_REPLY  # Claude Code's own dialog takes over
        values = form_values(outcome.answer, fields)
        await self.loop.answered(hold, outcome, {"values": values}, fields)
        return elicitation_reply(_content(values, fields))


def decode(signal: Signal) -> Signal:
    """A hook call as the mapping reads it: a question (AskUserQuestion, Elicitation) decoded into its form."""
    signal.form = form_of(signal.name, signal.payload)
    return signal


def mcp_checked(validate: Validator, fields: list[dict[str, Any]], props: dict[str, dict[str, Any]]) -> Validator:
    """``validate``, then what the MCP server checks the content against and the form's fields cannot
    carry (``forms.schema_problem``): it would refuse such an answer after the operator was told it
    went through, so it is refused here and the request stays pending (AEP-0006)."""
    if not props:
        return validate

    def check(answer: dict[str, Any]) -> str | None:
        problem = validate(answer)
        if problem is not None:
            return problem
        for fid, value in form_values(answer, fields).items():
            prop = props.get(fid)
            if prop is not None and value is not None and value != "" and value != []:
                problem = schema_problem(fid, prop, value)
                if problem is not None:
                    return problem
        return None

    return check


def cancel_reply() -> dict[str, Any]:
    """A held PermissionRequest whose run was cancelled: deny the call and interrupt Claude Code."""
    reply = permission_reply("deny", CANCEL_MESSAGE)
    reply["hookSpecificOutput"]["decision"]["interrupt"] = True
    return reply


def elicitation_cancel_reply() -> dict[str, Any]:
    """A held Elicitation whose run was cancelled: cancel the elicitation and stop Claude Code."""
    return {**STOP_REPLY, "hookSpecificOutput": {"hookEventName": "Elicitation", "action": "cancel"}}


def ask_user_question_reply(tool_input: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Allow the AskUserQuestion call with ``updatedInput`` = the input plus ``answers``.

    Hooks reference (AskUserQuestion input): ``answers`` maps each question's text to the chosen
    option label; multi-select answers join labels with ", "; an "Other" answer is its free text.
    ``updatedInput`` replaces the whole input, so every original key is echoed back.
    """
    source = tool_input if isinstance(tool_input, dict) else {}
    questions = source.get("questions") if isinstance(source.get("questions"), list) else []
    answers: dict[str, str] = {}
    for i, q in enumerate(questions, start=1):
        if not isinstance(q, dict) or str(i) not in values:
            continue
        options = q.get("options") if isinstance(q.get("options"), list) else []
        labels = {str(j): (get_str(o, "label") if isinstance(o, dict) else o)
                  for j, o in enumerate(options, start=1)}
        picked = values[str(i)]
        parts = picked if isinstance(picked, list) else [picked]
        text = ", ".join(str(labels.get(str(p)) or p) for p in parts if p is not None and p != "")
        answers[get_str(q, "question") or str(i)] = text
    updated = {**copy.deepcopy(source), "answers": answers}
    return {"hookSpecificOutput": {"hookEventName": "PermissionRequest",
                                   "decision": {"behavior": "allow", "updatedInput": updated}}}


def elicitation_reply(values: dict[str, Any]) -> dict[str, Any]:
    """Accept the elicitation: hooks reference "Elicitation output" ``{action: accept, content}``."""
    return {"hookSpecificOutput": {"hookEventName": "Elicitation", "action": "accept",
                                   "content": copy.deepcopy(values)}}


def _content(values: dict[str, Any], fields: list[dict[str, Any]]) -> dict[str, Any]:
    """The elicitation content the MCP server checks against its schema: a field left blank (null,
    "" or [], which the form takes as no answer) is left out, and a multi-select's lone choice is a
    one-item array (the property is an ``array``; AEP-0006 lets one choice come bare)."""
    multi = {f.get("id") for f in fields if f.get("multi")}
    return {k: [v] if k in multi and isinstance(v, str) else v for k, v in values.items()
            if v is not None and v != "" and v != []}


def _card_key(signal: Signal) -> str:
    """The key the mapping tags a PermissionRequest's card with (``pipeline.control.card_key``)."""
    p = signal.payload
    return card_key(get_str(p, "tool_name"), p.get("tool_input"), signal.received_ns)


def _elicitation_key(payload: dict[str, Any]) -> str:
    """Pairs an Elicitation with its ElicitationResult, as the mapping does."""
    return elicitation_key(get_str(payload, "elicitation_id"), get_str(payload, "mcp_server_name"))


def _session(payload: dict[str, Any]) -> str:
    value = payload.get("session_id")
    return value if isinstance(value, str) and value else "unknown"


def _call_key(payload: dict[str, Any]) -> str:
    """Pairs a held PermissionRequest with the PostToolUse of the same call: its tool_use_id, else
    (Claude Code sends none on PermissionRequest) what ``_about`` says the call is."""
    call = payload.get("tool_use_id")
    if isinstance(call, str) and call:
        return call
    return _about(payload)


def _about(payload: dict[str, Any]) -> str:
    """A call as its tool and input: what a PermissionRequest without a tool_use_id is paired on. An
    AskUserQuestion runs with the user's answers added to its input: its questions name the call."""
    tool, tool_input = get_str(payload, "tool_name"), payload.get("tool_input")
    if tool == ASK_USER_QUESTION and isinstance(tool_input, dict):
        tool_input = tool_input.get("questions")
    return permission_key(tool, tool_input)


def settings_block(url: str | None = None, attention_timeout: float = 55.0,
                   commands: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``~/.claude/settings.json`` ``hooks`` block pointing every mapped hook at the receiver.

    Held hooks get a vendor-side timeout above our hold window, so Claude Code never cancels a
    hook we are still holding for an operator. ``commands`` registers a hook as a ``command``
    hook instead (``COMMAND_HOOKS``: the ones Claude Code never fires over http).
    """
    url = url or hook_url(None, DECLARATION.endpoint)
    held = int(attention_timeout) + 30
    hooks: dict[str, Any] = {}
    for name in mapped_hooks(AGENT):  # every hook Annex A.1 maps: the mapping's table
        handler: dict[str, Any] = {"type": "http", "url": url}
        if commands and name in commands:
            handler = {"type": "command", "command": commands[name]}
        handler["timeout"] = held if name in HELD_HOOKS else 10
        entry: dict[str, Any] = {"hooks": [handler]}
        if name in TOOL_HOOKS:
            entry = {"matcher": "*", **entry}
        hooks[name] = [entry]
    return {"hooks": hooks}



def registration(url: str | None, cfg: Any) -> Wiring:
    """``~/.claude/settings.json`` ``hooks``: native http hooks, SessionStart through the shim."""
    endpoint = cfg.endpoint if cfg is not None else DECLARATION.endpoint
    timeout = cfg.attention_timeout if cfg is not None else ClaudeCodeConfig.attention_timeout
    target = hook_url(url, endpoint)
    # Moments Claude Code fires for command hooks only go through the shim, to the same receiver.
    commands = {name: shim_command(AGENT, url=target) for name in COMMAND_HOOKS}
    block = settings_block(target, timeout, commands)
    return Wiring(AGENT, [json_target(".claude/settings.json", block)], [
        "merge into ~/.claude/settings.json (or .claude/settings.json in a project), "
        "or run: aep-collector hooks claude-code --install"])


DECLARATION = VendorDeclaration(
    agent=AGENT, receiver_type="claude_code", port=8377, config_class=ClaudeCodeConfig,
    surface=lambda cfg, component: ClaudeCodeSurface(cfg, component),
    mapping=MAPPING, registration=registration, held_hooks=HELD_HOOKS,
    neutral_reply=NEUTRAL_REPLY,
    description="Claude Code native http hooks (POST /hook)",
)
FACTORY = DECLARATION.factory()


