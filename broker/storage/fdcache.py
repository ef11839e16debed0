"""The descriptor cache: how many segment files one process keeps open.

A broker may hold any number of partitions, and a partition's log any number of segments
(retention decides, not the broker), but a process has a fixed budget of file descriptors
(RLIMIT_NOFILE). So no segment keeps its files open for good, not even a log's active one: a
segment opens its files when it is used (an append, a flush, a read, an index load) and leaves
them in this cache, which closes the least recently used ones beyond `capacity`. Descriptors are
bounded by the cache whatever the partition count; so are mappings (`Segment.mapped`), which go
with their segment's files.

Rules this module keeps:
- A segment in use across an asynchronous operation is *pinned* (`Segment.pin`): an io_uring SQE
  or a flusher thread's call referencing its fd is in flight (a pending append pins its segment
  until it completes or is aborted, a flush plan until it completes or fails, a ring read until
  its CQE), or it is being opened and recovered. Pins are the one rule: a pinned segment's files
  are never closed under it. It may stay listed while pinned (a pin is a count, not a cache
  operation: the hot path pins and unpins its active segment on every append); an eviction that
  meets it takes it out without closing anything, and it comes back (most recently used) when
  its last pin goes. Closing a descriptor with an SQE in flight would be worse than an error: the
  number may already name another file.
- Evicting a segment does not sync it: the log's next flush syncs its bytes on a reopened file
  (`Segment.evict` says why).
- The cache holds at most `capacity` descriptors, except that the segment used last is never
  evicted (a capacity of 0 still lets one segment be read).
- One cache per worker process (each worker has its own descriptor table), owned by its one thread.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

DEFAULT_CAPACITY = 256  # for tools and tests that open logs without naming a cache


class CachedFiles(Protocol):
    """What the cache needs of a segment."""

    @property
    def open_files(self) -> int: ...

    @property
    def pinned(self) -> bool: ...

    def evict(self) -> None: ...


class FdCache:
    """LRU of unpinned segments with open files; evicting one closes its files."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError(f"descriptor cache capacity must be >= 0, not {capacity}")
        self.capacity = capacity
        self._lru: OrderedDict[CachedFiles, None] = OrderedDict()
        self.open_fds = 0  # descriptors of the segments in the cache
        self.evictions = 0

    @property
    def segments(self) -> int:
        """Segments in the cache (not `__len__`: an empty cache must not be falsy)."""
        return len(self._lru)

    def touch(self, seg: CachedFiles) -> None:
        """`seg` (in the cache) was used: it becomes the most recently used."""
        self._lru.move_to_end(seg)

    def hold(self, seg: CachedFiles) -> None:
        """Take `seg` out of the cache (closing, or about to open a file): its files are no
        longer the cache's to close. A no-op for a segment not in it."""
        if seg in self._lru:
            del self._lru[seg]
            self.open_fds -= seg.open_files

    def unpinned(self, seg: CachedFiles) -> None:
        """`seg`'s last pin went: it is the most recently used, back in the cache if an eviction
        took it out while it was pinned."""
        if seg in self._lru:
            self._lru.move_to_end(seg)
        else:
            self.release(seg)

    def evict_all(self) -> None:
        """Close every cached file not pinned (the process ran out of descriptors)."""
        lru, self._lru = self._lru, OrderedDict()
        self.open_fds = 0
        for victim in lru:
            if not victim.pinned:  # a pinned one comes back when unpinned
                self.evictions += 1
                victim.evict()

    def release(self, seg: CachedFiles) -> None:
        """Put `seg` (unpinned, with files open) in the cache as the most recently used, then
        close the least recently used others beyond the capacity (a pinned one is only taken out)."""
        if seg in self._lru:
            self.hold(seg)
        if not seg.open_files:
            return
        self._lru[seg] = None
        self.open_fds += seg.open_files
        lru = self._lru
        while self.open_fds > self.capacity and len(lru) > 1:
            victim = next(iter(lru))  # not seg: it is last, and there are others
            del lru[victim]
            self.open_fds -= victim.open_files
            if victim.pinned:  # in flight: out until its last pin goes (`unpinned`), not closed
                continue
            self.evictions += 1
            victim.evict()


DEFAULT_CACHE = FdCache()
