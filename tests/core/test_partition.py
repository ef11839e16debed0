"""Partition.produce, the one door to a partition's log and producer state, with I/O run by the test."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import pytest

from broker.core.partition import Partition, PendingProduce, Stored
from broker.core.producer_state import (
    FencedEpochError,
    RetryInFlightError,
    SequenceError,
    UnknownProducerError,
)
from broker.storage.diskspace import DiskSpace
from broker.storage.errors import OutOfSpaceError
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import LogConfig
from ringlog_proto.batch import encode_batch

IO = SyncFileIO()


def batch(seq: int, n: int = 1, pid: int = 4, epoch: int = 0) -> bytes:
    return encode_batch([b"v"] * n, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def written(p: Partition, records: bytes, space: DiskSpace) -> Stored:
    produced = p.produce(records, space)
    assert isinstance(produced, PendingProduce)
    run_ops(IO, produced.pending.ops)
    produced.complete()
    return produced.stored()


@pytest.fixture
def space(tmp_path: Path) -> DiskSpace:
    return DiskSpace(str(tmp_path), 0)


@pytest.fixture
def partition(tmp_path: Path):
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    yield p
    p.close()


def test_a_produce_is_visible_and_remembered_only_once_complete(
    partition: Partition, space: DiskSpace
) -> None:
    woken = []
    partition.waiters.append(lambda: woken.append(1))
    produced = partition.produce(batch(0, 2), space)
    assert isinstance(produced, PendingProduce)
    assert partition.log.end_offset == 0 and not woken
    with pytest.raises(RetryInFlightError):
        partition.produce(batch(0, 2), space)
    run_ops(IO, produced.pending.ops)
    before = produced.stored()
    produced.complete()
    assert produced.stored() == before == Stored(0, 2, 0, False)
    assert woken == [1]
    assert partition.produce(batch(0, 2), space) == Stored(0, 2, 0, False), "a retry: nothing written"
    partition.log.flush()
    assert partition.produce(batch(0, 2), space) == Stored(0, 2, 0, True)


def test_a_failed_append_frees_its_sequences(partition: Partition, space: DiskSpace) -> None:
    written(partition, batch(0), space)
    produced = partition.produce(batch(1), space)
    assert isinstance(produced, PendingProduce)
    partition.log.abort_append(produced.pending)
    produced.fail()
    with pytest.raises(SequenceError):
        partition.produce(batch(2), space)
    assert written(partition, batch(1), space).base_offset == 1


def test_a_full_disk_refuses_new_batches_but_answers_retries(partition: Partition, space: DiskSpace) -> None:
    written(partition, batch(0), space)
    space.saw_full(OSError(errno.ENOSPC, "No space left on device"))
    assert partition.produce(batch(0), space) == Stored(0, 1, 0, False)
    with pytest.raises(OutOfSpaceError):
        partition.produce(batch(1), space)
    assert partition.log.end_offset == 1


def test_producer_state_survives_a_reopen(tmp_path: Path, space: DiskSpace) -> None:
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    written(p, batch(0, 3), space)
    written(p, batch(3), space)
    p.close()
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    try:
        assert p.produce(batch(0, 3), space) == Stored(0, 3, 0, True)
        assert written(p, batch(4), space).base_offset == 4
    finally:
        p.close()


def test_retention_takes_the_producer_state_its_segments_held(tmp_path: Path, space: DiskSpace) -> None:
    """PROTOCOL §4.7: producer state lives as long as the batches carrying it, without a restart."""
    p = Partition(
        1, 0, str(tmp_path / "p"), LogConfig(segment_bytes=4096, max_batch_bytes=1024, retention_bytes=1)
    )
    try:
        written(p, batch(0, 2, pid=4), space)  # producer 4 only in the first segment
        for seq in range(200):  # producer 5 fills more segments
            written(p, batch(seq, 1, pid=5), space)
        assert len(p.log.segments) > 2
        assert p.producers.producer(4) == (0, 1)
        assert isinstance(p.produce(batch(0, 2, pid=4), space), Stored), "a retry while it is stored"
        assert p.apply_retention() > 0
        assert p.log.start_offset > 1  # producer 4's batch is gone
        assert p.producers.producer(4) is None
        assert p.producers.producer(5) == (0, 199), "the active segment keeps producer 5's latest"
        with pytest.raises(UnknownProducerError):  # Kafka: UNKNOWN_PRODUCER_ID, the client starts over
            p.produce(batch(2, 1, pid=4), space)
        stored = written(p, batch(0, 2, pid=4), space)  # new again: appended, not a retry
        assert stored.base_offset == p.log.end_offset - 2
    finally:
        p.close()


def test_a_bumped_epoch_starts_at_sequence_zero_and_fences_the_old(
    partition: Partition, space: DiskSpace
) -> None:
    """What an InitProducerId epoch bump relies on: the partition needs no word from the bump."""
    written(partition, batch(0, 2, epoch=0), space)
    with pytest.raises(SequenceError) as gap:
        partition.produce(batch(1, epoch=1), space)  # a new epoch starts at 0
    assert not isinstance(gap.value, UnknownProducerError), "the producer is known: a plain gap"
    assert written(partition, batch(0, epoch=1), space).base_offset == 2
    with pytest.raises(FencedEpochError):
        partition.produce(batch(2, epoch=0), space)
    with pytest.raises(UnknownProducerError):
        partition.produce(batch(3, pid=99), space)  # never seen here, not at sequence 0


def test_an_idle_producer_expires_from_its_last_write_also_after_a_reopen(
    tmp_path: Path, space: DiskSpace
) -> None:
    """--producer-id-expiration-ms: a producer idle that long since its last write (the append's
    time, in the broker's clock) is forgotten; reopened, the partition dates each producer's last
    write by the segment holding its last batch (its index keeps the append time)."""
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    written(p, batch(0, pid=4), space)
    first_write = p.log.segments[-1].last_append_ms  # the append's time: producer 4's last write
    assert first_write is not None
    time.sleep(0.002)  # the next append a millisecond later at least
    written(p, batch(0, pid=5), space)
    last_write = p.log.segments[-1].last_append_ms
    assert last_write is not None and last_write >= first_write
    assert p.expire_producers(first_write + 999, 1000) == 0
    assert p.producers.producer(4) == (0, 0)
    if last_write > first_write:  # the two appends fell in different milliseconds
        assert p.expire_producers(last_write + 999, 1000) == 1
        assert p.producers.producer(4) is None and p.producers.producer(5) == (0, 0)
        written(p, batch(0, pid=4), space)  # producer 4 again, from 0
    written(p, batch(1, pid=5), space)  # producer 5 writes again: idle from now on
    p.close()
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    try:
        assert p.producers.producer(4) == (0, 0) and p.producers.producer(5) == (0, 1)
        reopened_write = p.log.written_by_ms(0)
        assert reopened_write is not None and reopened_write >= last_write
        assert p.expire_producers(reopened_write + 1000, 1000) == 2
        with pytest.raises(UnknownProducerError):
            p.produce(batch(1, pid=4), space)
        end = p.log.end_offset
        assert written(p, batch(0, pid=4), space).base_offset == end, "started over at 0: stored"
    finally:
        p.close()
