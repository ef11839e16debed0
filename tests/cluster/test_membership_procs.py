"""Three real `broker serve` processes find each other over SWIM (UDP on 127.0.0.1), see a kill -9
as dead within the bound of test_swim.py, and see the restarted node alive at a higher incarnation."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_swim import detection_bound

from broker.cluster.swim import SwimConfig
from broker.node import membership
from labkit.brokerproc import TEST_KEYRING, BrokerProcess, membership_key_file
from ringlog_proto import membership as wire


def free_udp_ports(n: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def view(b: BrokerProcess) -> dict[int, tuple[str, int]]:
    try:
        doc = json.loads((b.data_dir / "run" / "members.json").read_text())
    except (OSError, ValueError):
        return {}
    return {m["node_id"]: (m["state"], m["incarnation"]) for m in doc["members"]}


def wait_until(cond, timeout: float) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    ports = free_udp_ports(3)
    seed = f"127.0.0.1:{ports[0]}"
    brokers = []
    for i, port in enumerate(ports):
        extra = ("--node-id", str(i + 1), "--membership-port", str(port), "--ebpf", "off")
        extra += ("--membership-key-file", str(membership_key_file(tmp_path)))
        if i:
            extra += ("--join", seed)
        brokers.append(BrokerProcess(tmp_path / f"d{i + 1}", tmp_path / f"b{i + 1}.log", extra))
    try:
        for b in brokers:
            b.start()
        yield brokers
    finally:
        for b in brokers:
            if b.running():
                b.stop()


def test_three_brokers_converge_detect_a_kill_and_a_restart(trio: list[BrokerProcess]) -> None:
    a, b, c = trio
    wait_until(lambda: all([s for s, _ in view(x).values()] == ["alive"] * 3 for x in trio), 5)
    old = view(a)[3][1]
    ack = membership.ping(
        "127.0.0.1", int(c.extra[3]), TEST_KEYRING, sequence=9, timeout=2
    )  # a tool holding the key gets the plain ack
    assert (ack.kind, ack.sequence, ack.node_id, ack.port) == (wire.ACK, 9, 3, c.port)

    # "node 3 is DEAD at incarnation 2^32-1", sent to node 1 alone, used to stop node 3
    # once node 1 gossiped it. Without the key it is dropped where it lands, in either version.
    dead3 = wire.Packet(wire.SYNC, 1, 99, 1, 1, 1, updates=(wire.Update(wire.DEAD, 3, 0xFFFFFFFF),))
    unsigned = wire.encode(dead3, TEST_KEYRING)[: -wire.TAG_SIZE]
    forged = [
        unsigned + bytes(wire.TAG_SIZE),
        wire.encode(dead3, wire.Keyring([b"a key of another cluster"])),
    ]
    forged.append(b"RLMB\x01" + unsigned[5:])  # version 1, unsigned: 34 bytes
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for data in forged:
            s.sendto(data, ("127.0.0.1", int(a.extra[3])))
    time.sleep(1.0)  # several protocol periods of gossip
    assert all(x.running() for x in trio)
    assert all([s for s, _ in view(x).values()] == ["alive"] * 3 for x in trio)

    c.kill()
    bound = detection_bound(3, SwimConfig()) + 0.5  # + the supervisor loop and file write
    took = wait_until(lambda: view(a)[3][0] == "dead" and view(b)[3][0] == "dead", bound + 2)
    assert took < bound, f"dead after {took:.2f} s, bound {bound:.2f} s"
    print(f"kill -9 seen dead by both others after {took:.2f} s (bound {bound:.2f} s)")

    time.sleep(1)  # the incarnation is the start time in seconds
    c.start()
    wait_until(lambda: all(view(x).get(3, ("", 0))[0] == "alive" and len(view(x)) == 3 for x in trio), 5)
    assert view(a)[3][1] > old and view(b)[3][1] > old

    assert b.stop() == 0  # graceful: LEFT, not dead
    wait_until(lambda: view(a)[2][0] == "left" and view(c)[2][0] == "left", 3)
