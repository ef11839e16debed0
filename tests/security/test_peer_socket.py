"""The inter-core listener (an abstract unix socket any local process can reach) serves only
processes of the broker's own user: what arrives there is trusted as another core's, so another
user connecting to it would skip authentication and ACLs. Both backends."""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess
from labkit.securitylab import Unavailable, add_user, start_broker
from ringlog_proto import messages as m

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")


def peer_address(b: BrokerProcess) -> str:
    """Core 0's inter-core socket, from its worker's --spec."""
    argv = Path(f"/proc/{b.worker_pids[0]}/cmdline").read_bytes().split(b"\0")
    spec = json.loads(argv[argv.index(b"--spec") + 1])
    return str(spec["peer_addresses"][0])


def try_create(address: str, name: str, uid: int | None) -> bytes:
    """Send a CreateTopic frame to `address` as `uid` (a forked child); what came back."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to `uid`, connect, send, report what it read
        got = b""
        try:
            os.close(r)
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(address)
            try:
                s.sendall(b"".join(m.encode_request(m.CreateTopicRequest(name, 1), 9)))
                got = s.recv(4096)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                got = b""  # closed by the broker
        except BaseException as exc:  # reported to the parent, which fails with it
            got = f"child failed: {exc!r}".encode()
        try:
            os.write(w, struct.pack(">I", len(got)) + got)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    (n,) = struct.unpack_from(">I", data)
    return data[4 : 4 + n]


@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
def test_only_the_brokers_user_reaches_the_inter_core_socket(tmp_path: Path, backend: str) -> None:
    add_user(tmp_path / "data", "alice", "pw")
    try:
        b = start_broker(tmp_path, backend, ("--sasl-mechanisms", "SCRAM-SHA-512"))
    except Unavailable as exc:
        pytest.skip(str(exc))
    try:
        address = peer_address(b)
        assert try_create(address, "sneaky", NOBODY) == b""  # closed, nothing answered
        assert "closing an inter-core connection from uid 65534" in b.log()
        assert "created topic sneaky" not in b.log()
        assert try_create(address, "ours", None) != b""  # the broker's own user: served
        assert b.wait_for_log("created topic ours")
    finally:
        b.stop()
