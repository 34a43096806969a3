"""Every HTTP surface refuses a request aiohttp cannot parse with the same JSON body: the hook
servers (tests/test_hook_hardening.py), OTLP/HTTP and the relay role, here, each over a raw socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from tests.helpers import running
from tests.test_hook_hardening import MALFORMED, exchange, http_responses
from tests.test_otlp_receiver import running as running_otlp
from tests.test_relay_server import TOKEN, config


def assert_json_refusals(where: str, port: int, answers_by_case: dict[str, bytes]) -> None:
    for name, raw in answers_by_case.items():
        answers = http_responses(raw)
        assert answers, (where, name)
        for status, headers, body in answers:
            assert status == 400, (where, name, status, body)
            assert headers["content-type"].startswith("application/json"), (where, name, headers)
            refusal = json.loads(body)
            assert refusal["error"] == "bad-http", (where, name, refusal)
            assert refusal["detail"].startswith("malformed HTTP request: "), (where, name, refusal)


async def answers(port: int) -> dict[str, bytes]:
    return {name: await asyncio.to_thread(exchange, port, raw) for name, raw in MALFORMED.items()}


async def test_otlp_http_refuses_an_unparsable_request_with_a_json_body() -> None:
    async with running_otlp() as (receiver, _sink, host):
        port = receiver.http_port
        assert_json_refusals("otlp", port, await answers(port))
        async with aiohttp.ClientSession() as http:  # still serving
            async with http.post(f"http://127.0.0.1:{port}/v1/logs", data=b"{}",
                                 headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200
        assert host.health.snapshot()["ok"] is True


async def test_the_relay_role_refuses_an_unparsable_request_with_a_json_body(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        exporter = service.exporters["relay_server"]
        assert_json_refusals("relay_server", exporter.port, await answers(exporter.port))
        async with aiohttp.ClientSession() as http:  # still serving
            async with http.get(f"{exporter.url}/healthz", headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                assert resp.status == 200
