"""The controller's decisions: placement, elections from the in-sync set, fencing of ISR changes."""

from __future__ import annotations

import collections
import itertools
import random

import pytest

from broker.cluster.controller import IsrRefused, assign, change_isr, handed_over, reconcile
from broker.cluster.placement import Candidate, place, rank
from broker.core.cluster_view import NO_LEADER, PartitionState

NODES = [Candidate(i) for i in range(1, 6)]


def test_placement_is_deterministic_distinct_and_spread() -> None:
    leaders: collections.Counter[int] = collections.Counter()
    for p in range(2000):
        replicas = place(7, p, NODES, 3)
        assert len(set(replicas)) == 3
        assert replicas == place(7, p, list(reversed(NODES)), 3)  # input order does not matter
        leaders[replicas[0]] += 1
    assert set(leaders) == {1, 2, 3, 4, 5}
    assert max(leaders.values()) < 1.25 * min(leaders.values())


def test_weights_skew_placement_proportionally() -> None:
    nodes = [Candidate(1, 100), Candidate(2, 200), Candidate(3, 100)]
    firsts = collections.Counter(place(3, p, nodes, 1)[0] for p in range(6000))
    share = firsts[2] / 6000
    assert 0.45 < share < 0.55  # weight 200 of 400


def test_adding_a_node_moves_only_replicas_it_takes() -> None:
    before = {p: place(1, p, NODES, 3) for p in range(1000)}
    after = {p: place(1, p, [*NODES, Candidate(6)], 3) for p in range(1000)}
    moved = 0
    for p in range(1000):
        lost = set(before[p]) - set(after[p])
        gained = set(after[p]) - set(before[p])
        assert gained <= {6}  # nothing moves between old nodes
        moved += len(lost)
    assert 0.4 * 1000 < moved < 0.8 * 1000  # about 3/6 of partitions gain node 6


def test_racks_are_spread_first() -> None:
    nodes = [Candidate(1, rack="a"), Candidate(2, rack="a"), Candidate(3, rack="b"), Candidate(4, rack="b")]
    for p in range(300):
        replicas = place(2, p, nodes, 2)
        racks = {next(n.rack for n in nodes if n.node_id == r) for r in replicas}
        assert racks == {"a", "b"}
        order = [c.node_id for c in rank(2, p, nodes)]
        assert order.index(replicas[0]) < order.index(replicas[1])


def test_too_few_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="replication factor 4"):
        place(1, 0, NODES[:3], 4)


def test_assign_leads_with_the_preferred_replica() -> None:
    states = assign(9, 4, 3, NODES)
    for p, s in enumerate(states):
        assert s.replicas == place(9, p, NODES, 3)
        assert s.leader == s.replicas[0] and s.leader_epoch == 0 and s.isr == s.replicas


S = PartitionState(replicas=(1, 2, 3), leader=1, leader_epoch=4, isr=(1, 2, 3))


def test_leader_death_elects_the_next_in_sync_replica() -> None:
    s = reconcile(S, live={2, 3})
    assert s == PartitionState((1, 2, 3), 2, 5, (2, 3))
    assert reconcile(s, live={2, 3}) is None  # idempotent


def test_follower_death_only_shrinks_the_isr() -> None:
    assert reconcile(S, live={1, 2}) == PartitionState((1, 2, 3), 1, 4, (1, 2))


def test_out_of_sync_replica_is_never_elected() -> None:
    s = PartitionState((1, 2, 3), 1, 4, (1, 2))  # 3 is alive but behind
    s2 = reconcile(s, live={3})
    assert s2 == PartitionState((1, 2, 3), NO_LEADER, 5, (2,))  # offline; 2 holds every acked record
    assert reconcile(s2, live={3}) is None
    back = reconcile(s2, live={2, 3})
    assert back == PartitionState((1, 2, 3), 2, 6, (2,))


def test_unclean_election_takes_any_live_replica_when_allowed() -> None:
    s = PartitionState((1, 2, 3), NO_LEADER, 5, (2,))
    assert reconcile(s, live={3}, unclean=True) == PartitionState((1, 2, 3), 3, 6, (3,))


def test_preferred_leader_takes_back_the_lead_once_in_sync() -> None:
    s = PartitionState((1, 2, 3), 2, 5, (2, 3))
    assert reconcile(s, live={1, 2, 3}) is None  # 1 is live but not yet in sync
    s = PartitionState((1, 2, 3), 2, 5, (2, 3, 1))
    assert reconcile(s, live={1, 2, 3}) == PartitionState((1, 2, 3), 1, 6, (2, 3, 1))
    assert reconcile(s, live={1, 2, 3}, prefer=False) is None


def test_a_draining_leader_hands_over_to_an_in_sync_replica_and_is_not_given_it_back() -> None:
    """Kafka's controlled shutdown: the lead moves while the node still runs; it stays in sync
    (it follows until it leaves) and the preferred-leader rule does not hand the lead back."""
    s = reconcile(S, live={1, 2, 3}, draining={1})
    assert s == PartitionState((1, 2, 3), 2, 5, (1, 2, 3))
    assert handed_over(s, 1, {1, 2, 3}, {1})
    assert reconcile(s, live={1, 2, 3}, draining={1}) is None
    # a draining node is never elected, from an offline partition either
    off = PartitionState((1, 2, 3), NO_LEADER, 5, (1, 3))
    assert reconcile(off, live={1, 2, 3}, draining={1}) == PartitionState((1, 2, 3), 3, 6, (1, 3))
    # once it has left (its presence gone), as a follower's death: only the ISR shrinks
    assert reconcile(s, live={2, 3}) == PartitionState((1, 2, 3), 2, 5, (2, 3))


def test_a_draining_leader_without_an_in_sync_successor_keeps_the_lead() -> None:
    alone = PartitionState((1, 2, 3), 1, 4, (1,))  # the others are behind: electing one loses data
    assert reconcile(alone, live={1, 2, 3}, draining={1}) is None
    assert handed_over(alone, 1, {1, 2, 3}, {1})  # nothing to wait for
    assert not handed_over(S, 1, {1, 2, 3}, {1})
    assert handed_over(S, 1, {1, 2, 3}, {1, 2, 3})  # every other one leaves too


def test_random_failures_keep_the_invariants() -> None:
    rng = random.Random(5)
    for _ in range(300):
        s = PartitionState((1, 2, 3), 1, 0, (1, 2, 3))
        for _ in range(20):
            live = {n for n in (1, 2, 3) if rng.random() < 0.6}
            new = reconcile(s, live) or s
            assert new.isr and set(new.isr) <= set(new.replicas)
            assert new.leader == NO_LEADER or (new.leader in new.isr and new.leader in live)
            assert new.leader_epoch == s.leader_epoch + (new.leader != s.leader)
            # the ISR only shrinks here: growth is the leader's proposal, after catching up
            assert set(new.isr) <= set(s.isr)
            s = new


def test_isr_changes_are_fenced_by_leader_and_epoch() -> None:
    assert change_isr(S, 1, 4, [1, 3]) == PartitionState((1, 2, 3), 1, 4, (1, 3))
    assert change_isr(S, 1, 4, [3, 1, 2]).isr == (1, 2, 3)  # kept in replica order
    for leader, epoch, isr in [(2, 4, [2]), (1, 3, [1]), (1, 4, [2, 3]), (1, 4, [1, 9])]:
        with pytest.raises(IsrRefused):
            change_isr(S, leader, epoch, isr)


def test_every_live_combination_reconciles_in_one_step() -> None:
    for live_n in range(4):
        for live in itertools.combinations((1, 2, 3), live_n):
            once = reconcile(S, set(live)) or S
            assert reconcile(once, set(live)) is None


def test_reassignment_adds_then_waits_for_sync_then_drops() -> None:
    s = PartitionState((1, 2, 3), 1, 4, (1, 2, 3), target=(2, 3, 4))
    adding = reconcile(s, live={1, 2, 3, 4})
    assert adding == PartitionState((1, 2, 3, 4), 1, 4, (1, 2, 3), target=(2, 3, 4))
    assert reconcile(adding, live={1, 2, 3, 4}) is None  # 4 is catching up: nothing to do
    synced = PartitionState((1, 2, 3, 4), 1, 4, (1, 2, 3, 4), target=(2, 3, 4))
    done = reconcile(synced, live={1, 2, 3, 4})
    # the old replica goes; the lead moves into the target at a new epoch
    assert done == PartitionState((2, 3, 4), 2, 5, (2, 3, 4))
    # a leader inside the target keeps the lead and the epoch
    kept = reconcile(PartitionState((1, 2, 3, 4), 2, 4, (1, 2, 3, 4), target=(2, 3, 4)), live={1, 2, 3, 4})
    assert kept == PartitionState((2, 3, 4), 2, 4, (2, 3, 4))


def test_drain_picks_the_best_spare_node() -> None:
    from broker.cluster.controller import drain_target

    nodes = [Candidate(i) for i in (1, 2, 4, 5)]  # 3 is the node being drained
    s = PartitionState((3, 1, 2), 3, 0, (3, 1, 2))
    target = drain_target(9, 0, s, 3, nodes)
    assert target is not None and target[1:] == (1, 2) and target[0] in (4, 5)
    best = next(c.node_id for c in rank(9, 0, nodes) if c.node_id not in (1, 2, 3))
    assert target[0] == best
    assert drain_target(9, 0, s, 7, nodes) is None  # holds nothing there
