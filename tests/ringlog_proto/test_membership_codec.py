"""The membership packet codec (ringlog_proto/membership.py): the header where its offsets say,
round trips, the tag, the key file's text, and random bytes that raise nothing but MalformedPacket.
That the XDP check reads the same offsets: tests/bpf/test_xdp_rules.py."""

from __future__ import annotations

import contextlib
import hmac
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringlog_proto import membership as wire

KEYRING = wire.Keyring([bytes(range(32))])


def member(nid: int, rack: str = "") -> wire.Member:
    return wire.Member(nid, f"10.0.0.{nid}", 9092, 7946, (40000 + nid, 41000 + nid), 2, 100, rack)


def test_each_header_field_is_at_its_offset() -> None:
    header = wire.encode_header(
        wire.SYNC, 0x01020304, 0x05060708, 0x090A, 0x0B0C, 0x0D0E0F10, wire.FLAG_REPLY | wire.FLAG_JOIN
    )
    assert len(header) == wire.HEADER_SIZE
    assert header[wire.MAGIC_OFFSET : wire.MAGIC_OFFSET + len(wire.MAGIC)] == wire.MAGIC
    assert header[wire.VERSION_OFFSET] == wire.VERSION
    assert header[wire.KIND_OFFSET] == wire.SYNC
    fields = [
        (wire.FLAGS_OFFSET, ">H", wire.FLAG_REPLY | wire.FLAG_JOIN),
        (wire.SEQUENCE_OFFSET, ">I", 0x01020304),
        (wire.NODE_ID_OFFSET, ">I", 0x05060708),
        (wire.CORES_OFFSET, ">H", 0x090A),
        (wire.PORT_OFFSET, ">H", 0x0B0C),
        (wire.INCARNATION_OFFSET, ">I", 0x0D0E0F10),
    ]
    for offset, fmt, value in fields:
        assert struct.unpack_from(fmt, header, offset) == (value,)
    assert fields[-1][0] + 4 == wire.HEADER_SIZE  # the incarnation ends the header


def test_the_smallest_packet_is_a_header_and_a_tag() -> None:
    data = wire.encode(wire.Packet(wire.PING, 1), KEYRING)
    assert len(data) == wire.PACKET_MIN == wire.HEADER_SIZE + wire.TAG_SIZE
    with pytest.raises(wire.MalformedPacket, match="shorter than"):
        wire.decode(data[:-1], KEYRING)


def test_codec_round_trip() -> None:
    m = member(7, rack="r1")
    ups = (
        wire.Update(wire.ALIVE, 7, 3, m),
        wire.Update(wire.SUSPECT, 8, 1),
        wire.Update(wire.DEAD, 9, 2),
        wire.Update(wire.LEFT, 10, 5),
    )
    p = wire.Packet(
        wire.PING_REQ, 0xFFFFFFFF, 7, 2, 9092, 3, wire.FLAG_JOIN, wire.Member(8, "10.0.0.8", 0, 7946), ups
    )
    data = wire.encode(p, KEYRING)
    assert data[:5] == b"RLMB\x02" and data[5] == wire.PING_REQ  # what bpf/xdp.c checks
    assert wire.decode(data, KEYRING) == p
    plain = wire.Packet(wire.PING, 5, 0)
    body = b"RLMB\x02\x01" + bytes(2) + (5).to_bytes(4, "big") + bytes(12)
    tag = hmac.digest(KEYRING.keys[0], body, "sha256")[:16]
    assert wire.encode(plain, KEYRING) == body + tag  # HMAC-SHA256 of the rest, cut to 128 bits
    assert wire.decode(wire.encode(plain, KEYRING), KEYRING) == plain


def test_keyring_from_a_key_files_text() -> None:
    text = "# the cluster key\n" + "ab" * 32 + "\n\n" + "cd" * 16 + "  # the old one\n"
    assert wire.Keyring.from_text(text, "key").keys == (bytes([0xAB]) * 32, bytes([0xCD]) * 16)
    for text, error in [
        ("", "key: 0 keys"),
        ("zz\n", "key:1: not a key in hex"),
        ("ab" * 8, "key: a key of 8 bytes: at least 16"),
        (("ab" * 16 + "\n") * 3, "key: 3 keys"),
    ]:
        with pytest.raises(ValueError, match=error):
            wire.Keyring.from_text(text, "key")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1600))
def test_decode_of_random_bytes_raises_only_malformed(data: bytes) -> None:
    with contextlib.suppress(wire.MalformedPacket):
        wire.decode(data, KEYRING)
