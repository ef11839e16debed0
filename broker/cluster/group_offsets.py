"""Consumer-group offsets of a cluster, kept in the metadata store, so that they survive the loss
of the group's coordinator node (Kafka keeps them in a replicated topic, `__consumer_offsets`).

Rules this module keeps:
- One key per group, `groups/<group id>`, holding the same document the single-node file holds
  (`broker/core/groups.py`, pending transactional offsets included): a commit, a transaction's
  pending offsets and its marker each replace it whole, merged with what the store holds.
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

from broker.cluster.records import Keys
from broker.cluster.store import MetadataStore, StoreError
from broker.core.groups import GroupDoc, GroupOffsetStore, OffsetsUnavailable, doc_from_json, doc_to_json


class StoreGroupOffsets(GroupOffsetStore):
    """The same document as the file's, pending transactional offsets included, under the
    group's key: every operation of `GroupOffsetStore` is a read and a replace of it here."""

    remote = True  # each call is an etcd round trip (module rules)

    def __init__(self, store: MetadataStore, keys: Keys, data_dir: str) -> None:
        super().__init__(data_dir)
        self.store = store
        self.keys = keys

    def load_doc(self, group: str) -> GroupDoc:
        try:
            kv = self.store.get(self.keys.group(group))
        except StoreError as exc:
            raise OffsetsUnavailable(f"the offsets of group {group!r} cannot be read now: {exc}") from exc
        return GroupDoc() if kv is None else doc_from_json(group, json.loads(kv.value))

    def store_doc(self, group: str, doc: GroupDoc) -> None:
        """One put of the whole document (a delete when it is empty)."""
        try:
            if doc:
                self.store.put(self.keys.group(group), json.dumps(doc_to_json(group, doc)))
            else:
                self.store.delete(self.keys.group(group))
        except StoreError as exc:
            raise OffsetsUnavailable(f"the offsets of group {group!r} cannot be written now: {exc}") from exc

    def has_offsets(self, group: str) -> bool:
        return bool(self.load_doc(group))

    def forget(self, group: str) -> None:
        """Nothing to forget: nothing is cached (module rules)."""

    def delete_group(self, group: str) -> bool:
        try:
            return self.store.delete(self.keys.group(group)) > 0
        except StoreError as exc:
            raise OffsetsUnavailable(f"the offsets of group {group!r} cannot be deleted now: {exc}") from exc
