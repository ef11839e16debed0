"""A segment: a store file of batches, as clients sent them, and its index.

Rules this module keeps:
- A segment is named by its base offset, 20 digits zero-padded (`00000000000000000042.log` and
  `.index`), so `ls` sorts segments in offset order: broker/storage/layout.py spells the names.
- The store file holds whole, validated batches back to back and nothing else (Fileformat in
  `ringlog_proto.batch`). Every byte below `size` has been written and belongs to a batch that
  passed validation; bytes above it are a torn tail that `recover` cuts (what it checks and
  keeps: broker/storage/segment_recovery.py).
- Offsets only grow inside a segment: each batch's base offset is at or past the previous batch's
  next offset. Past it only where the log cleaner removed batches (broker/storage/cleaner.py) or a
  follower copied a leader's cleaned log; a batch holds the offsets its header spans, some of
  them (a cleaned batch) or none (an empty one) with a record. Batches are checked as stored
  batches (`invalid_stored_header`).
- A segment is owned by one core (the one owning its partition); nothing here is thread-safe.
- Descriptors: every segment, the active one too, opens a file when it is used and leaves it to
  the process's descriptor cache (broker/storage/fdcache.py), which closes the least recently
  used; `pin` keeps a segment's files open across an asynchronous operation (an io_uring read in
  flight, a pending append, a flush plan, the recovery at open). A closed or deleted segment
  (`close`, `delete`) never reopens; its files close when its last pin goes. What a reopen needs
  stays in memory with the segment (its size, what is allocated and synced, the index with the
  entries not yet written), so closing its files loses nothing.
- The cache closes a segment's files without syncing them (`evict`): the bytes stay in the page
  cache, and the log's next flush reopens the file and syncs it there (Linux syncs the inode
  whichever descriptor asks, and reports a writeback error not yet seen to a descriptor opened
  after it), as for closed segments (fileio.SyncFile). A sync at eviction would put an
  fdatasync on the loop for every segment pushed out: with more partitions written between
  flushes than the cache holds, produce fell 15-fold (8302 to 552 a second at 10 000 partitions
  on one core). What that leaves: a writeback error on a file whose inode the kernel reclaimed
  before the flush reopened it is not reported; acks=all pays it only for a segment evicted
  between its append and the flush of the same turn, past the cache's size.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from broker.storage import segment_recovery
from broker.storage.errors import CorruptBatchError, LogClosedError
from broker.storage.fdcache import FdCache
from broker.storage.fileio import Buffer, FileIO, Write, run_write
from broker.storage.index import (
    ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    SegmentIndex,
    encode_header,
)
from broker.storage.layout import index_file_name, store_file_name, txn_index_file_name
from broker.storage.txn_index import MarkerEntry, decode_txn_file, encode_txn_file
from ringlog_proto.batch import (
    HEADER_SIZE,
    BatchHeader,
    read_header,
    scan_stored,
    span_shortfall,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Extent:
    """A run of whole batches in one segment's store: what a read returns."""

    segment: Segment
    position: int
    length: int
    first_offset: int  # base offset of the first batch in the run
    last_position: int = -1  # store position of the last batch in the run (-1: not given)


class Segment:
    """One store file plus its index, and what is known about them in memory."""

    def __init__(self, directory: str, base_offset: int, io: FileIO, cache: FdCache) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.io = io
        self.cache = cache
        self._store_fd: int | None = None
        self._index_fd: int | None = None
        self._pins = 0
        self._gone = False  # closed or deleted: files close with the last pin and never reopen
        self.store_path = os.path.join(directory, store_file_name(base_offset))
        self.index_path = os.path.join(directory, index_file_name(base_offset))
        self.size = 0  # bytes of whole batches written
        self.allocated = 0  # the store file's size: `size` plus space preallocated after it (zeros)
        self.next_offset = base_offset
        self.max_timestamp: int | None = None
        self.last_append_ms: int | None = None
        self._index: SegmentIndex | None = None
        self._entries_on_disk = 0  # from the index file's size, when the index is not loaded
        self.synced_size = 0  # store bytes known to be on disk (fdatasync done)
        self.index_synced_count = 0  # index entries known to be on disk
        self._mapping: memoryview | None = None  # the store mapped by `mapped`, until the files close
        self.txn_index_path = os.path.join(directory, txn_index_file_name(base_offset))
        # Its markers by offset, when every one is known (None: not known, the walk reads them);
        # `txn_index_written`: the `.txnindex` file holds them as they are.
        self.markers: dict[int, MarkerEntry] | None = None
        self.txn_index_written = False

    # ----------------------------------------------------------------------------- descriptors

    @property
    def open_files(self) -> int:
        return (self._store_fd is not None) + (self._index_fd is not None)

    @property
    def store_fd(self) -> int:
        """The store's descriptor, opened if need be. Unpinned, it is valid until the next use of
        another segment (the cache may close it then): use it at once, or `pin` first."""
        return self._fd(self._store_fd, index=False)

    @property
    def index_fd(self) -> int:
        """The index file's descriptor, opened if need be; valid as `store_fd` says."""
        return self._fd(self._index_fd, index=True)

    def _fd(self, fd: int | None, index: bool) -> int:
        if fd is None:
            return self._open_file(index=index)
        if not self._pins:
            self.cache.touch(self)
        return fd

    def _open_file(self, index: bool) -> int:
        if self._gone:
            raise LogClosedError(f"{self.store_path}: segment closed")
        pinned = self._pins > 0
        # Out while its count of open files changes; a pinned one stays out until unpinned.
        self.cache.hold(self)
        try:
            try:
                fd = self._open_path(index)
            except OSError as exc:
                # Out of descriptors (connections took them): the cache gives its own back, once.
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self.cache.open_fds:
                    raise
                log.warning(
                    "%s: %s; closing the %d cached segment files", self.store_path, exc, self.cache.open_fds
                )
                self.cache.evict_all()
                fd = self._open_path(index)
        finally:
            if not pinned:
                self.cache.release(self)  # the most recently used: not evicted by this
        return fd

    def _open_path(self, index: bool) -> int:
        if index:
            fd = self._index_fd = self.io.open(self.index_path, create=True)
        else:
            fd = self._store_fd = self.io.open(self.store_path, create=False)
        return fd

    @property
    def pinned(self) -> bool:
        return self._pins > 0

    def pin(self) -> None:
        """Keep this segment's open files open until `unpin` (an operation on them is in flight).
        A count only: the cache skips a pinned segment (fdcache.py)."""
        self._pins += 1

    def unpin(self) -> None:
        assert self._pins > 0, "unpin without pin"
        self._pins -= 1
        if self._pins:
            return
        if self._gone:
            self.cache.hold(self)
            self.close_files()
        else:
            self.cache.unpinned(self)

    def borrow_store_fd(self) -> int:
        """Pin the segment and return its store descriptor, for a read that completes later
        (an io_uring SQE); `unpin` when it has completed."""
        self.pin()
        try:
            return self.store_fd
        except BaseException:
            self.unpin()
            raise

    def evict(self) -> None:
        """The cache closes this segment's files for room; bytes not yet synced are synced by the
        log's next flush on a reopened descriptor (the module's rules say why)."""
        self.close_files()

    def close_files(self) -> None:
        """Close whatever files are open (the cache evicting, or the last pin of a closed segment)."""
        self._mapping = None  # unmapped once no reply still holds a view of it
        fds = (self._store_fd, self._index_fd)
        self._store_fd = self._index_fd = None
        for fd in fds:
            if fd is not None:
                with contextlib.suppress(OSError):
                    self.io.close(fd)

    def _retire(self) -> None:
        """No more use: close the files now, or when the last pin goes."""
        self._gone = True
        self.cache.hold(self)
        if not self._pins:
            self.close_files()

    # ----------------------------------------------------------------------------- lifecycle

    @classmethod
    def create(cls, directory: str, base_offset: int, io: FileIO, cache: FdCache) -> Segment:
        """Create an empty segment, returned pinned with its files open (the caller unpins it
        once it is the log's new active segment). The caller fsyncs the directory when durability
        asks for it."""
        store_path = os.path.join(directory, store_file_name(base_offset))
        index_path = os.path.join(directory, index_file_name(base_offset))
        fds: list[int] = []
        ours = False  # whether the files are new and empty, so ours to remove on failure
        try:
            fds.append(io.open(store_path, create=True))
            fds.append(io.open(index_path, create=True))
            if io.size(fds[0]) != 0:
                raise FileExistsError(f"{store_path} exists and is not empty: refusing to reuse offsets")
            ours = True
            io.ftruncate(fds[1], 0)
            header = encode_header(base_offset)
            run_write(io, Write(fds[1], (header,), 0, len(header)))
        except OSError:
            for fd in fds:
                io.close(fd)
            if ours:
                with contextlib.suppress(OSError):
                    io.unlink(store_path)
                    io.unlink(index_path)
            raise
        seg = cls(directory, base_offset, io, cache)
        seg._store_fd, seg._index_fd = fds
        seg._pins = 1
        seg._index = SegmentIndex()
        seg.markers = {}
        return seg

    @classmethod
    def open(
        cls,
        directory: str,
        base_offset: int,
        io: FileIO,
        cache: FdCache,
        *,
        active: bool,
        now_ms: int,
        clean_end: tuple[int, int] | None = None,
    ) -> Segment:
        """Open an existing segment and make store and index agree.

        The active segment (`active`) is scanned and validated batch by batch from its last index
        entry that checks out, and returned pinned with its files open, as `create` does (the log
        unpins it once its open syncs are done). A closed
        segment gets a cheap check of the index's last entry against the store (a mismatch falls
        back to the same recovery, so a torn closed segment is repaired too), and its files are
        closed again: a log may hold any number of closed segments, which open through the
        descriptor cache when they are used. `clean_end`: the (size, next offset) a clean close
        left the active segment at (broker/storage/clean_marker.py): it gets the closed segments'
        cheap check instead of the scan, and the scan when that fails or finds it otherwise
        (`index_loaded` tells which it got).
        """
        seg = cls(directory, base_offset, io, cache)
        seg._pins = 1  # the files opened here are ours until the end
        try:
            seg._store_fd = io.open(seg.store_path, create=False)
            seg._index_fd = io.open(seg.index_path, create=True)
            trusted = (
                active
                and clean_end is not None
                and seg._tail_consistent()
                and (seg.size, seg.next_offset) == clean_end
            )
            if not trusted and (active or not seg._tail_consistent()):
                seg.recover(now_ms)
        except BaseException:
            seg._pins = 0
            seg.close_files()
            raise
        seg.synced_size = seg.size
        seg.allocated = seg.size  # recovery cut anything after the batches, preallocated or torn
        # Not `entry_count`: that would load the whole index of every closed segment at open.
        seg.index_synced_count = len(seg._index) if seg._index is not None else seg._entries_on_disk
        if not active:
            seg._pins = 0
            seg.close_files()
            seg._load_txn_index()
        return seg

    def _load_txn_index(self) -> None:
        """The markers from the `.txnindex` file, if it is there and describes this segment as it
        is (txn_index.py's file form); else they stay unknown, for the walk."""
        try:
            fd = self.io.open(self.txn_index_path, create=False)
        except FileNotFoundError:
            return
        try:
            data = self.io.pread(fd, self.io.size(fd), 0)
        finally:
            self.io.close(fd)
        found = decode_txn_file(data, self.base_offset, self.next_offset, self.size)
        if isinstance(found, str):
            log.warning("%s: %s; the open walk reads the markers", self.txn_index_path, found)
            return
        self.markers = {m.offset: m for m in found}
        self.txn_index_written = True

    def write_txn_index(self) -> bool:
        """Write the `.txnindex` file of this closed segment if its markers are known and not in
        it yet (whole: a few bytes a marker). Returns whether it wrote (the caller syncs it, or
        leaves it a cache that a torn write only makes ignored)."""
        if self.markers is None or self.txn_index_written or self._gone:
            return False
        data = encode_txn_file(
            self.base_offset, self.next_offset, self.size, [self.markers[o] for o in sorted(self.markers)]
        )
        fd = self.io.open(self.txn_index_path, create=True)
        try:
            self.io.ftruncate(fd, 0)
            run_write(self.io, Write(fd, (data,), 0, len(data)))
        finally:
            self.io.close(fd)
        self.txn_index_written = True
        return True

    def drop_txn_index(self) -> None:
        """The segment changes (truncation) or goes: its `.txnindex` file no longer describes it."""
        self.txn_index_written = False
        with contextlib.suppress(FileNotFoundError):
            self.io.unlink(self.txn_index_path)

    def add_marker(self, offset: int, marker: MarkerEntry | None) -> None:
        """A control batch was appended at `offset`: what it says, or None when the appender
        did not say (its markers are then unknown until a walk reads them)."""
        if self.markers is not None:
            if marker is None:
                self.markers = None
            else:
                self.markers[offset] = marker

    def close(self) -> None:
        """Write unpersisted index entries and close both files (once no pin holds them). No
        fsync: see `Log.flush`.

        An index write the disk refuses (full) is skipped with a warning: the index is a cache
        that the next open rebuilds from the store. The files are closed whatever happens."""
        try:
            if not self._gone:
                try:
                    self.write_index()
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    log.warning(
                        "%s: index entries not written (%s); rebuilt at the next open", self.index_path, exc
                    )
        finally:
            self._retire()

    def abandon(self) -> None:
        """Close both files (once no pin holds them) writing nothing: a log refusing work, or a
        test playing a killed process."""
        self._retire()

    def delete(self) -> None:
        """Close and remove both files (store first: an orphan index is cleaned up at open). A read
        in flight keeps its descriptor of the unlinked file until it completes (its pin)."""
        self._retire()
        self.io.unlink(self.store_path)
        self.io.unlink(self.index_path)
        self.drop_txn_index()

    # ----------------------------------------------------------------------------- index

    @property
    def index(self) -> SegmentIndex:
        """The index, loaded on first use: closed segments keep theirs on disk until read."""
        if self._index is None:
            self._index = self._load_index()
            if not self._pins and self._index_fd is not None and not self._gone:
                # A closed segment read: its index is in memory now, only the store is needed.
                self.cache.hold(self)
                fd, self._index_fd = self._index_fd, None
                with contextlib.suppress(OSError):
                    self.io.close(fd)
                self.cache.release(self)
        return self._index

    @property
    def index_loaded(self) -> bool:
        """Whether the index is in memory: recovery loaded it (or a use did); false after an open
        whose cheap check passed."""
        return self._index is not None

    @property
    def entry_count(self) -> int:
        return len(self.index)

    def _load_index(self) -> SegmentIndex:
        index, reason = segment_recovery.read_index_file(self)
        last = index.last()
        end = 0 if last is None else last.position + self._batch_size_at(last.position)
        if reason is not None or end != self.size:
            log.warning(
                "%s: index inconsistent with store (%s); rebuilding", self.index_path, reason or "size"
            )
            self._index = index
            self.recover(self.io.mtime_ms(self.store_fd))
            return self._index
        return index

    def _batch_size_at(self, position: int) -> int:
        data = self.io.pread(self.store_fd, HEADER_SIZE, position)
        return read_header(data).size if len(data) == HEADER_SIZE else -1

    def _tail_consistent(self) -> bool:
        """The cheap open-time check (segment_recovery.py `tail_end`): does the last index entry
        end exactly where the store ends? Sets size, next offset and timestamps when it does."""
        tail = segment_recovery.tail_end(self)
        if tail is None:
            return False
        self.size, self.next_offset, self.max_timestamp, self.last_append_ms, self._entries_on_disk = tail
        return True

    def write_index(self) -> None:
        """Write index entries not yet in the file (index writes are lazy; see index.py)."""
        if self._index is None:
            return
        data, position = self._index.unpersisted()
        if data:
            run_write(self.io, Write(self.index_fd, (data,), position, len(data)))
            self._index.persisted_count = len(self._index)

    # ----------------------------------------------------------------------------- recovery

    def recover(self, now_ms: int) -> int:
        """Validate the store from the last index entry that checks out; cut what does not (how,
        and what is kept: broker/storage/segment_recovery.py). Returns the number of store bytes
        cut. A store written by the old format 1 raises LegacyFormatError before anything is read
        further or cut."""
        found = segment_recovery.recover(self, self._index, now_ms)
        index = self._index = found.index
        self.size = found.size
        self.next_offset = found.next_offset
        last = index.last()
        self.max_timestamp = None if last is None else last.max_timestamp
        self.last_append_ms = None if last is None else last.append_time_ms
        return found.cut

    # ----------------------------------------------------------------------------- appends

    def add_batch(self, position: int, header: BatchHeader, append_ms: int) -> None:
        """Record a batch whose bytes are now written at `position` (end of the store)."""
        assert position == self.size, (position, self.size)
        assert header.base_offset >= self.next_offset
        self.index.append(header.base_offset - self.base_offset, position, header.max_timestamp, append_ms)
        self.size = position + header.size
        self.next_offset = header.next_offset
        if self.max_timestamp is None or header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
        self.last_append_ms = append_ms

    def first_append_ms(self) -> int | None:
        """When the first batch was appended: `segment_ms` rolls the active segment by it."""
        return self.index.entry(0).append_time_ms if self.entry_count else None

    def truncate_to_size(self, size: int) -> None:
        """Cut the store at `size` (a batch boundary or the current end). Cold path, synchronous."""
        self.io.ftruncate(self.store_fd, size)
        self.synced_size = min(self.synced_size, size)
        self.allocated = size

    def preallocate(self, length: int) -> None:
        """Make the store file `length` bytes long ahead of the appends (zeros the file system
        allocates without writing): an append inside the file does not change its size, so the
        fdatasync that makes it durable commits no journal transaction for the size (the durable
        path's largest cost on ext4, ~50 us of ~160). Raises OSError (the caller carries on without)."""
        self.io.allocate(self.store_fd, length)
        self.allocated = length

    def truncate_allocation(self, length: int) -> None:
        """The store file is `length` bytes again after a preallocation the file system refused
        part of (what `allocated` counts stays): the blocks it got go back."""
        if self.io.size(self.store_fd) > length:
            self.io.ftruncate(self.store_fd, length)

    def release_preallocated(self, end: int) -> None:
        """Give back what was preallocated after `end` (the segment's final size): a segment that
        is no longer appended to is exactly its batches on disk."""
        if self.allocated > end:
            self.io.ftruncate(self.store_fd, end)
            self.allocated = end

    def truncate_before_offset(self, offset: int) -> int:
        """Drop every batch whose last offset is >= `offset`. Returns the new next offset."""
        index = self.index
        n = len(index)
        i = index.find_offset(offset - self.base_offset)
        if i < 0:
            keep = 0
        else:
            # The index is dense: batch i ends where batch i + 1 begins (or at the segment's end).
            next_start = self.base_offset + index.relative_offset(i + 1) if i + 1 < n else self.next_offset
            keep = i + 1 if next_start - 1 < offset else i
        if keep == n:
            return self.next_offset
        position = index.position(keep)
        new_next = self.base_offset + index.relative_offset(keep)
        self.drop_txn_index()  # before the store changes: a file left would describe the old one
        if self.markers is not None:
            self.markers = {o: m for o, m in self.markers.items() if o < new_next}
        index.truncate(keep)
        self.truncate_to_size(position)
        # Cut the file to the entries it really holds: never extend it over entries not written yet.
        self.io.ftruncate(self.index_fd, INDEX_HEADER_SIZE + index.persisted_count * ENTRY_SIZE)
        self.index_synced_count = min(self.index_synced_count, keep)
        self.size = position
        self.next_offset = new_next
        last = index.last()
        self.max_timestamp = None if last is None else last.max_timestamp
        self.last_append_ms = None if last is None else last.append_time_ms
        return new_next

    # ----------------------------------------------------------------------------- reads

    def locate(self, offset: int, max_bytes: int, upto: int | None = None) -> Extent | None:
        """Whole batches from the one holding `offset`, up to `max_bytes` (at least one batch)
        and, with `upto` (a batch boundary), only batches below that offset.

        None when no batch of this segment holds `offset` or a later offset (below `upto`).
        """
        index = self.index
        n = len(index)
        if n == 0 or offset >= self.next_offset:
            return None
        if upto is not None and upto < self.next_offset:
            if upto <= offset:
                return None
            n = index.find_offset(upto - 1 - self.base_offset) + 1  # the batches below `upto`
            if n == 0:
                return None
        i = max(index.find_offset(offset - self.base_offset), 0)
        if self.base_offset + index.relative_offset(i) < offset and self._ends_before(i, offset):
            # A cleaned batch whose last offset is below `offset` (the ones after it were
            # removed): the read starts at the next batch, as Kafka's starts at the first batch
            # ending at or after the offset asked.
            i += 1
            if i >= n:
                return None
        start = index.position(i)
        count = len(index)
        # The furthest batch boundary within max_bytes (batch j starts at position(j), and the
        # last one ends at the store's end); at least one batch.
        if (index.position(n) if n < count else self.size) - start <= max_bytes:
            j = n  # the common case of a consumer near the end: everything left fits
        else:
            j = max(index.last_position_within(i + 1, n, start + max_bytes), i + 1)
        end = index.position(j) if j < count else self.size
        first = self.base_offset + index.relative_offset(i)
        return Extent(self, start, end - start, first, index.position(j - 1))

    def _ends_before(self, i: int, offset: int) -> bool:
        """Whether batch `i` ends before `offset`: its header read (a read inside a batch only;
        a produced batch always reaches the next one's base, a cleaned one may not)."""
        data = self.io.pread(self.store_fd, HEADER_SIZE, self.index.position(i))
        return len(data) == HEADER_SIZE and read_header(data).next_offset <= offset

    def mapped(self, extent: Extent, map_file: Callable[[int, int], memoryview]) -> memoryview:
        """`extent`'s bytes as a read-only view of the store file mapped into memory, not read
        into a buffer: a fetch that the page cache can serve checks and sends them from there
        (the read's copy, and the fresh buffer's page faults, were most of a fetch's CPU).

        `map_file(fd, length)` maps (the backend's: storage makes no system call of its own). The
        mapping covers the file as allocated and is kept until the files close (the descriptor
        cache bounds both); a reply still sending a view keeps it mapped after that. Only bytes
        known to be in the file may be touched (a page past its end is SIGBUS): the caller asks
        the kernel whether the pages are resident first, which they are not past the end.
        Raises what opening the file or mapping it raises.
        """
        end = extent.position + extent.length
        mapping = self._mapping
        if mapping is None or len(mapping) < end:
            fd = self.store_fd
            mapping = self._mapping = map_file(fd, max(end, self.allocated))
        return mapping[extent.position : end]

    def check_batches(self, data: Buffer, extent: Extent) -> tuple[int, int, CorruptBatchError | None]:
        """Validate each batch of a read against its crc and the index.

        Returns (bytes of intact batches from the start, the offset after them, the error that
        stopped the check or None). Data read back is checked before it leaves the broker: a bit
        flip on disk becomes an error naming the file and position, never records a client trusts.
        """
        # What was stored passed full validation at append time: `scan_stored` looks only for
        # damage (ringlog_proto/batch.py), in C when native._records is built.
        pos, expected, reason = scan_stored(data, 0, len(data), extent.first_offset)
        while reason is not None and len(data) - pos >= HEADER_SIZE:
            # The scan takes each batch to start where the one before ends, at base offset +
            # record count: a batch the cleaner rewrote (fewer records than offsets) or removed
            # breaks that. A later base offset that the index holds at that very position is
            # no damage: the scan goes on from it.
            found = read_header(data, pos).base_offset
            if found <= expected or found != self._index_base_at(extent.position + pos):
                break
            pos, expected, reason = scan_stored(data, pos, len(data), found)
        if reason is not None:
            return pos, expected, CorruptBatchError(self.store_path, extent.position + pos, reason)
        if extent.last_position >= 0 and pos == len(data) == extent.length:
            # The scan counted the last batch's records; a cleaned one ends past them.
            expected += span_shortfall(data, extent.last_position - extent.position)
        return pos, expected, None

    def _index_base_at(self, position: int) -> int | None:
        """The base offset of the batch the index places at store `position`, or None."""
        index = self.index
        i = index.last_position_within(0, len(index), position)
        if i < 0 or index.position(i) != position:
            return None
        return self.base_offset + index.relative_offset(i)

    def find_timestamp(self, timestamp: int) -> int | None:
        """Store position of the first batch holding a record at or after `timestamp`, or None."""
        if self.max_timestamp is None or self.max_timestamp < timestamp:
            return None
        i = self.index.find_timestamp(timestamp)
        return None if i >= len(self.index) else self.index.position(i)
