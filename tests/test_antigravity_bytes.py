"""Antigravity's neutral replies are byte-exact over plain HTTP, not just equal as JSON."""

from __future__ import annotations

import aiohttp
import pytest

from tests.helpers import base_config, running


@pytest.mark.parametrize(("hook", "raw"), [("PreToolUse", b'{"decision": ""}'), ("Stop", b'{"decision": ""}'),
                                           ("PostToolUse", b"{}"), ("PreInvocation", b"{}")])
async def test_neutral_reply_bytes(tmp_path, hook, raw):
    cfg = base_config(tmp_path, receivers={"antigravity": {"endpoint": "127.0.0.1:0"}})
    async with running(cfg) as service:
        port = service.receivers["antigravity"].port
        body = {"conversationId": "c1", "stepIdx": 1, "toolCall": {"name": "run_command", "args": {}}}
        async with aiohttp.ClientSession() as s, \
                s.post(f"http://127.0.0.1:{port}/hook?hook={hook}", json=body) as r:
            assert r.status == 200 and await r.read() == raw
