"""ENOSPC on the storage engine's own writes: recovery's index rewrite, the
index writes of a flush and of a close. None of them may make a partition unusable: the index is a
cache of the store, so a write the disk refuses is retried later or rebuilt at the next open. A
failed sync still makes the log refuse work (fsyncgate; tests/storage/test_faults.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from integration.test_disk_full import fill, free_bytes, small_disk  # noqa: F401 - a fixture
from storage.test_faults import Fault, FaultyIO, active_store, reopen_plain

from broker.storage.diskspace import DiskSpace, is_out_of_space
from broker.storage.errors import LogClosedError, OutOfSpaceError, StorageError
from broker.storage.fileio import WriteError
from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import encode_batch


def crash(log: Log) -> None:
    """Drop the log as a killed process would: no flush, no index writes, files just closed."""
    for seg in log.segments:
        log.io.close(seg.store_fd)
        log.io.close(seg.index_fd)


def test_recovery_on_a_full_disk_opens_and_serves(
    tmp_path: Path, kit, small_config, caplog: pytest.LogCaptureFixture
) -> None:
    """After a crash the index lacks entries; recovery adds them, and when the disk refuses the
    write the log opens anyway, serves every batch, and writes the entries once there is room."""
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    written = kit.append_batches(log, 8)
    crash(log)
    io = FaultyIO()
    io.write_fault = Fault(".index", errno.ENOSPC, partial=10, sticky=True)
    log = Log.open(str(d), small_config, io=io)
    assert "no space to rewrite the index" in caplog.text
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(written)
    io.write_fault = None  # space is back
    end = log.end_offset
    assert log.append(kit.batch(end, 2)) == end
    log.flush()
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 2)])


def test_clean_reopen_writes_nothing(tmp_path: Path, kit, small_config) -> None:
    """A log closed cleanly opens on a disk that refuses every write."""
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    written = kit.append_batches(log, 30)
    log.close()
    io = FaultyIO()
    io.write_fault = Fault("", errno.ENOSPC, sticky=True)
    log = Log.open(str(d), small_config, io=io)
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(written)
    log.close()  # nothing to write: no error
    reopen_plain(kit, d, small_config, written)


def test_enospc_on_the_index_write_of_a_flush_keeps_the_log_usable(tmp_path: Path, kit, small_config) -> None:
    io = FaultyIO()
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    written = kit.append_batches(log, 60)  # rolled segments: the flush writes their indexes
    durable = log.durable_offset
    io.write_fault = Fault(".index", errno.ENOSPC, partial=5)
    with pytest.raises(StorageError) as ei:
        log.flush()
    assert isinstance(ei.value.__cause__, WriteError) and is_out_of_space(ei.value)
    assert log.durable_offset == durable
    end = log.end_offset
    assert log.append(kit.batch(end, 1)) == end  # still usable
    log.flush()
    assert log.durable_offset == log.end_offset
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets([*written, (end, 1)])
    log.close()
    reopen_plain(kit, d, small_config, [*written, (end, 1)])


def test_close_on_a_full_disk_closes_every_file(tmp_path: Path, kit, small_config) -> None:
    io = FaultyIO()
    d = tmp_path / "log"
    log = Log.open(str(d), small_config, io=io)
    written = kit.append_batches(log, 60)
    log.flush()
    written += kit.append_batches(log, 3)
    assert Path(active_store(log)).exists()
    io.write_fault = Fault(".index", errno.ENOSPC, sticky=True)
    with pytest.raises(StorageError):
        log.close()  # the flush's index write fails; the files are closed all the same
    for seg in log.segments:  # closed: no descriptor left, none opened again for a closed segment
        with pytest.raises((OSError, LogClosedError)):
            io.size(seg.store_fd)
    reopen_plain(kit, d, small_config, written)


def test_disk_space_refuses_below_the_floor_and_after_enospc(tmp_path: Path) -> None:
    now = [0.0]
    space = DiskSpace(str(tmp_path), 0, clock=lambda: now[0])
    space.check_writable()
    assert space.free_bytes is not None and space.free_bytes > 0
    space.saw_full(WriteError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OutOfSpaceError, match="No space left on device"):
        space.check_writable()
    now[0] += 2  # the next statvfs finds room: taken again
    space.check_writable()
    huge = DiskSpace(str(tmp_path), 1 << 62, clock=lambda: now[0])
    with pytest.raises(OutOfSpaceError, match="--min-free-bytes"):
        huge.check_writable()


def test_a_preallocation_the_disk_refuses_gives_back_what_it_got(small_disk: Path) -> None:  # noqa: F811
    """ext4 keeps the blocks a failed fallocate did get, and the file size it reached (a
    partition's step of 8 MiB, taken as space came back, left the disk full of its
    zeros, and every other core's writes were refused until a restart). A log appending fast
    on a real small ext4 never holds more file than it counts as allocated."""
    config = LogConfig(segment_bytes=64 << 20, max_batch_bytes=2 << 20, retention_ms=None)
    log = Log.open(str(small_disk / "log"), config)
    fill(small_disk / "filler", leave=6 << 20)
    value = b"v" * (700 * 1024)
    refused = False
    for _ in range(12):  # fast appends: the preallocation step doubles toward 8 MiB
        try:
            log.append(encode_batch([value]))
        except StorageError as exc:
            assert is_out_of_space(exc)
            refused = True
            break
        seg = log.segments[-1]
        held = os.fstat(seg.store_fd).st_size
        assert held <= max(seg.allocated, seg.size), f"{held} bytes in the file, {seg.allocated} counted"
    assert refused, "the disk never filled"
    assert free_bytes(small_disk) < 1 << 20  # filled by records, not by preallocated zeros
    log.close()
