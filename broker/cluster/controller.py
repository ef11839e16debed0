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
  Kafka's AlterPartitionReassignments, or the controller after `--reassign-after-s` of a node's
  absence), Kafka's scheme (its ReplicationControlManager and PartitionReassignmentReplicas): the
  state gets a `target` and its replicas become the target's followed by those it removes, the
  ones it adds (`adding`) out of sync; once every target replica is in sync the others go, and
  the lead moves into the target if it was outside. A cancellation takes the added replicas out
  again (Kafka's PartitionReassignmentRevert: the order left is the reassignment's, not the
  original's), refused when that would leave no in-sync replica and unclean election is off.
- Replicas placed by hand (Kafka's manual assignment) are checked as Kafka's controller checks
  them (`check_assignment`: every list non-empty, every node registered, none twice, as many
  replicas in each) and start with the active ones among them in sync, the first of those
  leading (`assigned`).
- An election asked for (Kafka's ElectLeaders, `elect`) is the same rule once more, on demand:
  the preferred replica takes the lead if it is live, not draining and in sync; unclean, a live
  out-of-sync replica only when no in-sync one is live (whatever the topic's setting: asking is
  the operator's consent). Both are refused, with the reason, when there is nothing to do or no
  replica to take it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from broker.cluster.placement import Candidate, lead_evenly, place, rank
from broker.core.cluster_view import NO_LEADER, PartitionState
from broker.core.replica_changes import Election, ReplicaFault, ReplicaRefused


def assign(
    topic_id: int,
    partitions: int,
    replication: int,
    nodes: Sequence[Candidate],
    indexes: Sequence[int] | None = None,
) -> list[PartitionState]:
    """The first state of each partition of a new topic (of those of `indexes`, when given):
    placed replicas, the preferred one leading, leaders spread over the topic's partitions
    (`placement.lead_evenly` over partitions 0 to the last wanted, so a topic completed in parts,
    or grown on the same nodes, leads as one placed whole would)."""
    wanted = list(range(partitions) if indexes is None else indexes)
    if not wanted:
        return []
    ordered = lead_evenly([place(topic_id, p, nodes, replication) for p in range(max(wanted) + 1)], nodes)
    return [
        PartitionState(replicas=ordered[p], leader=ordered[p][0], leader_epoch=0, isr=ordered[p])
        for p in wanted
    ]


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
    if any(t not in s.replicas for t in s.target):  # a target written alone (`start_reassignment`)
        return start_reassignment(s, s.target)
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


def start_reassignment(state: PartitionState, target: Sequence[int]) -> PartitionState:
    """The partition's state once a reassignment to `target` begins (module rules): its replicas
    the target's followed by those it removes, the ones it adds out of sync (`adding`). A target
    holding the same replicas in another order, with nothing under way, is done at once; one
    replacing a reassignment under way starts from the replicas as they are (Kafka's rule)."""
    target = tuple(target)
    adding = tuple(t for t in target if t not in state.replicas)
    removing = tuple(r for r in state.replicas if r not in target)
    if not adding and not removing:
        return replace(state, replicas=target, target=(), adding=())
    return replace(state, replicas=target + removing, target=target, adding=adding)


def cancel_reassignment(
    state: PartitionState, live: Collection[int], draining: Collection[int] = (), unclean: bool = False
) -> PartitionState:
    """The state once the reassignment under way is cancelled (module rules): its added replicas
    out again, the lead moved to a remaining in-sync replica if one of them held it. Raises
    `ReplicaRefused` when none is under way, or when no in-sync replica would remain and
    `unclean` (the topic's unclean.leader.election.enable) does not allow the first remaining
    replica to take over with what it has."""
    if not state.target:
        raise ReplicaRefused(ReplicaFault.NO_REASSIGNMENT, "No partition reassignment is in progress.")
    replicas = tuple(r for r in state.replicas if r not in state.adding)
    isr = tuple(r for r in state.isr if r not in state.adding)
    if not isr:
        if not unclean:
            raise ReplicaRefused(
                ReplicaFault.ASSIGNMENT,
                "Unable to revert the partition assignment because it would require an unclean "
                "leader election: no replica it keeps is in sync.",
            )
        isr = replicas[:1]
    leader = state.leader
    if leader not in isr:
        successors = [r for r in replicas if r in isr and r in live and r not in draining]
        leader = successors[0] if successors else NO_LEADER
    epoch = state.leader_epoch + (leader != state.leader)
    return PartitionState(replicas=replicas, leader=leader, leader_epoch=epoch, isr=isr)


def elect(
    state: PartitionState, election: Election, live: Collection[int], draining: Collection[int] = ()
) -> PartitionState:
    """The state after the election asked for (module rules), or `ReplicaRefused`: NOT_NEEDED
    when its outcome holds already, NOT_AVAILABLE when no replica it may choose can lead."""
    eligible = [r for r in state.replicas if r in live and r not in draining]
    if election is Election.PREFERRED:
        preferred = state.replicas[0]
        if state.leader == preferred and preferred in live:  # (a dead one: not yet replaced)
            raise ReplicaRefused(ReplicaFault.NOT_NEEDED, f"node {preferred}, the preferred replica, leads")
        if preferred not in eligible or preferred not in state.isr:
            why = (
                "not live"
                if preferred not in live
                else "stopping"
                if preferred in draining
                else "not in sync"
            )
            raise ReplicaRefused(
                ReplicaFault.NOT_AVAILABLE, f"the preferred replica, node {preferred}, is {why}"
            )
        return replace(state, leader=preferred, leader_epoch=state.leader_epoch + 1)
    if state.leader != NO_LEADER and state.leader in live:
        raise ReplicaRefused(ReplicaFault.NOT_NEEDED, f"node {state.leader} leads")
    in_sync = [r for r in eligible if r in state.isr]
    if in_sync:
        return replace(state, leader=in_sync[0], leader_epoch=state.leader_epoch + 1)
    if not eligible:
        raise ReplicaRefused(ReplicaFault.NOT_AVAILABLE, "no replica is live")
    return replace(state, leader=eligible[0], leader_epoch=state.leader_epoch + 1, isr=(eligible[0],))


def check_assignment(
    assignment: Sequence[Sequence[int]], registered: Collection[int], replication: int | None = None
) -> None:
    """Kafka's checks of replicas placed by hand (module rules), in node ids: raises
    `ReplicaRefused` (ASSIGNMENT) naming the first fault. `replication`: the count every list
    must have (a topic's, when its partitions are grown); else the first list's."""
    for replicas in assignment:
        if not replicas:
            raise ReplicaRefused(
                ReplicaFault.ASSIGNMENT, "The manual partition assignment includes an empty replica list."
            )
        seen: set[int] = set()
        for node in sorted(replicas):
            if node not in registered:
                raise ReplicaRefused(
                    ReplicaFault.ASSIGNMENT,
                    f"The manual partition assignment includes node {node}, but no such node is registered.",
                )
            if node in seen:
                raise ReplicaRefused(
                    ReplicaFault.ASSIGNMENT,
                    f"The manual partition assignment includes node {node} more than once.",
                )
            seen.add(node)
        if replication is not None and len(replicas) != replication:
            raise ReplicaRefused(
                ReplicaFault.ASSIGNMENT,
                f"The manual partition assignment includes a partition with {len(replicas)} "
                f"replica(s), but this is not consistent with previous partitions, which have "
                f"{replication} replica(s).",
            )
        replication = len(replicas)


def assigned(
    assignment: Sequence[Sequence[int]], active: Collection[int], first: int = 0
) -> list[PartitionState]:
    """The first states of partitions `first`, `first` + 1, ... placed by hand: the replicas as
    given, the active ones (live, not draining) in sync, the first of those leading. A partition
    with no active replica is refused, as Kafka's controller refuses it."""
    states = []
    for i, replicas in enumerate(assignment):
        isr = tuple(r for r in replicas if r in active)
        if not isr:
            raise ReplicaRefused(
                ReplicaFault.ASSIGNMENT,
                f"No node of the manual partition assignment for partition {first + i} is live "
                "(or every one is stopping).",
            )
        states.append(PartitionState(replicas=tuple(replicas), leader=isr[0], leader_epoch=0, isr=isr))
    return states


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
