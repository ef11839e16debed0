"""Consumer-group offsets: what each group committed on one partition, and which group ids are kept.

Rules this module keeps:
- One small JSON file per partition (`layout.group_offsets_path` of its directory), replaced atomically per
  commit (write, fsync, rename, fsync the directory, broker/storage/durable_file.py): a commit
  acknowledged is a commit kept. The in-memory map changes only after the file did.
- A group id is 1-255 characters (`check_group`; `GroupError` is INVALID_GROUP on the wire).
- Owned by the partition's core, like the partition (broker/core/partition.py); no locks.
"""

from __future__ import annotations

from broker.storage import layout
from broker.storage.durable_file import load_json, replace_json

GROUP_ID_MAX = 255  # characters


class GroupError(ValueError):
    """A consumer-group id the broker will not store."""


def check_group(group: str) -> None:
    if not group or len(group) > GROUP_ID_MAX:
        raise GroupError(f"a group id must be 1-{GROUP_ID_MAX} characters, not {len(group)}")


class GroupOffsets:
    """The committed (offset, metadata) of each group on one partition."""

    def __init__(self, directory: str) -> None:
        self._path = layout.group_offsets_path(directory)
        self._offsets: dict[str, tuple[int, str]] = self._load()

    def _load(self) -> dict[str, tuple[int, str]]:
        doc = load_json(self._path)
        if not isinstance(doc, dict):
            return {}
        return {g: (int(v[0]), str(v[1])) for g, v in doc.items()}

    def get(self, group: str) -> tuple[int, str]:
        """(offset, metadata) committed by `group`, or (-1, "") if it committed none."""
        return self._offsets.get(group, (-1, ""))

    def commit(self, group: str, offset: int, metadata: str) -> None:
        offsets = dict(self._offsets)
        offsets[group] = (offset, metadata)
        replace_json(self._path, {g: list(v) for g, v in offsets.items()})
        self._offsets = offsets
