"""The membership endpoint of a real `broker serve` against hostile datagrams.

What a packet can do to a broker is the supervisor's business: it decodes every datagram, so one
that escapes as an exception stops the process. These tests send what an attacker on the network
can send, then check that the broker still serves and counted what it dropped."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

from brokerproc import TEST_KEYRING, BrokerProcess, free_udp_port, membership_key_file, wait_for

from broker.cluster import swim as sw
from broker.node import membership as mb

# The packet that stopped a broker: header, one update, "node 0 is DEAD at incarnation 2^32-1".
# A single node's id is 0: it used to refute with incarnation 2^32, which struct.pack refused, and
# the supervisor died on the struct.error (the broker exited 1).
KILLER_V1 = (
    b"RLMB\x01\x04"
    + bytes(2)
    + struct.pack(">IIHHI", 1, 99, 1, 1, 1)
    + bytes([1])
    + struct.pack(">BII", 3, 0, 0xFFFFFFFF)
)
assert len(KILLER_V1) == 34


def counters(b: BrokerProcess) -> dict[str, int]:
    try:
        return json.loads((b.data_dir / "run" / "bpf.json").read_text())["membership"]
    except (OSError, ValueError, KeyError):
        return {}


def test_a_single_node_opens_no_membership_port_unless_asked(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d", tmp_path / "b.log", ("--ebpf", "off")).start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", b.port))  # free: the broker holds no UDP socket at its port's number
        assert "membership endpoint" not in b.log()
    finally:
        assert b.stop() == 0


def test_the_membership_endpoint_needs_the_key(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d", tmp_path / "b.log", ("--ebpf", "off", "--membership-port", "0"))
    try:
        b.start()
    except RuntimeError as exc:
        assert "--membership-key-file" in str(exc)
    else:
        raise AssertionError("a membership endpoint started without the cluster key")


def test_forged_packets_leave_the_broker_serving(tmp_path: Path) -> None:
    """The 34-byte packet that once stopped a broker (`KILLER_V1`), the same claim in the current
    version but unsigned or signed with another key, and a signed one at the last incarnation:
    dropped or ignored, each counted, and the broker still answers (a signed ping gets its ack,
    produce works)."""
    port = free_udp_port()
    extra = ("--ebpf", "off", "--membership-port", str(port))
    extra += ("--membership-key-file", str(membership_key_file(tmp_path)))
    b = BrokerProcess(tmp_path / "d", tmp_path / "b.log", extra).start()
    try:
        dead_at_last = sw.Packet(sw.SYNC, 1, 99, 1, 1, 1, updates=(sw.Update(sw.DEAD, 0, 0xFFFFFFFF),))
        forged = [
            KILLER_V1,
            sw.encode(dead_at_last, TEST_KEYRING)[: -sw.TAG_SIZE],  # no tag
            sw.encode(dead_at_last, TEST_KEYRING)[: -sw.TAG_SIZE] + bytes(sw.TAG_SIZE),  # a zero tag
            sw.encode(dead_at_last, sw.Keyring([b"not the cluster key at all"])),
            sw.encode(sw.Packet(sw.PING, 7), sw.Keyring([b"not the cluster key at all"])),
        ]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.3)
            for data in forged:
                s.sendto(data, ("127.0.0.1", port))
            try:
                answer = s.recv(2000)
            except TimeoutError:
                answer = b""
            assert answer == b"", "an unsigned ping was answered"
            s.sendto(sw.encode(dead_at_last, TEST_KEYRING), ("127.0.0.1", port))  # signed: ignored
        time.sleep(0.3)
        assert b.running(), b.log()
        ack = mb.ping("127.0.0.1", port, TEST_KEYRING, sequence=9, timeout=2)
        assert (ack.kind, ack.sequence, ack.port) == (mb.ACK, 9, b.port)
        c = wait_for(lambda: counters(b).get("pings") and counters(b), timeout=5)
        assert isinstance(c, dict)
        # KILLER_V1 speaks version 1 and the untagged one is too short for a tag (malformed); the
        # three others are of this version but not made with the key (unauthenticated).
        assert (c["malformed"], c["unauthenticated"], c["unrefutable"], c["errors"]) == (2, 3, 1, 0), c
    finally:
        assert b.stop() == 0, b.log()
