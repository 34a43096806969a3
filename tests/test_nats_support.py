"""The test nats-server helper: a first start whose port someone else took meanwhile tries new ports."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.nats_support import NatsNode


def test_a_first_start_on_a_port_taken_meanwhile_moves_to_free_ports(tmp_path: Path) -> None:
    node = NatsNode(tmp_path)
    taken = node.port
    with socket.socket() as squatter:  # what an outgoing connection or another test may do
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        node.start()
        try:
            assert node.running and node.port != taken
            assert "address already in use" in node.logfile.read_text()  # the first try met it
        finally:
            node.kill()
