"""The membership endpoint: a UDP ping/ack on each broker, the seed of the cluster protocol.

Rules this module keeps:
- Sans-I/O codec of the plain ping/ack (`encode`, `decode`, `ping` for tools and tests) plus
  `SwimEndpoint`, which the supervisor drives from its selector: no thread, no worker involvement.
  The gossip protocol itself is broker/cluster/swim.py (same header; its PING_REQ and SYNC kinds
  and payloads are documented there). `MembershipEndpoint` is the ping/ack answerer alone.
- Every packet starts with the fixed 24-byte header below, so that the XDP classifier (bpf/xdp.c)
  checks it with one length comparison, one 4-byte compare and one byte compare, at fixed offsets
  from the UDP header. Bytes after the header are ignored (room for gossip payloads).
- A packet that is too short, has the wrong magic or version, or an unknown kind is counted as
  malformed and dropped without an answer (XDP drops those first when it is attached).

Packet format (membership version 1, integers big-endian; docs/PROTOCOL.md §8):

    offset size field
    0      4    magic        "RLMB" (0x52 0x4C 0x4D 0x42)
    4      1    version      1
    5      1    kind         1 PING, 2 ACK
    6      2    flags        0 (senders write 0, receivers ignore)
    8      4    sequence     u32 chosen by the pinger, echoed in the ack
    12     4    node_id      u32 of the sender (0 for a pinger that is not a broker)
    16     2    cores        u16 worker count of the sender (0 for a non-broker pinger)
    18     2    port         u16 the sender's broker TCP port (0 for a non-broker pinger)
    20     4    incarnation  u32 the sender's start time (unix seconds): a restarted broker differs
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from dataclasses import dataclass
from typing import Final

from broker.cluster.swim import Swim

MAGIC: Final = b"RLMB"
VERSION: Final = 1
PING: Final = 1
ACK: Final = 2
HEADER_SIZE: Final = 24  # bpf/xdp.c: RL_MEMBERSHIP_HEADER
PACKET_BYTES_MAX: Final = 1472  # one Ethernet frame's UDP payload: larger datagrams are not ours
RECV_BATCH: Final = 64  # datagrams read per readiness event, so one busy sender cannot starve the loop

_HEADER = struct.Struct(">4sBBHIIHHI")
assert _HEADER.size == HEADER_SIZE


@dataclass(frozen=True, slots=True)
class Packet:
    kind: int
    sequence: int
    node_id: int = 0
    cores: int = 0
    port: int = 0
    incarnation: int = 0


class MalformedPacket(ValueError):
    """Not a membership packet of a version we speak."""


def encode(p: Packet) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, p.kind, 0, p.sequence, p.node_id, p.cores, p.port, p.incarnation)


def decode(data: bytes) -> Packet:
    if len(data) < HEADER_SIZE:
        raise MalformedPacket(f"{len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, version, kind, _flags, seq, node, cores, port, inc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MalformedPacket(f"magic {magic!r}, not {MAGIC!r}")
    if version != VERSION:
        raise MalformedPacket(f"version {version}, not {VERSION}")
    if kind not in (PING, ACK):
        raise MalformedPacket(f"unknown kind {kind}")
    return Packet(kind, seq, node, cores, port, inc)


class MembershipEndpoint:
    """Answers pings on a bound, non-blocking UDP socket. Counters for `broker stats`."""

    def __init__(self, sock: socket.socket, node_id: int, cores: int, port: int) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.node_id = node_id
        self.cores = cores
        self.port = port
        self.incarnation = int(time.time()) & 0xFFFFFFFF
        self.pings = 0
        self.acks_received = 0
        self.malformed = 0

    def on_readable(self) -> None:
        for _ in range(RECV_BATCH):
            try:
                data, addr = self.sock.recvfrom(PACKET_BYTES_MAX)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. ECONNREFUSED from an earlier ack's ICMP: nothing to do
                continue
            try:
                p = decode(data)
            except MalformedPacket:
                self.malformed += 1
                continue
            if p.kind == ACK:
                self.acks_received += 1
                continue
            self.pings += 1
            ack = Packet(ACK, p.sequence, self.node_id, self.cores, self.port, self.incarnation)
            with contextlib.suppress(OSError):  # a full socket buffer drops an ack, as UDP may
                self.sock.sendto(encode(ack), addr)

    def counters(self) -> dict[str, int]:
        return {"pings": self.pings, "acks_received": self.acks_received, "malformed": self.malformed}


def ping(host: str, port: int, sequence: int = 1, timeout: float = 1.0) -> Packet:
    """Ping a broker's membership endpoint and return its ack (raises TimeoutError, OSError)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(encode(Packet(PING, sequence)), (host, port))
        deadline = time.monotonic() + timeout
        while True:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            data, _ = s.recvfrom(PACKET_BYTES_MAX)
            with contextlib.suppress(MalformedPacket):
                p = decode(data)
                if p.kind == ACK and p.sequence == sequence:
                    return p


class SwimEndpoint:
    """Runs a SWIM node (broker/cluster/swim.py) on the membership socket, from the supervisor's
    selector: `on_readable` feeds it datagrams, `poll` ticks it when `next_deadline()` is due, and
    both send what it queued. Plain pings from non-brokers still get the plain ack (Swim does it)."""

    def __init__(self, sock: socket.socket, swim: Swim) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.swim = swim

    def on_readable(self, now: float) -> None:
        for _ in range(RECV_BATCH):
            try:
                data, addr = self.sock.recvfrom(PACKET_BYTES_MAX + 1)  # one more: oversized is malformed
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # e.g. ECONNREFUSED from an earlier packet's ICMP: nothing to do
                continue
            self.swim.receive(data, (addr[0], addr[1]), now)
        self.flush()

    def poll(self, now: float) -> None:
        if now >= self.swim.next_deadline():
            self.swim.tick(now)
        self.flush()

    def timeout(self, now: float) -> float:
        return max(0.0, self.swim.next_deadline() - now)

    def flush(self) -> None:
        for addr, data in self.swim.take_outgoing():
            with contextlib.suppress(OSError):  # a full buffer or an unreachable peer: UDP may drop
                self.sock.sendto(data, addr)

    def counters(self) -> dict[str, int]:
        c = self.swim.counters
        return {
            "pings": c.pings,
            "acks_received": c.acks_received,
            "malformed": c.malformed,
            "probes": c.probes,
            "suspected": c.suspected,
            "refuted": c.refuted,
        }
