"""One declaration per vendor: everything else the collector knows of a vendor is derived from it.

The declarations are read through the registry (``declared_vendors``), exactly as the ``hooks``
command, the shim's table and the mapping processor read them; the default config and the README
tables, which stay hand-written, are held to them here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from aep_collector.api import VendorDeclaration
from aep_collector.pipeline.component import Kind
from aep_collector.pipeline.registry import build_registry, declared_vendors
from aep_collector.processors.mapping import MappingProcessor, load_vendor
from aep_collector.receivers.registration import declaration, shim_entries

from tests.helpers import ROOT

BUILTIN = ("claude-code", "codex", "gemini-cli", "qwen-code", "vscode", "antigravity", "kimi-code", "opencode",
           "kilocode", "cline", "hermes", "pi")
DECLARED = declared_vendors(load_plugins=False)


def test_every_builtin_vendor_declares_itself_once() -> None:
    assert sorted(DECLARED) == sorted(BUILTIN)
    registry, _ = build_registry(load_plugins=False)
    for agent, decl in DECLARED.items():
        assert isinstance(decl, VendorDeclaration)
        factory = registry.get(Kind.RECEIVER, decl.receiver_type)
        assert factory is not None and factory.vendor is decl, agent  # the factory is derived from it
        assert factory.config_class is decl.config_class and factory.description.startswith(decl.description)
        assert factory.default_config().endpoint == decl.endpoint == f"127.0.0.1:{decl.port}"
    assert len({d.port for d in DECLARED.values()}) == len(DECLARED)  # no two vendors share a port


@pytest.mark.parametrize("agent", BUILTIN)
def test_the_mapping_is_found_through_the_declaration(agent: str) -> None:
    mod = load_vendor(agent)
    assert mod.__name__ == DECLARED[agent].mapping and mod.AGENT == agent


def test_extra_vendors_still_win() -> None:
    # A plug-in may still point an agent at its own module explicitly.
    assert load_vendor("codex", {"codex": "gemini_cli"}).AGENT == "gemini-cli"
    with pytest.raises(KeyError):
        load_vendor("no-such-agent")
    assert MappingProcessor().module("codex-otel").__name__.endswith("codex_otel")  # the OTLP profiles


def test_the_default_config_has_every_declared_receiver_on_its_port() -> None:
    receivers = yaml.safe_load((ROOT / "pipeline" / "default.yaml").read_text())["receivers"]
    for agent, decl in DECLARED.items():
        entry = receivers.get(decl.receiver_type)
        assert entry is not None, f"pipeline/default.yaml has no {decl.receiver_type} receiver"
        assert entry["endpoint"].endswith(f":-{decl.endpoint}}}"), (agent, entry["endpoint"])


def readme_ports(path: Path) -> dict[str, int]:
    """Receiver type -> port, from the rows of a README table that start with `` `type` | `agent` | port``."""
    rows = re.findall(r"^\| `([a-z_]+)` \| `[a-z-]+` \| `?(?:127\.0\.0\.1:)?(\d+)`? \|", path.read_text(), re.M)
    return {rtype: int(port) for rtype, port in rows}


def test_the_readme_tables_name_the_declared_ports() -> None:
    main = readme_ports(ROOT / "README.md")
    packages = {**readme_ports(ROOT / "receivers" / "hook_vendors" / "README.md"),
                **readme_ports(ROOT / "receivers" / "plugin_vendors" / "README.md")}
    for decl in DECLARED.values():
        assert main.get(decl.receiver_type) == decl.port, decl.agent
        if decl.receiver_type != "claude_code":  # its package has no table
            assert packages.get(decl.receiver_type) == decl.port, decl.agent


def test_the_shim_table_is_the_declarations() -> None:
    entries = shim_entries()
    for agent, decl in DECLARED.items():
        assert entries[agent]["port"] == decl.port
        assert entries[agent]["held"] == tuple(sorted(decl.held_hooks))
    # Byte-pinned neutral replies, exactly as they were hand-written before.
    assert entries["antigravity"]["by_event"] == {"pretooluse": b'{"decision": ""}', "stop": b'{"decision": ""}'}
    assert entries["antigravity"]["needs_event"] is True
    assert entries["kimi-code"]["by_event"] == {"userpromptsubmit": b""}
    assert entries["kimi-code"]["detached"] == ("posttooluse", "posttoolusefailure")
    assert entries["pi"]["neutral"] is None and entries["codex"]["neutral"] == b"{}"
    assert {a: e["wait"] for a, e in entries.items() if e["held"]} == {
        "claude-code": 60.0, "codex": 60.0, "qwen-code": 60.0, "vscode": 30.0, "kimi-code": 55.0, "hermes": 60.0}


def test_an_unknown_vendor_is_named_with_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: antigravity, claude-code"):
        declaration("no-such-vendor")
    assert declaration("KIMI_CODE").agent == "kimi-code"


# What the hook family's `declare` derives instead of each vendor module writing it: the hooks a
# vendor's surface holds follow from its handling (a permission reply holds PermissionRequest, a
# gate PreToolUse), and the shim waits past the hold window on exactly those.
HELD = {"codex": {"PermissionRequest"}, "qwen-code": {"PermissionRequest"}, "vscode": {"PreToolUse"},
        "kimi-code": {"PreToolUse"}, "gemini-cli": set(), "antigravity": set()}


@pytest.mark.parametrize("agent", sorted(HELD))
def test_the_hook_family_derives_held_hooks_mapping_and_config(agent: str) -> None:
    decl = DECLARED[agent]
    assert decl.held_hooks == HELD[agent]
    assert shim_entries()[agent]["held"] == tuple(sorted(HELD[agent]))
    assert decl.mapping == f"aep_collector.processors.mapping.{decl.receiver_type}"
    assert decl.receiver_type == agent.replace("-", "_")
    config = decl.config_class()
    assert config.endpoint == decl.endpoint
    assert type(config).__name__ == "".join(p.capitalize() for p in decl.receiver_type.split("_")) + "Config"
    assert hasattr(config, "attention_timeout") == bool(HELD[agent])  # only a vendor that holds has a hold window


def test_hook_signal_names_the_hook_or_refuses() -> None:
    from aep_collector.api import HookError, hook_signal
    from aiohttp.test_utils import make_mocked_request

    assert hook_signal("quill", {"event": "begin"}, "event").name == "begin"
    given = make_mocked_request("POST", "/hook?hook=done")
    assert hook_signal("quill", {}, "event", given).name == "done"
    assert hook_signal("quill", {"event": "ask"}, "event", given).name == "ask"  # the payload's own name wins
    with pytest.raises(HookError) as refused:
        hook_signal("claude-code", {"hook_event_name": 3}, "hook_event_name")
    assert refused.value.status == 400
    assert refused.value.body == {"error": "invalid-payload", "detail": "hook_event_name is missing or not a string"}
    with pytest.raises(HookError) as refused:
        hook_signal("quill", {}, "event", make_mocked_request("POST", "/hook"))
    assert refused.value.body["detail"] == "event is missing or not a string (or pass ?hook=<EventName>)"
