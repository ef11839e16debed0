"""The port a test broker first takes (labkit/brokerproc.py `unclaimed_port`): free, and outside the
range the kernel gives connect()'s local ports, so no client connection can hold it when the
broker restarts on it (a restart in CI once found its port taken that way)."""

from __future__ import annotations

import socket
from pathlib import Path

from labkit.brokerproc import unclaimed_port


def ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_the_port_is_free_and_below_the_range_connections_get() -> None:
    low, _high = ephemeral_range()
    port = unclaimed_port()
    assert 1024 <= port < low
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: a broker binds it


def test_no_client_connection_takes_a_port_below_the_range() -> None:
    """The premise: the kernel gives a connect() its local port from ip_local_port_range only."""
    low, high = ephemeral_range()
    with socket.create_server(("127.0.0.1", 0), backlog=512) as server:  # none accepted
        clients = [socket.create_connection(server.getsockname()) for _ in range(200)]
        try:
            ports = [c.getsockname()[1] for c in clients]
        finally:
            for c in clients:
                c.close()
    assert all(low <= p <= high for p in ports), sorted(ports)[:5]
