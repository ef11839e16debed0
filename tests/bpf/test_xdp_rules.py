"""bpf/xdp.c's membership check against ringlog_proto/membership.py, the packet's one owner.

The C states none of the packet's facts: bpf/xdp.py compiles it with the codec's constants as -D
flags. Without root, the tests check that every such macro the C uses is one the loader passes,
with the codec's value. With root and bcc, the real classifier (loaded, never attached) runs on
Ethernet frames through BPF_PROG_TEST_RUN: packets the codec encodes pass, whatever their tag
(the tag is checked in user space), and a wrong magic, version or length is dropped.
"""

from __future__ import annotations

import re
import socket
import struct

import pytest

from bpf import kernel, xdp
from ringlog_proto import membership as wire

reason = kernel.ebpf_unavailable()
needs_ebpf = pytest.mark.skipif(reason is not None, reason=f"eBPF unavailable: {reason}")

KEYRING = wire.Keyring([bytes(range(32))])
MEMBERSHIP_PORT = 7946
PARTITION_PORT = 9092
XDP_DROP = 1
XDP_PASS = 2


def c_text() -> str:
    return (kernel.HERE / "xdp.c").read_text()


def test_the_c_states_no_membership_fact_and_the_loader_passes_each_it_uses() -> None:
    text = c_text()
    assert not re.search(r"#define\s+RL_MEMBERSHIP_", text)
    used = set(re.findall(r"\bRL_MEMBERSHIP_\w+", text))
    defines = xdp.membership_defines()
    assert used == set(defines)
    assert xdp.cflags() == [f"-D{name}={value:#x}" for name, value in defines.items()]


def test_the_defines_are_the_codec_constants() -> None:
    d = xdp.membership_defines()
    packet = wire.encode(wire.Packet(wire.PING, 1), KEYRING)
    at = d["RL_MEMBERSHIP_MAGIC_OFFSET"]
    assert packet[at : at + 4] == d["RL_MEMBERSHIP_MAGIC"].to_bytes(4, "big") == wire.MAGIC
    assert packet[d["RL_MEMBERSHIP_VERSION_OFFSET"]] == d["RL_MEMBERSHIP_VERSION"] == wire.VERSION
    assert d["RL_MEMBERSHIP_PACKET_MIN"] == len(packet) == wire.PACKET_MIN


def frame(
    payload: bytes, dport: int = MEMBERSHIP_PORT, v6: bool = False, udp_len: int | None = None
) -> bytes:
    """An Ethernet frame carrying `payload` in UDP to `dport` (checksums zero: XDP reads none)."""
    udp = struct.pack(">HHHH", 40000, dport, 8 + len(payload) if udp_len is None else udp_len, 0) + payload
    if v6:
        src = socket.inet_pton(socket.AF_INET6, "fd00::1")
        dst = socket.inet_pton(socket.AF_INET6, "fd00::2")
        ip = struct.pack(">IHBB16s16s", 6 << 28, len(udp), socket.IPPROTO_UDP, 64, src, dst)
        return bytes(12) + b"\x86\xdd" + ip + udp
    src, dst = socket.inet_aton("10.0.0.1"), socket.inet_aton("10.0.0.2")
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0, src, dst)
    return bytes(12) + b"\x08\x00" + ip + udp


@pytest.fixture(scope="module")
def classifier():
    if reason is not None:
        pytest.skip(f"eBPF unavailable: {reason}")
    x = xdp.XdpClassifier("lo", MEMBERSHIP_PORT, [PARTITION_PORT])  # loaded, never attached
    try:
        yield x
    finally:
        x.close()


def verdict(x: xdp.XdpClassifier, data: bytes) -> int:
    ret, _ = kernel.prog_test_run(x.prog_fd, data, out_size=len(data))
    return ret


def good_packets() -> list[bytes]:
    me = wire.Member(3, "10.0.0.3", 9092, MEMBERSHIP_PORT, (40003, 41003), 2, 100, "r1")
    alive = wire.Update(wire.ALIVE, 3, 7, me)
    return [
        wire.encode(wire.Packet(wire.PING, 1), KEYRING),
        wire.encode(wire.Packet(wire.ACK, 2, 3, 2, 9092, 7, updates=(alive,)), KEYRING),
        wire.encode(wire.Packet(wire.PING_REQ, 3, 3, 2, 9092, 7, target=me), KEYRING),
        wire.encode(
            wire.Packet(
                wire.SYNC, 4, 3, 2, 9092, 7, wire.FLAG_REPLY, updates=(alive, wire.Update(wire.DEAD, 4, 1))
            ),
            KEYRING,
        ),
        wire.encode(wire.Packet(wire.PING, 5), wire.Keyring([b"another cluster's key"])),  # tag: user space's
    ]


@needs_ebpf
def test_packets_the_codec_encodes_pass_and_bad_headers_are_dropped(classifier) -> None:
    before = classifier.counters()
    passed = dropped = 0
    for v6 in (False, True):
        for packet in good_packets():
            assert verdict(classifier, frame(packet, v6=v6)) == XDP_PASS
            passed += 1
        good = good_packets()[0]
        bad = []
        for i in range(len(wire.MAGIC)):
            wrong = bytearray(good)
            wrong[wire.MAGIC_OFFSET + i] ^= 0x20
            bad.append(bytes(wrong))
        for version in (0, 1, wire.VERSION + 1, 255):
            wrong = bytearray(good)
            wrong[wire.VERSION_OFFSET] = version
            bad.append(bytes(wrong))
        bad += [good[: wire.PACKET_MIN - 1], good[: wire.HEADER_SIZE], b""]
        for packet in bad:
            assert verdict(classifier, frame(packet, v6=v6)) == XDP_DROP, packet
            dropped += 1
        # The UDP header's length, not only the frame's, must leave room for a header and a tag.
        assert verdict(classifier, frame(good, v6=v6, udp_len=8 + wire.PACKET_MIN - 1)) == XDP_DROP
        dropped += 1
    after = classifier.counters()
    assert after["membership"] - before["membership"] == passed
    assert after["malformed_dropped"] - before["malformed_dropped"] == dropped


@needs_ebpf
def test_other_ports_are_passed_untouched_whatever_they_carry(classifier) -> None:
    before = classifier.counters()
    for payload in (b"", b"RLMB\x01", good_packets()[0]):
        assert verdict(classifier, frame(payload, dport=MEMBERSHIP_PORT + 1)) == XDP_PASS
    after = classifier.counters()
    assert after["other"] - before["other"] == 3
    assert after["malformed_dropped"] == before["malformed_dropped"]


@needs_ebpf
def test_without_the_defines_the_c_does_not_compile() -> None:
    bcc = kernel.load_bcc()
    with pytest.raises(Exception, match=r"(?i)compile"):
        bcc.BPF(text=kernel.source("xdp.c"))
