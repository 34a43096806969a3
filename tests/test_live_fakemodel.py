"""The live tier's scripted fake model, over real loopback HTTP, in each dialect, streaming and not."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.live.fakemodel import FakeModel, calls, shell, text, tool

SHELL_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"},
                                                 "is_background": {"type": "boolean"}},
                "required": ["command", "is_background"]}


def post(url: str, body: dict[str, Any]) -> tuple[str, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.headers["Content-Type"], resp.read()


def sse(raw: bytes) -> list[Any]:
    out = []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


# --- one request per dialect: (path, body with tools and history, how to read the calls back) ----


def anthropic(history: list[Any], stream: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/messages?beta=true", {"model": "m", "stream": stream, "messages": [
        {"role": "user", "content": "go"}, *history], "tools": [{"name": "Bash", "input_schema": SHELL_SCHEMA},
                                                                 {"name": "Read", "input_schema": {}}]}


def anthropic_calls(ctype: str, raw: bytes) -> tuple[list[tuple[str, Any]], str]:
    if "json" in ctype:
        msg = json.loads(raw)
        return ([(b["name"], b["input"]) for b in msg["content"] if b["type"] == "tool_use"],
                "".join(b.get("text", "") for b in msg["content"]))
    events = sse(raw)
    names = {e["index"]: e["content_block"].get("name") for e in events if e["type"] == "content_block_start"}
    args = {e["index"]: json.loads(e["delta"]["partial_json"]) for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"}
    txt = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    return [(names[i], args[i]) for i in sorted(args)], txt


def chat(history: list[Any], stream: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": "m", "stream": stream, "messages": [
        {"role": "user", "content": "go"}, *history],
        "tools": [{"type": "function", "function": {"name": "run_shell_command", "parameters": SHELL_SCHEMA}}]}


def chat_calls(ctype: str, raw: bytes) -> tuple[list[tuple[str, Any]], str]:
    if "json" in ctype:
        m = json.loads(raw)["choices"][0]["message"]
        return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []], \
            m["content"] or ""
    assert raw.rstrip().endswith(b"data: [DONE]")
    deltas = [c["choices"][0]["delta"] for c in sse(raw) if c["choices"]]
    found = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for d in deltas
             for c in d.get("tool_calls") or []]
    return found, "".join(d.get("content") or "" for d in deltas)


def responses(history: list[Any], stream: bool) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": "m", "stream": stream, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}, *history],
        "tools": [{"type": "function", "name": "exec_command", "parameters": {
            "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}]}


def responses_calls(ctype: str, raw: bytes) -> tuple[list[tuple[str, Any]], str]:
    if "json" in ctype:
        items = json.loads(raw)["output"]
    else:
        events = sse(raw)
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    return ([(i["name"], json.loads(i["arguments"])) for i in items if i["type"] == "function_call"],
            "".join(c["text"] for i in items if i["type"] == "message" for c in i["content"]))


def gemini(history: list[Any], stream: bool) -> tuple[str, dict[str, Any]]:
    verb = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/v1beta/models/m:{verb}", {"contents": [{"role": "user", "parts": [{"text": "go"}]}, *history],
                                        "tools": [{"functionDeclarations": [
                                            {"name": "run_shell_command", "parametersJsonSchema": SHELL_SCHEMA}]}]}


def gemini_calls(ctype: str, raw: bytes) -> tuple[list[tuple[str, Any]], str]:
    chunks = [json.loads(raw)] if "json" in ctype else sse(raw)
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    return ([(p["functionCall"]["name"], p["functionCall"]["args"]) for p in parts if "functionCall" in p],
            "".join(p.get("text", "") for p in parts))


# history after one tool turn, in each dialect (the result text is what the agent sends back)
AFTER_ONE_TOOL = {
    "anthropic": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                "content": [{"type": "text", "text": "denied: use ls"}]}]}],
    "chat": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "run_shell_command", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "denied: use ls"}],
    "responses": [{"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "denied: use ls"}],
    "gemini": [{"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {}}}]},
               {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command",
                                                                "response": {"output": "denied: use ls"}}}]}],
}
DIALECTS = {"anthropic": (anthropic, anthropic_calls, "Bash", "command"),
            "chat": (chat, chat_calls, "run_shell_command", "command"),
            "responses": (responses, responses_calls, "exec_command", "cmd"),
            "gemini": (gemini, gemini_calls, "run_shell_command", "command")}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_scenario_turns_follow_the_conversation(dialect: str, stream: bool) -> None:
    build, read, shell_name, arg = DIALECTS[dialect]
    with FakeModel([shell("echo hi"), text("finished")]) as model:
        path, body = build([], stream)
        found, txt = read(*post(model.url + path, body))
        assert [name for name, _ in found] == [shell_name] and found[0][1][arg] == "echo hi"
        if dialect != "responses":  # required arguments come from the schema
            assert found[0][1]["is_background"] is False
        # A retry of the same request gets the same turn: the script follows the history, not a counter.
        assert read(*post(model.url + path, body))[0] == found
        path, body = build(AFTER_ONE_TOOL[dialect], stream)
        found, txt = read(*post(model.url + path, body))
        assert found == [] and txt == "finished"
        assert model.tool_results() == ['{"output": "denied: use ls"}' if dialect == "gemini" else "denied: use ls"]
        assert [r.dialect for r in model.model_requests()] == [dialect] * 3
        assert model.model_requests()[0].stream is stream


def test_named_tools_parallel_calls_and_past_the_script() -> None:
    with FakeModel([calls(tool("Read", file_path="/x"), shell("ls"))]) as model:
        path, body = anthropic([], False)
        found, _ = anthropic_calls(*post(model.url + path, body))
        assert found == [("Read", {"file_path": "/x"}), ("Bash", {"command": "ls", "is_background": False})]
        path, body = anthropic(AFTER_ONE_TOOL["anthropic"], True)
        assert anthropic_calls(*post(model.url + path, body)) == ([], "done")  # script exhausted


def test_side_calls_get_text_or_json_from_their_schema() -> None:
    schema = {"type": "object", "properties": {"reasoning": {"type": "string"},
                                               "model_choice": {"type": "string", "enum": ["flash", "pro"]},
                                               "complexity_score": {"type": "integer", "minimum": 1}}}
    with FakeModel([shell("ls")], side_text="a title") as model:
        _, raw = post(model.url + "/v1beta/models/m:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": "route"}]}],
            "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": schema}})
        answer = json.loads(json.loads(raw)["candidates"][0]["content"]["parts"][0]["text"])
        assert answer == {"reasoning": "ok", "model_choice": "flash", "complexity_score": 1}
        _, raw = post(model.url + "/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "t"}]})
        assert json.loads(raw)["content"] == [{"type": "text", "text": "a title"}]
        assert model.model_requests() == [] and len(model.requests) == 2


def test_models_listing_and_unknown_routes() -> None:
    with FakeModel() as model:
        for path in ("/models", "/v1/models"):
            with urllib.request.urlopen(model.url + path, timeout=10) as resp:
                assert json.loads(resp.read())["data"][0]["id"] == "fake-model"
        with urllib.request.urlopen(model.url + "/v1beta/models", timeout=10) as resp:
            assert json.loads(resp.read())["models"][0]["name"] == "models/fake-model"
        with pytest.raises(urllib.error.HTTPError) as err:
            post(model.url + "/v2/nothing", {})
        assert err.value.code == 404


def test_a_shell_turn_without_a_shell_tool_is_a_clear_400() -> None:
    with FakeModel([shell("ls")]) as model:
        with pytest.raises(urllib.error.HTTPError) as err:
            post(model.url + "/v1/messages", {"model": "m", "messages": [], "tools": [{"name": "Read"}]})
        assert err.value.code == 400 and "no shell tool among ['Read']" in err.value.read().decode()
