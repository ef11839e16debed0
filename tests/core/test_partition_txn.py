"""Transactions in a partition: markers through `write_marker`, the last stable offset, the aborted
list and read_committed reads through the one read door, on one node and on a leader and its
follower, and what truncation, retention and a restart after kill -9 leave of them (Kafka's
UnifiedLog and ProducerStateManager are the yardstick). Transactional batches are produced with
the partition's allow switch: the wire still refuses them."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from broker.core.acks import Waits
from broker.core.partition import (
    EARLIEST,
    LATEST,
    Isolation,
    Partition,
    PendingProduce,
    PendingRead,
    ReadAnswer,
    Stored,
)
from broker.core.producer_state import CoordinatorFencedError, FencedEpochError, InvalidTxnStateError
from broker.core.replication import NotLeaderError
from broker.storage.diskspace import DiskSpace
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import LogConfig
from broker.storage.txn_index import AbortedTxn
from ringlog_proto.batch import CRC_START, Record, encode_batch, iter_batches
from ringlog_proto.batch_control import control_of
from ringlog_proto.batch_header import TRANSACTIONAL_BIT

IO = SyncFileIO()
SMALL = LogConfig(segment_bytes=400, max_batch_bytes=400)  # a few batches per segment
COMMITTED = Isolation.LAST_STABLE
T0 = 1_700_000_000_000


def batch(
    n: int = 1, pid: int = -1, seq: int = -1, epoch: int = 0, txn: bool = False, value: bytes = b"v"
) -> bytes:
    out = bytearray(
        encode_batch(
            [Record(value, timestamp=T0 + seq)] * n,
            producer_id=pid,
            producer_epoch=epoch if pid >= 0 else -1,
            base_sequence=seq,
        )
    )
    if txn:
        struct.pack_into(">h", out, 21, TRANSACTIONAL_BIT)
        struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


def produced(p: Partition, records: bytes, space: DiskSpace) -> Stored:
    out = p.produce(records, space, transactional=True)
    assert isinstance(out, PendingProduce)
    run_ops(IO, out.pending.ops)
    out.complete()
    return out.stored()


def marker(p: Partition, pid: int, commit: bool, epoch: int = 0, coordinator_epoch: int = 0) -> Stored:
    out = p.write_marker(pid, epoch, coordinator_epoch, commit)
    run_ops(IO, out.pending.ops)
    out.complete()
    return out.stored()


def read_all(read: PendingRead) -> ReadAnswer:
    if read.extent is None:
        return read.nothing()
    extent = read.extent
    return read.finish(IO.pread(extent.segment.store_fd, extent.length, extent.position))


def offsets(records: bytes) -> list[int]:
    return [h.base_offset for _, h in iter_batches(records)]


def copied(p: Partition, records: bytes) -> int:
    end = -1
    for pending in p.append_replica(records):
        run_ops(IO, pending.pending.ops)
        end = pending.complete()
    return end


def everything(p: Partition) -> bytes:
    out = b""
    offset = p.log.start_offset
    while offset < p.log.end_offset:
        r = p.log.read(offset, 1 << 20)
        out += r.data
        offset = r.next_offset
    return out


@pytest.fixture
def space(tmp_path: Path) -> DiskSpace:
    return DiskSpace(str(tmp_path), 0)


@pytest.fixture
def part(tmp_path: Path) -> Partition:
    return Partition(1, 0, str(tmp_path / "p"), SMALL)


# ----------------------------------------------------------------------------- one node


def test_without_transactions_the_last_stable_offset_is_the_high_watermark(
    part: Partition, space: DiskSpace
) -> None:
    produced(part, batch(3), space)
    produced(part, batch(2, pid=5, seq=0), space)
    assert part.last_stable_offset == part.high_watermark == 5
    answer = read_all(part.read(0, 1 << 20, COMMITTED))
    assert answer.last_stable_offset == 5 and answer.aborted == ()
    assert read_all(part.read(0, 1 << 20)).last_stable_offset == 5, "every read reports it"
    assert part.list_offset(LATEST, isolation=COMMITTED) == part.list_offset(LATEST) == 5


def test_an_open_transaction_holds_read_committed_readers_until_its_commit(
    part: Partition, space: DiskSpace
) -> None:
    produced(part, batch(1), space)  # 0: no producer
    produced(part, batch(2, pid=7, seq=0, txn=True), space)  # 1-2: the transaction
    produced(part, batch(1, pid=8, seq=0), space)  # 3: idempotent, after it
    assert part.producers.transaction_of(7) == (1, -1)
    assert part.last_stable_offset == 1 and part.high_watermark == 4
    answer = read_all(part.read(0, 1 << 20, COMMITTED))
    assert offsets(answer.records) == [0] and answer.last_stable_offset == 1
    assert part.read(1, 1 << 20, COMMITTED).extent is None, "at the last stable offset: wait there"
    assert part.read(3, 1 << 20, COMMITTED).extent is None, "between it and the HW: empty, not out of range"
    assert offsets(read_all(part.read(0, 1 << 20)).records) == [0, 1, 3], "read_uncommitted sees it all"
    assert part.list_offset(LATEST, isolation=COMMITTED) == 1
    assert part.list_offset(T0 + 0, isolation=COMMITTED) == -1, "a time found past the LSO: none yet"
    assert part.list_offset(T0 + 0) == 1
    at = marker(part, 7, commit=True)
    assert (at.base_offset, at.end_offset, at.waits) == (4, 5, Waits.FLUSH), "acks=all: durable on one node"
    assert part.last_stable_offset == 5 and part.producers.transaction_of(7) == (-1, 0)
    answer = read_all(part.read(0, 1 << 20, COMMITTED))
    assert offsets(answer.records) == [0, 1, 3, 4] and answer.aborted == ()
    assert part.list_offset(T0 + 0, isolation=COMMITTED) == 1


def test_an_aborted_transaction_is_named_to_the_reads_it_overlaps(part: Partition, space: DiskSpace) -> None:
    produced(part, batch(2, pid=7, seq=0, txn=True), space)  # 0-1
    produced(part, batch(1, pid=9, seq=0, txn=True), space)  # 2: another, still open after 7's abort
    produced(part, batch(1, pid=7, seq=2, txn=True), space)  # 3
    assert part.last_stable_offset == 0
    marker(part, 7, commit=False)  # 4
    assert part.last_stable_offset == 2, "9's transaction holds it now"
    marker(part, 9, commit=True)  # 5
    assert part.last_stable_offset == 6
    entry = AbortedTxn(7, 0, 4, 2)
    assert read_all(part.read(0, 1 << 20, COMMITTED)).aborted == (entry,)
    assert read_all(part.read(3, 1 << 20, COMMITTED)).aborted == (entry,), (
        "the marker is at or after the read"
    )
    assert read_all(part.read(5, 1 << 20, COMMITTED)).aborted == (), "read past its marker"
    assert read_all(part.read(0, 1 << 20)).aborted == (), "read_uncommitted is told nothing"
    # the next transaction of producer 7 starts afresh
    produced(part, batch(1, pid=7, seq=3, txn=True), space)  # 6
    assert part.last_stable_offset == 6 and part.producers.transaction_of(7) == (6, 0)


def test_markers_are_checked_as_kafka_checks_them(part: Partition, space: DiskSpace) -> None:
    produced(part, batch(1, pid=7, seq=0, epoch=2, txn=True), space)
    with pytest.raises(FencedEpochError):
        part.write_marker(7, 1, 0, commit=True)
    marker(part, 7, commit=False, epoch=2, coordinator_epoch=5)
    with pytest.raises(CoordinatorFencedError):
        part.write_marker(7, 2, 4, commit=True)
    marker(part, 7, commit=False, epoch=3, coordinator_epoch=5)  # KIP-360 style bump by a marker
    assert part.producers.producer(7) == (3, -1), "a higher epoch: sequences start over"
    produced(part, batch(1, pid=7, seq=0, epoch=3, txn=True), space)
    with pytest.raises(InvalidTxnStateError):
        part.produce(batch(1, pid=7, seq=1, epoch=3), space)
    assert part.log.end_offset == 4, "nothing written by a refusal"
    marker(part, 12345, commit=True)  # a producer with nothing here takes a marker, which ends nothing
    assert part.last_stable_offset == 3 and part.producers.ongoing() == {7: 3}


def test_a_restart_after_kill_9_keeps_the_last_stable_offset_and_the_aborted_list(
    tmp_path: Path, space: DiskSpace
) -> None:
    part = Partition(1, 0, str(tmp_path / "p"), SMALL)
    for i in range(6):  # spans segments
        produced(part, batch(2, pid=7, seq=2 * i, txn=True, value=b"x%d" % i), space)
    marker(part, 7, commit=False, coordinator_epoch=3)  # 12
    produced(part, batch(1, pid=8, seq=0, txn=True), space)  # 13: open
    produced(part, batch(1, pid=9, seq=0), space)  # 14
    assert len(part.log.segments) > 1
    before = (part.last_stable_offset, read_all(part.read(0, 1 << 20, COMMITTED)).aborted)
    assert before == (13, (AbortedTxn(7, 0, 12, 13),))
    part.log.abandon()  # kill -9: nothing closed or flushed
    again = Partition(1, 0, str(tmp_path / "p"), SMALL)
    assert (again.last_stable_offset, read_all(again.read(0, 1 << 20, COMMITTED)).aborted) == before
    assert again.producers.transaction_of(7) == (-1, 3) and again.producers.transaction_of(8) == (13, -1)
    with pytest.raises(CoordinatorFencedError):
        again.write_marker(7, 0, 2, commit=True)
    marker(again, 8, commit=True)
    assert again.last_stable_offset == 16
    again.close()


def test_retention_and_delete_records_keep_the_last_stable_offset_right(
    part: Partition, space: DiskSpace
) -> None:
    produced(part, batch(2, pid=7, seq=0, txn=True), space)  # 0-1
    marker(part, 7, commit=False)  # 2
    produced(part, batch(2, pid=8, seq=0, txn=True), space)  # 3-4: open
    produced(part, batch(1, pid=9, seq=0), space)  # 5
    assert part.last_stable_offset == 3 and len(part.aborted) == 1
    part.delete_records(3)
    assert len(part.aborted) == 0, "its marker went"
    assert part.last_stable_offset == 3
    part.delete_records(4)
    assert part.last_stable_offset == 4, "never below the log start"
    assert part.list_offset(EARLIEST, isolation=COMMITTED) == 4


# ----------------------------------------------------------------------------- replicated


def leader_and_follower(tmp_path: Path) -> tuple[Partition, Partition]:
    leader = Partition(1, 0, str(tmp_path / "leader"), SMALL)
    follower = Partition(1, 0, str(tmp_path / "follower"), SMALL)
    leader.become_leader(1, (1, 2), (1, 2), node_id=1, now=0)
    follower.become_follower(1, leader=1)
    return leader, follower


def test_a_completed_transaction_stays_unstable_until_its_marker_is_below_the_high_watermark(
    tmp_path: Path, space: DiskSpace
) -> None:
    leader, follower = leader_and_follower(tmp_path)
    produced(leader, batch(2, pid=7, seq=0, txn=True), space)
    out = leader.write_marker(7, 0, 0, commit=False)
    assert out.waits is Waits.HIGH_WATERMARK
    run_ops(IO, out.pending.ops)
    out.complete()
    assert leader.high_watermark == 0 and leader.last_stable_offset == 0
    leader.replica_fetched(2, 2, now=1)  # the follower holds the data, not the marker
    assert leader.high_watermark == 2 and leader.last_stable_offset == 0, "the marker is not replicated yet"
    assert copied(follower, everything(leader)) == 3
    leader.replica_fetched(2, 3, now=2)
    assert leader.high_watermark == 3 and leader.last_stable_offset == 3
    follower.follower_high_watermark(3)
    assert follower.last_stable_offset == 3
    assert follower.aborted.collect(0, 3) == leader.aborted.collect(0, 3) == [AbortedTxn(7, 0, 2, 3)]
    assert follower.producers.transaction_of(7) == (-1, 0), "a new leader knows it"
    with pytest.raises(NotLeaderError):
        follower.write_marker(7, 0, 0, commit=True)
    with pytest.raises(NotLeaderError):
        follower.read(0, 1 << 20, COMMITTED)


def test_a_follower_truncated_below_a_marker_has_the_transaction_open_again(
    tmp_path: Path, space: DiskSpace
) -> None:
    leader, follower = leader_and_follower(tmp_path)
    produced(leader, batch(2, pid=7, seq=0, txn=True), space)
    out = leader.write_marker(7, 0, 0, commit=False)
    run_ops(IO, out.pending.ops)
    out.complete()
    data = everything(leader)
    assert copied(follower, data) == 3
    assert control_of(data, len(data) - 78).commit is False
    follower.follower_high_watermark(3)
    assert len(follower.aborted) == 1 and follower.last_stable_offset == 3
    assert follower.truncate_to(2) == 2
    assert len(follower.aborted) == 0
    assert follower.producers.transaction_of(7) == (0, -1)
    assert follower.last_stable_offset == 0
    follower.restart_at(10)
    assert follower.producers.ongoing() == {} and follower.last_stable_offset == 10
