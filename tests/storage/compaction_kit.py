"""Helpers of the log cleaner's tests (tests/storage/test_cleaner*.py): keyed logs, one clean run
the way a core runs it (assess, plan, clean, install), and a model of what a clean must leave."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.storage import log_cleaning
from broker.storage.cleaner import CleanResult, Steps, clean, no_steps
from broker.storage.fileio import SyncFileIO
from broker.storage.log import Log, LogConfig
from broker.storage.log_cleaning import CleanerCheckpoint
from broker.storage.offset_map import OffsetMap
from broker.storage.throttle import Throttle
from ringlog_proto.batch import Record, decode_batches, encode_batch

T0 = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000

COMPACT = LogConfig(
    segment_bytes=4096,
    max_batch_bytes=1024,
    retention_ms=None,
    cleanup_policy="compact",
    min_cleanable_dirty_ratio=0.0,
)


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@dataclass
class Model:
    """Every record appended: offset -> (key, value)."""

    records: dict[int, tuple[bytes | None, bytes | None]] = field(default_factory=dict)

    def append(self, log_: Log, pairs: list[tuple[bytes | None, bytes | None]], **kw: int) -> int:
        base = log_.append(
            encode_batch([Record(v, key=k) for k, v in pairs], timestamp=kw.pop("timestamp", T0), **kw)
        )
        for i, pair in enumerate(pairs):
            self.records[base + i] = pair
        return base

    def compacted(self, upto: int, tombstones: bool = True) -> dict[int, tuple[bytes | None, bytes | None]]:
        """What a full clean of [0, upto) leaves: below it each key's last record (tombstones too
        unless `tombstones` is false, i.e. past their horizon; keyless records gone), and every
        record at or past it."""
        last: dict[bytes, int] = {}
        for offset, (key, _) in sorted(self.records.items()):
            if offset < upto and key is not None:
                last[key] = offset
        out = {}
        for offset, (key, value) in sorted(self.records.items()):
            if offset >= upto or (
                key is not None and last[key] == offset and (value is not None or tombstones)
            ):
                out[offset] = (key, value)
        return out


def read_all(log_: Log, max_bytes: int = 700) -> dict[int, tuple[bytes | None, bytes | None]]:
    """Every record the log serves, read in small steps from its start, as a consumer reads
    (records below the offset asked are skipped); offsets must rise and reads must progress."""
    out: dict[int, tuple[bytes | None, bytes | None]] = {}
    off = log_.start_offset
    steps = 0
    while off < log_.end_offset:
        r = log_.read(off, max_bytes)
        assert r.error is None, r.error
        assert r.next_offset > off, (off, r.next_offset)
        for rec in decode_batches(r.data):
            if rec.offset >= off:
                assert rec.offset not in out and (not out or rec.offset > max(out)), rec.offset
                out[rec.offset] = (rec.key, rec.value)
        off = r.next_offset
        steps += 1
        assert steps < 100_000
    return out


@dataclass
class Round:
    ok: bool
    result: CleanResult | None
    dirtiness: log_cleaning.Dirtiness


def clean_round(
    log_: Log,
    checkpoint: CleanerCheckpoint,
    now: int = T0,
    *,
    producers_last: dict[int, int] | None = None,
    map_bytes: int = 1 << 20,
    high_watermark: int | None = None,
    steps: Steps = no_steps,
) -> Round:
    """One clean as the core runs it, whatever the dirty ratio; the checkpoint is updated."""
    d = log_cleaning.assess(
        log_, checkpoint, now, log_.end_offset if high_watermark is None else high_watermark
    )
    planned = log_cleaning.plan(log_, d, now, producers_last or {})
    if planned is None:
        return Round(False, None, d)
    result = clean(planned.plan, OffsetMap(map_bytes), SyncFileIO(), Throttle(None), steps)
    ok = log_cleaning.install(log_, planned, result, steps)
    if ok:
        checkpoint.cleaned_to = result.cleaned_to
        checkpoint.next_horizon_ms = result.next_horizon_ms
    return Round(ok, result, d)
