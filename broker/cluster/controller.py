"""What the controller decides: replicas for new partitions, leaders and in-sync sets as nodes
come and go. Pure functions; the agent (broker/cluster/agent.py) writes their answers to the
store, each in a transaction fenced by the partition's revision.

Rules this module keeps:
- Live means registered in the store: a node's key lives on its etcd lease, so a node the store
  no longer hears from is not live, whatever any membership view says. SWIM's confirmation of a
  death only makes the agent revoke that lease sooner (membership is a signal; the store decides).
- A new leader comes from the in-sync set only: every acknowledged (acks=all) record is on every
  member of it, so electing one loses nothing. With none of them live the partition goes offline
  (leader -1) and waits for one to come back, unless unclean election is allowed, which takes any
  live replica and says in the docs what that may lose.
- The in-sync set never becomes empty: the last member stays in it (Kafka's rule), so that when
  every replica died, the one that returns first with all acknowledged records is the one elected.
- The leader epoch grows by one with every change of leader (to -1 included), never otherwise:
  batches carry it, and followers truncate by it (KIP-101), so it must name one leader's term.
- The preferred leader (the first replica) takes the lead back once it is live and in sync, so
  leadership spreads over the nodes again after a failure heals.
- A draining node (stopping gracefully: Kafka's controlled shutdown) is live but leads nothing
  it can hand over: each partition it leads moves to the next live, non-draining in-sync replica
  (epoch + 1, the in-sync set as it is: the node still follows until it leaves), it is never
  elected, and the preferred-leader rule does not give its partitions back to it. A partition
  with no such replica stays with it until it leaves (then as a death).
- A node that is merely down keeps its replicas; moving them is a reassignment (`broker reassign`,
  or the controller after `--reassign-after-s` of a node's absence): a `target` in the state,
  reached by adding its replicas, waiting for them to be in sync, then dropping the others.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from broker.cluster.placement import Candidate, place, rank
from broker.core.cluster_view import NO_LEADER, PartitionState


def assign(
    topic_id: int, partitions: int, replication: int, nodes: Sequence[Candidate]
) -> list[PartitionState]:
    """The first state of each partition of a new topic: placed replicas, the preferred one leading."""
    states = []
    for p in range(partitions):
        replicas = place(topic_id, p, nodes, replication)
        states.append(PartitionState(replicas=replicas, leader=replicas[0], leader_epoch=0, isr=replicas))
    return states


def reconcile(
    state: PartitionState,
    live: Collection[int],
    unclean: bool = False,
    prefer: bool = True,
    draining: Collection[int] = (),
) -> PartitionState | None:
    """The state a partition should move to given the live nodes (`draining`: those of them
    stopping gracefully), or None when it is right as is.

    Idempotent: a controller that takes over, or one that missed an event, calls it for every
    partition and converges to the same states."""
    s = state
    eligible = [n for n in live if n not in draining]  # may be elected
    for node in [n for n in s.isr if n not in live]:
        s = _without(s, node, eligible)
    if s.leader == NO_LEADER:
        back = [r for r in s.replicas if r in s.isr and r in eligible]
        if back:
            s = replace(s, leader=back[0], leader_epoch=s.leader_epoch + 1)
        elif unclean:
            alive = [r for r in s.replicas if r in eligible]
            if alive:
                s = replace(s, leader=alive[0], leader_epoch=s.leader_epoch + 1, isr=(alive[0],))
    elif s.leader in draining:
        successors = [r for r in s.replicas if r in s.isr and r in eligible]
        if successors:
            s = replace(s, leader=successors[0], leader_epoch=s.leader_epoch + 1)
    elif prefer and not s.target:
        preferred = s.replicas[0]
        if preferred != s.leader and preferred in s.isr and preferred in eligible:
            s = replace(s, leader=preferred, leader_epoch=s.leader_epoch + 1)
    if s.target:
        s = _reassigning(s, eligible)
    return None if s == state else s


def handed_over(state: PartitionState, node: int, live: Collection[int], draining: Collection[int]) -> bool:
    """Whether draining `node` is done with this partition: it does not lead it, or no live,
    non-draining in-sync replica could take it (then it stays until the node leaves)."""
    if state.leader != node:
        return True
    return not any(r != node and r in state.isr and r in live and r not in draining for r in state.replicas)


def _reassigning(s: PartitionState, live: Collection[int]) -> PartitionState:
    """A reassignment (Kafka's scheme): the target replicas are added first, as followers out of
    sync; once every one of them is in sync the old ones go, and the lead moves into the target
    (a new epoch) if it was outside. Nothing acknowledged is lost: every target replica holds it."""
    added = tuple(t for t in s.target if t not in s.replicas)
    if added:
        return replace(s, replicas=s.replicas + added)
    if not all(t in s.isr for t in s.target):
        return s  # still catching up: the leaders propose them into the ISR as they do
    isr = tuple(r for r in s.isr if r in s.target)
    leader = s.leader
    if leader not in s.target:
        successors = [r for r in s.target if r in isr and r in live]
        if not successors:
            return s
        leader = successors[0]
    epoch = s.leader_epoch + (leader != s.leader)
    return PartitionState(replicas=s.target, leader=leader, leader_epoch=epoch, isr=isr)


def drain_target(
    topic_id: int, partition: int, state: PartitionState, node: int, nodes: Sequence[Candidate]
) -> tuple[int, ...] | None:
    """The replicas of a partition with `node` replaced by the best-placed live node that holds
    none of them (None: nothing to move, or no node to move to)."""
    if node not in state.replicas:
        return None
    spare = [c for c in rank(topic_id, partition, nodes) if c.node_id not in state.replicas]
    if not spare:
        return None
    return tuple(spare[0].node_id if r == node else r for r in state.replicas)


def _without(s: PartitionState, node: int, live: Collection[int]) -> PartitionState:
    isr = tuple(n for n in s.isr if n != node)
    if not isr:
        isr = s.isr  # the last in-sync replica stays: it alone is known to hold every acked record
    if s.leader != node:
        return replace(s, isr=isr)
    successors = [r for r in s.replicas if r in isr and r != node and r in live]
    leader = successors[0] if successors else NO_LEADER
    return replace(s, leader=leader, leader_epoch=s.leader_epoch + 1, isr=isr)


class IsrRefused(ValueError):
    """An in-sync-set change the controller must not write (stale epoch, not the leader, bad set)."""


def change_isr(state: PartitionState, leader: int, leader_epoch: int, isr: Sequence[int]) -> PartitionState:
    """The leader's proposal (followers fell behind or caught up) as the partition's next state.

    Fenced: only the current leader at the current epoch may change the set (a deposed leader's
    late proposal is refused); the set holds only replicas, and the leader itself."""
    if leader != state.leader or leader_epoch != state.leader_epoch:
        now = f"node {state.leader}, epoch {state.leader_epoch}"
        raise IsrRefused(f"node {leader} at epoch {leader_epoch} is not the leader ({now})")
    new = tuple(r for r in state.replicas if r in set(isr))
    if leader not in new:
        raise IsrRefused("the leader must stay in its in-sync set")
    if len(new) != len(set(isr)):
        raise IsrRefused(f"in-sync set {list(isr)} names nodes that are not replicas {list(state.replicas)}")
    return replace(state, isr=new)
