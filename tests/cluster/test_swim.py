"""SWIM (broker/cluster/swim.py) in the seeded simulator (swimsim.py): virtual time, no sockets."""

from __future__ import annotations

import math
import random

import pytest
from swimsim import Sim, member

from broker.cluster import swim as sw


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
        if t >= since and ev.view.member.node_id == nid and ev.kind == sw.DEAD:
            out.setdefault(observer, t - since)
    return out


# ----------------------------------------------------------------------------- codec


def test_codec_round_trip() -> None:
    m = member(7, rack="r1")
    ups = (
        sw.Update(sw.ALIVE, 7, 3, m),
        sw.Update(sw.SUSPECT, 8, 1),
        sw.Update(sw.DEAD, 9, 2),
        sw.Update(sw.LEFT, 10, 5),
    )
    p = sw.Packet(
        sw.PING_REQ, 0xFFFFFFFF, 7, 2, 9092, 3, sw.FLAG_JOIN, sw.Member(8, "10.0.0.8", 0, 7946), ups
    )
    data = sw.encode(p)
    assert data[:5] == b"RLMB\x01" and data[5] == sw.PING_REQ  # what bpf/xdp.c checks
    assert sw.decode(data) == p
    plain = sw.Packet(sw.PING, 5, 0)
    assert sw.encode(plain) == b"RLMB\x01\x01" + bytes(2) + (5).to_bytes(4, "big") + bytes(12)
    assert sw.decode(sw.encode(plain)) == plain


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"RLMB\x01\x01" + bytes(17),  # 23 bytes
        b"XXXX\x01\x01" + bytes(18),
        b"RLMB\x02\x01" + bytes(18),
        b"RLMB\x01\x09" + bytes(18),  # unknown kind
        sw.encode_header(sw.PING, 1, 2, 1, 1, 1) + b"\x01",  # one update announced, none there
        sw.encode_header(sw.PING, 1, 2, 1, 1, 1) + b"\x01\x07" + bytes(8),  # unknown state
        sw.encode(sw.Packet(sw.PING, 1, 2, updates=(sw.Update(sw.ALIVE, 3, 1, member(3)),)))[:-1],
        sw.encode(sw.Packet(sw.PING, 1, 2, updates=(sw.Update(sw.DEAD, 3, 1),))) + b"x",  # trailing byte
        sw.encode_header(sw.PING_REQ, 1, 2, 1, 1, 1) + bytes(3),  # target cut short
        bytes(sw.encode_header(sw.PING, 1, 2, 1, 1, 1)) + bytes(1500),  # over one frame
    ],
)
def test_malformed_input_is_refused_and_counted(data: bytes) -> None:
    with pytest.raises(sw.MalformedPacket):
        sw.decode(data)
    node = sw.Swim(member(1), rng=random.Random(1))
    node.receive(data, ("10.0.0.9", 1), 0.0)
    assert node.counters.malformed == 1 and node.take_outgoing() == []


def test_random_garbage_never_raises_anything_but_malformed() -> None:
    rng = random.Random(5)
    good = sw.encode(sw.Packet(sw.ACK, 1, 2, 1, 1, 1, updates=(sw.Update(sw.ALIVE, 3, 1, member(3)),)))
    node = sw.Swim(member(1), rng=random.Random(1))
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = data[: rng.randint(0, len(data))]
        node.receive(bytes(data), ("10.0.0.9", 1), 0.0)  # decodes or is counted; never raises


def test_non_broker_ping_gets_the_plain_ack() -> None:
    node = sw.Swim(member(4), rng=random.Random(1), incarnation=77)
    node.receive(sw.encode(sw.Packet(sw.PING, 42)), ("127.0.0.1", 5555), 0.0)
    [(addr, data)] = node.take_outgoing()
    assert addr == ("127.0.0.1", 5555) and len(data) == sw.HEADER_SIZE
    assert sw.decode(data) == sw.Packet(sw.ACK, 42, 4, 2, 9092, 77)


def test_packets_stay_within_one_frame_and_gossip_waits_its_turn() -> None:
    node = sw.Swim(member(1), rng=random.Random(1))
    for nid in range(2, 300):  # far more updates than one packet holds
        node.receive(
            sw.encode(
                sw.Packet(sw.ACK, 1, nid, 2, 9092, 1, updates=(sw.Update(sw.ALIVE, nid, 1, member(nid)),))
            ),
            member(nid).addr,
            0.0,
        )
    node.take_outgoing()
    node.tick(1.0)
    out = node.take_outgoing()
    assert out and all(sw.HEADER_SIZE <= len(d) <= sw.PACKET_BYTES_MAX for _, d in out)
    carried = [len(sw.decode(d).updates) for _, d in out if sw.decode(d).kind == sw.PING]
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


def _fields(m: sw.Member) -> dict[str, object]:
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
    assert all(_view(sim, o, 7).state == sw.DEAD for o in sim.live())


def test_no_false_deaths_under_ten_percent_loss() -> None:
    """20 nodes, 10% loss on every link, 60 s (300 periods): suspicions happen (a probe and all
    three indirect probes lost) and are refuted; nobody live is declared dead."""
    sim = cluster(20, seed=4, loss=0.10)
    start = sim.now
    sim.run_for(60)
    deaths = [(t, o, ev.view.member.node_id) for t, o, ev in sim.events if t >= start and ev.kind == sw.DEAD]
    suspicions = sum(1 for t, _, ev in sim.events if t >= start and ev.kind == sw.SUSPECT)
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
    assert any(ev.kind == sw.SUSPECT and ev.view.member.node_id == 3 for _, _, ev in sim.events)
    sim.link_loss.clear()
    sim.run_for(2.0)
    assert sim.nodes[3].swim.incarnation > before and sim.nodes[3].swim.counters.refuted >= 1
    assert all(_view(sim, o, 3).state == sw.ALIVE for o in sim.live())
    assert not any(ev.kind == sw.DEAD for _, _, ev in sim.events)


def test_a_paused_node_comes_back_without_blaming_others() -> None:
    sim = cluster(6)
    sim.pause(2)
    sim.run_for(detection_bound(6, sim.config) + 1)
    assert all(_view(sim, o, 2).state == sw.DEAD for o in sim.live() if o != 2)
    sim.resume(2)
    sim.run_for(3)
    assert sim.converged()
    assert sim.nodes[2].swim.counters.suspected == 0  # its stale probe was dropped, not blamed


def test_partition_then_heal_converges_back() -> None:
    sim = cluster(12)
    a, b = set(range(1, 7)), set(range(7, 13))
    sim.partition(a, b)
    sim.run_for(6)
    assert all(_view(sim, o, x).state == sw.DEAD for o in a for x in b)
    assert all(_view(sim, o, x).state == sw.DEAD for o in b for x in a)
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
    assert all(_view(sim, o, 4).state == sw.LEFT for o in sim.live())
    assert dead_times(sim, 4, start) == {}


def test_a_dead_node_restarted_is_alive_again_with_a_higher_incarnation() -> None:
    sim = cluster(6)
    old = sim.nodes[6].swim.incarnation
    sim.crash(6)
    sim.run_for(detection_bound(6, sim.config))
    assert all(_view(sim, o, 6).state == sw.DEAD for o in sim.live())
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
