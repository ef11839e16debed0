"""Consumer-group offsets of a cluster, kept in the metadata store, so that they survive the loss
of the group's coordinator node (Kafka keeps them in a replicated topic, `__consumer_offsets`).

Rules this module keeps:
- One key per group, `groups/<group id>`, holding the same document the single-node file holds
  (`broker/core/groups.py`): a commit replaces it whole, merged with what the store holds.
- Nothing is cached: the coordinator of a group moves with the live nodes (`routing.coordinator_node`),
  and a node that coordinated it before must not answer from a copy older than the new
  coordinator's commits. A read is one etcd range call.
- Calls are blocking and may wait on the network: they run on the coordinator core's
  `run_blocking` threads (`remote`), never on its loop, so a slow or absent etcd delays only the
  group requests waiting on it. The store's own deadline bounds a call when etcd is away; the
  request is then answered a retriable error (`OffsetsUnavailable`: Kafka's
  COORDINATOR_NOT_AVAILABLE, our REQUEST_TIMED_OUT).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping

from broker.cluster.records import Keys
from broker.cluster.store import MetadataStore, StoreError
from broker.core.groups import Committed, GroupError, GroupOffsetStore, OffsetsUnavailable, PartitionId


class StoreGroupOffsets(GroupOffsetStore):
    remote = True  # each call is an etcd round trip (module rules)

    def __init__(self, store: MetadataStore, keys: Keys, data_dir: str) -> None:
        super().__init__(data_dir)
        self.store = store
        self.keys = keys

    def offsets(self, group: str) -> Mapping[PartitionId, Committed]:
        try:
            kv = self.store.get(self.keys.group(group))
        except StoreError as exc:
            raise OffsetsUnavailable(f"the offsets of group {group!r} cannot be read now: {exc}") from exc
        if kv is None:
            return {}
        doc = json.loads(kv.value)
        if doc.get("group") != group:
            raise GroupError(f"the offsets record of group {group!r} holds group {doc.get('group')!r}")
        return {(int(t), int(p)): Committed(int(o), str(meta)) for t, p, o, meta in doc.get("offsets", ())}

    def has_offsets(self, group: str) -> bool:
        return bool(self.offsets(group))

    def commit(
        self,
        group: str,
        offsets: Mapping[PartitionId, Committed],
        live: Callable[[int], bool] | None = None,
    ) -> None:
        merged = {k: v for k, v in self.offsets(group).items() if live is None or live(k[0])}
        merged.update(offsets)
        rows = [[t, p, c.offset, c.metadata] for (t, p), c in sorted(merged.items())]
        try:
            self.store.put(self.keys.group(group), json.dumps({"group": group, "offsets": rows}))
        except StoreError as exc:
            raise OffsetsUnavailable(f"the offsets of group {group!r} cannot be written now: {exc}") from exc

    def forget(self, group: str) -> None:
        """Nothing to forget: nothing is cached (module rules)."""

    def delete_group(self, group: str) -> bool:
        try:
            return self.store.delete(self.keys.group(group)) > 0
        except StoreError as exc:
            raise OffsetsUnavailable(f"the offsets of group {group!r} cannot be deleted now: {exc}") from exc

    def delete_offsets(self, group: str, partitions: Iterable[PartitionId]) -> None:
        gone = set(partitions)
        offsets = self.offsets(group)
        if not gone & set(offsets):
            return
        kept = {k: v for k, v in offsets.items() if k not in gone}
        if not kept:
            self.delete_group(group)
            return
        rows = [[t, p, c.offset, c.metadata] for (t, p), c in sorted(kept.items())]
        try:
            self.store.put(self.keys.group(group), json.dumps({"group": group, "offsets": rows}))
        except StoreError as exc:
            raise OffsetsUnavailable(f"the offsets of group {group!r} cannot be written now: {exc}") from exc
