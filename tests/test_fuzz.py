"""Fuzz every receiver of the real collector binary: zero 5xx over many payloads each (hypothesis).

One collector (every hook receiver and OTLP/HTTP) serves the whole module; each receiver gets
``AEP_FUZZ_EXAMPLES`` payloads (default 10,000) over one persistent keep-alive connection.
Payloads mix the vendors' known keys and hook names with arbitrary JSON, lone surrogate escapes,
integers beyond the digit limit, non-finite and huge numbers, wrong types, batches, and bytes that
are not JSON or not UTF-8; and (``AEP_FUZZ_EXAMPLES / 50`` of them) HTTP that is malformed itself,
on raw sockets. Every answer must be below 500; a refusal must be a JSON body naming the problem
(on the hook receivers, also for the HTTP aiohttp itself cannot parse);
the collector must still be up and must not have logged a traceback.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import socket
import threading
import urllib.parse

import pytest
from aep_collector.pipeline.component import Kind
from aep_collector.pipeline.registry import build_registry
from aep_collector.receivers.hook_http import HookReceiverConfig
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.helpers import Collector, http_responses

REGISTRY, _ = build_registry(load_plugins=False)
# Every receiver built on the shared hook server (not otlp, not the NATS consumer).
HOOK_RECEIVERS = [t for t in REGISTRY.types(Kind.RECEIVER)
                  if issubclass(REGISTRY.get(Kind.RECEIVER, t).config_class, HookReceiverConfig)]
EXAMPLES = int(os.environ.get("AEP_FUZZ_EXAMPLES", "10000"))
PER_EXAMPLE = 10  # payloads per hypothesis example (``variants``)
RUNS = max(1, math.ceil(EXAMPLES / PER_EXAMPLE))

BIG = "\x00big-int\x00"  # an integer of more than 4,300 digits once encoded (``encode``)
SURROGATES = ["\ud800", "a\udfffb", "\udbff\udbff", "x\ud83d", "\ude00y", "\ud83d\ude00"]
KNOWN_KEYS = ["hook_event_name", "session_id", "tool_name", "tool_input", "tool_response", "tool_use_id",
              "prompt", "turn_id", "notification_type", "kind", "event", "hookName", "taskId", "conversationId",
              "stepIdx", "toolCall", "questions", "requested_schema", "mcp_server_name", "extra", "type",
              "permission", "input", "output", "properties", "name", "payload", "cwd", "transcript_path",
              "error", "message", "agent_type", "source", "reason", "elicitation_id", "mode", "content"]
HOOK_NAMES = ["SessionStart", "SessionEnd", "UserPromptSubmit", "Stop", "PreToolUse", "PostToolUse",
              "PostToolUseFailure", "PermissionRequest", "PermissionDenied", "Notification", "Elicitation",
              "ElicitationResult", "PreCompact", "PostCompact", "SubagentStart", "SubagentStop", "StopFailure",
              "TeammateIdle", "BeforeAgent", "AfterTool", "BeforeTool", "agent_start", "tool_call", "pre_tool_call",
              "on_session_end", "session.created", "session.idle", "session.deleted", "permission.asked",
              "permission.replied", "question.asked", "message.updated", "tool.execute.before",
              "tool.execute.after", "permission.ask", "bus", "tool.before", "SomethingNew", ""]

text = (st.text(max_size=16) | st.sampled_from(SURROGATES + HOOK_NAMES)
        | st.text(st.characters(exclude_categories=()), max_size=6))
number = (st.integers() | st.integers(min_value=2 ** 63, max_value=2 ** 200)
          | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e308, -0.0, 5e-324]))
leaf = st.none() | st.booleans() | number | text
json_value = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(text, inner, max_size=3), max_leaves=6)
known = st.dictionaries(st.sampled_from(KNOWN_KEYS), json_value, max_size=4)
hook_payload = st.one_of(
    known,
    st.builds(lambda d, n, s: {**d, "hook_event_name": n, "session_id": s}, known, st.sampled_from(HOOK_NAMES), text),
    st.builds(lambda d, t, s: {"kind": "bus", "event": {"type": t, "properties": {"sessionID": s, **d}}},
              known, st.sampled_from(HOOK_NAMES) | json_value, text),
    st.builds(lambda d, k, s: {"kind": k, "input": {"sessionID": s, **d}, "output": d,
                               "permission": {"sessionID": s, "id": s, **d}},
              known, st.sampled_from(["tool.before", "tool.after", "permission.ask", "bus"]), text))
hook_body = hook_payload | st.builds(lambda items: {"batch": items}, st.lists(hook_payload, max_size=3))

any_value = st.fixed_dictionaries({}, optional={
    "stringValue": text, "intValue": number | text, "doubleValue": number | text, "boolValue": leaf,
    "bytesValue": text, "arrayValue": json_value, "kvlistValue": json_value})
key_value = st.fixed_dictionaries({"key": text | st.sampled_from(["event.name", "session.id", "conversation.id"]),
                                   "value": any_value | json_value})
log_record = st.fixed_dictionaries({}, optional={
    "timeUnixNano": number | text | st.just(BIG), "severityNumber": number | text, "body": any_value | json_value,
    "attributes": st.lists(key_value, max_size=3),
    "traceId": text | st.sampled_from(["0" * 32, "ab" * 16]), "spanId": text | st.just("01" * 8)})
otlp_doc = st.fixed_dictionaries({"resourceLogs": st.lists(st.fixed_dictionaries({}, optional={
    "resource": st.fixed_dictionaries({"attributes": st.lists(key_value, max_size=2)}),
    "scopeLogs": st.lists(st.fixed_dictionaries({"logRecords": st.lists(log_record, max_size=2)}),
                          max_size=2)}), max_size=2)}) | json_value


def encode(value: object) -> bytes:
    raw = json.dumps(value, ensure_ascii=True)  # lone surrogates become \udXXX escapes, as Node emits
    return raw.replace(json.dumps(BIG), "9" * 4400).encode()


def variants(value: object, seed: int) -> list[bytes]:
    """The payload as JSON plus fuzzed derivations of it, ``PER_EXAMPLE`` in all: cheap to make, so
    hypothesis pays for one structured draw per ten payloads. Raw UTF-8 with the surrogates
    encoded (not UTF-8), truncations, flipped bytes, and values spliced in where a string was:
    a lone surrogate escape, a 4,400-digit integer, a number out of range, NaN, a list."""
    rng = random.Random(seed)
    raw = encode(value)
    out = [raw, json.dumps(value, ensure_ascii=False).replace(json.dumps(BIG), "1").encode("utf-8", "surrogatepass")]
    for _ in range(2):
        out.append(raw[:rng.randrange(len(raw))])
        at = rng.randrange(len(raw))
        out.append(raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1:])
    strings = [m.span() for m in re.finditer(rb'"(?:[^"\\]|\\.)*"', raw)]
    for splice in (rb'"\udc00x"', b"9" * 4400, b"1e400", b"NaN", rb'["\ud800", -1e999]', b"{}"):
        if len(out) == PER_EXAMPLE:
            break
        if strings:
            start, end = rng.choice(strings)
            out.append(raw[:start] + splice + raw[end:])
        else:
            out.append(splice)
    return out[:PER_EXAMPLE]


class Client:
    """One persistent keep-alive connection; reconnects when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes, ctype: str = "application/json") -> tuple[int, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.conn.request("POST", path, body=body, headers={"Content-Type": ctype})
                response = self.conn.getresponse()
                data = response.read()
                if response.will_close:
                    self.close()
                return response.status, data
            except (http.client.HTTPException, ConnectionError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    receivers: dict = {t: {"endpoint": "127.0.0.1:0"} for t in HOOK_RECEIVERS}
    receivers["otlp/vscode"] = {"profile": "vscode", "mode": "primary", "http": {"endpoint": "127.0.0.1:0"}}
    cfg = {"receivers": receivers,
           "processors": {"mapping": None, "runs": None, "capture": None},
           "exporters": {"jsonl": {"directory": str(tmp / "logs"), "fsync": "never"}},
           "service": {"state_dir": str(tmp / "state"),
                       "pipelines": {"all": {"receivers": list(receivers), "processors": ["mapping", "runs", "capture"],
                                             "exporters": ["jsonl"]}}}}
    c = Collector(cfg, tmp).start()
    assert c.proc is not None and c.proc.stdout is not None
    # Keep reading its log, so a full pipe can never stall the collector mid-run.
    reader = threading.Thread(target=lambda: c.log.extend(c.proc.stdout), daemon=True)
    reader.start()
    clients: dict[str, Client] = {}
    yield c, clients
    for client in clients.values():
        client.close()
    assert c.proc.poll() is None, "the collector died:\n" + "".join(c.log)[-3000:]
    c.proc.terminate()
    assert c.proc.wait(timeout=30) == 0, "".join(c.log)[-3000:]
    reader.join(timeout=10)
    out = "".join(c.log)
    assert "Traceback" not in out and "Error handling request" not in out, out[-5000:]


def client_for(stack, key: str) -> Client:
    c, clients = stack
    if key not in clients:
        clients[key] = Client(c.ports[key])
    return clients[key]


def check_hook_reply(status: int, body: bytes, sent: bytes) -> None:
    assert status < 500, (status, body[:300], sent[:300])
    assert status in (200, 400, 404, 413), (status, body[:300], sent[:300])
    if status != 200:
        parsed = json.loads(body)
        assert isinstance(parsed.get("error"), str) and isinstance(parsed.get("detail"), str), (body, sent[:300])


FUZZ = settings(max_examples=RUNS, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])


@pytest.mark.parametrize("receiver", HOOK_RECEIVERS)
@FUZZ
@given(body=hook_body, hook=st.none() | st.sampled_from(HOOK_NAMES) | text,
       param=st.sampled_from(["hook", "name"]), seed=st.integers(0, 2 ** 32))
def test_no_hook_receiver_answers_5xx(stack, receiver, body, hook, param, seed):
    client = client_for(stack, f"receiver/{receiver}")
    path = "/hook" if hook is None else "/hook?" + urllib.parse.urlencode({param: hook}, errors="surrogatepass")
    for raw in variants(body, seed):
        check_hook_reply(*client.post(path, raw), raw)


@FUZZ
@given(doc=otlp_doc, raw=st.binary(max_size=200), seed=st.integers(0, 2 ** 32),
       ctype=st.sampled_from(["application/json"] * 4 + ["application/x-protobuf", "text/plain"]))
def test_the_otlp_http_receiver_never_answers_5xx(stack, doc, raw, seed, ctype):
    client = client_for(stack, "receiver/otlp/vscode:http")
    bodies = variants(doc, seed) if ctype == "application/json" else [raw, *variants(doc, seed)[1:]]
    for body in bodies:
        status, reply = client.post("/v1/logs", body, ctype)
        assert status in (200, 400, 413, 415), (status, reply[:300], body[:300])


RAW_EXAMPLES = max(1, EXAMPLES // 50)
QUIET = 0.3  # seconds without a byte after which a raw connection's answer is taken as complete


@settings(max_examples=RAW_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(receiver=st.sampled_from(HOOK_RECEIVERS + ["otlp/vscode"]),
       head=st.sampled_from([b"POST /hook HTTP/1.1\r\n", b"POST /v1/logs HTTP/1.1\r\n", b"GET /healthz HTTP/1.0\r\n",
                             b"POST / HTTP/1.1\r\n", b""]),
       headers=st.lists(st.binary(max_size=40) | st.sampled_from([
           b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: 99999999999999999999",
           b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked", b"Content-Type: application/json",
           b"Content-Encoding: gzip", b"Host: x", b"Expect: 100-continue", b"Connection: close"]), max_size=5),
       body=st.binary(max_size=60))
# HTTP aiohttp refuses before any handler runs, every run (random examples reach it only now and then).
@example(receiver=HOOK_RECEIVERS[0], head=b"POST /hook HTTP/1.1\r\n", headers=[b"Content-Length: -1"], body=b"{}")
@example(receiver=HOOK_RECEIVERS[-1], head=b"POST /hook HTTP/1.1\r\n", headers=[b"Transfer-Encoding: chunked"],
         body=b"zz\r\nabc\r\n0\r\n\r\n")
def test_malformed_http_never_gets_5xx_or_a_traceback(stack, receiver, head, headers, body):
    c, _ = stack
    port = c.ports[f"receiver/{receiver}" if receiver != "otlp/vscode" else "receiver/otlp/vscode:http"]
    raw = head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(raw)
        # No half-close: aiohttp drops a connection whose client shut its side without answering,
        # so nothing would be checked. Read until the server closes, or goes quiet (keep-alive).
        s.settimeout(QUIET)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    for status in re.findall(rb"^HTTP/1\.[01] (\d{3})", answer, re.M):
        assert int(status) < 500, (raw, answer[:300])
    if receiver == "otlp/vscode":
        return
    # A hook server's refusal is a JSON body naming the problem, also for HTTP aiohttp cannot parse.
    for status, headers, reply in http_responses(answer):
        if status >= 400:
            assert headers.get("content-type", "").startswith("application/json"), (raw, answer[:300])
            refusal = json.loads(reply)
            assert isinstance(refusal.get("error"), str) and isinstance(refusal.get("detail"), str), (raw, reply)
