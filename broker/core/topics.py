"""The topic registry: names, numeric topic ids, partition counts and per-topic log settings.

Rules this module keeps:
- Topic ids are assigned here, only grow, and are never reused, even after a delete: a client
  holding a stale id then gets UNKNOWN_TOPIC_OR_PARTITION rather than another topic's data.
- The registry is one small JSON file replaced atomically (write a temporary file, fsync it,
  rename it over the old one, fsync the directory). A crash leaves the old or the new version,
  never a torn one. Topic changes are rare; this cost is paid per create or delete only.
- Partition data lives in `<data_dir>/topics/<topic_id>/<partition>/`: named by id, so a topic
  deleted and created again with the same name never meets the old files.
- Several worker processes share the registry. A change (create, delete) happens under an
  exclusive `flock` of `<data_dir>/topics.lock` (`locked()`): reload, change, save, unlock, so two
  cores never hand out one id or lose each other's topics. Readers need no lock: the file is only
  ever replaced whole. `refresh()` rereads it when it was replaced (a stat, no read otherwise).
- Orphan directories (a topic's files without a registry entry) are removed only by
  `remove_orphans()`, which a worker calls once at start while holding the lock, never on a later
  reload: another core may be between "save the registry" and "create the directories".
- Creating a topic writes the registry and nothing else: each partition's directory and first
  segment are made by its owning core when the partition is first used (broker/core/core.py), so
  CreateTopic costs the same for 1 or 10 000 partitions, and a crash at any point leaves either
  no topic or a topic whose partitions open (empty) on first use.
- Limits (broker/core/limits.py) are checked here, under the lock, so they hold across cores: partitions
  per topic and per broker (the sum over the registry), and floors on segment.bytes and segment.ms.
  They bind new topics and config changes only: a topic created under older limits keeps working.
- A topic's configs are its overrides only (broker/core/topic_configs.py), checked here whenever
  they are set (`make`, `altered`); what they mean with the broker's defaults is `settings_of`.
  A registry written before topics had configs (version 1) still loads (`Topic.from_json`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from broker.core.limits import Limits, partition_limit
from broker.core.topic_config_keys import ConfigError
from broker.core.topic_configs import (
    Alteration,
    TopicDefaults,
    TopicSettings,
    check_topic,
    parse_overrides,
    readable,
    replacing,
    settings,
)
from broker.storage import layout
from broker.storage.diskspace import is_out_of_space, release_reserve
from broker.storage.durable_file import exclusive_lock, load_json, replace_json
from broker.storage.log import LogConfig

log = logging.getLogger(__name__)

REGISTRY_VERSION = 2  # 2: topics carry their config overrides; 1 (resolved limits) still loads
READABLE_VERSIONS = (1, 2)
RACY_NS = 200_000_000  # a registry file younger than this is reloaded even when it looks the same
TOPIC_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class TopicFault(Enum):
    """Why a topic operation cannot be done: each becomes one error code (broker/core/errors.py),
    so a misspelt kind is a NameError at import, not a silent UNKNOWN_SERVER_ERROR."""

    EXISTS = "exists"
    UNKNOWN = "unknown"
    INVALID = "invalid"
    CONFIG = "config"
    LIMIT = "limit"
    PARTITIONS = "partitions"  # a partition count that is not an increase (Kafka's INVALID_PARTITIONS)


class TopicError(Exception):
    """A topic operation that cannot be done; `kind` names the wire error it becomes."""

    def __init__(self, kind: TopicFault, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic: its name, id, partition count and config overrides (`configs`, checked and
    normalised by broker/core/topic_configs.py: every config it does not name takes the broker's
    default). `configs` is a mapping never changed in place: a change is a new `Topic`."""

    name: str
    topic_id: int
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": self.partitions,
            "configs": dict(sorted(self.configs.items())),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Topic:
        """A topic as the registry or a cluster's record holds it; one written before topics had
        configs (retention_ms, retention_bytes, segment_bytes, max_batch_bytes, segment_ms
        fields, resolved when it was created) gets those that differ from the built-in defaults
        as its overrides, so it keeps what it was created with."""
        configs = d.get("configs")
        if configs is None:
            configs = _legacy_overrides(d)
        return cls(
            str(d["name"]),
            int(d["topic_id"]),
            int(d["partitions"]),
            {str(k): str(v) for k, v in configs.items()},
        )


def _legacy_overrides(d: Mapping[str, Any]) -> dict[str, str]:
    built_in = LogConfig()
    out = {}
    for field_name, config, default in (
        ("retention_ms", "retention.ms", built_in.retention_ms),
        ("retention_bytes", "retention.bytes", built_in.retention_bytes),
        ("segment_bytes", "segment.bytes", built_in.segment_bytes),
        ("segment_ms", "segment.ms", built_in.segment_ms),
    ):
        if field_name in d and d[field_name] != default:
            out[config] = "-1" if d[field_name] is None else str(d[field_name])
    batch = d.get("max_batch_bytes")
    segment = d.get("segment_bytes", built_in.segment_bytes)
    if batch is not None and batch != min(built_in.max_batch_bytes, segment):
        out["max.message.bytes"] = str(batch)
    return out


def invalid_topic_name(name: str) -> str | None:
    if not TOPIC_NAME_RE.match(name):
        return f"topic name {name!r} must be 1-249 characters of A-Z a-z 0-9 . _ -"
    if name in (".", ".."):
        return f"topic name {name!r} is reserved"
    return None


class TopicRegistry:
    """All topics of one broker, persisted in `<data_dir>/topics.json`."""

    def __init__(
        self,
        data_dir: str,
        defaults: LogConfig | TopicDefaults,
        remove_orphans: bool = True,
        limits: Limits | None = None,
    ) -> None:
        """`defaults`: the broker's defaults for topic configs (its log settings alone: the rest
        built in)."""
        self.data_dir = data_dir
        self.topic_defaults = defaults if isinstance(defaults, TopicDefaults) else TopicDefaults(defaults)
        self.defaults = self.topic_defaults.log
        self.limits = limits or Limits()
        self._settings: dict[int, tuple[Topic, TopicSettings]] = {}  # `settings_of`, per topic id
        self.path = layout.topics_file_path(data_dir)
        self.lock_path = layout.topics_lock_path(data_dir)
        self.by_name: dict[str, Topic] = {}
        self.by_id: dict[int, Topic] = {}
        self.next_topic_id = 1  # 0 means "no topic" in frame headers
        # Grows on every change of the topics held (a load, or one of this process's own writes):
        # what is made from them may be kept while it stays the same.
        self.generation = 0
        self._file_identity: tuple[int, int, int] | None = None
        os.makedirs(layout.topics_dir(data_dir), exist_ok=True)
        self.load()
        if remove_orphans:
            self.remove_orphans()

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the registry's exclusive lock (shared by every worker of this data dir)."""
        return exclusive_lock(self.lock_path)

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self) -> None:
        """Read the registry file (no files are touched)."""
        identity = self._identity()
        by_name: dict[str, Topic] = {}
        by_id: dict[int, Topic] = {}
        next_topic_id = 1
        doc = load_json(self.path)
        if isinstance(doc, dict):
            if doc.get("version") not in READABLE_VERSIONS:
                raise ValueError(f"{self.path}: unknown registry version {doc.get('version')}")
            next_topic_id = doc["next_topic_id"]
            for entry in doc["topics"]:
                topic = Topic.from_json(entry)
                by_name[topic.name] = topic
                by_id[topic.topic_id] = topic
        self.by_name, self.by_id, self.next_topic_id = by_name, by_id, next_topic_id
        self._file_identity = identity
        self.generation += 1

    def refresh(self) -> bool:
        """Reload if another process replaced the file since the last load; True if it did.
        A file replaced twice within one tick of the file system's clock can keep its inode
        number, time and size (git's "racy" files): while the file is that young it is reloaded."""
        identity = self._identity()
        if identity == self._file_identity and (identity is None or time.time_ns() - identity[1] > RACY_NS):
            return False
        self.load()
        return True

    def remove_orphans(self) -> None:
        """Remove partition directories of topics the registry does not hold.

        Such directories are what a crash between "delete from the registry" and "delete the
        files" leaves behind (or a core that was dead when another deleted a topic); deleting them
        finishes that delete. Call only at start, holding `locked()`.
        """
        topics_dir = layout.topics_dir(self.data_dir)
        for name in os.listdir(topics_dir):
            if layout.parse_number_name(name) not in self.by_id:
                log.warning("removing %s: no topic in the registry owns it", os.path.join(topics_dir, name))
                shutil.rmtree(os.path.join(topics_dir, name), ignore_errors=True)

    def _save(self) -> None:
        self.generation += 1  # first: the topics held changed already, whether the write succeeds
        doc = {
            "version": REGISTRY_VERSION,
            "next_topic_id": self.next_topic_id,
            "topics": [t.to_json() for t in sorted(self.by_id.values(), key=lambda t: t.topic_id)],
        }
        try:
            replace_json(self.path, doc)
        except OSError as exc:
            # A disk filled to the last byte by something else: give up the reserve file, once,
            # so that a DeleteTopic (which frees space) can still be recorded. A create never
            # gets here on a full disk: it is refused before (broker/storage/diskspace.py).
            if not is_out_of_space(exc) or not release_reserve(self.data_dir):
                raise
            replace_json(self.path, doc)
        self._file_identity = self._identity()

    def partition_dir(self, topic_id: int, partition: int) -> str:
        return layout.partition_dir(self.data_dir, topic_id, partition)

    def create(self, name: str, partitions: int, configs: Mapping[str, str | None] | None = None) -> Topic:
        """Create a topic with these config overrides (checked: `make`)."""
        topic = self.make(name, partitions, self.next_topic_id, configs)
        self.next_topic_id += 1
        self.by_name[name] = topic
        self.by_id[topic.topic_id] = topic
        self._save()
        return topic

    def make(
        self, name: str, partitions: int, topic_id: int, configs: Mapping[str, str | None] | None = None
    ) -> Topic:
        """The topic `create` would add, checked against the name rules, the limits and its
        configs, without adding it: a cluster allocates the id elsewhere (its metadata store)."""
        reason = invalid_topic_name(name)
        if reason is not None:
            raise TopicError(TopicFault.INVALID, reason)
        if name in self.by_name:
            raise TopicError(TopicFault.EXISTS, f"topic {name!r} already exists")
        if partitions < 1:
            raise TopicError(TopicFault.INVALID, f"a topic needs at least 1 partition, not {partitions}")
        lim = self.limits
        if partitions > lim.max_partitions_per_topic:
            raise TopicError(
                TopicFault.LIMIT,
                f"{partitions} partitions exceed the limit of {lim.max_partitions_per_topic} per topic "
                "(--max-partitions-per-topic)",
            )
        held, most = self.partition_count(), partition_limit(lim)
        if held + partitions > most:
            raise TopicError(
                TopicFault.LIMIT,
                f"{partitions} more partitions would make {held + partitions}: the broker's limit is "
                f"{most} (--max-partitions): docs/LIMITS.md",
            )
        return Topic(name, topic_id, partitions, self.checked(configs or {}))

    def checked(self, configs: Mapping[str, str | None]) -> dict[str, str]:
        """`configs` as a topic's overrides: each name and value checked, normalised, and the
        whole checked with the broker's defaults and floors; `TopicError` (INVALID_CONFIG) with
        the reason otherwise."""
        try:
            overrides = parse_overrides(configs)
            check_topic(overrides, self.topic_defaults, self.limits)
        except ConfigError as exc:
            raise TopicError(TopicFault.CONFIG, str(exc)) from None
        return overrides

    def altered(self, name: str, alteration: Alteration | Mapping[str, str | None]) -> Topic:
        """The topic `name` with its overrides altered (`alteration`, or replaced by a mapping),
        checked as `make` checks them; the registry is not changed (`replace_topic` does, or a
        cluster's store)."""
        topic = self.get(name)
        if not callable(alteration):
            alteration = replacing(alteration)
        return replace(topic, configs=self.checked(alteration(topic.configs, self.topic_defaults)))

    def replace_topic(self, *topics: Topic) -> None:
        """Store `topics` in place of the topics of their ids (their configs altered), in one
        write of the registry. Call holding `locked()`."""
        for topic in topics:
            if self.by_id.get(topic.topic_id) is None or self.by_name.get(topic.name) is None:
                raise TopicError(TopicFault.UNKNOWN, f"unknown topic {topic.name!r}")
        for topic in topics:
            self.by_id[topic.topic_id] = topic
            self.by_name[topic.name] = topic
        self._save()

    def settings_of(self, topic: Topic) -> TopicSettings:
        """The effective configs of `topic` (its overrides over the broker's defaults), cached
        per topic as long as the topic is the same."""
        cached = self._settings.get(topic.topic_id)
        if cached is not None and cached[0] == topic:
            return cached[1]
        try:
            s = check_topic(topic.configs, self.topic_defaults, self.limits)
        except ConfigError as exc:
            # Stored before a floor was raised (served as configured), or written by hand (an
            # override that does not parse takes the broker's default): never a topic unserved.
            log.warning("topic %s: %s", topic.name, exc)
            s = settings(readable(topic.configs), self.topic_defaults)
            if s.log_config(self.defaults).invalid() is not None:
                s = settings({}, self.topic_defaults)
        self._settings[topic.topic_id] = (topic, s)
        return s

    def log_config(self, topic: Topic) -> LogConfig:
        """The settings of `topic`'s partitions' logs."""
        return self.settings_of(topic).log_config(self.defaults)

    def mirror(self, topics: list[Topic]) -> bool:
        """Make the registry hold exactly `topics` (a cluster node copying its metadata store's
        topics for its workers, which read this file as they always do). Call holding `locked()`.
        Returns whether anything changed; ids keep growing past every id seen."""
        self.load()
        by_id = {t.topic_id: t for t in topics}
        if by_id == self.by_id:
            return False
        self.by_id = by_id
        self.by_name = {t.name: t for t in topics}
        self.next_topic_id = max([self.next_topic_id, *(t.topic_id + 1 for t in topics)])
        self._save()
        return True

    def partition_count(self) -> int:
        """Partitions of every topic in the registry (as last loaded)."""
        return sum(t.partitions for t in self.by_id.values())

    def delete(self, name: str) -> Topic:
        """Forget the topic durably; the caller closes its partitions, then `remove_files`."""
        topic = self.get(name)
        del self.by_name[name]
        del self.by_id[topic.topic_id]
        self._save()
        return topic

    def remove_files(self, topic: Topic) -> None:
        shutil.rmtree(layout.topic_dir(self.data_dir, topic.topic_id), ignore_errors=True)

    def remove_partition_files(self, partitions: Iterable[tuple[int, int]]) -> None:
        """Remove the directories of `partitions` ((topic id, index), of deleted topics), then
        each of their topics' directories once nothing is left in it: the other cores of the
        node remove their partitions' alongside, and the last one empties it."""
        topic_ids = set()
        for topic_id, index in partitions:
            shutil.rmtree(layout.partition_dir(self.data_dir, topic_id, index), ignore_errors=True)
            topic_ids.add(topic_id)
        for topic_id in topic_ids:
            with contextlib.suppress(OSError):  # not empty: another core's are still there
                os.rmdir(layout.topic_dir(self.data_dir, topic_id))

    def set_aside_partition_files(self, topic_id: int, index: int) -> str | None:
        """Rename the directory of partition `index` of `topic_id` (closed) out of the partitions'
        names, to be removed by `remove_set_aside` off the loop: the rename is one quick system
        call where the removal of its files may take the kernel seconds, and a partition of the
        name opened meanwhile (its replica placed here again) starts in a directory of its own.
        The new path, or None when there was no directory."""
        path = layout.partition_dir(self.data_dir, topic_id, index)
        aside = f"{path}{layout.SET_ASIDE}{time.time_ns()}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return None
        return aside

    @staticmethod
    def remove_set_aside(paths: Iterable[str]) -> None:
        """Remove what `set_aside_partition_files` renamed (any thread)."""
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)

    def get(self, name: str) -> Topic:
        topic = self.by_name.get(name)
        if topic is None:
            raise TopicError(TopicFault.UNKNOWN, f"unknown topic {name!r}")
        return topic

    def grown(self, topic: Topic, partitions: int) -> Topic:
        """`topic` with `partitions` partitions, checked as Kafka's controller checks a
        CreatePartitions (only an increase: `TopicFault.PARTITIONS`, with its messages) and
        against the limits, without changing the registry: a cluster writes it to its store.
        Partitions are only ever added at the end, so those there keep their index, their
        owning core (`routing.shard_for` of the topic id and index) and their data."""
        have = topic.partitions
        if partitions == have:
            raise TopicError(TopicFault.PARTITIONS, f"Topic already has {have} partition(s).")
        if partitions < have:
            raise TopicError(
                TopicFault.PARTITIONS,
                f"The topic {topic.name} currently has {have} partition(s); {partitions} would not be "
                "an increase.",
            )
        lim = self.limits
        if partitions > lim.max_partitions_per_topic:
            raise TopicError(
                TopicFault.LIMIT,
                f"{partitions} partitions exceed the limit of {lim.max_partitions_per_topic} per topic "
                "(--max-partitions-per-topic)",
            )
        held = self.partition_count() - self.by_id.get(topic.topic_id, topic).partitions
        most = partition_limit(lim)
        if held + partitions > most:
            raise TopicError(
                TopicFault.LIMIT,
                f"{partitions - have} more partitions would make {held + partitions}: the broker's limit "
                f"is {most} (--max-partitions): docs/LIMITS.md",
            )
        return replace(topic, partitions=partitions)

    def grow(self, name: str, partitions: int) -> Topic:
        """Give topic `name` `partitions` partitions (`grown` checks it) and save the registry.
        Call holding `locked()`, after a `load()`. No partition is made here: each is made by its
        owning core on first use, as for a new topic."""
        topic = self.grown(self.get(name), partitions)
        self.replace_topic(topic)
        return topic


def segment_floor_violation(segment_bytes: int, segment_ms: int | None, limits: Limits) -> str | None:
    """Why a topic's segment settings are below the broker's floors, or None.

    Each segment holds descriptors while in use and costs a roll (files created, directory synced):
    tiny or short-lived segments let one client multiply both. The storage engine accepts them;
    the broker does not, for topics.
    """
    if segment_bytes < limits.min_segment_bytes:
        return (
            f"segment_bytes {segment_bytes} is below the broker's floor of {limits.min_segment_bytes} "
            "(--min-segment-bytes)"
        )
    if segment_ms is not None and segment_ms < limits.min_segment_ms:
        return (
            f"segment_ms {segment_ms} is below the broker's floor of {limits.min_segment_ms} "
            "(--min-segment-ms)"
        )
    return None
