"""What a core knows of the cluster: the nodes and, per partition, its replicas, leader, leader
epoch and in-sync set, as the node's supervisor last published them.

Rules this module keeps:
- Data only. The record of the cluster is the metadata store (etcd, broker/cluster/); the node's
  cluster agent (in the supervisor) watches it and publishes this view to its workers as one JSON
  file, `<data_dir>/run/cluster.json`, replaced atomically, with a generation that only grows.
  A core reloads it when the file changes (`ViewFile.poll`, a stat per call), so a worker never
  talks to etcd and never blocks on it.
- A core acts on a partition's state only when its leader epoch is at least the one it acts on
  already: views arrive in order from one writer, but a restarted worker must not step back.
- Single node (no cluster): there is no file and `ClusterView.single()` says every partition is
  this node's, led at epoch 0 with itself in sync: the request path then does what it did before
  clustering, with no extra work per request.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from broker.storage.durable_file import replace_json

if TYPE_CHECKING:
    from broker.core.groups import GroupOffsetStore
    from broker.core.producer_ids import BlockSource
    from broker.core.replica_changes import Election, ReplicaRefused
    from broker.core.topic_configs import Alteration
    from broker.core.topics import Topic, TopicRegistry
    from broker.security.acls import AclStore

FILE_NAME = "cluster.json"
RACY_NS = 200_000_000  # a view file younger than this is read even when its stamp looks seen
NO_LEADER = -1


class ClusterCalls(Protocol):
    """The cluster's writes a core asks for (the node layer hands in `ClusterAdmin`, on the
    store). Blocking: a core runs them on its `run_blocking` threads, never on its loop."""

    def create_topic(
        self,
        registry: TopicRegistry,
        name: str,
        partitions: int,
        configs: Mapping[str, str | None] | None = None,
        replication: int = -1,
        assignment: Sequence[Sequence[int]] | None = None,
    ) -> Topic: ...

    def alter_topic_configs(self, registry: TopicRegistry, name: str, alteration: Alteration) -> Topic: ...

    def delete_topic(self, name: str) -> Topic: ...

    def create_partitions(
        self,
        registry: TopicRegistry,
        name: str,
        partitions: int,
        validate_only: bool = False,
        assignment: Sequence[Sequence[int]] | None = None,
    ) -> Topic: ...

    def alter_isr(
        self, topic_id: int, partition: int, leader: int, leader_epoch: int, isr: Sequence[int]
    ) -> PartitionState: ...

    def elect_leaders(
        self, election: Election, partitions: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], PartitionState | ReplicaRefused]: ...

    def alter_reassignment(
        self, topic_id: int, partition: int, target: Sequence[int] | None, unclean: bool = False
    ) -> PartitionState: ...

    def reassignments(
        self, topic_ids: Collection[int] | None = None
    ) -> dict[tuple[int, int], PartitionState]: ...


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """A clustered core's settings (None in BrokerConfig: a single node)."""

    calls: ClusterCalls
    producer_ids: BlockSource | None = None  # the cluster's producer id counter (None: the node's file)
    group_offsets: GroupOffsetStore | None = None  # the groups' offsets in the store (None: files)
    acls: AclStore | None = None  # the cluster's ACLs, which the Kafka ACL admin APIs change (blocking)
    name: str = "ringlog"  # the cluster's name (its key prefix in the store; Kafka's cluster id)
    min_insync: int = 2  # Kafka's min.insync.replicas (a topic's override wins)
    unclean_election: bool = False  # Kafka's unclean.leader.election.enable (a topic's override wins)
    replica_lag_max_ms: int = 10_000  # Kafka's replica.lag.time.max.ms (30 s there)
    replica_fetch_wait_ms: int = 500  # a follower's long poll (Kafka's replica.fetch.wait.max.ms)


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where a node's cores are reached: its advertised host, public port and per-core ports."""

    node_id: int
    host: str
    port: int
    core_ports: tuple[int, ...]
    rack: str = ""

    @property
    def cores(self) -> int:
        return len(self.core_ports)

    def core_port(self, core: int) -> int:
        return self.core_ports[core] if core < len(self.core_ports) and self.core_ports[core] else self.port


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition's replication state, as the controller last wrote it (fenced by epoch)."""

    replicas: tuple[int, ...]  # node ids, preferred leader first
    leader: int  # node id, NO_LEADER when none is in sync (offline)
    leader_epoch: int
    isr: tuple[int, ...]
    target: tuple[int, ...] = ()  # a reassignment under way: the replicas it ends with (empty: none)
    # of a reassignment under way, the replicas it added (what a cancellation takes away again);
    # those it removes are the replicas outside `target`
    adding: tuple[int, ...] = ()

    @property
    def removing(self) -> tuple[int, ...]:
        """The replicas a reassignment under way drops once its target is in sync."""
        return tuple(r for r in self.replicas if r not in self.target) if self.target else ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "replicas": list(self.replicas),
            "leader": self.leader,
            "epoch": self.leader_epoch,
            "isr": list(self.isr),
        }
        if self.target:
            d["target"] = list(self.target)
        if self.adding:
            d["adding"] = list(self.adding)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PartitionState:
        target = tuple(d.get("target", ()))
        adding = tuple(d.get("adding", ()))
        return cls(tuple(d["replicas"]), int(d["leader"]), int(d["epoch"]), tuple(d["isr"]), target, adding)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The nodes and partition states a core acts on. `clustered` False: a single node."""

    node_id: int
    generation: int
    clustered: bool
    nodes: Mapping[int, NodeAddress] = field(default_factory=dict)
    partitions: Mapping[tuple[int, int], PartitionState] = field(default_factory=dict)
    controller: int = NO_LEADER
    live: frozenset[int] = frozenset()  # nodes registered in the store now (`nodes` also has past ones)
    # live nodes stopping gracefully: they coordinate no group and are not offered to clients
    # (their leaderships are being moved; they still serve as followers until they leave)
    draining: frozenset[int] = frozenset()

    @classmethod
    def single(cls, node_id: int = 0) -> ClusterView:
        return cls(node_id=node_id, generation=0, clustered=False)

    @property
    def serving(self) -> frozenset[int]:
        """The live nodes that take new work: clients are offered these, groups coordinated there."""
        return self.live - self.draining

    def state_of(self, topic_id: int, partition: int) -> PartitionState | None:
        return self.partitions.get((topic_id, partition))

    def placed_elsewhere(self, topic_id: int, partition: int) -> bool:
        """Whether this view names the partition's replicas and this node is not among them: its
        replica here was moved off (a partition the view has no state for yet is not)."""
        state = self.partitions.get((topic_id, partition))
        return state is not None and self.node_id not in state.replicas

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "generation": self.generation,
            "controller": self.controller,
            "live": sorted(self.live),
            "draining": sorted(self.draining),
            "nodes": [
                {
                    "id": n.node_id,
                    "host": n.host,
                    "port": n.port,
                    "core_ports": list(n.core_ports),
                    "rack": n.rack,
                }
                for n in sorted(self.nodes.values(), key=lambda n: n.node_id)
            ],
            "partitions": [
                {"topic_id": tid, "partition": p, **s.to_json()}
                for (tid, p), s in sorted(self.partitions.items())
            ],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClusterView:
        nodes = {
            int(n["id"]): NodeAddress(
                int(n["id"]), n["host"], int(n["port"]), tuple(n["core_ports"]), n.get("rack", "")
            )
            for n in d["nodes"]
        }
        parts = {
            (int(p["topic_id"]), int(p["partition"])): PartitionState.from_json(p) for p in d["partitions"]
        }
        return cls(
            node_id=int(d["node_id"]),
            generation=int(d["generation"]),
            clustered=True,
            nodes=nodes,
            partitions=parts,
            controller=int(d.get("controller", NO_LEADER)),
            live=frozenset(int(n) for n in d.get("live", ())),
            draining=frozenset(int(n) for n in d.get("draining", ())),
        )


def publish(run_dir: str, view: ClusterView) -> None:
    """Replace the published view (the agent's side): atomically, so a reader sees old or new."""
    replace_json(os.path.join(run_dir, FILE_NAME), view.to_json())


class ViewFile:
    """A core's side: `poll()` returns a newer view when the file changed since the last call."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, FILE_NAME)
        self._stamp: tuple[int, int, int] | None = None  # mtime_ns, inode, size
        self.generation = -1

    def poll(self) -> ClusterView | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        stamp = (st.st_mtime_ns, st.st_ino, st.st_size)
        # A stamp seen before proves nothing while the file is young: two replacements within one
        # tick of the file system's clock can reuse the inode number and the size (git's "racy"
        # files). Until then the file is read and its generation decides.
        if stamp == self._stamp and time.time_ns() - st.st_mtime_ns > RACY_NS:
            return None
        try:
            with open(self.path, "rb") as f:
                view = ClusterView.from_json(json.loads(f.read()))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # being replaced: the next poll reads the new file
        self._stamp = stamp
        if view.generation <= self.generation:
            return None
        self.generation = view.generation
        return view
