"""A scripted fake model server for the live tier: the real agent CLIs talk to it instead of a vendor.

It speaks the four dialects the CLIs use, streaming (SSE) and not:

- Anthropic Messages: ``POST /v1/messages`` (``stream: true`` → SSE), ``/v1/messages/count_tokens``
- OpenAI Responses: ``POST /v1/responses`` (or ``/responses``)
- OpenAI Chat Completions: ``POST /v1/chat/completions`` (or ``/chat/completions``)
- Gemini: ``POST /v1beta/models/M:generateContent`` and ``:streamGenerateContent?alt=sse``,
  ``:countTokens``
- ``GET /models``, ``/v1/models``, ``/v1beta/models``: one model, ``fake-model``

A scenario is a list of turns, built with :func:`text`, :func:`tool` and :func:`shell`::

    with FakeModel([shell("echo hi"), text("done")]) as model:
        run_cli(env={"ANTHROPIC_BASE_URL": model.url})
        assert "hi" in model.tool_results()[0]

Which turn answers a request is read from the request itself: the number of tool-call turns the
conversation already holds (so a CLI's retries, side calls and restarts do not shift the script).
Past the last turn, or for a request that offers no tools (title generation, routing) or names an
output schema (Codex's approval reviewer), the server answers with text (``side_text``; JSON built
from the schema when the request asks for JSON).

Every request is recorded (:attr:`FakeModel.requests`, a list of :class:`Request`), so a test can
read what the agent sent back to the model: :meth:`FakeModel.tool_results` gives the text of every
tool result in the last request that carried tools, whatever the dialect.

``shell(cmd)`` is a tool call on whichever shell tool the request offers (``Bash``,
``exec_command``, ``run_shell_command``, ``bash``, ``run_commands``, ``terminal``, ...): the
argument names come from that tool's schema (``command``/``cmd`` as a string, ``commands`` as a
list, other required arguments filled with neutral values).

Run alone for exploring a CLI: ``python -m tests.live.fakemodel [--port N]`` serves
``shell("echo hello-from-fake")`` then ``text("done")`` and prints each request's path.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

SHELL_TOOLS = ("Bash", "exec_command", "run_shell_command", "bash", "run_commands", "terminal", "shell",
               "execute_command", "shell_command")
"""Shell tool names across the vendors, in the order :func:`shell` prefers them."""

MODEL_ID = "fake-model"


@dataclass(frozen=True)
class Turn:
    """One scripted model turn: ``text`` (final answer), or tool calls ``[(name, args), ...]``."""

    text: str | None = None
    calls: tuple[tuple[str, dict[str, Any] | str], ...] = ()


def text(s: str) -> Turn:
    """A turn answering with text (the agent's run then ends)."""
    return Turn(text=s)


def tool(name: str, args: dict[str, Any] | None = None, **kwargs: Any) -> Turn:
    """A turn calling tool ``name`` with ``args`` (a dict, or keyword arguments)."""
    return Turn(calls=((name, {**(args or {}), **kwargs}),))


def shell(command: str) -> Turn:
    """A turn calling the request's shell tool with ``command`` (argument names from its schema)."""
    return Turn(calls=(("", command),))


def calls(*turns: Turn) -> Turn:
    """Several tool calls in one turn (parallel calls): ``calls(shell("a"), tool("Read", ...))``."""
    return Turn(calls=tuple(c for t in turns for c in t.calls))


# ---------------------------------------------------------------------------------------------------
# Requests, normalized across dialects


@dataclass
class Tool:
    name: str
    schema: dict[str, Any]
    custom: bool = False  # an OpenAI Responses freeform tool: its call carries one string


@dataclass
class Request:
    """One recorded request: ``dialect`` is ``anthropic``, ``responses``, ``chat``, ``gemini`` or ``other``."""

    method: str
    path: str
    dialect: str
    body: Any
    headers: dict[str, str]
    stream: bool = False
    tools: list[Tool] = field(default_factory=list)

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def tool_turns(self) -> int:
        """How many assistant turns with tool calls the conversation in this request holds."""
        b = self.body if isinstance(self.body, dict) else {}
        if self.dialect == "anthropic":
            return sum(1 for m in b.get("messages") or [] if m.get("role") == "assistant"
                       and any(isinstance(c, dict) and c.get("type") == "tool_use" for c in _list(m.get("content"))))
        if self.dialect == "chat":
            return sum(1 for m in b.get("messages") or [] if m.get("role") == "assistant" and m.get("tool_calls"))
        if self.dialect == "gemini":
            return sum(1 for c in b.get("contents") or [] if c.get("role") == "model"
                       and any("functionCall" in p for p in c.get("parts") or []))
        if self.dialect == "responses":
            n, prev = 0, False
            for item in _list(b.get("input")):
                is_call = isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call",
                                                                          "local_shell_call")
                n += is_call and not prev
                prev = is_call or (prev and isinstance(item, dict) and item.get("type") == "reasoning")
            return n
        return 0

    def tool_results(self) -> list[str]:
        """The text of every tool result the conversation in this request holds, oldest first."""
        b = self.body if isinstance(self.body, dict) else {}
        out: list[str] = []
        if self.dialect == "anthropic":
            for m in b.get("messages") or []:
                for c in _list(m.get("content")):
                    if isinstance(c, dict) and c.get("type") == "tool_result":
                        out.append(_text_of(c.get("content")))
        elif self.dialect == "chat":
            out = [_text_of(m.get("content")) for m in b.get("messages") or [] if m.get("role") == "tool"]
        elif self.dialect == "gemini":
            for c in b.get("contents") or []:
                for p in c.get("parts") or []:
                    if "functionResponse" in p:
                        out.append(json.dumps(p["functionResponse"].get("response"), ensure_ascii=False))
        elif self.dialect == "responses":
            for item in _list(b.get("input")):
                if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output"):
                    out.append(_text_of(item.get("output")))
        return out

    def user_text(self) -> str:
        """All user-authored text in the conversation (prompt, and anything a CLI injects as user)."""
        b = self.body if isinstance(self.body, dict) else {}
        if self.dialect in ("anthropic", "chat"):
            return "\n".join(_text_of(m.get("content")) for m in b.get("messages") or [] if m.get("role") == "user")
        if self.dialect == "gemini":
            return "\n".join(p.get("text", "") for c in b.get("contents") or [] if c.get("role") == "user"
                             for p in c.get("parts") or [])
        if self.dialect == "responses":
            return "\n".join(_text_of(i.get("content")) for i in _list(b.get("input"))
                             if isinstance(i, dict) and i.get("role") == "user")
        return ""


def _list(v: Any) -> list[Any]:
    if isinstance(v, list):
        return v
    if isinstance(v, str):
        return [{"type": "text", "text": v}]
    return []


def _text_of(v: Any) -> str:
    """Text of a content value in any dialect: a string, or a list of text-bearing parts."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "\n".join(_text_of(p) for p in v)
    if isinstance(v, dict):
        for k in ("text", "content", "output"):
            if k in v:
                return _text_of(v[k])
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def _tools(dialect: str, body: Any) -> list[Tool]:
    if not isinstance(body, dict):
        return []
    out: list[Tool] = []
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        if dialect == "anthropic" and "name" in t:
            out.append(Tool(t["name"], t.get("input_schema") or {}))
        elif dialect == "chat" and isinstance(t.get("function"), dict):
            out.append(Tool(t["function"].get("name", ""), t["function"].get("parameters") or {}))
        elif dialect == "responses" and "name" in t:
            out.append(Tool(t["name"], t.get("parameters") or {}, custom=t.get("type") == "custom"))
        elif dialect == "gemini":
            for d in t.get("functionDeclarations") or t.get("function_declarations") or []:
                out.append(Tool(d.get("name", ""), d.get("parametersJsonSchema") or d.get("parameters") or {}))
    return out


def _instance(schema: Any, depth: int = 0) -> Any:
    """A small value that satisfies ``schema`` (enough for the JSON a CLI's side call asks for)."""
    if not isinstance(schema, dict) or depth > 8:
        return "ok"
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _instance(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    kind = str(kind or ("object" if "properties" in schema else "string")).lower()
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _instance(v, depth + 1) for k, v in props.items()}
    if kind == "array":
        return [_instance(schema.get("items") or {}, depth + 1)] if schema.get("minItems") else []
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return "ok"


def output_schema(req: Request) -> dict[str, Any] | None:
    """The JSON schema ``req`` asks its answer to follow (any dialect), if it names one."""
    b = req.body if isinstance(req.body, dict) else {}
    gen = b.get("generationConfig") or {}
    schema = gen.get("responseJsonSchema") or gen.get("responseSchema") or \
        ((b.get("response_format") or {}).get("json_schema") or {}).get("schema") or \
        ((b.get("text") or {}).get("format") or {}).get("schema")
    return schema if isinstance(schema, dict) and schema else None


def shell_args(t: Tool, command: str) -> dict[str, Any] | str:
    """Arguments for shell tool ``t`` running ``command``, named after its schema."""
    if t.custom:
        return command
    props = t.schema.get("properties") or {}
    args: dict[str, Any] = {}
    for name in t.schema.get("required") or []:
        if name not in ("command", "cmd", "commands"):
            args[name] = _instance(props.get(name) or {})
    for name in ("command", "cmd", "commands"):
        if name in props:
            is_list = str((props[name] or {}).get("type", "")).lower() == "array"
            args[name] = [command] if is_list else command
            break
    else:
        args["command"] = command
    return args


# ---------------------------------------------------------------------------------------------------
# The server


class FakeModel:
    """The scripted model on ``127.0.0.1`` (a free port unless ``port`` is given); see the module doc.

    ``url`` is the base URL (``http://127.0.0.1:PORT``, no path): add ``/v1`` where a CLI wants it.
    """

    def __init__(self, turns: list[Turn] | None = None, *, side_text: str = "ok", port: int = 0) -> None:
        self.turns = list(turns or [])
        self.side_text = side_text
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeModel:
        self._thread = threading.Thread(target=self._serve, name="fakemodel", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=0.05)  # a short poll: stop() returns at once

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the agent sent ------------------------------------------------------------------------

    def model_requests(self) -> list[Request]:
        """Requests that asked the model something with tools offered (the agent's own turns; a
        request naming an output schema is a side call, not a turn)."""
        with self._lock:
            return [r for r in self.requests if r.tools and output_schema(r) is None]

    def tool_results(self) -> list[str]:
        """Tool results in the last request that offered tools (the agent's whole conversation so far)."""
        reqs = self.model_requests()
        return reqs[-1].tool_results() if reqs else []

    # -- answering ----------------------------------------------------------------------------------

    def record(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}"

    def answer(self, req: Request) -> Turn:
        """The turn that answers ``req``: by conversation progress, or side text.

        A request that names an output schema is a side call even when it offers tools (Codex
        0.169's approval reviewer sends three tools and a ``text.format`` schema): it is answered
        with JSON built from the schema, never with the next scripted tool call.
        """
        if not req.tools or output_schema(req) is not None:
            return Turn(text=self.side_text)
        i = req.tool_turns()
        if i < len(self.turns) and all(t.calls for t in self.turns[:i]):
            return self.turns[i]
        return Turn(text="done")

    def resolve(self, req: Request, turn: Turn) -> list[tuple[str, dict[str, Any] | str, bool]]:
        """``turn``'s calls as ``(tool name, args, custom)``; a :func:`shell` call picks the request's shell tool."""
        by_name = {t.name: t for t in req.tools}
        out = []
        for name, args in turn.calls:
            if name == "":
                t = next((by_name[n] for n in SHELL_TOOLS if n in by_name), None)
                if t is None:
                    raise LookupError(f"no shell tool among {req.tool_names}")
                out.append((t.name, shell_args(t, str(args)), t.custom))
            else:
                t = by_name.get(name)
                out.append((name, args, bool(t and t.custom)))
        return out


def _handler(model: FakeModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet: the requests are recorded instead
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = urlsplit(self.path).path.rstrip("/")
            model.record(Request("GET", self.path, "other", None, dict(self.headers)))
            if path.endswith("/models") or path == "/models":
                if "v1beta" in path:
                    self._json({"models": [{"name": f"models/{MODEL_ID}", "displayName": MODEL_ID,
                                            "supportedGenerationMethods": ["generateContent"]}]})
                else:
                    self._json({"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0,
                                                            "owned_by": "fake"}]})
            else:
                self._json({"error": {"message": f"no route {path}"}}, 404)

        def do_HEAD(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = raw.decode("utf-8", "replace")
            parts = urlsplit(self.path)
            path = parts.path
            dialect = ("anthropic" if path.endswith("/messages") else
                       "responses" if path.endswith("/responses") else
                       "chat" if path.endswith("/chat/completions") else
                       "gemini" if "Content" in path else "other")
            stream = (":streamGenerateContent" in path) if dialect == "gemini" else \
                bool(isinstance(body, dict) and body.get("stream"))
            req = Request("POST", self.path, dialect, body, dict(self.headers), stream, _tools(dialect, body))
            model.record(req)
            if path.endswith("/count_tokens"):
                return self._json({"input_tokens": 10})
            if path.endswith(":countTokens"):
                return self._json({"totalTokens": 10})
            if dialect == "other":
                return self._json({"error": {"message": f"no route {path}"}}, 404)
            try:
                turn = model.answer(req)
                resolved = model.resolve(req, turn)
            except LookupError as exc:
                return self._json({"error": {"message": str(exc)}}, 400)
            getattr(self, f"_{dialect}")(req, turn, resolved)

        # -- plumbing ---------------------------------------------------------------------------

        def _json(self, obj: Any, status: int = 200) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _sse(self, events: list[tuple[str | None, Any]], done: bool = False) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True  # the body ends where the connection does
            for name, data in events:
                head = f"event: {name}\n" if name else ""
                self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
            if done:
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _text_for(self, req: Request, turn: Turn) -> str:
            """The text of a text turn; JSON from the schema when the request asks for JSON."""
            b = req.body if isinstance(req.body, dict) else {}
            gen = b.get("generationConfig") or {}
            schema = output_schema(req)
            if schema:
                return json.dumps(_instance(schema))
            if gen.get("responseMimeType") == "application/json" and not req.tools:
                return "{}"
            return turn.text or ""

        # -- Anthropic Messages -----------------------------------------------------------------

        def _anthropic(self, req: Request, turn: Turn, resolved: list) -> None:
            blocks: list[dict[str, Any]] = []
            if resolved:
                for name, args, _custom in resolved:
                    blocks.append({"type": "tool_use", "id": model.next_id("toolu_fake"), "name": name,
                                   "input": args})
            else:
                blocks.append({"type": "text", "text": self._text_for(req, turn)})
            stop = "tool_use" if resolved else "end_turn"
            usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
                     "cache_read_input_tokens": 0}
            msg = {"id": model.next_id("msg_fake"), "type": "message", "role": "assistant", "model":
                   (req.body or {}).get("model", MODEL_ID), "content": blocks, "stop_reason": stop,
                   "stop_sequence": None, "usage": usage}
            if not req.stream:
                return self._json(msg)
            events: list[tuple[str | None, Any]] = [
                ("message_start", {"type": "message_start", "message": {**msg, "content": [], "stop_reason": None,
                                                                         "usage": {**usage, "output_tokens": 1}}})]
            for i, block in enumerate(blocks):
                if block["type"] == "text":
                    start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
                else:
                    start = {**block, "input": {}}
                    delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                events += [("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}),
                           ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
                           ("content_block_stop", {"type": "content_block_stop", "index": i})]
            events += [("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                          "usage": {"output_tokens": 5}}),
                       ("message_stop", {"type": "message_stop"})]
            self._sse(events)

        # -- OpenAI Responses -------------------------------------------------------------------

        def _responses(self, req: Request, turn: Turn, resolved: list) -> None:
            items: list[dict[str, Any]] = []
            for name, args, custom in resolved:
                call_id = model.next_id("call_fake")
                if custom:
                    items.append({"type": "custom_tool_call", "id": model.next_id("ctc_"), "call_id": call_id,
                                  "name": name, "input": args if isinstance(args, str) else json.dumps(args),
                                  "status": "completed"})
                else:
                    items.append({"type": "function_call", "id": model.next_id("fc_"), "call_id": call_id,
                                  "name": name, "arguments": json.dumps(args), "status": "completed"})
            if not resolved:
                items.append({"type": "message", "id": model.next_id("msg_"), "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": self._text_for(req, turn), "annotations": []}]})
            rid = model.next_id("resp_")
            usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                     "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
            resp = {"id": rid, "object": "response", "created_at": 0, "status": "completed",
                    "model": (req.body or {}).get("model", MODEL_ID), "output": items, "usage": usage}
            if not req.stream:
                return self._json(resp)
            events: list[tuple[str | None, Any]] = [
                ("response.created", {"type": "response.created", "response": {**resp, "status": "in_progress",
                                                                               "output": []}})]
            for i, item in enumerate(items):
                events.append(("response.output_item.added", {"type": "response.output_item.added",
                                                              "output_index": i, "item": item}))
                if item["type"] == "message":
                    events.append(("response.output_text.delta", {
                        "type": "response.output_text.delta", "item_id": item["id"], "output_index": i,
                        "content_index": 0, "delta": item["content"][0]["text"]}))
                events.append(("response.output_item.done", {"type": "response.output_item.done",
                                                             "output_index": i, "item": item}))
            events.append(("response.completed", {"type": "response.completed", "response": resp}))
            self._sse(events)

        # -- OpenAI Chat Completions ------------------------------------------------------------

        def _chat(self, req: Request, turn: Turn, resolved: list) -> None:
            tool_calls = [{"id": model.next_id("call_fake"), "type": "function",
                           "function": {"name": name, "arguments": json.dumps(args)}} for name, args, _c in resolved]
            content = None if resolved else self._text_for(req, turn)
            finish = "tool_calls" if resolved else "stop"
            cid = model.next_id("chatcmpl-")
            usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
            base = {"id": cid, "created": 0, "model": (req.body or {}).get("model", MODEL_ID)}
            if not req.stream:
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if tool_calls:
                    message["tool_calls"] = tool_calls
                return self._json({**base, "object": "chat.completion", "usage": usage,
                                   "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
            chunk = {**base, "object": "chat.completion.chunk"}
            events: list[tuple[str | None, Any]] = [
                (None, {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                              "finish_reason": None}]})]
            if content:
                events.append((None, {**chunk, "choices": [{"index": 0, "delta": {"content": content},
                                                            "finish_reason": None}]}))
            for i, call in enumerate(tool_calls):
                events.append((None, {**chunk, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, **call}]},
                                                            "finish_reason": None}]}))
            events.append((None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
            events.append((None, {**chunk, "choices": [], "usage": usage}))
            self._sse(events, done=True)

        # -- Gemini -----------------------------------------------------------------------------

        def _gemini(self, req: Request, turn: Turn, resolved: list) -> None:
            parts: list[dict[str, Any]] = [{"functionCall": {"name": name, "args": args}} for name, args, _c in resolved]
            if not parts:
                parts.append({"text": self._text_for(req, turn)})
            resp = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                    "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
                    "modelVersion": MODEL_ID}
            if not req.stream:
                return self._json(resp)
            self._sse([(None, resp)])

    return Handler


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    model = FakeModel([shell("echo hello-from-fake"), text("done")], port=args.port).start()
    print(f"fake model on {model.url}", flush=True)
    seen = 0
    try:
        while True:
            threading.Event().wait(0.5)
            for r in model.requests[seen:]:
                print(r.method, r.path, r.dialect, "tools=" + ",".join(r.tool_names[:8]), flush=True)
            seen = len(model.requests)
    except KeyboardInterrupt:
        model.stop()


if __name__ == "__main__":
    main()
