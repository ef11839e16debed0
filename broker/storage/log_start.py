"""A log's start moving up: retention deleting old segments (`apply_retention`), Kafka's
DeleteRecords or a follower taking its leader's start (`delete_records`), and the start recorded
when it lies inside a segment, restored at open. `LogStart` is a layer of `Log`
(broker/storage/log.py) on `LogTruncation` (log_truncation.py), whose restart it takes when a
recorded start lies past the log's end.

Rules this module keeps:
- The start only moves up. The log starts at its first segment's base offset unless records were
  deleted below an offset inside a segment: that offset is kept in `log-start-offset.json` in the
  log's directory, and the log starts at the larger of the two (`Log.start_offset`). Nothing
  below the start is read; the segment holding it keeps its bytes below it, never served again.
- Whole segments only are deleted, oldest first, and never the active one nor one that appends in
  flight still write: for DeleteRecords, those wholly below the start (Kafka's rule: a segment goes
  once the next one starts at or below the log start), and the active one the start passed at the
  roll that closes it (Kafka waits for its next retention pass; a restart would delete it at
  open); for retention, those past `retention_ms`
  (by the broker's append time of their last batch, read from the index on disk, so a restart
  does not make old data young) or beyond `retention_bytes`. A log whose cleanup policy does not
  delete (Kafka's cleanup.policy=compact) keeps every segment: its cleaner removes records.
- The file is small and replaced atomically and durably (broker/storage/durable_file.py) before
  the new start is answered: a restart, kill -9 or power loss, never serves a deleted record
  again. It is written only when the start moves inside a segment: a cold path.
- A recorded start above the log's end (the records after the durable point were lost with the
  machine) starts the log over, empty, at the recorded start: everything below it was deleted.
  A crash between recording a start and deleting the segments below it is finished at open.

Fileformat (JSON): {"log_start_offset": <int, >= 0>}. A file that does not parse is ignored with
a warning (the segments' own start is then the log's start): it only ever holds a lower bound.
"""

from __future__ import annotations

import json
import logging

from broker.storage.durable_file import load_json, replace_json
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.layout import log_start_path
from broker.storage.log_truncation import LogTruncation
from broker.storage.segment import Segment

log = logging.getLogger("broker.storage.log")  # the log's lines, as before this module was apart


def read(directory: str) -> int:
    """The recorded log start of the log in `directory` (0: none recorded)."""
    path = log_start_path(directory)
    try:
        doc = load_json(path)
    except (OSError, ValueError) as exc:
        log.warning("%s: ignoring the recorded log start: %s", path, exc)
        return 0
    if doc is None:
        return 0
    value = doc.get("log_start_offset") if isinstance(doc, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        log.warning("%s: ignoring the recorded log start %s", path, json.dumps(doc)[:100])
        return 0
    return value


def write(directory: str, offset: int) -> None:
    """Record `offset` as the log's start, durably (module rules)."""
    assert offset >= 0
    replace_json(log_start_path(directory), {"log_start_offset": offset}, mode=0o644)


class LogStart(LogTruncation):
    """`delete_records`, `apply_retention` and the start restored at open (module rules)."""

    def delete_records(self, offset: int) -> int:
        """Move the log start up to `offset` (Kafka's DeleteRecords, or a follower taking its
        leader's start), at most to the log end (`OffsetOutOfRangeError` past it); never back.
        Segments wholly below it are deleted; an offset inside a segment is recorded durably
        first, so no restart serves a deleted record again. Returns the log start after."""
        self.check_usable()
        end = self.end_offset
        if offset > end:
            raise OffsetOutOfRangeError(f"delete records below {offset}: past the log end {end}")
        if offset <= self.start_offset:
            return self.start_offset
        gone = self._below(offset)
        if self.segments[len(gone)].base_offset < offset:
            write(self.directory, offset)
        self._start_floor = offset
        self._delete_first(len(gone))
        self.durable_offset = max(self.durable_offset, offset)
        self._assert_marks()
        return offset

    def _below(self, offset: int) -> list[Segment]:
        """The first segments, each followed by one based at or below `offset`: nothing of them
        is at or above it. Never the active segment nor one appends in flight still write."""
        pinned = self._pending[0].segment if self._pending else self.segments[-1]
        out = []
        for seg, after in zip(self.segments, self.segments[1:], strict=False):
            if seg is pinned or after.base_offset > offset:
                break
            out.append(seg)
        return out

    def drop_below_start(self) -> None:
        """At a roll: delete the segment just closed if the start passed it while it was active
        (`delete_records` keeps the active segment). Its directory is synced with the new
        segment's at the next flush; a crash before then finds the recorded start at open."""
        self._delete_first(len(self._below(self.start_offset)), sync=False)

    def _delete_first(self, count: int, sync: bool = True) -> None:
        for _ in range(count):
            seg = self.segments.pop(0)
            self._bases.pop(0)
            self._unsynced.pop(seg, None)
            log.info("%s: deleting segment (below the log start)", seg.store_path)
            seg.delete()
        if count and sync:
            self.io.fsync_dir(self.directory)

    def _restore_start(self, floor: int) -> None:
        """At open: the recorded log start, its segments wholly below it deleted (a crash came
        between recording it and deleting them); above the recovered end, the log starts over
        there (module rules)."""
        if floor <= self.segments[0].base_offset:
            return
        if floor > self.end_offset:
            log.warning(
                "%s: the recorded log start %d is past the recovered end %d: starting over, empty, there",
                self.directory,
                floor,
                self.end_offset,
            )
            self.restart_at(floor)
            return
        self._start_floor = floor
        self._delete_first(len(self._below(floor)))

    def apply_retention(self, now: int | None = None) -> int:
        """Delete whole closed segments past `retention_ms` or beyond `retention_bytes`.

        Age is the broker's append time of a segment's last batch, read from its index on disk,
        so a restart does not make old data young. Oldest first; the active segment is never
        deleted. Returns how many segments were deleted. A log whose cleanup policy does not
        delete (Kafka's cleanup.policy=compact) keeps every segment: its cleaner removes records.
        """
        self.check_usable()
        now = self.clock() if now is None else now
        cfg = self.config
        if not cfg.deletes:
            return 0
        total = self.size_bytes
        pinned = self._pending[0].segment if self._pending else self.segments[-1]
        deleted = 0
        while len(self.segments) > 1 and self.segments[0] is not pinned:
            seg = self.segments[0]
            last = seg.last_append_ms
            too_old = cfg.retention_ms is not None and (last is None or now - last > cfg.retention_ms)
            too_big = cfg.retention_bytes is not None and total > cfg.retention_bytes
            if not (too_old or too_big):
                break
            log.info("%s: deleting segment (%s)", seg.store_path, "age" if too_old else "size")
            self.segments.pop(0)
            self._bases.pop(0)
            self._unsynced.pop(seg, None)
            total -= seg.size
            seg.delete()
            deleted += 1
        if deleted:
            self.io.fsync_dir(self.directory)
            self.durable_offset = max(self.durable_offset, self.start_offset)
        return deleted
