"""The loop's side of the log cleaner: how dirty a log is and what a clean may take of it
(`assess`, `plan`), the swap of a clean's result into the log (`install`), and the cleaner's
checkpoint. The clean itself runs on a thread (broker/storage/cleaner.py).

Rules this module keeps:
- Everything here runs on the log's core, between its requests: a log changes only there, so
  what `plan` saw and what `install` finds can be compared without a lock.
- Cleanable are the closed segments (never the active one, nor one that appends in flight still
  write) from the log start up to the first that holds an offset at or past the high watermark
  (Kafka cleans only what every in-sync replica has) or the last stable offset (Kafka's first
  unstable offset: a transaction still open, or whose end is not replicated, is not cleaned, so
  every transactional batch cleaned is of a transaction known to have committed or aborted), or a
  batch younger than the min compaction lag. The dirty section starts where the last clean ended
  (the checkpoint, `cleaned_to`), or at the log start when the checkpoint is out of the log. Its
  share of the cleanable bytes is the dirty ratio; a log is cleaned when the ratio is above
  `min_cleanable_dirty_ratio`, or when the first dirty batch is older than `max_compaction_lag_ms`
  (KIP-354), or when a tombstone's delete horizon has come (KIP-534), as Kafka's LogCleanerManager
  decides. Ages are the broker's append times of the batches (in the index), as retention's are;
  Kafka reads the records' timestamps.
- `install` changes the log only if every segment the clean read is still there as it was (not
  deleted by retention, truncated by a follower, or replaced): otherwise the clean's files are
  removed and nothing happens. It then swaps in the order recovery relies on
  (broker/storage/log_recovery.py `finish_swaps`): every group's `.cleaned` index, then every
  `.cleaned` store, renamed to `.swap` (the commit: done when no `.cleaned` file is left), the
  directory synced; then per group the replaced segments after the first removed, the `.swap`
  index then store renamed over the first's files, and the new segment opened in their place
  (`Log.replace_segments`, broker/storage/log_segments.py). A failure half way leaves the log
  refusing work until it is reopened, where recovery completes the swap (or, before the commit,
  removes it). The replaced segments' `.txnindex` files go before the commit and each new
  segment's is written once it is in place (a cache: missing, the next open reads its markers).
- The checkpoint (`cleaner-checkpoint.json` in the partition's directory) says where the dirty
  section starts and when the next delete horizon comes. It is a hint: lost or behind, the next
  clean rewrites more than it needed to, never less.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from broker.storage import layout
from broker.storage.cleaner import CleanPlan, CleanResult, SourceSegment, Steps, no_steps
from broker.storage.durable_file import load_json, replace_json
from broker.storage.fileio import FileIO
from broker.storage.log import Log
from broker.storage.segment import Segment
from broker.storage.txn_index import AbortedTxn

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CleanerCheckpoint:
    cleaned_to: int = 0  # the dirty section starts here
    next_horizon_ms: int | None = None  # the earliest delete horizon of a tombstone the log keeps


def load_checkpoint(directory: str) -> CleanerCheckpoint:
    """The partition's checkpoint, or a fresh one (no file, or one that does not parse)."""
    path = layout.cleaner_checkpoint_path(directory)
    try:
        doc = load_json(path)
        if isinstance(doc, dict):
            horizon = doc.get("next_horizon_ms")
            return CleanerCheckpoint(int(doc["cleaned_to"]), None if horizon is None else int(horizon))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: %s; the next clean starts from the log start", path, exc)
    return CleanerCheckpoint()


def save_checkpoint(directory: str, checkpoint: CleanerCheckpoint) -> None:
    """Replace the checkpoint file durably (blocking: run off the loop)."""
    replace_json(
        layout.cleaner_checkpoint_path(directory),
        {"cleaned_to": checkpoint.cleaned_to, "next_horizon_ms": checkpoint.next_horizon_ms},
    )


@dataclass(frozen=True, slots=True)
class Dirtiness:
    """How much of a log a clean could take now, and whether it should (module rules)."""

    segments: tuple[Segment, ...]  # the cleanable segments, from the log start
    dirty_from: int
    upto: int
    clean_bytes: int
    dirty_bytes: int
    reason: str | None  # why it should be cleaned now ("dirty ratio", "max lag", "tombstones"), or None

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def assess(
    log_: Log,
    checkpoint: CleanerCheckpoint,
    now_ms: int,
    high_watermark: int,
    last_stable_offset: int | None = None,
) -> Dirtiness:
    """How dirty `log_` is (module rules); changes nothing. `last_stable_offset`: None when the
    partition holds no transaction (the high watermark then)."""
    if last_stable_offset is not None:
        high_watermark = min(high_watermark, last_stable_offset)
    cfg = log_.config
    start = log_.start_offset
    dirty_from = checkpoint.cleaned_to
    if not start <= dirty_from <= log_.end_offset:
        dirty_from = start
    cleanable: list[Segment] = []
    for seg in log_.closed_segments():
        if seg.next_offset > high_watermark:
            break
        if cfg.min_compaction_lag_ms and (
            seg.last_append_ms is None or seg.last_append_ms > now_ms - cfg.min_compaction_lag_ms
        ):
            break
        cleanable.append(seg)
    clean_bytes = sum(s.size for s in cleanable if s.next_offset <= dirty_from)
    dirty = [s for s in cleanable if s.next_offset > dirty_from]
    dirty_bytes = sum(s.size for s in dirty)
    upto = cleanable[-1].next_offset if cleanable else start
    reason = None
    if (
        dirty_bytes
        and (clean_bytes + dirty_bytes)
        and dirty_bytes / (clean_bytes + dirty_bytes) > cfg.min_cleanable_dirty_ratio
    ):
        reason = "dirty ratio"
    elif dirty_bytes and cfg.max_compaction_lag_ms is not None:
        first = dirty[0].first_append_ms()
        if first is not None and now_ms - first > cfg.max_compaction_lag_ms:
            reason = "max compaction lag"
    if (
        reason is None
        and cleanable
        and checkpoint.next_horizon_ms is not None
        and checkpoint.next_horizon_ms <= now_ms
    ):
        reason = "tombstones past their delete horizon"
    return Dirtiness(tuple(cleanable), dirty_from, upto, clean_bytes, dirty_bytes, reason)


@dataclass(frozen=True, slots=True)
class Planned:
    """A clean's plan (for the thread) and the segments it was made from (for `install`)."""

    plan: CleanPlan
    segments: tuple[Segment, ...]


def plan(
    log_: Log,
    dirtiness: Dirtiness,
    now_ms: int,
    producers_last: dict[int, int],
    markers_last: dict[int, int] | None = None,
    aborted: Iterable[AbortedTxn] = (),
) -> Planned | None:
    """The plan of a clean of `dirtiness` (from `assess`, this turn), or None when there is
    nothing to take. The index entries of its segments are written first (a closed segment's
    index is written lazily), so that the cleaner finds them all in the files. `markers_last`:
    each producer's last marker; `aborted`: the partition's aborted transactions (those begun
    in the cleanable range go into the plan)."""
    if not dirtiness.segments:
        return None
    try:
        for seg in dirtiness.segments:
            seg.write_index()
    except OSError as exc:
        log.warning("%s: not cleaned: an index could not be written (%s)", log_.directory, exc)
        return None
    cfg = log_.config
    clean_plan = CleanPlan(
        directory=log_.directory,
        segments=tuple(
            SourceSegment(s.base_offset, s.next_offset, s.size, s.store_path, s.index_path)
            for s in dirtiness.segments
        ),
        dirty_from=dirtiness.dirty_from,
        upto=dirtiness.upto,
        now_ms=now_ms,
        delete_retention_ms=cfg.delete_retention_ms,
        segment_bytes=cfg.segment_bytes,
        producers_last=dict(producers_last),
        markers_last=dict(markers_last or {}),
        aborted=tuple(entry for entry in aborted if entry.first_offset < dirtiness.upto),
    )
    return Planned(clean_plan, dirtiness.segments)


def discard(result: CleanResult, io: FileIO) -> None:
    """Remove a clean's `.cleaned` files (a clean not installed)."""
    for group in result.groups:
        for path in (group.store_path, group.index_path):
            with contextlib.suppress(OSError):
                io.unlink(path)


def _still_there(log_: Log, planned: Planned, result: CleanResult) -> list[list[Segment]] | None:
    """The log's segments each group replaces, if every one is still the log's, consecutive and
    as the plan saw it (same object, same size), else None."""
    seen = {
        src.base_offset: (src, seg) for src, seg in zip(planned.plan.segments, planned.segments, strict=True)
    }
    closed = log_.closed_segments()
    position = {id(seg): i for i, seg in enumerate(closed)}
    out = []
    for group in result.groups:
        segs = []
        for src in group.replaces:
            src_seen, seg = seen[src.base_offset]
            if (
                id(seg) not in position
                or seg.size != src_seen.size
                or seg.next_offset != src_seen.next_offset
            ):
                return None
            segs.append(seg)
        first = position[id(segs[0])]
        if any(position[id(seg)] != first + k for k, seg in enumerate(segs)):
            return None
        out.append(segs)
    return out


def install(log_: Log, planned: Planned, result: CleanResult, steps: Steps = no_steps) -> bool:
    """Swap the clean's segments into `log_` (module rules). False, with the clean's files
    removed, when the log changed under the clean or is not usable; True once swapped in."""
    io = log_.io
    try:
        log_.check_usable()
        olds = _still_there(log_, planned, result)
    except Exception:
        olds = None
    if olds is None or not result.groups:
        discard(result, io)
        return False
    directory = log_.directory

    def swap_name(name: str) -> str:
        return os.path.join(directory, layout.cleaning_name(name, layout.SWAP_SUFFIX))

    # The `.txnindex` files of the segments replaced go before the commit: a cache, whose absence
    # only makes the next open read those markers; none left can be taken for the new segment's.
    for old in olds:
        for seg in old:
            try:
                seg.drop_txn_index()
            except OSError as exc:
                log.warning("%s: not removed (%s); the clean is not installed", seg.txn_index_path, exc)
                discard(result, io)
                return False
    renamed = 0
    try:
        for group in result.groups:
            io.rename(group.index_path, swap_name(layout.index_file_name(group.base_offset)))
            renamed += 1
            steps("index-swap")
        for group in result.groups:
            io.rename(group.store_path, swap_name(layout.store_file_name(group.base_offset)))
            renamed += 1
            steps("store-swap")
        io.fsync_dir(directory)
        steps("committed")
    except OSError as exc:
        if renamed == 2 * len(result.groups):  # committed: only the directory sync failed
            log_.mark_broken(f"syncing a clean's commit failed ({exc}); the next open completes it")
            return False
        # Not committed while a `.cleaned` file is left: undo what was renamed, as recovery would.
        log.warning("%s: the clean's commit failed (%s); the log stays as it was", directory, exc)
        swaps = [
            swap_name(name)
            for g in result.groups
            for name in (layout.index_file_name(g.base_offset), layout.store_file_name(g.base_offset))
        ]
        for path in swaps:
            with contextlib.suppress(OSError):
                io.unlink(path)
        if any(os.path.exists(path) for path in swaps):
            # A `.swap` the next clean's commit would make look committed: the `.cleaned` files
            # left say it is not, and the log waits for the reopen that removes them all.
            log_.mark_broken(f"a clean's commit failed and could not be undone ({exc})")
            return False
        discard(result, io)
        return False
    try:
        for group, old in zip(result.groups, olds, strict=True):
            for seg in old[1:]:
                seg.delete()
            steps("replaced-removed")
            base = group.base_offset
            io.rename(
                swap_name(layout.index_file_name(base)), os.path.join(directory, layout.index_file_name(base))
            )
            steps("index-renamed")
            io.rename(
                swap_name(layout.store_file_name(base)), os.path.join(directory, layout.store_file_name(base))
            )
            steps("store-renamed")
            new = Segment.open(directory, base, io, log_.cache, active=False, now_ms=planned.plan.now_ms)
            log_.replace_segments(old, new)
            if group.markers is not None and new.markers is None:
                new.markers = {m.offset: m for m in group.markers}
                try:
                    new.write_txn_index()  # a cache: a crash before it is an open walk's reads
                except OSError as exc:
                    log.warning("%s: not written (%s)", new.txn_index_path, exc)
    except Exception as exc:
        log_.mark_broken(f"swapping in a cleaned segment failed ({exc}); the next open completes it")
        return False
    steps("swapped")
    return True
