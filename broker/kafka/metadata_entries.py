"""Kafka Metadata's topic entries, encoded once and kept: a listing of every topic is their bytes
joined, not every partition encoded again on each request.

Rules this module keeps:
- An entry is kept per topic and per layout of versions (`fast_encode.metadata_layout`) while
  what it was made from holds (`TopicEntries`); anything that depends on the request is made per
  request by broker/kafka/metadata.py.
- Topic ids (v10+): Kafka's are UUIDs; ours are numbers never reused within a cluster (or a data
  dir), so a topic's UUID is derived from the cluster id and its number (`topic_uuid`): stable
  across restarts and alike on every node and core, never the zero UUID Kafka reserves for "none"
  (an unknown topic named by name answers it), and never starting with "-" in base64 (Kafka's
  own rule for the ids it makes).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from broker.core.core import Core
from broker.core.topics import Topic
from broker.core.transactions import is_internal
from broker.core.views import MetadataView, PartitionView, kafka_broker_id
from broker.kafka.fast_encode import metadata_topic


def topic_uuid(cluster_id: str, topic_id: int) -> uuid.UUID:
    """The Kafka topic id (a UUID) of our topic `topic_id` in the cluster `cluster_id` (module
    rules)."""
    digest = bytearray(hashlib.sha256(f"{cluster_id}/topic/{topic_id}".encode()).digest()[:16])
    digest[0] &= 0x7F  # base64 never starts with "-" (index 62); the UUID is never zero
    digest[15] |= 0x01
    return uuid.UUID(bytes=bytes(digest))


class TopicEntries:
    """Each topic's encoded Metadata entry (`fast_encode.metadata_topic`), per layout of versions
    (`metadata_layout`), kept while what it was made from holds: the topic's name and partition
    count (a delete and create again is a new topic id) and the core's `placement_stamp` (a
    cluster view: leaders, epochs, replicas, ISR, live nodes). What depends on the request is
    never kept: which topics the principal may see, errors (unknown, invalid, refused), the
    authorized operations when asked (written over the entry's "omitted")."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        # topic id -> (name, partition count, placement stamp, layout -> entry)
        self._held: dict[int, tuple[str, int, object, dict[int, bytes]]] = {}

    def entry(self, core: Core, cluster_id: str, view: MetadataView, topic: Topic, layout: int) -> bytes:
        """The entry of `topic` (the registry's) for `layout`, made once; `view` gives the nodes."""
        stamp = core.metadata_views.placement_stamp
        held = self._held.get(topic.topic_id)
        if held is None or held[0] != topic.name or held[1] != topic.partitions or held[2] is not stamp:
            if len(self._held) > 2 * len(core.registry.by_id) + 64:  # topics deleted since
                live = core.registry.by_id
                self._held = {k: v for k, v in self._held.items() if k in live}
            held = (topic.name, topic.partitions, stamp, {})
            self._held[topic.topic_id] = held
        made = held[3].get(layout)
        if made is None:
            made = held[3][layout] = _topic_entry(
                cluster_id, view, topic, core.metadata_views.topic_placement(topic), layout
            )
        return made


def _topic_entry(
    cluster_id: str, view: MetadataView, topic: Topic, placement: Iterable[PartitionView], layout: int
) -> bytes:
    live = {n.node_id for n in view.nodes if n.live}
    # (replicas, ISR) as (node, core) pairs -> (replica ids, ISR ids, offline ids): a topic's
    # partitions share a few of them
    known: dict[tuple[object, object], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    partitions = []
    for p in placement:
        ids = known.get((p.replicas, p.isr))
        if ids is None:
            ids = known[(p.replicas, p.isr)] = (
                tuple(kafka_broker_id(n, c) for n, c in p.replicas),
                tuple(kafka_broker_id(n, c) for n, c in p.isr),
                tuple(kafka_broker_id(n, c) for n, c in p.replicas if n not in live),
            )
        if p.leader_node >= 0:
            head = (ErrorCode.none, p.index, kafka_broker_id(p.leader_node, p.owner_core), p.leader_epoch)
        else:
            head = (ErrorCode.leader_not_available, p.index, -1, p.leader_epoch)
        partitions.append((*head, *ids))
    return metadata_topic(
        layout,
        ErrorCode.none,
        topic.name,
        topic_uuid(cluster_id, topic.topic_id).bytes,
        is_internal(topic.name),
        partitions,
    )
