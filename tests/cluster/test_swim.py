"""SWIM (broker/cluster/swim.py) in the seeded simulator (labkit/swimsim.py): virtual time, no sockets.
The packet codec alone: tests/ringlog_proto/test_membership_codec.py."""

from __future__ import annotations

import contextlib
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.cluster import swim as sw
from labkit.swimsim import KEYRING, Sim, member
from ringlog_proto import membership as wire


def detection_bound(n: int, config: sw.SwimConfig) -> float:
    """When every live node holds a crashed member dead: some node probes it within ~1 period
    (n - 1 probers, round robin), its probe fails by the period's end, the suspicion times out, and
    DEAD spreads in about log2(n) rounds of gossip (each member also runs its own suspicion timer
    from when SUSPECT reached it). docs/CLUSTER.md states the same bound."""
    return (3 + 2 * math.log2(n)) * config.period + config.suspicion_timeout(n)


def cluster(n: int, seed: int = 1, loss: float = 0.0, config: sw.SwimConfig | None = None) -> Sim:
    sim = Sim(seed=seed, loss=loss, config=config)
    sim.add(1)
    for nid in range(2, n + 1):
        sim.add(nid, [1])
    assert sim.run_until_converged(20) is not None, "did not converge"
    return sim


def dead_times(sim: Sim, nid: int, since: float) -> dict[int, float]:
    """Observer -> when it first held `nid` dead (after `since`)."""
    out: dict[int, float] = {}
    for t, observer, ev in sim.events:
        if t >= since and ev.view.member.node_id == nid and ev.kind == wire.DEAD:
            out.setdefault(observer, t - since)
    return out


# ----------------------------------------------------------------------------- packets in and out


def signed(body: bytes) -> bytes:
    return KEYRING.sign(body)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"RLMB\x02\x01" + bytes(33),  # 39 bytes: no room for the header and the tag
        b"XXXX\x02\x01" + bytes(34),
        b"RLMB\x01\x01" + bytes(34),  # version 1 (unsigned) is no longer spoken
        b"RLMB\x02\x09" + bytes(34),  # unknown kind
        signed(wire.encode_header(wire.PING, 1, 2, 1, 1, 1) + b"\x01"),  # one update announced, none there
        signed(wire.encode_header(wire.PING, 1, 2, 1, 1, 1) + b"\x01\x07" + bytes(8)),  # unknown state
        signed(
            wire.encode(
                wire.Packet(wire.PING, 1, 2, updates=(wire.Update(wire.ALIVE, 3, 1, member(3)),)), KEYRING
            )[:-17]
        ),
        signed(
            wire.encode(wire.Packet(wire.PING, 1, 2, updates=(wire.Update(wire.DEAD, 3, 1),)), KEYRING)[:-16]
            + b"x"
        ),
        signed(wire.encode_header(wire.PING_REQ, 1, 2, 1, 1, 1) + bytes(3)),  # target cut short
        signed(wire.encode_header(wire.PING, 1, 2, 1, 1, 1) + bytes(1500)),  # over one frame
    ],
)
def test_malformed_input_is_refused_and_counted(data: bytes) -> None:
    with pytest.raises(wire.MalformedPacket):
        wire.decode(data, KEYRING)
    node = sw.Swim(member(1), KEYRING, rng=random.Random(1))
    node.receive(data, ("10.0.0.9", 1), 0.0)
    assert node.counters.malformed == 1 and node.take_outgoing() == []


def test_random_garbage_never_raises_anything_but_malformed() -> None:
    rng = random.Random(5)
    good = wire.encode(
        wire.Packet(wire.ACK, 1, 2, 1, 1, 1, updates=(wire.Update(wire.ALIVE, 3, 1, member(3)),)), KEYRING
    )
    node = sw.Swim(member(1), KEYRING, rng=random.Random(1))
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = data[: rng.randint(0, len(data))]
        node.receive(bytes(data), ("10.0.0.9", 1), 0.0)  # decodes or is counted; never raises


def test_non_broker_ping_gets_the_plain_ack() -> None:
    node = sw.Swim(member(4), KEYRING, rng=random.Random(1), incarnation=77)
    node.receive(wire.encode(wire.Packet(wire.PING, 42), KEYRING), ("127.0.0.1", 5555), 0.0)
    [(addr, data)] = node.take_outgoing()
    assert addr == ("127.0.0.1", 5555) and len(data) == wire.PACKET_MIN
    assert wire.decode(data, KEYRING) == wire.Packet(wire.ACK, 42, 4, 2, 9092, 77)


def test_packets_stay_within_one_frame_and_gossip_waits_its_turn() -> None:
    node = sw.Swim(member(1), KEYRING, rng=random.Random(1))
    for nid in range(2, 300):  # far more updates than one packet holds
        node.receive(
            wire.encode(
                wire.Packet(
                    wire.ACK, 1, nid, 2, 9092, 1, updates=(wire.Update(wire.ALIVE, nid, 1, member(nid)),)
                ),
                KEYRING,
            ),
            member(nid).addr,
            0.0,
        )
    node.take_outgoing()
    node.tick(1.0)
    out = node.take_outgoing()
    assert out and all(wire.PACKET_MIN <= len(d) <= wire.PACKET_BYTES_MAX for _, d in out)
    carried = [
        len(wire.decode(d, KEYRING).updates) for _, d in out if wire.decode(d, KEYRING).kind == wire.PING
    ]
    assert carried and 15 < carried[0] < 299  # full, but not everything at once


# ----------------------------------------------------------------------------- the protocol


def test_two_hundred_nodes_converge_through_one_seed() -> None:
    sim = Sim(seed=3)
    sim.add(1)
    for nid in range(2, 211):
        sim.add(nid, [1])
    took = sim.run_until_converged(20)
    assert took is not None and took < 8, took


def test_metadata_reaches_every_node() -> None:
    sim = cluster(12)
    for nid in sim.live():
        views = {v.member.node_id: v for v in sim.nodes[nid].swim.members()}
        for other in sim.live():
            assert views[other].member == sim.nodes[other].swim.me
    sim.nodes[5].swim.update_meta(
        sim.nodes[5].swim.me.__class__(**{**_fields(member(5)), "weight": 300}), sim.now
    )
    sim.run_for(3)
    assert all(_view(sim, o, 5).member.weight == 300 for o in sim.live())


def _fields(m: wire.Member) -> dict[str, object]:
    return {f: getattr(m, f) for f in m.__slots__}  # type: ignore[attr-defined]


def _view(sim: Sim, observer: int, nid: int) -> sw.MemberView:
    return next(v for v in sim.nodes[observer].swim.members() if v.member.node_id == nid)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_crashed_node_is_dead_everywhere_within_the_bound(seed: int) -> None:
    n = 30
    sim = cluster(n, seed=seed)
    sim.run_for(2)
    start = sim.now
    sim.crash(7)
    bound = detection_bound(n, sim.config)
    sim.run_for(bound)
    seen = dead_times(sim, 7, start)
    assert set(seen) == set(sim.live()), f"not dead everywhere within {bound:.2f} s"
    assert all(_view(sim, o, 7).state == wire.DEAD for o in sim.live())


def test_no_false_deaths_under_ten_percent_loss() -> None:
    """20 nodes, 10% loss on every link, 60 s (300 periods): suspicions happen (a probe and all
    three indirect probes lost) and are refuted; nobody live is declared dead."""
    sim = cluster(20, seed=4, loss=0.10)
    start = sim.now
    sim.run_for(60)
    deaths = [
        (t, o, ev.view.member.node_id) for t, o, ev in sim.events if t >= start and ev.kind == wire.DEAD
    ]
    suspicions = sum(1 for t, _, ev in sim.events if t >= start and ev.kind == wire.SUSPECT)
    assert deaths == []
    assert suspicions > 0  # the loss is real: the test would see a too-eager detector
    assert sim.converged()


def test_suspicion_is_refuted_with_a_higher_incarnation() -> None:
    sim = cluster(8)
    before = sim.nodes[3].swim.incarnation
    for other in sim.nodes:  # node 3 cannot be reached for a while, but can send
        if other != 3:
            sim.link_loss[(other, 3)] = 1.0
    sim.run_for(0.6)  # long enough to be suspected, shorter than the suspicion timeout (1 s)
    assert any(ev.kind == wire.SUSPECT and ev.view.member.node_id == 3 for _, _, ev in sim.events)
    sim.link_loss.clear()
    sim.run_for(2.0)
    assert sim.nodes[3].swim.incarnation > before and sim.nodes[3].swim.counters.refuted >= 1
    assert all(_view(sim, o, 3).state == wire.ALIVE for o in sim.live())
    assert not any(ev.kind == wire.DEAD for _, _, ev in sim.events)


def test_a_paused_node_comes_back_without_blaming_others() -> None:
    sim = cluster(6)
    sim.pause(2)
    sim.run_for(detection_bound(6, sim.config) + 1)
    assert all(_view(sim, o, 2).state == wire.DEAD for o in sim.live() if o != 2)
    sim.resume(2)
    sim.run_for(3)
    assert sim.converged()
    assert sim.nodes[2].swim.counters.suspected == 0  # its stale probe was dropped, not blamed


def test_partition_then_heal_converges_back() -> None:
    sim = cluster(12)
    a, b = set(range(1, 7)), set(range(7, 13))
    sim.partition(a, b)
    sim.run_for(6)
    assert all(_view(sim, o, x).state == wire.DEAD for o in a for x in b)
    assert all(_view(sim, o, x).state == wire.DEAD for o in b for x in a)
    sim.heal()
    took = sim.run_until_converged(10)
    assert took is not None, "did not converge after the partition healed"


def test_graceful_leave_is_left_everywhere_and_not_dead() -> None:
    sim = cluster(10)
    start = sim.now
    sim.leave(4)
    sim.run_for(0.5)
    sim.crash(4)  # the process exits after saying goodbye
    sim.run_for(3)
    assert all(_view(sim, o, 4).state == wire.LEFT for o in sim.live())
    assert dead_times(sim, 4, start) == {}


def test_a_dead_node_restarted_is_alive_again_with_a_higher_incarnation() -> None:
    sim = cluster(6)
    old = sim.nodes[6].swim.incarnation
    sim.crash(6)
    sim.run_for(detection_bound(6, sim.config))
    assert all(_view(sim, o, 6).state == wire.DEAD for o in sim.live())
    sim.restart(6, [1])
    sim.run_for(2)
    assert sim.converged()
    assert all(_view(sim, o, 6).incarnation > old for o in sim.live())


def test_runs_replay_exactly_from_the_seed() -> None:
    def run() -> list[tuple[float, int, str, int]]:
        sim = cluster(10, seed=9, loss=0.05)
        sim.crash(3)
        sim.run_for(4)
        return [(t, o, ev.kind, ev.view.member.node_id) for t, o, ev in sim.events]

    assert run() == run()


# ----------------------------------------------------------------------------- hostile input


def test_dead_about_itself_at_the_last_incarnation_does_not_raise() -> None:
    """34 bytes saying "you are dead at incarnation 2^32-1" made the refutation's
    incarnation 2^32, which no u32 field holds: struct.error out of receive stopped the broker."""
    node = sw.Swim(member(1), KEYRING, rng=random.Random(1), incarnation=5)
    last = 0xFFFFFFFF
    for state in (wire.DEAD, wire.SUSPECT, wire.LEFT):
        data = wire.encode(
            wire.Packet(wire.SYNC, 1, 2, 1, 1, 1, updates=(wire.Update(state, 1, last),)), KEYRING
        )
        node.receive(data, ("10.0.0.9", 1), 0.0)
        node.tick(1.0)
        node.take_outgoing()
    assert node.incarnation == 5 and node.counters.unrefutable == 3
    # The same claim from a peer about a member: believed (gossip of a real member's end).
    node.receive(
        wire.encode(
            wire.Packet(wire.SYNC, 1, 2, 1, 1, 1, updates=(wire.Update(wire.ALIVE, 3, 1, member(3)),)),
            KEYRING,
        ),
        ("10.0.0.9", 1),
        0.0,
    )
    node.receive(
        wire.encode(
            wire.Packet(wire.SYNC, 2, 2, 1, 1, 1, updates=(wire.Update(wire.DEAD, 3, last),)), KEYRING
        ),
        ("10.0.0.9", 1),
        0.0,
    )
    node.tick(2.0)
    assert {v.member.node_id: v.state for v in node.members()}[3] == wire.DEAD


OTHER = wire.Keyring([b"another cluster's key"])


def test_a_packet_without_the_key_is_dropped_and_counted() -> None:
    """A forged ALIVE (which would make this node probe an address the sender chose), a forged
    DEAD of a live member, and a plain ping (which would tell the node's start time): none is
    believed or answered without the cluster key."""
    node = sw.Swim(member(1), KEYRING, rng=random.Random(1), incarnation=5)
    node.receive(
        wire.encode(
            wire.Packet(wire.ACK, 1, 2, 1, 1, 1, updates=(wire.Update(wire.ALIVE, 2, 1, member(2)),)), KEYRING
        ),
        member(2).addr,
        0.0,
    )
    node.take_outgoing()
    forged = [
        wire.Packet(
            wire.SYNC,
            1,
            9,
            1,
            1,
            1,
            updates=(wire.Update(wire.ALIVE, 9, 1, wire.Member(9, "192.0.2.1", 1, 53)),),
        ),
        wire.Packet(wire.SYNC, 1, 9, 1, 1, 1, updates=(wire.Update(wire.DEAD, 2, 1),)),
        wire.Packet(wire.PING, 7),
    ]
    for p in forged:
        node.receive(wire.encode(p, OTHER), ("192.0.2.1", 53), 0.0)
        node.receive(wire.encode(p, KEYRING)[:-16] + bytes(16), ("192.0.2.1", 53), 0.0)  # no tag
    assert node.take_outgoing() == []
    assert {v.member.node_id: v.state for v in node.members()} == {1: wire.ALIVE, 2: wire.ALIVE}
    assert node.counters.unauthenticated == 6 and node.counters.malformed == 0


def test_a_rotation_accepts_both_keys_and_signs_with_the_first() -> None:
    old, new = KEYRING.keys[0], b"the new cluster key, 32 bytes.."
    rotating = wire.Keyring([new, old])
    node = sw.Swim(member(1), rotating, rng=random.Random(1), incarnation=5)
    for i, ring in enumerate((KEYRING, wire.Keyring([new]), rotating)):
        node.receive(wire.encode(wire.Packet(wire.PING, i), ring), ("127.0.0.1", 5555), 0.0)
    out = node.take_outgoing()
    assert len(out) == 3 and node.counters.unauthenticated == 0
    assert all(wire.decode(d, wire.Keyring([new])).kind == wire.ACK for _, d in out)
    with pytest.raises(wire.Unauthenticated):
        wire.decode(out[0][1], KEYRING)


# Mutated valid packets: decode raises MalformedPacket (or its Unauthenticated) and nothing else;
# a node fed them neither raises nor changes its view (random bytes:
# tests/ringlog_proto/test_membership_codec.py).
_VALID = [
    wire.encode(
        wire.Packet(
            wire.ACK,
            1,
            2,
            1,
            1,
            1,
            updates=(wire.Update(wire.ALIVE, 3, 1, member(3)), wire.Update(wire.DEAD, 4, 9)),
        ),
        KEYRING,
    ),
    wire.encode(
        wire.Packet(wire.PING_REQ, 1, 2, 1, 1, 1, target=wire.Member(8, "10.0.0.8", 0, 7946)), KEYRING
    ),
    wire.encode(wire.Packet(wire.PING, 5), KEYRING),
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(_VALID),
    st.lists(st.tuples(st.integers(0, 1600), st.integers(0, 255)), max_size=6),
    st.integers(0, 1600),
    st.booleans(),
)
def test_decode_of_mutated_packets_raises_only_malformed(
    valid: bytes, edits: list[tuple[int, int]], cut: int, resign: bool
) -> None:
    data = bytearray(valid[:-16])
    for pos, byte in edits:
        if data:
            data[pos % len(data)] = byte
    body = bytes(data[: max(cut, 24)])
    packet = KEYRING.sign(body) if resign else body + valid[-16:]  # re-signed: the parser is reached
    with contextlib.suppress(wire.MalformedPacket):
        wire.decode(packet, KEYRING)
    node = sw.Swim(member(1), KEYRING, rng=random.Random(1), incarnation=5)
    node.receive(packet, ("10.0.0.9", 1), 0.0)
    node.tick(1.0)
    node.take_outgoing()
