"""The cluster's records in the metadata store: where each one lives and how it is spelled.

Rules this module keeps:
- Every key of a cluster sits under `/ringlog/<cluster name>/`, so several clusters can share
  one etcd and a prefix watch sees everything of one cluster in revision order.
- Values are JSON objects; a reader ignores fields it does not know (a newer node may add some).
- `nodes/<id>` is a node's lasting description (addresses, cores, weight, rack): it outlives the
  node's session, so a replica on a node that is down still has a name and a core. `live/<id>`
  is the node's presence: written with the node's lease, it disappears when the lease lapses,
  which is the one definition of a node's death the controller acts on. Its value
  (`PresenceRecord`) says since when, and whether the node is draining (stopping gracefully:
  the controller moves its leaderships away, broker/cluster/controller.py).
- `partitions/<topic id>/<p>` is a partition's replicas, leader, leader epoch and in-sync set;
  it is only ever written in a transaction that compares its mod revision with the one the
  writer read (fencing: of two controllers, or a controller and a leader, one loses).
- `groups/<group id>` holds a consumer group's committed offsets (broker/cluster/group_offsets.py).
- `topics/<name>` holds the topic's id, partition count, replication and config overrides (a
  change of its configs is a transaction on that key's mod revision), and the replicas of the
  partitions placed by hand; `topic-id` is the last id handed out (ids only grow, never reused,
  as on one node).
- `security/users.json` and `security/acls.json` hold the cluster's users (SCRAM credentials) and
  ACLs, the documents a single node keeps in its data dir (broker/cluster/security_docs.py).
- Fixed-width numbers in keys, so that a range read returns partitions in order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from broker.core.cluster_view import NodeAddress
from broker.core.topics import Topic


class Keys:
    """The keys of one cluster's records."""

    def __init__(self, cluster: str) -> None:
        self.prefix = f"/ringlog/{cluster}/"
        self.nodes = self.prefix + "nodes/"
        self.live = self.prefix + "live/"
        self.topics = self.prefix + "topics/"
        self.partitions = self.prefix + "partitions/"
        self.controller = self.prefix + "controller"
        self.topic_id = self.prefix + "topic-id"
        self.producer_ids = self.prefix + "producer-ids"
        self.groups = self.prefix + "groups/"
        self.security = self.prefix + "security/"

    def node(self, node_id: int) -> str:
        return f"{self.nodes}{node_id:010d}"

    def live_node(self, node_id: int) -> str:
        return f"{self.live}{node_id:010d}"

    def topic(self, name: str) -> str:
        return self.topics + name

    def partition(self, topic_id: int, partition: int) -> str:
        return f"{self.partitions}{topic_id:010d}/{partition:06d}"

    def group(self, group: str) -> str:
        return self.groups + group

    def topic_partitions(self, topic_id: int) -> str:
        return f"{self.partitions}{topic_id:010d}/"

    @staticmethod
    def parse_partition(rest: str) -> tuple[int, int]:
        """(topic id, partition) from what follows the partitions prefix."""
        tid, p = rest.split("/")
        return int(tid), int(p)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node as the cluster knows it (its `nodes/<id>` record)."""

    node_id: int
    host: str
    port: int
    core_ports: tuple[int, ...]
    membership_port: int = 0
    weight: int = 100
    rack: str = ""

    def address(self) -> NodeAddress:
        return NodeAddress(self.node_id, self.host, self.port, self.core_ports, self.rack)

    def encode(self) -> str:
        return json.dumps({**asdict(self), "core_ports": list(self.core_ports)}, separators=(",", ":"))

    @classmethod
    def decode(cls, value: str | bytes) -> NodeRecord:
        d = json.loads(value)
        return cls(
            node_id=int(d["node_id"]),
            host=d["host"],
            port=int(d["port"]),
            core_ports=tuple(int(x) for x in d["core_ports"]),
            membership_port=int(d.get("membership_port", 0)),
            weight=int(d.get("weight", 100)),
            rack=d.get("rack", ""),
        )


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic as the cluster knows it: the settings every node's registry copies, how many
    replicas each partition has, and the replicas of those placed by hand (Kafka's manual
    assignment), kept so that whoever writes a partition's first state (its creator, or the
    controller completing a creation whose creator died) writes the placement asked for."""

    topic: Topic
    replication: int
    manual: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # partition -> node ids

    def encode(self) -> str:
        d: dict[str, Any] = {**self.topic.to_json(), "replication": self.replication}
        if self.manual:
            d["manual"] = {str(p): list(r) for p, r in sorted(self.manual.items())}
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def decode(cls, value: str | bytes) -> TopicRecord:
        """Also a record written before topics had configs (its resolved limits become the
        overrides they stand for: `Topic.from_json`)."""
        d: dict[str, Any] = json.loads(value)
        replication = int(d.pop("replication", 1))
        manual = {int(p): tuple(int(n) for n in r) for p, r in d.pop("manual", {}).items()}
        return cls(Topic.from_json(d), replication, manual)


@dataclass(frozen=True, slots=True)
class PresenceRecord:
    """A node's presence (its `live/<id>` record, on its session lease)."""

    since: float  # unix time it registered
    draining: bool = False  # stopping gracefully: hand its leaderships over, take no new work

    def encode(self) -> str:
        d: dict[str, Any] = {"since": self.since}
        if self.draining:
            d["draining"] = True
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def decode(cls, value: str | bytes) -> PresenceRecord:
        """Lenient: an older node's record (or one hand-written) that says nothing more is a
        presence that is not draining."""
        try:
            d = json.loads(value)
        except ValueError:
            return cls(0.0)
        if not isinstance(d, dict):
            return cls(0.0)
        since = d.get("since", 0.0)
        return cls(float(since) if isinstance(since, int | float) else 0.0, d.get("draining") is True)
