"""The segmented log of one partition: open, close, appends, flushes and reads, and the doors to
the rest. It is built in layers, each adding one noun's operations to the one below: its segments,
marks and pins, and the log cleaner's swap (log_segments.py), the end cut back for replication
(log_truncation.py), the start moved up by retention and DeleteRecords (log_start.py), then `Log`
here. Beside it: its settings and bounds (log_config.py), the checks a batch passes
(validation.py), the work of flushes (log_flush.py) and reads (log_reads.py) over the segments,
what a crash left (log_recovery.py) and the active segment's preallocation (preallocation.py).

Rules this module keeps:
- Offsets are assigned here and only grow. A new segment is based at the log's next offset, so a
  segment name is never reused: not after retention, not after truncation (which deletes later
  segments before any new one can be created at their offsets).
- Hot paths come in two halves so that an event loop can run the I/O itself without blocking:
  `prepare_append` / `complete_append` (or `abort_append`), `prepare_flush` / `complete_flush`,
  `prepare_read` / `complete_read`. The `prepare_*` half validates and returns operations
  (`Write`, `Sync`, `SyncDir`) or an extent to read; the caller executes them; the `complete_*`
  half makes the result visible. `append`, `flush` and `read` do both halves with the log's
  `FileIO`, for tools, tests and the uvloop backend.
- Cold paths (open, recovery, roll, truncate, retention) use the `FileIO` directly; so does the
  preallocation of the active segment's file ahead of its appends (one posix_fallocate per
  `PREALLOCATE_BYTES` appended, per up to `PREALLOCATE_BYTES_MAX` while the appends come fast),
  given back when the segment rolls or the log closes.
- One core owns a log; nothing here is thread-safe.

Durability (what each mark promises):
- After `append` returns (or `complete_append` runs), the batch is in the kernel's page cache: it
  survives the broker process crashing or being killed (SIGKILL), not a power loss or kernel crash.
- After `flush` returns (or `complete_flush` runs), every batch that was visible when the flush
  began is on stable storage (store fdatasync'd, then the index, and the directory when segments
  were created or deleted): it survives a power loss. Many appends and one flush is group commit.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple

from broker.storage import log_flush, log_reads, log_recovery, log_start, recompression, validation
from broker.storage.errors import OffsetOutOfRangeError, StorageError
from broker.storage.fdcache import DEFAULT_CACHE, FdCache
from broker.storage.fileio import (
    SYNC_IO,
    SYNCFS_MIN,
    Buffer,
    FileIO,
    FileSystems,
    Op,
    Write,
    WriteError,
    run_ops,
)
from broker.storage.index import RELATIVE_OFFSET_MAX
from broker.storage.log_config import SEGMENT_BYTES_MAX, LogConfig
from broker.storage.log_flush import FlushPlan
from broker.storage.log_reads import ReadResult
from broker.storage.log_segments import PendingAppend
from broker.storage.log_start import LogStart
from broker.storage.segment import Extent, Segment
from broker.storage.txn_index import MarkerEntry
from ringlog_proto.batch import STORED_LEADER_EPOCH, BatchHeader, now_ms, rebased, stamped
from ringlog_proto.batch_control import ControlRecord

log = logging.getLogger(__name__)

INDEX_PENDING_ENTRIES_MAX = 256  # index entries held in memory before they are written (ENTRY_SIZE each)


class CleanEnd(NamedTuple):
    """Where a clean close left a log's active segment (`Log.open`'s `clean`)."""

    base_offset: int
    size: int
    next_offset: int


def _left_clean(active: Segment, clean: CleanEnd) -> bool:
    """Whether `active` opened on the cheap check alone and is as the clean close left it."""
    return not active.index_loaded and (active.base_offset, active.size, active.next_offset) == clean


def sync_recovered(logs: Sequence[Log], filesystems: FileSystems) -> None:
    """Make durable what `Log.open` recovered into `logs` (its `recovered`): with `SYNCFS_MIN`
    logs or more, one syncfs per file system they are on (it writes back their data, indexes
    and directories, as their own three syncs would, in one journal commit instead of three per
    log); with fewer, after a failed syncfs (its error is seen: each file's own sync still
    reports it, `FileSystems` says why) and for logs whose file system cannot be told, each
    log's own syncs, which raise as the open's would have."""
    left = list(logs)
    if len(left) >= SYNCFS_MIN and filesystems.failed is None:
        groups: dict[tuple[int, int], list[Log]] = {}
        left = []
        for lg in logs:
            try:
                device = lg.io.device(lg.directory)
            except OSError:
                left.append(lg)
                continue
            groups.setdefault((id(lg.io), device), []).append(lg)
        for (_, device), group in groups.items():
            if not filesystems.sync(group[0].io, device, group[0].directory):
                left += group
    for lg in left:
        lg.sync_recovered()


class Log(LogStart):
    """A partition's log in one directory. Open with `Log.open`; its state and the operations of
    the layers below: broker/storage/log_segments.py, log_truncation.py, log_start.py."""

    # ------------------------------------------------------------------------- open / close

    @classmethod
    def open(
        cls,
        directory: str,
        config: LogConfig | None = None,
        io: FileIO | None = None,
        clock: Callable[[], int] = now_ms,
        cache: FdCache | None = None,
        clean: CleanEnd | None = None,
        recovered: list[Log] | None = None,
    ) -> Log:
        """Open or create the log in `directory`, recovering from whatever a crash left there.

        `recovered`: a start opening many logs passes a list, and a log whose recovery would sync
        its active segment and directory (three syncs, most of a recovery's time) joins it
        instead, unsynced: the caller makes them all durable at once (one syncfs per file system)
        or calls each one's `sync_recovered`, before anything is served from them.

        `cache`: the process's descriptor cache for closed segments (a worker passes its own,
        sized by `--segment-fd-cache`); tools and tests share a default one. `clean`: where a
        clean close left the active segment (its snapshot says: broker/core/partition.py): when
        the files agree (the index's last entry ends where the store does, at that size and next
        offset) the active segment is not scanned and nothing is synced (`opened_clean`); any
        difference and the open is the full one.
        """
        config = config or LogConfig()
        reason = config.invalid()
        if reason is not None:
            raise ValueError(f"invalid log config: {reason}")
        io = io or SYNC_IO
        self = cls(directory, config, io, clock, DEFAULT_CACHE if cache is None else cache)
        try:
            self._open(io, clean, recovered)
        except BaseException:
            self.abandon()
            raise
        return self

    def _open(self, io: FileIO, clean: CleanEnd | None = None, recovered: list[Log] | None = None) -> None:
        directory = self.directory
        self.opened_clean = False
        clock = self.clock
        cache = self.cache
        created = log_recovery.missing_dirs(directory)
        io.makedirs(directory)
        self._parents_unsynced = [os.path.dirname(d) for d in created]
        bases: list[int] = []  # a directory made just now holds nothing: nothing to list
        if not created:
            log_recovery.finish_swaps(directory, io)  # a clean a crash interrupted
            bases = log_recovery.segment_bases(directory, io)
        now = clock()
        # The active segment is pinned while it is recovered and synced (opened and created
        # pinned), then left to the descriptor cache like every other.
        pinned: Segment | None = None
        try:
            for i, base in enumerate(bases):
                is_last = i == len(bases) - 1
                end = clean[1:] if is_last and clean is not None and clean.base_offset == base else None
                seg = Segment.open(directory, base, io, cache, active=is_last, now_ms=now, clean_end=end)
                if is_last:
                    pinned = seg
                if self.segments:
                    log_recovery.check_follows(self.segments[-1], seg)
                self._add_segment(seg)
            if not self.segments:
                pinned = Segment.create(directory, 0, io, cache)
                self._add_segment(pinned)
                # Nothing to make durable yet (durable_offset 0 is true of an empty log): the first
                # flush syncs the directory with the data. A partition is made on its first use, in
                # the request that needs it: three syncs fewer keep that request short.
                self._dir_unsynced = True
            elif clean is not None and _left_clean(self.segments[-1], clean):
                self.opened_clean = True  # closed with everything synced, unchanged since
            elif recovered is not None:
                recovered.append(self)  # synced by the caller (`open`), before it serves
            else:
                # What recovery kept may still be only in the page cache (the process died, not the
                # machine): sync it, so that durable_offset starts out true.
                self._sync_active(self.segments[-1])
        except BaseException:
            if pinned is not None and pinned not in self.segments:
                pinned.abandon()  # not listed, so not abandoned with the log's
            raise
        finally:
            if pinned is not None:
                pinned.unpin()
        active = self.segments[-1]
        self._next_offset = active.next_offset
        self._reserved_size = active.size
        self.durable_offset = active.next_offset
        if not created:
            self._restore_start(log_start.read(directory))

    def _sync_active(self, active: Segment) -> None:
        self.io.fdatasync(active.store_fd)
        self.io.fdatasync(active.index_fd)
        self.io.fsync_dir(self.directory)

    def sync_recovered(self) -> None:
        """The syncs `open` left to its caller (`recovered`): what recovery kept reaches the disk."""
        active = self.segments[-1]
        active.pin()
        try:
            self._sync_active(active)
        finally:
            active.unpin()

    def close(self) -> None:
        """Flush (data and index reach the disk), then close every file. Idempotent.

        Files are closed even when the final sync fails; the failure is raised after.
        """
        plan = self.prepare_close()
        if plan is None:
            return
        failed = None
        try:
            log_flush.run_close(self.io, plan)
        except OSError as exc:
            failed = exc
        self.complete_close(plan, failed)

    @property
    def appending(self) -> bool:
        """Whether appends are in flight (prepared, not completed): `close` and `discard` refuse
        then, since their writes name this log's descriptors."""
        return bool(self._pending)

    def prepare_close(self) -> log_flush.ClosePlan | None:
        """`close` in three steps, for a caller closing many logs that runs the disk work of many
        at once (`Core.close`): this plan, `log_flush.run_close` (system calls only, any thread),
        then `complete_close` on this log's thread. None when nothing is left to do: closed
        already, or a log refusing work (its files are closed here, writing nothing). Raises
        StorageError with appends in flight, or when the flush cannot be planned (files closed)."""
        if self._closed:
            return None
        if self._pending:
            raise StorageError(f"close with {len(self._pending)} appends in flight")
        if self._broken is not None:
            self._close_files()
            return None
        try:
            flush = self.prepare_flush()
        except BaseException:
            self._close_files()
            raise
        active = self.segments[-1]
        active.pin()
        try:
            store_fd, index_fd = active.store_fd, active.index_fd
        except OSError as exc:  # a reopen failed
            active.unpin()
            self.fail_flush(exc, flush)
            self._close_files()
            raise StorageError(f"close of {self.directory} failed: {exc}") from exc
        reserved = self._reserved_size
        truncate_to = reserved if active.allocated > reserved else None
        return log_flush.ClosePlan(flush, active, store_fd, index_fd, truncate_to)

    def complete_close(self, plan: log_flush.ClosePlan, failed: OSError | None) -> None:
        """The end of `prepare_close`'s plan (`failed`: what `run_close` raised): the marks move
        when it succeeded, the log refuses work when a sync failed (`fail_flush`), and every file
        is closed either way; a failure is raised after, as StorageError."""
        try:
            if failed is None:
                if plan.truncated and plan.truncate_to is not None:
                    plan.active.allocated = plan.truncate_to
                self.complete_flush(plan.flush)
            else:
                self.fail_flush(failed, plan.flush)
                raise StorageError(f"close of {self.directory} failed: {failed}") from failed
        finally:
            plan.active.unpin()
            self._close_files()

    def _close_files(self) -> None:
        try:
            for seg in self.segments:
                if self._broken is None:
                    seg.close()
                else:
                    seg.abandon()
        finally:
            self._undrain_all()
            self._closed = True

    def discard(self) -> None:
        """Close every file writing and syncing nothing, for a log whose files are about to be
        deleted (its topic was): `close` would first write back and sync everything unsynced,
        holding its core for it (~60 ms per 128 MiB segment here) to keep data about to go.
        Raises StorageError with appends in flight, as `close` does (their writes name these
        files' descriptors)."""
        if self._closed:
            return
        if self._pending:
            raise StorageError(f"discard with {len(self._pending)} appends in flight")
        self.abandon()

    def abandon(self) -> None:
        """Close every file writing and syncing nothing (files pinned by a read in flight close
        when it completes): what a killed process leaves behind, for tests and a failed open."""
        for seg in self.segments:
            seg.abandon()
        self._undrain_all()
        self._closed = True

    # ------------------------------------------------------------------------- append

    def validate(
        self, records: bytes | bytearray | memoryview, keys: bool = False, transactional: bool = False
    ) -> validation.Checked:
        """Headers of the whole batches in `records`, or an error; changes nothing (the checks:
        broker/storage/validation.py; `keys`: every record must have a key; `transactional`: a
        transactional batch is taken, refused otherwise)."""
        return validation.validate(records, self.config, keys=keys, transactional=transactional)

    def validate_copy(self, records: bytes | bytearray | memoryview) -> validation.Checked:
        """`validate` for a follower's copies of its leader's batches: every check but this log's
        batch limit, which the leader applied under the settings of the moment it stored them (a
        topic's max.message.bytes, or its segment.bytes, may have been lowered since: refused
        here, they would stop the follower for good). Kafka's followers do not check it either.
        They may be batches the leader's cleaner rewrote (`stored`: fewer records, none, a delete
        horizon). Checked as Kafka's follower checks them: headers and crc32c, no record walk
        and no inflating (broker/storage/validation.py's rules)."""
        return validation.validate_stored(records, SEGMENT_BYTES_MAX)

    def prepare_append(
        self,
        records: bytes | bytearray | memoryview,
        headers: list[BatchHeader] | None = None,
        leader_epoch: int = STORED_LEADER_EPOCH,
    ) -> PendingAppend:
        """Validate `records` (one or more whole batches), assign offsets, return the write to do.

        Nothing is changed when validation fails: one bad batch refuses them all. The bytes are
        not copied: each base offset goes out as its own 8-byte buffer beside views of the rest,
        all in one vectored write. `headers` are what `validate(records)` returned, when the
        caller needed them first (to check producer sequences): validation is not repeated.
        `leader_epoch`: stamped in every batch (the epoch of the leader that assigns the offsets).
        A log whose topic names a codec (`LogConfig.compression`) first rewrites the batches in
        another (broker/storage/recompression.py), from the sections validation inflated when
        `headers` are its `Checked`: those bytes are written, and `pending.headers` are theirs.
        """
        self.check_usable()
        checked = self.validate(records) if headers is None else headers
        # the sections validation inflated, for the rewrite; not kept with the pending append
        inflated = checked.inflated if isinstance(checked, validation.Checked) else None
        headers = list(checked)
        cfg = self.config
        if cfg.compression is not None:  # the topic's compression.type names a codec
            records, headers = recompression.in_log_codec(records, headers, cfg, inflated)
        size = len(records)
        now = self.clock()
        base = self._next_offset
        seg = self.segments[-1]
        count = headers[0].record_count if len(headers) == 1 else sum(h.record_count for h in headers)
        if (
            self._reserved_size + size > cfg.segment_bytes
            or base + count - seg.base_offset > RELATIVE_OFFSET_MAX
            or cfg.segment_ms is not None
            or cfg.max_compaction_lag_ms is not None
        ):
            try:
                self._maybe_roll(size, count, now)
            except OSError as exc:
                raise StorageError(f"could not roll a new segment in {self.directory}: {exc}") from exc
            seg = self.segments[-1]
        view = memoryview(records)
        if cfg.log_append_time:
            # the whole header written anew (`stamped`): the time is the one appends are kept by
            buffers = self._stamped(view, headers, base, leader_epoch, now)
            base += count
        elif len(headers) == 1:  # the common case, without the loop
            h = headers[0]
            offset_bytes, rest, headers[0] = rebased(view, h, base, 0, leader_epoch)
            buffers = (offset_bytes, rest)
            base += h.record_count
        else:
            parts: list[memoryview | bytes] = []
            pos = 0
            for i, h in enumerate(headers):
                offset_bytes, rest, headers[i] = rebased(view, h, base, pos, leader_epoch)
                parts += (offset_bytes, rest)
                base += h.record_count
                pos += h.size
            buffers = tuple(parts)
        seg.pin()  # until the append completes or is aborted: its writes name the descriptors
        try:
            if self._reserved_size + size > seg.allocated:
                self._preallocation.extend(
                    seg, self._reserved_size + size, self._reserved_size, self.config.segment_bytes
                )
            ops: list[Op] = [Write(seg.store_fd, buffers, self._reserved_size, size)]
            pending = PendingAppend(seg, self._reserved_size, headers, size, now, ops)
            index = seg.index
            if len(index) - index.persisted_count >= INDEX_PENDING_ENTRIES_MAX:
                data, position = index.unpersisted()
                ops.append(Write(seg.index_fd, (data,), position, len(data)))
                pending.index_persisted = len(index)
        except BaseException:
            seg.unpin()  # a reopen that failed (out of descriptors): nothing was changed
            raise
        self._pending.append(pending)
        self._next_offset = base
        self._reserved_size += size
        return pending

    @staticmethod
    def _stamped(
        view: memoryview, headers: list[BatchHeader], base: int, leader_epoch: int, now: int
    ) -> tuple[memoryview | bytes, ...]:
        """`prepare_append`'s buffers for a log whose timestamps are its own (LogAppendTime):
        each batch's header stamped with `now` (`ringlog_proto.batch.stamped`), `headers`
        updated to what is stored."""
        parts: list[memoryview | bytes] = []
        pos = 0
        for i, h in enumerate(headers):
            head, rest, headers[i] = stamped(view, h, base, pos, leader_epoch, now)
            parts += (head, rest)
            base += h.record_count
            pos += h.size
        return tuple(parts)

    def prepare_copy(
        self, records: bytes | bytearray | memoryview, headers: list[BatchHeader] | None = None
    ) -> PendingAppend:
        """`prepare_append` for a follower: the batches keep the offsets and leader epochs the
        leader gave them, and must start at the next offset and follow one another without a gap
        (`OffsetOutOfRangeError` otherwise, nothing changed). Validated like a produce."""
        self.check_usable()
        headers = self.validate_copy(records) if headers is None else list(headers)
        expected = self._next_offset
        for h in headers:
            # A leader's compacted log skips offsets (its cleaner removed whole batches): a batch
            # may start past where the one before it ends, never before.
            if h.base_offset < expected:
                raise OffsetOutOfRangeError(
                    f"replicated batch at offset {h.base_offset} where the log expects {expected}"
                )
            expected = h.next_offset
        size = len(records)
        now = self.clock()
        count = expected - self._next_offset
        seg = self.segments[-1]
        cfg = self.config
        if (
            self._reserved_size + size > cfg.segment_bytes
            or expected - seg.base_offset > RELATIVE_OFFSET_MAX
            or cfg.segment_ms is not None
            or cfg.max_compaction_lag_ms is not None
        ):
            try:
                self._maybe_roll(size, count, now)
            except OSError as exc:
                raise StorageError(f"could not roll a new segment in {self.directory}: {exc}") from exc
            seg = self.segments[-1]
        return self._pending_write(seg, (memoryview(records),), headers, size, now, expected)

    def prepare_copies(self, records: bytes | bytearray | memoryview) -> list[PendingAppend]:
        """`prepare_copy` of a follower's fetch, in as many appends as segments it fills (a
        fetch may hold more than a segment). Run every one's ops, complete them in order."""
        headers = self.validate_copy(records)
        view = memoryview(records)
        limit = self.config.segment_bytes
        pendings: list[PendingAppend] = []
        try:
            start = pos = 0
            while start < len(headers):
                room = limit - self._reserved_size
                size = headers[start].size
                end = start + 1
                while end < len(headers) and size + headers[end].size <= room:
                    size += headers[end].size
                    end += 1
                pendings.append(self.prepare_copy(view[pos : pos + size], headers[start:end]))
                start, pos = end, pos + size
        except BaseException:
            if pendings:
                self.abort_append(pendings[0])
            raise
        return pendings

    def _pending_write(
        self,
        seg: Segment,
        buffers: tuple[memoryview | bytes, ...],
        headers: list[BatchHeader],
        size: int,
        now: int,
        next_offset: int,
    ) -> PendingAppend:
        """The tail of `prepare_copy` (`prepare_append` has its own copy inline: its hot path)."""
        seg.pin()  # until the append completes or is aborted: its writes name the descriptors
        try:
            if self._reserved_size + size > seg.allocated:
                self._preallocation.extend(
                    seg, self._reserved_size + size, self._reserved_size, self.config.segment_bytes
                )
            ops: list[Op] = [Write(seg.store_fd, buffers, self._reserved_size, size)]
            pending = PendingAppend(seg, self._reserved_size, headers, size, now, ops)
            index = seg.index
            if len(index) - index.persisted_count >= INDEX_PENDING_ENTRIES_MAX:
                data, position = index.unpersisted()
                ops.append(Write(seg.index_fd, (data,), position, len(data)))
                pending.index_persisted = len(index)
        except BaseException:
            seg.unpin()
            raise
        self._pending.append(pending)
        self._next_offset = next_offset
        self._reserved_size += size
        return pending

    def _maybe_roll(self, size: int, record_count: int, now: int) -> None:
        seg = self.segments[-1]
        if self._next_offset == seg.base_offset:
            return  # empty segments are never rolled: every segment holds at least one batch
        reason = None
        if self._reserved_size + size > self.config.segment_bytes:
            reason = "size"
        elif self._next_offset + record_count - seg.base_offset > RELATIVE_OFFSET_MAX:
            reason = "offsets"
        elif (roll_ms := self.config.roll_ms) is not None:
            first = seg.first_append_ms()
            if first is not None and now - first >= roll_ms:
                reason = "age"
        if reason is None:
            return
        if not self._pending:
            seg.write_index()  # complete now; with appends in flight, the next flush writes it
        new = Segment.create(self.directory, self._next_offset, self.io, self.cache)  # created pinned
        log.debug("%s: rolled (%s)", new.store_path, reason)
        try:
            seg.release_preallocated(self._reserved_size)  # its final size: writes in flight are below it
        except BaseException:
            new.abandon()  # not listed: its descriptors close with its pin
            new.unpin()
            raise
        self._add_segment(new)
        new.unpin()  # the cache's, as every idle segment: the next append pins it
        if self._pending:  # writes to it are in flight: pinned until they complete
            seg.pin()
            self._draining.append(seg)
        self._unsynced[seg] = None
        self._reserved_size = 0
        self._dir_unsynced = True
        if seg.next_offset <= self.start_offset:
            self.drop_below_start()  # DeleteRecords passed it while it was active

    def complete_append(
        self, pending: PendingAppend, markers: Mapping[int, ControlRecord] | None = None
    ) -> None:
        """The pending append's writes all succeeded: make its batches visible. `markers`: what
        its control batches say, by base offset, for the segment's `.txnindex` (a control batch
        not in it leaves its segment's markers unknown, for the open walk to read)."""
        assert self._pending and self._pending[0] is pending, "appends complete in the order prepared"
        self._pending.popleft()
        seg = pending.segment
        position = pending.position
        for h in pending.headers:
            seg.add_batch(position, h, pending.append_ms)
            position += h.size
            if h.control:
                record = None if markers is None else markers.get(h.base_offset)
                seg.add_marker(
                    h.base_offset,
                    None
                    if record is None
                    else MarkerEntry(h.base_offset, record.coordinator_epoch, record.type),
                )
        if pending.index_persisted >= 0:
            seg.index.persisted_count = max(seg.index.persisted_count, pending.index_persisted)
        self._unsynced[seg] = None
        draining = self._draining
        if draining and draining[0] is seg and (not self._pending or self._pending[0].segment is not seg):
            del draining[0]  # a rolled segment's last append in flight completed
            seg.unpin()
        seg.unpin()  # the append's own pin (`prepare_append`)

    def abort_append(self, pending: PendingAppend) -> list[PendingAppend]:
        """A write of `pending` failed: undo it and every append prepared after it.

        The caller must have stopped (or seen fail) the I/O of the later appends. Returns them,
        so that their producers get an error too. If undoing fails, the log refuses further
        appends until reopened, where recovery repairs the files.
        """
        assert self._pending and self._pending[0] is pending, "the oldest pending append fails first"
        aborted = list(self._pending)
        self._pending.clear()
        try:
            while self.segments[-1] is not pending.segment:
                seg = self.segments.pop()
                self._bases.pop()
                self._unsynced.pop(seg, None)
                seg.delete()
                self._dir_unsynced = True
            if pending.segment.txn_index_written:  # active again: its file would go stale
                with contextlib.suppress(OSError):
                    pending.segment.drop_txn_index()
            pending.segment.truncate_to_size(pending.position)
        except OSError as exc:
            self._broken = f"could not undo a failed write: {exc}"
            log.error("%s: %s", self.directory, self._broken)
        finally:
            self._undrain_all()
            for entry in aborted:  # their writes have stopped or failed (the caller's word)
                entry.segment.unpin()
        self._next_offset = pending.base_offset
        self._reserved_size = pending.position
        return aborted

    def append(self, records: bytes | bytearray | memoryview) -> int:
        """Append one or more whole batches; return the first base offset. Durability: module doc."""
        pending = self.prepare_append(records)
        try:
            run_ops(self.io, pending.ops)
        except OSError as exc:
            self.abort_append(pending)
            raise StorageError(
                f"append to {pending.segment.store_path} failed, nothing written: {exc}"
            ) from exc
        self.complete_append(pending)
        return pending.base_offset

    # ------------------------------------------------------------------------- flush

    def prepare_flush(self) -> FlushPlan:
        """The operations that make everything visible now durable (group commit: one per turn;
        what they sync: broker/storage/log_flush.py)."""
        self.check_usable()
        directories = [self.directory, *self._parents_unsynced] if self._dir_unsynced else []
        try:
            return log_flush.plan(
                self._unsynced, self.segments[-1], self._draining, directories, self.end_offset
            )
        except OSError as exc:  # a reopen failed
            raise StorageError(f"flush of {self.directory} failed: {exc}") from exc

    def complete_flush(self, plan: FlushPlan) -> None:
        log_flush.complete(plan)
        if plan.syncs_directories:
            self._dir_unsynced = False
            self._parents_unsynced = []
        self._unsynced = log_flush.still_unsynced(self._unsynced, self.segments[-1])
        self.durable_offset = max(self.durable_offset, min(plan.durable_offset, self.end_offset))
        self._assert_marks()

    def flush(self) -> None:
        """fdatasync everything appended so far. See the module docstring for the guarantee."""
        plan = self.prepare_flush()
        try:
            run_ops(self.io, plan.ops)
        except OSError as exc:
            self.fail_flush(exc, plan)
            raise StorageError(f"flush of {self.directory} failed: {exc}") from exc
        self.complete_flush(plan)

    def fail_flush(self, exc: OSError, plan: FlushPlan | None = None) -> None:
        """A flush failed. `plan`: the flush that failed (its segments are unpinned).

        A sync failed: the kernel may have dropped the dirty pages it could not write and
        will report success on a retry (PostgreSQL's "fsyncgate"), so no later flush can be
        trusted: the log refuses further work until reopened, where recovery reads back what
        really is on disk. That holds for ENOSPC from fdatasync too (ext4 drops delayed-allocation
        pages it finds no block for).

        A write failed (`WriteError`: the index entries a flush writes, on a full disk): nothing
        already written is in doubt, so the log stays usable; durable_offset did not move, and
        the next flush writes and syncs the same again."""
        if plan is not None:
            log_flush.unpin(plan)
        if isinstance(exc, WriteError):
            log.warning(
                "%s: flush could not write the index (%s); the next flush retries", self.directory, exc
            )
            return
        self._broken = f"fdatasync failed ({exc}); data since offset {self.durable_offset} may be lost"
        log.error("%s: %s", self.directory, self._broken)

    # ------------------------------------------------------------------------- read

    def prepare_read(self, offset: int, max_bytes: int, upto: int | None = None) -> Extent | None:
        """Where the batches from `offset` are: one segment, whole batches, at least one batch.

        None when `offset` is the end of the log (nothing to read yet: a consumer waits there),
        or `upto` (a batch boundary: a high watermark), below which the extent stays.
        """
        self.check_usable()
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        end = self.end_offset
        if not self.start_offset <= offset <= end:
            raise OffsetOutOfRangeError(f"offset {offset} is outside the log [{self.start_offset}, {end}]")
        if upto is not None and offset >= upto:
            return None
        return log_reads.locate(self.segments, self._bases, offset, max_bytes, upto)

    def complete_read(self, extent: Extent, data: Buffer) -> ReadResult:
        """Check the bytes read for `extent`; return the intact batches before any damage."""
        return log_reads.checked(extent, data)

    def read(self, offset: int, max_bytes: int) -> ReadResult:
        """Batches from the one holding `offset`, as stored, up to `max_bytes` (at least one batch)."""
        extent = self.prepare_read(offset, max_bytes)
        if extent is None:
            return ReadResult(b"", offset, offset)
        data = self.io.pread(extent.segment.store_fd, extent.length, extent.position)
        return self.complete_read(extent, data)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose record timestamp is >= `timestamp`, or None if there is none.

        The index finds the batch; its records are decoded (a cold path) to find the record. A
        batch compressed with a codec `decode_records` does not read (snappy, lz4, zstd: appends
        inflate them to check them, reads do not decode them) answers its first offset: a client
        asking for a time inside it gets the batch's earlier records too (at least once, never
        fewer), not an error.
        """
        found = self.timestamp_and_offset(timestamp)
        return None if found is None else found.offset

    def timestamp_and_offset(self, timestamp: int) -> log_reads.TimestampAndOffset | None:
        """`offset_for_timestamp`'s record: its offset and its own timestamp (Kafka's ListOffsets
        answers both). A record found below the log start (records deleted inside a segment)
        answers the log start, with that record's timestamp: a consumer never gets an offset it
        cannot read."""
        self.check_usable()
        found = log_reads.timestamp_and_offset(self.segments, self.io, timestamp)
        start = self.start_offset
        if found is not None and found.offset < start:
            return found._replace(offset=start)
        return found

    def batch_headers(self, from_offset: int = 0) -> Iterator[BatchHeader]:
        """Headers of the stored batches from the one holding `from_offset`, read via the index.

        A cold path (one small pread per batch): for rebuilding state derived from headers, such
        as the idempotent producers' last sequences, when a partition opens.
        """
        self.check_usable()
        yield from log_reads.batch_headers(self.segments, self.io, from_offset)

    def batches_and_markers(self, from_offset: int = 0) -> Iterator[tuple[BatchHeader, ControlRecord | None]]:
        """`batch_headers`, each control batch with what its record says (a transaction's
        marker: one more small pread per marker): the open walk that rebuilds which
        transactions are open and which were aborted."""
        self.check_usable()
        yield from log_reads.batches_and_markers(self.segments, self.io, from_offset)
        # The closed segments whose markers the walk read: their `.txnindex` spares the next open
        # those reads (a cache: not synced; a torn file is ignored).
        for seg in self.segments[:-1]:
            if seg not in self._draining:
                try:
                    seg.write_txn_index()
                except OSError as exc:
                    log.warning(
                        "%s: not written (%s); the next open reads the markers", seg.txn_index_path, exc
                    )

    def written_by_ms(self, offset: int) -> int | None:
        """A time by which the batch holding `offset` was written, in the broker's clock: the
        append time of the last batch of its segment (the index keeps one per segment, the time
        retention reads), so never earlier than the batch's own. None: the segment does not know
        it (no batch in it), or no segment holds `offset`."""
        i = bisect.bisect_right(self._bases, offset) - 1
        return self.segments[i].last_append_ms if i >= 0 else None
