"""The cluster's writes made outside the controller: topics, and a leader's in-sync-set changes.

Rules this module keeps:
- Blocking calls on the store: a worker runs them on its `run_blocking` threads (its loop never
  waits on etcd), the CLI and the agent call them directly.
- Each write is one transaction that states what it read: a topic is created only if its name is
  absent and the topic-id counter is where it was read (two creators never share an id); an
  in-sync-set change only if the partition's record is at the revision it was read and the
  proposer is its leader at the current epoch (`controller.change_isr`), so a deposed leader's
  late proposal, or one racing the controller, changes nothing. A lost race is read again and
  retried a few times; an uncertain outcome (`StoreUncertain`) is read back, not repeated blindly.
- An in-sync-set change adds no replica whose node is not live or is draining (Kafka refuses
  such an AlterPartition, KIP-841): a node stopping still fetches and looks caught up, and
  acks=all would wait for it once it is gone. Those are left out and the rest applies; a
  proposal left with nothing to change is answered with the state as it stands (a definite
  answer: the leader stops counting them for its high watermark at once).
- A topic is created in two steps: its record (with its id) in one transaction, then its
  partitions' first states (placed over the live nodes) in transactions of at most `TXN_OPS`
  keys (etcd's default cap is 128 operations per transaction). A creator that dies between the
  steps leaves partitions without state; the controller writes them (`complete_topics`), so a
  topic never stays half made. Replicas placed by hand (Kafka's manual assignment) are checked
  first (`controller.check_assignment`, against the registered nodes; a partition needs one of
  them live) and kept in the topic's record, so that the controller completing a creation
  places them as asked too; their states are then written as computed ones are.
- Elections and reassignments asked for by a client (Kafka's ElectLeaders and
  AlterPartitionReassignments) are the controller's rules (`controller.elect`,
  `start_reassignment`, `cancel_reassignment`) applied to the state read, written fenced on the
  revision it was read at like every change of a partition's state; the controller carries a
  reassignment on from there (`controller.reconcile`), whichever node holds the role then: the
  whole of it is in the partition's record in etcd.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Final

from broker.cluster.controller import (
    IsrRefused,
    assign,
    assigned,
    cancel_reassignment,
    change_isr,
    check_assignment,
    drain_target,
    elect,
    start_reassignment,
)
from broker.cluster.placement import Candidate
from broker.cluster.records import Keys, NodeRecord, PresenceRecord, TopicRecord
from broker.cluster.store import (
    Compare,
    Delete,
    MetadataStore,
    Put,
    StoreUncertain,
    absent,
    mod_revision_is,
)
from broker.core.cluster_view import NO_LEADER, PartitionState
from broker.core.replica_changes import Election, ReplicaFault, ReplicaRefused
from broker.core.topic_configs import Alteration
from broker.core.topics import Topic, TopicError, TopicFault, TopicRegistry
from broker.core.transactions import is_internal

log = logging.getLogger(__name__)

TXN_OPS: Final = 100
RACE_RETRIES: Final = 5


class ClusterAdmin:
    def __init__(self, store: MetadataStore, keys: Keys, default_replication: int = 3) -> None:
        self.store = store
        self.keys = keys
        self.default_replication = default_replication

    # ------------------------------------------------------------------------------- nodes

    def live_candidates(self) -> list[Candidate]:
        """The live nodes as placement sees them (weight and rack from their records)."""
        live = self.presence()
        return [
            Candidate(rec.node_id, rec.weight, rec.rack) for rec in self.registered() if rec.node_id in live
        ]

    def registered(self) -> list[NodeRecord]:
        """Every node the cluster has a record of (live or not: Kafka's registered brokers)."""
        return [NodeRecord.decode(kv.value) for kv in self.store.get_prefix(self.keys.nodes).kvs]

    def presence(self) -> dict[int, PresenceRecord]:
        """The live nodes (their presence keys), each saying whether it is draining."""
        k = self.keys
        return {
            int(kv.key.decode()[len(k.live) :]): PresenceRecord.decode(kv.value)
            for kv in self.store.get_prefix(k.live).kvs
        }

    def _active(self) -> tuple[set[int], set[int]]:
        """(live, draining): the live nodes, and those of them stopping gracefully."""
        presence = self.presence()
        return set(presence), {n for n, p in presence.items() if p.draining}

    # ------------------------------------------------------------------------------- topics

    def create_topic(
        self,
        registry: TopicRegistry,
        name: str,
        partitions: int,
        configs: Mapping[str, str | None] | None = None,
        replication: int = -1,
        assignment: Sequence[Sequence[int]] | None = None,
    ) -> Topic:
        """Create the topic in the cluster; `registry` checks the name, limits and configs (as
        on one node) and is not changed: the node's agent copies the new topic into it.
        `assignment`: each partition's replicas (node ids, the preferred leader first) placed by
        hand; then `partitions` and `replication` are taken from it."""
        manual: dict[int, tuple[int, ...]] = {}
        nodes = self.live_candidates()
        if assignment:
            manual = self._checked_assignment(assignment)
            partitions, replication = len(assignment), len(assignment[0])
        else:
            replication = self.default_replication if replication == -1 else replication
            if replication < 1 or replication > len(nodes):
                raise TopicError(
                    TopicFault.CONFIG,
                    f"replication factor {replication} needs as many live nodes; {len(nodes)} are live",
                )
        k = self.keys
        for _ in range(RACE_RETRIES):
            counter = self.store.get(k.topic_id)
            last = int(counter.value) if counter is not None else 0
            topic = registry.make(name, partitions, last + 1, configs)
            fence = mod_revision_is(k.topic_id, counter.mod_revision) if counter else absent(k.topic_id)
            record = TopicRecord(topic, replication, manual)
            try:
                result = self.store.txn(
                    [absent(k.topic(name)), fence],
                    [Put(k.topic_id, str(topic.topic_id)), Put(k.topic(name), record.encode())],
                )
            except StoreUncertain:
                existing = self.store.get(k.topic(name))
                if existing is None or TopicRecord.decode(existing.value).topic.topic_id != topic.topic_id:
                    continue  # not ours (or not applied): try again
                result = None
            if result is not None and not result.succeeded:
                if self.store.get(k.topic(name)) is not None:
                    raise TopicError(TopicFault.EXISTS, f"topic {name!r} already exists")
                continue  # another topic took the id: read the counter again
            self.write_partitions(topic, replication, nodes, manual)
            log.info(
                "created topic %s (id %d, %d partitions, %d replicas%s)",
                name,
                topic.topic_id,
                partitions,
                replication,
                ", placed by hand" if manual else "",
            )
            return topic
        raise TopicError(TopicFault.LIMIT, f"topic {name!r}: too many concurrent topic creations, try again")

    def _checked_assignment(
        self, assignment: Sequence[Sequence[int]], first: int = 0, replication: int | None = None
    ) -> dict[int, tuple[int, ...]]:
        """Replicas placed by hand, checked (module rules), as partition -> node ids from `first`."""
        check_assignment(assignment, {rec.node_id for rec in self.registered()}, replication)
        live, draining = self._active()
        assigned(assignment, live - draining, first)  # refuses a partition with no active replica
        return {first + i: tuple(r) for i, r in enumerate(assignment)}

    def write_partitions(
        self,
        topic: Topic,
        replication: int,
        nodes: Sequence[Candidate],
        manual: Mapping[int, Sequence[int]] | None = None,
    ) -> int:
        """The first state of each partition of `topic` that has none yet, those in `manual`
        placed as it says (the others over `nodes`). Returns how many written."""
        k = self.keys
        have = {
            Keys.parse_partition(kv.key.decode()[len(k.partitions) :])[1]
            for kv in self.store.get_prefix(k.topic_partitions(topic.topic_id)).kvs
        }
        missing = [p for p in range(topic.partitions) if p not in have]
        manual = manual or {}
        placed = [p for p in missing if p not in manual]
        computed = assign(topic.topic_id, len(placed), replication, nodes, placed) if placed else []
        states = dict(zip(placed, computed, strict=True))
        active = {c.node_id for c in nodes}
        for p in missing:
            if p in manual:
                states[p] = _first_state(manual[p], active)
        todo = sorted(states.items())
        for i in range(0, len(todo), TXN_OPS):
            chunk = todo[i : i + TXN_OPS]
            key = [k.partition(topic.topic_id, p) for p, _ in chunk]
            self.store.txn(
                [absent(x) for x in key],
                [Put(x, json.dumps(s.to_json())) for x, (_, s) in zip(key, chunk, strict=True)],
            )  # a lost race: someone else wrote them (the controller completing the topic)
        return len(todo)

    def alter_topic_configs(self, registry: TopicRegistry, name: str, alteration: Alteration) -> Topic:
        """Alter the overrides of topic `name` in the cluster (`alteration` applied to them as its
        record holds them), checked by `registry` as on one node; one transaction on the topic's
        record at the revision read (a lost race is read and altered again). Every node's agent
        copies it into its registry, whose cores apply it (broker/core/core.py `_sync_partitions`)."""
        k = self.keys
        for _ in range(RACE_RETRIES):
            kv = self.store.get(k.topic(name))
            if kv is None:
                raise TopicError(TopicFault.UNKNOWN, f"unknown topic {name!r}")
            record = TopicRecord.decode(kv.value)
            overrides = registry.checked(alteration(record.topic.configs, registry.topic_defaults))
            topic = replace(record.topic, configs=overrides)
            new = replace(record, topic=topic)
            try:
                result = self.store.txn(
                    [mod_revision_is(k.topic(name), kv.mod_revision)], [Put(k.topic(name), new.encode())]
                )
            except StoreUncertain:
                continue  # read it back: ours is there (the next write changes nothing) or we retry
            if result.succeeded:
                log.info("topic %s: configs now %s", name, overrides or "the broker's defaults")
                return topic
        raise TopicError(TopicFault.LIMIT, f"topic {name!r}: its record kept changing under us, try again")

    def create_partitions(
        self,
        registry: TopicRegistry,
        name: str,
        partitions: int,
        validate_only: bool = False,
        assignment: Sequence[Sequence[int]] | None = None,
    ) -> Topic:
        """Grow topic `name` to `partitions` partitions (`registry.grown` checks it as on one
        node): its record, fenced by the mod revision it was read at (two growers, or a grower
        and a delete, never both win), then the new partitions' first states, placed over the
        live nodes as a new topic's are (`write_partitions`; the controller writes any a crash
        left out), or as `assignment` places them by hand (one replica list per new partition,
        as many replicas as the topic's). `validate_only`: checked, nothing written."""
        k = self.keys
        for _ in range(RACE_RETRIES):
            kv = self.store.get(k.topic(name))
            if kv is None:
                raise TopicError(TopicFault.UNKNOWN, f"unknown topic {name!r}")
            record = TopicRecord.decode(kv.value)
            topic = registry.grown(record.topic, partitions)
            nodes = self.live_candidates()
            manual = dict(record.manual)
            if assignment is not None:
                added = partitions - record.topic.partitions
                if len(assignment) != added:
                    raise ReplicaRefused(
                        ReplicaFault.ASSIGNMENT,
                        f"Attempted to add {added} additional partition(s), but only "
                        f"{len(assignment)} assignment(s) were specified.",
                    )
                first = record.topic.partitions
                manual.update(self._checked_assignment(assignment, first, record.replication))
            elif record.replication > len(nodes):
                raise TopicError(
                    TopicFault.CONFIG,
                    f"replication factor {record.replication} needs as many live nodes; "
                    f"{len(nodes)} are live",
                )
            if validate_only:
                return topic
            grown = TopicRecord(topic, record.replication, manual)
            try:
                result = self.store.txn(
                    [mod_revision_is(k.topic(name), kv.mod_revision)], [Put(k.topic(name), grown.encode())]
                )
                written = result.succeeded
            except StoreUncertain:
                now = self.store.get(k.topic(name))
                written = now is not None and TopicRecord.decode(now.value) == grown
            if not written:
                continue  # changed under us: read it again
            self.write_partitions(topic, record.replication, nodes, manual)
            log.info("topic %s (id %d) now has %d partitions", name, topic.topic_id, partitions)
            return topic
        raise TopicError(TopicFault.LIMIT, f"topic {name!r}: it kept changing under this request, try again")

    def delete_topic(self, name: str) -> Topic:
        if is_internal(name):  # its coordinators' state (broker/core/transactions.py), as on one node
            raise TopicError(TopicFault.INVALID, f"topic {name!r} is internal: it cannot be deleted")
        k = self.keys
        kv = self.store.get(k.topic(name))
        if kv is None:
            raise TopicError(TopicFault.UNKNOWN, f"unknown topic {name!r}")
        topic = TopicRecord.decode(kv.value).topic
        self.store.txn(
            [mod_revision_is(k.topic(name), kv.mod_revision)],
            [Delete(k.topic(name)), Delete(k.topic_partitions(topic.topic_id), prefix=True)],
        )
        log.info("deleted topic %s (id %d)", name, topic.topic_id)
        return topic

    # ------------------------------------------------------------------------------- partitions

    def write_state(
        self,
        topic_id: int,
        partition: int,
        read_at: int,
        state: PartitionState,
        fence: Compare | None = None,
    ) -> int | None:
        """Replace the partition's state with `state` if its record is still at the mod revision
        `read_at` the writer decided on (module rules): the revision written at, None if it was
        not. Every change of a partition's state after its first goes through here. The
        controller passes its election's `fence` too: a controller deposed while it decided (a
        pause, a slow thread) writes nothing, even where no newer controller has written the
        partition yet, so its stale view of who is live never moves a leader."""
        key = self.keys.partition(topic_id, partition)
        compares = (
            [mod_revision_is(key, read_at)] if fence is None else [mod_revision_is(key, read_at), fence]
        )
        result = self.store.txn(compares, [Put(key, json.dumps(state.to_json()))])
        return result.revision if result.succeeded else None

    def reassign(self, topic_id: int, partition: int, target: Sequence[int]) -> PartitionState:
        """Start moving the partition's replicas to `target`, every one of them live (`broker
        reassign`; the controller finishes it once every target replica is in sync:
        `controller.reconcile`). Returns the state written."""
        target = tuple(dict.fromkeys(target))
        nodes = {c.node_id for c in self.live_candidates()}
        if not target or not set(target) <= nodes:
            raise ValueError(f"target {list(target)}: every node must be live (live: {sorted(nodes)})")
        try:
            return self.alter_reassignment(topic_id, partition, target)
        except ReplicaRefused as exc:
            raise ValueError(f"partition {topic_id}/{partition}: {exc}") from exc

    def alter_reassignment(
        self, topic_id: int, partition: int, target: Sequence[int] | None, unclean: bool = False
    ) -> PartitionState:
        """Start a reassignment of the partition to `target` (node ids, registered ones, the
        preferred leader first), replacing one under way, or cancel the one under way (`target`
        None; `unclean`: the topic allows an unclean election, which a cancellation that leaves
        no in-sync replica needs). Kafka's AlterPartitionReassignments (module rules); returns
        the state written (or the state as it is, when nothing changes). Raises
        `ReplicaRefused`."""
        key = self.keys.partition(topic_id, partition)
        if target is not None:
            check_assignment([target], {rec.node_id for rec in self.registered()})
        live, draining = self._active() if target is None else (set(), set())
        for _ in range(RACE_RETRIES):
            kv = self.store.get(key)
            if kv is None:
                raise ReplicaRefused(ReplicaFault.UNKNOWN, f"partition {partition} has no state")
            state = PartitionState.from_json(json.loads(kv.value))
            if target is None:
                new = cancel_reassignment(state, live, draining, unclean)
            else:
                new = start_reassignment(state, target)
            if new == state:
                return state
            try:
                written = self.write_state(topic_id, partition, kv.mod_revision, new) is not None
            except StoreUncertain:
                continue  # read it back: ours is there (nothing left to change) or we retry
            if written:
                what = "cancelled" if target is None else f"-> {list(target)}"
                log.info(
                    "partition %d/%d: reassignment %s (replicas %s, adding %s)",
                    topic_id,
                    partition,
                    what,
                    list(new.replicas),
                    list(new.adding),
                )
                return new
        raise ReplicaRefused(
            ReplicaFault.NOT_AVAILABLE, f"partition {partition}: its state kept changing under us, try again"
        )

    def reassignments(
        self, topic_ids: Collection[int] | None = None
    ) -> dict[tuple[int, int], PartitionState]:
        """The partitions (of `topic_ids`, or of every topic) with a reassignment under way."""
        out = {}
        for kv in self.store.get_prefix(self.keys.partitions).kvs:
            ident = Keys.parse_partition(kv.key.decode()[len(self.keys.partitions) :])
            if topic_ids is not None and ident[0] not in topic_ids:
                continue
            state = PartitionState.from_json(json.loads(kv.value))
            if state.target:
                out[ident] = state
        return out

    def elect_leaders(
        self, election: Election, partitions: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], PartitionState | ReplicaRefused]:
        """Kafka's ElectLeaders on each of `partitions` (topic id, index): the controller's
        `elect` on the state read, written fenced (module rules). Each answered with the state
        written (a new leader) or with why not."""
        live, draining = self._active()
        k = self.keys
        read = {
            Keys.parse_partition(kv.key.decode()[len(k.partitions) :]): kv
            for kv in self.store.get_prefix(k.partitions).kvs
        }
        out: dict[tuple[int, int], PartitionState | ReplicaRefused] = {}
        for tid, p in partitions:
            kv = read.get((tid, p))
            out[(tid, p)] = ReplicaRefused(ReplicaFault.UNKNOWN, f"partition {p} has no state")
            for _ in range(RACE_RETRIES):
                if kv is None:
                    break
                state = PartitionState.from_json(json.loads(kv.value))
                try:
                    new = elect(state, election, live, draining)
                except ReplicaRefused as exc:
                    out[(tid, p)] = exc
                    break
                try:
                    written = self.write_state(tid, p, kv.mod_revision, new) is not None
                except StoreUncertain:
                    written = False
                if written:
                    log.info(
                        "partition %d/%d: %s election: leader %d -> %d (epoch %d)",
                        tid,
                        p,
                        election.name.lower(),
                        state.leader,
                        new.leader,
                        new.leader_epoch,
                    )
                    out[(tid, p)] = new
                    break
                kv = self.store.get(k.partition(tid, p))  # changed under us: decide again
        return out

    def drain(self, node: int) -> list[tuple[int, int, tuple[int, ...]]]:
        """Move every replica off `node` (to the best-placed live node holding none of that
        partition's replicas). Returns (topic id, partition, target) of each move started."""
        nodes = [c for c in self.live_candidates() if c.node_id != node]
        moves = []
        for kv in self.store.get_prefix(self.keys.partitions).kvs:
            tid, p = Keys.parse_partition(kv.key.decode()[len(self.keys.partitions) :])
            state = PartitionState.from_json(json.loads(kv.value))
            target = drain_target(tid, p, state, node, nodes)
            if target is not None and not state.target:
                self.reassign(tid, p, target)
                moves.append((tid, p, target))
        return moves

    def alter_isr(
        self, topic_id: int, partition: int, leader: int, leader_epoch: int, isr: Sequence[int]
    ) -> PartitionState:
        """Write the leader's new in-sync set; returns the partition's state after (raises
        `IsrRefused` when the proposer is not the leader at that epoch any more)."""
        key = self.keys.partition(topic_id, partition)
        for _ in range(RACE_RETRIES):
            kv = self.store.get(key)
            if kv is None:
                raise IsrRefused(f"partition {topic_id}/{partition} has no state")
            state = PartitionState.from_json(json.loads(kv.value))
            new = change_isr(state, leader, leader_epoch, isr)
            ineligible = self._ineligible(set(new.isr) - set(state.isr))
            if ineligible:
                log.info(
                    "partition %d/%d: node(s) %s not added to the in-sync set: not live, or draining",
                    topic_id,
                    partition,
                    sorted(ineligible),
                )
                new = replace(new, isr=tuple(r for r in new.isr if r not in ineligible))
            if new == state:
                return state
            try:
                written = self.write_state(topic_id, partition, kv.mod_revision, new) is not None
            except StoreUncertain:
                continue  # read it back: either ours is there (no change needed) or we retry
            if written:
                return new
        raise IsrRefused(f"partition {topic_id}/{partition}: the in-sync set kept changing under us")

    def _ineligible(self, nodes: set[int]) -> set[int]:
        """Those of `nodes` that may not join an in-sync set: not live, or draining."""
        out = set()
        for node in nodes:
            kv = self.store.get(self.keys.live_node(node))
            if kv is None or PresenceRecord.decode(kv.value).draining:
                out.add(node)
        return out


def _first_state(replicas: Sequence[int], active: Collection[int]) -> PartitionState:
    """The first state of a partition placed by hand whose creator died before writing it: as
    `controller.assigned` makes it, or, with none of its replicas active now, offline until the
    first returns (in sync alone, as the last in-sync replica of any partition stays)."""
    try:
        return assigned([replicas], active)[0]
    except ReplicaRefused:
        return PartitionState(tuple(replicas), NO_LEADER, 0, (replicas[0],))
