"""The membership endpoint: SWIM (broker/cluster/swim.py) on a UDP socket of the supervisor.

Rules this module keeps:
- The packet's bytes are ringlog_proto/membership.py's (docs/PROTOCOL.md §8.2), which tools and
  tests import too. Every packet is signed with the cluster key (its `Keyring`): a tool pinging a
  broker needs the key as well; `read_keyring` reads it from the `--membership-key-file`.
- `SwimEndpoint` is driven from the supervisor's selector: no thread, no worker involvement.
- Nothing a datagram says may stop the supervisor: the codec raises only its own error, and a
  bug that still escapes `Swim.receive` is logged and counted (`errors`), never propagated. A
  send to an address a member named that the socket refuses (a bad host string) is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from pathlib import Path
from typing import Final

from broker.cluster.swim import Swim
from ringlog_proto.membership import (
    ACK,
    PACKET_BYTES_MAX,
    PING,
    Keyring,
    MalformedPacket,
    Packet,
    decode,
    encode,
)

log = logging.getLogger(__name__)

RECV_BATCH: Final = 64  # datagrams read per readiness event, so one busy sender cannot starve the loop


def read_keyring(path: str | Path) -> Keyring:
    """The cluster key file at `path`: one key a line in hex (`openssl rand -hex 32`), two during a
    rotation. Raises OSError or ValueError with what is wrong."""
    return Keyring.from_text(Path(path).read_text(), str(path))


def ping(host: str, port: int, keyring: Keyring, sequence: int = 1, timeout: float = 1.0) -> Packet:
    """Ping a broker's membership endpoint with the cluster key and return its ack (raises
    TimeoutError, OSError). Answers not signed with the key are ignored."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(encode(Packet(PING, sequence), keyring), (host, port))
        deadline = time.monotonic() + timeout
        while True:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            data, _ = s.recvfrom(PACKET_BYTES_MAX)
            with contextlib.suppress(MalformedPacket):
                p = decode(data, keyring)
                if p.kind == ACK and p.sequence == sequence:
                    return p


class SwimEndpoint:
    """Runs a SWIM node (broker/cluster/swim.py) on the membership socket, from the supervisor's
    selector: `on_readable` feeds it datagrams, `poll` ticks it when `next_deadline()` is due, and
    both send what it queued. Signed pings from tools get the plain ack (Swim does it)."""

    def __init__(self, sock: socket.socket, swim: Swim) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.swim = swim
        self.errors = 0

    def on_readable(self, now: float) -> None:
        for _ in range(RECV_BATCH):
            try:
                data, addr = self.sock.recvfrom(PACKET_BYTES_MAX + 1)  # one more: oversized is malformed
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # e.g. ECONNREFUSED from an earlier packet's ICMP: nothing to do
                continue
            try:
                self.swim.receive(data, (addr[0], addr[1]), now)
            except Exception:  # a bug of ours, never the sender's to trigger: keep the node up
                self.errors += 1
                log.exception("membership: a packet from %s:%d was not handled", addr[0], addr[1])
        self.flush()

    def poll(self, now: float) -> None:
        if now >= self.swim.next_deadline():
            self.swim.tick(now)
        self.flush()

    def timeout(self, now: float) -> float:
        return max(0.0, self.swim.next_deadline() - now)

    def flush(self) -> None:
        for addr, data in self.swim.take_outgoing():
            # A full buffer or an unreachable peer: UDP may drop. ValueError: a host
            # string the socket refuses (an embedded NUL), which a member could have named.
            with contextlib.suppress(OSError, ValueError):
                self.sock.sendto(data, addr)

    def counters(self) -> dict[str, int]:
        c = self.swim.counters
        return {
            "pings": c.pings,
            "acks_received": c.acks_received,
            "malformed": c.malformed,
            "unauthenticated": c.unauthenticated,
            "unrefutable": c.unrefutable,
            "errors": self.errors,
            "probes": c.probes,
            "suspected": c.suspected,
            "refuted": c.refuted,
        }
