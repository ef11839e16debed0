"""What a core shows of its topics to both protocols' Metadata: the plain data each adapter encodes.

Apart from `Core` (broker/core/core.py) because it only reads: the registry, the cluster view,
the partitions open here. It decides nothing and changes nothing a request sees next.

Rules this module keeps:
- One answer for both protocols (`MetadataViews.view`, whose types are in broker/core/views.py);
  the adapters encode it as their protocol writes it.
- A listing of every topic is made again only when the registry changed (its `generation`):
  listings of 100 000 topics share one list until then, read only.
- What an adapter may keep of a topic's placement (owning core, leader, epoch, replicas, ISR) is
  computed from the topic's id and partition count and `placement_stamp` alone; the offsets
  (`topic_offsets`) are what a request writes in itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from broker.core.cluster_view import ClusterView
from broker.core.config import BrokerConfig
from broker.core.partition import Partition
from broker.core.topics import Topic, TopicRegistry
from broker.core.views import MetadataView, NodeView, PartitionView, TopicView
from ringlog_proto.routing import owner


class ShownCore(Protocol):
    """What the views read of their core: a `Core` (broker/core/core.py, which makes them, so
    this module does not import it)."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def cluster(self) -> ClusterView: ...
    @property
    def registry(self) -> TopicRegistry: ...
    @property
    def partitions(self) -> Mapping[tuple[int, int], Partition]: ...
    def owner(self, topic_id: int, partition: int) -> int: ...
    def refresh_topics(self, force: bool = False) -> None: ...


class MetadataViews:
    """One core's Metadata views (module rules), owned by its `Core` (`Core.metadata_views`)."""

    def __init__(self, core: ShownCore) -> None:
        self._core = core
        self._listing_held: tuple[TopicRegistry | None, int, list[tuple[str, Topic | None]]] = (None, -1, [])

    def view(self, names: Sequence[str] | None = None, *, partitions: bool = True) -> MetadataView:
        """Topics (`names`, or every one when None), their partitions with owning cores, and
        where each core is reached: the one answer both protocols encode (broker/core/views.py).
        `partitions` False: each topic without its partitions (an answer asks `topic_placement`
        and `topic_offsets` per topic, and may keep what it made of the placement while
        `placement_stamp` and the topic stay the same)."""
        config = self._core.config
        named = self.topics_named(names)
        cluster = self._core.cluster
        nodes = self._node_views(cluster)
        topics = []
        for name, topic in named:
            if topic is None:
                topics.append(TopicView(name, 0, known=False))
                continue
            topic_settings = self._core.registry.settings_of(topic)
            topics.append(
                TopicView(
                    topic.name,
                    topic.topic_id,
                    known=True,
                    retention_ms=_wire_limit(topic_settings.retention_ms),
                    retention_bytes=_wire_limit(topic_settings.retention_bytes),
                    segment_bytes=topic_settings.segment_bytes,
                    partitions=self._partition_views(topic, cluster, nodes, True) if partitions else (),
                )
            )
        return MetadataView(
            host=config.public_host,
            port=config.port,
            cores=config.cores,
            core_ports=config.core_ports,
            steering=bool((config.bpf_snapshot() or {}).get("steering")),  # the supervisor's bpf.json
            topics=tuple(topics),
            node_id=config.node_id,
            nodes=tuple(sorted(nodes.values(), key=lambda n: n.node_id)),
            clustered=cluster.clustered,
            controller=cluster.controller if cluster.controller in cluster.live else config.node_id,
        )

    def topics_named(self, names: Sequence[str] | None) -> list[tuple[str, Topic | None]]:
        """Each of `names` (every topic's, sorted, when None) with its topic (None: no such
        topic), the registry looked at as `view` does: the topics of a view that `view([])`
        gives the rest of. Read only: a listing is shared while the registry
        stays the same."""
        self._core.refresh_topics()
        by_name = self._core.registry.by_name
        if names and any(name not in by_name for name in names):
            self._core.refresh_topics(force=True)
            by_name = self._core.registry.by_name
        if names is None:
            return self._listing()
        return [(name, by_name.get(name)) for name in names]

    @property
    def placement_stamp(self) -> object:
        """What every partition's placement (owning core, leader, epoch, replicas, ISR, the
        nodes' liveness) is computed from besides its topic's id and partition count: the
        cluster view, which is replaced, never changed in place, on every change (one node: the
        same for the core's life, placement being a function of the topic id and core count)."""
        return self._core.cluster

    def topic_placement(self, topic: Topic) -> tuple[PartitionView, ...]:
        """The partitions of `topic` as `view` shows them, without their offsets
        (-1, -1): what Kafka's Metadata answers, which may be kept while `placement_stamp` and
        the topic's partition count stay the same."""
        cluster = self._core.cluster
        return self._partition_views(topic, cluster, self._node_views(cluster), False)

    def topic_offsets(self, topic: Topic) -> list[tuple[int, int, int]]:
        """(index, log start offset, high watermark) of each partition of `topic` open on this
        core whose offsets `view` shows (the rest show -1, -1, as `topic_placement`)."""
        cluster, opened = self._core.cluster, self._core.partitions
        shown = []
        for i in range(topic.partitions):
            p = opened.get((topic.topic_id, i))
            if p is not None and not (cluster.clustered and cluster.state_of(topic.topic_id, i) is None):
                shown.append((i, p.log.start_offset, p.high_watermark))
        return shown

    def _listing(self) -> list[tuple[str, Topic | None]]:
        """Every topic by name, sorted: made again only when the registry changed (shared by
        every listing until then: read only)."""
        registry, (held, generation, listing) = self._core.registry, self._listing_held
        if held is not registry or generation != registry.generation:
            listing = [(name, registry.by_name[name]) for name in sorted(registry.by_name)]
            self._listing_held = (registry, registry.generation, listing)
        return listing

    def _node_views(self, cluster: ClusterView) -> dict[int, NodeView]:
        node_id = self._core.config.node_id
        nodes = {
            n.node_id: NodeView(
                n.node_id, n.host, n.port, n.cores, n.core_ports, n.rack, n.node_id in cluster.serving
            )
            for n in cluster.nodes.values()
        }
        if node_id not in nodes:
            config = self._core.config
            nodes[node_id] = NodeView(
                node_id, config.public_host, config.port, config.cores, config.core_ports
            )
        return nodes

    def _partition_views(
        self, topic: Topic, cluster: ClusterView, nodes: Mapping[int, NodeView], offsets: bool
    ) -> tuple[PartitionView, ...]:
        node_id, opened = self._core.config.node_id, self._core.partitions
        parts = []
        for i in range(topic.partitions):
            p = opened.get((topic.topic_id, i)) if offsets else None
            start, end = (p.log.start_offset, p.high_watermark) if p is not None else (-1, -1)
            state = cluster.state_of(topic.topic_id, i) if cluster.clustered else None
            if state is None and cluster.clustered:  # its first state is not written yet
                parts.append(PartitionView(i, -1, -1, -1, -1, 0, (), ()))
                continue
            if state is None:
                core = self._core.owner(topic.topic_id, i)
                me = ((node_id, core),)
                parts.append(PartitionView(i, core, start, end, node_id, 0, me, me))
                continue
            placed = {r: (r, _core_on(nodes.get(r), topic.topic_id, i)) for r in state.replicas}
            leader = nodes.get(state.leader)
            if leader is not None and not leader.live:
                leader = None
            parts.append(
                PartitionView(
                    i,
                    _core_on(leader, topic.topic_id, i) if leader is not None else -1,
                    start,
                    end,
                    state.leader if leader is not None else -1,
                    state.leader_epoch,
                    tuple(placed[r] for r in state.replicas),
                    tuple(placed[r] for r in state.isr if r in placed),
                )
            )
        return tuple(parts)


def _core_on(node: NodeView | None, topic_id: int, partition: int) -> int:
    """The core of `node` that holds the partition's replica there (-1: the node is not live)."""
    if node is None or not node.cores:
        return -1
    return owner(topic_id, partition, range(node.cores))


def _wire_limit(value: int | None) -> int:
    return -2 if value is None else value
