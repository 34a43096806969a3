"""Planted secrets never leave above the ceiling, whatever field a vendor puts them in (issue #12).

A secret set (provider API keys, an AWS key id and a bare AWS secret access key, GitHub and Slack
tokens, a bearer token, a PEM private key, a JWT, an email, Linux and macOS home paths) is planted
into EVERY string field of EVERY vendor mapping-fixture input, and into EVERY attribute (record
and resource) of every OTLP fixture record of the ``vscode`` and ``codex`` profiles in both modes.
Each planted input runs the real chain a collector runs (mapping -> runs -> capture -> stamp ->
the serialized bytes the JSONL and relay exporters write), and:

* at a pure ``metadata`` (or ``none``) ceiling no byte of any planted secret leaves, and no field that carried
  one leaves either (its marker is gone too: such a value is content, never structure);
* under the default config (``metadata`` with ``attention: redacted``) and at ``redacted``, no
  planted secret leaves, and what does leave of the fields that carried them is the redacted form.

Only the keys a mapping dispatches on are left alone (``DISPATCH``): planting there would route the
input to a different mapping rather than test the capture processor. Session ids ARE planted: it replaces
an envelope id that carries a secret by its opaque digest.

The enumeration is deterministic (every secret visits every field by rotation); the hypothesis
test adds freshly generated secrets of each shape.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
import string
import tempfile
from pathlib import Path
from typing import Any

import pytest
from aep_collector.pipeline.envelope import Stamper
from aep_collector.pipeline.model import Signal
from aep_collector.pipeline.wire import dumps
from aep_collector.processors.capture import CaptureConfig, CaptureProcessor
from aep_collector.processors.mapping import MappingProcessor
from aep_collector.processors.runs import RunsProcessor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import corpus
from tests.test_privacy import VENDORS, fixture_inputs, signal_name

# (planted value, substrings that must never leave). The needles are the secret material itself,
# not the scheme words around it ("Bearer", "BEGIN") that are allowed to remain.
SECRETS: list[tuple[str, list[str]]] = [
    ("sk-proj-AbCdEf123456GhIjKl789012MnOp", ["sk-proj-AbCdEf123456GhIjKl789012MnOp"]),
    ("sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa-xYzQ", ["Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa"]),
    ("AIzaSyA1bC2dE3fG4hI5jK6lM7nO8pQ9rS0tUvW", ["AIzaSyA1bC2dE3fG4hI5jK6lM7nO8pQ9rS0tUvW"]),
    ("AKIAIOSFODNN7EXAMPLE", ["AKIAIOSFODNN7EXAMPLE"]),
    ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ["wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "bPxRfiCYEXAMPLEKEY"]),
    ("ghp_AbCdEfGhIjKlMnOpQrStUvWxYz012345", ["ghp_AbCdEfGhIjKlMnOpQrStUvWxYz012345"]),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEF", ["11ABCDEFG0123456789_abcdef"]),
    ("xoxb-123456789012-ABCDEFabcdef", ["xoxb-123456789012-ABCDEFabcdef", "123456789012-ABCDEFabcdef"]),
    ("Bearer abc123.DEF-456_ghi~789xyz", ["abc123.DEF-456_ghi~789xyz"]),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bqPlantedKeyBody\n-----END RSA PRIVATE KEY-----",
     ["MIIEowIBAAKCAQEA7bqPlantedKeyBody"]),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.SflKxwRJSMeKKF2QT4fwpM", ["eyJhbGciOiJIUzI1NiJ9", "SflKxwRJSMeKKF2QT4fwpM"]),
    ("alice.planted@example.com", ["alice.planted@example.com", "alice.planted"]),
    ("/home/alice/payroll/export.csv", ["/home/alice", "alice/payroll"]),
    ("/Users/bob/Documents/plan.key", ["/Users/bob", "bob/Documents"]),
]
REDACTED_FORMS = ("[REDACTED:secret]", "[REDACTED:pii]", "~/")

# Keys the mappings dispatch on (hook / record names anywhere; the moment `kind` and the bus-event
# `type` at the top two levels of a plugin payload). Their value names the moment and may become
# part of an `x.*` type (AEP-0001 §6), so planting there tests the routing, not the capture processor.
DISPATCH = {"hook_event_name", "hookName", "event.name"}
DISPATCH_TOP = {"type", "kind"}

OTEL = {"vscode-otel": "vscode-otel.json", "codex-otel": "codex-otel.json"}
CONFIGS = {"none": ("none", {}), "metadata": ("metadata", {}), "default": ("metadata", {"attention": "redacted"}),
           "redacted": ("redacted", {})}


def otel_inputs(agent: str) -> list[tuple[str, dict[str, Any]]]:
    doc = corpus(f"mappings/{OTEL[agent]}")
    entries = [*doc["records"].items(), ("unknown", doc["unknown"])]
    return [(name, entry["input"]) for name, entry in entries]


def vendor_inputs(vendor: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(signal name, payload, typed Signal fields) for every fixture input of a vendor or OTel profile."""
    if vendor in VENDORS:
        return [(signal_name(vendor, k, p), p, {"respond_via": ["control"]}) for k, p in fixture_inputs(vendor)]
    agent, mode = vendor.rsplit(":", 1)
    return [(name, flat, {"mode": mode}) for name, flat in otel_inputs(agent)]


TARGETS = sorted(VENDORS) + [f"{agent}:{mode}" for agent in OTEL for mode in ("companion", "primary")]


def plant(value: Any, make: Any, key: str | None = None, depth: int = 0) -> Any:
    """Every string outside the dispatch keys replaced by ``make()`` (depth-first, in document order)."""
    if isinstance(value, dict):
        return {k: plant(v, make, k, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [plant(v, make, key, depth) for v in value]
    dispatch = key in DISPATCH or (key in DISPATCH_TOP and depth <= 2)
    if isinstance(value, str) and not dispatch:
        return make()
    return value


def chain(ceiling: str, overrides: dict[str, str], state: Path) -> Any:
    processors = [MappingProcessor(), RunsProcessor(), CaptureProcessor(CaptureConfig(ceiling=ceiling, overrides=overrides))]
    stamper = Stamper(state, "privacy-host")

    def run(agent: str, name: str, payload: Any, fields: dict[str, Any]) -> list[str]:
        batch: list[Any] = [Signal(agent, name, payload, **fields)]
        for p in processors:
            batch = p(batch)
        return [dumps(stamper.stamp(d)) for d in batch if isinstance(d, dict)]
    return run


def exported(target: str, config: str, planted: list[tuple[str, Any, dict[str, Any]]], state: Path) -> str:
    agent = target.split(":")[0]
    run = chain(*CONFIGS[config], state)
    return "\n".join(line for name, payload, attrs in planted for line in run(agent, name, payload, attrs))


def check(wire: str, config: str, needles: list[str], markers: list[str]) -> None:
    assert wire, "nothing was exported: the test would prove nothing"
    leaked = [n for n in needles if n in wire]
    assert not leaked, (config, leaked[:3], wire[:3000])
    if config in ("none", "metadata"):
        # Pure metadata: a field that carried a secret is content, so none of it leaves.
        shown = [m for m in markers if m in wire]
        assert not shown, (shown[:3], wire[:3000])
    for line in wire.splitlines():
        assert json.loads(line)["capture"] in ("none", "metadata", "redacted")


@pytest.fixture(scope="module")
def state_dir():
    with tempfile.TemporaryDirectory(prefix="aep-privacy-") as d:
        yield Path(d)


def planter(rotation: int, counter: Any) -> tuple[Any, list[str], set[str]]:
    """``make`` for one rotation: field i gets secret i + rotation, bare or inside prose."""
    markers: list[str] = []
    needles: set[str] = set()
    fields = itertools.count(rotation)

    def make() -> str:
        index = next(fields)
        secret, found = SECRETS[index % len(SECRETS)]
        needles.update(found)
        if index % 3 == 0:
            return secret  # bare: the whole value is the secret (an id-like field)
        marker = f"PLNT{next(counter)}Q"
        markers.append(marker)
        return f"{marker} deploy with {secret} now"  # embedded in prose
    return make, markers, needles


@pytest.mark.parametrize("target", TARGETS)
def test_every_secret_in_every_field_never_leaves(target: str, state_dir: Path) -> None:
    inputs = vendor_inputs(target)
    assert inputs
    counter = itertools.count()
    for rotation in range(len(SECRETS)):
        make, markers, needles = planter(rotation, counter)
        planted = [(name, plant(payload, make), attrs) for name, payload, attrs in inputs]
        assert needles, "nothing was planted: the test would prove nothing"
        for config in CONFIGS:
            wire = exported(target, config, planted, state_dir)
            check(wire, config, sorted(needles), markers)
            if config == "redacted" and markers and any(m in wire for m in markers):
                # What leaves of a planted field at redacted is its redacted form.
                assert any(form in wire for form in REDACTED_FORMS), wire[:3000]


# --- generated secrets ------------------------------------------------------------------------

_B64 = string.ascii_letters + string.digits


def _generated(kind: str, rng: random.Random) -> tuple[str, str]:
    """(planted value, needle) for one freshly generated secret of ``kind``."""
    def pick(alphabet: str, n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))
    if kind == "aws_secret":  # how AWS makes them: 30 random bytes in base64
        value = base64.b64encode(rng.randbytes(30)).decode()
        return value, value
    if kind == "aws_key_id":
        value = "AKIA" + pick(string.ascii_uppercase + string.digits, 16)
        return value, value
    if kind == "openai":
        value = "sk-" + pick(_B64, 40)
        return value, value
    if kind == "anthropic":
        body = pick(_B64, 48)
        return f"sk-ant-api03-{body}", body
    if kind == "google":
        value = "AIza" + pick(_B64 + "_-", 35)
        return value, value
    if kind == "github":
        value = "ghp_" + pick(_B64, 36)
        return value, value
    if kind == "slack":
        body = f"{pick(string.digits, 12)}-{pick(_B64, 24)}"
        return f"xoxb-{body}", body
    if kind == "bearer":
        body = pick(_B64 + "-._~", 32)
        return f"Authorization: Bearer {body}", body
    if kind == "email":
        user = pick(string.ascii_lowercase, 8)
        return f"{user}.x@{pick(string.ascii_lowercase, 6)}.io", f"{user}.x@"
    if kind == "home":
        user = pick(string.ascii_lowercase, 7)
        root = rng.choice(["/home/", "/Users/"])
        return f"{root}{user}/src/app.py", f"{root}{user}"
    raise AssertionError(kind)


KINDS = ["aws_secret", "aws_key_id", "openai", "anthropic", "google", "github", "slack", "bearer", "email", "home"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(TARGETS), kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1),
       bare=st.booleans(), config=st.sampled_from(sorted(CONFIGS)))
def test_generated_secrets_never_leave(target: str, kind: str, seed: int, bare: bool, config: str,
                                       state_dir: Path) -> None:
    rng = random.Random(seed)
    needles: list[str] = []

    def make() -> str:
        value, needle = _generated(kind, rng)
        needles.append(needle)
        return value if bare else f"see {value} for details"

    planted = [(name, plant(payload, make), attrs) for name, payload, attrs in vendor_inputs(target)]
    wire = exported(target, config, planted, state_dir)
    check(wire, config, needles, [])
