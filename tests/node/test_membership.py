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

import pytest

from broker.node import membership as mb
from labkit.brokerproc import TEST_KEYRING, BrokerProcess, free_udp_port, membership_key_file, wait_for
from ringlog_proto import membership as wire

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
        dead_at_last = wire.Packet(
            wire.SYNC, 1, 99, 1, 1, 1, updates=(wire.Update(wire.DEAD, 0, 0xFFFFFFFF),)
        )
        forged = [
            KILLER_V1,
            wire.encode(dead_at_last, TEST_KEYRING)[: -wire.TAG_SIZE],  # no tag
            wire.encode(dead_at_last, TEST_KEYRING)[: -wire.TAG_SIZE] + bytes(wire.TAG_SIZE),  # a zero tag
            wire.encode(dead_at_last, wire.Keyring([b"not the cluster key at all"])),
            wire.encode(wire.Packet(wire.PING, 7), wire.Keyring([b"not the cluster key at all"])),
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
            s.sendto(wire.encode(dead_at_last, TEST_KEYRING), ("127.0.0.1", port))  # signed: ignored
        time.sleep(0.3)
        assert b.running(), b.log()
        ack = mb.ping("127.0.0.1", port, TEST_KEYRING, sequence=9, timeout=2)
        assert (ack.kind, ack.sequence, ack.port) == (wire.ACK, 9, b.port)
        c = wait_for(lambda: counters(b).get("pings") and counters(b), timeout=5)
        assert isinstance(c, dict)
        # KILLER_V1 speaks version 1 and the untagged one is too short for a tag (malformed); the
        # three others are of this version but not made with the key (unauthenticated).
        assert (c["malformed"], c["unauthenticated"], c["unrefutable"], c["errors"]) == (2, 3, 1, 0), c
    finally:
        assert b.stop() == 0, b.log()


def test_keyring_from_a_file(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("# the cluster key\n" + "ab" * 32 + "\n\n" + "cd" * 16 + "  # the old one\n")
    assert mb.read_keyring(f).keys == (bytes([0xAB]) * 32, bytes([0xCD]) * 16)
    for text, error in [
        ("", "0 keys"),
        ("zz\n", "not a key in hex"),
        ("ab" * 8, "at least 16"),
        (("ab" * 16 + "\n") * 3, "3 keys"),
    ]:
        f.write_text(text)
        with pytest.raises(ValueError, match=f"{f}.*{error}"):
            mb.read_keyring(f)
    with pytest.raises(OSError):
        mb.read_keyring(tmp_path / "missing")
