"""The ``nats`` exporter against a real single-node nats-server with JetStream.

Events read back from the stream with the official client; commands sent with a plain NATS
request, as the gateway does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import nats
import orjson
import pytest
from aep_collector.exporters.nats import NatsExporter, NatsExporterConfig
from aep_collector.pipeline.component import CreateSettings
from aep_collector.pipeline.config import ConfigError, parse
from aep_collector.pipeline.control import ControlRouter
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.host import Health, Host
from aep_collector.pipeline.natsconn import (
    AGENT_HEADER,
    CONTROL_HEADER,
    Link,
    NatsConnection,
    NatsStream,
    event_subject,
    token,
)
from aep_collector.pipeline.registry import build_registry
from nats.js import api
from nats.js.errors import NotFoundError

from tests.helpers import base_config, read_jsonl, running
from tests.nats_support import NatsNode
from tests.relay_double import wait_until

CC = "claude-code"


def make_exporter(url: str, tmp_path: Path, **overrides: Any) -> tuple[NatsExporter, Host]:
    stream = NatsStream(**overrides.pop("stream", {}))
    cfg = NatsExporterConfig(connection=NatsConnection(servers=[url], reconnect_wait=0.1),
                             stream=stream, collector="edge-a", **overrides)
    host = Host(health=Health(), state_dir=tmp_path / "state")
    host.control = ControlRouter(host.health)
    return NatsExporter(CreateSettings(id="nats"), cfg), host


def events(stamper: Stamper, session: str | None, n: int, agent: str = CC) -> list[dict[str, Any]]:
    kind = "progress.status" if session else "agent.started"
    return [stamper.stamp({"type": kind, "agent": agent, "session": session, "data": {"n": i}})
            for i in range(n)]


async def stored(url: str, stream: str = "AEP_EVENTS", subject: str = ">") -> list[Any]:
    """Every message of ``stream`` (optionally one subject), in stream order."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return []
        out: list[Any] = []
        if not info.state.messages:
            return out
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            if subject == ">" or msg.subject == subject:
                out.append(msg)
        return out
    finally:
        await nc.close()


def test_tokens_are_single_safe_and_distinct() -> None:
    names = ["claude-code", "a.b", "a*", ">", "a b", "a\tb", "x~2Ey", "ünï", "", "a.b.>", "$JS", "a~"]
    toks = [token(n) for n in names]
    assert len(set(toks)) == len(toks)
    for t in toks:
        assert t and not any(c in t for c in ".*> \t\r\n"), t
    assert token("claude-code") == "claude-code" and token("a.b") == "a~2Eb"
    assert event_subject("aep.events", "codex", "s.1 *") == "aep.events.codex.s~2E1~20~2A"
    assert event_subject("aep.events", "codex", None) == "aep.events.codex.~"


@pytest.mark.parametrize(("raw", "message"), [
    ({"connection": {"servers": ["http://x:1"]}}, "nats://host:port"),
    ({"connection": {"token": "t", "user": "u"}}, "one authentication method"),
    ({"connection": {"tls_cert": "/nope.pem"}}, "go together"),
    ({"connection": {"creds": "/no/such.creds"}}, "no such file"),
    ({"stream": {"replicas": 2}}, "replicas must be 1, 3 or 5"),
    ({"stream": {"subject_prefix": "aep.*"}}, "subject_prefix"),
    ({"control_prefix": "aep.>"}, "control_prefix"),
    ({"control_prefix": "aep.events.control"}, "inside subject_prefix"),
    ({"control_prefix": "fleet", "stream": {"subject_prefix": "fleet"}}, "inside subject_prefix"),
    ({"max_in_flight": 0}, "max_in_flight"),
])
def test_bad_configs_are_refused_by_name(raw: dict[str, Any], message: str, tmp_path: Path) -> None:
    registry, _ = build_registry(load_plugins=False)
    doc = {"receivers": {"claude_code": None}, "processors": {"mapping": None}, "exporters": {"nats": raw},
           "service": {"state_dir": str(tmp_path), "pipelines": {"a": {"receivers": ["claude_code"],
                                                                       "processors": ["mapping"],
                                                                       "exporters": ["nats"]}}}}
    with pytest.raises(ConfigError, match="exporters.nats") as err:
        parse(doc, registry)
    assert message in str(err.value)


def test_tls_files_tls_cannot_load_are_refused_by_name_at_config_load(tmp_path: Path) -> None:
    """Not only missing files: a CA bundle or a key pair TLS cannot use, named, before start."""
    import subprocess

    registry, _ = build_registry(load_plugins=False)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    key, cert, other = tmp_path / "k.pem", tmp_path / "c.pem", tmp_path / "other.pem"
    for k in (key, other):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(k), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=nats.test"], check=True, capture_output=True)
    for connection, message in [({"tls_ca": str(garbage)}, "tls_ca"),
                                ({"tls_cert": str(cert), "tls_key": str(key)}, "tls_cert"),  # another cert's key
                                ({"tls_cert": str(garbage), "tls_key": str(garbage)}, "tls_cert")]:
        doc = {"receivers": {"nats": {"connection": connection}}, "exporters": {"jsonl": {"directory": str(tmp_path)}},
               "service": {"state_dir": str(tmp_path), "pipelines": {"g": {"receivers": ["nats"],
                                                                           "exporters": ["jsonl"]}}}}
        with pytest.raises(ConfigError, match="receivers.nats") as err:
            parse(doc, registry)
        assert message in str(err.value), str(err.value)


def test_auth_and_tls_options_reach_the_client(tmp_path: Path) -> None:
    seed = tmp_path / "user.nk"
    seed.write_text("SUAEXAMPLE")
    ca = tmp_path / "ca.pem"
    import ssl
    import subprocess
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=nats.test"], check=True, capture_output=True)
    ca.write_bytes(cert.read_bytes())
    opts = NatsConnection(servers=["tls://nats.test:4222"], nkey_seed=str(seed), tls_ca=str(ca),
                          tls_cert=str(cert), tls_key=str(key), tls_hostname="nats.test").options()
    assert opts["nkeys_seed"] == str(seed) and isinstance(opts["tls"], ssl.SSLContext)
    assert opts["tls_hostname"] == "nats.test" and opts["max_reconnect_attempts"] == -1
    assert "token" not in opts and "user_credentials" not in opts
    assert NatsConnection(token="").options().get("token") is None  # ${env:TOKEN:-} unset
    assert NatsConnection(token="t0k").options()["token"] == "t0k"
    assert "tls" not in NatsConnection().options()


async def test_events_land_on_per_session_subjects_in_order_with_msg_ids(node: NatsNode, tmp_path: Path) -> None:
    exp, host = make_exporter(node.url, tmp_path, stream={"replicas": 1, "max_age": 3600.0, "max_msgs": 10_000,
                                                         "retention": "limits"})
    stamper = Stamper(tmp_path / "st", "edge-host")
    await exp.start(host)
    try:
        a = events(stamper, "sess.one *", 300)
        b = events(stamper, "s2", 5, agent="codex")
        interleaved = [e for pair in zip(a[:5], b, strict=True) for e in pair] + a[5:]
        await exp.deliver(interleaved)
        await exp.deliver(events(stamper, None, 1))
        assert host.health.snapshot()["ok"]
        nc = await nats.connect(node.url)
        info = await nc.jetstream().stream_info("AEP_EVENTS")
        await nc.close()
        assert info.config.subjects == ["aep.events.>"] and info.config.num_replicas == 1
        assert info.config.max_age == 3600.0 and info.config.max_msgs == 10_000
        assert info.config.retention == api.RetentionPolicy.LIMITS and info.state.messages == 306
        msgs = await stored(node.url, subject="aep.events.claude-code.sess~2Eone~20~2A")
        assert [orjson.loads(m.data)["id"] for m in msgs] == [e["id"] for e in a]
        assert [m.headers["Nats-Msg-Id"] for m in msgs] == [e["id"] for e in a]
        assert all(m.headers[CONTROL_HEADER] == "aep.control.edge-a" for m in msgs)
        assert [orjson.loads(m.data)["seq"] for m in msgs] == list(range(300))
        assert [orjson.loads(m.data) for m in await stored(node.url, subject="aep.events.codex.s2")] == b
        assert len(await stored(node.url, subject="aep.events.claude-code.~")) == 1
    finally:
        await exp.shutdown()


@pytest.mark.parametrize("in_flight", [1, 512])
async def test_a_resent_batch_is_stored_once(node: NatsNode, tmp_path: Path, in_flight: int) -> None:
    exp, host = make_exporter(node.url, tmp_path, max_in_flight=in_flight)
    await exp.start(host)
    try:
        batch = events(Stamper(tmp_path / "st", "h"), "s", 40)
        await exp.deliver(batch)
        await exp.deliver(batch[10:] + events(Stamper(tmp_path / "st2", "h"), "t", 2))
        msgs = await stored(node.url)
        assert [m.headers["Nats-Msg-Id"] for m in msgs] == [e["id"] for e in batch] + [
            m.headers["Nats-Msg-Id"] for m in msgs[40:]]
        assert len(msgs) == 42
        assert host.health.counters[("exporter/nats", "deduplicated")] == 30
    finally:
        await exp.shutdown()


async def test_nats_absent_at_start_then_up_delivers_everything(tmp_path: Path) -> None:
    node = NatsNode(tmp_path)
    exp, host = make_exporter(node.url, tmp_path, publish_timeout=0.3)
    await exp.start(host)
    try:
        batch = events(Stamper(tmp_path / "st", "h"), "s", 50)
        with pytest.raises(ConnectionError):
            await exp.deliver(batch)  # the sending queue keeps the batch and retries it
        assert "nats-down" in host.health.snapshot()["problems"]["exporter/nats"]
        pending = asyncio.create_task(exp.export(batch))  # the memory queue's path retries itself
        node.start()
        await asyncio.wait_for(pending, 30)
        assert [m.headers["Nats-Msg-Id"] for m in await stored(node.url)] == [e["id"] for e in batch]
        assert host.health.snapshot()["ok"]
    finally:
        await exp.shutdown()
        node.kill()


async def post(port: int, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/hook", json=body) as r:
        return r.status, await r.json()


async def test_a_held_permission_is_answered_over_nats_and_re_acks_are_byte_identical(
        node: NatsNode, tmp_path: Path) -> None:
    cfg = base_config(tmp_path, extra_exporters={"nats": {
        "connection": {"servers": [node.url]}, "collector": "edge-a"}})
    async with running(cfg) as service:
        port = service.receivers["claude_code"].port
        assert (await post(port, {"session_id": "s1", "hook_event_name": "SessionStart", "source": "startup"}))[0] == 200
        await wait_until(lambda: service.host.control.route_live(CC), "the NATS control route to go live")
        hook = asyncio.create_task(post(port, {"session_id": "s1", "hook_event_name": "PermissionRequest",
                                               "tool_name": "Bash", "tool_input": {"command": "ls"},
                                               "tool_use_id": "toolu_1"}))

        async def requested() -> list[Any]:
            return [m for m in await stored(node.url) if orjson.loads(m.data)["type"] == "attention.requested"]

        msgs: list[Any] = []
        for _ in range(500):
            msgs = await requested()
            if msgs and service.host.control.holds:
                break
            await asyncio.sleep(0.02)
        (req,) = msgs
        assert req.headers["Aep-Accepts"] == '["control.attention.respond", "control.cancel"]'
        rid = orjson.loads(req.data)["id"]

        def command(cid: str, subject: str) -> bytes:
            return orjson.dumps({"aep": "0.1", "id": cid, "type": "control.attention.respond",
                                 "source": "aep://ops/agent/aep-console", "agent": "aep-console",
                                 "session": "s1", "time": "2026-12-03T08:00:00.000Z", "subject": subject,
                                 "data": {"answer": {"option": "allow"}}})

        nc = await nats.connect(node.url)
        try:
            to = req.headers[CONTROL_HEADER]
            assert to == "aep.control.edge-a"
            stray = await nc.request(to, command("01JCMD000000000000000000AA", "01JNOSUCH"), timeout=5,
                                     headers={AGENT_HEADER: CC})
            first = await nc.request(to, command("01JCMD000000000000000000AB", rid), timeout=5,
                                     headers={AGENT_HEADER: CC})
            status, reply = await asyncio.wait_for(hook, 10)
            again = await nc.request(to, command("01JCMD000000000000000000AB", rid), timeout=5,
                                     headers={AGENT_HEADER: CC})
            bad = await nc.request(to, b"{not json", timeout=5, headers={AGENT_HEADER: CC})
        finally:
            await nc.close()
        (nack,) = [orjson.loads(line) for line in stray.data.split(b"\n")]
        assert nack["type"] == "control.rejected" and nack["data"]["reason"] == "refused"
        (ack,) = [orjson.loads(line) for line in first.data.split(b"\n")]
        assert ack["type"] == "control.accepted" and ack["cause"] == "01JCMD000000000000000000AB"
        assert status == 200 and reply["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
        assert again.data == first.data  # the recorded ack, byte for byte; decided once
        assert bad.data == b"" and bad.headers["Aep-Error"].startswith("invalid")
        history = read_jsonl(tmp_path / "logs" / CC / "s1.jsonl")
        assert [e["type"] for e in history].count("control.accepted") == 1
    assert not service.host.control.route_live(CC)


def _tls_node(tmp_path: Path) -> tuple[NatsNode, Path]:
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    node = NatsNode(tmp_path, extra=["--auth", "s3cret-fleet", "--tls", "--tlscert", str(cert),
                                     "--tlskey", str(key)]).start()
    return node, cert


async def test_closing_a_link_the_server_keeps_refusing_never_hangs(tmp_path: Path) -> None:
    """nats-py's connect loop can swallow the cancellation ``close`` sends and then retry a refused
    token for ever (a CI run hung on it for ten minutes): close must end it, every time."""
    import random

    node, cert = _tls_node(tmp_path)
    try:
        rng = random.Random(16)
        for _ in range(20):
            link = Link(NatsConnection(servers=[f"tls://127.0.0.1:{node.port}"], token="not-it",
                                       tls_ca=str(cert), reconnect_wait=0.1, connect_timeout=1.0),
                        _never_up, lambda detail: None)
            link.start("nats:refused")
            await asyncio.sleep(rng.uniform(0.0, 0.5))  # close lands at a different point of the loop each time
            closing = asyncio.ensure_future(link.close())
            done, _ = await asyncio.wait({closing}, timeout=5.0)
            assert done, "Link.close did not return within 5 s while the server refused the token"
            assert link._task is not None and link._task.done(), "the connect loop is still running"
    finally:
        node.kill()


async def _never_up(nc: Any) -> None:
    raise AssertionError("a refused token never connects")


async def test_token_auth_and_tls_against_a_real_server(tmp_path: Path) -> None:
    node, cert = _tls_node(tmp_path)
    try:
        url = f"tls://127.0.0.1:{node.port}"
        stamper = Stamper(tmp_path / "st", "h")
        wrong = NatsExporter(CreateSettings(id="nats"), NatsExporterConfig(
            connection=NatsConnection(servers=[url], token="not-it", tls_ca=str(cert), reconnect_wait=0.1,
                                      connect_timeout=1.0),
            publish_timeout=0.5))
        host = Host(health=Health(), state_dir=tmp_path / "w")
        await wrong.start(host)
        with pytest.raises(ConnectionError):
            await wrong.deliver(events(stamper, "s", 1))
        assert "nats-down" in host.health.snapshot()["problems"]["exporter/nats"]
        await wrong.shutdown()
        right = NatsExporter(CreateSettings(id="nats"), NatsExporterConfig(
            connection=NatsConnection(servers=[url], token="s3cret-fleet", tls_ca=str(cert))))
        await right.start(Host(health=Health(), state_dir=tmp_path / "r"))
        batch = events(stamper, "s", 3)
        await right.deliver(batch)
        await right.shutdown()
        ctx = NatsConnection(servers=[url], token="s3cret-fleet", tls_ca=str(cert)).options()
        nc = await nats.connect(**{k: ctx[k] for k in ("servers", "token", "tls")})
        try:
            assert (await nc.jetstream().stream_info("AEP_EVENTS")).state.messages == 3
        finally:
            await nc.close()
    finally:
        node.kill()
