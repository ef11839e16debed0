"""Store files preallocated ahead of their appends (broker/storage/preallocation.py): the
file is longer than its batches while a segment is active, exactly its batches once it rolls or
the log closes, and a killed process's preallocated zeros are released at the next open without
being taken for damage (by recovery or by `broker dump`)."""

from __future__ import annotations

import errno
import logging
import os

import pytest
from conftest import FakeClock
from test_faults import FaultyIO

from broker.cli import main
from broker.storage.errors import StorageError
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import Log, LogConfig
from broker.storage.log_config import PREALLOCATE_BYTES, PREALLOCATE_BYTES_MAX
from broker.storage.preallocation import PREALLOCATE_RAMP_MS
from ringlog_proto.batch import encode_batch

CONFIG = LogConfig(segment_bytes=4 * PREALLOCATE_BYTES, max_batch_bytes=64 * 1024, retention_ms=None)


def store_of(log: Log):
    return log.segments[-1].store_path


def test_the_active_store_is_preallocated_and_closes_to_its_batches(tmp_path, kit):
    log = Log.open(str(tmp_path / "log"), CONFIG)
    written = kit.append_batches(log, 20)
    log.flush()
    data = log.segments[-1].size
    path = store_of(log)
    assert data < os.stat(path).st_size <= data + PREALLOCATE_BYTES, "a step ahead of the appends"
    assert kit.read_all(log, max_bytes=1 << 20) == kit.expected_offsets(written)
    log.close()
    assert os.stat(path).st_size == data, "a closed segment is exactly its batches"
    reopened = Log.open(str(tmp_path / "log"), CONFIG)
    assert reopened.end_offset == written[-1][0] + written[-1][1]
    reopened.close()


def test_a_rolled_segment_gives_its_preallocation_back(tmp_path, kit):
    config = LogConfig(segment_bytes=64 * 1024, max_batch_bytes=8 * 1024, retention_ms=None)
    log = Log.open(str(tmp_path / "log"), config)
    kit.append_batches(log, 1500, counts=[4])
    assert len(log.segments) >= 3
    for seg in log.segments[:-1]:
        assert os.stat(seg.store_path).st_size == seg.size
    active = log.segments[-1]
    assert os.stat(active.store_path).st_size == config.segment_bytes, "never past the segment size"
    log.close()


def test_a_killed_process_leaves_zeros_that_recovery_releases_quietly(tmp_path, kit, caplog):
    d = tmp_path / "log"
    log = Log.open(str(d), CONFIG)
    written = kit.append_batches(log, 30)
    log.flush()
    data = log.segments[-1].size
    path = store_of(log)
    kit.crash(log)
    assert os.stat(path).st_size > data
    # `broker dump` sees the zeros as preallocated space, not damage.
    assert main(["dump", str(d)]) == 0
    with caplog.at_level(logging.INFO, logger="broker.storage.segment"):
        log = Log.open(str(d), CONFIG)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("preallocated" in r.getMessage() for r in caplog.records)
    end = written[-1][0] + written[-1][1]
    assert log.end_offset == end
    assert os.stat(path).st_size == data, "the zeros are cut"
    assert kit.read_all(log, max_bytes=1 << 20) == kit.expected_offsets(written)
    assert log.append(kit.batch(end, 2)) == end, "appends continue at the next offset"
    log.close()


def test_a_torn_batch_before_the_zeros_is_still_damage(tmp_path, kit, caplog):
    """Preallocation must not hide a torn write: bytes of a batch before the zeros are cut with a
    warning, as without it."""
    d = tmp_path / "log"
    log = Log.open(str(d), CONFIG)
    written = kit.append_batches(log, 10)
    data = log.segments[-1].size
    path = store_of(log)
    kit.crash(log)
    with open(path, "r+b") as f:  # half a batch header where the next batch would start
        f.seek(data)
        f.write(b"\x00" * 8 + b"\x00\x00\x01\x00")
    assert main(["dump", str(d)]) == 1
    with caplog.at_level(logging.INFO, logger="broker.storage.segment"):
        log = Log.open(str(d), CONFIG)
    assert any(r.levelno == logging.WARNING and "cut" in r.getMessage() for r in caplog.records)
    assert log.end_offset == written[-1][0] + written[-1][1]
    assert os.stat(path).st_size == data
    log.close()


def test_appends_go_on_where_the_file_system_cannot_preallocate(tmp_path, kit):
    """A full disk (or a file system without fallocate) at preallocation: appends still write and
    grow the file as before; only the write itself can fail an append."""
    for error in (errno.ENOSPC, errno.EOPNOTSUPP):
        io = FaultyIO()
        io.allocate_error = error
        d = tmp_path / f"log-{error}"
        log = Log.open(str(d), CONFIG, io=io)
        written = kit.append_batches(log, 10)
        assert os.stat(store_of(log)).st_size == log.segments[-1].size
        assert kit.read_all(log, max_bytes=1 << 20) == kit.expected_offsets(written)
        log.close()


def test_the_step_doubles_while_appends_use_it_up_quickly_and_starts_over_after_a_pause(tmp_path):
    """One fallocate per MiB costs an ingesting core ~3%: a log whose appends use each step up in
    under PREALLOCATE_RAMP_MS takes twice the last, up to PREALLOCATE_BYTES_MAX; after a pause it
    is back to PREALLOCATE_BYTES (the disk held ahead of a slow partition stays small)."""
    clock = FakeClock()
    config = LogConfig(segment_bytes=8 * PREALLOCATE_BYTES_MAX, max_batch_bytes=1 << 20, retention_ms=None)
    log = Log.open(str(tmp_path / "log"), config, clock=clock)
    value = os.urandom(512 * 1024)
    steps = []
    for _ in range(40):
        before = log.segments[-1].allocated
        log.append(encode_batch([value]))
        after = log.segments[-1].allocated
        if after != before:
            steps.append(after - log.segments[-1].size)  # what is held ahead of the data
        clock.advance(PREALLOCATE_RAMP_MS // 10)
    doublings = (PREALLOCATE_BYTES_MAX // PREALLOCATE_BYTES).bit_length()  # 64 KiB .. 8 MiB: 8 steps
    ramp = [PREALLOCATE_BYTES * 2**i for i in range(doublings)]  # 5 MiB/s: every step used up fast
    assert ramp[-1] == PREALLOCATE_BYTES_MAX
    assert steps[: len(ramp)] == ramp
    assert steps[len(ramp) :] == [PREALLOCATE_BYTES_MAX] * (len(steps) - len(ramp)) and len(steps) > len(ramp)
    clock.advance(PREALLOCATE_RAMP_MS)
    while log.segments[-1].allocated - log.segments[-1].size > len(value) + 100:
        log.append(encode_batch([value]))  # use up what the last step holds, quickly
    clock.advance(PREALLOCATE_RAMP_MS * PREALLOCATE_BYTES_MAX // PREALLOCATE_BYTES)  # then a pause
    log.append(encode_batch([value]))
    assert log.segments[-1].allocated - log.segments[-1].size == PREALLOCATE_BYTES
    log.append(encode_batch([value]))  # at once: 512 KiB past the step in no time is a stream again
    assert log.segments[-1].allocated - log.segments[-1].size == 2 * PREALLOCATE_BYTES
    log.close()
    assert os.stat(log.segments[-1].store_path).st_size == log.segments[-1].size


def test_a_discarded_log_syncs_nothing_and_refuses_with_appends_in_flight(tmp_path, kit):
    """`Log.discard` (a deleted topic's partition): the files close without a write-back or a
    sync; with an append prepared and not completed it raises, as `close` does."""
    log = Log.open(str(tmp_path / "log"), CONFIG, SyncFileIO())  # its own: its fdatasync is replaced
    kit.append_batches(log, 5)
    pending = log.prepare_append(kit.batch(log.next_offset, 2))
    with pytest.raises(StorageError, match="in flight"):
        log.discard()
    run_ops(log.io, pending.ops)
    log.complete_append(pending)
    synced = []
    log.io.fdatasync = synced.append  # type: ignore[method-assign]
    log.discard()
    assert synced == []
    log.discard()  # idempotent
    with pytest.raises(StorageError):
        log.prepare_append(kit.batch(log.next_offset, 1))


def test_a_first_write_holds_64_kib_ahead_and_a_slow_partition_stays_there(tmp_path):
    """Every partition touched once holds its first step: 64 KiB, so 100 000 touched partitions
    hold ~6 GiB of fallocate, not the ~98 GiB a MiB each held. A partition appending under
    PREALLOCATE_BYTES per PREALLOCATE_RAMP_MS never ramps: its steps stay the first."""
    assert PREALLOCATE_BYTES == 64 << 10
    assert 100_000 * PREALLOCATE_BYTES <= 6.2 * (1 << 30)
    clock = FakeClock()
    config = LogConfig(segment_bytes=64 * PREALLOCATE_BYTES, max_batch_bytes=1 << 20, retention_ms=None)
    log = Log.open(str(tmp_path / "log"), config, clock=clock)
    log.append(encode_batch([b"x" * 100]))
    seg = log.segments[-1]
    assert seg.allocated == seg.size + PREALLOCATE_BYTES
    assert os.stat(seg.store_path).st_size == seg.allocated
    value = os.urandom(16 * 1024)
    held = set()
    for _ in range(40):  # 16 KiB every 300 ms: ~53 KiB/s, a step lasting over PREALLOCATE_RAMP_MS
        clock.advance(PREALLOCATE_RAMP_MS * 3 // 10)
        before = seg.allocated
        log.append(encode_batch([value]))
        if seg.allocated != before:
            held.add(seg.allocated - seg.size)
    assert held == {PREALLOCATE_BYTES}
    log.close()


def ahead(log: Log) -> int:
    return log.segments[-1].allocated - log.segments[-1].size


def test_a_partition_holds_one_to_two_seconds_of_its_appends_ahead(tmp_path):
    """The step follows the rate: doubled while one lasts under PREALLOCATE_RAMP_MS, kept while it
    lasts up to twice that (no step taken and dropped at every small change of rate), cut to that
    long of appends past twice it. A partition among 1000 taking 300 KiB/s made five fallocates a
    second with a 64 KiB step; now it makes under one, holding under twice its second ahead."""
    clock = FakeClock()
    config = LogConfig(segment_bytes=64 * PREALLOCATE_BYTES_MAX, max_batch_bytes=1 << 20, retention_ms=None)
    log = Log.open(str(tmp_path / "log"), config, clock=clock)
    log.append(encode_batch([b"x"]))
    assert ahead(log) == PREALLOCATE_BYTES
    # The first step used up in a bit less than PREALLOCATE_RAMP_MS: the next is twice.
    clock.advance(PREALLOCATE_RAMP_MS - 1)
    log.append(encode_batch([os.urandom(PREALLOCATE_BYTES)]))
    assert ahead(log) == 2 * PREALLOCATE_BYTES
    # Twice that used up in a bit more than PREALLOCATE_RAMP_MS: kept.
    clock.advance(PREALLOCATE_RAMP_MS + 1)
    log.append(encode_batch([os.urandom(2 * PREALLOCATE_BYTES)]))
    assert ahead(log) == 2 * PREALLOCATE_BYTES
    # ... and in three times as long: cut to what that rate takes in PREALLOCATE_RAMP_MS.
    clock.advance(3 * PREALLOCATE_RAMP_MS)
    log.append(encode_batch([os.urandom(2 * PREALLOCATE_BYTES)]))
    assert ahead(log) == PREALLOCATE_BYTES
    # A steady 300 KiB/s in 30 KiB appends: the step settles between one and two seconds of them.
    value = os.urandom(30 * 1024)
    steps = []
    for _ in range(300):  # 30 s
        clock.advance(PREALLOCATE_RAMP_MS // 10)
        before = log.segments[-1].allocated
        log.append(encode_batch([value]))
        if log.segments[-1].allocated != before:
            steps.append(ahead(log))
    rate = 300 * 1024 * PREALLOCATE_RAMP_MS // 1000
    assert steps[-1] == 512 * 1024 and rate <= steps[-1] < 2 * rate, steps
    assert len(steps) <= 30 // 1.5 + 4, f"{len(steps)} fallocates in 30 s: {steps}"
    log.close()
