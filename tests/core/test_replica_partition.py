"""Leader epochs in the log, the follower's append and truncation, and the leader's ISR and high
watermark: a partition's replication without a server, I/O run by the test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.core.acks import Waits
from broker.core.partition import (
    EARLIEST,
    LATEST,
    Diverging,
    Partition,
    PendingProduce,
    PendingRead,
    ReadAnswer,
    Stored,
)
from broker.core.replication import IsrProposal, LeaderState, NotEnoughReplicasError, NotLeaderError
from broker.storage import validation
from broker.storage.diskspace import DiskSpace
from broker.storage.epochs import EpochHistory
from broker.storage.errors import InvalidBatchError, OffsetOutOfRangeError
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import LogConfig
from ringlog_proto import batch_checks, compression
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_ZSTD,
    BatchHeader,
    encode_batch,
    iter_batches,
    read_header,
)
from ringlog_proto.messages import Acks

IO = SyncFileIO()
SMALL = LogConfig(segment_bytes=400, max_batch_bytes=400)  # a few batches per segment


def batch(n: int = 1, pid: int = -1, seq: int = -1, value: bytes = b"v") -> bytes:
    return encode_batch([value] * n, producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=seq)


def produced(p: Partition, records: bytes, space: DiskSpace) -> Stored:
    out = p.produce(records, space)
    assert isinstance(out, PendingProduce)
    run_ops(IO, out.pending.ops)
    return out.complete()


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


# ----------------------------------------------------------------------------- the epoch history


def test_end_offset_for_epoch_follows_kip_101() -> None:
    h = EpochHistory()
    assert h.end_offset_for_epoch(0, 0) == (-1, -1)
    for epoch, start in ((1, 0), (1, 5), (3, 10), (4, 20)):
        h.assign(epoch, start)
    assert h.entries() == [(1, 0), (3, 10), (4, 20)]
    assert h.end_offset_for_epoch(0, 30) == (0, 0), "below the first epoch: where the first starts"
    assert h.end_offset_for_epoch(1, 30) == (1, 10)
    assert h.end_offset_for_epoch(2, 30) == (1, 10), "an epoch without batches: the one before it"
    assert h.end_offset_for_epoch(3, 30) == (3, 20)
    assert h.end_offset_for_epoch(4, 30) == (4, 30), "the latest ends at the log end"
    assert h.end_offset_for_epoch(5, 30) == (-1, -1), "above every epoch known"
    assert h.end_offset_for_epoch(5, 30, leader_epoch=6) == (4, 30)
    assert h.end_offset_for_epoch(6, 30, leader_epoch=6) == (6, 30)
    assert h.end_offset_for_epoch(-1, 30) == (-1, -1)
    h.assign(2, 15)  # a lower epoch later in the log: what it supersedes goes
    assert h.entries() == [(1, 0), (2, 15)]
    h.truncate_from(15)
    assert h.entries() == [(1, 0)] and h.latest_epoch == 1
    h.assign(3, 12)
    h.expire_before(13)
    assert h.entries() == [(3, 13)]
    assert h.end_offset_for_epoch(1, 30) == (1, 13), "an expired epoch ends where the log starts"


def test_produced_batches_carry_the_leader_epoch_and_reopen_keeps_the_history(
    tmp_path: Path, space: DiskSpace
) -> None:
    d = str(tmp_path / "p")
    p = Partition(1, 0, d, SMALL)
    produced(p, batch(2), space)  # not replicated: epoch 0
    p.become_leader(3, (1,), (1,), node_id=1, now=0, min_insync=1)
    produced(p, batch(1), space)
    produced(p, batch(1), space)
    p.become_leader(5, (1,), (1,), node_id=1, now=0, min_insync=1)
    produced(p, batch(3), space)
    epochs = [read_header(p.log.read(o, 1).data).partition_leader_epoch for o in (0, 2, 3, 4)]
    assert epochs == [0, 3, 3, 5]
    assert p.epochs.entries() == [(0, 0), (3, 2), (5, 4)]
    assert p.end_offset_for_epoch(3) == (3, 4)
    assert p.end_offset_for_epoch(5) == (5, 7)
    p.close()
    again = Partition(1, 0, d, SMALL)
    assert again.epochs.entries() == [(0, 0), (3, 2), (5, 4)]
    assert again.leader_epoch == 5, "an unreplicated reopen stamps the latest epoch, never below it"
    again.close()


# ----------------------------------------------------------------------------- follower append, truncate


def leader_and_follower(tmp_path: Path, config: LogConfig = SMALL) -> tuple[Partition, Partition]:
    leader = Partition(1, 0, str(tmp_path / "leader"), config)
    follower = Partition(1, 0, str(tmp_path / "follower"), config)
    leader.become_leader(1, (1, 2), (1, 2), node_id=1, now=0)
    follower.become_follower(1, leader=1)
    return leader, follower


def test_a_follower_stores_the_leaders_batches_as_they_are(tmp_path: Path, space: DiskSpace) -> None:
    leader, follower = leader_and_follower(tmp_path)
    for i in range(12):  # several segments on both sides
        produced(leader, batch(2, pid=7, seq=2 * i, value=b"x%d" % i), space)
    data = everything(leader)
    assert copied(follower, data) == 24
    assert everything(follower) == data, "byte for byte, offsets and epochs included"
    assert len(follower.log.segments) > 1
    assert follower.producers.producer(7) == (0, 23), "the producer state learns them"
    assert follower.epochs.entries() == [(1, 0)]
    with pytest.raises(OffsetOutOfRangeError):
        follower.append_replica(data)  # the first base offset must be the log end
    with pytest.raises(NotLeaderError):
        follower.produce(batch(), space)
    with pytest.raises(NotLeaderError):
        leader.append_replica(data)
    corrupt = bytearray(everything(leader)[: read_header(data).size])
    corrupt[-1] ^= 1
    follower.truncate_to(0)
    with pytest.raises(Exception, match="crc"):
        follower.append_replica(bytes(corrupt))
    leader.close()
    follower.close()


def test_a_follower_copies_batches_above_a_batch_limit_lowered_since(
    tmp_path: Path, space: DiskSpace
) -> None:
    """A topic's max.message.bytes (or segment.bytes) lowered after its leader stored larger
    batches: a follower behind still copies them (the leader checked them under the settings of
    their time), and stamps nothing (LogAppendTime batches keep the leader's time); a produce
    on the leader is held to the new limit."""
    leader, follower = leader_and_follower(tmp_path)
    big = batch(1, value=b"y" * 300)
    produced(leader, big, space)
    lowered = LogConfig(segment_bytes=400, max_batch_bytes=100, log_append_time=True)
    leader.configure(lowered)
    follower.configure(lowered)
    assert copied(follower, everything(leader)) == 1
    assert everything(follower) == everything(leader)
    with pytest.raises(Exception, match="exceeds max_batch_bytes 100"):
        leader.produce(big, space)
    leader.close()
    follower.close()


def test_truncation_mid_segment_and_across_segments_survives_reopen(tmp_path: Path, space: DiskSpace) -> None:
    leader, follower = leader_and_follower(tmp_path)
    for i in range(6):
        produced(leader, batch(1, pid=7, seq=i), space)
    leader.become_leader(2, (1, 2), (1, 2), node_id=1, now=0)
    for i in range(6, 14):
        produced(leader, batch(1, pid=7, seq=i), space)
    copied(follower, everything(leader))
    segments = len(follower.log.segments)
    assert segments >= 3
    assert follower.truncate_to(9) == 9  # mid-segment, segments above it deleted
    assert len(follower.log.segments) < segments
    assert follower.epochs.entries() == [(1, 0), (2, 6)]
    assert follower.producers.producer(7) == (0, 8)
    assert follower.truncate_to(4) == 4  # below the second epoch
    assert follower.epochs.entries() == [(1, 0)]
    assert follower.producers.producer(7) == (0, 3)
    follower.close()
    reopened = Partition(1, 0, str(tmp_path / "follower"), SMALL)
    assert reopened.log.end_offset == 4
    assert reopened.epochs.entries() == [(1, 0)]
    assert reopened.producers.producer(7) == (0, 3)
    reopened.become_follower(2, leader=1)
    assert copied(reopened, leader.log.read(4, 1 << 20).data) > 4, "appends again after the cut"
    assert reopened.log.read(4, 1).first_offset == 4
    reopened.close()
    leader.close()


# ----------------------------------------------------------------------------- the leader's view


def test_high_watermark_is_the_isrs_smallest_log_end_and_never_goes_back(
    tmp_path: Path, space: DiskSpace
) -> None:
    leader, _ = leader_and_follower(tmp_path)
    produced(leader, batch(3), space)
    assert leader.high_watermark == 0, "the follower has not fetched"
    done: list[int] = []
    leader.after_replicated(3, lambda: done.append(3), lambda exc: done.append(-1))
    leader.replica_fetched(2, 2, now=10)
    assert leader.high_watermark == 2 and done == []
    leader.replica_fetched(2, 3, now=20)
    assert leader.high_watermark == 3 and done == [3]
    leader.replica_fetched(2, 1, now=30)  # a follower that truncated: the HW stays
    assert leader.high_watermark == 3
    state = leader.replica
    assert isinstance(state, LeaderState)
    produced(leader, batch(1), space)
    assert leader.isr_proposal(20 + 31_000, 30_000) == IsrProposal(leave=(2,), join=())
    failed: list[BaseException] = []
    leader.after_replicated(4, lambda: None, failed.append)
    leader.update_isr((1,))  # the controller took the follower out: below min_insync 2
    assert isinstance(failed[0], NotEnoughReplicasError)
    assert leader.high_watermark == 4, "alone in the ISR: the HW is the leader's end"
    with pytest.raises(NotEnoughReplicasError):
        leader.check_replicas()
    leader.replica_fetched(2, 4, now=40_000)
    assert leader.isr_proposal(40_000, 30_000) == IsrProposal(leave=(), join=(2,))
    leader.close()


def test_a_replica_proposed_into_the_isr_holds_the_high_watermark_until_the_answer(
    tmp_path: Path, space: DiskSpace
) -> None:
    """The nemesis's kill -9 rounds lost acknowledged records this way: node 3 caught up, its
    leader proposed ISR [1, 2, 3], acknowledged two more records (ISR [1, 2] as far as it knew),
    and the controller made node 3, the preferred leader, lead the moment the store held the
    proposal: the two records, which node 3 had not fetched, were truncated away."""
    leader = Partition(1, 0, str(tmp_path / "leader"), SMALL)
    leader.become_leader(1, (1, 2, 3), (1, 2), node_id=1, now=0)
    produced(leader, batch(2), space)
    leader.replica_fetched(2, 2, now=10)
    leader.replica_fetched(3, 2, now=10)
    assert leader.high_watermark == 2
    assert leader.isr_proposal(10, 30_000) == IsrProposal(leave=(), join=(3,))
    leader.proposing_isr(1, (1, 2, 3))
    produced(leader, batch(2), space)
    done: list[int] = []
    leader.after_replicated(4, lambda: done.append(4), lambda exc: done.append(-1))
    leader.replica_fetched(2, 4, now=20)
    assert leader.high_watermark == 2 and done == [], "node 3 may already be in the stored ISR"
    leader.isr_answered(1, None)  # no answer: still unknown
    leader.replica_fetched(2, 4, now=21)
    assert leader.high_watermark == 2 and done == []
    leader.replica_fetched(3, 4, now=30)
    assert leader.high_watermark == 4 and done == [4]
    leader.isr_answered(1, (1, 2, 3))
    produced(leader, batch(1), space)
    leader.update_isr((1, 2))  # a view read before the proposal applied, published after the answer
    leader.replica_fetched(2, 5, now=31)
    assert leader.high_watermark == 4, "the stale view does not take node 3 out of the HW"
    leader.update_isr((1, 2, 3))  # the view catches up
    leader.replica_fetched(3, 5, now=32)
    assert leader.high_watermark == 5
    state = leader.replica
    assert isinstance(state, LeaderState) and state.isr == {1, 2, 3} and state.joining == frozenset()
    # refused (the ISR stayed [1, 2]): node 3 no longer holds the HW
    leader.update_isr((1, 2))
    leader.proposing_isr(1, (1, 2, 3))
    produced(leader, batch(1), space)
    leader.replica_fetched(2, 6, now=40)
    assert leader.high_watermark == 5
    leader.isr_answered(1, (1, 2))
    assert leader.high_watermark == 6
    # a newcomer that stops fetching is proposed out after the lag, as an ISR member would be
    leader.proposing_isr(1, (1, 2, 3))
    leader.replica_fetched(2, 6, now=40 + 31_000)
    assert leader.isr_proposal(40 + 31_000, 30_000) == IsrProposal(leave=(3,), join=())
    leader.close()


def test_a_replica_taken_out_of_the_isr_joins_again_only_by_fetching(
    tmp_path: Path, space: DiskSpace
) -> None:
    """The controller takes a dead node out; its last fetch was caught up and the log has been
    idle since: without forgetting it, the leader proposed the dead node back every 250 ms."""
    leader = Partition(1, 0, str(tmp_path / "leader"), SMALL)
    leader.become_leader(1, (1, 2, 3), (1, 2, 3), node_id=1, now=0)
    produced(leader, batch(2), space)
    leader.replica_fetched(2, 2, now=10)
    leader.replica_fetched(3, 2, now=10)
    leader.update_isr((1, 2))  # node 3 died
    assert leader.isr_proposal(20, 30_000) == IsrProposal(leave=(), join=())
    leader.replica_fetched(3, 2, now=30)  # back, fetching
    assert leader.isr_proposal(30, 30_000) == IsrProposal(leave=(), join=(3,))
    leader.close()


def test_truncation_to_a_segment_base_leaves_it_empty_and_reusable(tmp_path: Path, space: DiskSpace) -> None:
    leader, follower = leader_and_follower(tmp_path)
    for i in range(10):
        produced(leader, batch(1, pid=7, seq=i), space)
    copied(follower, everything(leader))
    assert len(follower.log.segments) >= 2
    base = follower.log.segments[1].base_offset
    assert follower.truncate_to(base) == base
    assert follower.log.segments[-1].base_offset == base and follower.log.segments[-1].size == 0
    follower.close()
    again = Partition(1, 0, str(tmp_path / "follower"), SMALL)
    assert again.log.end_offset == base
    again.become_follower(1, leader=1)
    assert copied(again, leader.log.read(base, 1 << 20).data) > base
    assert everything(again) == everything(leader)[: len(everything(again))]
    again.close()
    leader.close()


# ----------------------------------------------------------------------------- the read door


def headers_of(records: bytes) -> list[BatchHeader]:
    return [h for _, h in iter_batches(records)]


def read_all(read: PendingRead) -> ReadAnswer:
    if read.extent is None:
        return read.nothing()
    extent = read.extent
    return read.finish(IO.pread(extent.segment.store_fd, extent.length, extent.position))


def test_one_read_door_a_consumer_below_the_high_watermark_a_follower_to_the_log_end(
    tmp_path: Path, space: DiskSpace
) -> None:
    """The isolation is the only difference between the reads: a consumer of the leader stops at
    the high watermark (and waits there), a follower reads past it; a follower's read first
    counts its position, which moves the high watermark the consumer then reads to."""
    leader, _ = leader_and_follower(tmp_path)
    produced(leader, batch(2), space)
    produced(leader, batch(1), space)
    consumer = leader.read(0, 1 << 20)
    assert consumer.extent is None and consumer.nothing() == ReadAnswer(b"", 0, 0, 0)
    follower = leader.read_for_follower(2, 0, -1, leader.leader_epoch, 1 << 20, now=1)
    assert isinstance(follower, PendingRead)
    copied_ = read_all(follower)
    assert [h.base_offset for h in headers_of(copied_.records)] == [0, 2]
    moved = leader.read_for_follower(2, 2, leader.leader_epoch, leader.leader_epoch, 1 << 20, now=2)
    assert isinstance(moved, PendingRead) and leader.high_watermark == 2
    answer = read_all(leader.read(0, 1 << 20))
    assert [h.base_offset for h in headers_of(answer.records)] == [0]
    assert (answer.high_watermark, answer.log_start_offset) == (2, 0)
    with pytest.raises(OffsetOutOfRangeError):
        leader.read_for_follower(2, 4, -1, leader.leader_epoch, 1 << 20, now=3)
    with pytest.raises(NotLeaderError):
        leader.read(0, 1 << 20, leader_epoch=leader.leader_epoch + 1)
    leader.close()


def test_a_follower_whose_epoch_diverges_is_told_where_before_anything_is_read(
    tmp_path: Path, space: DiskSpace
) -> None:
    leader, _ = leader_and_follower(tmp_path)
    produced(leader, batch(2), space)
    epoch = leader.leader_epoch
    # the follower says it fetched up to 5 in an epoch that ended here at 2
    answer = leader.read_for_follower(2, 5, epoch, epoch, 1 << 20, now=1)
    assert answer == Diverging(epoch, 2)
    assert leader.high_watermark == 0, "a diverging follower's position is not counted"
    leader.close()


def test_list_offset_answers_latest_earliest_and_a_timestamp(tmp_path: Path, space: DiskSpace) -> None:
    p = Partition(1, 0, str(tmp_path / "p"), SMALL)
    produced(p, encode_batch([b"a"], timestamp=1000), space)
    produced(p, encode_batch([b"b"], timestamp=2000), space)
    assert p.list_offset(LATEST) == 2 and p.list_offset(EARLIEST) == 0
    assert p.list_offset(1500) == 1 and p.list_offset(3000) == -1
    with pytest.raises(ValueError, match="offset spec -3"):
        p.list_offset(-3)
    p.close()


# ----------------------------------------------------------------------------- the acks rule


def produced_(p: Partition, space: DiskSpace, acks: int) -> PendingProduce:
    out = p.produce(batch(1), space, acks)
    assert isinstance(out, PendingProduce)
    run_ops(IO, out.pending.ops)
    out.complete()
    return out


def test_the_partition_decides_what_a_produce_waits_for(tmp_path: Path, space: DiskSpace) -> None:
    """One place says what each acks waits for (docs/CLUSTER.md): the backends only carry it
    out. One copy: 0 and 1 the write, durable and all a flush. Replicated: durable and all the
    high watermark, refused before anything is written when too few replicas are in sync."""
    alone = Partition(1, 0, str(tmp_path / "alone"), SMALL)
    assert [alone.waits_for(a) for a in (Acks.NONE, Acks.WRITTEN, Acks.DURABLE, Acks.ALL)] == [
        Waits.WRITE,
        Waits.WRITE,
        Waits.FLUSH,
        Waits.FLUSH,
    ]
    with pytest.raises(ValueError, match="acks must be"):
        alone.waits_for(3)
    leader, _ = leader_and_follower(tmp_path)
    assert [leader.waits_for(a) for a in (Acks.WRITTEN, Acks.DURABLE, Acks.ALL)] == [
        Waits.WRITE,
        Waits.HIGH_WATERMARK,
        Waits.HIGH_WATERMARK,
    ]
    produced = leader.produce(batch(1), space, Acks.ALL)
    assert isinstance(produced, PendingProduce) and produced.waits is Waits.HIGH_WATERMARK
    assert produced.stored().waits is Waits.HIGH_WATERMARK, "a retry of it waits for the same"
    run_ops(IO, produced.pending.ops)
    produced.complete()
    leader.become_leader(1, (1, 2), (1,), node_id=1, now=0)  # the follower left the ISR: 1 < min 2
    leader.replica.min_insync = 2  # type: ignore[union-attr]
    for acks in (Acks.DURABLE, Acks.ALL):
        with pytest.raises(NotEnoughReplicasError):
            leader.produce(batch(1), space, acks)
    assert produced_(leader, space, Acks.WRITTEN).waits is Waits.WRITE
    alone.close()
    leader.close()


def test_a_followers_fetch_waits_on_the_log_end_not_the_high_watermark(
    tmp_path: Path, space: DiskSpace
) -> None:
    """A consumer's long poll reads below the HW, so an HW move wakes it; a follower's reads to
    the log end, so an HW move (another follower's fetch) must not: only an append does, or a
    change of role, or the partition closing."""
    leader = Partition(1, 0, str(tmp_path / "leader"), LogConfig())
    leader.become_leader(1, (1, 2, 3), (1, 2, 3), node_id=1, now=0)
    produced(leader, batch(2), space)
    consumers: list[str] = []
    followers: list[str] = []

    def park() -> None:
        leader.waiters.append(lambda: consumers.append("woken"))
        leader.replica_waiters.append(lambda: followers.append("woken"))

    park()
    leader.replica_fetched(2, 2, now=10)
    leader.replica_fetched(3, 2, now=10)  # the HW moves: 0 -> 2
    assert leader.high_watermark == 2
    assert consumers == ["woken"] and followers == [], "an HW move wakes consumers only"
    assert len(leader.replica_waiters) == 1
    produced(leader, batch(1), space)  # the log end grows
    assert followers == ["woken"] and leader.replica_waiters == []
    park()
    leader.become_follower(2, leader=2)  # leadership lost: the parked follower fetch answers
    assert followers == ["woken", "woken"] and leader.replica_waiters == []
    park()
    leader.close()
    assert followers == ["woken"] * 3 and consumers == ["woken"] * 3


def test_a_corrupt_batch_from_the_leader_is_refused_and_nothing_is_written(
    tmp_path: Path, space: DiskSpace
) -> None:
    """One batch whose crc does not match refuses the whole fetch, good batches before it too,
    with the batch and the reason named."""
    leader, follower = leader_and_follower(tmp_path, LogConfig())
    for i in range(3):
        produced(leader, batch(2, value=b"r%d" % i), space)
    data = everything(leader)
    second = read_header(data).size
    corrupt = bytearray(data)
    corrupt[second + read_header(data, second).size - 1] ^= 0x10  # the second batch's last byte
    seg = follower.log.segments[-1]
    size_before = os.fstat(seg.store_fd).st_size
    with pytest.raises(InvalidBatchError, match=f"batch at byte {second}: crc32c mismatch"):
        follower.append_replica(bytes(corrupt))
    assert follower.log.end_offset == 0 and everything(follower) == b""
    assert os.fstat(seg.store_fd).st_size == size_before, "not a byte written"
    assert copied(follower, data) == 6, "the intact fetch, retried, is taken"
    leader.close()
    follower.close()


@pytest.mark.parametrize("codec", [COMPRESSION_LZ4, COMPRESSION_ZSTD, COMPRESSION_GZIP])
def test_a_follower_copies_a_compressed_batch_without_inflating_it(
    tmp_path: Path, space: DiskSpace, monkeypatch: pytest.MonkeyPatch, codec: int
) -> None:
    """The leader inflated it to check it when it was produced; the follower checks its header
    and crc only (as Kafka's follower does)."""
    leader, follower = leader_and_follower(tmp_path, LogConfig())
    produced(leader, encode_batch([b"z" * 100] * 50, compression=codec), space)
    data = everything(leader)

    def inflate(*args: object, **kwargs: object) -> None:
        raise AssertionError("a follower's copy was inflated")

    monkeypatch.setattr(batch_checks, "decompress_bounded", inflate)
    monkeypatch.setattr(compression, "decompress_bounded", inflate)
    monkeypatch.setattr(compression, "decompress", inflate)
    monkeypatch.setattr(validation, "check_compressed", inflate)
    assert copied(follower, data) == 50
    assert everything(follower) == data
    leader.close()
    follower.close()
