"""A clean restart (the core's marker and each partition's snapshot: broker/storage/clean_marker.py,
broker/storage/producer_snapshot.py) must leave exactly the state a crash restart (the recovery
scan and the header walk) rebuilds: producers, sequences, epochs, open and aborted transactions,
the last stable offset and the high watermark. Any doubt (a damaged, missing, stale or foreign
snapshot; no marker; a kill -9 after a clean start) is the full path."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.core import lifecycle
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.partition import Partition, PendingProduce
from broker.core.producer_state import CoordinatorFencedError, FencedEpochError, SequenceError
from broker.storage import clean_marker, producer_snapshot
from broker.storage.diskspace import DiskSpace
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.fileio import SYNCFS_MIN, SyncFileIO, run_ops
from broker.storage.log import LogConfig
from ringlog_proto.batch import CRC_START, Record, encode_batch
from ringlog_proto.batch_header import TRANSACTIONAL_BIT

IO = SyncFileIO()
SMALL = LogConfig(segment_bytes=600, max_batch_bytes=600)  # a few batches per segment: rolls
T0 = 1_700_000_000_000
TOKEN = 0x5EED


def batch(n: int = 1, pid: int = -1, seq: int = -1, epoch: int = 0, txn: bool = False) -> bytes:
    out = bytearray(
        encode_batch(
            [Record(b"v", timestamp=T0 + max(seq, 0))] * n,
            producer_id=pid,
            producer_epoch=epoch if pid >= 0 else -1,
            base_sequence=seq,
        )
    )
    if txn:
        struct.pack_into(">h", out, 21, TRANSACTIONAL_BIT)
        struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


def run(out: PendingProduce) -> None:
    run_ops(IO, out.pending.ops)
    out.complete()


def close_clean(p: Partition) -> None:
    """What `Core.close` does for each partition: close, then write the snapshot."""
    snap = p.close(token=TOKEN)
    assert snap is not None and p.write_snapshot(snap)


def state(p: Partition) -> dict[str, object]:
    """Everything a restart derives from the headers, but each producer's last write time: the
    walk knows only its segment's last append time (a bound), the snapshot the time itself."""
    producers = sorted(x._replace(last_write_ms=0) for x in p.producers.snapshot())
    return {
        "producers": producers,
        "active": p.producers.active(),
        "open": [t[:3] + t[4:] for t in p.producers.open_transactions()],
        "last_offsets": p.producers.last_offsets(),
        "last_markers": p.producers.last_markers(),
        "epochs": p.epochs.entries(),
        "leader_epoch": p.leader_epoch,
        "aborted": p.aborted.entries(),
        "lso": p.last_stable_offset,
        "hw": p.high_watermark,
        "start": p.log.start_offset,
        "end": p.log.end_offset,
        "durable": p.log.durable_offset,
        "segments": [(s.base_offset, s.size, s.next_offset) for s in p.log.segments],
    }


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("produce"), st.integers(1, 3), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("plain"), st.integers(1, 3)),
        st.tuples(st.just("bump"), st.integers(1, 3)),
        st.tuples(st.just("marker"), st.integers(1, 3), st.booleans(), st.integers(0, 2)),
        st.tuples(
            st.just("epoch"),
        ),
        st.tuples(st.just("delete"), st.floats(0, 1)),
    ),
    max_size=30,
)


def play(p: Partition, ops: list[tuple], space: DiskSpace) -> None:
    seqs = {pid: 0 for pid in (1, 2, 3)}
    epochs = {pid: 0 for pid in (1, 2, 3)}
    for op in ops:
        try:
            if op[0] == "produce":
                _, pid, n, txn = op
                out = p.produce(batch(n, pid, seqs[pid], epochs[pid], txn), space, transactional=True)
                assert isinstance(out, PendingProduce)
                run(out)
                seqs[pid] += n
            elif op[0] == "plain":
                out = p.produce(batch(op[1]), space)
                assert isinstance(out, PendingProduce)
                run(out)
            elif op[0] == "bump":
                epochs[op[1]] += 1
                seqs[op[1]] = 0
            elif op[0] == "marker":
                _, pid, commit, coordinator_epoch = op
                run(p.write_marker(pid, epochs[pid], coordinator_epoch, commit))
            elif op[0] == "epoch":
                p.leader_epoch += 1
            else:
                p.delete_records(int(op[1] * p.high_watermark))
        except (SequenceError, FencedEpochError, CoordinatorFencedError, OffsetOutOfRangeError):
            pass  # refused: nothing changed, as the walk will find


def restarted(tmp_path: Path, ops: list[tuple]) -> tuple[Partition, Partition]:
    """(the clean restart, the crash restart of a copy of the same files) after `ops`."""
    space = DiskSpace(str(tmp_path), 0)
    d = tmp_path / "p"
    p = Partition(1, 0, str(d), SMALL)
    play(p, ops, space)
    before = state(p)
    before["durable"] = p.log.end_offset  # the close flushes
    before["leader_epoch"] = max(p.epochs.latest_epoch, 0)  # a single node's: from its batches
    close_clean(p)
    shutil.copytree(d, tmp_path / "crash")
    clean = Partition(1, 0, str(d), SMALL, clean=TOKEN)
    crash = Partition(1, 0, str(tmp_path / "crash"), SMALL)
    assert clean.log.opened_clean and not crash.log.opened_clean
    after = state(clean)
    # It is the state the partition had when it closed (an unstable completed transaction below
    # the log end is stable once read: the high watermark is the log end here) ...
    assert after == before
    # ... and the walk's. Where the log start moved (DeleteRecords), the partition kept what Kafka
    # keeps and the walk cannot see: an open transaction or the latest epoch whose batches all
    # went, an abort whose transaction's batches went before its marker, the start inside a
    # batch (the walk reads from that batch): compared where it can.
    walked = state(crash)
    if any(op[0] == "delete" for op in ops):
        for key in ("producers", "active", "open", "last_offsets", "last_markers", "epochs", "aborted"):
            walked[key] = after[key]
        walked["leader_epoch"], walked["lso"] = after["leader_epoch"], after["lso"]
    assert after == walked
    return clean, crash


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
# DeleteRecords to the end keeps the active segment; the next record rolls it, wholly below the
# start: deleted at that roll, as the restart's open would (it was kept until a restart before)
@example(ops=[("plain", 1)] * 8 + [("delete", 1.0), ("plain", 1)])
def test_a_clean_restart_has_the_state_of_a_crash_restart(tmp_path_factory, ops) -> None:
    tmp_path = tmp_path_factory.mktemp("h")
    clean, crash = restarted(tmp_path, ops)
    for p in (clean, crash):
        p.log.abandon()


def test_a_hand_written_history_of_transactions_epochs_and_deletions(tmp_path: Path) -> None:
    ops = [
        ("produce", 1, 2, False),
        ("produce", 2, 1, True),
        ("epoch",),
        ("produce", 3, 2, True),
        ("marker", 2, False, 0),  # an abort: in the aborted list
        ("plain", 3),
        ("bump", 1),
        ("produce", 1, 1, False),
        ("delete", 0.2),
        ("marker", 3, True, 1),
        ("produce", 2, 2, True),  # still open at the close
        ("epoch",),
        ("plain", 1),
    ]
    clean, crash = restarted(tmp_path, ops)
    assert clean.producers.ongoing() == {2: crash.producers.ongoing()[2]}
    assert clean.last_stable_offset < clean.high_watermark, "the open transaction holds it"
    assert len(clean.aborted) == 1 and clean.epochs.latest_epoch == 2
    # the restored state goes on as the walked one does
    space = DiskSpace(str(tmp_path), 0)
    for p in (clean, crash):
        run(p.write_marker(2, 0, 1, False))
        out = p.produce(batch(1, 1, 1, 1), space)
        assert isinstance(out, PendingProduce)
        run(out)
    assert state(clean) == state(crash)
    clean.log.abandon()
    crash.log.abandon()


def closed_with_snapshot(tmp_path: Path) -> Path:
    d = tmp_path / "p"
    p = Partition(1, 0, str(d), SMALL)
    history = [("produce", 1, 2, True), ("produce", 2, 1, False), ("marker", 1, False, 0)]
    play(p, history, DiskSpace(str(tmp_path), 0))
    close_clean(p)
    return d


@pytest.mark.parametrize(
    "damage",
    ["flip", "truncate", "empty", "token", "missing"],
)
def test_a_damaged_missing_or_foreign_snapshot_is_the_walk(tmp_path: Path, damage: str, caplog) -> None:
    caplog.set_level(logging.INFO, "broker.core.partition")
    d = closed_with_snapshot(tmp_path)
    shutil.copytree(d, tmp_path / "crash")
    path = d / producer_snapshot.SNAPSHOT_FILE
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:40] + bytes([data[40] ^ 1]) + data[41:])
    elif damage == "truncate":
        path.write_bytes(data[:-9])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "missing":
        path.unlink()
    token = TOKEN + 1 if damage == "token" else TOKEN  # a snapshot of another run
    p = Partition(1, 0, str(d), SMALL, clean=token)
    crash = Partition(1, 0, str(tmp_path / "crash"), SMALL)
    assert not p.log.opened_clean, "a snapshot in doubt: the full open, syncs and all"
    assert state(p) == state(crash)
    assert "the header walk" in caplog.text
    p.log.abandon()
    crash.log.abandon()


def test_a_log_changed_since_its_snapshot_is_the_full_path(tmp_path: Path) -> None:
    """A run that opened the partition on the full path, wrote to it and was killed leaves the
    snapshot of the close before: its token may match a marker, its log no longer does."""
    d = closed_with_snapshot(tmp_path)
    p = Partition(1, 0, str(d), SMALL)  # no marker
    out = p.produce(batch(1, 2, 1), DiskSpace(str(tmp_path), 0))
    assert isinstance(out, PendingProduce)
    run(out)
    p.log.abandon()  # kill -9
    shutil.copytree(d, tmp_path / "crash")
    again = Partition(1, 0, str(d), SMALL, clean=TOKEN)
    crash = Partition(1, 0, str(tmp_path / "crash"), SMALL)
    assert not again.log.opened_clean
    assert state(again) == state(crash)
    assert again.producers.producer(2) == (0, 1)
    again.log.abandon()
    crash.log.abandon()


def test_a_torn_tail_after_a_snapshot_is_recovered(tmp_path: Path) -> None:
    d = closed_with_snapshot(tmp_path)
    store = d / "00000000000000000000.log"
    if not store.exists():  # rolled: the active one is the last
        store = sorted(d.glob("*.log"))[-1]
    with open(store, "ab") as f:
        f.write(b"\x07" * 50)  # garbage after the last batch, as a crash could leave
    p = Partition(1, 0, str(d), SMALL, clean=TOKEN)
    assert not p.log.opened_clean
    assert os.path.getsize(store) == p.log.segments[-1].size, "cut by recovery"
    p.log.abandon()


# ----------------------------------------------------------------------------- the core's marker


def core_at(data: Path, cores: int = 1, core_id: int = 0) -> Core:
    return Core(BrokerConfig(data_dir=str(data), cores=cores, core_id=core_id))


def produce_to_every(core: Core, name: str, count: int, seq: int = 0) -> None:
    space = DiskSpace(core.config.data_dir, 0)
    topic = core.registry.by_name.get(name) or core.create_topic(name, count)
    for i in range(count):
        if core.owner(topic.topic_id, i) != core.config.core_id:
            continue
        p = core.partition(topic.topic_id, i)
        out = p.produce(batch(2, 7, seq), space)
        assert isinstance(out, PendingProduce)
        run(out)


def opened_clean(core: Core) -> list[bool]:
    return [p.log.opened_clean for p in core.partitions.values()]


def test_a_clean_close_marks_the_core_and_the_next_start_takes_the_mark(tmp_path: Path) -> None:
    core = core_at(tmp_path)
    produce_to_every(core, "t", 4)
    core.close()
    marker = Path(clean_marker.marker_path(str(tmp_path), 0))
    doc = json.loads(marker.read_text())
    assert doc["core"] == 0 and doc["cores"] == 1 and isinstance(doc["token"], int)
    again = core_at(tmp_path)
    assert not marker.exists(), "taken before any partition opens"
    assert opened_clean(again) == [True] * 4
    assert all(p.producers.producer(7) == (0, 1) for p in again.partitions.values())
    produce_to_every(again, "t", 4, seq=2)  # sequences go on from the snapshot's
    again.close()
    assert marker.exists()


def test_kill_9_after_a_clean_start_is_a_full_recovery(tmp_path: Path) -> None:
    core = core_at(tmp_path)
    produce_to_every(core, "t", 3)
    core.close()
    clean = core_at(tmp_path)
    assert opened_clean(clean) == [True] * 3
    produce_to_every(clean, "t", 3, seq=2)
    for p in clean.partitions.values():
        p.log.abandon()  # kill -9: nothing closed, no marker
    after = core_at(tmp_path)
    assert opened_clean(after) == [False] * 3
    assert all(p.producers.producer(7) == (0, 3) and p.log.end_offset == 4 for p in after.partitions.values())
    after.close()


def test_a_failed_close_writes_no_marker(tmp_path: Path) -> None:
    core = core_at(tmp_path)
    produce_to_every(core, "t", 2)
    first = next(iter(core.partitions.values()))
    first.log.mark_broken("a failed fdatasync")
    core.close()
    assert not os.path.exists(clean_marker.marker_path(str(tmp_path), 0))
    assert opened_clean(core_at(tmp_path)) == [False, False]


class FailingSync(SyncFileIO):
    """A disk whose fdatasync fails (what `Core.close` runs on its threads)."""

    def fdatasync(self, fd: int) -> None:
        raise OSError(errno.EIO, "injected")


def test_a_close_of_many_partitions_in_chunks_closes_each_clean(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(lifecycle, "CLOSE_CHUNK", 4)  # several chunks, planned while the last syncs
    core = core_at(tmp_path)
    produce_to_every(core, "t", 11)
    logs = [p.log for p in core.partitions.values()]
    stores = [log.segments[-1].store_path for log in logs]
    sizes = [(os.path.getsize(s), log.segments[-1].size) for s, log in zip(stores, logs, strict=True)]
    assert all(on_disk > size for on_disk, size in sizes), "preallocated"
    core.close()
    assert all(log.closed and log.durable_offset == log.end_offset for log in logs)
    sizes = [(os.path.getsize(s), log.segments[-1].size) for s, log in zip(stores, logs, strict=True)]
    assert all(on_disk == size for on_disk, size in sizes), "tails given back"
    assert all(not s.pinned for log in logs for s in log.segments)
    assert os.path.exists(clean_marker.marker_path(str(tmp_path), 0))
    again = core_at(tmp_path)
    assert opened_clean(again) == [True] * 11
    again.close()


def test_a_sync_failing_on_a_close_thread_writes_no_marker_and_closes_the_rest(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(lifecycle, "CLOSE_CHUNK", 3)
    core = core_at(tmp_path)
    produce_to_every(core, "t", 7)
    parts = list(core.partitions.values())
    parts[4].log.io = FailingSync()
    with caplog.at_level(logging.ERROR):
        core.close()
    assert not os.path.exists(clean_marker.marker_path(str(tmp_path), 0))
    assert any("closing partition" in r.getMessage() and "injected" in r.getMessage() for r in caplog.records)
    assert all(p.log.closed for p in parts)
    assert [p.log._broken is not None for p in parts] == [False] * 4 + [True] + [False] * 2
    assert all(not s.pinned for p in parts for s in p.log.segments)
    assert opened_clean(core_at(tmp_path)) == [False] * 7


def test_a_marker_of_another_core_count_is_not_used_and_stale_ones_go(tmp_path: Path) -> None:
    for k in range(2):
        core = core_at(tmp_path, cores=2, core_id=k)
        produce_to_every(core, "t", 4)
        core.close()
    assert all(os.path.exists(clean_marker.marker_path(str(tmp_path), k)) for k in range(2))
    one = core_at(tmp_path, cores=1)  # the partitions each core owns changed with the count
    assert not any(opened_clean(one))
    assert not os.path.exists(clean_marker.marker_path(str(tmp_path), 1)), "core 0 removes core 1's"
    for p in one.partitions.values():
        p.log.abandon()


def test_the_supervisor_keeps_markers_when_it_clears_the_run_directory(tmp_path: Path) -> None:
    from broker.node.startup import prepare_data_dir

    core = core_at(tmp_path)
    produce_to_every(core, "t", 1)
    core.close()
    stale = Path(tmp_path / "run" / "view.json")
    stale.write_text("{}")
    fd = prepare_data_dir(str(tmp_path), LogConfig(), core.config.limits)
    os.close(fd)
    assert not stale.exists()
    assert os.path.exists(clean_marker.marker_path(str(tmp_path), 0))


# ------------------------------------------------------------------ many partitions: one syncfs


@pytest.fixture
def syncs(monkeypatch) -> dict[str, int]:
    """Counts of the process's FileIO syncs (every log here uses `SyncFileIO`)."""
    counts = {"syncfs": 0, "fdatasync": 0}
    real_syncfs, real_fdatasync = SyncFileIO.syncfs, SyncFileIO.fdatasync

    def syncfs(self: SyncFileIO, fd: int) -> None:
        counts["syncfs"] += 1
        real_syncfs(self, fd)

    def fdatasync(self: SyncFileIO, fd: int) -> None:
        counts["fdatasync"] += 1
        real_fdatasync(self, fd)

    monkeypatch.setattr(SyncFileIO, "syncfs", syncfs)
    monkeypatch.setattr(SyncFileIO, "fdatasync", fdatasync)
    return counts


def failing_syncfs(self: SyncFileIO, fd: int) -> None:
    raise OSError(errno.EIO, "injected syncfs")


MANY = SYNCFS_MIN + 8


def test_a_close_of_many_partitions_syncs_the_file_system_once_a_chunk(tmp_path: Path, syncs) -> None:
    core = core_at(tmp_path)
    produce_to_every(core, "t", MANY)
    logs = [p.log for p in core.partitions.values()]
    syncs.update(syncfs=0, fdatasync=0)
    core.close()
    assert syncs == {"syncfs": 1, "fdatasync": 0}
    assert all(log.closed and log.durable_offset == log.end_offset for log in logs)
    assert all(os.path.getsize(log.segments[-1].store_path) == log.segments[-1].size for log in logs)
    assert os.path.exists(clean_marker.marker_path(str(tmp_path), 0))
    again = core_at(tmp_path)
    assert opened_clean(again) == [True] * MANY
    assert all(p.log.end_offset == 2 for p in again.partitions.values())
    again.close()


def test_a_failed_syncfs_at_close_falls_back_to_each_partitions_syncs(
    tmp_path: Path, syncs, monkeypatch
) -> None:
    """Each log's own syncs then say which failed: here one, which alone closes unclean."""
    core = core_at(tmp_path)
    produce_to_every(core, "t", MANY)
    parts = list(core.partitions.values())
    parts[3].log.io = FailingSync()
    monkeypatch.setattr(SyncFileIO, "syncfs", failing_syncfs)
    syncs.update(fdatasync=0)
    core.close()
    assert syncs["fdatasync"] == 2 * (MANY - 1)  # the store and the index of each but the failing one
    assert [p.log._broken is not None for p in parts] == [False] * 3 + [True] + [False] * (MANY - 4)
    assert all(p.log.closed for p in parts)
    assert not os.path.exists(clean_marker.marker_path(str(tmp_path), 0))


def crashed_with_many(tmp_path: Path) -> None:
    core = core_at(tmp_path)
    produce_to_every(core, "t", MANY)
    for p in core.partitions.values():
        p.log.abandon()  # kill -9: nothing closed, no marker


def test_a_recovery_of_many_partitions_syncs_the_file_system_once(tmp_path: Path, syncs) -> None:
    crashed_with_many(tmp_path)
    syncs.update(syncfs=0, fdatasync=0)
    after = core_at(tmp_path)
    assert syncs == {"syncfs": 1, "fdatasync": 0}
    assert opened_clean(after) == [False] * MANY
    assert all(p.log.end_offset == 2 and p.log.durable_offset == 2 for p in after.partitions.values())
    assert after.lifecycle.recovered is None
    after.close()


def test_a_failed_syncfs_at_start_syncs_each_recovered_log(tmp_path: Path, syncs, monkeypatch) -> None:
    crashed_with_many(tmp_path)
    monkeypatch.setattr(SyncFileIO, "syncfs", failing_syncfs)
    syncs.update(fdatasync=0)
    after = core_at(tmp_path)
    assert syncs["fdatasync"] == 2 * MANY  # the store and the index of each, as before syncfs
    assert all(p.log.end_offset == 2 for p in after.partitions.values())
    after.close()


def test_a_few_recovered_partitions_keep_their_own_syncs(tmp_path: Path, syncs) -> None:
    core = core_at(tmp_path)
    produce_to_every(core, "t", 3)
    for p in core.partitions.values():
        p.log.abandon()
    syncs.update(syncfs=0, fdatasync=0)
    after = core_at(tmp_path)
    assert syncs == {"syncfs": 0, "fdatasync": 6}
    after.close()
