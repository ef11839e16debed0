"""What the core answers about the cluster, as plain data: each protocol encodes it its own way.

Rules this module keeps:
- No wire types here (neither ringlog_proto's messages nor Kafka's): the core computes a view
  once (`Handlers.metadata_view`), and our Metadata handler and the Kafka adapter each turn it
  into their own response, so the core never knows which protocol asked.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PartitionView:
    index: int
    owner_core: int  # the core that serves it (routing.shard_for)
    start_offset: int  # -1, -1: not open on this core (another core's, or never written)
    end_offset: int


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

    def core_port(self, core: int) -> int:
        """Where a client reaches `core` directly: its own port, else the public one."""
        if core < len(self.core_ports) and self.core_ports[core]:
            return self.core_ports[core]
        return self.port
