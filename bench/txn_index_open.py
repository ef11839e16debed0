"""The open of a partition whose log holds many transaction markers, with and without the closed
segments' `.txnindex` files (broker/storage/txn_index.py's file form): the open walk reads each
batch's header either way; without the files it also reads each marker's record (a second pread
per marker), with them it takes the markers from one small file per segment.

Run: `.venv/bin/python bench/txn_index_open.py [--transactions N] [--segment-bytes B] [--rounds R]`

What runs: one partition (storage and core only, no broker), written as N transactions of one
batch each by three producers, every fourth aborted, a plain batch after each (so half the
batches are markers, a third of the rest transactional), in segments of B bytes; closed. Then R
rounds alternate: open with the files as the roll left them, and open with every `.txnindex`
removed first (that open writes them again; it is removed before the next such round). The page
cache is warm in both (the files were just written): the figure is the walk's CPU and syscalls,
not the disk. Printed: the median open time of each kind (min..max), and the markers per open.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from txn_kit import Writer

from broker.core.partition import Partition
from broker.storage.diskspace import DiskSpace
from broker.storage.layout import TXN_INDEX_SUFFIX
from broker.storage.log import LogConfig


def build(directory: str, transactions: int, segment_bytes: int) -> tuple[int, int]:
    config = LogConfig(segment_bytes=segment_bytes, max_batch_bytes=min(segment_bytes, 1 << 20))
    p = Partition(1, 0, directory, config)
    w = Writer(p, DiskSpace(os.path.dirname(directory), 0))
    for i in range(transactions):
        pid = 7 + i % 3
        w.txn(pid, b"k%d" % (i % 100), False)
        w.end(pid, commit=i % 4 != 3)
        w.plain(b"p%d" % (i % 100), b"." * 40)
    segments = len(p.log.segments)
    p.close()
    return segments, transactions


def open_once(directory: str, config: LogConfig) -> float:
    started = time.perf_counter()
    p = Partition(1, 0, directory, config)
    elapsed = time.perf_counter() - started
    p.close()
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transactions", type=int, default=20_000)
    ap.add_argument("--segment-bytes", type=int, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="txnindex-bench-")
    try:
        directory = os.path.join(base, "p")
        segments, markers = build(directory, args.transactions, args.segment_bytes)
        config = LogConfig(segment_bytes=args.segment_bytes, max_batch_bytes=min(args.segment_bytes, 1 << 20))
        with_files: list[float] = []
        without: list[float] = []
        for _ in range(args.rounds):
            with_files.append(open_once(directory, config))
            for name in os.listdir(directory):
                if name.endswith(TXN_INDEX_SUFFIX):
                    os.unlink(os.path.join(directory, name))
            without.append(open_once(directory, config))  # writes them again
        print(f"{markers} markers, {3 * markers} batches, {segments} segments of {args.segment_bytes} bytes")
        for label, times in (("with .txnindex", with_files), ("without (walk reads markers)", without)):
            print(
                f"  open {label:30s} {statistics.median(times) * 1e3:8.1f} ms "
                f"({min(times) * 1e3:.1f}..{max(times) * 1e3:.1f}), n={len(times)}"
            )
        print(f"  ratio without/with: {statistics.median(without) / statistics.median(with_files):.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
