"""The nemesis's checker (labkit/clusterchecker.py) on histories built by hand, and its offline
reader on a data dir a real broker wrote. No root, no cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from crc32c import crc32c

from broker.storage import layout
from broker.storage.fileio import run_ops
from broker.storage.log import Log
from labkit.brokerproc import BrokerProcess, Wire
from labkit.clusterchecker import (
    ABORTED,
    COMMITTED,
    UNKNOWN,
    Ack,
    Attempt,
    Read,
    Replica,
    Timeline,
    Txn,
    check,
    check_transactions,
    failover_time,
    read_partition,
    read_replica,
    report,
)
from ringlog_proto import messages as m
from ringlog_proto.batch import CRC_START, TRANSACTIONAL_BIT, Record, control_batch, encode_batch

T = "orders"


def log(*payloads: bytes, start: int = 0) -> tuple[tuple[int, bytes], ...]:
    return tuple((start + i, p) for i, p in enumerate(payloads))


def acks(*payloads: bytes, start: int = 0) -> list[Ack]:
    return [Ack(T, 0, start + i, p) for i, p in enumerate(payloads)]


def kinds(violations) -> list[tuple[str, int, object]]:
    return [(v.kind, v.offset, v.node) for v in violations]


def test_a_clean_history_has_no_violation() -> None:
    full = log(b"a", b"b", b"c")
    reps = [Replica(n, T, 0, full) for n in (0, 1, 2)]
    reads = [Read(T, 0, 0, b"a", "c1"), Read(T, 0, 2, b"c", "c2")]
    assert check(acks(b"a", b"b", b"c"), reads, reps) == []
    assert report([]) == "no violations"


def test_an_acknowledged_record_truncated_away_is_lost() -> None:
    reps = [Replica(0, T, 0, log(b"a", b"b", b"c")), Replica(1, T, 0, log(b"a", b"b", b"x"))]
    found = check(acks(b"a", b"b", b"c"), [], reps)
    assert ("lost", 2, 1) in kinds(found)
    # both in sync, so the high watermark is 3: their disagreement at 2 is a divergence too (a tie:
    # the replica named first is the reference)
    assert ("divergent", 2, 1) in kinds(found) and len(found) == 2
    text = report(found)
    assert "lost" in text and "b'x'" in text


def test_moved_and_duplicated_records() -> None:
    moved = Replica(0, T, 0, log(b"a", b"zz", b"b"))
    dup = Replica(1, T, 0, log(b"a", b"b", b"b"))
    found = kinds(check(acks(b"a", b"b"), [], [moved, dup]))
    assert ("moved", 1, 0) in found
    assert ("duplicated", 1, 1) in found
    assert ("lost", 1, 1) not in found


def test_a_producers_records_out_of_its_order_are_reordered() -> None:
    """Acknowledged at offsets against the order one producer sent them (the epoch-bump duplicate:
    a stored batch answered an error, resent after later ones under a new epoch); another
    producer's order is its own."""
    rep = Replica(0, T, 0, log(b"p1", b"q0", b"p0", b"q1"))
    sent = [Ack(T, 0, 2, b"p0", "p", 0), Ack(T, 0, 0, b"p1", "p", 1)]
    sent += [Ack(T, 0, 1, b"q0", "q", 0), Ack(T, 0, 3, b"q1", "q", 1)]
    assert kinds(check(sent, [], [rep])) == [("reordered", 0, None)]


def test_two_acks_at_one_offset_conflict() -> None:
    found = check([Ack(T, 0, 0, b"from-old-leader"), Ack(T, 0, 0, b"from-new-leader")], [], [])
    assert [v.kind for v in found] == ["conflicting-acks", "no-in-sync-replica"]


def test_a_read_that_the_final_log_contradicts() -> None:
    reps = [Replica(n, T, 0, log(b"a", b"b")) for n in (0, 1)]
    reads = [
        Read(T, 0, 1, b"b", "ok"),
        Read(T, 0, 1, b"dirty", "c2"),  # read from a deposed leader, later truncated and rewritten
        Read(T, 0, 2, b"gone", "c3"),  # read past what survived
    ]
    found = kinds(check(acks(b"a", b"b"), reads, reps))
    assert ("read-conflict", 1, None) in found
    assert ("read-changed", 1, None) in found
    assert ("read-changed", 2, None) in found
    assert len([k for k in found if k[0] == "read-changed"]) == 2  # the good read is not flagged


def test_a_divergent_suffix_counts_only_below_the_high_watermark() -> None:
    leader = Replica(0, T, 0, log(b"a", b"b", b"c", b"d"))
    follower = Replica(1, T, 0, log(b"a", b"b", b"c", b"d"))
    stale = Replica(2, T, 0, log(b"a", b"old1", b"old2"), in_sync=False)  # never truncated
    found = kinds(check([], [], [leader, follower, stale]))
    assert found == [("divergent", 1, 2)]
    # the same stale replica is fine when its divergent records sit above the high watermark
    assert check([], [], [leader, follower, stale], {(T, 0): 1}) == []
    # a lagging replica whose prefix agrees is not divergent
    lagging = Replica(2, T, 0, log(b"a", b"b"), in_sync=False)
    assert check([], [], [leader, follower, lagging]) == []


def test_the_high_watermark_defaults_to_the_smallest_in_sync_end() -> None:
    a = Replica(0, T, 0, log(b"a", b"b", b"c"))
    b = Replica(1, T, 0, log(b"a", b"b"))
    stale = Replica(2, T, 0, log(b"a", b"b", b"X"), in_sync=False)
    assert check([], [], [a, b, stale]) == []  # offset 2 is at the high watermark 2, not below


def test_retention_hides_nothing_it_should_not() -> None:
    trimmed = Replica(0, T, 0, log(b"c", b"d", start=2))
    assert check(acks(b"a", b"b", b"c", b"d"), [Read(T, 0, 0, b"a")], [trimmed]) == []
    assert kinds(check(acks(b"a", b"b", b"c", b"e"), [], [trimmed])) == [("lost", 3, 0)]


def test_failover_time_counts_from_the_fault_to_the_first_new_success() -> None:
    attempts = [
        Attempt(9.0, 10.5, True),  # in flight at the fault: does not count
        Attempt(10.1, 11.0, False),
        Attempt(11.2, 12.25, True),
        Attempt(12.3, 12.4, True),
    ]
    assert failover_time(attempts, 10.0) == pytest.approx(2.25)
    assert failover_time(attempts, 13.0) is None
    timeline = Timeline()
    with timeline.attempt():
        pass
    with pytest.raises(ConnectionError), timeline.attempt():
        raise ConnectionError
    assert [a.ok for a in timeline.attempts] == [True, False]
    assert timeline.failover_time(timeline.attempts[0].started) is not None


def test_read_replica_reads_a_brokers_data_dir_offline(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log").start()
    try:
        w = Wire(broker.port)
        topic_id = w.create_topic(T, partitions=2)
        acked = []
        for i in range(3):
            batch = encode_batch([Record(f"r{i}-{j}".encode()) for j in range(2)])
            resp = w.rpc(m.ProduceRequest(topic_id, 1, m.Acks.WRITTEN, 5000, batch))
            assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
            acked += [Ack(T, 1, resp.base_offset + j, f"r{i}-{j}".encode()) for j in range(2)]
        w.close()
    finally:
        broker.kill()  # a crash: the reader must not need a clean shutdown
    data = str(tmp_path / "data")
    rep = read_replica(data, T, 1, node=0)
    assert [p for _, p in rep.records] == [a.payload for a in acked]
    assert read_replica(data, topic_id, 1, node=0).records == rep.records
    assert read_replica(data, T, 0, node=0).records == ()
    assert read_replica(data, "nope", 0, node=0).records == ()
    assert check(acked, [], [rep]) == []

    # a torn tail (a batch cut short by a crash) ends the log there, and the files are untouched
    part = layout.partition_dir(data, topic_id, 1)
    (store,) = [n for n in os.listdir(part) if n.endswith(layout.STORE_SUFFIX)]
    path = os.path.join(part, store)
    extra = encode_batch([Record(b"torn")])
    with open(path, "ab") as f:
        f.write(extra[: len(extra) // 2])
    size = os.path.getsize(path)
    assert [p for _, p in read_partition(part)] == [a.payload for a in acked]
    assert os.path.getsize(path) == size


def test_read_partition_skips_markers_and_reads_past_them(tmp_path: Path) -> None:
    """Transaction markers carry no payload: skipped, and the records after them read; a
    transactional batch is read like any other (the stored checks, not a produce's)."""
    txn = bytearray(
        encode_batch([Record(b"t1")], producer_id=5, producer_epoch=0, base_sequence=0, base_offset=1)
    )
    txn[21:23] = TRANSACTIONAL_BIT.to_bytes(2, "big")
    txn[17:21] = crc32c(bytes(txn[CRC_START:])).to_bytes(4, "big")
    part = tmp_path / "p"
    log_ = Log.open(str(part))
    log_.append(encode_batch([Record(b"a0")]))
    for copied in (bytes(txn), control_batch(5, 0, True, 0, 1000, base_offset=2)):
        pending = log_.prepare_copy(copied)
        run_ops(log_.io, pending.ops)
        log_.complete_append(pending)
    log_.append(encode_batch([Record(b"a3")]))
    log_.close()
    assert read_partition(str(part)) == [(0, b"a0"), (1, b"t1"), (3, b"a3")]
    assert read_partition(str(part), markers=True) == [(2, b"commit 5")]


# ----------------------------------------------------------------------------- transactions


def txn(number: int, outcome: str, *records: tuple[int, bytes]) -> Txn:
    return Txn(number, tuple(records), outcome)


# two transactions over two partitions, the second aborted, and a third whose commit raised
HISTORY = [
    txn(0, COMMITTED, (0, b"t0-0"), (1, b"t0-1")),
    txn(1, ABORTED, (0, b"t1-0"), (1, b"t1-1")),
    txn(2, UNKNOWN, (0, b"t2-0"), (1, b"t2-1")),
    txn(3, COMMITTED, (0, b"t3-0"), (1, b"t3-1")),
]
# as written: data t0 at 0, t1 at 1, marker 2, t2 at 3, marker 4, t3 at 5, marker 6 (per partition)
CLEAN = [Read(T, p, o, f"t{n}-{p}".encode(), "rc") for p in (0, 1) for n, o in ((0, 0), (2, 3), (3, 5))]


def tkinds(violations) -> list[tuple[str, int, int]]:
    return sorted((v.kind, v.partition, v.offset) for v in violations)


def test_a_whole_transactional_history_passes() -> None:
    # each read twice (a consumer restarted from the start reads its offsets again): no duplicate
    assert check_transactions(T, HISTORY, CLEAN + CLEAN, stable_offsets={0: 7}, high_watermarks={0: 7}) == []
    # a transaction whose outcome the client does not know may also be wholly invisible
    without_t2 = [r for r in CLEAN if not r.payload.startswith(b"t2")]
    assert check_transactions(T, HISTORY, without_t2) == []


def test_an_aborted_transaction_visible_is_rejected() -> None:
    found = check_transactions(T, HISTORY, [*CLEAN, Read(T, 1, 1, b"t1-1")])
    assert tkinds(found) == [("aborted-visible", 1, 1)]


def test_a_committed_transaction_partly_visible_is_rejected() -> None:
    found = check_transactions(T, HISTORY, [r for r in CLEAN if r.payload != b"t3-1"])
    assert tkinds(found) == [("partial", 0, 5)]
    assert tkinds(check_transactions(T, HISTORY, [r for r in CLEAN if not r.payload.startswith(b"t0")])) == [
        ("lost", 0, -1)
    ]


def test_an_unknown_outcome_must_be_all_or_nothing() -> None:
    found = check_transactions(T, HISTORY, [r for r in CLEAN if r.payload != b"t2-0"])
    assert tkinds(found) == [("partial", 1, 3)]


def test_a_duplicate_and_a_foreign_record_are_rejected() -> None:
    found = check_transactions(T, HISTORY, [*CLEAN, Read(T, 0, 7, b"t3-0"), Read(T, 0, 8, b"zz")])
    assert tkinds(found) == [("duplicated", 0, 5), ("foreign", 0, 8)]


def test_transactions_out_of_order_in_a_partition_are_rejected() -> None:
    swapped = [
        Read(T, 0, 0, b"t3-0"),
        Read(T, 0, 3, b"t2-0"),
        Read(T, 0, 5, b"t0-0"),
        *(r for r in CLEAN if r.partition == 1),
    ]
    found = check_transactions(T, HISTORY, swapped)
    assert tkinds(found) == [("reordered", 0, 3), ("reordered", 0, 5)]


def test_a_stable_offset_behind_and_replicas_disagreeing_on_markers_are_rejected() -> None:
    records = tuple((r.offset, r.payload) for r in CLEAN if r.partition == 0)
    reps = [Replica(n, T, 0, records) for n in (1, 2)]
    marks = [
        Replica(1, T, 0, ((2, b"abort 7"), (4, b"commit 7"), (6, b"commit 7"))),
        Replica(2, T, 0, ((2, b"commit 7"), (4, b"commit 7"), (6, b"commit 7"))),
    ]
    found = check_transactions(T, HISTORY, CLEAN, reps, marks, {0: 7}, {0: 4})
    assert tkinds(found) == [("markers-divergent", 0, 2), ("unstable", 0, 4)]
    # a read the final log contradicts (the record judge of `check`, over the same replicas)
    found = check_transactions(T, HISTORY, [*CLEAN, Read(T, 0, 2, b"t1-0")], reps)
    assert ("read-changed", 0, 2) in tkinds(found) and ("aborted-visible", 0, 2) in tkinds(found)
