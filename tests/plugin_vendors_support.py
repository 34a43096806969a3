"""Shared helpers of the tests/test_plugin_vendors_*.py files: a running collector, posts, the JSONL, Node."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
from aep_sdk.control import ControlSender
from aiohttp import web

from tests.helpers import ROOT, base_config, held_requests, read_jsonl

VENDORS = ("opencode", "kilocode", "cline", "hermes", "pi")
AGENTS = {"opencode": "opencode", "kilocode": "kilocode", "cline": "cline", "hermes": "hermes", "pi": "pi"}
FIXTURES = {"opencode": "mappings/opencode.json", "kilocode": "mappings/kilocode.json",
            "cline": "mappings/cline.json", "hermes": "mappings/hermes.json", "pi": "mappings/pi.json"}
JS = ROOT / "receivers" / "plugin_vendors" / "js"
DRIVER = ROOT / "tests" / "js" / "drive.mjs"
NODE = shutil.which("node")
BUILDER = ControlSender(lambda _c: None, agent="operator", host="ops")
PLUGINS = {"opencode": "opencode-plugin.js", "kilocode": "kilocode-plugin.js"}


def receivers(**overrides: dict[str, Any]) -> dict[str, Any]:
    """Every receiver of this issue on a free loopback port, with per-vendor overrides."""
    return {v: {"endpoint": "127.0.0.1:0", **overrides.get(v, {})} for v in VENDORS}


def config(tmp_path: Path, extra_exporters: dict[str, Any] | None = None, **overrides: dict[str, Any]) -> dict[str, Any]:
    return base_config(tmp_path, receivers=receivers(**overrides), extra_exporters=extra_exporters)


def project(event: dict[str, Any], with_step: bool = True) -> dict[str, Any]:
    """What the mapping fixtures compare: ``{type, data, subject?, step?}``."""
    out = {"type": event["type"], "data": event.get("data", {})}
    if "subject" in event:
        out["subject"] = event["subject"]
    if with_step and "step" in event:
        out["step"] = event["step"]
    return out


def strip(expected: Any) -> Any:
    if isinstance(expected, dict):
        return {k: strip(v) for k, v in expected.items() if k != "$comment"}
    if isinstance(expected, list):
        return [strip(v) for v in expected]
    return copy.deepcopy(expected)


def respond(subject: str, session: str, **answer: Any) -> dict[str, Any]:
    return BUILDER.build("control.attention.respond", session, subject=subject, data={"answer": answer})


class Env:
    """A running in-process collector with this issue's receivers."""

    def __init__(self, service: Any, tmp_path: Path) -> None:
        self.service, self.tmp_path = service, tmp_path
        self.router = service.host.control

    def port(self, vendor: str) -> int:
        return self.service.receivers[vendor].port

    def url(self, vendor: str, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port(vendor)}{path}"

    async def post(self, vendor: str, body: Any, params: dict[str, str] | None = None,
                   headers: dict[str, str] | None = None, path: str = "/hook") -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.post(self.url(vendor, path), json=body, params=params,
                                                         headers=headers) as r:
            raw = await r.read()
            return r.status, json.loads(raw) if raw else None

    async def get(self, vendor: str, path: str) -> Any:
        async with aiohttp.ClientSession() as s, s.get(self.url(vendor, path)) as r:
            return await r.json()

    def events(self, agent: str) -> list[dict[str, Any]]:
        """Every event of ``agent`` in the JSONL files, file by file, each file in emission order."""
        root = self.tmp_path / "logs" / agent
        out: list[dict[str, Any]] = []
        for path in sorted(root.glob("*.jsonl")) if root.exists() else []:
            out.extend(read_jsonl(path))
        return out

    def session(self, agent: str, session: str) -> list[dict[str, Any]]:
        path = self.tmp_path / "logs" / agent / f"{session}.jsonl"
        return read_jsonl(path) if path.exists() else []

    def since(self, agent: str, seen: set[str]) -> list[dict[str, Any]]:
        return [e for e in self.events(agent) if e["id"] not in seen]

    def ids(self, agent: str) -> set[str]:
        return {e["id"] for e in self.events(agent)}

    async def held(self, n: int = 1) -> list[str]:
        """Ids of the held requests once ``n`` are pending (bounded polling)."""
        return await held_requests(self.router, n)


async def node(plugin: str, scenario: dict[str, Any], env: dict[str, str] | None = None,
               bound: float = 60.0) -> dict[str, Any]:
    """Run the Node driver on ``js/<plugin>`` with ``scenario``; its JSON report."""
    assert NODE is not None
    proc = await asyncio.create_subprocess_exec(
        NODE, str(DRIVER), str(JS / plugin), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(scenario).encode()), bound)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the vendor-side halves' host calls, and a stand-in Kilo server -------------------------------------


def step(moment: dict[str, Any]) -> dict[str, Any]:
    """The host call that produces ``moment``: the hook and the arguments the vendor passes it."""
    m = copy.deepcopy(moment)
    if m["kind"] == "bus":
        return {"hook": "event", "args": [{"event": m["event"]}]}
    if m["kind"] == "permission.ask":
        return {"hook": "permission.ask", "args": [m["permission"], {"status": "ask"}]}
    hook = "tool.execute.before" if m["kind"] == "tool.before" else "tool.execute.after"
    return {"hook": hook, "args": [m["input"], m["output"]]}


def scenario(vendor: str, steps: list[dict[str, Any]], url: str, **options: Any) -> dict[str, Any]:
    inp = {"directory": "/home/user/proj"} if vendor == "kilocode" else {}
    return {"host": "plugin", "input": {**inp, **options.pop("input", {})}, "options": {"url": url, **options},
            "steps": steps}


class KiloServer:
    """A stand-in for Kilo's server: records the reply-route POSTs."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.calls: list[tuple[str, dict[str, Any], str | None]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _route(self, request: web.Request) -> web.Response:
        self.calls.append((request.path, await request.json(), request.headers.get("x-kilo-directory")))
        return web.json_response(True, status=self.status)

    async def __aenter__(self) -> KiloServer:
        app = web.Application()
        app.router.add_post("/permission/{pid}/reply", self._route)
        app.router.add_post("/question/{rid}/reply", self._route)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def called(self, n: int = 1) -> None:
        for _ in range(500):
            if len(self.calls) >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the reply route was never called")


def headers(server: KiloServer, directory: str = "/home/user/proj ü") -> dict[str, str]:
    from urllib.parse import quote

    return {"X-AEP-Server-Url": quote(server.url, safe=""), "X-AEP-Directory": quote(directory, safe="")}
