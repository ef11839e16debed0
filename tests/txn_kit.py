"""Helpers of the tests of transactions in a partition's log (tests/storage/test_cleaner_txn.py,
tests/core/test_cleaning.py): a transactional producer per producer id driving a `Partition`
with its allow switch (the wire still refuses transactional batches), and what a read_committed
consumer ends with."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from crc32c import crc32c

from broker.core.partition import Isolation, Partition, PendingProduce, PendingRead, ReadAnswer
from broker.storage.diskspace import DiskSpace
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.layout import TXN_INDEX_SUFFIX
from broker.storage.txn_index import AbortedTxn, MarkerEntry, decode_txn_file
from ringlog_proto.batch import CRC_START, Record, decode_records, encode_batch, iter_batches
from ringlog_proto.batch_control import control_of
from ringlog_proto.batch_header import TRANSACTIONAL_BIT

IO = SyncFileIO()
T0 = 1_700_000_000_000
KEYS = [b"a", b"b", b"c", b"d"]
PIDS = [7, 8, 9]


def batch(key: bytes, value: bytes | None, pid: int = -1, seq: int = -1, txn: bool = False) -> bytes:
    out = bytearray(
        encode_batch(
            [Record(value, key=key, timestamp=T0)],
            producer_id=pid,
            producer_epoch=0 if pid >= 0 else -1,
            base_sequence=seq,
        )
    )
    if txn:
        struct.pack_into(">h", out, 21, TRANSACTIONAL_BIT)
        struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


class Writer:
    """Produces into a partition as a transactional producer per pid would."""

    def __init__(self, p: Partition, space: DiskSpace) -> None:
        self.p = p
        self.space = space
        self.seq = dict.fromkeys(PIDS, 0)
        self.open: set[int] = set()
        self.n = 0

    def plain(self, key: bytes, value: bytes | None) -> None:
        self._run(self.p.produce(batch(key, value), self.space))

    def txn(self, pid: int, key: bytes, tombstone: bool) -> None:
        self.n += 1
        value = None if tombstone else b"%d-%d" % (pid, self.n)
        self._run(self.p.produce(batch(key, value, pid, self.seq[pid], True), self.space, transactional=True))
        self.seq[pid] += 1
        self.open.add(pid)

    def end(self, pid: int, commit: bool) -> None:
        self._run(self.p.write_marker(pid, 0, 0, commit))
        self.open.discard(pid)

    @staticmethod
    def _run(out: object) -> None:
        assert isinstance(out, PendingProduce)
        run_ops(IO, out.pending.ops)
        out.complete()


def _read(read: PendingRead) -> ReadAnswer:
    if read.extent is None:
        return read.nothing()
    extent = read.extent
    return read.finish(IO.pread(extent.segment.store_fd, extent.length, extent.position))


def committed_view(p: Partition) -> tuple[dict[bytes, bytes], set[bytes]]:
    """What a read_committed consumer ends with, read from the log start in small reads (Kafka's
    consumer filter: the aborted list of each answer, markers skipped): each key's last value
    (a tombstone removes it), and every value it was shown."""
    view: dict[bytes, bytes] = {}
    seen: set[bytes] = set()
    offset = p.log.start_offset
    aborted_pids: set[int] = set()
    pending: list[AbortedTxn] = []
    while True:
        answer = _read(p.read(offset, 300, Isolation.LAST_STABLE))
        data = bytes(answer.records)
        if not data:
            break
        pending = sorted({*pending, *answer.aborted}, key=lambda e: e.first_offset)
        for pos, h in iter_batches(data):
            if h.next_offset <= offset:
                continue
            while pending and pending[0].first_offset <= h.last_offset:
                aborted_pids.add(pending.pop(0).producer_id)
            if h.control:
                if control_of(data, pos).type == 0 and h.producer_id in aborted_pids:
                    aborted_pids.discard(h.producer_id)
                continue
            if h.transactional and h.producer_id in aborted_pids:
                continue
            for r in decode_records(data, pos):
                if r.offset < offset:
                    continue
                assert r.key is not None
                if r.value is None:
                    view.pop(r.key, None)
                else:
                    view[r.key] = r.value
                    seen.add(r.value)
            offset = h.next_offset
        offset = max(offset, h.next_offset)
    return view, seen


def store_markers(p: Partition) -> dict[int, list[MarkerEntry]]:
    """Each segment's markers, read from its store: the truth a `.txnindex` must match."""
    out = {}
    for seg in p.log.segments:
        with open(seg.store_path, "rb") as f:
            data = f.read(seg.size)
        found = []
        for pos, h in iter_batches(data):
            if h.control:
                c = control_of(data, pos)
                found.append(MarkerEntry(h.base_offset, c.coordinator_epoch, c.type))
        out[seg.base_offset] = found
    return out


def files(directory: Path) -> dict[int, bytes]:
    return {
        int(n.split(".")[0]): (directory / n).read_bytes()
        for n in os.listdir(directory)
        if n.endswith(TXN_INDEX_SUFFIX)
    }


def check_files(p: Partition, directory: Path) -> int:
    """Every `.txnindex` present describes its segment and holds its markers; returns how many."""
    truth = store_markers(p)
    segs = {s.base_offset: s for s in p.log.segments}
    found = files(directory)
    for base, data in found.items():
        seg = segs[base]
        assert decode_txn_file(data, base, seg.next_offset, seg.size) == truth[base], base
    return len(found)
