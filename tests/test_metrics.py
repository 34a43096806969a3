"""The metrics endpoint: Prometheus text with per-component counts and health gauges."""

from __future__ import annotations

import aiohttp

from tests.helpers import base_config, running


async def test_metrics_count_accepted_exported_and_refused(tmp_path):
    cfg = base_config(tmp_path)
    cfg["service"]["telemetry"] = {"metrics": {"endpoint": "127.0.0.1:0"}}
    async with running(cfg) as service:
        port = service.receivers["claude_code"].port
        async with aiohttp.ClientSession() as s:
            for name in ("SessionStart", "UserPromptSubmit"):
                async with s.post(f"http://127.0.0.1:{port}/hook", json={"session_id": "m", "hook_event_name": name}):
                    pass
            async with s.post(f"http://127.0.0.1:{port}/hook", data=b"{nope"):
                pass
            async with s.get(f"http://127.0.0.1:{service.metrics.port}/metrics") as r:
                assert r.status == 200 and r.content_type == "text/plain"
                text = await r.text()
    assert 'aep_collector_items_total{component="receiver/claude_code",outcome="accepted"} 2' in text
    assert 'aep_collector_items_total{component="exporter/jsonl",outcome="exported"} 2' in text
    assert 'aep_collector_items_total{component="receiver/claude_code",outcome="refused"} 1' in text
    assert "aep_collector_up 1" in text and "aep_collector_relay_connected 0" in text
    assert "aep_collector_sessions 1" in text

