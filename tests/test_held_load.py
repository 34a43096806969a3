"""Many held requests at once: every one gets its neutral reply, and nothing of it stays behind.

2,000 Claude Code PermissionRequests are held at once (a relay route is live, nobody answers);
each must time out into its neutral ``{}`` with its ``attention.timeout`` recorded, and afterwards
no hold, watched connection or in-flight request may remain. (How late the replies are is
measured by ``bench/bench_held.py``, not asserted here.)
"""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp

from tests.helpers import base_config, read_jsonl, running
from tests.relay_double import RelayDouble, wait_until

HOLDS = 2000


async def test_two_thousand_held_permission_requests_all_get_their_neutral_reply(tmp_path):
    relay = RelayDouble()
    await relay.start()
    cfg = base_config(tmp_path, {"claude_code": {"endpoint": "127.0.0.1:0", "attention_timeout": 1.0,
                                                 "max_concurrent_requests": HOLDS + 100}},
                      extra_exporters={"relay": {"endpoint": relay.ws_url}})
    cfg["service"]["limits"] = {"max_held_requests": HOLDS + 100}
    try:
        async with running(cfg) as service:
            receiver = service.receivers["claude_code"]
            control = service.host.control
            await wait_until(lambda: control.route_live("claude-code"), "a live control route")
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=600)) as s:
                async def one(n: int) -> tuple[int, object]:
                    body = {"hook_event_name": "PermissionRequest", "session_id": f"load-{n % 20}",
                            "tool_name": "Bash", "tool_use_id": f"call-{n}", "tool_input": {"command": f"echo {n}"}}
                    async with s.post(f"http://127.0.0.1:{receiver.port}/hook", json=body) as r:
                        return r.status, await r.json()
                replies = await asyncio.gather(*(one(n) for n in range(HOLDS)))
            assert Counter(status for status, _ in replies) == {200: HOLDS}
            assert all(body == {} for _, body in replies)  # Claude Code's neutral reply: it asks the user
            # The requests are closed: nothing held, watched or in flight.
            assert control.holds == {}
            assert receiver.surface.loop._watched == {} and receiver.surface.calls == {}
            await wait_until(lambda: not receiver.inflight, "the hook requests to finish")
    finally:
        await relay.stop()
    events = [e for f in (tmp_path / "logs" / "claude-code").glob("load-*.jsonl") for e in read_jsonl(f)]
    kinds = Counter(e["type"] for e in events)
    assert kinds["attention.requested"] == HOLDS and kinds["attention.timeout"] == HOLDS
    requested = {e["id"] for e in events if e["type"] == "attention.requested"}
    assert {e["cause"] for e in events if e["type"] == "attention.timeout"} == requested
