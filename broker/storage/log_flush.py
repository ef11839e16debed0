"""A log's flush: the plan that makes what is visible durable, and its completion over the
segments. `Log` (broker/storage/log.py) checks that it is usable and says which segments and
directories are unsynced, then calls these; the caller runs the plan's operations between.

Rules this module keeps:
- One flush covers every append visible when it was planned: many appends and one flush is group
  commit. Its `durable_offset` is the log's end at planning, never more.
- The store is synced before anything says its bytes are durable: a segment's synced size and
  index marks move only when the plan completes, never past what it synced (a truncation may
  have cut the segment meanwhile).
- The active segment is pinned by the plan until it completes or fails, even if it rolls
  meanwhile; its index is written, not synced: a cache that recovery rebuilds from the synced
  store, and syncing it would double the cost of a flush. Closed segments are named by path
  (`SyncFile`), holding no descriptor of the cache's: a flush may cover many segments rolled
  since the last one. Their index entries not yet written (appends that were in flight when
  they rolled) are written first, and their index is synced with them; so is their `.txnindex`
  (their transaction markers), written once no append in flight still writes the segment.
- Directories are synced too when segments were created or deleted since the last flush (and,
  the first time, the directories the log's open created): a power loss could otherwise drop a
  new segment's name, and the durable data in it, whole.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from broker.storage.fileio import (
    FileIO,
    FileSystems,
    Op,
    Sync,
    SyncDir,
    SyncFile,
    Write,
    run_ops,
    run_together,
)
from broker.storage.segment import Segment


@dataclass(slots=True)
class FlushPlan:
    ops: list[Op]
    # (segment, store size, index entries, whether the index is synced too) the ops make durable
    marks: list[tuple[Segment, int, int, bool]]
    durable_offset: int
    pinned: list[Segment] = field(default_factory=list)  # unpinned by complete_ / fail_flush

    @property
    def syncs_directories(self) -> bool:
        return any(isinstance(op, SyncDir) for op in self.ops)


def plan(
    unsynced: Iterable[Segment],
    active: Segment,
    draining: Collection[Segment],
    directories: Sequence[str],
    durable_offset: int,
) -> FlushPlan:
    """`Log.prepare_flush`'s plan: the syncs (and index writes) of the `unsynced` segments, then
    of `directories`; it makes the log durable up to `durable_offset` (module rules). `draining`:
    the segments rolled with appends still in flight to them."""
    ops: list[Op] = []
    marks = []
    pinned: list[Segment] = []
    try:
        for seg in unsynced:
            index = seg.index
            if seg is active:  # pinned until the plan ends; its index written, not synced
                seg.pin()
                pinned.append(seg)
                data, position = index.unpersisted()
                if seg.synced_size < seg.size:
                    ops.append(Sync(seg.store_fd))
                if data:
                    ops.append(Write(seg.index_fd, (data,), position, len(data)))
                marks.append((seg, seg.size, len(index), False))
                continue
            seg.write_index()  # entries of appends in flight when it rolled: to the page cache
            if seg not in draining and seg.write_txn_index():
                ops.append(SyncFile(seg.txn_index_path))  # written at its roll, synced with it
            if seg.synced_size < seg.size:
                ops.append(SyncFile(seg.store_path))
            sync_index = seg.index_synced_count < len(index)
            if sync_index:
                ops.append(SyncFile(seg.index_path))
            marks.append((seg, seg.size, len(index), sync_index))
    except BaseException:
        for seg in pinned:
            seg.unpin()
        raise
    ops.extend(SyncDir(directory) for directory in directories)
    return FlushPlan(ops, marks, durable_offset, pinned)


def unpin(plan: FlushPlan) -> None:
    """Release what the plan pinned (its completion or failure)."""
    pinned, plan.pinned = plan.pinned, []
    for seg in pinned:
        seg.unpin()


def complete(plan: FlushPlan) -> None:
    """The plan's operations all succeeded: its segments' marks move up to what it synced."""
    unpin(plan)
    for seg, size, entries, index_synced in plan.marks:
        seg.synced_size = max(seg.synced_size, min(size, seg.size))
        kept = min(entries, len(seg.index))  # a truncate may have run in between
        seg.index.persisted_count = max(seg.index.persisted_count, kept)
        if index_synced:
            seg.index_synced_count = max(seg.index_synced_count, kept)


def still_unsynced(unsynced: Iterable[Segment], active: Segment) -> dict[Segment, None]:
    """Of `unsynced`, those a completed flush left with something to sync, and the active segment."""
    return {
        s: None
        for s in unsynced
        if s is active or s.synced_size < s.size or s.index_synced_count < len(s.index)
    }


@dataclass(slots=True)
class ClosePlan:
    """What a clean `Log.close` asks of the disk: give back the active segment's preallocated
    tail (`truncate_to`, None when nothing is preallocated past its end), then the flush, then
    the active index's sync (a flush writes it, leaving it unsynced). The active segment is
    pinned until the close completes, so its descriptors stay valid on another thread."""

    flush: FlushPlan
    active: Segment
    store_fd: int
    index_fd: int
    truncate_to: int | None
    truncated: bool = False


def run_close(io: FileIO, plan: ClosePlan) -> None:
    """Carry out `plan`'s disk work: system calls only, so that a core closing many logs may run
    many of them at once on threads (concurrent syncs share journal commits). A failed truncate
    is left for the next open (it releases a tail left); a failed sync raises."""
    _truncate(io, plan)
    run_ops(io, plan.flush.ops)
    io.fdatasync(plan.index_fd)


def _truncate(io: FileIO, plan: ClosePlan) -> None:
    if plan.truncate_to is not None:
        try:
            io.ftruncate(plan.store_fd, plan.truncate_to)
            plan.truncated = True
        except OSError:
            pass


def run_closes_together(
    closes: Sequence[tuple[FileIO, ClosePlan, str]], filesystems: FileSystems
) -> list[OSError | None]:
    """Many logs' closes (each: its file calls, its plan, its directory) with one syncfs per
    file system instead of each one's syncs (`run_together` says what that promises and how a
    failure still lands on its log): each one's error, None when it closed durable. The
    truncates go first, as in `run_close`, so that the syncfs covers the new sizes too."""
    errors: list[OSError | None] = [None] * len(closes)
    groups: dict[int, list[int]] = {}  # by FileIO: a test's faulty one beside the process's
    for i, (io, plan, _) in enumerate(closes):
        _truncate(io, plan)
        groups.setdefault(id(io), []).append(i)
    for indices in groups.values():
        io = closes[indices[0]][0]
        flushes = [(_close_ops(closes[i][1]), closes[i][2]) for i in indices]
        found, _ = run_together(io, flushes, filesystems)
        for i, error in zip(indices, found, strict=True):
            errors[i] = error
    return errors


def _close_ops(plan: ClosePlan) -> list[Op]:
    return [*plan.flush.ops, Sync(plan.index_fd)]
