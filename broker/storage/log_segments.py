"""A log's segments and the offsets they span: the state every part of the log changes, with the
pins that keep segments' files open, the marks and whether the log is usable; and the log
cleaner's view of the segments and the swap of its cleaned ones. `Log` (broker/storage/log.py) is
built on it in layers, each adding one noun's operations to the one below: `LogTruncation`
(log_truncation.py, the end cut back), `LogStart` (log_start.py, the start moved up), then `Log`
(open, close, appends, flushes, reads).

Rules this module keeps:
- Offsets move in one direction through three marks:
  durable_offset (fsynced) <= end_offset (written, visible to readers) <= next offset assigned,
  all asserted (`_assert_marks`) where a flush, a truncation, a restart or a move of the start
  moves them. An append's completion moves only end_offset, up to where the oldest append still
  in flight begins (appends complete in the order prepared, asserted there): the full check is
  not repeated on that hot path.
- Descriptors: no segment keeps its files open for good, the active one neither: every segment
  opens its files through a descriptor cache (broker/storage/fdcache.py, one per process) when
  used, so an idle log holds no descriptor once the cache needs the room, and a process holds at
  most the cache's however many partitions it has. Whatever an operation returned to the caller
  references stays open until it is completed: a pending append pins its segment until it
  completes or is aborted (and a segment rolled with appends in flight stays `_draining` until
  they complete); a flush plan pins the active segment (it syncs closed ones by path,
  `SyncFile`); `Segment.borrow_store_fd` is how a reader pins one. The append position, the
  preallocation and the durability marks are the log's and its segments' memory, not the files':
  a reopen continues where the last descriptor left.
- The log cleaner (broker/storage/log_cleaning.py) reads only closed segments that no append in
  flight still writes (`closed_segments`). A cleaned segment takes the place of those it replaces
  in one step (`replace_segments`); they are retired, not closed under a read in flight, which
  keeps its descriptor until it completes.
- One core owns a log; nothing here is thread-safe.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from broker.storage.errors import LogClosedError
from broker.storage.fdcache import DEFAULT_CACHE, FdCache
from broker.storage.fileio import FileIO, Op
from broker.storage.log_config import LogConfig
from broker.storage.preallocation import Preallocation
from broker.storage.segment import Segment
from ringlog_proto.batch import BatchHeader

log = logging.getLogger("broker.storage.log")  # the log's lines, as before this module was apart


@dataclass(slots=True)
class PendingAppend:
    """An append whose offsets are assigned and whose write has not completed yet."""

    segment: Segment
    position: int
    headers: list[BatchHeader]  # with the assigned base offsets
    size: int
    append_ms: int
    ops: list[Op]
    index_persisted: int = -1  # index entries the ops also write, or -1

    @property
    def base_offset(self) -> int:
        return self.headers[0].base_offset

    @property
    def next_offset(self) -> int:
        return self.headers[-1].next_offset


class LogSegments:
    """The state of a partition's log in one directory (the layers above change it; open a log
    with `Log.open`)."""

    def __init__(
        self,
        directory: str,
        config: LogConfig,
        io: FileIO,
        clock: Callable[[], int],
        cache: FdCache = DEFAULT_CACHE,
    ) -> None:
        self.directory = directory
        self.config = config
        self.io = io
        self.clock = clock
        self.cache = cache
        self._draining: list[Segment] = []  # rolled with appends in flight: pinned until they end
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self._pending: deque[PendingAppend] = deque()
        self._next_offset = 0  # next offset to assign (includes pending appends)
        self._reserved_size = 0  # store size of the active segment including pending appends
        self._preallocation = Preallocation(directory, clock)
        self.durable_offset = 0
        # Segments with data or index entries not yet synced, in order (a dict: a set that keeps
        # order, so that an append's membership check does not scan every segment rolled since).
        self._unsynced: dict[Segment, None] = {}
        self._dir_unsynced = False
        # Directories whose new entries (the log's own directory, the topic directory above it)
        # the first flush must sync too: a partition made on first use creates both, and without
        # these syncs a power loss could drop the directory, and the durable data in it, whole.
        self._parents_unsynced: list[str] = []
        self._closed = False
        self._broken: str | None = None
        # The lowest end a truncation (or restart) left since the log cleaner last asked
        # (`take_truncation`): the records it had cleaned above it are gone, and what is appended
        # there again is dirty.
        self._truncated_to: int | None = None
        # Where records were deleted below an offset inside a segment (Kafka's DeleteRecords):
        # the log starts at the larger of this and its first segment's base (log_start.py).
        self._start_floor = 0

    # ------------------------------------------------------------------------- segments and pins

    def _add_segment(self, seg: Segment) -> None:
        self.segments.append(seg)
        self._bases.append(seg.base_offset)

    def _undrain_all(self) -> None:
        draining, self._draining = self._draining, []
        for seg in draining:
            seg.unpin()

    # ------------------------------------------------------------------------- usable

    @property
    def closed(self) -> bool:
        """Closed, or refusing work until reopened."""
        return self._closed or self._broken is not None

    def check_usable(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")
        if self._broken is not None:
            raise LogClosedError(f"log {self.directory} is unusable until reopened: {self._broken}")

    def mark_broken(self, reason: str) -> None:
        """Refuse all work until reopened, where recovery repairs what `reason` left (a swap of
        cleaned segments that failed half way: recovery completes it)."""
        self._broken = reason
        log.error("%s: %s", self.directory, reason)

    # ------------------------------------------------------------------------- offsets

    @property
    def start_offset(self) -> int:
        """The first offset still held (retention and `delete_records` move it forward)."""
        base = self.segments[0].base_offset
        return base if base >= self._start_floor else self._start_floor

    @property
    def end_offset(self) -> int:
        """One past the last visible offset: where a consumer that is caught up waits."""
        return self._pending[0].base_offset if self._pending else self.segments[-1].next_offset

    @property
    def next_offset(self) -> int:
        """The offset the next append gets (past the appends still in flight)."""
        return self._next_offset

    @property
    def size_bytes(self) -> int:
        return sum(seg.size for seg in self.segments)

    def _assert_marks(self) -> None:
        assert self.start_offset <= self.durable_offset <= self.end_offset <= self._next_offset, (
            self.start_offset,
            self.durable_offset,
            self.end_offset,
            self._next_offset,
        )

    # ------------------------------------------------------------------------- the log cleaner's

    def closed_segments(self) -> list[Segment]:
        """The segments the log cleaner may read (broker/storage/log_cleaning.py): every one
        before the active segment, up to the first that appends in flight still write (one
        rolled while they ran)."""
        out = []
        draining = self._draining
        for seg in self.segments[:-1]:
            if seg in draining:
                break
            out.append(seg)
        return out

    def replace_segments(self, old: list[Segment], new: Segment) -> None:
        """`new`, a cleaned segment opened from the files that replaced `old` (consecutive
        closed segments of this log, whose files are already removed or renamed over), takes
        their place. They are retired: a read in flight keeps its descriptor of the old file
        until it completes; none reopens. Their flushes are moot: `new` was synced when it was
        written (a flush in flight that names their paths finds them gone or finds `new`)."""
        i = next(k for k, seg in enumerate(self.segments) if seg is old[0])
        assert all(a is b for a, b in zip(self.segments[i : i + len(old)], old, strict=True)), "consecutive"
        assert i + len(old) < len(self.segments), "the active segment is never replaced"
        self.segments[i : i + len(old)] = [new]
        self._bases[i : i + len(old)] = [new.base_offset]
        for seg in old:
            self._unsynced.pop(seg, None)
            seg.abandon()
        self._dir_unsynced = True
