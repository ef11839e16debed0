"""A closed segment's `.txnindex` (broker/storage/txn_index.py's file form): written when the
segment rolls, read at open instead of each marker's record, ignored and rebuilt by the open
walk when absent or damaged, and kept in step by retention, truncation and the cleaner."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_cleaner_txn import CONFIG, clean_partition, state
from txn_kit import Writer, check_files, files, store_markers

from broker.core.partition import Partition
from broker.storage import log_reads
from broker.storage.diskspace import DiskSpace
from broker.storage.layout import TXN_INDEX_SUFFIX


def txn_log(p: Partition, space: DiskSpace, rounds: int = 12) -> None:
    w = Writer(p, space)
    for i in range(rounds):
        pid = 7 + i % 3
        w.txn(pid, b"k%d" % (i % 5), False)
        w.plain(b"p%d" % (i % 4), b"." * 60)
        w.end(pid, commit=i % 4 != 1)
    w.txn(9, b"open", False)
    w.plain(b"z", b"." * 100)


class CountingReads:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = log_reads.control_of

        def counted(*a: object, **kw: object) -> object:
            self.n += 1
            return real(*a, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(log_reads, "control_of", counted)


def test_written_at_roll_and_read_at_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    space = DiskSpace(str(tmp_path), 0)
    directory = tmp_path / "p"
    p = Partition(1, 0, str(directory), CONFIG)
    txn_log(p, space)
    before = state(p), p.aborted.entries()
    closed = len(p.log.segments) - 1
    assert closed >= 3
    p.close()
    p = Partition(1, 0, str(directory), CONFIG)
    assert check_files(p, directory) == closed, "every closed segment has one"
    p.close()
    reads = CountingReads(monkeypatch)
    p = Partition(1, 0, str(directory), CONFIG)
    active_markers = len(store_markers(p)[p.log.segments[-1].base_offset])
    assert (state(p), p.aborted.entries()) == before
    assert reads.n == active_markers, "only the active segment's markers are read from the store"
    p.close()


@pytest.mark.parametrize("damage", ["absent", "flipped", "short", "stale"])
def test_absent_or_damaged_it_is_rebuilt_by_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    space = DiskSpace(str(tmp_path), 0)
    directory = tmp_path / "p"
    p = Partition(1, 0, str(directory), CONFIG)
    txn_log(p, space)
    before = state(p), p.aborted.entries()
    p.close()
    victim = sorted(files(directory))[1]
    path = directory / f"{victim:020d}{TXN_INDEX_SUFFIX}"
    data = bytearray(path.read_bytes())
    if damage == "absent":
        path.unlink()
    elif damage == "flipped":
        data[-3] ^= 0x10
        path.write_bytes(bytes(data))
    elif damage == "short":
        path.write_bytes(bytes(data[:-5]))
    else:  # another segment's file under this one's name
        other = sorted(files(directory))[0]
        path.write_bytes((directory / f"{other:020d}{TXN_INDEX_SUFFIX}").read_bytes())
    reads = CountingReads(monkeypatch)
    p = Partition(1, 0, str(directory), CONFIG)
    assert (state(p), p.aborted.entries()) == before
    assert reads.n > 0, "the walk read the markers"
    assert check_files(p, directory) == len(p.log.segments) - 1, "and wrote the file again"
    p.close()


def test_retention_truncation_and_the_cleaner_keep_it_in_step(tmp_path: Path) -> None:
    space = DiskSpace(str(tmp_path), 0)
    directory = tmp_path / "p"
    p = Partition(1, 0, str(directory), CONFIG)
    txn_log(p, space, rounds=18)
    p.close()
    p = Partition(1, 0, str(directory), CONFIG)
    assert check_files(p, directory) == len(p.log.segments) - 1
    # the cleaner: the replaced segments' files go, the new segments' hold the markers they keep
    now = int(time.time() * 1000)
    assert clean_partition(p, now)
    assert clean_partition(p, now + 2 * CONFIG.delete_retention_ms)
    assert check_files(p, directory) >= 1
    before = state(p)
    p.close()
    p = Partition(1, 0, str(directory), CONFIG)
    assert state(p) == before
    # truncation: the segment cut loses its file (it is active again)
    p.truncate_to(p.log.segments[-2].base_offset + 1)
    assert p.log.segments[-1].base_offset not in files(directory), "the segment cut is active: no file"
    check_files(p, directory)
    # retention: a deleted segment's file goes with it
    closed = {s.base_offset for s in p.log.segments[:-1]}
    p.configure(replace(CONFIG, cleanup_policy="compact,delete", retention_bytes=1))
    left = {s.base_offset for s in p.log.segments[:-1]}
    assert left < closed and set(files(directory)) <= left
    check_files(p, directory)
    p.close()
