"""Every HTTP surface refuses a request aiohttp cannot parse with the same JSON body: the hook
servers (tests/test_hook_hardening.py), OTLP/HTTP and the relay role, here, each over a raw socket."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.helpers import running
from tests.test_hook_hardening import assert_json_refusals
from tests.test_otlp_receiver import running as running_otlp
from tests.test_relay_server import TOKEN, config


async def test_otlp_http_refuses_an_unparsable_request_with_a_json_body() -> None:
    async with running_otlp() as (receiver, _sink, host):
        port = receiver.http_port
        await assert_json_refusals("otlp", port)
        async with aiohttp.ClientSession() as http:  # still serving
            async with http.post(f"http://127.0.0.1:{port}/v1/logs", data=b"{}",
                                 headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 200
        assert host.health.snapshot()["ok"] is True


async def test_the_relay_role_refuses_an_unparsable_request_with_a_json_body(tmp_path: Path) -> None:
    async with running(config(tmp_path)) as service:
        exporter = service.exporters["relay_server"]
        await assert_json_refusals("relay_server", exporter.port)
        async with aiohttp.ClientSession() as http:  # still serving
            async with http.get(f"{exporter.url}/healthz", headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                assert resp.status == 200
