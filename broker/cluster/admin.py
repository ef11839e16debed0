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
  topic never stays half made.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final

from broker.cluster.controller import IsrRefused, assign, change_isr, drain_target
from broker.cluster.placement import Candidate
from broker.cluster.records import Keys, NodeRecord, PresenceRecord, TopicRecord
from broker.cluster.store import (
    Delete,
    MetadataStore,
    Put,
    StoreUncertain,
    absent,
    mod_revision_is,
)
from broker.core.cluster_view import PartitionState
from broker.core.topic_configs import Alteration
from broker.core.topics import Topic, TopicError, TopicFault, TopicRegistry

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
        live = {
            int(kv.key.decode()[len(self.keys.live) :]) for kv in self.store.get_prefix(self.keys.live).kvs
        }
        candidates = []
        for kv in self.store.get_prefix(self.keys.nodes).kvs:
            rec = NodeRecord.decode(kv.value)
            if rec.node_id in live:
                candidates.append(Candidate(rec.node_id, rec.weight, rec.rack))
        return candidates

    # ------------------------------------------------------------------------------- topics

    def create_topic(
        self,
        registry: TopicRegistry,
        name: str,
        partitions: int,
        configs: Mapping[str, str | None] | None = None,
        replication: int = -1,
    ) -> Topic:
        """Create the topic in the cluster; `registry` checks the name, limits and configs (as
        on one node) and is not changed: the node's agent copies the new topic into it."""
        replication = self.default_replication if replication == -1 else replication
        nodes = self.live_candidates()
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
            record = TopicRecord(topic, replication)
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
            self.write_partitions(topic, replication, nodes)
            log.info(
                "created topic %s (id %d, %d partitions, %d replicas)",
                name,
                topic.topic_id,
                partitions,
                replication,
            )
            return topic
        raise TopicError(TopicFault.LIMIT, f"topic {name!r}: too many concurrent topic creations, try again")

    def write_partitions(self, topic: Topic, replication: int, nodes: Sequence[Candidate]) -> int:
        """The first state of each partition of `topic` that has none yet. Returns how many written."""
        k = self.keys
        have = {
            Keys.parse_partition(kv.key.decode()[len(k.partitions) :])[1]
            for kv in self.store.get_prefix(k.topic_partitions(topic.topic_id)).kvs
        }
        states = assign(topic.topic_id, topic.partitions, replication, nodes)
        todo = [(p, s) for p, s in enumerate(states) if p not in have]
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
            new = TopicRecord(topic, record.replication)
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
        self, registry: TopicRegistry, name: str, partitions: int, validate_only: bool = False
    ) -> Topic:
        """Grow topic `name` to `partitions` partitions (`registry.grown` checks it as on one
        node): its record, fenced by the mod revision it was read at (two growers, or a grower
        and a delete, never both win), then the new partitions' first states, placed over the
        live nodes as a new topic's are (`write_partitions`; the controller writes any a crash
        left out). `validate_only`: checked, nothing written."""
        k = self.keys
        for _ in range(RACE_RETRIES):
            kv = self.store.get(k.topic(name))
            if kv is None:
                raise TopicError(TopicFault.UNKNOWN, f"unknown topic {name!r}")
            record = TopicRecord.decode(kv.value)
            topic = registry.grown(record.topic, partitions)
            nodes = self.live_candidates()
            if record.replication > len(nodes):
                raise TopicError(
                    TopicFault.CONFIG,
                    f"replication factor {record.replication} needs as many live nodes; "
                    f"{len(nodes)} are live",
                )
            if validate_only:
                return topic
            grown = TopicRecord(topic, record.replication)
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
            self.write_partitions(topic, record.replication, nodes)
            log.info("topic %s (id %d) now has %d partitions", name, topic.topic_id, partitions)
            return topic
        raise TopicError(TopicFault.LIMIT, f"topic {name!r}: it kept changing under this request, try again")

    def delete_topic(self, name: str) -> Topic:
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

    def write_state(self, topic_id: int, partition: int, read_at: int, state: PartitionState) -> int | None:
        """Replace the partition's state with `state` if its record is still at the mod revision
        `read_at` the writer decided on (module rules): the revision written at, None if it was
        not. Every change of a partition's state after its first goes through here."""
        key = self.keys.partition(topic_id, partition)
        result = self.store.txn([mod_revision_is(key, read_at)], [Put(key, json.dumps(state.to_json()))])
        return result.revision if result.succeeded else None

    def reassign(self, topic_id: int, partition: int, target: Sequence[int]) -> PartitionState:
        """Start moving the partition's replicas to `target` (the controller finishes it once
        every target replica is in sync: `controller.reconcile`). Returns the state written."""
        key = self.keys.partition(topic_id, partition)
        target = tuple(dict.fromkeys(target))
        nodes = {c.node_id for c in self.live_candidates()}
        if not target or not set(target) <= nodes:
            raise ValueError(f"target {list(target)}: every node must be live (live: {sorted(nodes)})")
        for _ in range(RACE_RETRIES):
            kv = self.store.get(key)
            if kv is None:
                raise ValueError(f"partition {topic_id}/{partition} has no state")
            state = PartitionState.from_json(json.loads(kv.value))
            if state.replicas == target and not state.target:
                return state
            new = replace(state, target=target)
            if self.write_state(topic_id, partition, kv.mod_revision, new) is not None:
                log.info(
                    "partition %d/%d: reassigning %s -> %s",
                    topic_id,
                    partition,
                    list(state.replicas),
                    list(target),
                )
                return new
        raise ValueError(f"partition {topic_id}/{partition}: its state kept changing under us")

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
