"""Test helpers: run a real collector in-process or as a subprocess, on loopback free ports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from aep_collector.pipeline.config import parse
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.service import Service

ROOT = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def running(raw: dict[str, Any], registry: Any = None) -> AsyncIterator[Service]:
    """Build and start a Service from a config dict; always shut it down."""
    if registry is None:
        registry, _ = build_registry(load_plugins=False)
    service = Service(parse(raw, registry, "test.yaml"), host_name="test-host")
    await service.start()
    try:
        yield service
    finally:
        await service.shutdown()


def base_config(tmp_path: Path, receivers: dict[str, Any] | None = None, ceiling: str = "metadata",
                extra_exporters: dict[str, Any] | None = None) -> dict[str, Any]:
    receivers = receivers or {"claude_code": {"endpoint": "127.0.0.1:0"}}
    exporters = {"jsonl": {"directory": str(tmp_path / "logs"), "fsync": "never"}, **(extra_exporters or {})}
    return {
        "receivers": receivers,
        "processors": {"mapping": None, "runs": None, "capture": {"ceiling": ceiling}},
        "exporters": exporters,
        "service": {"state_dir": str(tmp_path / "state"), "pipelines": {"agents": {
            "receivers": list(receivers), "processors": ["mapping", "runs", "capture"],
            "exporters": list(exporters)}}},
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


class Collector:
    """``aep-collector`` as a subprocess; the bound ports are read from its log."""

    def __init__(self, config: dict[str, Any], tmp_path: Path, env: dict[str, str] | None = None) -> None:
        self.path = tmp_path / f"collector-{time.monotonic_ns()}.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.ports: dict[str, int] = {}
        self.log: list[str] = []

    def start(self, timeout: float = 20.0) -> Collector:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aep_collector.pipeline.cli", "--config", str(self.path)],
            cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("collector exited early:\n" + "".join(self.log))
            self.log.append(line)
            m = re.search(r"(receiver/\S+) listening on \S+?:(\d+)", line)
            if m:
                self.ports[m.group(1)] = int(m.group(2))
            m = re.search(r"(receiver/\S+?): OTLP/(gRPC|HTTP) on (?:http://)?[^\s/]+:(\d+)", line)
            if m:
                self.ports[f"{m.group(1)}:{m.group(2).lower()}"] = int(m.group(3))
            m = re.search(r"relay role on http://[^\s]+:(\d+)", line)
            if m:
                self.ports["relay_server"] = int(m.group(1))
            if "aep-collector started" in line:
                return self
        raise RuntimeError("collector did not start in time:\n" + "".join(self.log))

    def stop(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.log.append(out or "")
        return self.proc.returncode


@contextlib.contextmanager
def collector(config: dict[str, Any], tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[Collector]:
    c = Collector(config, tmp_path, env).start()
    try:
        yield c
    finally:
        if c.proc is not None and c.proc.poll() is None:
            c.stop()


def race(path: Path, versions: list[bytes], write: Callable[[bytes], None], rounds: int = 10) -> list[str]:
    """Four writers, ``rounds`` writes each, and a reader: what the reader saw that no writer wrote."""
    seen: list[str] = []
    done = threading.Event()

    def writer(data: bytes) -> None:
        for _ in range(rounds):
            try:
                write(data)
            except OSError as exc:
                seen.append(type(exc).__name__)

    def reader() -> None:
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                data = path.read_bytes()
                if data not in versions:
                    seen.append(f"torn: {len(data)} bytes")

    threads = [threading.Thread(target=writer, args=(v,)) for v in versions]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    return seen


async def held_requests(router: Any, n: int = 1) -> list[str]:
    """Ids of the control router's held requests once ``n`` are pending (bounded polling)."""
    for _ in range(1000):
        if len(router.holds) >= n:
            return list(router.holds)
        await asyncio.sleep(0.01)
    raise AssertionError("no held request appeared")


async def timed_out_and_late_answer_refused(events: list[dict[str, Any]], operator: Any, session: str) -> None:
    """A held request asked for over ``control`` timed out, and a late operator answer grants nothing."""
    import pytest
    from aep_collector.pipeline.control import RESPOND
    from aep_sdk.control import NackError

    (req,) = [e for e in events if e["type"] == "attention.requested"]
    (timeout,) = [e for e in events if e["type"] == "attention.timeout"]
    assert timeout["subject"] == req["id"] and req["data"]["respond_via"] == ["control"]
    with pytest.raises(NackError) as info:
        await operator.send(RESPOND, session, subject=req["id"], data={"answer": {"option": "allow"}}, retries=0)
    assert info.value.reason == "refused"


def http_responses(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The HTTP/1.x responses in ``raw`` (what a raw socket read): status, lower-cased headers and
    body (by ``Content-Length``, else the rest); 1xx interim responses have none."""
    out: list[tuple[int, dict[str, str], bytes]] = []
    while raw.startswith(b"HTTP/"):
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            raise AssertionError(f"a response cut inside its headers: {raw[:300]!r}")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            body = b""
        elif "content-length" in headers:
            body, rest = rest[:int(headers["content-length"])], rest[int(headers["content-length"]):]
        else:
            body, rest = rest, b""
        out.append((status, headers, body))
        raw = rest
    return out


async def serve(app: Any) -> tuple[Any, int]:
    """Start the aiohttp ``app`` on a free loopback port: its runner (``cleanup()`` it) and the port."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@contextlib.asynccontextmanager
async def redirected_elsewhere(path: str, status: int, answer: Callable[[], Any]) -> AsyncIterator[tuple[str, list]]:
    """A receiver answering a POST to ``path`` with a ``status`` redirect to ``/elsewhere``, which
    takes any method and answers ``answer()`` (a success, were it reached): the URL to POST to, and
    what reached ``/elsewhere`` as (method, body, X-Api-Key header). Cleaned up on the way out."""
    from aiohttp import web

    elsewhere: list[tuple[str, bytes, str | None]] = []

    async def moved(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": "/elsewhere"})

    async def other(request: web.Request) -> web.Response:
        elsewhere.append((request.method, await request.read(), request.headers.get("X-Api-Key")))
        return answer()

    app = web.Application()
    app.router.add_post(path, moved)
    app.router.add_route("*", "/elsewhere", other)
    runner, port = await serve(app)
    try:
        yield f"http://127.0.0.1:{port}{path}", elsewhere
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def operator_console(url: str, token: str | None) -> AsyncIterator[Any]:
    """The official SDK's ``ControlClient`` as an operator console ("aep-console" on "ops-host"),
    connected to the relay at ``url`` with ``token``; closed on the way out."""
    from aep_sdk.aio import ControlClient

    client = ControlClient(url, agent="aep-console", host="ops-host", token=token)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()
