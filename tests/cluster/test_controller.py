"""The controller's decisions: placement, elections from the in-sync set, fencing of ISR changes."""

from __future__ import annotations

import collections
import itertools
import random

import pytest

from broker.cluster.controller import (
    IsrRefused,
    assign,
    assigned,
    cancel_reassignment,
    change_isr,
    check_assignment,
    elect,
    handed_over,
    reconcile,
    start_reassignment,
)
from broker.cluster.placement import Candidate, place, rank
from broker.core.cluster_view import NO_LEADER, PartitionState
from broker.core.replica_changes import Election, ReplicaFault, ReplicaRefused

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
        assert set(s.replicas) == set(place(9, p, NODES, 3))  # rendezvous's replicas, reordered
        assert s.leader == s.replicas[0] and s.leader_epoch == 0 and s.isr == s.replicas


@pytest.mark.parametrize("topic_id", range(1, 40))
def test_a_topic_s_leaders_spread_as_evenly_as_its_replicas_allow(topic_id: int) -> None:
    """Rendezvous alone leads 3 partitions of 3 replicas on 3 nodes from one node 1 time in 9;
    Kafka's placement spreads them one each, and so does ours, whatever the topic's id."""
    three = NODES[:3]
    assert sorted(s.leader for s in assign(topic_id, 3, 3, three)) == [1, 2, 3]
    assert sorted(collections.Counter(s.leader for s in assign(topic_id, 9, 3, three)).values()) == [3, 3, 3]
    placed = [place(topic_id, p, NODES, 3) for p in range(8)]
    fewest = min(  # every choice of leaders: the fewest leads the busiest node can have
        max(collections.Counter(choice).values()) for choice in itertools.product(*placed)
    )
    leads = collections.Counter(s.leader for s in assign(topic_id, 8, 3, NODES))
    assert max(leads.values()) == fewest
    for s, p in zip(assign(topic_id, 8, 3, NODES), range(8), strict=True):
        assert set(s.replicas) == set(place(topic_id, p, NODES, 3))
        assert s.replicas[1:] == tuple(r for r in place(topic_id, p, NODES, 3) if r != s.leader)


def test_leaders_follow_weights_and_a_completed_topic_leads_as_one_placed_whole() -> None:
    nodes = [Candidate(1, 100), Candidate(2, 200), Candidate(3, 100)]
    leads = collections.Counter(s.leader for s in assign(5, 400, 3, nodes))
    assert leads == {1: 100, 2: 200, 3: 100}
    whole = assign(5, 12, 2, NODES)
    parts = assign(5, 12, 2, NODES, [0, 1, 2, 3, 4]) + assign(5, 12, 2, NODES, [5, 6, 7, 8, 9, 10, 11])
    assert parts == whole
    assert assign(5, 12, 2, NODES, []) == []


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
    # Kafka's order while it moves: the target's replicas, then those it removes
    assert adding == PartitionState((2, 3, 4, 1), 1, 4, (1, 2, 3), target=(2, 3, 4), adding=(4,))
    assert adding.removing == (1,)
    assert reconcile(adding, live={1, 2, 3, 4}) is None  # 4 is catching up: nothing to do
    synced = PartitionState((2, 3, 4, 1), 1, 4, (1, 2, 3, 4), target=(2, 3, 4), adding=(4,))
    done = reconcile(synced, live={1, 2, 3, 4})
    # the old replica goes; the lead moves into the target at a new epoch
    assert done == PartitionState((2, 3, 4), 2, 5, (2, 3, 4))
    # a leader inside the target keeps the lead and the epoch
    kept = reconcile(
        PartitionState((2, 3, 4, 1), 2, 4, (1, 2, 3, 4), target=(2, 3, 4), adding=(4,)), live={1, 2, 3, 4}
    )
    assert kept == PartitionState((2, 3, 4), 2, 4, (2, 3, 4))


def test_starting_a_reassignment_is_kafkas_first_step() -> None:
    s = PartitionState((1, 2, 3), 1, 4, (1, 2, 3))
    moving = start_reassignment(s, (4, 2))
    assert moving == PartitionState((4, 2, 1, 3), 1, 4, (1, 2, 3), target=(4, 2), adding=(4,))
    assert moving.removing == (1, 3)
    # the same replicas in another order, nothing under way: done at once, the leader kept
    assert start_reassignment(s, (3, 1, 2)) == PartitionState((3, 1, 2), 1, 4, (1, 2, 3))
    # a new target replaces the one under way, from the replicas as they are (4 is kept as added
    # by the first: Kafka's rule), and 5 is what it adds now
    again = start_reassignment(moving, (5, 4))
    assert again == PartitionState((5, 4, 2, 1, 3), 1, 4, (1, 2, 3), target=(5, 4), adding=(5,))
    # pure removal: nothing to add; done as soon as the target is in sync
    shrink = start_reassignment(s, (2, 3))
    assert shrink.adding == () and shrink.removing == (1,)
    assert reconcile(shrink, live={1, 2, 3}) == PartitionState((2, 3), 2, 5, (2, 3))


def test_cancelling_takes_the_added_replicas_out() -> None:
    moving = PartitionState((4, 2, 1, 3), 1, 4, (1, 2, 3), target=(4, 2), adding=(4,))
    # Kafka's revert keeps the order the reassignment gave the replicas
    assert cancel_reassignment(moving, live={1, 2, 3, 4}) == PartitionState((2, 1, 3), 1, 4, (1, 2, 3))
    # an added replica that had caught up and leads: the lead goes to a kept in-sync one
    led = PartitionState((4, 2, 1, 3), 4, 5, (4, 2, 3), target=(4, 2), adding=(4,))
    assert cancel_reassignment(led, live={1, 2, 3, 4}) == PartitionState((2, 1, 3), 2, 6, (2, 3))
    # only added replicas in sync: an unclean revert, refused unless the topic allows it
    only_new = PartitionState((4, 1), 4, 5, (4,), target=(4,), adding=(4,))
    with pytest.raises(ReplicaRefused, match="unclean") as refused:
        cancel_reassignment(only_new, live={1, 4})
    assert refused.value.kind is ReplicaFault.ASSIGNMENT
    assert cancel_reassignment(only_new, live={1, 4}, unclean=True) == PartitionState((1,), 1, 6, (1,))
    with pytest.raises(ReplicaRefused) as none:
        cancel_reassignment(PartitionState((1, 2), 1, 0, (1, 2)), live={1, 2})
    assert none.value.kind is ReplicaFault.NO_REASSIGNMENT


def test_a_preferred_election_moves_the_lead_to_the_first_replica_only_when_it_may() -> None:
    s = PartitionState((1, 2, 3), 2, 7, (1, 2, 3))
    assert elect(s, Election.PREFERRED, live={1, 2, 3}) == PartitionState((1, 2, 3), 1, 8, (1, 2, 3))
    refusals = [
        (PartitionState((1, 2, 3), 1, 7, (1, 2, 3)), {1, 2, 3}, (), ReplicaFault.NOT_NEEDED, "leads"),
        (s, {2, 3}, (), ReplicaFault.NOT_AVAILABLE, "not live"),
        # it leads, but died a moment ago: the controller has not replaced it yet
        (PartitionState((1, 2, 3), 1, 7, (1, 2, 3)), {2, 3}, (), ReplicaFault.NOT_AVAILABLE, "not live"),
        (PartitionState((1, 2, 3), 2, 7, (2, 3)), {1, 2, 3}, (), ReplicaFault.NOT_AVAILABLE, "not in sync"),
        (s, {1, 2, 3}, {1}, ReplicaFault.NOT_AVAILABLE, "stopping"),
    ]
    for state, live, draining, kind, why in refusals:
        with pytest.raises(ReplicaRefused, match=why) as refused:
            elect(state, Election.PREFERRED, live, draining)
        assert refused.value.kind is kind


def test_an_unclean_election_takes_an_out_of_sync_replica_only_when_no_in_sync_one_lives() -> None:
    offline = PartitionState((1, 2, 3), NO_LEADER, 7, (1,))
    assert elect(offline, Election.UNCLEAN, live={2, 3}) == PartitionState((1, 2, 3), 2, 8, (2,))
    assert elect(offline, Election.UNCLEAN, live={2, 3}, draining={2}) == PartitionState(
        (1, 2, 3), 3, 8, (3,)
    )
    # an in-sync replica alive: a clean election, the in-sync set kept
    assert elect(offline, Election.UNCLEAN, live={1, 3}) == PartitionState((1, 2, 3), 1, 8, (1,))
    with pytest.raises(ReplicaRefused) as led:
        elect(PartitionState((1, 2, 3), 2, 7, (2,)), Election.UNCLEAN, live={1, 2, 3})
    assert led.value.kind is ReplicaFault.NOT_NEEDED
    with pytest.raises(ReplicaRefused) as nobody:
        elect(offline, Election.UNCLEAN, live={4})
    assert nobody.value.kind is ReplicaFault.NOT_AVAILABLE
    # once elected, the controller leaves it alone
    elected = elect(offline, Election.UNCLEAN, live={2, 3})
    assert reconcile(elected, live={2, 3}) is None


def test_manual_assignments_are_checked_as_kafka_checks_them() -> None:
    check_assignment([(1, 2), (2, 3)], registered={1, 2, 3})
    for assignment, registered, replication, why in [
        ([(1, 2), ()], {1, 2}, None, "empty replica list"),
        ([(1, 9)], {1, 2}, None, "node 9, but no such node is registered"),
        ([(1, 1)], {1, 2}, None, "node 1 more than once"),
        ([(1, 2), (1,)], {1, 2}, None, "1 replica\\(s\\), but this is not consistent"),
        ([(1,)], {1, 2}, 2, "previous partitions, which have 2"),
    ]:
        with pytest.raises(ReplicaRefused, match=why) as refused:
            check_assignment(assignment, registered, replication)
        assert refused.value.kind is ReplicaFault.ASSIGNMENT
    # the active replicas start in sync, the first of them leading; none active: refused
    assert assigned([(3, 1, 2)], active={1, 2}) == [PartitionState((3, 1, 2), 1, 0, (1, 2))]
    with pytest.raises(ReplicaRefused, match="partition 5"):
        assigned([(3,)], active={1, 2}, first=5)


def test_drain_picks_the_best_spare_node() -> None:
    from broker.cluster.controller import drain_target

    nodes = [Candidate(i) for i in (1, 2, 4, 5)]  # 3 is the node being drained
    s = PartitionState((3, 1, 2), 3, 0, (3, 1, 2))
    target = drain_target(9, 0, s, 3, nodes)
    assert target is not None and target[1:] == (1, 2) and target[0] in (4, 5)
    best = next(c.node_id for c in rank(9, 0, nodes) if c.node_id not in (1, 2, 3))
    assert target[0] == best
    assert drain_target(9, 0, s, 7, nodes) is None  # holds nothing there
