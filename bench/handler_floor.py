"""What the broker's Python request handlers alone cost per request, measured in this process
with no event loop, no socket and no backend: the least any backend that keeps the handlers in
Python (the direction the performance work keeps: the request path leaves the interpreter, the
handlers stay Python) adds to the kernel's floor.

bench/perf.py runs it beside its floors and prints floor + handlers as the lower bound of each
CPU-per-GB target. Run alone: `.venv/bin/python bench/handler_floor.py [--rounds N]`.

- Produce: `RinglogAdapter.handle` of a pre-built ProduceRequest frame (one 64 KiB batch of 63 1 KiB
  values, acks=1) -> its Append, whose writes `SyncFileIO` runs untimed (a pwritev: the floor's)
  -> `complete()` -> the reply's bytes. Less a crc32c of the batch (the floor's too), what is
  left is parsing the request, validation (header checks, the C record walk), offsets, index,
  producer state and the reply.
- Fetch: `handle` of a 1 MiB FetchRequest -> its Read's extent as a view of the mapped segment
  (what the io_uring backend serves from the page cache) -> `finish(view)` (the stored-batch
  check, in C) -> the reply; less a crc32c of the same mapped extents (the floor's): locating
  the extent, the check's call, the reply.

Frames are built before the timed sections (decoding them is the backend's). Times are
`perf_counter_ns` of this process, pinned and busy for the whole section; each round is
reported (the VM's noise shows in the spread).
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from crc32c import crc32c

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Append, Read, Reply
from broker.ringlog.adapter import RinglogAdapter
from broker.storage.fileio import SyncFileIO, run_ops
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch
from ringlog_proto.frames import FrameDecoder

VALUE_BYTES = 1024
BATCH_RECORDS = 63  # 64 KiB batches, as perf.py's ingest
FETCH_BYTES = 1 << 20
PRODUCE_BATCHES = 3000
FETCHES = 600
GB = 1e9


def _reply(outcome: Any) -> m.Response:
    assert isinstance(outcome, Reply), outcome
    d = FrameDecoder()
    d.feed(b"".join(outcome.buffers))
    frame = d.next_frame()
    return m.decode_response(frame)  # type: ignore[arg-type]


def _map(fd: int, length: int) -> memoryview:
    return memoryview(mmap.mmap(fd, length, prot=mmap.PROT_READ))


def measure(workdir: Path, rounds: int) -> dict[str, list[float]]:
    """Per round: the handlers' µs per request and CPU-seconds per GB of values produced and
    fetched, without what the floors already count (the write, the crc)."""
    h = RinglogAdapter(Core(BrokerConfig(data_dir=str(workdir / "handlers"))))
    out: dict[str, list[float]] = {"produce_us": [], "produce_s_gb": [], "fetch_us": [], "fetch_s_gb": []}
    try:
        created = _reply(h.handle(m.request_frame(m.CreateTopicRequest("h", 1), 1)))
        assert isinstance(created, m.CreateTopicResponse) and created.error == m.ErrorCode.NONE, created
        tid = created.topic_id
        batch = encode_batch([os.urandom(VALUE_BYTES) for _ in range(BATCH_RECORDS)])
        io = SyncFileIO()
        value_gb = BATCH_RECORDS * VALUE_BYTES / GB  # per batch

        def produce(n: int) -> float:
            """Seconds per request in the handlers (the writes between are not counted)."""
            frames = [
                m.request_frame(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 30_000, batch), i) for i in range(n)
            ]
            ns = time.perf_counter_ns
            spent = 0
            for f in frames:
                t0 = ns()
                outcome = h.handle(f)
                t1 = ns()
                assert isinstance(outcome, Append), outcome
                run_ops(io, outcome.pending.ops)
                t2 = ns()
                outcome.complete()
                spent += t1 - t0 + ns() - t2
            return spent / n / 1e9

        def crc(n: int) -> float:
            t = time.perf_counter_ns()
            for _ in range(n):
                crc32c(batch)
            return (time.perf_counter_ns() - t) / n / 1e9

        produce(200)  # warm: the segment's first pages, the code
        for _ in range(rounds):
            handled = produce(PRODUCE_BATCHES) - crc(PRODUCE_BATCHES)
            out["produce_us"].append(handled * 1e6)
            out["produce_s_gb"].append(handled / value_gb)

        log = h.core.partitions[(tid, 0)].log
        end = log.end_offset

        def fetch(n: int) -> tuple[float, list[memoryview]]:
            views: list[memoryview] = []
            offset = 0
            t = time.perf_counter_ns()
            for i in range(n):
                outcome = h.handle(m.request_frame(m.FetchRequest(tid, 0, offset, FETCH_BYTES, 0, 1), i))
                assert isinstance(outcome, Read), outcome
                extent = outcome.extent
                view = extent.segment.mapped(extent, _map)
                outcome.finish(view)
                views.append(view)
                offset = extent.first_offset + extent.length // len(batch) * BATCH_RECORDS
                if offset >= end:
                    offset = 0
            return (time.perf_counter_ns() - t) / n / 1e9, views

        def crcs(views: list[memoryview]) -> float:
            t = time.perf_counter_ns()
            for v in views:
                crc32c(v)
            return (time.perf_counter_ns() - t) / len(views) / 1e9

        _, views = fetch(100)
        fetch_gb = len(views[0]) * BATCH_RECORDS * VALUE_BYTES / len(batch) / GB
        for _ in range(rounds):
            handled, views = fetch(FETCHES)
            floor = crcs(views)
            out["fetch_us"].append((handled - floor) * 1e6)
            out["fetch_s_gb"].append((handled - floor) / fetch_gb)
    finally:
        h.core.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rl-handlers-"))
    try:
        r = measure(workdir, args.rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for what in ("produce", "fetch"):
        us = ", ".join(f"{v:.0f}" for v in r[f"{what}_us"])
        gb = ", ".join(f"{v:.2f}" for v in r[f"{what}_s_gb"])
        print(f"{what}: the handlers alone {us} µs per request, {gb} CPU-s per GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
