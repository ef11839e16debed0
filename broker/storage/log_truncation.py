"""A log's end cut back, for replication: a follower dropping a divergent tail (`truncate`), or
starting over, empty, past its end (`restart_at`), and the lowest end left for the log cleaner.
`LogTruncation` is a layer of `Log` (broker/storage/log.py) on its segments
(log_segments.py).

Rules this module keeps:
- Batches are atomic: a truncation ends the log on the batch boundary at or below the offset asked.
  Later appends reuse the removed offsets (that is what truncation is for), never a segment name:
  the segments after the one cut are deleted before any new one can be created at their offsets.
- Neither runs with appends in flight: their writes and completions name the segments cut.
- Durable on return: the cut files and the directory are synced before the new end is answered,
  so a crash never brings back a tail the follower dropped.
- A truncation that cuts the batch holding the log start leaves nothing of the log: it starts
  over, empty, at the start. A restart deletes every segment and starts at an offset above the
  end, so every old segment name is below it.
- Each end left is kept for the log cleaner (`take_truncation`, the lowest since it last asked):
  what it cleaned above it is gone, and what is appended there again is dirty.
"""

from __future__ import annotations

import bisect

from broker.storage.errors import OffsetOutOfRangeError, StorageError
from broker.storage.log_segments import LogSegments
from broker.storage.segment import Segment


class LogTruncation(LogSegments):
    """`truncate` and `restart_at` (module rules), on the log's segments."""

    def truncate(self, offset: int) -> int:
        """Remove every batch holding an offset >= `offset`; returns the new end offset.

        Batches are atomic, so the end lands on the batch boundary at or below `offset`. Later
        appends reuse the removed offsets: that is what truncation is for (a follower dropping a
        divergent tail). Durable on return.
        """
        self.check_usable()
        if self._pending:
            raise StorageError("truncate with appends in flight")
        if not self.start_offset <= offset <= self.end_offset:
            raise OffsetOutOfRangeError(
                f"truncate to {offset}: outside [{self.start_offset}, {self.end_offset}]"
            )
        keep = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        while len(self.segments) > keep + 1:
            seg = self.segments.pop()
            self._bases.pop()
            self._unsynced.pop(seg, None)
            seg.delete()
        seg = self.segments[-1]
        start = self.start_offset
        new_end = seg.truncate_before_offset(offset)
        self._next_offset = new_end
        self._reserved_size = seg.size
        self.io.fdatasync(seg.store_fd)
        self.io.fdatasync(seg.index_fd)
        self.io.fsync_dir(self.directory)
        seg.synced_size = seg.size
        if new_end < start:  # the batch holding the start was cut: nothing of the log is left
            self.restart_at(start)
            return start
        self.durable_offset = min(self.durable_offset, new_end)
        self._assert_marks()
        self._note_truncation(new_end)
        return new_end

    def restart_at(self, offset: int) -> None:
        """Delete every segment and start over, empty, at `offset` above the end: a follower
        whose leader no longer holds the follower's end (retention deleted it there). Durable on
        return; no segment name is reused (every old one is below `offset`)."""
        self.check_usable()
        if self._pending:
            raise StorageError("restart with appends in flight")
        if offset <= self.end_offset:
            raise OffsetOutOfRangeError(f"restart at {offset}: not above the log end {self.end_offset}")
        old, self.segments, self._bases = self.segments, [], []
        for seg in old:
            self._unsynced.pop(seg, None)
            seg.delete()
        self._undrain_all()
        seg = Segment.create(self.directory, offset, self.io, self.cache)  # created pinned
        self._add_segment(seg)
        seg.unpin()  # the cache's now, as every idle segment
        self._next_offset = offset
        self._reserved_size = 0
        self.io.fsync_dir(self.directory)
        self.durable_offset = offset
        self._assert_marks()
        self._note_truncation(offset)

    def _note_truncation(self, end: int) -> None:
        if self._truncated_to is None or end < self._truncated_to:
            self._truncated_to = end

    def take_truncation(self) -> int | None:
        """The lowest end a truncation left since the last call, or None: where the log
        cleaner's checkpoint must come down to (Kafka's cleaner does the same on truncation)."""
        end, self._truncated_to = self._truncated_to, None
        return end
