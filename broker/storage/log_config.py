"""A log's settings (`LogConfig`) and the storage engine's fixed bounds, checked against one another.

Rules this module keeps:
- Every bound has its reason beside it. The relations between them (a segment within the index's
  u32 positions, the default batch's inflation within the cap, the first preallocation step within
  the largest) are checked at import by `relation_errors`, under -O too: a change that breaks
  one stops the broker's start with both values named.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.storage.index import POSITION_MAX
from ringlog_proto.batch import CODEC_NAMES

SEGMENT_BYTES_MAX = 1 << 31  # index positions are u32; 2 GiB keeps every position far from overflow
# A segment's store is preallocated ahead of its appends (broker/storage/preallocation.py) in steps
# of this many bytes, each twice the last while appends use one up in under a second, up to the
# most (a partition holds about one to two seconds of its appends ahead); a tail of zeros no longer
# than that after the last batch is that space, left by a process that was killed (a clean close
# gives it back), not damage (broker/storage/segment_recovery.py).
# The first step is small because every partition touched once holds it: 100k partitions hold
# ~6 GiB at 64 KiB (at 1 MiB they held ~98 GiB, more than many disks have); a busier partition
# ramps within a few steps, so none pays much more than a fallocate (~20 us) a second.
PREALLOCATE_BYTES = 64 << 10
PREALLOCATE_BYTES_MAX = 8 << 20
# A compressed batch may inflate to this many times max_batch_bytes (`LogConfig.max_decompressed_bytes`):
# producers' batches of text compress 3-10x; a decompression bomb is stopped at the bound.
DECOMPRESSION_RATIO_MAX = 16
# ... and never past this, whatever the topic's batch limit: a core keeps one buffer this large
# for the check once it has met a compressed batch (ringlog_proto.batch.decompress_bounded).
DECOMPRESSED_BYTES_MAX = 32 * 1024 * 1024
CLEANUP_POLICIES = frozenset({"delete", "compact"})  # Kafka's cleanup.policy values, comma-joined


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-log settings. Sizes in bytes, times in milliseconds; None disables a limit."""

    segment_bytes: int = 128 * 1024 * 1024
    max_batch_bytes: int = 1024 * 1024
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    retention_bytes: int | None = None
    segment_ms: int | None = None  # roll the active segment once its first batch is this old
    # Stamp every appended batch with the append time (Kafka's message.timestamp.type
    # LogAppendTime): its timestamp type bit set, its max timestamp the log's clock, its crc
    # recomputed. Followers copy the stamped bytes as they are.
    log_append_time: bool = False
    # Walk every appended batch's record framing (ringlog_proto.batch.invalid_records; a
    # compressed batch's after inflating it). Always on in the broker; off only to measure what it
    # costs (bench/storage.py, bench/compressed_validation.py) or to plant a poison batch in a test.
    check_records: bool = True
    # What becomes of old data, Kafka's cleanup.policy: "delete" (retention deletes whole
    # segments), "compact" (the log cleaner keeps the last record of each key,
    # broker/storage/cleaner.py; retention deletes nothing) or both, "compact,delete".
    cleanup_policy: str = "delete"
    # The cleaner's settings, Kafka's topic configs of the same names and defaults: a tombstone
    # (null value) stays this long after the clean that first met it (delete.retention.ms, 1 day);
    # a record is never cleaned younger than min.compaction.lag.ms (0); a dirty record older than
    # max.compaction.lag.ms (None: Kafka's Long.MAX_VALUE, never) is cleaned whatever the dirty
    # ratio (and the active segment rolls at that age, KIP-354); a log is cleaned once its dirty
    # bytes are at least this part of its cleanable bytes (min.cleanable.dirty.ratio, 0.5).
    # Ages are the broker's append times, as retention's are (see `cleaner.py`).
    delete_retention_ms: int = 24 * 3600 * 1000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int | None = None
    min_cleanable_dirty_ratio: float = 0.5
    # The codec every appended batch is stored with (Kafka's compression.type): None keeps the
    # producer's ("producer"), else a codec number (ringlog_proto.batch.CODEC_NAMES, 0 for
    # "uncompressed"); a batch in another codec is rewritten in this one (recompression.py) at
    # `compression_level`, Kafka's compression.<codec>.level (None: the codec's default).
    compression: int | None = None
    compression_level: int | None = None

    @property
    def compacts(self) -> bool:
        """Whether the log cleaner compacts this log (cleanup.policy has "compact"). A substring
        test, which `invalid` makes exact (delete and compact, comma-joined), at a fifth of a
        split's cost: every produce asks it (a compacted topic's records need keys)."""
        return "compact" in self.cleanup_policy

    @property
    def deletes(self) -> bool:
        """Whether retention deletes this log's old segments (cleanup.policy has "delete")."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def roll_ms(self) -> int | None:
        """The active segment's age at which it rolls: `segment_ms`, or sooner on a compacted log
        with a max compaction lag (Kafka's rule of KIP-354: a record in the active segment could
        otherwise outwait its lag, since the active segment is never cleaned)."""
        lag = self.max_compaction_lag_ms
        if lag is None or not self.compacts:
            return self.segment_ms
        return lag if self.segment_ms is None else min(lag, self.segment_ms)

    @property
    def max_decompressed_bytes(self) -> int:
        """How far a compressed batch's records may inflate when it is checked: a bound tied to
        the batch limit, DECOMPRESSION_RATIO_MAX times it (16 MiB at the default 1 MiB), and at
        most DECOMPRESSED_BYTES_MAX. Past it the batch is MESSAGE_TOO_LARGE: what a consumer
        would have to hold in memory for it."""
        return min(self.max_batch_bytes * DECOMPRESSION_RATIO_MAX, DECOMPRESSED_BYTES_MAX)

    # (The broker puts floors on segment_bytes and segment_ms, broker/core/limits.py; the storage
    # engine itself accepts small segments, which its tests use.)

    def invalid(self) -> str | None:
        if not 0 < self.segment_bytes <= SEGMENT_BYTES_MAX:
            return f"segment_bytes {self.segment_bytes} must be in 1..{SEGMENT_BYTES_MAX}"
        if not 0 < self.max_batch_bytes <= self.segment_bytes:
            return (
                f"max_batch_bytes {self.max_batch_bytes} must be in 1..segment_bytes ({self.segment_bytes})"
            )
        for name in ("retention_ms", "retention_bytes", "segment_ms", "max_compaction_lag_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                return f"{name} must be >= 0 or None, not {value}"
        policies = self.cleanup_policy.split(",")
        if not policies or len(set(policies)) != len(policies) or not set(policies) <= CLEANUP_POLICIES:
            return f"cleanup_policy {self.cleanup_policy!r} must be delete, compact or compact,delete"
        for name in ("delete_retention_ms", "min_compaction_lag_ms"):
            if getattr(self, name) < 0:
                return f"{name} must be >= 0, not {getattr(self, name)}"
        if self.max_compaction_lag_ms is not None and self.max_compaction_lag_ms < self.min_compaction_lag_ms:
            return (
                f"max_compaction_lag_ms {self.max_compaction_lag_ms} is below "
                f"min_compaction_lag_ms {self.min_compaction_lag_ms}"
            )
        if self.compression is not None and self.compression not in CODEC_NAMES:
            return f"compression must be None or a codec in {sorted(CODEC_NAMES)}, not {self.compression}"
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            return f"min_cleanable_dirty_ratio must be in 0..1, not {self.min_cleanable_dirty_ratio}"
        return None


def relation_errors(
    segment_bytes_max: int = SEGMENT_BYTES_MAX,
    position_max: int = POSITION_MAX,
    batch_bytes_default: int = LogConfig().max_batch_bytes,
    decompression_ratio_max: int = DECOMPRESSION_RATIO_MAX,
    decompressed_bytes_max: int = DECOMPRESSED_BYTES_MAX,
    preallocate_bytes: int = PREALLOCATE_BYTES,
    preallocate_bytes_max: int = PREALLOCATE_BYTES_MAX,
) -> list[str]:
    """What is wrong between the storage bounds (this module's by default), one line each, naming
    both values: checked at import, as native/constants.py checks its own; tests pass others."""
    errors = []
    if not 0 < segment_bytes_max <= position_max + 1:
        errors.append(
            f"SEGMENT_BYTES_MAX ({segment_bytes_max}) must be at most the index's POSITION_MAX + 1 "
            f"({position_max + 1}): every byte of a segment has a u32 position"
        )
    if not 0 < batch_bytes_default * decompression_ratio_max <= decompressed_bytes_max:
        errors.append(
            f"LogConfig's default max_batch_bytes ({batch_bytes_default}) times DECOMPRESSION_RATIO_MAX "
            f"({decompression_ratio_max}) must be at most DECOMPRESSED_BYTES_MAX ({decompressed_bytes_max}): "
            "the cap is for larger batch limits, the default's bound is the ratio's"
        )
    if not 0 < preallocate_bytes <= preallocate_bytes_max:
        errors.append(
            f"PREALLOCATE_BYTES ({preallocate_bytes}) must be at most PREALLOCATE_BYTES_MAX "
            f"({preallocate_bytes_max}): the first preallocation step is the smallest"
        )
    return errors


if _errors := relation_errors():  # a plain `if`, not an assert: it holds under -O too
    raise AssertionError("broker/storage/log_config.py: " + "; ".join(_errors))
