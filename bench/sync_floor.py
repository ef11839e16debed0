"""The most R12's acks=all shape (bench/scale.py) can take from this machine's disk: the same
writes and syncs with no broker, so that R12's acks=all figures can be read as the disk's share
and ours.

One node's acks=all answers a produce once its bytes are on disk (docs/STORAGE.md); a group
commit over many partitions makes them durable with one `syncfs` for all
(broker/backends/appends.py). Here a writer thread appends 1 KiB records in batches round robin
over `files` files (R12's shape: librdkafka's ~100-record batches over 1000 partitions, ~1 MB
batches over one) while a syncer thread calls `syncfs` in a loop; a record counts once a
`syncfs` that began after its write has returned, and the writer waits while `window` records
are written and not yet synced (librdkafka's `queue.buffering.max.messages`, 100 000 by default:
R12's producer holds no more than that unacknowledged). Each file is allocated ahead of its
writes as a segment is (`posix_fallocate`, broker/storage/preallocation.py), here in steps of
what it holds so far, 1 MiB at least: writes into allocated blocks cost the sync less (over 1000
files, 3 s runs: 409k rec/s against 277k appending without). What is left out is everything of the
broker's: the network, the requests, the Python; what stays is the page-cache copy, the
writeback of every file dirtied since the last sync and the journal's commit.

Run by bench/scale.py for R12 (in a process of its own); alone:
`.venv/bin/python bench/sync_floor.py [--dir DIR] [--seconds S]`. Prints one JSON object: records
a second over one file and over `--files`, each the median of two runs alternated (one, many,
many, one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.storage.fileio import SyncFileIO

RECORD_BYTES = 1024
WINDOW_RECORDS = 100_000  # librdkafka's queue.buffering.max.messages default
ALLOCATE_MIN = 1 << 20  # the first allocation step of a file
MANY_BATCH = 100  # records a write over many files: R12's ~100-record requests over 1000
ONE_BATCH = 960  # over one file: librdkafka's 1 MB batch of 1 KiB records


class Synced:
    """Records written and records synced, shared by the writer and the syncer."""

    def __init__(self, window: int) -> None:
        self.cond = threading.Condition()
        self.written = 0
        self.synced = 0
        self.window = window
        self.stop = False


def _syncer(fd: int, state: Synced, io: SyncFileIO) -> None:
    while True:
        with state.cond:
            while state.written == state.synced and not state.stop:
                state.cond.wait()
            if state.stop:
                return
            mark = state.written
        io.syncfs(fd)
        with state.cond:
            state.synced = mark
            state.cond.notify_all()


def run(where: Path, files: int, batch: int, seconds: float, window: int) -> float:
    """Records a second synced over `files` files, `batch` records a write."""
    io = SyncFileIO()
    root = Path(tempfile.mkdtemp(prefix="sync-floor-", dir=where))
    fds = [io.open(str(root / f"{i:05d}.log"), create=True) for i in range(files)]
    buf = os.urandom(RECORD_BYTES * batch)
    state = Synced(window)
    syncer = threading.Thread(target=_syncer, args=(fds[0], state, io), daemon=True)
    syncer.start()
    offsets = [0] * files
    allocated = [0] * files
    try:
        t0 = time.perf_counter()
        end = t0 + seconds
        synced0 = 0
        i = 0
        while True:
            with state.cond:
                while state.written - state.synced + batch > state.window:
                    state.cond.wait()
            now = time.perf_counter()
            if now >= end:
                with state.cond:
                    synced0 = state.synced
                break
            fd, offset = fds[i], offsets[i]
            if offset + len(buf) > allocated[i]:
                allocated[i] = offset + len(buf) + max(ALLOCATE_MIN, offset)
                os.posix_fallocate(fd, 0, allocated[i])
            offsets[i] += os.pwrite(fd, buf, offset)
            i = (i + 1) % files
            with state.cond:
                state.written += batch
                state.cond.notify_all()
        wall = time.perf_counter() - t0
        return synced0 / wall
    finally:
        with state.cond:
            state.stop = True
            state.cond.notify_all()
        syncer.join()
        for fd in fds:
            io.close(fd)
        shutil.rmtree(root, ignore_errors=True)


def floor(where: Path, files: int, seconds: float, window: int = WINDOW_RECORDS) -> dict[str, float]:
    """{"one": rate, "many": rate} in records a second, each the median of two runs (one, many,
    many, one: a drift of the VM between them shows in both)."""
    ones, manys = [], []
    ones.append(run(where, 1, ONE_BATCH, seconds, window))
    manys.append(run(where, files, MANY_BATCH, seconds, window))
    manys.append(run(where, files, MANY_BATCH, seconds, window))
    ones.append(run(where, 1, ONE_BATCH, seconds, window))
    return {"one": statistics.median(ones), "many": statistics.median(manys), "files": files}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go (the broker's disk)")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=2.0, help="each of the four runs")
    ap.add_argument("--window", type=int, default=WINDOW_RECORDS, help="records written and not yet synced")
    args = ap.parse_args(argv)
    print(json.dumps(floor(Path(args.dir), args.files, args.seconds, args.window)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
