"""The relay role against hostile or careless input and consumers, each on a real loopback server:
bad events are refused whole and named (HTTP 400 JSON, WebSocket error frame on a surviving
connection), a malformed token or resume header is a refusal or a defined position, never a 500,
a session dropped whole still gets its ``replay-exhausted``, a replay larger than ``hard_limit``
reaches a consumer that reads, and a consumer that stops reading is really disconnected.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.exporters.relay_server.server import Backlog, Outlet
from aep_collector.pipeline.validate import envelope_errors
from aep_collector.pipeline.wire import MAX_DEPTH

from tests.helpers import running
from tests.test_relay_server import TOKEN, config

AUTH = {"Authorization": f"Bearer {TOKEN}"}
POST = {**AUTH, "AEP-Version": "0.1"}
CORPUS = Path("/work/shared/aep/conformance/fixtures/invalid/cases.json")
ENVELOPE_CASES = ("unknown severity", "malformed traceparent", "extension attribute name over 20 chars",
                  "extension attribute with object value", "extension attribute name with illegal charset")


def ev(session: Any, seq: int, **extra: Any) -> dict[str, Any]:
    return {"aep": "0.1", "id": f"{session}-{seq}", "type": "progress.status", "time": "2026-01-01T00:00:00.000Z",
            "source": "aep://h/agent/x", "agent": "x", "session": session, "seq": seq, **extra}


def ndjson(events: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(e) for e in events) + "\n"


async def post(http: aiohttp.ClientSession, url: str, body: str,
               media: str = "application/x-ndjson") -> tuple[int, Any]:
    async with http.post(f"{url}/events", data=body.encode(), headers={**POST, "Content-Type": media}) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else await r.text())


async def replay(http: aiohttp.ClientSession, url: str, from_: Any = "all", **headers: str) -> str:
    params = {"live": "0", "from": from_ if from_ == "all" else json.dumps(from_)} if from_ is not None \
        else {"live": "0"}
    async with http.get(f"{url}/stream", params=params, headers={**AUTH, **headers}) as r:
        assert r.status == 200, await r.text()
        return (await r.read()).decode()


async def hello(ws: aiohttp.ClientWebSocketResponse, role: str = "both") -> None:
    await ws.send_json({"type": "hello", "versions": ["0.1"], "role": role, "identity": {"agent": "x"}})
    assert (await ws.receive_json(timeout=5))["type"] == "hello"


def deep(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(levels):
        node = {"a": node}
    return node


async def test_a_batch_with_one_bad_event_is_refused_whole_and_names_the_line(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            status, body = await post(http, url, ndjson([ev("s-partial", 1), ev({"not": "a string"}, 2)]))
            assert status == 400 and body["error"] == "invalid-event" and body["line"] == 1
            assert "session" in body["detail"]
            assert "id: s-partial:" not in await replay(http, url)  # line 0 was not ingested either
            assert (await post(http, url, ndjson([ev("s-partial", 1)])))[0] == 202  # and a good one is
            assert "id: s-partial:0:1" in await replay(http, url)


async def test_a_bad_event_on_the_websocket_gets_an_error_frame_and_the_connection_lives(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{url}/socket", headers=AUTH)
            await hello(ws)
            await ws.send_json({"type": "subscribe", "id": "keep", "filter": {"agent": "x"}})
            assert (await ws.receive_json(timeout=5))["type"] == "subscribed"
            await ws.send_json(dict(ev(["s"], 1), id="E1"))
            err = await ws.receive_json(timeout=5)
            assert (err["type"], err["code"], err["cause"]) == ("error", "invalid-event", "E1")
            await ws.send_str(json.dumps(deep(MAX_DEPTH + 5)))  # too deep to be decoded at all
            err = await ws.receive_json(timeout=5)
            assert err["code"] == "bad-json" and "nesting" in err["detail"]
            await ws.send_json(ev("ws-ok", 0))  # the connection and its subscription still work
            assert (await ws.receive_json(timeout=5))["id"] == "ws-ok-0"
            await ws.close()


def corpus_cases() -> list[tuple[str, dict[str, Any]]]:
    cases = [(c["name"], c["event"]) for c in json.loads(CORPUS.read_text())["cases"] if c["name"] in ENVELOPE_CASES]
    assert len(cases) == len(ENVELOPE_CASES)  # the corpus still has every case this test relies on
    base = ev("s1", 0)
    return cases + [("capture outside the enum", {**base, "capture": "everything"}),
                    ("integer session", {**base, "session": 7}), ("string data", {**base, "data": "text"}),
                    ("integer run", {**base, "run": 5}), ("time without an offset", {**base, "time": "2026-01-01T00:00:00"}),
                    ("source that is not a URI", {**base, "source": "not a uri"})]


async def test_the_relay_refuses_what_validate_events_refuses(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            for name, event in corpus_cases():
                assert envelope_errors(event), name  # the project's validator refuses it ...
                status, body = await post(http, url, json.dumps(event), "application/json")
                assert status == 400 and body["error"] == "invalid-event", (name, status, body)  # ... so does ingest
            assert "id:" not in await replay(http, url)


def raw_request(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
                  + b"Authorization: Bearer tok\xff\r\nAEP-Version: 0.1\r\n"
                  + b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_a_token_with_a_non_utf8_byte_is_refused_not_crashed_on(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        port = service.exporters["relay_server"].port
        for path, method in (("/stream", "GET"), ("/events", "POST"), ("/socket", "GET")):
            status, body = await asyncio.to_thread(raw_request, port, path, method)
            assert status == 401 and json.loads(body)["error"] == "unauthorized", (path, status, body)
        status, body = await asyncio.to_thread(raw_request, port, "/healthz")
        assert status == 200 and json.loads(body) == {"ok": True}


async def test_a_last_event_id_past_every_integer_resumes_after_everything(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            assert (await post(http, url, ndjson([ev("sess", i) for i in range(3)])))[0] == 202
            # An honoured header (so the next check can fail): strictly after seq 0.
            got = await replay(http, url, None, **{"Last-Event-ID": "sess:0:0"})
            assert "id: sess:0:1" in got and "id: sess:0:0\n" not in got
            # Longer than any integer an accepted event can hold: a position after all of them.
            got = await replay(http, url, None, **{"Last-Event-ID": "sess:" + "1" * 5000 + ":1"})
            assert "id:" not in got and got.endswith(": replay-complete\n\n")
            got = await replay(http, url, None, **{"Last-Event-ID": "sess:0:" + "9" * 5000})
            assert "id:" not in got


async def test_a_session_dropped_whole_still_tells_a_resume_it_missed_events(tmp_path: Path) -> None:
    async with running(config(tmp_path, max_sessions=2)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            await post(http, url, ndjson([ev("S1", i) for i in range(3)]) + ndjson([ev("S2", 0)]))
            await post(http, url, ndjson([ev("O1", 0), ev("O2", 0)]))  # S1 and S2 are dropped whole
            # S2 is not held at all: the marker says nothing up to its last position is left.
            assert await replay(http, url, [{"session": "S2", "seq": 0}]) == ": replay-complete\n\n"
            assert ": replay-exhausted S2 0:1" in await replay(http, url, [{"session": "S2"}])
            await post(http, url, ndjson([ev("S1", 3), ev("S1", 4)]))  # S1 comes back
            got = await replay(http, url, [{"session": "S1", "epoch": 0, "seq": 0}])
            assert got.index(": replay-exhausted S1 0:3") < got.index("id: S1:0:3") < got.index("id: S1:0:4")
            ws = await http.ws_connect(f"{url}/socket", headers=AUTH)
            await hello(ws, "consumer")
            await ws.send_json({"type": "subscribe", "id": "r", "from": [{"session": "S1", "seq": 0}]})
            frames = [await ws.receive_json(timeout=5) for _ in range(4)]
            assert frames[1] == {"type": "replay-exhausted", "sub": "r", "session": "S1",
                                 "earliest": {"epoch": 0, "seq": 3}}
            assert [f.get("seq") for f in frames[2:]] == [3, 4]
            await ws.close()


async def test_a_replay_larger_than_the_hard_limit_reaches_a_reading_consumer(tmp_path: Path) -> None:
    # ~600 KB held against a 64 KiB hard limit: the replay must stream, not queue.
    cfg = config(tmp_path, soft_limit=16 * 1024, hard_limit=64 * 1024)
    async with running(cfg) as service:
        url = service.exporters["relay_server"].url
        blob = "x" * 1000
        held = [ev(f"r{k}", i, severity="notice", data={"b": blob}) for k in range(4) for i in range(150)]
        async with aiohttp.ClientSession() as http:
            for k in range(4):
                assert (await post(http, url, ndjson(held[k * 150:(k + 1) * 150])))[0] == 202
            got = await replay(http, url)
            assert got.count("\nid: ") == len(held) and got.endswith(": replay-complete\n\n")
            ws = await http.ws_connect(f"{url}/socket", headers=AUTH, max_msg_size=0)
            await hello(ws, "consumer")
            await ws.send_json({"type": "subscribe", "id": "all", "from": "all"})
            assert (await ws.receive_json(timeout=5))["type"] == "subscribed"
            first = await ws.receive_json(timeout=5)
            # Live events posted while the replay is still being sent come after it, each once.
            late = [ev("r0", 150 + i, severity="notice") for i in range(20)]
            assert (await post(http, url, ndjson(late)))[0] == 202
            ids = [first["id"]]
            while len(ids) < len(held) + len(late):
                frame = await ws.receive_json(timeout=5)
                assert frame.get("type") != "closing", frame
                ids.append(frame["id"])
            assert ids == [e["id"] for e in held + late]
            await ws.close()


async def test_a_stalled_sse_subscriber_past_the_hard_limit_is_really_disconnected(tmp_path: Path) -> None:
    async with running(config(tmp_path, soft_limit=16 * 1024, hard_limit=64 * 1024)) as service:
        relay = service.exporters["relay_server"]
        server = relay._runner.server
        async with aiohttp.ClientSession() as http, aiohttp.ClientSession() as poster:
            r = await http.get(f"{relay.url}/stream", params={"filter": json.dumps({"agent": "slow"})}, headers=AUTH)
            r.connection.transport.pause_reading()  # the consumer stops reading
            blob = "x" * 16000
            for k in range(20):  # ~19 MB of error events: never shed, so the hard limit must trip
                batch = [dict(ev("slow", k * 60 + i, severity="error", data={"b": blob}), agent="slow")
                         for i in range(60)]
                assert (await post(poster, relay.url, ndjson(batch)))[0] == 202
            assert not relay.surface.streams
            for _ in range(100):  # the grace, then the server's side of the connection is gone
                if len(server.connections) <= 1:  # only the poster's keep-alive connection is left
                    break
                await asyncio.sleep(0.1)
            assert len(server.connections) <= 1, server.connections
            r.close()


async def test_an_event_nested_past_the_decoder_limit_is_refused(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            sub = await http.get(f"{url}/stream", params={"filter": json.dumps({"agent": "x"})}, headers=AUTH)
            too_deep = json.dumps(ev("d", 0, capture="full", data={})).replace(
                '"data": {}', '"data": ' + '{"a": ' * 1000 + "{}" + "}" * 1000)  # past json.dumps' own limit
            status, body = await post(http, url, too_deep, "application/json")
            assert status == 400 and body["error"] == "invalid-json" and "nesting" in body["detail"]
            # At the limit it is accepted, and down-levelled for this redacted subscriber without a crash.
            ok = ev("d", 1, capture="full", data=deep(MAX_DEPTH - 2))
            assert (await post(http, url, json.dumps(ok), "application/json"))[0] == 202
            line = await asyncio.wait_for(sub.content.readuntil(b"\n\n"), 5)
            assert b"id: d:0:1" in line and b"id: d:0:0" not in line
            sub.close()


@pytest.mark.parametrize("session", ["a\nid: evil:0:9\ndata: {}", "b\rx"])
async def test_line_breaks_in_an_event_never_split_its_sse_chunk(tmp_path: Path, session: str) -> None:
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        async with aiohttp.ClientSession() as http:
            sub = await http.get(f"{url}/stream", params={"filter": json.dumps({"agent": "x"})}, headers=AUTH)
            text = json.dumps(ev(session, 0)).replace(", ", ",\r")  # \r between tokens is JSON whitespace
            assert (await post(http, url, text, "application/json"))[0] == 202
            chunk = (await asyncio.wait_for(sub.content.readuntil(b"\n\n"), 5)).decode()
            lines = chunk.rstrip("\n").split("\n")
            assert [x.split(":", 1)[0] for x in lines] == ["event", "data"]  # no id: it cannot be one line
            assert "\r" not in chunk and json.loads(lines[1][6:])["session"] == session
            sub.close()


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "bEaReR"])
async def test_the_bearer_scheme_is_matched_whatever_its_case(tmp_path: Path, scheme: str) -> None:
    # RFC 7235 §2.1: the auth-scheme is case-insensitive; only the token itself is compared exactly.
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        auth = {"Authorization": f"{scheme} {TOKEN}"}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/stream", params={"live": "0"}, headers=auth) as r:
                assert r.status == 200 and (await r.text()) == ": replay-complete\n\n"
            async with http.post(f"{url}/events", data=json.dumps(ev("case", 0)),
                                 headers={**auth, "AEP-Version": "0.1", "Content-Type": "application/json"}) as r:
                assert r.status == 202
            async with http.get(f"{url}/healthz", headers=auth) as r:
                assert (await r.json())["sessions"] == 1
            ws = await http.ws_connect(f"{url}/socket", headers=auth)
            await hello(ws, "consumer")
            await ws.close()
            wrong = {"Authorization": f"{scheme} {TOKEN.upper()}"}
            async with http.get(f"{url}/stream", params={"live": "0"}, headers=wrong) as r:
                assert r.status == 401


async def test_a_consumer_that_subscribes_with_from_again_and_again_without_reading_waits_in_its_socket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``from`` subscription holds a snapshot of the buffers until it is sent: a consumer that
    never reads must not make the relay hold one per frame it sends."""
    held: list[int] = []
    queue_replay = Outlet.replay

    def replay(self: Outlet, backlog: Any) -> None:
        queue_replay(self, backlog)
        queued = [x for x in self.queue._queue if isinstance(x, Backlog)]  # type: ignore[attr-defined]
        held.append(len(queued) + (self.backlog is not None))

    monkeypatch.setattr(Outlet, "replay", replay)
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        blob = "x" * 2000
        async with aiohttp.ClientSession() as http:
            for k in range(4):  # ~8 MB held: more than the sockets between us buffer
                assert (await post(http, url, ndjson([ev(f"h{k}", i, data={"b": blob}) for i in range(1000)])))[0] == 202
            ws = await http.ws_connect(f"{url}/socket", headers=AUTH, max_msg_size=0)
            await hello(ws, "consumer")
            ws._response.connection.transport.pause_reading()  # type: ignore[union-attr]
            await ws.send_json({"type": "subscribe", "id": "everything", "from": "all"})
            for _ in range(100):  # each would snapshot all 4000 entries, to replay none of them
                await ws.send_json({"type": "subscribe", "id": "none", "from": "all", "filter": {"agent": "none"}})
            await ws.send_json({"type": "ping", "t": 7})
            ws._response.connection.transport.resume_reading()  # type: ignore[union-attr]
            events = 0
            while (frame := await ws.receive_json(timeout=30)).get("type") != "pong":
                events += frame.get("type") == "progress.status"
            assert events == 4000
            await ws.close()
    assert len(held) == 101 and max(held) <= 2, max(held)


async def test_an_unsubscribe_stops_the_replay_it_ends(tmp_path: Path) -> None:
    """A consumer that unsubscribes (or subscribes again under the same id) while a large replay of
    that subscription is still being sent does not get the rest of it."""
    async with running(config(tmp_path)) as service:
        url = service.exporters["relay_server"].url
        blob = "x" * 2000
        held = 15_000  # ~30 MB: more than the sockets between us buffer
        async with aiohttp.ClientSession() as http:
            for k in range(held // 1000):
                batch = [ev(f"u{k % 3}", k * 1000 + i, data={"b": blob}) for i in range(1000)]
                assert (await post(http, url, ndjson(batch)))[0] == 202
            for ending in ({"type": "unsubscribe", "id": "a"}, {"type": "subscribe", "id": "a", "filter": {"agent": "none"}}):
                ws = await http.ws_connect(f"{url}/socket", headers=AUTH, max_msg_size=0)
                await hello(ws, "consumer")
                ws._response.connection.transport.pause_reading()  # type: ignore[union-attr]
                await ws.send_json({"type": "subscribe", "id": "a", "from": "all"})
                await ws.send_json(ending)
                await ws.send_json({"type": "ping", "t": 1})
                ws._response.connection.transport.resume_reading()  # type: ignore[union-attr]
                events, frames = 0, []
                while (frame := await ws.receive_json(timeout=30)).get("type") != "pong":
                    if frame.get("type") == "progress.status":
                        events += 1
                    else:
                        frames.append(frame["type"])
                assert frames[-1] == ("unsubscribed" if ending["type"] == "unsubscribe" else "subscribed"), frames
                assert events < held, ending
                await ws.close()
