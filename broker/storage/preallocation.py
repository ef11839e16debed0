"""The active segment's store file, allocated ahead of its appends (one `Preallocation` per log).

Rules this module keeps:
- One posix_fallocate per `PREALLOCATE_BYTES` appended, per up to `PREALLOCATE_BYTES_MAX` as the
  appends come faster: about a second of them (broker/storage/log_config.py has both and why);
  never past the segment size unless one append alone is larger. The log gives the space back
  when the segment rolls or the log closes (`Segment.release_preallocated`).
- A file system that cannot preallocate turns it off for the log; a full disk does not (the space
  may come back), and neither leaves blocks allocated that no append counts on.
- Owned by its log, so by one core; nothing here is thread-safe.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable

from broker.storage.log_config import PREALLOCATE_BYTES, PREALLOCATE_BYTES_MAX
from broker.storage.segment import Segment

log = logging.getLogger("broker.storage.log")  # the log's lines, as before this module was apart

# A step lasting under PREALLOCATE_RAMP_MS of appends is doubled (up to PREALLOCATE_BYTES_MAX); one
# lasting over twice that long is cut to what that long of appends takes (at least the first).
# So a partition holds between one and two such spans of its own appends ahead, at most one
# fallocate a span: the disk held ahead of all partitions together follows what they take, not
# how many they are (100k idle ones hold the first step each).
PREALLOCATE_RAMP_MS = 1000


class Preallocation:
    """How far ahead of its appends a log's active segment is allocated: the step, and whether the
    file system preallocates at all."""

    __slots__ = ("_clock", "_directory", "_enabled", "_last_end", "_last_ms", "_step")

    def __init__(self, directory: str, clock: Callable[[], int]) -> None:
        self._directory = directory  # the log's, for its log line
        self._clock = clock
        self._enabled = True  # until the file system refuses (see `extend`)
        self._step = PREALLOCATE_BYTES
        self._last_ms = -PREALLOCATE_RAMP_MS  # when the last step was taken (the clock's)
        self._last_end = 0  # the store position it was taken at

    def extend(self, seg: Segment, end: int, reserved_size: int, segment_bytes: int) -> None:
        """Extend the active segment's file by a step past `end` (never past the segment size,
        unless one append alone is larger). A file system that cannot (or a full disk) leaves
        appends growing the file as before: the write itself reports a full disk.
        `reserved_size`: the store size the log's appends prepared so far count on;
        `segment_bytes`: the log's config's (read at each append: a test may change it).

        The step follows the appends' rate (see PREALLOCATE_RAMP_MS): a partition taking a stream
        of large batches makes one fallocate per 8 MiB, not per 64 KiB or MiB (~20 us each: 3% of
        an ingesting core at a MiB), one among 1000 taking 300 KiB/s each one a second, not five
        (5000 fallocates a second were 6% of that core's samples), while the disk held ahead of a
        slow or idle partition's data stays 64 KiB."""
        if not self._enabled:
            return
        now = self._clock()
        # What was appended since the last step (at least that step, more when one append
        # crossed it: a stream of batches larger than the step is still a stream).
        appended = end - self._last_end if end > self._last_end else end  # a new segment: from 0
        took_ms = now - self._last_ms
        if took_ms * self._step < PREALLOCATE_RAMP_MS * appended:  # the step lasted under that long
            self._step = min(2 * self._step, PREALLOCATE_BYTES_MAX)
        elif 2 * PREALLOCATE_RAMP_MS * appended <= took_ms * self._step:  # over twice that long
            wanted = PREALLOCATE_RAMP_MS * appended // took_ms
            step = PREALLOCATE_BYTES
            while step < wanted:
                step *= 2
            self._step = step
        self._last_ms = now
        self._last_end = end
        target = max(end, min(end + self._step, segment_bytes))
        try:
            seg.preallocate(target)
        except OSError as exc:
            # ext4 keeps the blocks a failed fallocate did get and the file size it reached:
            # left there, they hold the space a full disk has left (or just got back) as zeros
            # no append counts on, and every other partition's writes fail until a restart cuts
            # them. Cut back to what is counted: the appends prepared so far (writes
            # in flight land below `reserved_size`) or what was allocated before.
            with contextlib.suppress(OSError):
                seg.truncate_allocation(max(reserved_size, seg.allocated))
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                self._enabled = False
                log.info("%s: no preallocation (%s); appends grow the files", self._directory, exc)
