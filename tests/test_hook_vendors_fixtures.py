"""Every mapping-fixture input of the six hook-family vendors, POSTed to the RUNNING receiver.

Each case gets a fresh in-process collector (receiver -> mapping -> runs -> capture at the
fixtures' posture -> JSONL). The reply must be the vendor's neutral reply for that hook, and the
JSONL must hold the fixture's expected events with the pinned ``{type, data, subject, step}``;
every line is a valid envelope. Runtime differences from the pure mapping are asserted, not
skipped: no route is live, so a Codex/Qwen permission card says ``respond_via: ["oob"]``; a
leg's subject is its request's id (the attention book) and a terminal carries ``latency_ms``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aep_collector.pipeline.registry import build_registry
from aep_collector.pipeline.validate import StreamValidator, envelope_errors
from aep_collector.receivers.hook_vendors import antigravity, kimi_code

from tests.conftest import corpus
from tests.helpers import base_config, read_jsonl, running

# receiver type -> (fixture file, agent)
VENDORS = {"codex": ("codex", "codex"), "gemini_cli": ("gemini-cli", "gemini-cli"),
           "qwen_code": ("qwen-code", "qwen-code"), "vscode": ("vscode", "vscode"),
           "kimi_code": ("kimi-code", "kimi-code"), "antigravity": ("antigravity", "antigravity")}
LEGS = {"attention.answered", "attention.resolved", "attention.timeout"}


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for rtype, (fixture, _) in VENDORS.items():
        fx = corpus(f"mappings/{fixture}.json")
        out += [(rtype, key, entry) for key, entry in fx["hooks"].items()]
        out.append((rtype, "fallback", fx["fallback"]))
    return out


CASES = cases()


def expected_of(entry: dict[str, Any]) -> list[dict[str, Any]]:
    exp = entry["expected"]
    items = [] if exp is None else exp if isinstance(exp, list) else [exp]
    return [{k: v for k, v in e.items() if k != "$comment"} for e in items]


def hook_of(rtype: str, entry: dict[str, Any]) -> str | None:
    return entry.get("hook") if rtype == "antigravity" else None


def preludes(rtype: str, entry: dict[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """What the vendor sent before this moment, when the case is about a pairing."""
    payload = entry["input"]
    if rtype == "antigravity" and entry.get("join"):
        # The join the fixture passes as a parameter is, at runtime, an earlier PreToolUse.
        pre = {k: v for k, v in payload.items() if k not in ("error",)}
        return [({**pre, "toolCall": {"name": entry["join"]["name"], "args": {}}}, "PreToolUse")]
    if rtype == "kimi_code" and payload.get("hook_event_name") == "PermissionResult":
        # A result pairs with the PermissionRequest of the same call (orphan legs are dropped).
        req = {k: payload[k] for k in ("session_id", "tool_name", "tool_call_id") if k in payload}
        return [({**req, "hook_event_name": "PermissionRequest"}, None)]
    return []


@pytest.fixture
def registry() -> Any:
    reg, _ = build_registry(load_plugins=False)
    return reg


async def post(base: str, body: Any, hook: str | None) -> tuple[int, bytes]:
    url = base + "/hook" + (f"?hook={hook}" if hook else "")
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.read()


def log(tmp_path: Path, agent: str) -> list[dict[str, Any]]:
    return [e for p in sorted((tmp_path / "logs" / agent).glob("*.jsonl")) for e in read_jsonl(p)]


@pytest.mark.parametrize("rtype,key,entry", CASES, ids=[f"{r}:{k}" for r, k, _ in CASES])
async def test_fixture_input_through_the_running_receiver(tmp_path: Path, registry: Any, rtype: str, key: str,
                                                          entry: dict[str, Any]) -> None:
    fixture, agent = VENDORS[rtype]
    cfg = base_config(tmp_path, receivers={rtype: {"endpoint": "127.0.0.1:0"}})
    async with running(cfg, registry) as service:
        base = f"http://127.0.0.1:{service.receivers[rtype].port}"
        for body, hook in preludes(rtype, entry):
            assert (await post(base, body, hook))[0] == 200
        before = len(log(tmp_path, agent))
        hook = hook_of(rtype, entry)
        status, raw = await post(base, entry["input"], hook)
    # The vendor's reply contract: its neutral reply (nothing is held without a control route).
    assert status == 200
    if rtype == "antigravity":
        assert json.loads(raw) == antigravity.neutral_reply(hook or "")
    elif rtype == "kimi_code" and entry["input"].get("hook_event_name") in kimi_code.SILENT_HOOKS:
        assert raw == b""  # Kimi Code would put any UserPromptSubmit stdout into the model's context
    else:
        assert json.loads(raw) == {}

    events = log(tmp_path, agent)
    stream = StreamValidator()
    for e in events:
        assert envelope_errors(e) == [], e
        assert stream.feed(e) == [], e
    new = events[before:]
    expected = expected_of(entry)
    if not expected:
        assert new == [], "a deliberately unmapped moment emits nothing"
        return
    for exp in expected:
        got = next((e for e in new if e["type"] == exp["type"]), None)
        assert got is not None, (exp["type"], [e["type"] for e in new])
        want = dict(exp)
        data = dict(got.get("data", {}))
        if exp["type"] == "attention.requested" and "respond_via" in exp["data"] and rtype in ("codex", "qwen_code"):
            # AEP-0008: respond_via is the receiver's truth, and no control route is live here.
            assert data["respond_via"] == ["oob"]
            data["respond_via"] = exp["data"]["respond_via"]
        if exp["type"] == "attention.resolved" and "latency_ms" not in exp["data"]:
            # Runtime wiring: the receiver saw the request, so the terminal says how long it stood.
            assert isinstance(data.pop("latency_ms"), int)
        assert data == want["data"], exp["type"]
        if exp["type"] in LEGS:
            requests = [e for e in events if e["type"] == "attention.requested"]
            assert got["subject"] == requests[-1]["id"]  # the attention book links the leg to its request
        else:
            assert got.get("subject") == want.get("subject")
        if "step" in want:
            assert got.get("step") == want["step"]
