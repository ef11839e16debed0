"""Fault injection through the FileIO parameter, bad input, and the split (prepare/complete) API.

`FaultyIO` is the real `SyncFileIO` with faults added on top: short writes, and errors (optionally
after writing a prefix, as a real partial write does) on writes or syncs of the store (`.log`) or
index (`.index`) files. Everything else is real files in `tmp_path`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from crc32c import crc32c

from broker.storage.errors import (
    BatchTooLargeError,
    InvalidBatchError,
    LogClosedError,
    OffsetOutOfRangeError,
    StorageError,
)
from broker.storage.fileio import Buffer, SyncFileIO, Write, run_ops
from broker.storage.log import INDEX_PENDING_ENTRIES_MAX, Log, LogConfig
from broker.storage.log_config import SEGMENT_BYTES_MAX
from ringlog_proto.batch import HEADER_SIZE


@dataclass
class Fault:
    suffix: str  # ".log", ".index" or "" (any file)
    errno: int
    skip: int = 0  # let this many matching calls through first
    partial: int = 0  # bytes of the write that reach the file before the error
    sticky: bool = False  # keep failing until cleared (a full disk), rather than once


class FaultyIO(SyncFileIO):
    def __init__(self) -> None:
        self.paths: dict[int, str] = {}
        self.max_write: int | None = None
        self.write_fault: Fault | None = None
        self.sync_fault: Fault | None = None
        self.dir_sync_fault: int | None = None
        self.pwritev_calls = 0
        # These tests are about writes: without preallocation a store file is exactly what was
        # written (tests/storage/test_preallocation.py has the preallocated case).
        self.allocate_error: int | None = errno.EOPNOTSUPP

    def allocate(self, fd: int, length: int) -> None:
        if self.allocate_error is not None:
            raise OSError(self.allocate_error, os.strerror(self.allocate_error))
        super().allocate(fd, length)

    def open(self, path: str, create: bool) -> int:
        fd = super().open(path, create)
        self.paths[fd] = path
        return fd

    def _trip(self, fault: Fault | None, fd: int) -> Fault | None:
        if fault is None or not self.paths.get(fd, "").endswith(fault.suffix):
            return None
        if fault.skip > 0:
            fault.skip -= 1
            return None
        return fault

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        self.pwritev_calls += 1
        fault = self._trip(self.write_fault, fd)
        if fault is not None:
            if fault.partial:
                os.pwrite(fd, b"".join(bytes(b) for b in buffers)[: fault.partial], offset)
            if not fault.sticky:
                self.write_fault = None
            raise OSError(fault.errno, os.strerror(fault.errno))
        if self.max_write is not None:
            return os.pwrite(fd, b"".join(bytes(b) for b in buffers)[: self.max_write], offset)
        return super().pwritev(fd, buffers, offset)

    def fdatasync(self, fd: int) -> None:
        fault = self._trip(self.sync_fault, fd)
        if fault is not None:
            if not fault.sticky:
                self.sync_fault = None
            raise OSError(fault.errno, os.strerror(fault.errno))
        super().fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        if self.dir_sync_fault is not None:
            code, self.dir_sync_fault = self.dir_sync_fault, None
            raise OSError(code, os.strerror(code))
        super().fsync_dir(path)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def active_store(log: Log) -> Path:
    return Path(log.segments[-1].store_path)


def reopen_plain(kit, d: Path, config: LogConfig, expected: list[tuple[int, int]]) -> None:
    """Reopen with the plain FileIO: exactly `expected` reads back, no garbage in any store."""
    log = Log.open(str(d), config)
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(expected)
    end = expected[-1][0] + expected[-1][1]
    assert log.end_offset == end
    for base in kit.segment_bases(d):
        store = kit.store_path(d, base)
        stored = kit.store_batches(store)
        assert (stored[-1].end if stored else 0) == store.stat().st_size, f"garbage in {store}"
    log.close()


# --------------------------------------------------------------------------------------- short writes


@pytest.mark.parametrize("max_write", [1, 7, HEADER_SIZE])
def test_short_writes_are_continued(tmp_path, kit, small_config, max_write):
    io = FaultyIO()
    io.max_write = max_write
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    calls = io.pwritev_calls
    written = kit.append_batches(log, 70)
    assert len(log.segments) >= 3
    assert io.pwritev_calls - calls >= 70 * 2, "the writes really were short"
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(written)
    log.flush()
    assert log.durable_offset == log.end_offset
    log.close()
    reopen_plain(kit, d, small_config, written)


def test_short_writes_leave_whole_index_files(tmp_path, kit, small_config):
    """Index writes outside the hot path (segment creation, close, the rewrite after recovery) are
    continued after short writes too: every index file is whole, and append times survive."""
    io = FaultyIO()
    io.max_write = 7
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    kit.append_batches(log, 70)
    log.close()
    # An index the next open rebuilds, with the short-writing FileIO again.
    kit.index_path(d, kit.segment_bases(d)[1]).unlink()
    Log.open(str(d), small_config, io=io).close()
    for base in kit.segment_bases(d):
        entries = kit.index_entries(kit.index_path(d, base), base)
        assert [(e.relative_offset + base, e.position) for e in entries] == [
            (b.base_offset, b.position) for b in kit.store_batches(kit.store_path(d, base))
        ]


# --------------------------------------------------------------------------------------- write errors


@pytest.mark.parametrize("partial", [0, 1, 8, HEADER_SIZE, -1])
def test_enospc_on_append_leaves_log_untouched(tmp_path, kit, small_config, partial):
    io = FaultyIO()
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    written = kit.append_batches(log, 10)
    end = log.end_offset
    store = active_store(log)
    size_on_disk = store.stat().st_size
    size_bytes = log.size_bytes
    durable = log.durable_offset
    batch = kit.batch(end, 3)
    io.write_fault = Fault(".log", errno.ENOSPC, partial=partial % len(batch))
    with pytest.raises(StorageError) as ei:
        log.append(batch)
    assert type(ei.value) is StorageError
    assert str(store) in str(ei.value) and "No space left on device" in str(ei.value)
    assert isinstance(ei.value.__cause__, OSError) and ei.value.__cause__.errno == errno.ENOSPC
    assert log.end_offset == end
    assert log.durable_offset == durable
    assert log.size_bytes == size_bytes
    assert store.stat().st_size == size_on_disk, "the partial write was cut off the file"
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(written)
    # The fault is gone: the same batch gets the offset the failed one would have had.
    assert log.append(batch) == end
    kit.read_batch(log, end, 3)
    more = kit.append_batches(log, 40)
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 3), *more])


def test_full_disk_fails_every_append_until_space_returns(tmp_path, kit, small_config):
    io = FaultyIO()
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    written = kit.append_batches(log, 5)
    end = log.end_offset
    size_on_disk = active_store(log).stat().st_size
    io.write_fault = Fault(".log", errno.ENOSPC, partial=5, sticky=True)
    for _ in range(5):
        with pytest.raises(StorageError):
            log.append(kit.batch(end, 2))
        assert log.end_offset == end
        assert active_store(log).stat().st_size == size_on_disk
    io.write_fault = None
    assert log.append(kit.batch(end, 2)) == end
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 2)])


def fill_until_roll(kit, log: Log, config: LogConfig) -> list:
    """Append until the next 3-record, 600-byte-wide batch no longer fits: that batch rolls."""
    written = kit.append_batches(log, 5)
    big = kit.batch(0, 3, width=600)
    while log.segments[-1].size + len(big) <= config.segment_bytes:
        written += kit.append_batches(log, 1, counts=[1])
    return written


def test_enospc_on_first_append_into_a_rolled_segment(tmp_path, kit, small_config):
    """The failing append rolled a new segment first: the new segment stays, empty, and the next
    append goes into it at the same offset."""
    io = FaultyIO()
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    written = fill_until_roll(kit, log, small_config)
    end = log.end_offset
    old_store = active_store(log)
    old_size = old_store.stat().st_size
    io.write_fault = Fault(".log", errno.ENOSPC, partial=100)
    with pytest.raises(StorageError):
        log.append(kit.batch(end, 3, width=600))
    assert log.end_offset == end
    assert old_store.stat().st_size == old_size
    assert kit.store_path(d, end).stat().st_size == 0
    assert log.append(kit.batch(end, 3, width=600)) == end
    assert log.segments[-1].base_offset == end
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 3)])


def test_enospc_on_index_write_inside_append(tmp_path, kit):
    """Every INDEX_PENDING_ENTRIES_MAX appends, an append also writes the pending index entries;
    when that write fails the append fails as a whole and its store bytes are cut."""
    config = LogConfig(segment_bytes=1 << 20, max_batch_bytes=4096, retention_ms=None)
    io = FaultyIO()
    d = tmp_path / "log"
    log = Log.open(str(d), config, io=io)
    written = kit.append_batches(log, INDEX_PENDING_ENTRIES_MAX, counts=[1], width=0)
    end = log.end_offset
    store = active_store(log)
    size = store.stat().st_size
    io.write_fault = Fault(".index", errno.ENOSPC, partial=30)
    with pytest.raises(StorageError):
        log.append(kit.batch(end, 1))
    assert log.end_offset == end
    assert store.stat().st_size == size
    assert log.append(kit.batch(end, 1)) == end
    log.close()
    reopen_plain(kit, d, config, [*written, (end, 1)])


def test_enospc_while_rolling_is_a_storage_error(tmp_path, kit, small_config):
    io = FaultyIO()
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    written = fill_until_roll(kit, log, small_config)
    end = log.end_offset
    fds = open_fds()
    io.write_fault = Fault("", errno.ENOSPC, sticky=True)  # the disk is full: every write fails
    try:
        with pytest.raises(StorageError):
            log.append(kit.batch(end, 3, width=600))
    finally:
        io.write_fault = None
    assert log.end_offset == end
    assert open_fds() == fds, "file descriptors leaked by the failed roll"
    assert not kit.store_path(d, end).exists() and not kit.index_path(d, end).exists()
    assert log.append(kit.batch(end, 3, width=600)) == end
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 3)])


# --------------------------------------------------------------------------------------- sync errors


@pytest.mark.parametrize("target", [".log", ".index", "dir"])
def test_sync_error_in_flush_does_not_advance_durable_offset(tmp_path, kit, small_config, target):
    io = FaultyIO()
    d = tmp_path / "log"
    fds = open_fds()
    log = Log.open(str(d), small_config, io=io)
    first = kit.append_batches(log, 5)
    log.flush()
    durable = log.durable_offset
    assert durable == log.end_offset
    more = kit.append_batches(log, 60)  # rolls segments: closed indexes and the directory need syncs
    end = log.end_offset
    assert len(log.segments) > 1
    if target == "dir":
        io.dir_sync_fault = errno.EIO
    else:
        io.sync_fault = Fault(target, errno.EIO)
    with pytest.raises(StorageError) as ei:
        log.flush()
    assert isinstance(ei.value.__cause__, OSError) and ei.value.__cause__.errno == errno.EIO
    assert log.durable_offset == durable, "a failed flush must not advance durable_offset"
    assert log.end_offset == end
    # The log refuses work until reopened: nothing may claim durability after a failed sync.
    with pytest.raises(LogClosedError):
        log.append(kit.batch(end, 1))
    with pytest.raises(LogClosedError):
        log.flush()
    assert log.durable_offset == durable
    log.close()
    assert open_fds() == fds, "close of a broken log still closes its files"
    # Reopening reads back what really is there (here: everything, the page cache kept it).
    reopen_plain(kit, d, small_config, first + more)


def test_flush_after_a_failed_fdatasync_does_not_claim_durability(tmp_path, kit, small_config):
    """fsyncgate: after fdatasync fails, Linux may drop the dirty pages and report success on the
    next call; a retried flush must not move durable_offset over data that may be gone."""
    io = FaultyIO()
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    kit.append_batches(log, 5)
    log.flush()
    durable = log.durable_offset
    kit.append_batches(log, 5)
    io.sync_fault = Fault(".log", errno.EIO)
    with pytest.raises(StorageError):
        log.flush()
    with pytest.raises(StorageError):  # the retry: the kernel would say nothing this time
        log.flush()
    assert log.durable_offset == durable
    log.close()


def test_sync_error_in_close_is_a_storage_error(tmp_path, kit, small_config):
    io = FaultyIO()
    log = Log.open(str(tmp_path / "log"), small_config, io=io)
    kit.append_batches(log, 5)
    io.sync_fault = Fault(".index", errno.EIO)
    try:
        with pytest.raises(StorageError):
            log.close()
    finally:
        log.close()  # the fault was one-shot: release the files either way


# --------------------------------------------------------------------------------------- split API


def execute(pending) -> None:
    run_ops(SyncFileIO(), pending.ops)


def test_prepare_complete_in_order(tmp_path, kit, small_config):
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    written = kit.append_batches(log, 5)
    end = log.end_offset
    pendings = []
    base = end
    for count in (1, 2, 3):
        p = log.prepare_append(kit.batch(base, count))
        assert p.base_offset == base
        pendings.append(p)
        base += count
    # Nothing is visible before its completion, even after its bytes are written.
    for p in pendings:
        execute(p)
    assert log.end_offset == end
    assert log.read(end, 4096).data == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(end + 1, 4096)
    for p, count in zip(pendings, (1, 2, 3), strict=True):
        log.complete_append(p)
        assert log.end_offset == p.base_offset + count
        kit.read_batch(log, p.base_offset, count)
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(
        [*written, (end, 1), (end + 1, 2), (end + 3, 3)]
    )
    log.close()


def test_pending_appends_hold_back_flush_and_close(tmp_path, kit, small_config):
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    kit.append_batches(log, 5)
    end = log.end_offset
    p = log.prepare_append(kit.batch(end, 2))
    execute(p)
    log.flush()
    assert log.durable_offset == end, "a pending append is not durable before it completes"
    with pytest.raises(StorageError):
        log.close()
    with pytest.raises(StorageError):
        log.truncate(0)
    log.complete_append(p)
    log.flush()
    assert log.durable_offset == end + 2
    log.close()


@pytest.mark.parametrize("written_before_abort", [0, 1, 3])
def test_abort_first_of_three(tmp_path, kit, small_config, written_before_abort):
    """abort_append(first) undoes all three, whatever part of their writes already ran."""
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=FaultyIO())  # sizes exact: no preallocation
    written = kit.append_batches(log, 5)
    end = log.end_offset
    store = active_store(log)
    size = store.stat().st_size
    pendings = []
    base = end
    for count in (1, 2, 3):
        pendings.append(log.prepare_append(kit.batch(base, count)))
        base += count
    for p in pendings[:written_before_abort]:
        execute(p)
    if written_before_abort:
        assert store.stat().st_size > size
    aborted = log.abort_append(pendings[0])
    assert aborted == pendings
    assert log.end_offset == end
    assert store.stat().st_size == size
    assert log.append(kit.batch(end, 4)) == end
    kit.read_batch(log, end, 4)
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 4)])


def test_abort_after_a_roll_removes_the_rolled_segment(tmp_path, kit, small_config):
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=FaultyIO())  # sizes exact: no preallocation
    written = kit.append_batches(log, 5)
    big = len(kit.batch(0, 3, width=600))
    while log.segments[-1].size + 2 * big <= small_config.segment_bytes:
        written += kit.append_batches(log, 1, counts=[1])
    assert log.segments[-1].size + big <= small_config.segment_bytes
    end = log.end_offset
    old = active_store(log)
    old_size = old.stat().st_size
    p1 = log.prepare_append(kit.batch(end, 3, width=600))
    p2 = log.prepare_append(kit.batch(end + 3, 3, width=600))  # does not fit: rolls
    p3 = log.prepare_append(kit.batch(end + 6, 1))
    assert p1.segment.base_offset < end < p2.segment.base_offset == end + 3
    assert p3.segment is p2.segment
    rolled = (kit.store_path(d, end + 3), kit.index_path(d, end + 3))
    assert all(f.exists() for f in rolled)
    for p in (p1, p2, p3):
        execute(p)
    assert log.abort_append(p1) == [p1, p2, p3]
    assert not any(f.exists() for f in rolled), "the rolled segment's files are gone"
    assert log.segments[-1].store_path == str(old)
    assert old.stat().st_size == old_size
    assert log.end_offset == end
    # The next append reuses p1's offset in the old segment; a later roll is based right.
    assert log.append(kit.batch(end, 3, width=600)) == end
    assert log.segments[-1].store_path == str(old)
    assert log.append(kit.batch(end + 3, 3, width=600)) == end + 3
    assert log.segments[-1].base_offset == end + 3
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 3), (end + 3, 3)])


def test_abort_after_earlier_appends_completed(tmp_path, kit, small_config):
    """p1 completes; p2's write fails half way; p2 and p3 are undone, p1 stays."""
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    written = kit.append_batches(log, 5)
    end = log.end_offset
    p1 = log.prepare_append(kit.batch(end, 1))
    p2 = log.prepare_append(kit.batch(end + 1, 2))
    p3 = log.prepare_append(kit.batch(end + 3, 3))
    execute(p1)
    log.complete_append(p1)
    op = p2.ops[0]
    assert isinstance(op, Write)
    os.pwrite(op.fd, b"".join(bytes(b) for b in op.buffers)[:20], op.offset)
    execute(p3)
    assert log.abort_append(p2) == [p2, p3]
    assert log.end_offset == end + 1
    assert active_store(log).stat().st_size == p2.position
    assert log.append(kit.batch(end + 1, 2)) == end + 1
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 1), (end + 1, 2)])


# --------------------------------------------------------------------------------------- bad input


@pytest.fixture
def filled(tmp_path, kit, small_config):
    """A log with a few batches, and a check that nothing about it changed."""
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    written = kit.append_batches(log, 8)
    store = active_store(log)
    state = (log.end_offset, log.size_bytes, store.stat().st_size)

    def untouched() -> None:
        assert (log.end_offset, log.size_bytes, store.stat().st_size) == state
        assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(written)
        end = log.end_offset
        assert log.append(kit.batch(end, 1)) == end  # and still appendable at the same offset
        kit.read_batch(log, end, 1)

    yield log, untouched
    log.close()


def test_batch_larger_than_max_batch_bytes(tmp_path, kit):
    config = LogConfig(segment_bytes=4096, max_batch_bytes=1000, retention_ms=None)
    log = Log.open(str(tmp_path / "log"), config)
    kit.append_batches(log, 3)
    end, size, on_disk = log.end_offset, log.size_bytes, active_store(log).stat().st_size
    # a record of a ~930-byte value: 2-byte length varints (record and value), attributes,
    # timestamp and offset deltas, null key, header count: 9 bytes of framing
    big = kit.batch(end, 1, width=1000 - HEADER_SIZE - 9 + 1)
    assert len(big) == 1001
    with pytest.raises(BatchTooLargeError):
        log.append(big)
    assert (log.end_offset, log.size_bytes, active_store(log).stat().st_size) == (end, size, on_disk)
    exact = kit.batch(end, 1, width=1000 - HEADER_SIZE - 9)
    assert len(exact) == 1000
    assert log.append(exact) == end
    log.close()


def flip(b: bytes, at: int) -> bytes:
    return b[:at] + bytes([b[at] ^ 0x10]) + b[at + 1 :]


BAD_BATCHES = {
    "crc_record_section": lambda b: flip(b, HEADER_SIZE + 5),
    "crc_header_field": lambda b: flip(b, 45),  # producer_id: covered by the crc
    "crc_field": lambda b: flip(b, 19),
    "magic": lambda b: b[:16] + b"\x01" + b[17:],
    "second_batch_truncated": lambda b: b + b[:-1],
    "second_batch_bad_crc": lambda b: b + flip(b, HEADER_SIZE + 5),
    "batch_plus_a_byte": lambda b: b + b"\x00",
    "empty": lambda b: b"",
    "length_prefix_only": lambda b: b[:12],
    "header_only": lambda b: b[:HEADER_SIZE],
    "one_byte_short": lambda b: b[:-1],
    "half": lambda b: b[: len(b) // 2],
    "record_count_zero": lambda b: b[:57] + bytes(4) + b[61:],
}


def forge_crc_suffix(data: bytes, target: int) -> bytes:
    """4 bytes X with crc32c(data + X) == target. For a fixed length the crc is affine in X over
    GF(2), so X comes out of a 32x32 linear system."""
    base = crc32c(data + bytes(4))
    cols = [crc32c(data + (1 << i).to_bytes(4, "little")) ^ base for i in range(32)]
    # Solve sum(x_i * cols[i]) == target ^ base by Gaussian elimination (rows are result bits).
    rows = [
        (sum(((cols[i] >> bit) & 1) << i for i in range(32)), ((target ^ base) >> bit) & 1)
        for bit in range(32)
    ]
    solution = 0
    pivots = []
    for col in range(32):
        pivot = next((r for r in range(len(pivots), 32) if (rows[r][0] >> col) & 1), None)
        if pivot is None:
            continue
        k = len(pivots)
        rows[k], rows[pivot] = rows[pivot], rows[k]
        for r in range(32):
            if r != k and (rows[r][0] >> col) & 1:
                rows[r] = (rows[r][0] ^ rows[k][0], rows[r][1] ^ rows[k][1])
        pivots.append(col)
    for k, col in enumerate(pivots):
        solution |= rows[k][1] << col
    suffix = solution.to_bytes(4, "little")
    assert crc32c(data + suffix) == target
    return suffix


def test_trailing_bytes_rejected_even_when_the_crc_matches(filled, kit):
    """Four trailing bytes chosen so that the crc over the whole buffer still matches: only the
    framing stops them (the broker would otherwise store 4 stray bytes after the batch)."""
    log, untouched = filled
    batch = kit.batch(log.end_offset, 3)
    stored_crc = int.from_bytes(batch[13:17], "big")
    trailer = forge_crc_suffix(batch[17:], stored_crc)
    with pytest.raises(InvalidBatchError):
        log.append(batch + trailer)
    untouched()


def test_several_batches_in_one_append(tmp_path, kit, small_config):
    """Whole batches back to back are one append: consecutive offsets, one write, all or nothing."""
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    written = kit.append_batches(log, 3)
    end = log.end_offset
    records = kit.batch(end, 3) + kit.batch(end + 3, 1) + kit.batch(end + 4, 2)
    assert log.append(records) == end
    assert log.end_offset == end + 6
    for base, count in ((end, 3), (end + 3, 1), (end + 4, 2)):
        kit.read_batch(log, base, count)
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 3), (end + 3, 1), (end + 4, 2)])


def test_one_oversized_batch_refuses_the_whole_append(filled, kit):
    log, untouched = filled
    end = log.end_offset
    big = kit.batch(end + 1, 1, width=4096)  # over max_batch_bytes of small_config
    with pytest.raises(BatchTooLargeError):
        log.append(kit.batch(end, 1) + big)
    untouched()


@pytest.mark.parametrize("bad", list(BAD_BATCHES))
def test_invalid_batch_rejected(filled, kit, bad):
    log, untouched = filled
    batch = BAD_BATCHES[bad](kit.batch(log.end_offset, 3))
    with pytest.raises(InvalidBatchError):
        log.append(batch)
    untouched()


def patch_with_crc(batch: bytes, at: int, value: bytes) -> bytes:
    """`batch` with `value` written at `at` and the crc recomputed: only the header is wrong."""
    raw = bytearray(batch)
    raw[at : at + len(value)] = value
    raw[17:21] = crc32c(bytes(raw[21:])).to_bytes(4, "big")
    return bytes(raw)


BAD_HEADERS = {  # (byte position, new bytes) in RecordBatch v2; the crc is made right again
    "compression_codec": (21, (5).to_bytes(2, "big")),
    "transactional": (21, (0x10).to_bytes(2, "big")),
    "control": (21, (0x20).to_bytes(2, "big")),
    "unknown_attribute_bit": (21, (0x40).to_bytes(2, "big")),
    "last_offset_delta": (23, (5).to_bytes(4, "big")),
    "max_before_first_timestamp": (35, (0).to_bytes(8, "big")),
    "record_count_zero": (57, (0).to_bytes(4, "big")),
    "record_count_too_big": (57, (4).to_bytes(4, "big")),
}


@pytest.mark.parametrize("bad", list(BAD_HEADERS))
def test_invalid_header_with_valid_crc_rejected(filled, kit, bad):
    log, untouched = filled
    at, value = BAD_HEADERS[bad]
    batch = patch_with_crc(kit.batch(log.end_offset, 3), at, value)
    with pytest.raises(InvalidBatchError):
        log.append(batch)
    untouched()


def test_read_offsets_out_of_range(filled):
    log, untouched = filled
    end = log.end_offset
    for off in (-1, -(1 << 62), end + 1, end + 1000):
        with pytest.raises(OffsetOutOfRangeError):
            log.read(off, 4096)
    r = log.read(end, 4096)
    assert (r.data, r.first_offset, r.next_offset, r.error) == (b"", end, end, None)
    for max_bytes in (0, -1):
        with pytest.raises(ValueError):
            log.read(0, max_bytes)
    # max_bytes smaller than a batch still returns one whole batch.
    r = log.read(0, 1)
    assert r.data and r.next_offset > 0 and r.error is None
    untouched()


def test_truncate_out_of_range(filled, kit):
    log, untouched = filled
    end = log.end_offset
    for off in (-1, end + 1):
        with pytest.raises(OffsetOutOfRangeError):
            log.truncate(off)
    untouched()


def test_truncate_below_start_after_retention(tmp_path, kit):
    clock = kit.FakeClock()
    config = LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=1000)
    log = Log.open(str(tmp_path / "log"), config, clock=clock)
    kit.append_batches(log, 80, clock=clock)
    clock.advance(10_000)
    assert log.apply_retention() > 0
    start = log.start_offset
    assert start > 0
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate(start - 1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(start - 1, 4096)
    assert log.truncate(start) == start
    assert log.end_offset == start
    assert log.append(kit.batch(start, 2)) == start
    log.close()


@pytest.mark.parametrize(
    "config",
    [
        LogConfig(segment_bytes=0),
        LogConfig(segment_bytes=-1),
        LogConfig(segment_bytes=SEGMENT_BYTES_MAX + 1),
        LogConfig(segment_bytes=4096, max_batch_bytes=0),
        LogConfig(segment_bytes=4096, max_batch_bytes=4097),
        LogConfig(retention_ms=-1),
        LogConfig(retention_bytes=-1),
        LogConfig(segment_ms=-1),
    ],
    ids=str,
)
def test_invalid_config_rejected(tmp_path, config):
    d = tmp_path / "log"
    with pytest.raises(ValueError, match="invalid log config"):
        Log.open(str(d), config)
    assert not d.exists() or not os.listdir(d)


def test_closed_log_refuses_everything(tmp_path, kit, small_config):
    log = Log.open(str(tmp_path / "log"), small_config)
    kit.append_batches(log, 3)
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogClosedError):
        log.append(kit.batch(0, 1))
    with pytest.raises(LogClosedError):
        log.read(0, 4096)
    with pytest.raises(LogClosedError):
        log.flush()
    with pytest.raises(LogClosedError):
        log.truncate(0)


def test_a_new_logs_first_flush_syncs_the_directories_made_for_it(tmp_path) -> None:
    """A partition made on first use creates its directory and the topic's: the first flush must
    make their names durable too, or a power loss could drop the acks=2 data with the directory."""
    from broker.storage.fileio import SyncDir
    from broker.storage.log import Log, LogConfig
    from ringlog_proto.batch import Record, encode_batch

    (tmp_path / "topics").mkdir()
    directory = tmp_path / "topics" / "7" / "0"
    log = Log.open(str(directory), LogConfig())
    log.append(encode_batch([Record(b"x")]))
    plan = log.prepare_flush()
    synced = [op.path for op in plan.ops if isinstance(op, SyncDir)]
    assert synced == [str(directory), str(tmp_path / "topics" / "7"), str(tmp_path / "topics")]
    log.abandon()
    log = Log.open(str(directory), LogConfig())  # existing directory: nothing more to sync above it
    log.append(encode_batch([Record(b"y")]))
    assert not [op for op in log.prepare_flush().ops if isinstance(op, SyncDir)]
    log.abandon()


# ------------------------------------------------------------------------- through the partition


def test_a_partition_opens_its_log_with_the_file_io_it_is_given(tmp_path: Path) -> None:
    """The faulty disk reaches the partition, not only a log opened by hand: a failed fsync of
    its log refuses the partition's next produce (a log that failed a sync stands behind no
    write, not even a retry's) until it is reopened."""
    from broker.core.partition import Partition, PendingProduce
    from broker.storage.diskspace import DiskSpace
    from ringlog_proto.batch import encode_batch

    io = FaultyIO()
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig(), io=io)
    assert p.log.io is io
    produced = p.produce(encode_batch([b"v"]), DiskSpace(str(tmp_path), 0))
    assert isinstance(produced, PendingProduce)
    run_ops(io, produced.pending.ops)
    produced.complete()
    io.sync_fault = Fault(".log", errno.EIO)
    with pytest.raises(StorageError):
        p.log.flush()
    with pytest.raises(LogClosedError):
        p.produce(encode_batch([b"w"]), DiskSpace(str(tmp_path), 0))
    p.close()
