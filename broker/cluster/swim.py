"""SWIM membership, sans-I/O: which nodes are alive, suspect, dead or gone (docs/CLUSTER.md).

Rules this module keeps:
- No sockets, no clock, no randomness of its own: the caller passes `now` (seconds, monotonic) to
  every call and a seeded `random.Random`; packets leave through `take_outgoing()` and changes of
  the view through `take_events()`. The same inputs give the same outputs (the simulator relies on it).
- Membership is a failure *signal*, not a decision: it says what this node believes of the others.
  Placement and leadership belong to the controller and the metadata store.
- The packet is ringlog_proto/membership.py's, the one owner of its bytes (docs/PROTOCOL.md
  §8.2): this module fills packets, up to `packet_bytes`; updates that do not fit wait for the
  next packet.
- Nothing is believed before its tag is (`decode` checks it against every key of the `Keyring`
  before a byte of the payload is parsed): without a valid tag a packet is dropped and counted
  (`unauthenticated`); one that does not decode is dropped and counted (`malformed`).
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
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from ringlog_proto.membership import (
    ACK,
    ALIVE,
    DEAD,
    FLAG_INDIRECT,
    FLAG_JOIN,
    FLAG_REPLY,
    HEADER_SIZE,
    INCARNATION_MAX,
    LEFT,
    PACKET_BYTES_MAX,
    PING,
    PING_REQ,
    SUSPECT,
    SYNC,
    TAG_SIZE,
    Addr,
    Keyring,
    MalformedPacket,
    Member,
    Packet,
    State,
    Unauthenticated,
    Update,
    decode,
    encode_header,
    encode_target,
    encode_update,
)


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
                peer = self._peers[nid]
                self._set(nid, peer, DEAD, peer.incarnation, now)
                self._enqueue(Update(DEAD, nid, peer.incarnation))
        if now >= self._join_at:
            if self._seeds and not self._alive_ids():
                for addr in self._seeds:
                    self._send(addr, PING, self._next_seq(), flags=FLAG_JOIN, first=[self._self_update()])
                self._join_at = now + c.join_retry
            else:
                self._join_at = math.inf
        probe = self._probe
        if probe is not None and not probe.acked:
            if paused:
                self._probe = probe = None
            elif not probe.indirect_sent and now >= probe.start + c.ack_timeout:
                probe.indirect_sent = True
                self._send_ping_reqs(probe)
        if now >= self._next_probe:
            if probe is not None and not probe.acked:
                self._probe_failed(probe, now)
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
        first: Sequence[Update] = (),
    ) -> None:
        """One packet, its free room filled with the least-sent gossip."""
        head = self._header(kind, seq, flags)
        if target is not None:
            head += encode_target(target)
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
