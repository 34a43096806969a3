"""The collector's own log: no secret at any level; bad requests are one line per cause, counted.

The collector runs as a subprocess at ``debug`` level; its whole stderr is what is checked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import urllib.request

from aep_collector.pipeline.logs import RedactingFilter, Throttle, config_secrets

from tests.helpers import Collector, base_config
from tests.relay_double import RelayDouble

TOKEN = "aep-relay-7f3a9c2e1b5d4f60"
AWS_KEY = "AKIA" + "IOSFODNN7EXAMPLE"


def post(port: int, data: bytes) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/hook", data=data,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


BAD_HTTP = [b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n",
            b"NOT HTTP AT ALL\r\n\r\n",
            b"POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
            b"POST /hook HTTP/1.1\r\nBad Header Line\r\n\r\n"]


def send_raw(port: int, raw: bytes) -> bytes:
    """A malformed HTTP request; what the server answers before closing."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def hang_up(port: int) -> None:
    """Headers and half a body, then the client goes away."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"a\":")


async def test_debug_log_holds_no_secret_and_bad_requests_are_one_line_per_cause(tmp_path):
    relay = RelayDouble(token=TOKEN)
    await relay.start()
    try:
        cfg = base_config(tmp_path, extra_exporters={"relay": {"endpoint": relay.ws_url, "token": TOKEN}})
        cfg["service"]["telemetry"] = {"logs": {"level": "debug"}, "metrics": {"endpoint": "127.0.0.1:0"}}
        c = await asyncio.to_thread(Collector(cfg, tmp_path).start)  # the relay double keeps serving
        try:
            for _ in range(100):  # the relay connects with its Authorization header (logged at debug)
                if relay.connections():
                    break
                await asyncio.sleep(0.05)
            assert relay.connections(), "".join(c.log)
            port = c.ports["receiver/claude_code"]
            good = {"hook_event_name": "SessionStart", "session_id": "s1", "source": "startup"}
            assert await asyncio.to_thread(post, port, json.dumps(good).encode()) == 200
            for n in range(40):
                bad = f'{{"hook_event_name": "Stop", "token": "{TOKEN}", "aws": "{AWS_KEY}", "n": {n},'.encode()
                assert await asyncio.to_thread(post, port, bad) == 400
            for _ in range(15):
                await asyncio.to_thread(hang_up, port)
            for raw in BAD_HTTP * 4:
                await asyncio.to_thread(send_raw, port, raw)
            assert await asyncio.to_thread(post, port, b'{"session_id": ' + b"9" * 5000 + b"}") == 400
            await asyncio.sleep(0.3)
            metrics_port = int(re.search(r"metrics listening on \S+?:(\d+)", "".join(c.log)).group(1))
            page = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode())
        finally:
            assert await asyncio.to_thread(c.stop) == 0
    finally:
        await relay.stop()
    out = "".join(c.log)
    assert "level" in cfg["service"]["telemetry"]["logs"] and " DEBUG " in out  # debug really was on
    assert TOKEN not in out and AWS_KEY not in out
    assert "Traceback" not in out, out[-6000:]
    assert 'receiver="receiver/claude_code",cause="invalid-json"} 41' in page
    assert 'receiver="receiver/claude_code",cause="client-disconnected"} 15' in page
    lines = [line for line in out.splitlines() if "receiver/claude_code: invalid-json" in line]
    assert len(lines) == 1, lines  # one line per cause while the window lasts, not one per request
    assert len([line for line in out.splitlines() if "client-disconnected" in line]) == 1
    bad_http = re.search(r'receiver="receiver/claude_code",cause="bad-http"\} (\d+)', page)
    assert bad_http and int(bad_http.group(1)) >= 12, page  # counted, never a traceback (above)
    assert len([line for line in out.splitlines() if "WARNING" in line and ": bad-http: " in line]) == 1


def test_the_filter_redacts_messages_arguments_and_tracebacks():
    flt = RedactingFilter([TOKEN])
    record = logging.LogRecord("websockets.client", logging.DEBUG, __file__, 1, "> Authorization: %s %s",
                               ("Bearer", "abcdefghijklmnop1234"), None)
    assert flt.filter(record) and "abcdefghijklmnop1234" not in record.getMessage()
    try:
        raise ValueError(f"bad {TOKEN} and {AWS_KEY}")
    except ValueError:
        import sys
        record = logging.LogRecord("aep", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    flt.filter(record)
    text = logging.Formatter().format(record)
    assert TOKEN not in text and AWS_KEY not in text and "ValueError" in text


def test_config_secrets_finds_tokens_and_capture_secret_values(monkeypatch):
    from dataclasses import dataclass, field

    @dataclass
    class Relay:
        endpoint: str = "ws://x"
        token: str = TOKEN
        headers: dict = field(default_factory=lambda: {"X-Api-Key": "k-123456"})

    monkeypatch.setenv("MY_SECRET", "from-the-env")
    found = set(config_secrets([Relay(), {"secret_values": ["lit-secret"], "secret_env": ["MY_SECRET", "UNSET_X"]}]))
    assert found == {TOKEN, "k-123456", "lit-secret", "from-the-env"}


def test_throttle_writes_one_line_per_cause_and_says_how_many_were_suppressed(caplog):
    throttle = Throttle(logging.getLogger("aep.test"), window=3600)
    with caplog.at_level(logging.WARNING, "aep.test"):
        for _ in range(5):
            throttle("receiver/x", "invalid-json", "line 1 column 2: oops")
        throttle("receiver/x", "busy", "full")
        throttle.window = 0
        throttle("receiver/x", "invalid-json", "again")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["receiver/x: invalid-json: line 1 column 2: oops", "receiver/x: busy: full",
                        "receiver/x: invalid-json: again (4 more since the last line)"]


def test_the_filter_redacts_emails_and_homes_but_keeps_what_operators_read():
    """A vendor session id can hold an email (Kimi Code's `user@host:/path`): the log line keeps
    the rest of it for correlation. Phone-like numbers (timestamps, ports, counts) are not PII here."""
    flt = RedactingFilter()
    session = "alice.planted@example.com:/home/alice/work"
    record = logging.LogRecord("aep.late_calls", logging.WARNING, __file__, 1,
                               "kimi_code session %s: run ended with tool call(s) %s never reported",
                               (session, "call-for-bob.planted%40example.com"), None)
    assert flt.filter(record)
    message = record.getMessage()
    assert "planted" not in message and "alice" not in message
    assert message == ("kimi_code session [REDACTED:pii]:~/work: run ended with tool call(s) "
                       "[REDACTED:pii] never reported")
    kept = "metrics listening on 127.0.0.1:4318 at 2026-07-03 10:00:00, 1234567 events, +1 555 123 4567"
    record = logging.LogRecord("aep", logging.INFO, __file__, 1, kept, (), None)
    flt.filter(record)
    assert record.getMessage() == kept


async def test_debug_log_holds_no_credential_from_the_relay_url(tmp_path):
    """AEP-0003 §8.1: an ``access_token`` query MUST NOT be logged. At ``debug`` websockets prints the
    upgrade request line and headers, the Basic header it builds from the URL's user info included."""
    relay = RelayDouble(token=TOKEN)
    await relay.start()
    password = "pw-" + "d41d8cd98f00b204"
    url = relay.ws_url.replace("ws://", f"ws://operator:{password}@") + f"?access_token={TOKEN}"
    try:
        cfg = base_config(tmp_path, extra_exporters={"relay": {"endpoint": url}})
        cfg["service"]["telemetry"] = {"logs": {"level": "debug"}, "metrics": {"endpoint": "127.0.0.1:0"}}
        c = await asyncio.to_thread(Collector(cfg, tmp_path).start)
        try:
            for _ in range(100):
                if relay.connections():
                    break
                await asyncio.sleep(0.05)
            assert relay.connections(), "".join(c.log)
        finally:
            assert await asyncio.to_thread(c.stop) == 0
    finally:
        await relay.stop()
    out = "".join(c.log)
    assert "> GET " in out  # websockets' request dump was on
    basic = __import__("base64").b64encode(f"operator:{password}".encode()).decode()
    for secret in (TOKEN, password, basic, basic.rstrip("=")):
        assert secret not in out
