"""The broker's listening sockets, made once by the supervisor and inherited by every worker.

Rules this module keeps:
- Per core k: its member of the public SO_REUSEPORT group on HOST:PORT, its direct TCP listener
  and its inter-core unix listener in the abstract namespace (broker/node/supervisor.py says why
  the supervisor holds them all). `make_sockets` leaves nothing open when it fails.
- A public port another process listens on is refused, never joined (`_check_port_free`).
- A core's direct port survives a restart when it is still free (`core-ports.json`, under the data
  dir): Kafka clients hold on to the ports Metadata named.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from broker.storage import layout
from broker.storage.durable_file import load_json, replace_json

log = logging.getLogger("broker.node.supervisor")  # the supervisor's lines, wherever they are written

LISTEN_BACKLOG = 1024  # connections queued per listener (also what waits while a worker restarts)
BIND_RETRY_S = 1.0  # a port held by the dying workers of a killed broker frees within this


@dataclass(slots=True)
class Sockets:
    public: list[socket.socket]
    direct: list[socket.socket]
    peer: list[socket.socket]
    port: int
    direct_ports: list[int]
    peer_addresses: list[str]


def make_sockets(
    host: str, port: int, cores: int, core_ports_base: int, remembered: Sequence[int] = ()
) -> Sockets:
    """Every listener of the broker. Raises OSError (e.g. EADDRINUSE) with nothing left open.

    Without `core_ports_base`, core k first tries `remembered[k]` (its port before a restart:
    stock Kafka clients keep reconnecting to the ports Metadata named and never ask the bootstrap
    address again) and takes any free port if that one is taken."""
    made: list[socket.socket] = []
    try:
        family = socket.getaddrinfo(host, port or None, type=socket.SOCK_STREAM)[0][0]
        if port:
            _check_port_free(family, host, port)
        public: list[socket.socket] = []
        for _ in range(cores):
            s = socket.socket(family, socket.SOCK_STREAM)
            made.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind((host, port))
            port = s.getsockname()[1]  # --port 0: the first bind picks it, the others join it
            s.listen(LISTEN_BACKLOG)
            public.append(s)
        direct: list[socket.socket] = []
        for k in range(cores):
            s = socket.socket(family, socket.SOCK_STREAM)
            made.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if core_ports_base:
                s.bind((host, core_ports_base + k))
            else:
                _bind_preferring(s, host, remembered[k] if k < len(remembered) else 0)
            s.listen(LISTEN_BACKLOG)
            direct.append(s)
        peer: list[socket.socket] = []
        addresses = [f"\0ringlog-{os.getpid()}-{port}-core-{k}" for k in range(cores)]
        for address in addresses:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            made.append(s)
            s.bind(address)
            s.listen(LISTEN_BACKLOG)
            peer.append(s)
    except BaseException:
        for s in made:
            s.close()
        raise
    return Sockets(public, direct, peer, port, [s.getsockname()[1] for s in direct], addresses)


def _bind_preferring(s: socket.socket, host: str, port: int) -> None:
    """Bind `s` to `port` if it is free, else to any port."""
    if 0 < port < 65536:
        try:
            s.bind((host, port))
            return
        except OSError:
            log.info("direct port %d is taken: a core listens on another one", port)
    s.bind((host, 0))


def remembered_core_ports(data_dir: str, host: str) -> list[int]:
    """The direct ports the cores had when this data dir was last served on `host` ([] if none)."""
    try:
        doc = load_json(layout.core_ports_path(data_dir))
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict) or doc.get("host") != host or not isinstance(doc.get("ports"), list):
        return []
    return [p if isinstance(p, int) else 0 for p in doc["ports"]]


def remember_core_ports(data_dir: str, host: str, ports: Sequence[int]) -> None:
    try:
        replace_json(layout.core_ports_path(data_dir), {"host": host, "ports": list(ports)})
    except OSError as exc:  # a full disk: the next start takes new ports, nothing worse
        log.warning("cannot remember the core ports: %s", exc)


def _check_port_free(family: int, host: str, port: int) -> None:
    """Refuse a port another process listens on. SO_REUSEPORT would let us join its group (same
    user) and silently share its traffic, so bind once without it first. The workers of a broker
    killed a moment ago may still hold it for a few milliseconds: retry briefly."""
    deadline = time.monotonic() + BIND_RETRY_S
    while True:
        probe = socket.socket(family, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
            return
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise
        finally:
            probe.close()
        time.sleep(0.05)
