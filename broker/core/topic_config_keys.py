"""Every config Kafka 4.x lists for a topic: its name, type, built-in default, valid values, the
broker configs it falls back to (Kafka's synonyms) and what it does here (`Effect`), with the
parsing and range checks of its values. The table the topic config model
(broker/core/topic_configs.py) is built on.

Rules this module keeps:
- Names, types, ranges and synonyms are Kafka's (its LogConfig and ServerTopicConfigSynonyms);
  the documentation strings are ours and say what each config does in ringlog.
- A value is checked as Kafka's ConfigDef checks it (integers within their type, doubles finite,
  booleans true or false in any case, list items and strings among their choices) and rendered
  back as Kafka renders it (`ConfigKey.render`): the stored form of an override.
- Pure data and functions: no state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from broker.storage.log_config import SEGMENT_BYTES_MAX, LogConfig

_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_DECIMAL: Final = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
INT_MAX: Final = (1 << 31) - 1
LONG_MAX: Final = (1 << 63) - 1
LONG_MIN: Final = -(1 << 63)


class ConfigType(Enum):
    """A config's type, as Kafka's ConfigDef types them (the adapters map these on)."""

    BOOLEAN = "boolean"
    STRING = "string"
    INT = "int"
    LONG = "long"
    DOUBLE = "double"
    LIST = "list"


class Effect(Enum):
    """What ringlog does with a config (module rules)."""

    APPLIED = "applied"
    CLEANER = "cleaner"
    STORED = "stored"


class ConfigError(ValueError):
    """A config name or value that cannot be set, with the reason (INVALID_CONFIG)."""


Check = Callable[[object], str | None]


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One topic config: its Kafka type, built-in default (a string, as described), valid values,
    the broker configs it falls back to (Kafka's synonyms, highest priority first) and what it
    does here."""

    name: str
    type: ConfigType
    default: str
    doc: str
    effect: Effect = Effect.STORED
    synonyms: tuple[str, ...] = ()
    low: float | None = None  # numbers: the smallest value allowed
    high: float | None = None
    choices: tuple[str, ...] = ()  # strings and lists: the values allowed (empty: any)
    check: Check | None = None  # a further rule on the parsed value: the reason it fails, or None

    def parse(self, text: str) -> object:
        """The value of `text`, or `ConfigError` naming this config and why."""
        raw = text.strip()
        value: object
        match self.type:
            case ConfigType.BOOLEAN:
                if raw.lower() not in ("true", "false"):
                    raise self._invalid(text, "expected the value to be either true or false")
                value = raw.lower() == "true"
            case ConfigType.INT | ConfigType.LONG:
                lo, hi = (-INT_MAX - 1, INT_MAX) if self.type is ConfigType.INT else (LONG_MIN, LONG_MAX)
                if not _INTEGER.fullmatch(raw) or not lo <= int(raw) <= hi:
                    raise self._invalid(text, f"not a number of type {self.type.name}")
                value = int(raw)
            case ConfigType.DOUBLE:
                try:
                    value = float(raw) if _DECIMAL.fullmatch(raw) else math.nan
                except ValueError:
                    value = math.nan
                if not math.isfinite(value):
                    raise self._invalid(text, "not a number of type DOUBLE")
            case ConfigType.LIST:
                value = tuple(item.strip() for item in raw.split(",")) if raw else ()
            case _:
                value = raw
        reason = self._out_of_range(value)
        if reason is not None:
            raise self._invalid(text, reason)
        return value

    def _invalid(self, text: str, reason: str) -> ConfigError:
        return ConfigError(f"invalid value {text!r} for configuration {self.name}: {reason}")

    def _out_of_range(self, value: object) -> str | None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.low is not None and value < self.low:
                return f"value must be at least {_number(self.low)}"
            if self.high is not None and value > self.high:
                return f"value must be no more than {_number(self.high)}"
        if self.choices:
            items = value if isinstance(value, tuple) else (value,)
            for item in items:
                if item not in self.choices:
                    return f"string must be one of: {', '.join(self.choices)}"
        return self.check(value) if self.check is not None else None

    def render(self, value: object) -> str:
        """`value` as Kafka writes it back (the normalised form an override is stored in)."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        return str(value)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _non_empty(value: object) -> str | None:
    return "at least one policy is needed (compact, delete or both)" if value == () else None


def _throttled(value: object) -> str | None:
    """Kafka's throttled-replicas list: "*" or partition:broker pairs."""
    assert isinstance(value, tuple)
    if value in ((), ("*",)):
        return None
    for item in value:
        p, sep, b = item.partition(":")
        if not sep or not p.isdigit() or not b.isdigit():
            return "must be the literal '*' or a list of replicas in the form partition:broker"
    return None


def _tiered_off(value: object) -> str | None:
    return "ringlog has no tiered storage (remote log storage is not enabled)" if value is True else None


def _gzip_level(value: object) -> str | None:
    assert isinstance(value, int)
    return None if value == -1 or 1 <= value <= 9 else "value must be -1 (the codec's default) or in 1..9"


_DAY_MS: Final = 24 * 3600 * 1000
_KEYS: Final = (
    ConfigKey(
        "cleanup.policy",
        ConfigType.LIST,
        "delete",
        "delete: old segments are deleted by retention.ms and retention.bytes. compact: the log "
        "cleaner keeps the last record of each key; without delete, retention deletes nothing.",
        Effect.CLEANER,
        ("log.cleanup.policy",),
        choices=("compact", "delete"),
        check=_non_empty,
    ),
    ConfigKey(
        "compression.type",
        ConfigType.STRING,
        "producer",
        "The codec batches are stored with. producer: as the producer sent them. uncompressed, "
        "gzip, snappy, lz4, zstd: a batch sent in another codec is rewritten in this one when it "
        "is appended (its records, offsets, timestamps and producer sequence kept; the batch as "
        "stored must fit max.message.bytes too), as Kafka does; a batch already in it is stored "
        "as sent. The rewrite is CPU on the partition's core: producers that compress with the "
        "topic's codec spare it.",
        Effect.APPLIED,
        ("compression.type",),
        choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
    ),
    ConfigKey(
        "compression.gzip.level",
        ConfigType.INT,
        "-1",
        "The level a batch rewritten in gzip (compression.type=gzip) is compressed at (-1: "
        "zlib's default, 6).",
        Effect.APPLIED,
        ("compression.gzip.level",),
        check=_gzip_level,
    ),
    ConfigKey(
        "compression.lz4.level",
        ConfigType.INT,
        "9",
        "The level a batch rewritten in lz4 (compression.type=lz4) is compressed at (9, Kafka's "
        "default: the fast compressor, as Kafka's; others: lz4's HC levels).",
        Effect.APPLIED,
        ("compression.lz4.level",),
        low=1,
        high=17,
    ),
    ConfigKey(
        "compression.zstd.level",
        ConfigType.INT,
        "3",
        "The level a batch rewritten in zstd (compression.type=zstd) is compressed at.",
        Effect.APPLIED,
        ("compression.zstd.level",),
        low=-131072,
        high=22,
    ),
    ConfigKey(
        "delete.retention.ms",
        ConfigType.LONG,
        str(_DAY_MS),
        "How long a compacted topic keeps a tombstone (a record with a null value) once the "
        "cleaner has reached it.",
        Effect.CLEANER,
        ("log.cleaner.delete.retention.ms",),
        low=0,
    ),
    ConfigKey(
        "file.delete.delay.ms",
        ConfigType.LONG,
        "60000",
        "Kafka's wait before deleting a segment's files. ringlog deletes them at once (a read in "
        "flight keeps its descriptor).",
        Effect.STORED,
        ("log.segment.delete.delay.ms",),
        low=0,
    ),
    ConfigKey(
        "flush.messages",
        ConfigType.LONG,
        str(LONG_MAX),
        "Kafka's forced-fsync interval in records. ringlog flushes by its group commit and by acks.",
        Effect.STORED,
        ("log.flush.interval.messages",),
        low=1,
    ),
    ConfigKey(
        "flush.ms",
        ConfigType.LONG,
        str(LONG_MAX),
        "Kafka's forced-fsync interval in time. ringlog flushes by its group commit and by acks.",
        Effect.STORED,
        ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
        low=0,
    ),
    ConfigKey(
        "follower.replication.throttled.replicas",
        ConfigType.LIST,
        "",
        "Replicas whose follower fetches Kafka would throttle. Kept; ringlog does not throttle.",
        check=_throttled,
    ),
    ConfigKey(
        "index.interval.bytes",
        ConfigType.INT,
        "4096",
        "Kafka's sparse-index spacing. ringlog indexes every batch.",
        Effect.STORED,
        ("log.index.interval.bytes",),
        low=0,
    ),
    ConfigKey(
        "leader.replication.throttled.replicas",
        ConfigType.LIST,
        "",
        "Replicas whose leader Kafka would throttle. Kept; ringlog does not throttle.",
        check=_throttled,
    ),
    ConfigKey(
        "local.retention.bytes",
        ConfigType.LONG,
        "-2",
        "Tiered storage's local retention by size (-2: retention.bytes). ringlog has no tiered storage.",
        Effect.STORED,
        ("log.local.retention.bytes",),
        low=-2,
    ),
    ConfigKey(
        "local.retention.ms",
        ConfigType.LONG,
        "-2",
        "Tiered storage's local retention by age (-2: retention.ms). ringlog has no tiered storage.",
        Effect.STORED,
        ("log.local.retention.ms",),
        low=-2,
    ),
    ConfigKey(
        "max.compaction.lag.ms",
        ConfigType.LONG,
        str(LONG_MAX),
        "The longest a record may stay uncompacted in a compacted topic.",
        Effect.CLEANER,
        ("log.cleaner.max.compaction.lag.ms",),
        low=1,
    ),
    ConfigKey(
        "max.message.bytes",
        ConfigType.INT,
        str(LogConfig().max_batch_bytes),
        "The largest record batch the topic accepts, in bytes as sent (compressed); larger ones are "
        "refused with MESSAGE_TOO_LARGE. At most segment.bytes.",
        Effect.APPLIED,
        ("message.max.bytes",),
        low=0,
    ),
    ConfigKey(
        "message.timestamp.after.max.ms",
        ConfigType.LONG,
        str(LONG_MAX),
        "How far past the broker's clock a CreateTime timestamp may be. Kept, not enforced.",
        Effect.STORED,
        ("log.message.timestamp.after.max.ms",),
        low=0,
    ),
    ConfigKey(
        "message.timestamp.before.max.ms",
        ConfigType.LONG,
        str(LONG_MAX),
        "How far before the broker's clock a CreateTime timestamp may be. Kept, not enforced.",
        Effect.STORED,
        ("log.message.timestamp.before.max.ms",),
        low=0,
    ),
    ConfigKey(
        "message.timestamp.type",
        ConfigType.STRING,
        "CreateTime",
        "CreateTime: records keep the producer's timestamps. LogAppendTime: the broker stamps each "
        "batch with its clock when it appends it.",
        Effect.APPLIED,
        ("log.message.timestamp.type",),
        choices=("CreateTime", "LogAppendTime"),
    ),
    ConfigKey(
        "min.cleanable.dirty.ratio",
        ConfigType.DOUBLE,
        "0.5",
        "The share of a compacted log not yet cleaned above which the cleaner cleans it.",
        Effect.CLEANER,
        ("log.cleaner.min.cleanable.ratio",),
        low=0,
        high=1,
    ),
    ConfigKey(
        "min.compaction.lag.ms",
        ConfigType.LONG,
        "0",
        "The least time a record stays uncompacted in a compacted topic.",
        Effect.CLEANER,
        ("log.cleaner.min.compaction.lag.ms",),
        low=0,
    ),
    ConfigKey(
        "min.insync.replicas",
        ConfigType.INT,
        "1",
        "In a cluster, the in-sync replicas an acks=all produce needs, else NOT_ENOUGH_REPLICAS. "
        "A single node keeps one copy and does not use it.",
        Effect.APPLIED,
        ("min.insync.replicas",),
        low=1,
    ),
    ConfigKey(
        "preallocate",
        ConfigType.BOOLEAN,
        "false",
        "Kafka's whole-segment preallocation. ringlog preallocates the active segment ahead of its "
        "appends in any case.",
        Effect.STORED,
        ("log.preallocate",),
    ),
    ConfigKey(
        "remote.log.copy.disable",
        ConfigType.BOOLEAN,
        "false",
        "Tiered storage: stop copying segments to remote storage. ringlog has no tiered storage.",
    ),
    ConfigKey(
        "remote.log.delete.on.disable",
        ConfigType.BOOLEAN,
        "false",
        "Tiered storage: delete remote segments when it is turned off. ringlog has no tiered storage.",
    ),
    ConfigKey(
        "remote.storage.enable",
        ConfigType.BOOLEAN,
        "false",
        "Tiered storage. ringlog has none: only false is accepted.",
        check=_tiered_off,
    ),
    ConfigKey(
        "retention.bytes",
        ConfigType.LONG,
        "-1",
        "The most bytes a partition keeps before its oldest closed segments are deleted (-1: no "
        "limit). Checked every 30 s and when it changes.",
        Effect.APPLIED,
        ("log.retention.bytes",),
    ),
    ConfigKey(
        "retention.ms",
        ConfigType.LONG,
        str(7 * _DAY_MS),
        "How long a closed segment is kept after its last append before it is deleted (-1: "
        "forever). Checked every 30 s and when it changes.",
        Effect.APPLIED,
        ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
        low=-1,
    ),
    ConfigKey(
        "segment.bytes",
        ConfigType.INT,
        str(LogConfig().segment_bytes),
        "The size at which the active segment is closed and a new one started.",
        Effect.APPLIED,
        ("log.segment.bytes",),
        low=1,
        high=min(SEGMENT_BYTES_MAX, INT_MAX),
    ),
    ConfigKey(
        "segment.index.bytes",
        ConfigType.INT,
        str(10 * 1024 * 1024),
        "Kafka's offset index size. ringlog's index grows with its segment.",
        Effect.STORED,
        ("log.index.size.max.bytes",),
        low=4,
    ),
    ConfigKey(
        "segment.jitter.ms",
        ConfigType.LONG,
        "0",
        "Kafka's random offset of segment.ms. Kept, not used.",
        Effect.STORED,
        ("log.roll.jitter.ms", "log.roll.jitter.hours"),
        low=0,
    ),
    ConfigKey(
        "segment.ms",
        ConfigType.LONG,
        str(LONG_MAX),
        "The age of its first batch at which the active segment is closed on the next append "
        f"({LONG_MAX}: never).",
        Effect.APPLIED,
        ("log.roll.ms", "log.roll.hours"),
        low=1,
    ),
    ConfigKey(
        "unclean.leader.election.enable",
        ConfigType.BOOLEAN,
        "false",
        "In a cluster, with no in-sync replica alive, elect any live replica (acknowledged records "
        "may be lost).",
        Effect.APPLIED,
        ("unclean.leader.election.enable",),
    ),
)
KEYS: Final[Mapping[str, ConfigKey]] = {k.name: k for k in _KEYS}
