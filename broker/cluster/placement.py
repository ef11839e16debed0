"""Where a partition's replicas live: weighted rendezvous hashing over the nodes.

Rules this module keeps:
- Pure functions of their arguments: every node computes the same answer from the same inputs,
  so a placement can be checked (and recomputed by a new controller) without asking anyone.
- The scheme is the seeds' (laminarmq's "partition distribution"): rank the nodes by
  f(weight, H(partition, node)) and take the top k. With u = H mapped into (0, 1), the score
  `-weight / ln(u)` is the weighted form of rendezvous hashing: a node of twice the weight wins
  twice as often, and adding or removing a node moves only the replicas it gains or held
  (no global reshuffle, unlike modulo placement). H is `ringlog_proto.routing.node_hash` over
  the partition's identity and the node id (the hash clients use for group coordinators too),
  so no language's hash library is involved.
- Racks: among the ranked nodes, the first replica of each rack is taken before a second replica
  of any rack (Kafka's rack-aware placement), so k replicas span min(k, racks) racks.
- Within a node, a replica's core is today's rendezvous over the node's cores
  (`routing.owner`): placement over nodes and over cores is the same idea twice.
- The preferred leader is the first replica of the list. Rendezvous picks each partition's
  replicas alone, so its first-ranked node would lead as evenly as the hash spreads, which is
  unevenly for a topic of few partitions: 3 partitions on 3 nodes lead from one node alone 1 time
  in 9 and all from different nodes only 2 in 9. `lead_evenly` picks, across a topic's
  partitions in order, each one's leader among its replicas as Kafka's placement spreads them
  (round robin over the brokers): the replica that leads least so far for its weight, ties in
  rank order. The replicas stay the ones rendezvous chose; only their order changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ringlog_proto.routing import node_hash, partition_key

_TWO_53 = float(1 << 53)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node that may hold replicas: its id, relative weight (> 0) and rack ("" for none)."""

    node_id: int
    weight: int = 100
    rack: str = ""


def node_score(topic_id: int, partition: int, node_id: int, weight: int) -> float:
    """The node's weighted rendezvous score for one partition (higher wins)."""
    h = node_hash(partition_key(topic_id, partition), node_id)
    u = ((h >> 11) + 0.5) / _TWO_53  # the top 53 bits, centred: strictly inside (0, 1)
    return -float(weight) / math.log(u)


def rank(topic_id: int, partition: int, nodes: Sequence[Candidate]) -> list[Candidate]:
    """Every eligible node (weight > 0), best first; ties go to the lower node id."""
    eligible = [n for n in nodes if n.weight > 0]
    return sorted(eligible, key=lambda n: (-node_score(topic_id, partition, n.node_id, n.weight), n.node_id))


def place(topic_id: int, partition: int, nodes: Sequence[Candidate], replicas: int) -> tuple[int, ...]:
    """The node ids of the partition's `replicas` replicas, preferred leader first.

    Raises ValueError when fewer eligible nodes than `replicas` exist: a topic asking for more
    copies than there are nodes is refused at creation (Kafka's INVALID_REPLICATION_FACTOR), not
    silently under-replicated."""
    if replicas < 1:
        raise ValueError(f"replication factor must be at least 1, got {replicas}")
    ranked = rank(topic_id, partition, nodes)
    if len(ranked) < replicas:
        raise ValueError(f"replication factor {replicas} is larger than the {len(ranked)} available nodes")
    chosen: list[Candidate] = []
    racks_used: set[str] = set()
    for candidate in ranked:  # first pass: one replica per rack
        if candidate.rack not in racks_used or not candidate.rack:
            if candidate.rack:
                racks_used.add(candidate.rack)
            chosen.append(candidate)
            if len(chosen) == replicas:
                break
    if len(chosen) < replicas:  # fewer racks than replicas: fill in rank order
        taken = {c.node_id for c in chosen}
        chosen.extend(c for c in ranked if c.node_id not in taken)
        chosen = chosen[:replicas]
        chosen.sort(key=ranked.index)
    return tuple(c.node_id for c in chosen)


def lead_evenly(replica_lists: Sequence[Sequence[int]], nodes: Sequence[Candidate]) -> list[tuple[int, ...]]:
    """Each replica list (a topic's partitions, in order) with its preferred leader first, the
    others after it in their order.

    In turn, each partition is led by the replica with the fewest leads so far per unit of weight
    (ties to the earlier one, the better-ranked). A greedy turn can leave a node two leads above
    another when a later partition's replicas are all busy, so leads are then shifted along chains
    (u leads a partition that v also holds, v one that w holds, ...) from a node to one that would
    still lead fewer for its weight, until no chain does: with equal weights that is the spread
    with the fewest leads on the busiest node that the replica lists allow. A pure function of
    its inputs, so a controller completing a topic's placement computes what its creator did."""
    weight = {c.node_id: max(c.weight, 1) for c in nodes}
    leads: dict[int, int] = {}

    def load(node: int, extra: int = 0) -> float:
        return (leads.get(node, 0) + extra) / weight.get(node, 100)

    leaders = []
    for replicas in replica_lists:
        leader = min(replicas, key=lambda r: load(r, 1))
        leads[leader] = leads.get(leader, 0) + 1
        leaders.append(leader)
    while _shift_one(replica_lists, leaders, leads, lambda n: weight.get(n, 100)):
        pass
    return [
        (lead, *(r for r in replicas if r != lead))
        for lead, replicas in zip(leaders, replica_lists, strict=True)
    ]


def _shift_one(
    replica_lists: Sequence[Sequence[int]],
    leaders: list[int],
    leads: dict[int, int],
    weight: Callable[[int], int],
) -> bool:
    """Move one lead along a chain from the busiest node that has one to a node where it lowers
    the sum over nodes of leads² / weight (breadth first, so the chain is short); False when no
    node has one. That sum falls with each move, so the moves end."""
    led_by: dict[int, list[int]] = {}
    for i, lead in enumerate(leaders):
        led_by.setdefault(lead, []).append(i)
    for start in sorted(led_by, key=lambda n: (-leads[n] / weight(n), n)):
        came: dict[int, tuple[int, int]] = {start: (start, -1)}  # node -> (previous node, partition)
        queue = [start]
        for u in queue:
            for i in led_by.get(u, ()):
                for v in replica_lists[i]:
                    if v in came:
                        continue
                    came[v] = (u, i)
                    if (2 * leads.get(v, 0) + 1) / weight(v) < (2 * leads[start] - 1) / weight(start):
                        node = v
                        while node != start:
                            prev, part = came[node]
                            leaders[part] = node
                            leads[node] = leads.get(node, 0) + 1
                            leads[prev] -= 1
                            node = prev
                        return True
                    queue.append(v)
    return False
