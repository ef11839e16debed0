"""Topic configs: every config Kafka lists for a topic, the broker's defaults for them, a topic's
overrides parsed and checked, and what the effective values mean for its log and its replicas.

Rules this module keeps:
- One model for both protocols. A topic carries only its overrides, a name -> string map
  (`Topic.configs`, broker/core/topics.py); every other config takes the broker's default
  (`TopicDefaults`: the `broker serve` flags, else the built-in value), so a broker restarted
  with another default changes every topic that does not override it, as Kafka's do.
- The configs are Kafka 4.x's (broker/core/topic_config_keys.py: names, types, ranges, broker
  synonyms): an unknown name or a value outside its range is refused with the reason
  (INVALID_CONFIG), whatever asks. What each does here is its `Effect`: APPLIED changes what the
  broker does, CLEANER is for the log cleaner (parsed and exposed by `TopicSettings`), STORED is
  accepted, kept and described but changes nothing here (tiered storage, flush intervals, index
  tuning: ringlog has its own).
- Overrides are stored normalised (Kafka's own rendering: "TRUE" -> "true", "compact, delete" ->
  "compact,delete", " 100" -> "100"), so what a client set is what DescribeConfigs returns.
- Where ringlog's defaults differ from Kafka's (segment.bytes 128 MiB, max.message.bytes 1 MiB,
  no time-based roll), the broker's default is what is described, never a value it does not use.
- Pure: no files, no I/O. The registry keeps overrides (broker/core/topics.py), the core applies
  the effective values to its partitions (broker/core/core.py), each adapter maps the
  description (`describe_topic`, `describe_broker`) onto its protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from broker.core.limits import Limits
from broker.core.topic_config_keys import KEYS, LONG_MAX, ConfigError, ConfigType
from broker.storage.log_config import LogConfig
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
)

# compression.type's codecs as the batch header numbers them (ringlog_proto/batch_header.py)
_CODECS: Mapping[str, int] = {
    "uncompressed": COMPRESSION_NONE,
    "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4,
    "zstd": COMPRESSION_ZSTD,
}


class ConfigSource(Enum):
    """Where a config's value comes from, highest priority first."""

    TOPIC = "topic"  # the topic's own override (Kafka's DYNAMIC_TOPIC_CONFIG)
    STATIC_BROKER = "static broker"  # a `broker serve` flag (Kafka's STATIC_BROKER_CONFIG)
    DEFAULT = "default"  # built in (Kafka's DEFAULT_CONFIG)


class ConfigChangeError(ValueError):
    """A change that cannot be made whatever the values: a config named twice, an operation a
    config's type does not take (INVALID_REQUEST, as Kafka answers it)."""


@dataclass(frozen=True, slots=True)
class TopicDefaults:
    """The broker's defaults for topic configs: its log settings (`broker serve` flags), its
    cluster settings, and which of them a flag set (`static`: described STATIC_BROKER)."""

    log: LogConfig = field(default_factory=LogConfig)
    min_insync_replicas: int = 1  # a cluster's --min-insync-replicas
    unclean_leader_election: bool = False  # a cluster's --unclean-leader-election
    static: frozenset[str] = frozenset()

    def value(self, name: str) -> str:
        """The broker's default for config `name`, as described."""
        log = self.log
        match name:
            case "retention.ms":
                return "-1" if log.retention_ms is None else str(log.retention_ms)
            case "retention.bytes":
                return "-1" if log.retention_bytes is None else str(log.retention_bytes)
            case "segment.bytes":
                return str(log.segment_bytes)
            case "segment.ms":
                return str(LONG_MAX) if log.segment_ms is None else str(log.segment_ms)
            case "max.message.bytes":
                return str(log.max_batch_bytes)
            case "message.timestamp.type":
                return "LogAppendTime" if log.log_append_time else "CreateTime"
            case "min.insync.replicas":
                return str(self.min_insync_replicas)
            case "unclean.leader.election.enable":
                return "true" if self.unclean_leader_election else "false"
            case "cleanup.policy":
                return log.cleanup_policy
            case "delete.retention.ms":
                return str(log.delete_retention_ms)
            case "min.compaction.lag.ms":
                return str(log.min_compaction_lag_ms)
            case "max.compaction.lag.ms":
                return str(LONG_MAX) if log.max_compaction_lag_ms is None else str(log.max_compaction_lag_ms)
            case "min.cleanable.dirty.ratio":
                return str(log.min_cleanable_dirty_ratio)
        return KEYS[name].default

    def source(self, name: str) -> ConfigSource:
        return ConfigSource.STATIC_BROKER if name in self.static else ConfigSource.DEFAULT


def parse_overrides(configs: Mapping[str, str | None]) -> dict[str, str]:
    """`configs` checked name by name and value by value (Kafka's rules), normalised: the
    overrides to store. `ConfigError` names the first that is refused."""
    out: dict[str, str] = {}
    for name, text in configs.items():
        key = KEYS.get(name)
        if key is None:
            raise ConfigError(f"unknown topic config name: {name}")
        if text is None:
            raise ConfigError(f"a null value is not supported for topic config {name}")
        out[name] = key.render(key.parse(text))
    return out


class ConfigOp(Enum):
    """What an incremental change does to one config (Kafka's IncrementalAlterConfigs ops)."""

    SET = "set"  # the override becomes the value
    DELETE = "delete"  # no override: the broker's default
    APPEND = "append"  # list configs: the values not already there added at the end
    SUBTRACT = "subtract"  # list configs: the values given taken out


@dataclass(frozen=True, slots=True)
class ConfigChange:
    name: str
    op: ConfigOp
    value: str | None = None


# A topic's new overrides from its current ones and the broker's defaults (checked afterwards by
# the registry): how an alter is applied to what is stored at the moment it is stored.
Alteration = Callable[[Mapping[str, str], "TopicDefaults"], dict[str, str | None]]


def replacing(configs: Mapping[str, str | None]) -> Alteration:
    """An alteration whose overrides are `configs`, whatever they were (Kafka's AlterConfigs)."""
    new = dict(configs)
    return lambda _current, _defaults: dict(new)


def changing(changes: Iterable[ConfigChange]) -> Alteration:
    """An alteration that makes `changes` to the current overrides (IncrementalAlterConfigs):
    `ConfigChangeError` for a config named twice or APPEND / SUBTRACT of a config that is not
    a list; the new values are checked by the registry as any others."""
    todo = list(changes)
    named = [c.name for c in todo]
    twice = sorted({n for n in named if named.count(n) > 1})
    if twice:
        raise ConfigChangeError(f"duplicate config keys: {', '.join(twice)}")
    for c in todo:
        if c.op in (ConfigOp.APPEND, ConfigOp.SUBTRACT):
            key = KEYS.get(c.name)
            if key is None:
                raise ConfigError(f"unknown topic config name: {c.name}")
            if key.type is not ConfigType.LIST:
                raise ConfigChangeError(f"config value {c.op.value} is not allowed for config key: {c.name}")

    def alter(current: Mapping[str, str], defaults: TopicDefaults) -> dict[str, str | None]:
        out: dict[str, str | None] = dict(current)
        for c in todo:
            if c.op is ConfigOp.SET:
                out[c.name] = c.value
            elif c.op is ConfigOp.DELETE:
                out.pop(c.name, None)
            else:
                old = [v for v in current.get(c.name, defaults.value(c.name)).split(",") if v]
                given = [v.strip() for v in (c.value or "").split(",") if v.strip()]
                if c.op is ConfigOp.APPEND:
                    out[c.name] = ",".join(old + [v for v in given if v not in old])
                else:
                    out[c.name] = ",".join(v for v in old if v not in given)
        return out

    return alter


def readable(overrides: Mapping[str, str]) -> dict[str, str]:
    """Those of `overrides` that are known configs with values that parse: what a registry
    edited by hand can still be served with."""
    out = {}
    for name, text in overrides.items():
        key = KEYS.get(name)
        if key is not None:
            try:
                key.parse(text)
            except ConfigError:
                continue
            out[name] = text
    return out


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """A topic's effective configs, parsed: what the core applies and the cleaner reads."""

    retention_ms: int | None  # None: keep forever
    retention_bytes: int | None  # None: no size limit
    segment_bytes: int
    segment_ms: int | None  # None: no time-based roll
    max_message_bytes: int
    log_append_time: bool
    min_insync_replicas: int
    unclean_leader_election: bool
    compression_type: str
    compression_levels: Mapping[str, int]  # codec name -> its compression.<codec>.level
    cleanup_policy: tuple[str, ...]
    delete_retention_ms: int
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    min_cleanable_dirty_ratio: float

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """Whether retention deletes old segments (Kafka: only with the delete policy)."""
        return "delete" in self.cleanup_policy

    def log_config(self, base: LogConfig) -> LogConfig:
        """The log's settings: `base` (the broker's, for what topics do not set) with these.
        A batch may not exceed its segment (`LogConfig.invalid`): max.message.bytes above
        segment.bytes is held to it. Without the delete policy nothing is deleted by age or size,
        as in Kafka (compaction, broker/storage/cleaner.py, is what bounds such a log)."""
        return replace(
            base,
            segment_bytes=self.segment_bytes,
            max_batch_bytes=max(1, min(self.max_message_bytes, self.segment_bytes)),
            retention_ms=self.retention_ms if self.delete else None,
            retention_bytes=self.retention_bytes if self.delete else None,
            segment_ms=self.segment_ms,
            log_append_time=self.log_append_time,
            cleanup_policy=",".join(self.cleanup_policy),
            delete_retention_ms=self.delete_retention_ms,
            min_compaction_lag_ms=self.min_compaction_lag_ms,
            max_compaction_lag_ms=(
                None if self.max_compaction_lag_ms == LONG_MAX else self.max_compaction_lag_ms
            ),
            min_cleanable_dirty_ratio=self.min_cleanable_dirty_ratio,
            compression=self.compression_codec,
            compression_level=self.compression_levels.get(self.compression_type),
        )

    @property
    def compression_codec(self) -> int | None:
        """The codec the log stores every batch with (None: the producer's, compression.type
        producer; 0: uncompressed)."""
        if self.compression_type == "producer":
            return None
        return _CODECS[self.compression_type]


def effective(overrides: Mapping[str, str], defaults: TopicDefaults) -> dict[str, str]:
    """Every config's value: the topic's override, else the broker's default."""
    return {name: overrides.get(name, defaults.value(name)) for name in KEYS}


def settings(overrides: Mapping[str, str], defaults: TopicDefaults) -> TopicSettings:
    """The effective configs of a topic with `overrides` (stored ones: already checked)."""
    values = effective(overrides, defaults)

    def get(name: str) -> object:
        return KEYS[name].parse(values[name])

    def number(name: str) -> int:
        value = get(name)
        assert isinstance(value, int)
        return value

    retention_ms, retention_bytes, segment_ms = (
        number("retention.ms"),
        number("retention.bytes"),
        number("segment.ms"),
    )
    policy = get("cleanup.policy")
    ratio = get("min.cleanable.dirty.ratio")
    assert isinstance(policy, tuple) and isinstance(ratio, float)
    return TopicSettings(
        retention_ms=None if retention_ms < 0 else retention_ms,
        retention_bytes=None if retention_bytes < 0 else retention_bytes,
        segment_bytes=number("segment.bytes"),
        segment_ms=None if segment_ms == LONG_MAX else segment_ms,
        max_message_bytes=number("max.message.bytes"),
        log_append_time=values["message.timestamp.type"] == "LogAppendTime",
        min_insync_replicas=number("min.insync.replicas"),
        unclean_leader_election=get("unclean.leader.election.enable") is True,
        compression_type=values["compression.type"],
        compression_levels={codec: number(f"compression.{codec}.level") for codec in ("gzip", "lz4", "zstd")},
        cleanup_policy=policy,
        delete_retention_ms=number("delete.retention.ms"),
        min_compaction_lag_ms=number("min.compaction.lag.ms"),
        max_compaction_lag_ms=number("max.compaction.lag.ms"),
        min_cleanable_dirty_ratio=ratio,
    )


def check_topic(overrides: Mapping[str, str], defaults: TopicDefaults, limits: Limits) -> TopicSettings:
    """The settings of a topic with `overrides` (parsed already), or `ConfigError` when they do
    not hold together or break the broker's floors (broker/core/limits.py): Kafka's rule that
    min.compaction.lag.ms is at most max.compaction.lag.ms, then ours on segments."""
    s = settings(overrides, defaults)
    if s.min_compaction_lag_ms > s.max_compaction_lag_ms:
        raise ConfigError(
            f"conflict topic config setting min.compaction.lag.ms ({s.min_compaction_lag_ms}) > "
            f"max.compaction.lag.ms ({s.max_compaction_lag_ms})"
        )
    if s.segment_bytes < limits.min_segment_bytes:
        raise ConfigError(
            f"segment.bytes {s.segment_bytes} is below the broker's floor of {limits.min_segment_bytes} "
            "(--min-segment-bytes)"
        )
    if s.segment_ms is not None and s.segment_ms < limits.min_segment_ms:
        raise ConfigError(
            f"segment.ms {s.segment_ms} is below the broker's floor of {limits.min_segment_ms} "
            "(--min-segment-ms)"
        )
    reason = s.log_config(defaults.log).invalid()
    if reason is not None:
        raise ConfigError(reason)
    return s


# ------------------------------------------------------------------------------------------ describe


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config as described: what both protocols' describe answers carry."""

    name: str
    value: str | None  # None: sensitive (never the case for a topic's)
    source: ConfigSource
    read_only: bool
    sensitive: bool
    type: ConfigType
    doc: str
    synonyms: tuple[Synonym, ...] = ()


def describe_topic(
    overrides: Mapping[str, str], defaults: TopicDefaults, names: Iterable[str] | None = None
) -> list[ConfigEntry]:
    """Every config of a topic (or those of `names` that exist), as Kafka's DescribeConfigs
    answers: the effective value; its source (the override, else a broker flag, else built in);
    and its synonyms in priority order: the override, then the broker config the default comes
    from (named as Kafka names it: `log.retention.ms` for retention.ms)."""
    wanted = KEYS if names is None else [n for n in names if n in KEYS]
    out = []
    for name in sorted(wanted):
        key = KEYS[name]
        synonyms = []
        if name in overrides:
            synonyms.append(Synonym(name, overrides[name], ConfigSource.TOPIC))
        if key.synonyms:
            synonyms.append(Synonym(key.synonyms[0], defaults.value(name), defaults.source(name)))
        source = synonyms[0].source if synonyms else ConfigSource.DEFAULT
        value = overrides[name] if name in overrides else defaults.value(name)
        out.append(ConfigEntry(name, value, source, False, False, key.type, key.doc, tuple(synonyms)))
    return out


@dataclass(frozen=True, slots=True)
class BrokerSetting:
    """A broker config that is not a topic config's synonym: its value and whether a flag set it."""

    value: str
    type: ConfigType
    doc: str
    static: bool = True


def describe_broker(
    defaults: TopicDefaults, others: Mapping[str, BrokerSetting], names: Iterable[str] | None = None
) -> list[ConfigEntry]:
    """The broker's configs (or those of `names`), read-only: ringlog's are `broker serve` flags,
    changed by a restart. Each topic config's first synonym with the broker's default for it
    (`log.retention.ms`, `message.max.bytes`, ...), then `others` (its ids, listeners, ...)."""
    entries: dict[str, ConfigEntry] = {}
    for name, key in KEYS.items():
        if not key.synonyms:
            continue
        broker_name = key.synonyms[0]
        source = defaults.source(name)
        value = defaults.value(name)
        entries[broker_name] = ConfigEntry(
            broker_name,
            value,
            source,
            True,
            False,
            key.type,
            f"The broker's default for topic config {name}: {key.doc}",
            (Synonym(broker_name, value, source),),
        )
    for name, setting in others.items():
        source = ConfigSource.STATIC_BROKER if setting.static else ConfigSource.DEFAULT
        entries[name] = ConfigEntry(
            name,
            setting.value,
            source,
            True,
            False,
            setting.type,
            setting.doc,
            (Synonym(name, setting.value, source),),
        )
    wanted = entries if names is None else [n for n in names if n in entries]
    return [entries[n] for n in sorted(wanted)]
