"""A node's copy of its cluster's records: what the watch on the store has delivered so far.

Rules this module keeps:
- Fed only by the store's own answers: a full read (`load`) and then watch events in revision
  order (`apply`). It never guesses; the revision of the last event applied is the view's
  generation, so a worker can tell a newer view from an older one.
- Pure: no store calls, no files, no threads (the agent owns those), so the rules of how records
  become a view are tested without etcd.
- A record that does not parse is skipped with a warning, never fatal: one bad write (a newer
  node's format, an operator's etcdctl) must not take every node's view down with it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

from broker.cluster.records import Keys, NodeRecord, PresenceRecord, TopicRecord
from broker.core.cluster_view import NO_LEADER, ClusterView, PartitionState
from broker.core.topics import Topic

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Versioned:
    """A partition's state and the mod revision it was read at (what a fenced write compares)."""

    state: PartitionState
    mod_revision: int


class Mirror:
    def __init__(self, keys: Keys, node_id: int) -> None:
        self.keys = keys
        self.node_id = node_id
        self.revision = 0
        self.nodes: dict[int, NodeRecord] = {}
        self.live: dict[int, int] = {}  # node id -> the lease its presence key lives on
        self.draining: set[int] = set()  # live nodes stopping gracefully (their presence says so)
        self.topics: dict[str, TopicRecord] = {}
        self.partitions: dict[tuple[int, int], Versioned] = {}
        self.controller = NO_LEADER
        self.security: dict[str, bytes] = {}  # the users' and the ACLs' documents, by file name

    def load(self, items: list[tuple[str, bytes, int, int]], revision: int) -> None:
        """Start over from a full read: (key, value, mod revision, lease) of every key under the
        cluster's prefix, as of `revision`."""
        self.nodes.clear()
        self.live.clear()
        self.draining.clear()
        self.topics.clear()
        self.partitions.clear()
        self.security.clear()
        self.controller = NO_LEADER
        for key, value, mod_revision, lease in items:
            self.apply(key, value, mod_revision, lease)
        self.revision = revision

    def apply(self, key: str, value: bytes | None, mod_revision: int, lease: int = 0) -> bool:
        """One watch event (`value` None: the key was deleted). Returns whether the view changed."""
        k = self.keys
        self.revision = max(self.revision, mod_revision)
        try:
            if key.startswith(k.partitions):
                ident = Keys.parse_partition(key[len(k.partitions) :])
                if value is None:
                    return self.partitions.pop(ident, None) is not None
                self.partitions[ident] = Versioned(PartitionState.from_json(json.loads(value)), mod_revision)
            elif key.startswith(k.live):
                node = int(key[len(k.live) :])
                if value is None:
                    self.draining.discard(node)
                    return self.live.pop(node, None) is not None
                self.live[node] = lease
                if PresenceRecord.decode(value).draining:
                    self.draining.add(node)
                else:
                    self.draining.discard(node)
            elif key.startswith(k.nodes):
                node = int(key[len(k.nodes) :])
                if value is None:
                    return self.nodes.pop(node, None) is not None
                self.nodes[node] = NodeRecord.decode(value)
            elif key.startswith(k.topics):
                name = key[len(k.topics) :]
                if value is None:
                    return self.topics.pop(name, None) is not None
                self.topics[name] = TopicRecord.decode(value)
            elif key.startswith(k.security):
                name = key[len(k.security) :]
                if value is None:
                    return self.security.pop(name, None) is not None
                self.security[name] = value
            elif key == k.controller:
                self.controller = NO_LEADER if value is None else int(json.loads(value)["node_id"])
            else:
                return False
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the record at %s: %s", key, exc)
            return False
        return True

    def view(self, fenced: bool = False) -> ClusterView:
        """What this node's workers act on. `fenced`: the store said this node's session lapsed
        (the cluster took it for dead, and may have elected others): it leads nothing until it
        has registered again (broker/cluster/agent.py; a store merely unreachable fences nothing)."""
        partitions = {ident: v.state for ident, v in self.partitions.items()}
        live = frozenset(n for n in self.live if n in self.nodes)
        draining = frozenset(n for n in self.draining if n in live)
        if fenced:
            me = self.node_id
            partitions = {
                ident: replace(s, leader=NO_LEADER) if s.leader == me else s
                for ident, s in partitions.items()
            }
            live = live - {me}
        return ClusterView(
            node_id=self.node_id,
            generation=self.revision,
            clustered=True,
            nodes={n: rec.address() for n, rec in self.nodes.items()},
            partitions=partitions,
            controller=self.controller,
            live=live,
            draining=draining,
        )

    def topic_list(self) -> list[Topic]:
        """The topics every node's registry holds (a topic whose partition states are not all
        written yet is still listed: its partitions are offline until they are)."""
        return [r.topic for r in self.topics.values()]
