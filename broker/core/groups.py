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
- Owned by one core's event loop; no locks. Files are read on a group's first use.
- Offsets are deleted on request (Kafka's DeleteGroups and OffsetDelete): a group's file is
  rewritten without them, or removed with its last one (the directory synced: a deletion
  acknowledged stays deleted).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

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


class GroupOffsetStore:
    """The committed offsets of the groups this core coordinates, one durable file per group."""

    # False: answered on the loop (a file read once, then memory; a commit is one fsynced
    # replace). True: every call may wait on the network, so it runs on the core's
    # `run_blocking` threads (`Core.offsets_run`), never on its loop.
    remote = False

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self._groups: dict[str, dict[PartitionId, Committed]] = {}

    def offsets(self, group: str) -> Mapping[PartitionId, Committed]:
        """Every offset `group` committed (read from its file on first use)."""
        found = self._groups.get(group)
        if found is None:
            found = self._groups[group] = read_group_file(self.data_dir, group)
        return found

    def has_offsets(self, group: str) -> bool:
        """Whether `group` committed any offset. A group without any is not cached: any name can
        be asked (DescribeGroups), and the names asked must not pile up in memory."""
        found = self._groups.get(group)
        if found is None:
            found = read_group_file(self.data_dir, group)
            if found:
                self._groups[group] = found
        return bool(found)

    def committed(self, group: str, topic_id: int, partition: int) -> Committed:
        return self.offsets(group).get((topic_id, partition), NOTHING_COMMITTED)

    def commit(
        self,
        group: str,
        offsets: Mapping[PartitionId, Committed],
        live: Callable[[int], bool] | None = None,
    ) -> None:
        """Store `offsets` for `group` durably (one file replace), then remember them. The
        group's offsets of topics `live` says are gone (deleted: ids are never reused) are
        dropped in the same write."""
        merged = {k: v for k, v in self.offsets(group).items() if live is None or live(k[0])}
        merged.update(offsets)
        write_group_file(self.data_dir, group, merged)
        self._groups[group] = merged

    def forget(self, group: str) -> None:
        """Drop the cached copy (the file stays): the next use reads it again."""
        self._groups.pop(group, None)

    def delete_group(self, group: str) -> bool:
        """Forget every offset of `group`, durably (its file removed, the directory synced).
        Returns whether it had any."""
        had = bool(self.offsets(group))
        remove_group_file(self.data_dir, group)
        self._groups.pop(group, None)
        return had

    def delete_offsets(self, group: str, partitions: Iterable[PartitionId]) -> None:
        """Forget `group`'s offsets of `partitions`, durably (one file replace; the file removed
        when none is left)."""
        gone = set(partitions)
        offsets = self.offsets(group)
        if not gone & set(offsets):
            return
        kept = {k: v for k, v in offsets.items() if k not in gone}
        if kept:
            write_group_file(self.data_dir, group, kept)
        else:
            remove_group_file(self.data_dir, group)
        self._groups[group] = kept


def read_group_file(data_dir: str, group: str) -> dict[PartitionId, Committed]:
    doc = load_json(layout.group_file_path(data_dir, group))
    if not isinstance(doc, dict):
        return {}
    if doc.get("group") != group:  # a sha256 prefix collision: never seen, but never merged either
        raise GroupError(f"the offsets file of group {group!r} holds group {doc.get('group')!r}")
    return {(int(t), int(p)): Committed(int(o), str(meta)) for t, p, o, meta in doc.get("offsets", ())}


def write_group_file(data_dir: str, group: str, offsets: Mapping[PartitionId, Committed]) -> None:
    os.makedirs(layout.groups_dir(data_dir), exist_ok=True)
    rows = [[t, p, c.offset, c.metadata] for (t, p), c in sorted(offsets.items())]
    replace_json(layout.group_file_path(data_dir, group), {"group": group, "offsets": rows})


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
        merged = {**offsets, **read_group_file(data_dir, group)}
        write_group_file(data_dir, group, merged)
        moved += len(offsets)
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if paths:
        log.info(
            "moved %d committed offsets of %d groups out of %d partition files", moved, len(found), len(paths)
        )
    return moved
