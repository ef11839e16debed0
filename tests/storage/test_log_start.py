"""The log start moved by `Log.delete_records` (Kafka's DeleteRecords), on real files: inside a
segment it is recorded durably and kept across reopening, segments wholly below it are deleted
(also when a crash came between the two), nothing below it is read again, and the marks keep
their order through truncation, a recorded start past a lost tail, retention and time lookups."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.storage import log_start
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.layout import log_start_path
from broker.storage.log import Log, LogConfig


def built(kit, directory: Path, config: LogConfig, n: int = 120) -> Log:
    log = Log.open(str(directory), config)
    kit.append_batches(log, n)
    assert len(log.segments) >= 4
    return log


def inside(log: Log, k: int) -> int:
    """An offset strictly inside segment `k` (not its base)."""
    seg = log.segments[k]
    assert seg.next_offset - seg.base_offset >= 3
    return seg.base_offset + 2


def test_inside_a_segment_is_recorded_and_kept_and_nothing_below_is_read(tmp_path, kit, small_config) -> None:
    log = built(kit, tmp_path, small_config)
    end = log.end_offset
    target = inside(log, 2)
    bases_before = [s.base_offset for s in log.segments]
    assert log.delete_records(target) == target
    assert log.start_offset == target
    assert [s.base_offset for s in log.segments] == bases_before[2:]  # wholly below: gone
    assert kit.segment_bases(tmp_path) == bases_before[2:]
    assert log_start.read(str(tmp_path)) == target
    with pytest.raises(OffsetOutOfRangeError):
        log.read(target - 1, 100)
    assert kit.read_all(log)[0] == target
    assert log.delete_records(target - 1) == target  # never back, no error
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(end + 1)
    log.close()
    again = Log.open(str(tmp_path), small_config)
    try:
        assert (again.start_offset, again.end_offset) == (target, end)
        assert kit.read_all(again) == list(range(target, end))
        kit.append_batches(again, 3)  # appends go on as before
        assert again.end_offset > end
    finally:
        again.close()


def test_at_a_segment_boundary_no_file_is_needed(tmp_path, kit, small_config) -> None:
    log = built(kit, tmp_path, small_config)
    base = log.segments[2].base_offset
    assert log.delete_records(base) == base
    assert not Path(log_start_path(str(tmp_path))).exists()
    assert log.segments[0].base_offset == base
    log.close()


def test_up_to_the_end_keeps_the_active_segment(tmp_path, kit, small_config) -> None:
    log = built(kit, tmp_path, small_config)
    end = log.end_offset
    assert log.delete_records(end) == end
    assert len(log.segments) == 1 and log.start_offset == end
    assert log.read(end, 100).data == b""
    assert log.durable_offset >= end
    log.close()
    again = Log.open(str(tmp_path), small_config)
    assert (again.start_offset, again.end_offset) == (end, end)
    again.close()


def test_the_active_segment_passed_by_the_start_goes_at_its_roll(tmp_path, kit, small_config) -> None:
    log = built(kit, tmp_path, small_config)
    end = log.end_offset
    active = log.segments[-1].base_offset
    assert log.delete_records(end) == end
    assert [s.base_offset for s in log.segments] == [active]  # active: kept
    assert log.append(kit.batch(end, 1, width=4000)) == end  # fits no segment but an empty one: a roll
    # the roll closed it, wholly below the start: deleted then, not at the next restart
    assert [s.base_offset for s in log.segments] == [end]
    assert kit.segment_bases(tmp_path) == [end]
    assert log.start_offset == end and kit.read_all(log)[0] == end
    log.close()
    again = Log.open(str(tmp_path), small_config)
    try:
        assert [s.base_offset for s in again.segments] == [end]
        assert again.start_offset == end
    finally:
        again.close()


def test_a_crash_between_recording_and_deleting_deletes_at_open(tmp_path, kit, small_config) -> None:
    log = built(kit, tmp_path, small_config)
    target = inside(log, 3)
    bases = [s.base_offset for s in log.segments]
    log.close()
    log_start.write(str(tmp_path), target)  # recorded, segments not yet deleted
    again = Log.open(str(tmp_path), small_config)
    try:
        assert again.start_offset == target
        assert kit.segment_bases(tmp_path) == bases[3:]
        assert kit.read_all(again)[0] == target
    finally:
        again.close()


def test_a_recorded_start_past_a_lost_tail_starts_over_there(tmp_path, kit, small_config) -> None:
    log = built(kit, tmp_path, small_config)
    end = log.end_offset
    log.close()
    log_start.write(str(tmp_path), end + 10)  # the tail it was recorded in was lost
    again = Log.open(str(tmp_path), small_config)
    try:
        assert (again.start_offset, again.end_offset) == (end + 10, end + 10)
        kit.append_batches(again, 2)
        assert again.start_offset == end + 10
    finally:
        again.close()


@pytest.mark.parametrize("doc", ['{"log_start_offset": -3}', "[1]", "not json"])
def test_a_damaged_record_is_ignored(tmp_path, kit, small_config, doc: str) -> None:
    log = built(kit, tmp_path, small_config)
    start = log.start_offset
    log.close()
    Path(log_start_path(str(tmp_path))).write_text(doc)
    again = Log.open(str(tmp_path), small_config)
    assert again.start_offset == start
    again.close()


def test_truncating_below_the_start_starts_over_at_it(tmp_path, kit, small_config) -> None:
    log = Log.open(str(tmp_path), small_config)
    kit.append_batches(log, 3, counts=(5,))  # batches [0,5) [5,10) [10,15)
    assert log.delete_records(7) == 7  # inside the second batch
    assert log.truncate(8) == 7  # the batch holding the start is cut: empty, at the start
    assert (log.start_offset, log.end_offset) == (7, 7)
    kit.append_batches(log, 1, counts=(2,))
    assert kit.read_all(log) == [7, 8]
    log.close()


def test_a_time_below_the_start_finds_the_start(tmp_path, kit, small_config) -> None:
    log = Log.open(str(tmp_path), small_config)
    kit.append_batches(log, 3, counts=(5,))
    log.delete_records(7)
    found = log.timestamp_and_offset(0)
    assert found is not None and found.offset == 7
    log.close()


def test_retention_after_a_deletion(tmp_path, kit) -> None:
    clock = kit.FakeClock()
    config = LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=1000)
    log = Log.open(str(tmp_path), config, clock=clock)
    kit.append_batches(log, 120, clock=clock)
    target = inside(log, 1)
    log.delete_records(target)
    clock.advance(5000)
    assert log.apply_retention() > 0
    assert log.start_offset == log.segments[0].base_offset > target
    log.close()
