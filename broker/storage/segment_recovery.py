"""What a crash left in one segment, found and repaired when it opens: its index trusted only as
far as it checks out against the store, the store's torn tail cut. `Segment`
(broker/storage/segment.py) calls these with its files (`Segment.open`, `Segment.recover`, an
index loaded on first use) and takes what they find; what lies between segments is
broker/storage/log_recovery.py.

Rules this module keeps:
- The store is the truth; the index is a cache of it. A closed segment gets a cheap check when
  it opens (`tail_end`: its index's last entry must end exactly where the store ends); the active
  segment, and any that fails the check, is recovered.
- Recovery walks back over index entries until one points at a whole batch with the right base
  offset and crc, then scans forward batch by batch (header, lengths, crc32c, offsets that only
  grow, within what a segment can index), re-adding index entries. The first batch that does not
  check out and everything after it is cut: a torn or garbage tail. Zeros after the last batch,
  no longer than `PREALLOCATED_TAIL_MAX`, are preallocated space a killed process left: released,
  not reported as damage.
- A store of the old format 1 is refused (`LegacyFormatError`) before anything is read further
  or cut: an older version's data is not ours to cut.
- The index file is rewritten only where it differs: a clean restart writes nothing, so recovery
  works on a full disk.
- Memory is bounded: the store is read in chunks of `SCAN_CHUNK_BYTES`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from broker.storage.errors import LegacyFormatError
from broker.storage.fileio import FileIO, Write, run_write
from broker.storage.index import (
    ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    POSITION_MAX,
    RELATIVE_OFFSET_MAX,
    SegmentIndex,
    decode_entry,
    invalid_header,
    parse_entries,
)
from broker.storage.log_config import PREALLOCATE_BYTES_MAX
from ringlog_proto.batch import HEADER_SIZE, BatchHeader, batch_crc, legacy_format, read_header
from ringlog_proto.batch import invalid_stored_header as invalid_batch_header

log = logging.getLogger("broker.storage.segment")  # the segment's lines, as before this module was apart

SCAN_CHUNK_BYTES = 4 * 1024 * 1024  # recovery reads the store in chunks this big; bounds its memory
# A tail of zeros no longer than the largest preallocation step after the last batch is that
# space, left by a process that was killed (a clean close gives it back), not damage.
PREALLOCATED_TAIL_MAX = PREALLOCATE_BYTES_MAX + (64 << 20)  # plus the largest batch a write could tear


class SegmentFiles(Protocol):
    """What recovery needs of a segment (`Segment`): its files, opened when asked for."""

    @property
    def io(self) -> FileIO: ...

    @property
    def base_offset(self) -> int: ...

    @property
    def store_path(self) -> str: ...

    @property
    def index_path(self) -> str: ...

    @property
    def store_fd(self) -> int: ...

    @property
    def index_fd(self) -> int: ...


class TailEnd(NamedTuple):
    """What a segment that passes the cheap check is: its size, next offset and last times."""

    size: int
    next_offset: int
    max_timestamp: int | None
    last_append_ms: int | None
    entries: int  # in the index file


@dataclass(frozen=True, slots=True)
class Recovered:
    """What recovery found: the index that checks out, the store's size and next offset after the
    cut, and how many bytes were cut."""

    index: SegmentIndex
    size: int
    next_offset: int
    cut: int


def preallocated(tail: bytes) -> bool:
    """Whether `tail` (the bytes after a store's last whole batch) is unwritten preallocated space."""
    return not tail.rstrip(b"\x00")


def tail_end(seg: SegmentFiles) -> TailEnd | None:
    """The cheap open-time check: where the store ends, if the last index entry ends exactly
    there, else None. Reads one entry and one batch header, not the whole index, so opening a
    log with many segments stays fast."""
    index_size = seg.io.size(seg.index_fd)
    store_size = seg.io.size(seg.store_fd)
    if index_size < INDEX_HEADER_SIZE or (index_size - INDEX_HEADER_SIZE) % ENTRY_SIZE:
        return None
    if index_size == INDEX_HEADER_SIZE:
        empty = (
            store_size == 0
            and invalid_header(seg.io.pread(seg.index_fd, INDEX_HEADER_SIZE, 0), seg.base_offset) is None
        )
        return TailEnd(0, seg.base_offset, None, None, 0) if empty else None
    header = seg.io.pread(seg.index_fd, INDEX_HEADER_SIZE, 0)
    if invalid_header(header, seg.base_offset) is not None:
        return None
    last = decode_entry(seg.io.pread(seg.index_fd, ENTRY_SIZE, index_size - ENTRY_SIZE))
    if last is None:
        return None
    data = seg.io.pread(seg.store_fd, HEADER_SIZE, last.position)
    if len(data) < HEADER_SIZE:
        return None
    h = read_header(data)
    if (
        invalid_batch_header(h) is not None
        or h.base_offset != seg.base_offset + last.relative_offset
        or last.position + h.size != store_size
    ):
        return None
    entries = (index_size - INDEX_HEADER_SIZE) // ENTRY_SIZE
    return TailEnd(store_size, h.next_offset, last.max_timestamp, last.append_time_ms, entries)


def read_index_file(seg: SegmentFiles) -> tuple[SegmentIndex, str | None]:
    """Entries from the index file, and why some or all of it was unusable (None if fine)."""
    data = seg.io.pread(seg.index_fd, seg.io.size(seg.index_fd), 0)
    reason = invalid_header(data, seg.base_offset)
    if reason is not None:
        return SegmentIndex(), reason
    entries, reason = parse_entries(data[INDEX_HEADER_SIZE:])
    return SegmentIndex(entries, len(entries) // ENTRY_SIZE), reason


def recover(seg: SegmentFiles, index: SegmentIndex | None, now_ms: int) -> Recovered:
    """Validate the store from the last index entry that checks out; cut what does not.

    Walks back over index entries until one points at a batch with the right base offset and
    crc, then scans forward from there batch by batch (header, lengths, crc32c, offset
    continuity), re-adding index entries. The first invalid batch and everything after it is
    cut: it is a torn or garbage tail. `index`: the one in memory, if loaded (it is changed).
    Writes the index file and cuts the store; the segment takes what is returned.
    """
    if legacy_format(seg.io.pread(seg.store_fd, HEADER_SIZE, 0)) is not None:
        raise LegacyFormatError(seg.store_path)  # an older version's data: not ours to cut
    if index is None:
        index, reason = read_index_file(seg)
        if reason:
            log.warning("%s: %s; rebuilding from the store", seg.index_path, reason)
    store_size = seg.io.size(seg.store_fd)
    # Walk back to the last trustworthy entry.
    while len(index):
        e = index.entry(len(index) - 1)
        h = _verified_header(seg, e.position, seg.base_offset + e.relative_offset, store_size)
        if h is not None:
            break
        index.truncate(len(index) - 1)
    if len(index):
        last = index.last()
        assert last is not None
        h = _verified_header(seg, last.position, seg.base_offset + last.relative_offset, store_size)
        assert h is not None
        position, next_offset = last.position + h.size, h.next_offset
    else:
        position, next_offset = 0, seg.base_offset
    rebuilt_time = min(now_ms, seg.io.mtime_ms(seg.store_fd))
    position, next_offset, reason = _scan(seg, index, position, next_offset, store_size, rebuilt_time)
    cut = store_size - position
    if cut:
        if cut <= PREALLOCATED_TAIL_MAX and preallocated(seg.io.pread(seg.store_fd, cut, position)):
            log.info("%s: released %d bytes preallocated after position %d", seg.store_path, cut, position)
        else:
            log.warning("%s: cut %d bytes at position %d: %s", seg.store_path, cut, position, reason)
        seg.io.ftruncate(seg.store_fd, position)
    _rewrite_index(seg, index)
    return Recovered(index, position, next_offset, cut)


def _rewrite_index(seg: SegmentFiles, index: SegmentIndex) -> None:
    """Make the index file hold exactly `index` (it may have lost entries, or hold garbage or a
    partial entry), writing only what differs: a clean restart writes nothing, so recovery
    works on a full disk. Where the disk refuses the write (ENOSPC), the file is cut to what
    is right in it, or emptied, and the entries stay unpersisted in memory: the index is a
    cache of the store, rebuilt at the next open if need be. Other errors raise."""
    whole = index.encode_file(seg.base_offset)
    on_disk = seg.io.pread(seg.index_fd, seg.io.size(seg.index_fd), 0)
    if on_disk == whole:
        index.persisted_count = len(index)
        return
    keep = 0  # bytes at the start of the file that are already right (whole entries)
    if len(on_disk) >= INDEX_HEADER_SIZE and on_disk[:INDEX_HEADER_SIZE] == whole[:INDEX_HEADER_SIZE]:
        common = len(whole) if on_disk.startswith(whole) else _common_prefix(on_disk, whole)
        keep = INDEX_HEADER_SIZE + (common - INDEX_HEADER_SIZE) // ENTRY_SIZE * ENTRY_SIZE
    try:
        if keep < len(on_disk):
            seg.io.ftruncate(seg.index_fd, keep)  # frees space; never needs any
        if keep < len(whole):
            run_write(seg.io, Write(seg.index_fd, (whole[keep:],), keep, len(whole) - keep))
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        with contextlib.suppress(OSError):
            seg.io.ftruncate(seg.index_fd, keep)
        log.warning(
            "%s: no space to rewrite the index (%s); the rest stays in memory until there "
            "is room (the store is the truth: the next open rebuilds it if need be)",
            seg.index_path,
            exc.strerror or exc,
        )
        index.persisted_count = max(0, (keep - INDEX_HEADER_SIZE) // ENTRY_SIZE)
        return
    index.persisted_count = len(index)


def _verified_header(
    seg: SegmentFiles, position: int, expected_offset: int, store_size: int
) -> BatchHeader | None:
    """The header of the batch at `position` if the whole batch is there and its crc matches."""
    data = seg.io.pread(seg.store_fd, HEADER_SIZE, position)
    if len(data) < HEADER_SIZE:
        return None
    h = read_header(data)
    if invalid_batch_header(h, store_size - position) is not None or h.base_offset != expected_offset:
        return None
    body = seg.io.pread(seg.store_fd, h.size, position)
    if len(body) != h.size or batch_crc(body, 0, h.size) != h.crc:
        return None
    return h


def _scan(
    seg: SegmentFiles, index: SegmentIndex, position: int, next_offset: int, store_size: int, append_ms: int
) -> tuple[int, int, str]:
    """Validate batches from `position`, adding index entries; stop at the first bad one."""
    chunk = b""
    chunk_pos = position
    while position < store_size:
        rel = position - chunk_pos
        if len(chunk) - rel < HEADER_SIZE:
            chunk = seg.io.pread(seg.store_fd, SCAN_CHUNK_BYTES, position)
            chunk_pos, rel = position, 0
            if len(chunk) < HEADER_SIZE:
                return position, next_offset, f"{len(chunk)} trailing bytes, less than a header"
        h = read_header(chunk, rel)
        reason = invalid_batch_header(h, store_size - position)
        if reason is None and h.base_offset < next_offset:
            reason = f"base offset {h.base_offset}, expected {next_offset} or later"
        if reason is None and (
            h.last_offset - seg.base_offset > RELATIVE_OFFSET_MAX or position + h.size > POSITION_MAX + 1
        ):
            reason = "batch beyond the offsets or bytes a segment can index"
        if reason is not None:
            return position, next_offset, reason
        if len(chunk) - rel < h.size:
            chunk = seg.io.pread(seg.store_fd, max(SCAN_CHUNK_BYTES, h.size), position)
            chunk_pos, rel = position, 0
        if batch_crc(chunk, rel, h.size) != h.crc:
            return position, next_offset, "crc32c mismatch"
        index.append(h.base_offset - seg.base_offset, position, h.max_timestamp, append_ms)
        position += h.size
        next_offset = h.next_offset
    return position, next_offset, "end of store"


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    lo, hi = 0, n  # binary search over slices: C-speed compares, not a Python loop per byte
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
