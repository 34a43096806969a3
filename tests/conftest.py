"""Shared test fixtures: where the official AEP corpus lives (read in place, never copied), and the
relay double with an operator attached, for the modules that set a ``TOKEN``."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aep_sdk.aio import ControlClient

from tests.relay_double import RelayDouble

ROOT = Path(__file__).resolve().parent.parent
AEP_DIR = Path(os.environ.get("AEP_CONFORMANCE_DIR", ROOT.parent / "shared" / "aep")).resolve()
FIXTURES = AEP_DIR / "conformance" / "fixtures"


def corpus(relative: str) -> object:
    """Load a JSON file of the corpus; fail loudly (never skip) when the corpus is missing."""
    path = FIXTURES / relative
    if not path.exists():
        raise FileNotFoundError(
            f"AEP conformance corpus not found at {path}; set AEP_CONFORMANCE_DIR to the corpus root"
        )
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def aep_dir() -> Path:
    return AEP_DIR


@pytest.fixture(autouse=True)
def hook_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own shim copy and install records, never the user's ~/.aep.

    ``aep-collector hooks`` copies the shim to ``$AEP_HOOK_DIR/bin`` (subprocesses inherit it).
    """
    path = tmp_path_factory.mktemp("aep-hook-dir")
    monkeypatch.setenv("AEP_HOOK_DIR", str(path))
    return path


@pytest.fixture
async def relay(request: pytest.FixtureRequest) -> AsyncIterator[RelayDouble]:
    """A started relay double accepting the test module's ``TOKEN``."""
    double = RelayDouble(token=request.module.TOKEN)
    await double.start()
    yield double
    await double.stop()


@pytest.fixture
async def operator(request: pytest.FixtureRequest, relay: RelayDouble) -> AsyncIterator[ControlClient]:
    """An operator console attached to ``relay`` with the test module's ``TOKEN``."""
    client = ControlClient(relay.url, agent="aep-console", host="ops-host", token=request.module.TOKEN)
    await client.connect()
    yield client
    await client.close()


@pytest.fixture
def node(tmp_path: Path):
    """A single nats-server with JetStream on 127.0.0.1 and a free port, killed afterwards."""
    from tests.nats_support import NatsNode

    n = NatsNode(tmp_path).start()
    yield n
    n.kill()


@pytest.fixture
def small_node(tmp_path: Path):
    """A nats-server whose max_payload is 4 KiB, so an oversize event is cheap to make."""
    from tests.nats_support import NatsNode

    conf = tmp_path / "small.conf"
    conf.write_text("max_payload: 4096\n")
    n = NatsNode(tmp_path, extra=["-c", str(conf)]).start()
    yield n
    n.kill()
