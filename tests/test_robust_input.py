"""Input the receivers must survive: slow bodies, lone surrogates, huge integers, odd bus types.

Every test drives real loopback servers (an in-process service) over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import aiohttp
import pytest
from aep_collector.pipeline import wire
from aep_collector.pipeline.component import Kind
from aep_collector.pipeline.registry import build_registry
from aep_collector.receivers.hook_http import HookReceiverConfig, json_response
from aep_collector.receivers.otlp import wire as otlp_wire

from tests.helpers import base_config, read_jsonl, running

REGISTRY, _ = build_registry(load_plugins=False)
# Every receiver built on the shared hook server (not otlp, not the NATS consumer).
HOOK_RECEIVERS = [t for t in REGISTRY.types(Kind.RECEIVER)
                  if issubclass(REGISTRY.get(Kind.RECEIVER, t).config_class, HookReceiverConfig)]
OTLP = {"profile": "vscode", "mode": "primary", "http": {"endpoint": "127.0.0.1:0"}}


def events(tmp: Path) -> list[dict]:
    return [e for f in sorted((tmp / "logs").rglob("*.jsonl")) for e in read_jsonl(f)]


async def metrics(service) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{service.metrics.port}/metrics") as r:
        return await r.text()


def error_count(page: str, receiver: str, cause: str) -> int:
    m = re.search(rf'aep_collector_request_errors_total\{{receiver="{re.escape(receiver)}",cause="{cause}"\}} (\d+)',
                  page)
    return int(m.group(1)) if m else 0


async def stalled(port: int, path: str = "/hook", ctype: str = "application/json"):
    """A client that sends its headers and one byte of a 100-byte body, then stalls."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\nContent-Length: 100\r\n\r\n{{"
                 .encode())
    await writer.drain()
    return reader, writer


async def response_of(reader: asyncio.StreamReader) -> tuple[int, dict]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split()[1])
    length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
    return status, json.loads(await reader.readexactly(length))


# -- slow bodies ---------------------------------------------------------------------------------


async def test_stalled_bodies_never_take_the_slots_of_whole_hooks(tmp_path):
    # The bound is long here: were stalled bodies holding slots, every hook would get 503 at once.
    receivers = {"claude_code": {"endpoint": "127.0.0.1:0", "max_concurrent_requests": 2, "body_timeout": 60}}
    async with running(base_config(tmp_path, receivers)) as service:
        port = service.receivers["claude_code"].port
        clients = [await stalled(port) for _ in range(5)]  # more stalled clients than slots
        async with aiohttp.ClientSession() as s:
            for n in range(3):
                body = {"hook_event_name": "UserPromptSubmit", "session_id": "alive", "prompt": f"p{n}"}
                async with s.post(f"http://127.0.0.1:{port}/hook", json=body) as r:
                    assert r.status == 200, await r.text()
        # The audit trail flows meanwhile.
        assert [e["type"] for e in events(tmp_path)].count("run.started") == 3
        for _, writer in clients:
            writer.close()


async def test_a_stalled_body_gets_408_with_a_json_body_and_is_counted(tmp_path):
    receivers = {"claude_code": {"endpoint": "127.0.0.1:0", "max_concurrent_requests": 2, "body_timeout": 0.5}}
    cfg = base_config(tmp_path, receivers)
    cfg["service"]["telemetry"] = {"metrics": {"endpoint": "127.0.0.1:0"}}
    async with running(cfg) as service:
        port = service.receivers["claude_code"].port
        clients = [await stalled(port) for _ in range(3)]
        for reader, writer in clients:
            status, body = await response_of(reader)
            assert status == 408
            assert body["error"] == "body-timeout" and "0.5s" in body["detail"]
            assert await reader.read() == b""  # the connection is closed, not kept for the rest
            writer.close()
        page = await metrics(service)
        assert error_count(page, "receiver/claude_code", "body-timeout") == 3
        async with aiohttp.ClientSession() as s, s.post(
                f"http://127.0.0.1:{port}/hook", json={"hook_event_name": "Stop", "session_id": "after"}) as r:
            assert r.status == 200


async def test_a_body_that_trickles_in_within_the_bound_is_accepted(tmp_path):
    cfg = base_config(tmp_path, {"claude_code": {"endpoint": "127.0.0.1:0", "body_timeout": 30}})
    async with running(cfg) as service:
        port = service.receivers["claude_code"].port
        body = json.dumps({"hook_event_name": "SessionStart", "session_id": "slow", "source": "startup"}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        for i in range(0, len(body), 7):
            writer.write(body[i:i + 7])
            await writer.drain()
            await asyncio.sleep(0.02)
        status, _ = await response_of(reader)
        writer.close()
        assert status == 200
        assert [e["type"] for e in events(tmp_path) if e.get("session") == "slow"] == ["session.started"]


async def test_the_otlp_http_receiver_bounds_bodies_too(tmp_path):
    cfg = base_config(tmp_path, {"otlp": {**OTLP, "body_timeout": 0.5}})
    async with running(cfg) as service:
        reader, writer = await stalled(service.receivers["otlp"].http_port, "/v1/logs")
        status, body = await response_of(reader)
        writer.close()
        assert status == 408
        assert body["code"] == otlp_wire.INVALID_ARGUMENT and "0.5s" in body["message"]


def test_body_timeout_must_be_positive(tmp_path):
    from aep_collector.pipeline.config import ConfigError, parse
    for bad in (0, -1, "soon"):
        with pytest.raises(ConfigError, match="body_timeout"):
            parse(base_config(tmp_path, {"claude_code": {"endpoint": "127.0.0.1:0", "body_timeout": bad}}),
                  REGISTRY, "t.yaml")


# -- lone surrogates -----------------------------------------------------------------------------


def test_the_shared_decoder_replaces_lone_surrogates_in_keys_and_values():
    raw = rb'{"s\ud800":["x\udc00y",{"k":"\ud83d\ude00","deep":[["\udfff"]]}],"ok":"\u00e9"}'
    assert wire.loads(raw) == {"s\ufffd": ["x\ufffdy", {"k": "\U0001F600", "deep": [["\ufffd"]]}], "ok": "\u00e9"}
    assert wire.loads(raw.decode()) == wire.loads(raw)
    depth = wire.MAX_DEPTH  # the deepest body the decoder accepts (deeper: refused, naming it)
    deep = b"[" * depth + rb'"\ud800"' + b"]" * depth
    value = wire.loads(deep)
    for _ in range(depth):
        value = value[0]
    assert value == "\ufffd"


async def test_lone_surrogates_are_recorded_as_replacement_characters_never_lost(tmp_path):
    cfg = base_config(tmp_path, {"claude_code": {"endpoint": "127.0.0.1:0"}, "opencode": {"endpoint": "127.0.0.1:0"}},
                      ceiling="full")
    async with running(cfg) as service:
        cc, oc = service.receivers["claude_code"].port, service.receivers["opencode"].port
        async with aiohttp.ClientSession() as s:
            for port, raw in (
                (cc, rb'{"hook_event_name":"SessionStart","session_id":"a\ud800b","source":"startup"}'),
                (cc, rb'{"hook_event_name":"PreToolUse","session_id":"s1","tool_name":"Bash",'
                     rb'"tool_use_id":"t1","tool_input":{"command":"echo \udc00","\ud800key":1}}'),
                (oc, rb'{"kind":"bus","event":{"type":"session.created","properties":'
                     rb'{"info":{"id":"oc\udbff","title":"t\ud800"}}}}'),
            ):
                async with s.post(f"http://127.0.0.1:{port}/hook", data=raw,
                                  headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 200, await r.text()
    evs = events(tmp_path)
    assert not [e for e in evs if e["type"] == "error.raised"], evs
    started = [e for e in evs if e["type"] == "session.started"]
    assert {e["session"] for e in started} == {"a\ufffdb", "oc\ufffd"}
    assert all(e["source"].endswith("%EF%BF%BDb") or e["source"].endswith("oc%EF%BF%BD") for e in started)
    tool = next(e for e in evs if e["type"] == "tool.requested")
    assert tool["data"]["args"] == {"command": "echo \ufffd", "\ufffdkey": 1}
    # The files are valid UTF-8 end to end (read_jsonl decoded them strictly).
    assert (tmp_path / "logs" / "claude-code" / "a%EF%BF%BDb.jsonl").exists()


async def test_otlp_json_with_lone_surrogates_is_accepted_the_same_way(tmp_path):
    cfg = base_config(tmp_path, {"otlp": OTLP}, ceiling="full")
    raw = (rb'{"resourceLogs":[{"resource":{"attributes":[{"key":"bad\ud800key","value":{"stringValue":"v"}}]},'
           rb'"scopeLogs":[{"logRecords":[{"timeUnixNano":"1700000000000000000","attributes":['
           rb'{"key":"event.name","value":{"stringValue":"copilot_chat.session.start"}},'
           rb'{"key":"session.id","value":{"stringValue":"vs\udc00"}}]}]}]}]}')
    async with running(cfg) as service:
        port = service.receivers["otlp"].http_port
        async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/v1/logs", data=raw,
                                                        headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200, await r.text()
    assert {e["session"] for e in events(tmp_path)} == {"vs\ufffd"}


def test_a_reply_quoting_a_surrogate_still_encodes():
    response = json_response({"error": "invalid-payload", "detail": "bad name '\ud800'"}, 400)
    assert json.loads(response.body) == {"error": "invalid-payload", "detail": "bad name '\ud800'"}
    body = otlp_wire.encode_status(3, "bad key \ud800", otlp_wire.JSON)
    assert json.loads(body)["message"] == "bad key \ufffd"
    assert b"bad key \xef\xbf\xbd" in otlp_wire.encode_status(3, "bad key \ud800", otlp_wire.PROTOBUF)


# -- huge integers, bad numbers, odd bus types ---------------------------------------------------


async def test_an_integer_beyond_the_digit_limit_is_a_400_naming_it_on_every_receiver(tmp_path):
    receivers = {t: {"endpoint": "127.0.0.1:0"} for t in HOOK_RECEIVERS}
    receivers["otlp"] = OTLP
    cfg = base_config(tmp_path, receivers)
    huge = b"9" * 5000
    async with running(cfg) as service, aiohttp.ClientSession() as s:
        for name in HOOK_RECEIVERS:
            port = service.receivers[name].port
            for raw in (b'{"hook_event_name":"PreToolUse","session_id":"s","tool_input":{"n":' + huge + b"}}",
                        b'{"session_id":' + huge + b"}", b"[" + huge + b"]"):
                async with s.post(f"http://127.0.0.1:{port}/hook?hook=PreToolUse", data=raw) as r:
                    body = await r.json(content_type=None)
                    assert r.status == 400, (name, r.status, body)
                    assert body["error"] == "invalid-json" and "4300 digits" in body["detail"], (name, body)
            for raw in (b'{"a": 1e999}', b'{"a": NaN}', b'{"a": -Infinity}'):
                async with s.post(f"http://127.0.0.1:{port}/hook?hook=Stop", data=raw) as r:
                    assert r.status == 400 and (await r.json(content_type=None))["error"] == "invalid-json"
        port = service.receivers["otlp"].http_port
        for raw in (b'{"resourceLogs":[{"resource":{"attributes":[{"key":"a","value":{"intValue":' + huge + b"}}]}}]}",
                    b'{"resourceLogs":[], "x":' + huge + b"}"):
            async with s.post(f"http://127.0.0.1:{port}/v1/logs", data=raw,
                              headers={"Content-Type": "application/json"}) as r:
                body = await r.json(content_type=None)
                assert r.status == 400 and "4300 digits" in body["message"], body


@pytest.mark.parametrize("receiver", ["opencode", "kilocode"])
async def test_a_bus_event_type_that_is_not_a_string_is_a_400_naming_it(tmp_path, receiver):
    cfg = base_config(tmp_path, {receiver: {"endpoint": "127.0.0.1:0"}})
    async with running(cfg) as service, aiohttp.ClientSession() as s:
        port = service.receivers[receiver].port
        for bad in (["session.idle"], {"a": 1}, 7):
            for query in ("", "?name=session.idle"):
                body = {"kind": "bus", "event": {"type": bad, "properties": {"sessionID": "x"}}}
                async with s.post(f"http://127.0.0.1:{port}/hook{query}", json=body) as r:
                    reply = await r.json()
                    assert r.status == 400 and "event.type must be a string" in reply["detail"], reply
        # The valid event right after is recorded.
        good = {"kind": "bus", "event": {"type": "session.created", "properties": {"info": {"id": "ok"}}}}
        async with s.post(f"http://127.0.0.1:{port}/hook", json=good) as r:
            assert r.status == 200
    assert [e["session"] for e in events(tmp_path)] == ["ok"]
