"""The descriptor cache: how many files of closed segments one process keeps open.

A partition's log may hold any number of segments (retention decides, not the broker), but a
process has a fixed budget of file descriptors (RLIMIT_NOFILE). So only the active segment of each
log keeps its files open for good; a closed segment opens its files when it is used (a read, an
index load, a flush of a segment just rolled) and leaves them in this cache, which closes the
least recently used ones beyond `capacity`.

Rules this module keeps:
- A segment in use across an asynchronous operation is *pinned* (`Segment.pin`): an io_uring SQE
  referencing its fd is in flight, or the log holds it (the active segment, a pending append, a
  flush plan). A pinned segment is not in the cache and its files are never closed under it; it
  comes back (most recently used) when its last pin goes. Closing a descriptor with an SQE in
  flight would be worse than an error: the number may already name another file.
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

    def close_files(self) -> None: ...


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
        """Take `seg` out of the cache (pinned, closing, or about to open a file): its files are no
        longer the cache's to close. A no-op for a segment not in it."""
        if seg in self._lru:
            del self._lru[seg]
            self.open_fds -= seg.open_files

    def evict_all(self) -> None:
        """Close every cached file (the process ran out of descriptors)."""
        lru, self._lru = self._lru, OrderedDict()
        self.open_fds = 0
        self.evictions += len(lru)
        for victim in lru:
            victim.close_files()

    def release(self, seg: CachedFiles) -> None:
        """Put `seg` (unpinned, with files open) in the cache as the most recently used, then
        close the least recently used others beyond the capacity."""
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
            self.evictions += 1
            victim.close_files()


DEFAULT_CACHE = FdCache()
