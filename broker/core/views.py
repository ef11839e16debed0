"""What the core answers about the cluster, as plain data: each protocol encodes it its own way.

Rules this module keeps:
- No wire types here (neither ringlog_proto's messages nor Kafka's): the core computes a view
  once (`Core.metadata_view`), and our Metadata handler and the Kafka adapter each turn it
  into their own response, so the core never knows which protocol asked.
"""

from __future__ import annotations

from dataclasses import dataclass

KAFKA_IDS_PER_NODE = 1000  # Kafka broker id of core k of node n: n * 1000 + k (one node: k)


def kafka_broker_id(node_id: int, core: int) -> int:
    """Kafka clients see each core of each node as a broker of its own (its direct port), so a
    partition's leader is the one core that serves it: no forward between cores."""
    return node_id * KAFKA_IDS_PER_NODE + core


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node of the cluster as clients reach it (one node: this broker)."""

    node_id: int
    host: str
    port: int  # its public port
    cores: int
    core_ports: tuple[int, ...]  # core k's direct port (0 or missing: not reachable directly)
    rack: str = ""
    live: bool = True  # False: a replica's node that is down (listed by replicas, not as a broker)

    def core_port(self, core: int) -> int:
        if core < len(self.core_ports) and self.core_ports[core]:
            return self.core_ports[core]
        return self.port


@dataclass(frozen=True, slots=True)
class PartitionView:
    index: int
    owner_core: int  # the core that serves it on its leader node (routing.owner over its cores)
    start_offset: int  # -1, -1: not open on this core (another core's, or never written)
    end_offset: int
    leader_node: int = 0  # -1: offline (no in-sync replica is live)
    leader_epoch: int = 0
    replicas: tuple[tuple[int, int], ...] = ()  # (node id, core) of each replica, preferred first
    isr: tuple[tuple[int, int], ...] = ()  # the in-sync ones, as (node id, core)


@dataclass(frozen=True, slots=True)
class TopicView:
    name: str
    topic_id: int  # 0 when `known` is False
    known: bool  # False: no such topic (it was asked for by name)
    retention_ms: int = -1  # -1: the broker's default; -2: keep forever
    retention_bytes: int = -1
    segment_bytes: int = -1
    partitions: tuple[PartitionView, ...] = ()


@dataclass(frozen=True, slots=True)
class MetadataView:
    host: str  # the broker's advertised host
    port: int  # its public port
    cores: int
    core_ports: tuple[int, ...]  # core k's direct port (0 or missing: not reachable directly)
    steering: bool  # eBPF steers connections to owning cores
    topics: tuple[TopicView, ...]
    node_id: int = 0  # the node answering
    nodes: tuple[NodeView, ...] = ()  # every known node, this one included (one node: itself)
    clustered: bool = False
    controller: int = 0  # the node to send cluster-wide admin to (any node can do it: Kafka clients ask one)

    def node(self, node_id: int) -> NodeView | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        return None

    def core_port(self, core: int) -> int:
        """Where a client reaches `core` directly: its own port, else the public one."""
        if core < len(self.core_ports) and self.core_ports[core]:
            return self.core_ports[core]
        return self.port
