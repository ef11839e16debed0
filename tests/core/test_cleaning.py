"""A core's log cleaner (broker/core/cleaning.py) over real partitions, its blocking calls run by
hand: which partition it picks, one clean at a time, the swap on the loop's side, the checkpoint,
a partition that closes mid-clean, and the producer state and epochs across a clean and a reopen."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from blocking_kit import Blocking
from txn_kit import Writer, committed_view

from broker.core.cleaning import LogCleaning
from broker.core.partition import Partition
from broker.storage.cleaner import CleanerConfig
from broker.storage.diskspace import DiskSpace
from broker.storage.fileio import run_ops
from broker.storage.log import LogConfig
from broker.storage.log_cleaning import load_checkpoint
from broker.storage.txn_index import AbortedTxn
from ringlog_proto.batch import Record, decode_batches, encode_batch

T0 = 1_700_000_000_000
COMPACT = LogConfig(
    segment_bytes=4096,
    max_batch_bytes=1024,
    retention_ms=None,
    cleanup_policy="compact",
    min_cleanable_dirty_ratio=0.3,
)


def produce(p: Partition, space: DiskSpace, key: bytes, value: bytes | None, **kw: int) -> None:
    pending = p.produce(encode_batch([Record(value, key=key)], timestamp=T0, **kw), space)
    assert not isinstance(pending, tuple)
    run_ops(p.log.io, pending.pending.ops)  # type: ignore[union-attr]
    pending.complete()  # type: ignore[union-attr]


def served(p: Partition) -> dict[bytes | None, tuple[int, bytes | None]]:
    out: dict[bytes | None, tuple[int, bytes | None]] = {}
    off = p.log.start_offset
    while off < p.log.end_offset:
        r = p.log.read(off, 4096)
        for rec in decode_batches(r.data):
            if rec.offset >= off:
                out[rec.key] = (rec.offset, rec.value)
        off = r.next_offset
    return out


def test_it_cleans_the_dirtiest_compacted_partition_and_only_those(tmp_path: Path) -> None:
    space = DiskSpace(str(tmp_path), 0)
    cleaner = Partition(1, 0, str(tmp_path / "c"), COMPACT)  # cleaned once, then a little dirt
    dirtier = Partition(1, 1, str(tmp_path / "d"), COMPACT)  # never cleaned: all of it dirty
    deleting = Partition(2, 0, str(tmp_path / "x"), replace(COMPACT, cleanup_policy="delete"))
    blocking = Blocking()
    partitions = [cleaner]
    cleaning = LogCleaning(
        CleanerConfig(dedupe_buffer_bytes=1 << 16), lambda: partitions, blocking, lambda: T0
    )
    for i in range(300):
        produce(cleaner, space, b"k%d" % (i % 60), b"v%d" % i * 10)
    assert cleaning.tick() and cleaning.busy
    assert not cleaning.tick(), "one clean at a time"
    while blocking.run():  # the clean, the checkpoint's save
        pass
    assert cleaning.cleans == 1 and not cleaning.busy
    for i in range(300):
        produce(cleaner, space, b"k%d" % (i % 60), b"w%d" % i * 10)
        produce(dirtier, space, b"k%d" % (i % 3), b"v%d" % i * 10)
        produce(deleting, space, b"k%d" % (i % 3), b"v%d" % i * 10)
    partitions[:] = [cleaner, dirtier, deleting]
    want = (served(cleaner), served(dirtier))
    cleaner_size, dirtier_size = cleaner.log.size_bytes, dirtier.log.size_bytes
    assert cleaning.tick()
    assert blocking.run() == 1  # the clean of the dirtiest; its end starts the next at once
    assert cleaning.cleans == 2 and cleaning.busy
    assert dirtier.log.size_bytes < dirtier_size / 4 and cleaner.log.size_bytes == cleaner_size
    while blocking.run():
        pass
    assert cleaning.cleans == 3 and not cleaning.busy and not cleaning.tick(), "nothing dirty left"
    assert (served(cleaner), served(dirtier)) == want
    assert len(deleting.log.segments) > 3, "a delete policy is never compacted"
    cp = load_checkpoint(dirtier.directory)
    assert cp.cleaned_to == dirtier.log.segments[-1].base_offset
    assert cleaning.map_bytes == (1 << 16) // 24 * 24
    for p in (cleaner, dirtier, deleting):
        p.close()


def test_a_partition_closed_mid_clean_cancels_it(tmp_path: Path) -> None:
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(tmp_path / "c"), COMPACT)
    for i in range(200):
        produce(p, space, b"k%d" % (i % 3), b"v" * 50)
    blocking = Blocking()
    partitions = [p]
    cleaning = LogCleaning(CleanerConfig(), lambda: partitions, blocking, lambda: T0)
    assert cleaning.tick()
    cleaning.forget(p)
    partitions.clear()
    p.close()
    blocking.run()
    assert cleaning.cleans == 0 and not cleaning.busy
    assert not [n for n in os.listdir(p.directory) if ".cleaned" in n or ".swap" in n]


def test_producer_state_and_epochs_are_the_same_after_a_clean_and_a_reopen(tmp_path: Path) -> None:
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(tmp_path / "c"), COMPACT)
    for i in range(120):
        produce(p, space, b"k%d" % (i % 4), b"v" * 60, producer_id=11, producer_epoch=2, base_sequence=i)
        if i < 30:
            produce(p, space, b"k%d" % (i % 4), b"w" * 60, producer_id=12, producer_epoch=0, base_sequence=i)
    blocking = Blocking()
    cleaning = LogCleaning(CleanerConfig(), lambda: [p], blocking, lambda: T0)
    before = (p.producers.producer(11), p.producers.producer(12), p.epochs.entries(), served(p))
    assert cleaning.tick()
    while blocking.run():
        pass
    assert cleaning.cleans >= 1
    p.close()
    again = Partition(1, 0, str(tmp_path / "c"), COMPACT)
    assert (
        again.producers.producer(11),
        again.producers.producer(12),
        again.epochs.entries(),
        served(again),
    ) == before
    produce(again, space, b"k0", b"next", producer_id=11, producer_epoch=2, base_sequence=120)  # no gap
    again.close()


def test_a_truncation_below_the_checkpoint_brings_it_down(tmp_path: Path) -> None:
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(tmp_path / "c"), COMPACT)
    for i in range(200):
        produce(p, space, b"k%d" % (i % 3), b"v" * 50)
    blocking = Blocking()
    cleaning = LogCleaning(CleanerConfig(), lambda: [p], blocking, lambda: T0)
    assert cleaning.tick()
    while blocking.run():
        pass
    cleaned_to = cleaning.checkpoint(p).cleaned_to
    assert cleaned_to > 100
    end = p.log.truncate(100)  # a follower dropping a divergent tail
    assert cleaning.checkpoint(p).cleaned_to == end <= 100, "what comes there again is dirty"
    blocking.run()  # the checkpoint saved
    assert load_checkpoint(p.directory).cleaned_to == end
    p.close()


def test_transactions_through_the_cores_cleaner(tmp_path: Path) -> None:
    """The core's cleaner cleans only below the last stable offset, drops the aborted records
    (the plan carries the partition's aborted list to the clean's process) and keeps the
    partition's aborted list in step with the markers the clean kept."""
    space = DiskSpace(str(tmp_path), 0)
    config = replace(COMPACT, segment_bytes=700, max_batch_bytes=700, min_cleanable_dirty_ratio=0.0)
    p = Partition(1, 0, str(tmp_path / "p"), config)
    w = Writer(p, space)
    w.plain(b"a", b"first")  # 0
    w.txn(7, b"a", False)  # 1: aborted
    w.txn(8, b"b", False)  # 2: committed, its batch stays (the producer's last)
    w.end(7, False)  # 3
    w.end(8, True)  # 4
    w.txn(7, b"c", False)  # 5: aborted, its batch stays (the producer's last, emptied)
    w.end(7, False)  # 6
    w.plain(b"d", b"x" * 600)  # 7: rolls
    w.txn(9, b"a", False)  # 8: open
    w.plain(b"d", b"y" * 600)  # 9: rolls
    assert [e.last_offset for e in p.aborted.entries()] == [3, 6] and p.last_stable_offset == 8
    before = committed_view(p)
    blocking = Blocking()
    cleaning = LogCleaning(CleanerConfig(dedupe_buffer_bytes=1 << 16), lambda: [p], blocking)
    assert cleaning.tick()
    assert blocking.run() == 1 and cleaning.cleans == 1
    assert [e.last_offset for e in p.aborted.entries()] == [6], "1's transaction is gone, 5's stays"
    assert p.log.segments[1].base_offset == 7, "the open transaction's segment is not cleaned"
    assert committed_view(p) == before
    p.close()
    again = Partition(1, 0, str(tmp_path / "p"), config)
    assert again.aborted.entries() == [AbortedTxn(7, 5, 6, 7)], "the walk finds what the clean kept"
    assert committed_view(again) == before and again.producers.ongoing() == {9: 8}
    again.close()
