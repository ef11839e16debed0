"""The log cleaner: Kafka's log compaction of one partition, the part that runs off the loop.

Kafka's LogCleaner is the model (its `Cleaner.doClean`, `buildOffsetMap`, `cleanSegments` and
`MemoryRecords.filterTo`, with KIP-534's delete horizon and KIP-354's max compaction lag); the
core decides when a log is cleaned (broker/core/cleaning.py), the loop takes a `CleanPlan` of it
and installs the result (broker/storage/log_cleaning.py), and `clean` here reads and writes files
off the loop (in a process of its own in the broker, broker/storage/clean_process.py; on the
caller's thread in tools and tests), touching no `Log` or `Segment` object.

Rules this module keeps:
- The dirty section is [`dirty_from`, `upto`): records since the last clean, in closed segments
  only (the active segment is never cleaned), below the high watermark and older than the min
  compaction lag. Its keys go into the `OffsetMap` (a fixed amount of memory) with their latest
  offsets; when the map fills, the section ends at the record that did not fit (`cleaned_to`),
  and the rest stays dirty for the next round, as Kafka cleans what its dedupe buffer holds.
- Then every segment from the log start up to `cleaned_to` is rewritten, in groups of
  consecutive segments whose bytes fit `segment_bytes` (Kafka's `groupSegmentsBySize`), each
  group into one segment named by its first segment's base offset. A record below `cleaned_to`
  stays only if it is its key's latest (no later offset in the map) and not a tombstone whose
  delete horizon has passed; a record without a key goes (Kafka counts it invalid); a record at
  or past `cleaned_to` stays (not examined). Offsets never change: consumers see gaps.
- Tombstones (null values): a batch holding one that stays gets a delete horizon the first time
  it is cleaned, `now + delete_retention_ms` (KIP-534, ringlog_proto/batch_compact.py); a later
  clean after the horizon drops them. The earliest horizon still ahead is returned, so that the
  core cleans again then even if the log is not dirty.
- A batch whose records all go is dropped, except its header stays (an empty batch) where it
  must: the last batch of a producer the partition's producer state still holds (Kafka's rule,
  so its last sequence and epoch survive a restart's rebuild from the log), the first batch of
  each leader epoch (so the epoch history rebuilt at open starts each epoch where it did: Kafka
  keeps a checkpoint file for it, ringlog rebuilds it from batches) and the first and last
  batches of each group (so a cleaned segment starts at its name, as every segment does, and
  ends where the segments it replaces ended: recovery finds the range a `.swap` file replaces
  from its last offset).
- Transactions (Kafka's `CleanedTransactionMetadata`, `isBatchRetained` and `shouldDiscardBatch`):
  the cleanable range ends at or below the last stable offset (log_cleaning.py), so every
  transactional batch cleaned belongs to a transaction that ended; the plan lists the aborted
  ones (`CleanPlan.aborted`, from the partition's aborted-transaction index), and the others
  committed. Records of an aborted transaction go whatever their key, and never enter the offset
  map (an aborted record must not hide the committed one of its key). A marker stays whole while
  any batch of its transaction stays (even emptied: the open walk then still finds the
  transaction, and its end); once none does, the first clean that finds it so gives it a delete
  horizon (`now + delete_retention_ms`, KIP-534, as tombstones get) and a clean after the horizon
  drops it. A marker that must stay where a data batch would be emptied (the producer's last
  marker, `CleanPlan.markers_last`, so that its epoch and coordinator epoch survive the walk, or
  a boundary batch) stays whole instead: the walk reads a marker's kind from its record.
- Files: each group is written as `<base>.log.cleaned` and `<base>.index.cleaned` (an index of the
  batches written, each keeping the append time of the batch it came from: retention and the
  compaction lags read those), both fdatasync'd. Each group also names the aborted transactions
  whose markers it keeps (`CleanedGroup.aborted`): the partition's index keeps only those of its
  range once the group is swapped in; and every marker it keeps (`CleanedGroup.markers`), which
  `install` writes as the new segment's `.txnindex`. Nothing else is touched here: committing them
  (`.swap`) and swapping them in happens on the loop (log_cleaning.py), and recovery removes
  `.cleaned` files left by a crash. A failure or a cancel removes this clean's files.
- Every byte read and written goes through the `Throttle` (the I/O cap, the loop's turns).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from broker.storage.errors import StorageError
from broker.storage.fileio import FileIO, Write, run_write
from broker.storage.index import (
    INDEX_HEADER_SIZE,
    RELATIVE_OFFSET_MAX,
    SegmentIndex,
    invalid_header,
    parse_entries,
)
from broker.storage.layout import CLEANED_SUFFIX, cleaning_name, index_file_name, store_file_name
from broker.storage.offset_map import OffsetMap
from broker.storage.throttle import Throttle
from broker.storage.txn_index import AbortedTxn, MarkerEntry
from ringlog_proto.batch import (
    CONTROL_BIT,
    HEADER_SIZE,
    NO_PRODUCER_ID,
    TRANSACTIONAL_BIT,
    BatchHeader,
    read_header,
)
from ringlog_proto.batch_compact import emptied, rebuilt, records_of
from ringlog_proto.batch_control import control_of
from ringlog_proto.record import BatchError

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 1 << 20  # the cleaner reads a store this much at a time
WRITE_CHUNK_BYTES = 1 << 20  # and writes a cleaned one this much at a time
DEDUPE_BUFFER_BYTES = 32 << 20  # per core (Kafka's log.cleaner.dedupe.buffer.size is 128 MiB per broker)
BACKOFF_MS = 15_000  # Kafka's log.cleaner.backoff.ms: how often a core looks for a log to clean


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """A worker's cleaner settings (the broker's flags; per core, each core cleaning its own
    partitions one at a time, as one of Kafka's cleaner threads)."""

    enabled: bool = True  # Kafka's log.cleaner.enable
    dedupe_buffer_bytes: int = DEDUPE_BUFFER_BYTES
    io_max_bytes_per_s: float | None = None  # Kafka's log.cleaner.io.max.bytes.per.second (None: no cap)
    backoff_ms: int = BACKOFF_MS

    def invalid(self) -> str | None:
        if self.dedupe_buffer_bytes < 1024:
            return f"dedupe buffer of {self.dedupe_buffer_bytes} bytes: at least 1024"
        if self.io_max_bytes_per_s is not None and self.io_max_bytes_per_s <= 0:
            return f"io_max_bytes_per_s {self.io_max_bytes_per_s}: positive, or None for no cap"
        if self.backoff_ms < 1:
            return f"backoff_ms {self.backoff_ms}: at least 1"
        return None


@dataclass(frozen=True, slots=True)
class SourceSegment:
    """A closed segment as the loop saw it when it planned the clean: enough to read its files,
    and to tell at install time whether it changed since (log_cleaning.py)."""

    base_offset: int
    next_offset: int
    size: int
    store_path: str
    index_path: str


@dataclass(frozen=True, slots=True)
class CleanPlan:
    """What one clean of one log is to do (made on the loop, run by `clean` on a thread)."""

    directory: str
    segments: tuple[SourceSegment, ...]  # from the log start to the last cleanable segment
    dirty_from: int  # the first dirty offset (where the last clean ended)
    upto: int  # the first offset not cleanable (the active segment, the lag, the high watermark)
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    # producer id -> last offset of its last batch, for every producer the partition holds
    producers_last: dict[int, int] = field(default_factory=dict)
    # producer id -> offset of its last marker, for every producer the partition holds one of
    markers_last: dict[int, int] = field(default_factory=dict)
    # the aborted transactions whose markers are in the log and that began below `upto`
    aborted: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """One cleaned segment written as `.cleaned` files, and the segments it replaces."""

    base_offset: int
    replaces: tuple[SourceSegment, ...]
    size: int
    store_path: str  # its `.cleaned` store file
    index_path: str  # its `.cleaned` index file
    aborted: tuple[AbortedTxn, ...] = ()  # the aborted transactions whose markers it keeps
    markers: tuple[MarkerEntry, ...] | None = None  # every marker it keeps (None: one did not read)


@dataclass(slots=True)
class CleanStats:
    """What a clean did, for its log line, metrics and bench/compaction.py (records and batches
    of the segments it rewrote: read, and written back)."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    batches_read: int = 0
    batches_kept: int = 0
    map_keys: int = 0
    map_bytes: int = 0
    tombstones_dropped: int = 0
    elapsed_s: float = 0.0
    throttled_s: float = 0.0


@dataclass(slots=True)
class CleanResult:
    groups: list[CleanedGroup]
    cleaned_to: int  # where the dirty section now starts
    next_horizon_ms: int | None  # the earliest delete horizon of a tombstone kept, if any
    stats: CleanStats


Steps = Callable[[str], None]  # told each step of a clean by name: tests kill the process there


def no_steps(step: str) -> None:
    """The `Steps` of a clean nobody watches."""


class _Reader:
    """A source segment's batches in order, each with its append time from the index file."""

    def __init__(self, io: FileIO, seg: SourceSegment, throttle: Throttle, stats: CleanStats) -> None:
        self.io = io
        self.seg = seg
        self.throttle = throttle
        self.stats = stats

    def _index(self) -> SegmentIndex:
        fd = self.io.open(self.seg.index_path, create=False)
        try:
            data = self.io.pread(fd, self.io.size(fd), 0)
        finally:
            self.io.close(fd)
        self.throttle.account(len(data))
        reason = invalid_header(data, self.seg.base_offset)
        entries, bad = parse_entries(data[INDEX_HEADER_SIZE:]) if reason is None else (b"", reason)
        if bad is not None:
            raise StorageError(f"{self.seg.index_path}: {bad}: not cleaned (the next open repairs it)")
        return SegmentIndex(entries)

    def batches(self) -> Iterator[tuple[bytes, BatchHeader, int]]:
        """(the batch's bytes, its header, its append time) of each batch, in order."""
        seg = self.seg
        index = self._index()
        fd = self.io.open(seg.store_path, create=False)
        try:
            pos = 0
            chunk = b""
            chunk_at = 0
            k = 0
            while pos < seg.size:
                rel = pos - chunk_at
                if len(chunk) - rel < HEADER_SIZE:
                    chunk = self.io.pread(fd, min(READ_CHUNK_BYTES, seg.size - pos), pos)
                    chunk_at, rel = pos, 0
                    self.throttle.account(len(chunk))
                h = read_header(chunk, rel) if len(chunk) - rel >= HEADER_SIZE else None
                if h is None or k >= len(index) or index.position(k) != pos:
                    raise StorageError(f"{seg.store_path}: batch {k} at {pos} is not where its index says")
                if h.base_offset != seg.base_offset + index.relative_offset(k) or h.size > seg.size - pos:
                    raise StorageError(f"{seg.store_path}: batch {k} at {pos} disagrees with its index")
                if len(chunk) - rel < h.size:
                    chunk = self.io.pread(fd, max(READ_CHUNK_BYTES, h.size), pos)
                    chunk = chunk[: seg.size - pos]
                    chunk_at, rel = pos, 0
                    self.throttle.account(len(chunk))
                self.stats.batches_read += 1
                yield chunk[rel : rel + h.size], h, index.entry(k).append_time_ms
                pos += h.size
                k += 1
        finally:
            self.io.close(fd)


class _Transactions:
    """The transactions of a clean's batches, met in log order (module rules; Kafka's
    `CleanedTransactionMetadata`): whether a transactional batch is of an aborted one, and
    where the first batch of each that stays is, for its marker."""

    def __init__(self, aborted: tuple[AbortedTxn, ...]) -> None:
        self._aborted: dict[int, deque[AbortedTxn]] = {}
        for entry in sorted(aborted, key=lambda e: e.last_offset):
            self._aborted.setdefault(entry.producer_id, deque()).append(entry)
        self._first_kept: dict[int, int] = {}  # producer id -> first offset kept of its open txn (-1: none)

    def _current(self, pid: int, offset: int) -> AbortedTxn | None:
        """The producer's first aborted transaction whose marker is at or after `offset`."""
        entries = self._aborted.get(pid)
        while entries and entries[0].last_offset < offset:
            entries.popleft()
        return entries[0] if entries else None

    def aborted(self, h: BatchHeader) -> bool:
        """Whether the transactional data batch `h` is of an aborted transaction."""
        entry = self._current(h.producer_id, h.base_offset)
        return entry is not None and entry.first_offset <= h.base_offset

    def batch(self, h: BatchHeader, kept: bool) -> None:
        first = self._first_kept.setdefault(h.producer_id, -1)
        if kept and first < 0:
            self._first_kept[h.producer_id] = h.base_offset

    def marker(self, h: BatchHeader) -> tuple[int, AbortedTxn | None]:
        """The marker `h` ends its producer's transaction: the first offset of it that stays
        (-1: none), and its entry if it was aborted."""
        first = self._first_kept.pop(h.producer_id, -1)
        entry = self._current(h.producer_id, h.base_offset)
        return first, entry if entry is not None and entry.last_offset == h.base_offset else None


def _txn_data(h: BatchHeader) -> bool:
    return bool(h.attributes & TRANSACTIONAL_BIT) and h.producer_id != NO_PRODUCER_ID


def build_map(
    plan: CleanPlan, offset_map: OffsetMap, io: FileIO, throttle: Throttle, stats: CleanStats
) -> int:
    """Fill `offset_map` with the latest offset of each key of the dirty section (aborted
    transactions' records left out); returns where the section it covers ends (`plan.upto`, or
    the first record that did not fit)."""
    offset_map.clear()
    start, upto = plan.dirty_from, plan.upto
    txns = _Transactions(plan.aborted)
    for seg in plan.segments:
        if seg.next_offset <= start:
            continue
        for data, h, _ in _Reader(io, seg, throttle, stats).batches():
            if h.next_offset <= start or h.attributes & CONTROL_BIT or not h.record_count:
                continue
            if h.base_offset >= upto:
                return upto
            if _txn_data(h) and txns.aborted(h):
                continue
            _, records = records_of(data, h)
            for r in records:
                if r.key is None or not start <= r.offset < upto:
                    continue
                try:
                    offset_map.put(r.key, r.offset)
                except OverflowError:
                    stats.map_keys = offset_map.entries
                    return r.offset
    stats.map_keys = offset_map.entries
    return upto


def groups_by_size(segments: list[SourceSegment], segment_bytes: int) -> list[list[SourceSegment]]:
    """Consecutive segments, grouped so that each group's bytes fit `segment_bytes` and its
    offsets one segment's relative offsets (Kafka's `groupSegmentsBySize`); a segment alone
    may be larger."""
    groups: list[list[SourceSegment]] = []
    for seg in segments:
        group = groups[-1] if groups else None
        if (
            group is not None
            and sum(s.size for s in group) + seg.size <= segment_bytes
            and seg.next_offset - group[0].base_offset <= RELATIVE_OFFSET_MAX
        ):
            group.append(seg)
        else:
            groups.append([seg])
    return groups


class _GroupWriter:
    """One cleaned segment being written to its `.cleaned` files."""

    def __init__(
        self, io: FileIO, directory: str, base_offset: int, throttle: Throttle, stats: CleanStats
    ) -> None:
        self.io = io
        self.base_offset = base_offset
        self.throttle = throttle
        self.stats = stats
        self.store_path = os.path.join(directory, cleaning_name(store_file_name(base_offset), CLEANED_SUFFIX))
        self.index_path = os.path.join(directory, cleaning_name(index_file_name(base_offset), CLEANED_SUFFIX))
        self.index = SegmentIndex()
        self.position = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._written = 0
        self.fd = io.open(self.store_path, create=True)
        io.ftruncate(self.fd, 0)  # a crashed clean's leftover of the same name

    def add(self, batch: bytes, h: BatchHeader, append_ms: int) -> None:
        self.index.append(h.base_offset - self.base_offset, self.position, h.max_timestamp, append_ms)
        self.position += len(batch)
        self._pending.append(batch)
        self._pending_bytes += len(batch)
        self.stats.batches_kept += 1
        if self._pending_bytes >= WRITE_CHUNK_BYTES:
            self._write()

    def _write(self) -> None:
        if not self._pending:
            return
        buffers = tuple(self._pending)
        run_write(self.io, Write(self.fd, buffers, self._written, self._pending_bytes))
        self.throttle.account(self._pending_bytes)
        self.stats.bytes_written += self._pending_bytes
        self._written += self._pending_bytes
        self._pending, self._pending_bytes = [], 0

    def finish(self, steps: Steps) -> None:
        """Write what is left, the index, and sync both: the group is whole on disk."""
        self._write()
        steps("cleaned-written")
        self.io.fdatasync(self.fd)
        index_bytes = self.index.encode_file(self.base_offset)
        fd = self.io.open(self.index_path, create=True)
        try:
            self.io.ftruncate(fd, 0)
            run_write(self.io, Write(fd, (index_bytes,), 0, len(index_bytes)))
            self.throttle.account(len(index_bytes))
            self.io.fdatasync(fd)
        finally:
            self.io.close(fd)
        steps("cleaned-synced")

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            self.io.close(fd)

    def remove(self) -> None:
        self.close()
        for path in (self.store_path, self.index_path):
            with contextlib.suppress(OSError):
                self.io.unlink(path)


def clean(
    plan: CleanPlan,
    offset_map: OffsetMap,
    io: FileIO,
    throttle: Throttle,
    steps: Steps = no_steps,
) -> CleanResult:
    """Run one clean (the module's rules); raises `CleanCancelled` when cancelled and
    `StorageError` or `OSError` when a file cannot be read or written, leaving no file of its own."""
    started = time.monotonic()
    stats = CleanStats(map_bytes=offset_map.memory_bytes)
    cleaned_to = build_map(plan, offset_map, io, throttle, stats)
    steps("map-built")
    now = plan.now_ms
    horizon_new = now + plan.delete_retention_ms
    next_horizon: int | None = None
    todo = [s for s in plan.segments if s.base_offset < cleaned_to]
    writers: list[_GroupWriter] = []
    groups: list[CleanedGroup] = []
    prev_epoch: int | None = None
    txns = _Transactions(plan.aborted)
    try:
        for group in groups_by_size(todo, plan.segment_bytes):
            writer = _GroupWriter(io, plan.directory, group[0].base_offset, throttle, stats)
            writers.append(writer)
            last = group[-1]
            kept_aborted: list[AbortedTxn] = []
            markers: list[MarkerEntry] | None = []
            for seg in group:
                for data, h, append_ms in _Reader(io, seg, throttle, stats).batches():
                    epoch_start = h.partition_leader_epoch != prev_epoch
                    prev_epoch = h.partition_leader_epoch
                    must_stay = (
                        epoch_start
                        or (seg is group[0] and h.base_offset == seg.base_offset)
                        or (seg is last and h.next_offset == seg.next_offset)
                    )
                    pid = h.producer_id
                    if h.attributes & CONTROL_BIT and pid != NO_PRODUCER_ID:
                        first_kept, entry = txns.marker(h)
                        must_stay = must_stay or plan.markers_last.get(pid) == h.base_offset
                        out, horizon = _marker(data, h, first_kept >= 0, must_stay, now, horizon_new, stats)
                        if out is not None and entry is not None and first_kept >= 0:
                            kept_aborted.append(entry._replace(first_offset=first_kept))
                    else:
                        aborted = _txn_data(h) and txns.aborted(h)
                        out, horizon = _filtered(
                            data, h, plan, offset_map, cleaned_to, horizon_new, stats, aborted
                        )
                        if out is None and (
                            must_stay
                            or (pid != NO_PRODUCER_ID and plan.producers_last.get(pid) == h.last_offset)
                        ):
                            out = emptied(h)
                        if _txn_data(h):
                            txns.batch(h, out is not None)
                    if horizon is not None and (next_horizon is None or horizon < next_horizon):
                        next_horizon = horizon
                    if out is not None:
                        writer.add(out, h, append_ms)
                        if h.attributes & CONTROL_BIT and markers is not None:
                            try:
                                control = control_of(out, verify=False)
                                markers.append(
                                    MarkerEntry(h.base_offset, control.coordinator_epoch, control.type)
                                )
                            except BatchError:
                                markers = None
            writer.finish(steps)
            writer.close()
            groups.append(
                CleanedGroup(
                    writer.base_offset,
                    tuple(group),
                    writer.position,
                    writer.store_path,
                    writer.index_path,
                    tuple(kept_aborted),
                    None if markers is None else tuple(markers),
                )
            )
    except BaseException:
        for writer in writers:
            writer.remove()
        raise
    stats.bytes_read = throttle.total_bytes - stats.bytes_written
    stats.elapsed_s = time.monotonic() - started
    stats.throttled_s = throttle.slept_s
    return CleanResult(groups, cleaned_to, next_horizon, stats)


def _filtered(
    data: bytes,
    h: BatchHeader,
    plan: CleanPlan,
    offset_map: OffsetMap,
    cleaned_to: int,
    horizon_new: int,
    stats: CleanStats,
    aborted: bool = False,
) -> tuple[bytes | None, int | None]:
    """The batch as it is written back (None: no record stays) and the delete horizon of the
    tombstones it keeps (None: it keeps none). `aborted`: it is of an aborted transaction."""
    stats.records_read += h.record_count
    if aborted:
        return None, None  # whatever the keys (module rules)
    if h.attributes & CONTROL_BIT or h.base_offset >= cleaned_to:
        stats.records_kept += h.record_count
        return data, None  # kept whole: a control batch of no producer, or past what the map covers
    if not h.record_count:
        return None, None  # an empty batch: kept only where the caller says it must be
    section, records = records_of(data, h)
    horizon = h.delete_horizon_ms
    now = plan.now_ms
    kept = []
    tombstones = False
    for r in records:
        if r.offset >= cleaned_to:
            kept.append(r)
            tombstones = tombstones or r.tombstone
            continue
        if r.key is None:
            continue
        if offset_map.get(r.key) > r.offset:
            continue  # a later record of the key follows
        if r.tombstone:
            if horizon is not None and now >= horizon:
                stats.tombstones_dropped += 1
                continue
            tombstones = True
        kept.append(r)
    stats.records_kept += len(kept)
    if not kept:
        return None, None
    if tombstones and horizon is None:
        horizon = horizon_new
        return rebuilt(h, section, kept, horizon), horizon
    if len(kept) == len(records):
        return data, horizon if tombstones else None  # as it is, crc and all
    return rebuilt(h, section, kept, None), horizon if tombstones else None


def _marker(
    data: bytes,
    h: BatchHeader,
    txn_stays: bool,
    must_stay: bool,
    now: int,
    horizon_new: int,
    stats: CleanStats,
) -> tuple[bytes | None, int | None]:
    """A marker as it is written back (None: it goes) and its delete horizon if one is still
    ahead (module rules; Kafka's `shouldDiscardBatch` for control batches, with KIP-534's
    horizon). `txn_stays`: a batch of its transaction stays."""
    stats.records_read += h.record_count
    horizon = h.delete_horizon_ms
    if txn_stays:
        out: bytes | None = data
        horizon = None
    elif not h.record_count:
        out = data if must_stay else None  # already emptied: nothing left for a reader
        horizon = None
    elif horizon is None:
        section, records = records_of(data, h)
        out, horizon = rebuilt(h, section, records, horizon_new), horizon_new
    elif now >= horizon:
        out, horizon = (data if must_stay else None), None
    else:
        out = data
    if out is not None:
        stats.records_kept += h.record_count
    return out, horizon
