"""Consumer-group offsets: what each group committed, kept on the group's coordinator core.

Rules this module keeps:
- A group's committed offsets belong to its coordinator core (`routing.coordinator_for`), whatever
  protocol commits them: ours and Kafka's read and write the same store, so a group committed by a
  Kafka client reads the same through our Consumer, and the other way round.
- One small JSON file per group (`layout.group_file_path`: named by a hash of the group id, the id
  inside), replaced atomically per commit (write, fsync, rename, fsync the directory,
  broker/storage/durable_file.py): a commit acknowledged is a commit kept. A commit of many
  partitions is one replace. The in-memory map changes only after the file did.
- Each offset is kept under its topic's id, never its name: topic ids are never reused, so a topic
  deleted and created again under the same name starts with no committed offsets. A group's
  offsets of deleted topics are dropped at its next commit.
- A group id is 1-255 characters (`check_group`; `GroupError` is INVALID_GROUP on our wire).
- An offset is stored as it came, whatever the partition's log holds, as Kafka's coordinator stores
  it; the metadata beside it is at most OFFSET_METADATA_MAX characters.
- The offsets of the old layout (one file per partition, `layout.group_offsets_path`) are moved
  into this store once, before any core serves (`migrate_partition_offsets`, run by the
  supervisor), then removed.
- Owned by one core's event loop; no locks. Files are read on a group's first use, and only a
  group with offsets (committed or pending) stays in memory: any name can be asked about (a lag
  monitor polling names, a deleted group), and the names asked must not pile up.
- Offsets are deleted on request (Kafka's DeleteGroups and OffsetDelete): a group's file is
  rewritten without them, or removed with its last one (the directory synced: a deletion
  acknowledged stays deleted). Pending transactional offsets of those partitions go with them.
- Transactional offsets (KIP-98/447, Kafka's GroupMetadata pendingTransactionalOffsetCommits) are
  kept *pending* per producer id in the same document (`pending`, written only when some are),
  durably before the answer (`commit_pending`), and do not count as committed until the
  transaction's marker (`complete_pending`): commit makes them the committed offsets, abort drops
  them, one replace each. A producer's later pending offset of a partition replaces its earlier
  one; an older producer epoch than the one pending is refused (`StaleProducerEpoch`). A
  non-transactional commit of a partition made after a pending one wins when the transaction
  commits later (Kafka compares the two records' log positions; here the pending offset is
  marked superseded). `pending_for` names the partitions with pending offsets (Kafka's
  hasPendingOffsetCommitsForTopicPartition: OffsetFetch's UNSTABLE_OFFSET_COMMIT).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from broker.storage import layout
from broker.storage.durable_file import load_json, replace_json

log = logging.getLogger(__name__)

GROUP_ID_MAX = 255  # characters
# Characters of the metadata committed with an offset: Kafka's offset.metadata.max.bytes default
# (its coordinator compares the string's length). Longer: OFFSET_METADATA_TOO_LARGE for that
# partition (Kafka), LIMIT_EXCEEDED (ours); every commit rewrites the group's file with them all.
OFFSET_METADATA_MAX = 4096


class GroupError(ValueError):
    """A consumer-group id the broker will not store."""


def check_group(group: str) -> None:
    if not group or len(group) > GROUP_ID_MAX:
        raise GroupError(f"a group id must be 1-{GROUP_ID_MAX} characters, not {len(group)}")


class OffsetsUnavailable(Exception):
    """The store of a group's offsets cannot be reached now (a cluster's etcd is away): nothing
    was read or written; the client asks again (retriable on both protocols)."""


class Committed(NamedTuple):
    offset: int
    metadata: str


NOTHING_COMMITTED = Committed(-1, "")
PartitionId = tuple[int, int]  # (topic id, partition index)


class StaleProducerEpoch(Exception):
    """Transactional offsets from an older epoch of a producer than the one pending: a zombie's
    (Kafka's INVALID_PRODUCER_EPOCH); nothing was stored."""


@dataclass
class PendingTxn:
    """One producer's transactional offsets, waiting for its transaction's marker."""

    epoch: int
    offsets: dict[PartitionId, Committed] = field(default_factory=dict)
    # partitions committed non-transactionally after this pending offset: they keep that commit
    superseded: set[PartitionId] = field(default_factory=set)


@dataclass
class GroupDoc:
    """What one group's document holds: its committed offsets and its pending transactions."""

    offsets: dict[PartitionId, Committed] = field(default_factory=dict)
    pending: dict[int, PendingTxn] = field(default_factory=dict)  # producer id -> its offsets

    def __bool__(self) -> bool:
        return bool(self.offsets or self.pending)

    def minus(self, gone: set[PartitionId]) -> GroupDoc:
        """A copy without the offsets (committed or pending) of the partitions `gone`."""
        return self.without_topics(None, lambda k: k not in gone)

    def without_topics(
        self, live: Callable[[int], bool] | None, keep_partition: Callable[[PartitionId], bool] | None = None
    ) -> GroupDoc:
        """A copy without the offsets (committed or pending) of topics `live` says are gone (and
        of partitions `keep_partition` refuses)."""

        def keep(k: PartitionId) -> bool:
            return (live is None or live(k[0])) and (keep_partition is None or keep_partition(k))

        pending = {
            pid: PendingTxn(
                txn.epoch,
                {k: v for k, v in txn.offsets.items() if keep(k)},
                {k for k in txn.superseded if keep(k)},
            )
            for pid, txn in self.pending.items()
        }
        return GroupDoc(
            {k: v for k, v in self.offsets.items() if keep(k)},
            {pid: t for pid, t in pending.items() if t.offsets},
        )


def doc_to_json(group: str, doc: GroupDoc) -> dict[str, Any]:
    """The document's JSON form; `pending` only when some are, so a group that never took part
    in a transaction keeps the form it always had."""
    out: dict[str, Any] = {
        "group": group,
        "offsets": [[t, p, c.offset, c.metadata] for (t, p), c in sorted(doc.offsets.items())],
    }
    if doc.pending:
        out["pending"] = [
            [
                pid,
                txn.epoch,
                [
                    [t, p, c.offset, c.metadata, (t, p) in txn.superseded]
                    for (t, p), c in sorted(txn.offsets.items())
                ],
            ]
            for pid, txn in sorted(doc.pending.items())
        ]
    return out


def doc_from_json(group: str, raw: object) -> GroupDoc:
    if not isinstance(raw, dict):
        return GroupDoc()
    if raw.get("group") != group:  # a sha256 prefix collision: never seen, but never merged either
        raise GroupError(f"the offsets document of group {group!r} holds group {raw.get('group')!r}")
    offsets = {(int(t), int(p)): Committed(int(o), str(meta)) for t, p, o, meta in raw.get("offsets", ())}
    pending = {}
    for pid, epoch, rows in raw.get("pending", ()):
        txn = PendingTxn(int(epoch))
        for t, p, o, meta, superseded in rows:
            txn.offsets[(int(t), int(p))] = Committed(int(o), str(meta))
            if superseded:
                txn.superseded.add((int(t), int(p)))
        pending[int(pid)] = txn
    return GroupDoc(offsets, pending)


class GroupOffsetStore:
    """The committed offsets of the groups this core coordinates, one durable file per group.

    Every change is read-modify-write of the group's whole document through `load_doc` and
    `store_doc`, which a subclass replaces to keep the document elsewhere (a cluster's etcd)."""

    # False: answered on the loop (a file read once, then memory; a commit is one fsynced
    # replace). True: every call may wait on the network, so it runs on the core's
    # `run_blocking` threads (`Core.offsets_run`), never on its loop.
    remote = False

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self._groups: dict[str, GroupDoc] = {}

    # ------------------------------------------------------------------------- where the document lives

    def load_doc(self, group: str) -> GroupDoc:
        """The group's document (read from its file on first use, then kept if it holds any
        offset: module rules)."""
        found = self._groups.get(group)
        if found is None:
            found = read_group_doc(self.data_dir, group)
            if found:
                self._groups[group] = found
        return found

    def store_doc(self, group: str, doc: GroupDoc) -> None:
        """Replace the group's document durably (its file removed when empty), then remember it
        (an empty one is forgotten: module rules)."""
        if doc:
            write_group_doc(self.data_dir, group, doc)
            self._groups[group] = doc
        else:
            remove_group_file(self.data_dir, group)
            self._groups.pop(group, None)

    # ------------------------------------------------------------------------- committed offsets

    def offsets(self, group: str) -> Mapping[PartitionId, Committed]:
        """Every offset `group` committed (pending transactional ones are not)."""
        return self.load_doc(group).offsets

    def has_offsets(self, group: str) -> bool:
        """Whether `group` committed any offset or has pending ones (Kafka's hasOffsets)."""
        return bool(self.load_doc(group))

    def committed(self, group: str, topic_id: int, partition: int) -> Committed:
        return self.offsets(group).get((topic_id, partition), NOTHING_COMMITTED)

    def commit(
        self,
        group: str,
        offsets: Mapping[PartitionId, Committed],
        live: Callable[[int], bool] | None = None,
    ) -> None:
        """Store `offsets` for `group` durably (one replace), then remember them. The group's
        offsets of topics `live` says are gone (deleted: ids are never reused) are dropped in
        the same write. A pending transactional offset of the same partition is superseded: this
        commit stays when its transaction commits (module rules)."""
        doc = self.load_doc(group).without_topics(live)
        doc.offsets.update(offsets)
        for txn in doc.pending.values():
            txn.superseded.update(k for k in offsets if k in txn.offsets)
        self.store_doc(group, doc)

    def forget(self, group: str) -> None:
        """Drop the cached copy (the file stays): the next use reads it again."""
        self._groups.pop(group, None)

    def delete_group(self, group: str) -> bool:
        """Forget every offset of `group`, pending ones too, durably (its file removed, the
        directory synced). Returns whether it had any."""
        had = bool(self.load_doc(group))
        self.store_doc(group, GroupDoc())
        return had

    def delete_offsets(self, group: str, partitions: Iterable[PartitionId]) -> None:
        """Forget `group`'s offsets of `partitions`, pending ones too, durably (one replace; the
        document removed when none is left)."""
        gone = set(partitions)
        doc = self.load_doc(group)
        if not gone & (set(doc.offsets) | {k for t in doc.pending.values() for k in t.offsets}):
            return
        self.store_doc(group, doc.minus(gone))

    # ------------------------------------------------------------------------- transactional offsets

    def commit_pending(
        self,
        group: str,
        producer_id: int,
        producer_epoch: int,
        offsets: Mapping[PartitionId, Committed],
        live: Callable[[int], bool] | None = None,
    ) -> None:
        """Keep `offsets` pending for the transaction of `producer_id`, durably (one replace),
        until its marker. Raises StaleProducerEpoch for an epoch older than the one pending."""
        doc = self.load_doc(group).without_topics(live)
        txn = doc.pending.get(producer_id)
        if txn is not None and producer_epoch < txn.epoch:
            raise StaleProducerEpoch(
                f"producer {producer_id} epoch {producer_epoch} is older than its pending epoch {txn.epoch}"
            )
        if txn is None:
            txn = doc.pending[producer_id] = PendingTxn(producer_epoch)
        txn.epoch = producer_epoch
        txn.offsets.update(offsets)
        txn.superseded.difference_update(offsets)
        self.store_doc(group, doc)

    def complete_pending(self, group: str, producer_id: int, commit: bool) -> bool:
        """The marker of `producer_id`'s transaction: on commit its pending offsets become the
        group's committed offsets (but those superseded), on abort they go; one replace.
        Returns whether it had any pending (a marker without any writes nothing)."""
        doc = self.load_doc(group).without_topics(None)
        txn = doc.pending.pop(producer_id, None)
        if txn is None:
            return False
        if commit:
            doc.offsets.update((k, c) for k, c in txn.offsets.items() if k not in txn.superseded)
        self.store_doc(group, doc)
        return True

    def pending_for(self, group: str, partitions: Iterable[PartitionId]) -> set[PartitionId]:
        """Those of `partitions` some transaction of `group` holds a pending offset of."""
        held = {k for t in self.load_doc(group).pending.values() for k in t.offsets}
        return {k for k in partitions if k in held}


def read_group_doc(data_dir: str, group: str) -> GroupDoc:
    return doc_from_json(group, load_json(layout.group_file_path(data_dir, group)))


def write_group_doc(data_dir: str, group: str, doc: GroupDoc) -> None:
    os.makedirs(layout.groups_dir(data_dir), exist_ok=True)
    replace_json(layout.group_file_path(data_dir, group), doc_to_json(group, doc))


def remove_group_file(data_dir: str, group: str) -> None:
    path = layout.group_file_path(data_dir, group)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _old_offset_files(data_dir: str) -> Iterable[tuple[int, int, str]]:
    """(topic id, partition, path) of every per-partition offsets file of the old layout."""
    topics = layout.topics_dir(data_dir)
    try:
        topic_names = os.listdir(topics)
    except FileNotFoundError:
        return
    for tname in topic_names:
        topic_id = layout.parse_number_name(tname)
        if topic_id is None:
            continue
        try:
            partition_names = os.listdir(layout.topic_dir(data_dir, topic_id))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for pname in partition_names:
            index = layout.parse_number_name(pname)
            if index is None:
                continue
            path = layout.group_offsets_path(layout.partition_dir(data_dir, topic_id, index))
            if os.path.exists(path):
                yield topic_id, index, path


def migrate_partition_offsets(data_dir: str) -> int:
    """Move the old per-partition offsets files into the per-group store, then remove them.
    Returns the offsets moved. Run before any core serves. An offset already in the store is
    kept (it can only come from an earlier, interrupted run of this migration). Raises OSError
    (a full disk) with the old files left in place: the next start tries again."""
    found: dict[str, dict[PartitionId, Committed]] = {}
    paths = []
    for topic_id, index, path in _old_offset_files(data_dir):
        doc = load_json(path)
        paths.append(path)
        if not isinstance(doc, dict):
            continue
        for group, (offset, metadata) in doc.items():
            found.setdefault(group, {})[(topic_id, index)] = Committed(int(offset), str(metadata))
    moved = 0
    for group, offsets in found.items():
        doc = read_group_doc(data_dir, group)
        doc.offsets = {**offsets, **doc.offsets}
        write_group_doc(data_dir, group, doc)
        moved += len(offsets)
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if paths:
        log.info(
            "moved %d committed offsets of %d groups out of %d partition files", moved, len(found), len(paths)
        )
    return moved
