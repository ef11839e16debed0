"""The membership packet codec and endpoint over a real UDP socket (no root needed)."""

from __future__ import annotations

import socket
import time

import pytest

from broker.node import membership as mb


def test_header_is_24_bytes_with_the_magic_first() -> None:
    data = mb.encode(mb.Packet(mb.PING, 7))
    assert len(data) == mb.HEADER_SIZE == 24
    assert data[:5] == b"RLMB\x01" and data[5] == mb.PING
    assert data[8:12] == (7).to_bytes(4, "big")
    assert mb.decode(data) == mb.Packet(mb.PING, 7)
    ack = mb.Packet(mb.ACK, 0xFFFFFFFF, node_id=3, cores=64, port=65535, incarnation=123)
    assert mb.decode(mb.encode(ack) + b"gossip later") == ack  # bytes after the header are ignored


@pytest.mark.parametrize(
    "data",
    [b"", b"RLMB", mb.encode(mb.Packet(mb.PING, 1))[:23], b"XXXX" + bytes(20), b"RLMB\x02" + bytes(19)],
)
def test_malformed_packets_are_refused(data: bytes) -> None:
    with pytest.raises(mb.MalformedPacket):
        mb.decode(data)


def test_unknown_kind_is_refused() -> None:
    data = bytearray(mb.encode(mb.Packet(mb.PING, 1)))
    data[5] = 9
    with pytest.raises(mb.MalformedPacket, match="kind 9"):
        mb.decode(bytes(data))


def test_endpoint_acks_pings_and_counts_malformed() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    ep = mb.MembershipEndpoint(server, node_id=5, cores=2, port=9092)
    port = server.getsockname()[1]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.settimeout(2)
            c.sendto(b"junk", ("127.0.0.1", port))
            c.sendto(mb.encode(mb.Packet(mb.PING, 42)), ("127.0.0.1", port))
            time.sleep(0.05)
            ep.on_readable()
            ack = mb.decode(c.recv(100))
        assert (ack.kind, ack.sequence, ack.node_id, ack.cores, ack.port) == (mb.ACK, 42, 5, 2, 9092)
        assert ack.incarnation == ep.incarnation
        assert ep.counters() == {"pings": 1, "acks_received": 0, "malformed": 1}
    finally:
        server.close()


def test_swim_endpoint_answers_plain_pings_like_the_old_endpoint() -> None:
    """What the XDP tests (tests/bpf) and monitoring rely on: a non-broker PING to a broker's
    membership port gets the plain 24-byte ACK with its cores and port; junk is counted."""
    from broker.cluster.swim import Member, Swim

    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    ep = mb.SwimEndpoint(server, Swim(Member(0, "127.0.0.1", 9092, port, (9100, 9101), 2), incarnation=321))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.settimeout(2)
            c.sendto(b"junk", ("127.0.0.1", port))
            c.sendto(mb.encode(mb.Packet(mb.PING, 42)), ("127.0.0.1", port))
            time.sleep(0.05)
            ep.on_readable(time.monotonic())
            data = c.recv(2000)
        assert len(data) == mb.HEADER_SIZE
        assert mb.decode(data) == mb.Packet(mb.ACK, 42, 0, 2, 9092, 321)
        assert ep.counters()["pings"] == 1 and ep.counters()["malformed"] == 1
    finally:
        server.close()
