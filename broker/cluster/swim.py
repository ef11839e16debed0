"""SWIM membership, sans-I/O: which nodes are alive, suspect, dead or gone (docs/CLUSTER.md).

Rules this module keeps:
- No sockets, no clock, no randomness of its own: the caller passes `now` (seconds, monotonic) to
  every call and a seeded `random.Random`; packets leave through `take_outgoing()` and changes of
  the view through `take_events()`. The same inputs give the same outputs (the simulator relies on it).
- Membership is a failure *signal*, not a decision: it says what this node believes of the others.
  Placement and leadership belong to the controller and the metadata store.
- This module is the one definition of the membership packet (broker/node/membership.py re-exports
  it). Every packet starts with the 24-byte RLMB header of membership version 2 (magic, version,
  kind, flags, sequence, node_id, cores, port, incarnation) that bpf/xdp.c checks, then a compact
  payload, then a 16-byte tag: HMAC-SHA256 of everything before it under the cluster key, cut to
  128 bits. The whole datagram is bounded by `PACKET_BYTES_MAX` (one Ethernet frame's UDP
  payload). Updates that do not fit wait for the next packet.
- Nothing is believed before its tag is: a packet is checked against every key of the `Keyring`
  (two during a rotation, memberlist's keyring rule: the first signs, any verifies) before a byte
  of its payload is parsed. Without a valid tag it is dropped and counted (`unauthenticated`); a
  packet that does not decode is dropped and counted (`malformed`). `decode` raises nothing but
  `MalformedPacket` (of which `Unauthenticated` is a kind), whatever the bytes.
- Nothing a packet says may stop the node: an incarnation is a u32, and a claim about this node at
  the last one (which no refutation can beat) is counted and ignored instead of overflowing.
- A PING from node id 0 (a tool that is not a broker, signed with the key) gets the plain ACK.
- Member states are the `State` enum, never strings: a comparison with a misspelt or wrongly
  cased string cannot silently be false everywhere (SWIM's deaths never reached the
  cluster agent because its supervisor compared "dead" with "DEAD").
- Failure detection (SWIM, Das et al. 2002): once per protocol period, probe one member (round robin
  over a shuffled list, so each is probed within two periods of its turn); no ACK within
  `ack_timeout`: ask `indirect_k` others to probe it (PING_REQ); still nothing by the end of the
  period: SUSPECT. A suspect that does not refute within the suspicion timeout is DEAD (confirm).
- Incarnations order what is said about a node: ALIVE(i) beats anything of incarnation < i;
  SUSPECT(i) beats ALIVE(i); DEAD(i) and LEFT(i) beat ALIVE(i) and SUSPECT(i). Only a node raises its
  own incarnation: told it is suspect or dead at incarnation i, it refutes with ALIVE(i + 1). A
  restarted node starts at a higher incarnation (the supervisor uses its start time), so a dead or
  left node that comes back is alive again.
- Dissemination is infection style: each update rides on the packets this node sends anyway,
  fewest-sent first, `retransmit_mult * ceil(log10(n + 1))` times. A push-pull SYNC of the whole
  view with one random member every `sync_interval` repairs what gossip lost; a node that hears from
  a member it thinks dead tells it so (it refutes), and every `reconnect_interval` a node pings one
  dead member: after a partition heals, both sides find each other again.
- A tick that comes more than a period late means this node was paused (SIGSTOP, a stall): the
  probe in flight is dropped instead of blamed on its target.

Defaults (SwimConfig), sized for fast failover on a LAN:
- period 200 ms, ack_timeout 80 ms (a LAN round trip is well under 1 ms; 80 ms absorbs a busy
  supervisor loop and leaves 120 ms of the period for the indirect probes), indirect_k 3.
- suspicion timeout = suspicion_mult (5) * max(1, log10(n)) * period: 1 s up to 10 nodes, 2 s at
  100, 2.3 s at 200. Gossip reaches every member in about log(n) periods, so the suspect hears of
  its suspicion (and refutes) well within that even at 10% loss, while a crashed node of a small
  cluster is confirmed dead about 1.5 s after it stops answering.
- retransmit_mult 4 (memberlist's value); sync_interval 3 s; reconnect_interval 1 s; dead and left
  members are kept 300 s (so late gossip about them cannot resurrect them) and then forgotten.

Packet format: docs/PROTOCOL.md §8.2.
"""

from __future__ import annotations

import enum
import hmac
import math
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

MAGIC: Final = b"RLMB"
VERSION: Final = 2  # 2: every packet ends with the cluster key's tag (version 1 had none)
HEADER_SIZE: Final = 24
TAG_SIZE: Final = 16  # HMAC-SHA256 cut to 128 bits (RFC 2104 §5: at least half the hash, 80 bits)
PACKET_MIN: Final = HEADER_SIZE + TAG_SIZE  # bpf/xdp.c: RL_MEMBERSHIP_MIN
PACKET_BYTES_MAX: Final = 1472  # one Ethernet frame's UDP payload: larger datagrams are not ours
KEY_BYTES_MIN: Final = 16
INCARNATION_MAX: Final = 0xFFFFFFFF  # a u32 on the wire

PING: Final = 1
ACK: Final = 2
PING_REQ: Final = 3  # "probe this target for me": payload starts with the target
SYNC: Final = 4  # a view (or part of one) pushed whole: push-pull anti-entropy, join replies, nudges
KINDS: Final = frozenset({PING, ACK, PING_REQ, SYNC})

FLAG_JOIN: Final = 0x0001  # on a PING: "send me your view" (answered by ACK and SYNC packets)
FLAG_REPLY: Final = 0x0002  # on a SYNC: "send me yours back"
FLAG_INDIRECT: Final = 0x0004  # on an ACK: relayed for a PING_REQ


class State(enum.Enum):
    """A member's state. Its value is the name `<data_dir>/run/members.json` shows."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


ALIVE: Final = State.ALIVE
SUSPECT: Final = State.SUSPECT
DEAD: Final = State.DEAD
LEFT: Final = State.LEFT
_STATE_CODE: Final = {ALIVE: 1, SUSPECT: 2, DEAD: 3, LEFT: 4}
_CODE_STATE: Final = {v: k for k, v in _STATE_CODE.items()}

_HEADER = struct.Struct(">4sBBHIIHHI")
_UPDATE_HEAD = struct.Struct(">BII")  # state, node_id, incarnation
_META = struct.Struct(">HHHH")  # client port, membership port, cores, weight
_TARGET = struct.Struct(">IH")  # PING_REQ: target node id, membership port (then the host, str8)
assert _HEADER.size == HEADER_SIZE

Addr = tuple[str, int]


class MalformedPacket(ValueError):
    """Not a membership packet of a version we speak."""


class Unauthenticated(MalformedPacket):
    """A membership packet whose tag no key of the keyring made: dropped unread."""


class Keyring:
    """The cluster's membership keys: the first signs every packet sent, any of them verifies one
    received. Rotating is three rolling restarts: add the new key second on every node, then move
    it first (nodes now sign with it and still accept the old one), then drop the old one."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not 1 <= len(keys) <= 2:
            raise ValueError(f"{len(keys)} keys: a keyring holds one, or two during a rotation")
        for k in keys:
            if len(k) < KEY_BYTES_MIN:
                raise ValueError(f"a key of {len(k)} bytes: at least {KEY_BYTES_MIN}")
        self.keys: tuple[bytes, ...] = tuple(keys)

    @classmethod
    def from_file(cls, path: str | Path) -> Keyring:
        """One key a line in hex (`openssl rand -hex 32`); blank lines and `#` comments skipped.
        Raises OSError or ValueError with what is wrong."""
        keys = []
        for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
            text = raw.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                keys.append(bytes.fromhex(text))
            except ValueError:
                raise ValueError(f"{path}:{n}: not a key in hex") from None
        try:
            return cls(keys)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def sign(self, body: bytes) -> bytes:
        return body + hmac.digest(self.keys[0], body, "sha256")[:TAG_SIZE]

    def verify(self, data: bytes) -> bool:
        body, tag = data[:-TAG_SIZE], data[-TAG_SIZE:]
        return any(hmac.compare_digest(hmac.digest(k, body, "sha256")[:TAG_SIZE], tag) for k in self.keys)


@dataclass(frozen=True, slots=True)
class Member:
    """What a node says of itself, gossiped with every ALIVE: enough to reach each of its cores."""

    node_id: int
    host: str
    port: int  # the broker's client TCP port
    membership_port: int
    direct_ports: tuple[int, ...] = ()  # core k's direct TCP port at index k
    cores: int = 1
    weight: int = 100
    rack: str = ""

    @property
    def addr(self) -> Addr:
        return (self.host, self.membership_port)


@dataclass(frozen=True, slots=True)
class Update:
    """One statement about a node. `member` is set for ALIVE only (the metadata travels with it)."""

    state: State
    node_id: int
    incarnation: int
    member: Member | None = None


@dataclass(frozen=True, slots=True)
class Packet:
    kind: int
    sequence: int
    node_id: int = 0
    cores: int = 0
    port: int = 0
    incarnation: int = 0
    flags: int = 0
    target: Member | None = None  # PING_REQ: node_id, host and membership_port are used
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class MemberView:
    """This node's belief about one member (itself included)."""

    member: Member
    state: State
    incarnation: int

    def to_json(self) -> dict[str, object]:
        m = self.member
        return {
            "node_id": m.node_id,
            "state": self.state.value,
            "incarnation": self.incarnation,
            "host": m.host,
            "port": m.port,
            "membership_port": m.membership_port,
            "direct_ports": list(m.direct_ports),
            "cores": m.cores,
            "weight": m.weight,
            "rack": m.rack,
        }


@dataclass(frozen=True, slots=True)
class MemberEvent:
    kind: State  # the member's new state
    view: MemberView


# ----------------------------------------------------------------------------- codec


def _str8(s: str) -> bytes:
    b = s.encode()
    if len(b) > 255:
        raise ValueError(f"{s[:20]!r}...: longer than 255 bytes")
    return bytes((len(b),)) + b


def encode_update(u: Update) -> bytes:
    out = _UPDATE_HEAD.pack(_STATE_CODE[u.state], u.node_id, u.incarnation)
    if u.state == ALIVE:
        m = u.member
        assert m is not None
        out += _str8(m.host) + _META.pack(m.port, m.membership_port, m.cores, m.weight) + _str8(m.rack)
        out += bytes((len(m.direct_ports),)) + struct.pack(f">{len(m.direct_ports)}H", *m.direct_ports)
    return out


def encode_header(
    kind: int, seq: int, node_id: int, cores: int, port: int, inc: int, flags: int = 0
) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, kind, flags, seq, node_id, cores, port, inc)


def _encode_target(t: Member) -> bytes:
    return _TARGET.pack(t.node_id, t.membership_port) + _str8(t.host)


def encode(p: Packet, keyring: Keyring) -> bytes:
    """The whole packet, signed (every update must fit: `Swim` fills its packets itself)."""
    out = encode_header(p.kind, p.sequence, p.node_id, p.cores, p.port, p.incarnation, p.flags)
    if p.target is not None:
        out += _encode_target(p.target)
    if p.updates:
        out += bytes((len(p.updates),)) + b"".join(encode_update(u) for u in p.updates)
    if len(out) + TAG_SIZE > PACKET_BYTES_MAX:
        raise ValueError(f"{len(out) + TAG_SIZE} bytes: more than {PACKET_BYTES_MAX}")
    return keyring.sign(out)


def _str8_at(data: bytes, pos: int) -> tuple[str, int]:
    n = data[pos]
    end = pos + 1 + n
    if end > len(data):
        raise MalformedPacket(f"string of {n} bytes truncated at byte {pos}")
    try:
        return data[pos + 1 : end].decode(), end
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"bad string: {exc}") from exc


_ALIVE_CACHE: dict[bytes, Update] = {}  # the same ALIVE record arrives many times: decode it once
_ALIVE_CACHE_MAX = 4096


def _decode_update(data: bytes, pos: int) -> tuple[Update, int]:
    code, node_id, inc = _UPDATE_HEAD.unpack_from(data, pos)
    start = pos
    pos += _UPDATE_HEAD.size
    state = _CODE_STATE.get(code)
    if state is None:
        raise MalformedPacket(f"unknown member state {code}")
    if state != ALIVE:
        return Update(state, node_id, inc), pos
    p_rack = pos + 1 + data[pos] + _META.size
    p_direct = p_rack + 1 + data[p_rack]
    end = p_direct + 1 + 2 * data[p_direct]
    if end > len(data):
        raise MalformedPacket(f"member record truncated at byte {start}")
    key = data[start:end]
    u = _ALIVE_CACHE.get(key)
    if u is not None:
        return u, end
    host, pos = _str8_at(data, pos)
    port, mport, cores, weight = _META.unpack_from(data, pos)
    rack, pos = _str8_at(data, pos + _META.size)
    direct = struct.unpack_from(f">{data[pos]}H", data, pos + 1)
    u = Update(state, node_id, inc, Member(node_id, host, port, mport, direct, cores, weight, rack))
    if len(_ALIVE_CACHE) >= _ALIVE_CACHE_MAX:
        _ALIVE_CACHE.clear()
    _ALIVE_CACHE[key] = u
    return u, end


def decode(data: bytes, keyring: Keyring) -> Packet:
    """The packet `data` holds, once its tag is one of `keyring`'s; raises MalformedPacket (or
    Unauthenticated) and nothing else, whatever `data` is."""
    if len(data) < PACKET_MIN:
        raise MalformedPacket(f"{len(data)} bytes, shorter than the {HEADER_SIZE}-byte header and the tag")
    if len(data) > PACKET_BYTES_MAX:
        raise MalformedPacket(f"{len(data)} bytes, longer than {PACKET_BYTES_MAX}")
    magic, version, kind, flags, seq, node, cores, port, inc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MalformedPacket(f"magic {magic!r}, not {MAGIC!r}")
    if version != VERSION:
        raise MalformedPacket(f"version {version}, not {VERSION}")
    if kind not in KINDS:
        raise MalformedPacket(f"unknown kind {kind}")
    if not keyring.verify(data):
        raise Unauthenticated("no key of the keyring made this packet's tag")
    data = data[:-TAG_SIZE]
    pos = HEADER_SIZE
    target = None
    updates: list[Update] = []
    try:
        if kind == PING_REQ:
            tid, tport = _TARGET.unpack_from(data, pos)
            thost, pos = _str8_at(data, pos + _TARGET.size)
            target = Member(tid, thost, 0, tport)
        if pos < len(data):
            count = data[pos]
            pos += 1
            for _ in range(count):
                u, pos = _decode_update(data, pos)
                updates.append(u)
    except (struct.error, IndexError) as exc:
        raise MalformedPacket(f"truncated payload: {exc}") from exc
    if pos != len(data):
        raise MalformedPacket(f"{len(data) - pos} bytes after the last update")
    return Packet(kind, seq, node, cores, port, inc, flags, target, tuple(updates))


# ----------------------------------------------------------------------------- the state machine


@dataclass(frozen=True, slots=True)
class SwimConfig:
    period: float = 0.2
    ack_timeout: float = 0.08
    indirect_k: int = 3
    suspicion_mult: float = 5.0
    retransmit_mult: int = 4
    sync_interval: float = 3.0
    reconnect_interval: float = 1.0
    join_retry: float = 1.0
    dead_retain: float = 300.0
    leave_fanout: int = 8  # members told directly of a graceful leave (gossip does the rest)
    packet_bytes: int = PACKET_BYTES_MAX

    def suspicion_timeout(self, n: int) -> float:
        return self.suspicion_mult * max(1.0, math.log10(max(1, n))) * self.period

    def retransmits(self, n: int) -> int:
        return self.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))


@dataclass(slots=True)
class _Peer:
    member: Member
    state: State
    incarnation: int
    since: float
    nudged: float = -math.inf
    record: bytes = b""  # this peer's update as SYNC sends it, encoded once per change


@dataclass(slots=True)
class _Probe:
    target: int
    incarnation: int
    seq: int
    start: float
    acked: bool = False
    indirect_sent: bool = False


@dataclass(slots=True)
class _Gossip:
    data: bytes
    sent: int = 0


@dataclass(slots=True)
class Counters:
    pings: int = 0  # PINGs answered
    acks_received: int = 0
    malformed: int = 0
    unauthenticated: int = 0  # dropped: no key of the keyring made their tag
    unrefutable: int = 0  # claims about this node at INCARNATION_MAX, which it cannot outbid
    probes: int = 0
    indirect_probes: int = 0
    suspected: int = 0  # members this node suspected itself (its probe failed)
    refuted: int = 0  # times this node refuted a suspicion of itself
    packets_out: int = 0
    bytes_out: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class Swim:
    """One node's SWIM state machine. Drive it with receive/tick; drain take_outgoing/take_events."""

    def __init__(
        self,
        me: Member,
        keyring: Keyring,
        config: SwimConfig | None = None,
        rng: random.Random | None = None,
        now: float = 0.0,
        incarnation: int = 0,
    ) -> None:
        self.me = me
        self.keyring = keyring
        self.config = config or SwimConfig()
        self.rng = rng or random.Random(me.node_id)
        self.incarnation = incarnation
        self.left = False
        self.counters = Counters()
        self._peers: dict[int, _Peer] = {}
        self._suspects: dict[int, float] = {}  # node id -> when it turns dead
        self._queue: dict[int, _Gossip] = {}  # node id -> the latest update about it, encoded
        self._out: list[tuple[Addr, bytes]] = []
        self._events: list[MemberEvent] = []
        self._seq = self.rng.getrandbits(32)
        self._probe: _Probe | None = None
        self._order: list[int] = []
        c = self.config
        self._next_probe = now + self.rng.random() * c.period  # nodes started together stay out of step
        self._next_sync = now + c.sync_interval * (0.5 + self.rng.random())
        self._next_reconnect = now + c.reconnect_interval * (0.5 + self.rng.random())
        self._seeds: list[Addr] = []
        self._join_at = math.inf
        self._relays: dict[int, tuple[Addr, int, float]] = {}  # our seq -> (asker, its seq, expiry)
        self._last_tick = now
        self._enqueue(self._self_update())

    # ------------------------------------------------------------------------- the API

    def join(self, seeds: list[Addr], now: float) -> None:
        """Ask the seeds for their view now and every `join_retry` until some member answers."""
        self._seeds = [a for a in seeds if a != self.me.addr]
        self._join_at = now
        self.tick(now)

    def leave(self, now: float) -> None:
        """Say goodbye: LEFT goes to a few members at once and on every packet after."""
        if self.left:
            return
        self.left = True
        self._probe = None
        u = Update(LEFT, self.me.node_id, self.incarnation)
        self._enqueue(u)
        alive = self._alive_ids()
        self.rng.shuffle(alive)
        for nid in alive[: self.config.leave_fanout]:
            self._send_sync(self._peers[nid].member.addr, [u], reply=False)
        self._events.append(MemberEvent(LEFT, self._self_view()))

    def update_meta(self, me: Member, now: float) -> None:
        """New metadata of this node (weight, ports): a new incarnation carries it."""
        assert me.node_id == self.me.node_id
        self.me = me
        self.incarnation = min(self.incarnation + 1, INCARNATION_MAX)
        self._enqueue(self._self_update())
        self._events.append(MemberEvent(ALIVE, self._self_view()))

    def members(self) -> list[MemberView]:
        """Every member this node knows of (itself first), dead and left ones until forgotten."""
        views = [self._self_view()]
        views += [MemberView(p.member, p.state, p.incarnation) for _, p in sorted(self._peers.items())]
        return views

    def take_outgoing(self) -> list[tuple[Addr, bytes]]:
        out, self._out = self._out, []
        return out

    def take_events(self) -> list[MemberEvent]:
        ev, self._events = self._events, []
        return ev

    def next_deadline(self) -> float:
        if self.left:
            return math.inf  # nothing more to time: it answers what arrives until it exits
        d = min(self._next_probe, self._next_sync, self._next_reconnect, self._join_at)
        p = self._probe
        if p is not None and not p.acked and not p.indirect_sent:
            d = min(d, p.start + self.config.ack_timeout)
        if self._suspects:
            d = min(d, *self._suspects.values())
        return d

    def suspicion_timeout(self) -> float:
        return self.config.suspicion_timeout(len(self._alive_ids()) + 1)

    # ------------------------------------------------------------------------- time

    def tick(self, now: float) -> None:
        c = self.config
        paused = now - self._last_tick > 1.5 * c.period  # nothing here waits longer than a period
        self._last_tick = now
        for seq in [s for s, (_, _, exp) in self._relays.items() if exp <= now]:
            del self._relays[seq]
        if self.left:
            return
        for nid, when in list(self._suspects.items()):
            if when <= now:
                p = self._peers[nid]
                self._set(nid, p, DEAD, p.incarnation, now)
                self._enqueue(Update(DEAD, nid, p.incarnation))
        if now >= self._join_at:
            if self._seeds and not self._alive_ids():
                for addr in self._seeds:
                    self._send(addr, PING, self._next_seq(), flags=FLAG_JOIN, first=[self._self_update()])
                self._join_at = now + c.join_retry
            else:
                self._join_at = math.inf
        p = self._probe
        if p is not None and not p.acked:
            if paused:
                self._probe = p = None
            elif not p.indirect_sent and now >= p.start + c.ack_timeout:
                p.indirect_sent = True
                self._send_ping_reqs(p)
        if now >= self._next_probe:
            if p is not None and not p.acked:
                self._probe_failed(p, now)
            self._probe = None
            self._next_probe = max(self._next_probe + c.period, now)
            self._start_probe(now)
        if now >= self._next_sync:
            self._next_sync = now + c.sync_interval
            alive = self._alive_ids()
            if alive:
                self._send_sync(
                    self._peers[self.rng.choice(alive)].member.addr, self._view_updates(), reply=True
                )
        if now >= self._next_reconnect:
            self._next_reconnect = now + c.reconnect_interval
            self._reconnect(now)

    def _start_probe(self, now: float) -> None:
        while True:
            if not self._order:
                self._order = [nid for nid, p in self._peers.items() if p.state in (ALIVE, SUSPECT)]
                if not self._order:
                    return
                self.rng.shuffle(self._order)
            nid = self._order.pop()
            peer = self._peers.get(nid)
            if peer is not None and peer.state in (ALIVE, SUSPECT):
                break
        self._probe = _Probe(nid, peer.incarnation, self._next_seq(), now)
        self.counters.probes += 1
        self._send(peer.member.addr, PING, self._probe.seq)

    def _send_ping_reqs(self, p: _Probe) -> None:
        target = self._peers.get(p.target)
        if target is None:
            return
        others = [nid for nid in self._alive_ids() if nid != p.target]
        k = min(self.config.indirect_k, len(others))
        for nid in self.rng.sample(others, k):
            self.counters.indirect_probes += 1
            self._send(self._peers[nid].member.addr, PING_REQ, p.seq, target=target.member)

    def _probe_failed(self, p: _Probe, now: float) -> None:
        peer = self._peers.get(p.target)
        if peer is None or peer.state != ALIVE or peer.incarnation != p.incarnation:
            return
        self.counters.suspected += 1
        self._suspect(p.target, peer, peer.incarnation, now)
        # Tell the suspect itself at once: it refutes sooner than gossip would reach it.
        self._send_sync(peer.member.addr, [Update(SUSPECT, p.target, peer.incarnation)], reply=False)

    def _reconnect(self, now: float) -> None:
        """Ping one dead member: if it is back (a partition healed), each side tells the other."""
        keep = now - self.config.dead_retain
        for nid in [n for n, p in self._peers.items() if p.state in (DEAD, LEFT) and p.since < keep]:
            del self._peers[nid]
            self._queue.pop(nid, None)
        dead = [nid for nid, p in self._peers.items() if p.state == DEAD]
        if dead:
            self._send(self._peers[self.rng.choice(dead)].member.addr, PING, self._next_seq())
        elif self._seeds and not self._alive_ids():  # alone again: ask the seeds
            self._join_at = now

    # ------------------------------------------------------------------------- packets in

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        try:
            pkt = decode(data, self.keyring)
        except Unauthenticated:
            self.counters.unauthenticated += 1
            return
        except MalformedPacket:
            self.counters.malformed += 1
            return
        if pkt.node_id == 0:  # not a broker (a tool holding the key): the plain ping/ack
            if pkt.kind == PING:
                self.counters.pings += 1
                m = self.me
                self._emit(
                    addr, encode_header(ACK, pkt.sequence, m.node_id, m.cores, m.port, self.incarnation)
                )
            return
        if pkt.node_id == self.me.node_id:
            self.counters.extra["own_id"] = self.counters.extra.get("own_id", 0) + 1
            return
        stale = [u.node_id for u in pkt.updates if self._merge(u, now)]
        if stale:  # the sender spreads old news of a member that refuted or came back: correct it
            self._send_sync(addr, [self._record(nid) for nid in stale], reply=False)
        self._check_sender(pkt, addr, now)
        if pkt.kind == PING:
            self.counters.pings += 1
            self._send(addr, ACK, pkt.sequence)
            if pkt.flags & FLAG_JOIN:
                self._send_sync(addr, self._view_updates(), reply=False)
        elif pkt.kind == ACK:
            self.counters.acks_received += 1
            p = self._probe
            if p is not None and pkt.sequence == p.seq:
                p.acked = True
            relay = self._relays.pop(pkt.sequence, None)
            if relay is not None:
                self._send(relay[0], ACK, relay[1], flags=FLAG_INDIRECT)
        elif pkt.kind == PING_REQ:
            if not self.left and pkt.target is not None:
                seq = self._next_seq()
                self._relays[seq] = (addr, pkt.sequence, now + self.config.period)
                self._send(pkt.target.addr, PING, seq)
        elif pkt.kind == SYNC and pkt.flags & FLAG_REPLY and not self.left:
            self._send_sync(addr, self._view_updates(), reply=False)

    def _check_sender(self, pkt: Packet, addr: Addr, now: float) -> None:
        """A member we hold suspect, dead or left but that talks to us at that incarnation does not
        know it: tell it (at most once a period), so that it refutes."""
        p = self._peers.get(pkt.node_id)
        if p is None or p.state == ALIVE or p.incarnation < pkt.incarnation:
            return
        if now - p.nudged < self.config.period:
            return
        p.nudged = now
        self._send_sync(addr, [Update(p.state, pkt.node_id, p.incarnation)], reply=False)

    def _merge(self, u: Update, now: float) -> bool:
        """Apply one update; True when it is older news than ours of a member alive (or of us):
        without a correction, the holder of a stale suspicion would confirm it once the
        refutation's gossip has died out."""
        if u.node_id == self.me.node_id:
            if u.state != ALIVE and not self.left:
                if u.incarnation >= INCARNATION_MAX:  # nothing outbids it: believe none of it
                    self.counters.unrefutable += 1
                    return False
                if u.incarnation >= self.incarnation:
                    self.incarnation = u.incarnation + 1
                    self.counters.refuted += 1
                    self._enqueue(self._self_update())
                    self._events.append(MemberEvent(ALIVE, self._self_view()))
                    return False
                return True
            return False
        if u.node_id == 0:
            return False
        p = self._peers.get(u.node_id)
        if p is None:
            if u.state == ALIVE and u.member is not None:
                p = _Peer(u.member, ALIVE, u.incarnation, now)
                self._peers[u.node_id] = p
                self._order.insert(self.rng.randrange(len(self._order) + 1), u.node_id)
                self._events.append(MemberEvent(ALIVE, MemberView(p.member, ALIVE, p.incarnation)))
                self._enqueue(u)
            return False
        inc, state = u.incarnation, p.state
        if u.state != ALIVE and state == ALIVE and inc < p.incarnation:
            return True
        if u.state == ALIVE:
            if inc > p.incarnation and u.member is not None:
                p.member = u.member
                self._set(u.node_id, p, ALIVE, inc, now)
                self._enqueue(u)
        elif u.state == SUSPECT:
            if (state == ALIVE and inc >= p.incarnation) or (state == SUSPECT and inc > p.incarnation):
                self._suspect(u.node_id, p, inc, now)
        elif u.state == DEAD:
            if (state in (ALIVE, SUSPECT) and inc >= p.incarnation) or (
                state == DEAD and inc > p.incarnation
            ):
                self._set(u.node_id, p, DEAD, inc, now)
                self._enqueue(u)
        elif u.state == LEFT and ((state != LEFT and inc >= p.incarnation) or inc > p.incarnation):
            self._set(u.node_id, p, LEFT, inc, now)
            self._enqueue(u)
        return False

    def _record(self, nid: int) -> bytes:
        if nid == self.me.node_id:
            return encode_update(self._self_update())
        p = self._peers[nid]
        if not p.record:
            p.record = encode_update(
                Update(p.state, nid, p.incarnation, p.member if p.state == ALIVE else None)
            )
        return p.record

    def _suspect(self, nid: int, p: _Peer, inc: int, now: float) -> None:
        self._set(nid, p, SUSPECT, inc, now)
        self._suspects[nid] = now + self.suspicion_timeout()
        self._enqueue(Update(SUSPECT, nid, inc))

    def _set(self, nid: int, p: _Peer, state: State, inc: int, now: float) -> None:
        changed = state != p.state or inc != p.incarnation
        p.state, p.incarnation, p.since, p.record = state, inc, now, b""
        if state != SUSPECT:
            self._suspects.pop(nid, None)
        if changed:
            self._events.append(MemberEvent(state, MemberView(p.member, state, inc)))

    # ------------------------------------------------------------------------- packets out

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq

    def _alive_ids(self) -> list[int]:
        return [nid for nid, p in self._peers.items() if p.state in (ALIVE, SUSPECT)]

    def _self_update(self) -> Update:
        return Update(LEFT if self.left else ALIVE, self.me.node_id, self.incarnation, self.me)

    def _self_view(self) -> MemberView:
        return MemberView(self.me, LEFT if self.left else ALIVE, self.incarnation)

    def _view_updates(self) -> list[bytes]:
        return [self._record(self.me.node_id), *(self._record(nid) for nid in self._peers)]

    def _enqueue(self, u: Update) -> None:
        self._queue[u.node_id] = _Gossip(encode_update(u))

    def _header(self, kind: int, seq: int, flags: int = 0) -> bytes:
        m = self.me
        return encode_header(kind, seq, m.node_id, m.cores, m.port, self.incarnation, flags)

    def _send(
        self,
        addr: Addr,
        kind: int,
        seq: int,
        flags: int = 0,
        target: Member | None = None,
        first: list[Update] = (),  # type: ignore[assignment]
    ) -> None:
        """One packet, its free room filled with the least-sent gossip."""
        head = self._header(kind, seq, flags)
        if target is not None:
            head += _encode_target(target)
        parts = [encode_update(u) for u in first]
        room = self.config.packet_bytes - TAG_SIZE - len(head) - 1 - sum(map(len, parts))
        if self._queue:
            limit = self.config.retransmits(len(self._peers) + 1)
            firsts = {u.node_id for u in first}
            for nid, g in sorted(self._queue.items(), key=lambda kv: kv[1].sent):
                if len(parts) >= 255 or len(g.data) > room:
                    if room < 16:
                        break
                    continue
                if nid in firsts:
                    continue
                parts.append(g.data)
                room -= len(g.data)
                g.sent += 1
                if g.sent >= limit:
                    del self._queue[nid]
        body = head + (bytes((len(parts),)) + b"".join(parts) if parts else b"")
        self._emit(addr, body)

    def _send_sync(self, addr: Addr, updates: list[Update] | list[bytes], reply: bool) -> None:
        """`updates` in as many SYNC packets as they need; only the first asks for a reply."""
        flags = FLAG_REPLY if reply else 0
        room_max = self.config.packet_bytes - TAG_SIZE - HEADER_SIZE - 1
        parts: list[bytes] = []
        room = room_max
        for u in updates:
            data = u if isinstance(u, bytes) else encode_update(u)
            if (len(data) > room or len(parts) == 255) and parts:
                self._emit(
                    addr, self._header(SYNC, self._next_seq(), flags) + bytes((len(parts),)) + b"".join(parts)
                )
                flags, parts, room = 0, [], room_max
            parts.append(data)
            room -= len(data)
        if parts:
            self._emit(
                addr, self._header(SYNC, self._next_seq(), flags) + bytes((len(parts),)) + b"".join(parts)
            )

    def _emit(self, addr: Addr, body: bytes) -> None:
        data = self.keyring.sign(body)
        self.counters.packets_out += 1
        self.counters.bytes_out += len(data)
        self._out.append((addr, data))
