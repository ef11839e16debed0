"""Storage-engine benchmark: what `Log.append` and `Log.read` cost next to the raw system calls.

Run: `.venv/bin/python bench/storage.py [--quick] [--dir DIR] [--total-mb N] [--profile]`

What it measures, and why each number is compared with the ceiling it is:

1. Append. 100 B and 1 KiB records in batches of about 16 KiB and 256 KiB (as many records as fit),
   appended one `Log.append` per batch into a fresh log (segment_bytes 128 MiB, so segments roll
   during the run; max_batch_bytes 1 MiB). Batches are encoded before the clock starts.
2. Read. The same log read back front to back with `Log.read(offset, 1 MiB)`, which is a typical
   fetch size; each read returns the whole batches that fit in 1 MiB, crc-checked by the broker.
   Records are counted from batch headers (`iter_batches`) in an untimed pass that also checks
   every byte and offset came back.
3. Raw ceiling, in the same run, in the same directory: one `os.write` per batch of the very same
   bytes to a fresh file, and `os.read` of that file in 1 MiB chunks. The log can only add work to
   these system calls (it issues one `pwritev` per batch and one `pread` per read), so the ratio
   log / raw is the share of the system-call rate that the Python engine keeps. Raw and log run
   alternately, three rounds (raw first in rounds 1 and 3, log first in round 2); the best of the
   three is reported for each, which filters out the noise of a shared VM, and the largest
   worst/best spread is printed so a disturbed run shows itself.
   Nothing is fsynced in these timed loops: writes land in the page cache, which is what `append`
   promises (see broker/storage/log.py), and reads are served from the page cache, on both sides,
   because dropping the cache needs root and is not what a consumer that is caught up sees.
   Both ceilings are therefore memory-copy speeds, not disk speeds.
4. Codec. `encode_batch` of bytes values (the producer fast path) and of `Record` objects with a
   key and two headers, and `decode_records` (crc verified, as clients do), in records/s, for
   ~16 KiB batches. This is client CPU, measured apart from storage.
5. Group commit. 16 KiB batches of 1 KiB records with `flush()` (fdatasync) after every batch,
   after every 64 batches, and never: what durability costs in appends/s. This one does hit the
   disk, so it is a property of the machine as much as of the code.
6. Record-framing validation. What the broker's walk of every appended batch's records costs
   (`LogConfig.check_records`, always on in the broker; ringlog_proto.batch.invalid_records, in
   C via native._records when built), with the walk on and off in the same run, at two levels:
   `Log.append` alone (the walk's share at its largest), and the produce path a uvloop worker
   runs once a request's bytes are read (frame decode, `RinglogAdapter.handle`, `Log.validate` and the
   write, the response encoded; no sockets, so no network noise): the "produce throughput"
   the walk must keep. Workloads: 16 KiB batches of 100 B and of 1 KiB records, and one-record
   batches of 100 B (the per-batch cost at its most visible), 32 MiB each. Both variants are open side
   by side and fed the workload in 128 blocks, alternating which goes first at every block, for
   `--validation-rounds` rounds (default 7). The headline ratio sums each block's fastest round
   (what the code costs with a shared machine's interference filtered out block by block); the
   per-round ratios (median, min..max) and each side's round-to-round spread are printed too.
   Times are the running thread's CPU time (`time.thread_time`, user + system, the write's copy
   into the page cache included), not wall time: on a shared machine the wall clock also counts
   whatever other processes ran meanwhile, which swamped a 5% difference. `--validation-only`
   runs just this section.
7. `--profile` (instead of the tables): the 256 KiB / 1 KiB append under cProfile, top 15
   functions by cumulative and by own time. cProfile's per-call overhead inflates Python-heavy
   paths; read it for where time goes, not for how fast.

A pool of up to 64 MiB of distinct batches is encoded per configuration and appended cyclically up
to --total-mb, so setup stays short while the data written is larger than any CPU cache. (A pool
of one cache-hot batch speeds up both sides alike: on the machine this was written on, it left
the log/raw ratio within 0.02.) An untimed warm-up write first touches enough memory that the
first timed run does not pay the VM's first use of fresh pages. Temporary files go to a fresh
directory under --dir (default: `.bench-tmp/` in the repository, on the same file system as the
data directory would be; /tmp is often tmpfs), deleted at the end, `.bench-tmp/` included when this
run created it.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import platform
import pstats
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchlib import REPO, code_version, fs_of, size_label, table

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Append, Reply
from broker.ringlog.adapter import RinglogAdapter
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import Log, LogConfig
from ringlog_proto import messages as m
from ringlog_proto.batch import (
    HEADER_SIZE,
    RECORD_COUNT_MAX,
    Record,
    batch_crc,
    decode_records,
    encode_batch,
    iter_batches,
    read_header,
    set_base_offset,
    walk_implementation,
)
from ringlog_proto.batch import record_size as encoded_record_size
from ringlog_proto.frames import Frame, FrameDecoder

KIB = 1024
MIB = 1024 * KIB
MB = 1_000_000  # rates are in MB/s, 10^6 bytes per second

RECORD_SIZES = (100, KIB)
BATCH_SIZES = (16 * KIB, 256 * KIB)
READ_MAX_BYTES = MIB
SEGMENT_BYTES = 128 * MIB  # LogConfig's default, stated here so the bench does not drift with it
MAX_BATCH_BYTES = MIB
POOL_BYTES = 64 * MIB
ROUNDS = 3
TIMESTAMP = 1_700_000_000_000
TARGET_RATIO = 0.80  # the goal: 256 KiB appends at >= 80% of the raw write rate


def log_config() -> LogConfig:
    return LogConfig(segment_bytes=SEGMENT_BYTES, max_batch_bytes=MAX_BATCH_BYTES)


class BenchIO(SyncFileIO):
    """SyncFileIO whose syncs can be switched off, so that closing a benchmark log does not wait
    for the disk. Only the close after the timed loop runs with `syncs = False`; the timed append
    and read loops make no sync calls either way."""

    syncs = True

    def fdatasync(self, fd: int) -> None:
        if self.syncs:
            super().fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        if self.syncs:
            super().fsync_dir(path)


def close_unsynced(log: Log) -> None:
    assert isinstance(log.io, BenchIO)
    log.io.syncs = False
    log.close()


# --------------------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    record_size: int
    batch_target: int
    records_per_batch: int
    batch_size: int  # encoded bytes of one batch
    batches: list[bytes]  # the sequence to append: a pool of distinct batches, repeated

    @property
    def total_bytes(self) -> int:
        return self.batch_size * len(self.batches)

    @property
    def total_records(self) -> int:
        return self.records_per_batch * len(self.batches)

    @property
    def label(self) -> str:
        return f"{size_label(self.batch_target)} / {size_label(self.record_size)} records"


def record_size_bound(value_size: int) -> int:
    """Encoded bytes of a plain record of `value_size` bytes at any index of a batch."""
    return encoded_record_size(bytes(value_size), offset_delta=RECORD_COUNT_MAX)


def records_fitting(batch_bytes: int, per_record: int) -> int:
    """How many records of `per_record` encoded bytes fit in a batch of at most `batch_bytes`."""
    return max(1, (batch_bytes - HEADER_SIZE) // per_record)


def make_workload(record_size: int, batch_target: int, total_bytes: int) -> Workload:
    # the largest a record of this size encodes to (an offset delta of 3 bytes): never over target
    n = records_fitting(batch_target, record_size_bound(record_size))
    pool: list[bytes] = []
    pool_bytes = min(total_bytes, POOL_BYTES)
    while not pool or len(pool) * len(pool[0]) < pool_bytes:
        raw = os.urandom(n * record_size)
        values = [raw[i * record_size : (i + 1) * record_size] for i in range(n)]
        pool.append(encode_batch(values, timestamp=TIMESTAMP))
    size = len(pool[0])
    assert size <= batch_target, (size, batch_target)
    count = max(1, total_bytes // size)
    return Workload(record_size, batch_target, n, size, [pool[i % len(pool)] for i in range(count)])


# --------------------------------------------------------------------------------------- timed loops


def raw_write(path: str, batches: list[bytes], check_crc: bool = False) -> float:
    """One os.write per batch; with `check_crc`, first the crc32c the broker must verify.

    The second form is the ceiling for any broker that validates before it acknowledges: the
    part of append's cost that no amount of Python tuning removes.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        write = os.write
        t0 = time.perf_counter()
        for b in batches:
            if check_crc and batch_crc(b, 0, len(b)) != read_header(b).crc:
                raise RuntimeError("benchmark batch with a bad crc")
            if write(fd, b) != len(b):
                raise OSError(f"short write to {path}")
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def raw_read(path: str, expected: int) -> float:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        read = os.read
        got = 0
        t0 = time.perf_counter()
        while True:
            chunk = read(fd, READ_MAX_BYTES)
            if not chunk:
                break
            got += len(chunk)
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    if got != expected:
        raise RuntimeError(f"raw read got {got} bytes, wrote {expected}")
    return dt


def log_append(directory: str, batches: list[bytes]) -> tuple[Log, float]:
    log = Log.open(directory, log_config(), io=BenchIO())
    append = log.append
    t0 = time.perf_counter()
    for b in batches:
        append(b)
    return log, time.perf_counter() - t0


def log_read(log: Log, expected: int) -> float:
    read = log.read
    offset = log.start_offset
    end = log.end_offset
    got = 0
    t0 = time.perf_counter()
    while offset < end:
        r = read(offset, READ_MAX_BYTES)
        if r.error is not None:
            raise r.error
        got += len(r.data)
        offset = r.next_offset
    dt = time.perf_counter() - t0
    if got != expected:
        raise RuntimeError(f"log read got {got} bytes, appended {expected}")
    return dt


def count_records(log: Log, w: Workload) -> int:
    """Untimed: read the log again, count records from batch headers, check offsets and bytes."""
    offset = log.start_offset
    records = 0
    i = 0
    while offset < log.end_offset:
        r = log.read(offset, READ_MAX_BYTES)
        for pos, h in iter_batches(r.data):
            if h.base_offset != records:
                raise RuntimeError(f"batch {i} has base offset {h.base_offset}, expected {records}")
            appended = bytearray(w.batches[i])
            set_base_offset(appended, h.base_offset)
            if r.data[pos : pos + h.size] != appended:
                raise RuntimeError(f"batch {i} came back different from what was appended")
            records += h.record_count
            i += 1
        offset = r.next_offset
    if records != w.total_records or i != len(w.batches):
        raise RuntimeError(f"read {records} records in {i} batches, appended {w.total_records}")
    return records


@dataclass
class IOResult:
    workload: Workload
    times: dict[str, list[float]]  # seconds of each round, for "append", "raw_write", "read", "raw_read"
    records_read: int

    def best(self, key: str) -> float:
        return min(self.times[key])

    def spread(self, key: str) -> float:
        """Worst round over best round, minus one: how noisy the machine was."""
        return max(self.times[key]) / min(self.times[key]) - 1

    @property
    def append_s(self) -> float:
        return self.best("append")

    @property
    def raw_write_s(self) -> float:
        return self.best("raw_write")

    @property
    def crc_write_s(self) -> float:
        return self.best("crc_write")

    @property
    def read_s(self) -> float:
        return self.best("read")

    @property
    def raw_read_s(self) -> float:
        return self.best("raw_read")


def bench_io(w: Workload, workdir: str, tag: str) -> IOResult:
    times: dict[str, list[float]] = {
        "append": [],
        "raw_write": [],
        "crc_write": [],
        "read": [],
        "raw_read": [],
    }
    records_read = 0
    for rnd in range(ROUNDS):
        log_dir = os.path.join(workdir, f"log-{tag}-{rnd}")
        raw_path = os.path.join(workdir, f"raw-{tag}-{rnd}.bin")
        log = None
        try:
            # Alternate which side goes first, so neither always meets the other's writeback.
            for side in ("raw", "log") if rnd % 2 == 0 else ("log", "raw"):
                if side == "raw":
                    times["raw_write"].append(raw_write(raw_path, w.batches))
                    times["raw_read"].append(raw_read(raw_path, w.total_bytes))
                    os.unlink(raw_path)
                    times["crc_write"].append(raw_write(raw_path, w.batches, check_crc=True))
                else:
                    log, dt = log_append(log_dir, w.batches)
                    times["append"].append(dt)
                    times["read"].append(log_read(log, w.total_bytes))
                    if rnd == 0:
                        records_read = count_records(log, w)
        finally:
            if log is not None:
                close_unsynced(log)
            shutil.rmtree(log_dir, ignore_errors=True)
            if os.path.exists(raw_path):
                os.unlink(raw_path)
    return IOResult(w, times, records_read)


VALIDATION_WORKLOADS = ((16 * KIB, 100), (16 * KIB, KIB), (0, 100))  # batch target 0: one record
VALIDATION_BLOCKS = 128  # the workload is appended in this many blocks, each timed on its own
VALIDATION_BYTES = 32 * MIB  # per workload and round: rounds x 2 logs of it sit in the page cache


@dataclass
class ValidationResult:
    level: str  # "Log.append" or "produce path"
    workload: Workload
    # seconds[variant][round][block], variant True = with the walk
    seconds: dict[bool, list[list[float]]]

    def round_totals(self, check: bool) -> list[float]:
        return [sum(r) for r in self.seconds[check]]

    def best_blocks(self, check: bool) -> float:
        """Sum over blocks of each block's fastest round: the cost with the noise of a shared
        machine (preemption, a neighbour's cache traffic) filtered out block by block."""
        rounds = self.seconds[check]
        return sum(min(r[i] for r in rounds) for i in range(len(rounds[0])))


class _LogSide:
    """One variant of the Log.append comparison."""

    def __init__(self, directory: str, check: bool) -> None:
        config = LogConfig(segment_bytes=SEGMENT_BYTES, max_batch_bytes=MAX_BATCH_BYTES, check_records=check)
        self.directory = directory
        self.log = Log.open(directory, config, io=BenchIO())
        self.run = self.log.append

    def close(self) -> None:
        close_unsynced(self.log)
        shutil.rmtree(self.directory, ignore_errors=True)


class _ProduceSide:
    """One variant of the produce-path comparison: what a uvloop worker does with a produce
    request once its bytes are read (frame decode, RinglogAdapter.handle, the log's validate and
    write, the response encoded), in this process, without sockets."""

    def __init__(self, directory: str, check: bool) -> None:
        config = BrokerConfig(
            data_dir=directory,
            log_defaults=LogConfig(
                segment_bytes=SEGMENT_BYTES, max_batch_bytes=MAX_BATCH_BYTES, check_records=check
            ),
        )
        self.directory = directory
        self.handlers = RinglogAdapter(Core(config))
        self.decoder = FrameDecoder()
        self.io = SyncFileIO()
        self.frames: dict[bytes, bytes] = {}
        reply = self._handle(b"".join(m.encode_request(m.CreateTopicRequest("bench", 1), 1)))
        resp = m.decode_response(next(iter(frames_of(reply))))
        assert isinstance(resp, m.CreateTopicResponse) and resp.error == m.ErrorCode.NONE, resp
        self.topic_id = resp.topic_id

    def request(self, batch: bytes) -> bytes:
        """The request bytes for `batch`, encoded once, untimed (the client's work)."""
        raw = self.frames.get(batch)
        if raw is None:
            req = m.ProduceRequest(self.topic_id, 0, acks=m.Acks.WRITTEN, records=batch)
            raw = self.frames[batch] = b"".join(m.encode_request(req, 1))
        return raw

    def _handle(self, raw: bytes) -> bytes:
        self.decoder.feed(raw)
        frame = self.decoder.next_frame()
        assert isinstance(frame, Frame)
        out = self.handlers.handle(frame)
        if isinstance(out, Append):
            run_ops(self.io, out.pending.ops)
            out = out.complete()
        assert isinstance(out, Reply), out
        return b"".join(out.buffers)

    def run(self, raw: bytes) -> None:
        self._handle(raw)

    def close(self) -> None:
        for p in self.handlers.core.partitions.values():
            p.log.io = BenchIO()  # its syncs off for the close, as close_unsynced does
            close_unsynced(p.log)
        self.handlers.core.partitions.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


def frames_of(raw: bytes) -> list[Frame]:
    dec = FrameDecoder()
    dec.feed(raw)
    out = []
    while isinstance(f := dec.next_frame(), Frame):
        out.append(f)
    return out


def bench_validation(workdir: str, rounds: int) -> list[ValidationResult]:
    """For each workload and each level (Log.append, the produce path), two sides open at once,
    one with the record walk and one without, fed block by block, alternating which goes first
    at every block and every round: load that drifts on a shared machine lands on both alike."""
    out = []
    for level in ("Log.append", "produce path"):
        for batch_target, record_size in VALIDATION_WORKLOADS:
            if batch_target:
                w = make_workload(record_size, batch_target, VALIDATION_BYTES)
            else:  # one record per batch: fewer bytes, or the run would take minutes
                n = VALIDATION_BYTES // 16 // (HEADER_SIZE + record_size_bound(record_size))
                pool = [encode_batch([os.urandom(record_size)], timestamp=TIMESTAMP) for _ in range(n)]
                w = Workload(record_size, 0, 1, len(pool[0]), pool)
            clock = time.thread_time  # CPU time: what other processes took of the CPU is not counted
            seconds: dict[bool, list[list[float]]] = {True: [], False: []}
            sides: dict[bool, _LogSide | _ProduceSide] = {}
            try:
                for check in (True, False):
                    d = os.path.join(workdir, f"validation-{level[0]}-{batch_target}-{record_size}-{check}")
                    sides[check] = _LogSide(d, check) if level == "Log.append" else _ProduceSide(d, check)
                # The very same objects for both sides (both topics got the same id in their
                # fresh data dirs): separately allocated copies made one side systematically
                # slower by a few percent, whichever it was (memory placement, not the walk).
                on_side = sides[True]
                shared = (
                    w.batches if isinstance(on_side, _LogSide) else [on_side.request(b) for b in w.batches]
                )
                assert isinstance(on_side, _LogSide) or on_side.topic_id == sides[False].topic_id  # type: ignore[union-attr]
                inputs = dict.fromkeys((True, False), shared)
                step = max(1, len(w.batches) // VALIDATION_BLOCKS)
                for rnd in range(rounds):
                    for check in (True, False):
                        seconds[check].append([])
                    for i, start in enumerate(range(0, len(w.batches), step)):
                        for check in (True, False) if (rnd + i) % 2 == 0 else (False, True):
                            run = sides[check].run
                            block = inputs[check][start : start + step]
                            t0 = clock()
                            for item in block:
                                run(item)
                            seconds[check][-1].append(clock() - t0)
            finally:
                for side in sides.values():
                    side.close()
            out.append(ValidationResult(level, w, seconds))
    return out


def print_validation(results: list[ValidationResult], rounds: int) -> None:
    print(
        f"\nRecord-framing validation: LogConfig.check_records on vs off, same run, at Log.append and"
        f" through the produce path; {size_label(VALIDATION_BYTES)} x {rounds} rounds per variant in"
        f" {VALIDATION_BLOCKS} blocks alternating; CPU time of the running thread; walk in"
        f" {walk_implementation()}:"
    )
    header = [
        "level",
        "batch",
        "record",
        "batches",
        "on MB/s",
        "off MB/s",
        "on/off",
        "walk us/batch",
        "rounds on/off median",
        "min..max",
        "spread on",
        "spread off",
    ]
    table_rows = []
    for r in results:
        w = r.workload
        on, off = r.best_blocks(True), r.best_blocks(False)
        t_on, t_off = r.round_totals(True), r.round_totals(False)
        ratios = sorted(b / a for a, b in zip(t_on, t_off, strict=True))
        table_rows.append(
            [
                r.level,
                size_label(w.batch_target) if w.batch_target else "1 record",
                size_label(w.record_size),
                f"{len(w.batches)} x {w.batch_size} B",
                rate(w.total_bytes, on),
                rate(w.total_bytes, off),
                f"{off / on:.3f}",
                f"{(on - off) / len(w.batches) * 1e6:.2f}",
                f"{ratios[len(ratios) // 2]:.3f}",
                f"{ratios[0]:.3f}..{ratios[-1]:.3f}",
                f"{max(t_on) / min(t_on) - 1:.0%}",
                f"{max(t_off) / min(t_off) - 1:.0%}",
            ]
        )
    table(header, table_rows, labels=3)
    print(
        "  on/off: throughput kept with the walk (1.000: free; the goal is >= 0.95), from the sum"
        " over blocks of each block's fastest round; walk us/batch: the difference per batch. 'rounds':"
        " the same ratio per whole round (median, min..max) and each variant's round-to-round spread"
        " (worst / best - 1), to show how noisy the machine was"
    )


def warm_up(workdir: str, nbytes: int) -> None:
    """Write and delete `nbytes` untimed: the VM's first touch of page-cache memory is slow."""
    path = os.path.join(workdir, "warm-up.bin")
    chunk = os.urandom(MIB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        for _ in range(max(1, nbytes // MIB)):
            os.write(fd, chunk)
    finally:
        os.close(fd)
        os.unlink(path)


# --------------------------------------------------------------------------------------- codec


def codec_records(kind: str, record_size: int, count: int) -> list[bytes] | list[Record]:
    raw = os.urandom(count * record_size)
    values = [raw[i * record_size : (i + 1) * record_size] for i in range(count)]
    if kind == "bytes":
        return values
    return [
        Record(v, key=b"key-%012d" % i, headers=(("trace-id", b"%016x" % i), ("source", b"bench")))
        for i, v in enumerate(values)
    ]


def bench_codec(record_size: int, kind: str, total_records: int) -> tuple[float, float, int, int]:
    """(encode records/s, decode records/s, records per batch, batch bytes) for ~16 KiB batches."""
    probe = codec_records(kind, record_size, 1)
    per_record = len(encode_batch(probe, timestamp=TIMESTAMP)) - HEADER_SIZE
    n = records_fitting(16 * KIB, per_record)
    nbatches = max(1, total_records // n)
    inputs = [codec_records(kind, record_size, n) for _ in range(nbatches)]
    encoded: list[bytes] = []
    best_enc = best_dec = float("inf")
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        encoded = [encode_batch(recs, timestamp=TIMESTAMP) for recs in inputs]
        best_enc = min(best_enc, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for b in encoded:
            decode_records(b)
        best_dec = min(best_dec, time.perf_counter() - t0)
    records = n * nbatches
    return records / best_enc, records / best_dec, n, len(encoded[0])


# --------------------------------------------------------------------------------------- group commit


def bench_group_commit(workdir: str, nbatches: int) -> tuple[list[tuple[str, int, float, float]], Workload]:
    """(label, flushes, total seconds, seconds inside flush) for flush after every batch, after
    every 64 batches, and never. Real fdatasyncs: this is the one part that waits for the disk."""
    w = make_workload(KIB, 16 * KIB, 16 * KIB * nbatches)
    del w.batches[nbatches:]
    rows = []
    for label, every in (("flush every batch", 1), ("flush every 64 batches", 64), ("no flush", 0)):
        directory = os.path.join(workdir, f"group-commit-{every}")
        log = Log.open(directory, log_config(), io=SyncFileIO())
        try:
            append, flush, clock = log.append, log.flush, time.perf_counter
            flushes = 0
            in_flush = 0.0
            t0 = clock()
            for i, b in enumerate(w.batches, 1):
                append(b)
                if every and (i % every == 0 or i == len(w.batches)):  # the tail is flushed too
                    t1 = clock()
                    flush()
                    in_flush += clock() - t1
                    flushes += 1
            dt = clock() - t0
            rows.append((label, flushes, dt, in_flush))
        finally:
            log.close()
            shutil.rmtree(directory, ignore_errors=True)
    return rows, w


# --------------------------------------------------------------------------------------- output


def rate(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / MB:,.0f}"


def count_rate(n: float, seconds: float) -> str:
    return f"{n / seconds:,.0f}"


def io_row(r: IOResult, seconds: float, records: int, raw_seconds: float) -> list[str]:
    """The columns the append and the read tables share."""
    w = r.workload
    return [
        size_label(w.batch_target),
        size_label(w.record_size),
        f"{w.batch_size} B x {w.records_per_batch}",
        rate(w.total_bytes, seconds),
        count_rate(records, seconds),
        count_rate(len(w.batches), seconds),
        rate(w.total_bytes, raw_seconds),
        f"{raw_seconds / seconds:.2f}x",
    ]


IO_HEADER = ["batch", "record", "batch bytes x recs", "MB/s", "records/s", "batches/s", "raw MB/s", "log/raw"]


def print_io(results: list[IOResult]) -> None:
    print(
        f"\n1+3. Log.append vs os.write of the same batches, one call per batch"
        f" (best of {ROUNDS} rounds, raw and log alternating)"
    )
    rows = [
        [
            *io_row(r, r.append_s, r.workload.total_records, r.raw_write_s),
            f"{r.raw_write_s / r.crc_write_s:.2f}x",
        ]
        for r in results
    ]
    table([*IO_HEADER, "crc+write/raw"], rows)
    print("  crc+write/raw: crc32c check then os.write, the floor of any validating append")
    print(
        f"\n2+3. Log.read(offset, max_bytes=1 MiB) vs os.read of the raw file in 1 MiB chunks"
        f" (best of {ROUNDS}; records counted from batch headers)"
    )
    table(IO_HEADER, [io_row(r, r.read_s, r.records_read, r.raw_read_s) for r in results])
    print("\n  Summary (both sides in the page cache, see above):")
    for r in results:
        w = r.workload
        print(
            f"  append {w.label}: {rate(w.total_bytes, r.append_s)} MB/s"
            f" = {r.raw_write_s / r.append_s:.2f}x raw write"
        )
    for r in results:
        w = r.workload
        print(
            f"  read   {w.label}: {rate(w.total_bytes, r.read_s)} MB/s"
            f" = {r.raw_read_s / r.read_s:.2f}x raw read"
        )
    spreads = ", ".join(
        f"{name} {max(r.spread(key) for r in results):.0%}"
        for key, name in (
            ("append", "append"),
            ("raw_write", "raw write"),
            ("read", "read"),
            ("raw_read", "raw read"),
        )
    )
    print(f"  noise: largest worst-round / best-round - 1 over configurations: {spreads}")
    for r in results:
        if r.workload.batch_target == 256 * KIB:
            ratio = r.raw_write_s / r.append_s
            verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
            goal = f"append >= {TARGET_RATIO:.2f}x raw write"
            ceiling = r.raw_write_s / r.crc_write_s
            print(
                f"  target {goal}, {r.workload.label}: {ratio:.2f}x, {verdict}"
                f" (crc check + write alone: {ceiling:.2f}x)"
            )


def print_codec(rows: list[tuple[int, str, float, float, int, int]]) -> None:
    print("\n4. Record codec in Python (~16 KiB batches, best of 3; Record objects built before the clock)")
    out = []
    for record_size, kind, enc, dec, n, size in rows:
        kind_label = "bytes values" if kind == "bytes" else "Record(key, 2 headers)"
        per = size / n
        out.append(
            [
                size_label(record_size),
                kind_label,
                f"{size} B x {n}",
                f"{enc:,.0f}",
                f"{enc * per / MB:,.0f}",
                f"{dec:,.0f}",
                f"{dec * per / MB:,.0f}",
            ]
        )
    table(["record", "kind", "batch", "encode rec/s", "MB/s", "decode rec/s (crc checked)", "MB/s"], out, 3)


def print_group_commit(rows: list[tuple[str, int, float, float]], w: Workload) -> None:
    print(
        f"\n5. Group commit: {len(w.batches)} appends of {w.batch_size} B batches"
        f" ({w.records_per_batch} x 1 KiB records); flush = store fdatasync, timed inside"
        " (the index is synced when its segment closes)"
    )
    out = []
    for label, flushes, dt, in_flush in rows:
        out.append(
            [
                label,
                f"{flushes}",
                count_rate(len(w.batches), dt),
                count_rate(w.total_records, dt),
                rate(w.total_bytes, dt),
                f"{in_flush / dt:.0%}",
                f"{in_flush / flushes * 1e3:.2f}" if flushes else "-",
            ]
        )
    table(["mode", "flushes", "appends/s", "records/s", "MB/s", "time in flush", "ms per flush"], out, 1)
    by_label = {label: dt for label, _, dt, _ in rows}
    gain = by_label["flush every batch"] / by_label["flush every 64 batches"]
    cost = by_label["flush every 64 batches"] / by_label["no flush"]
    print(
        f"  flushing every 64 batches gives {gain:.1f}x the appends/s of a flush per batch,"
        f" at {1 / cost:.2f}x the appends/s of no flush at all"
    )


# --------------------------------------------------------------------------------------- main


def run_profile(workdir: str, total: int) -> None:
    w = make_workload(KIB, 256 * KIB, total)
    warm_up(workdir, 2 * total)
    log = Log.open(os.path.join(workdir, "profile"), log_config(), io=BenchIO())
    try:
        append = log.append
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for b in w.batches:
            append(b)
        prof.disable()
        dt = time.perf_counter() - t0
    finally:
        close_unsynced(log)
        shutil.rmtree(os.path.join(workdir, "profile"), ignore_errors=True)
    print(
        f"profile: append {w.label}, {len(w.batches)} batches, {w.total_bytes / MIB:.0f} MiB:"
        f" {rate(w.total_bytes, dt)} MB/s under cProfile (its overhead included)"
    )
    for key in ("cumulative", "tottime"):
        print(f"\n--- top 15 by {key} ---")
        pstats.Stats(prof, stream=sys.stdout).strip_dirs().sort_stats(key).print_stats(15)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="64 MiB per configuration and smaller codec runs")
    p.add_argument("--dir", help="parent of the temporary directory (default: .bench-tmp/ in the repo)")
    p.add_argument(
        "--total-mb", type=int, help="MiB written per configuration (default 512, 64 with --quick)"
    )
    p.add_argument(
        "--validation-only", action="store_true", help="only the record-framing validation comparison"
    )
    p.add_argument("--validation-rounds", type=int, default=7, help="rounds of each variant (default 7)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile the 256 KiB / 1 KiB append instead of printing the tables",
    )
    args = p.parse_args(argv)

    total = (args.total_mb or (64 if args.quick else 512)) * MIB
    codec_total = 50_000 if args.quick else 300_000
    group_batches = 500 if args.quick else 2000

    parent = Path(args.dir) if args.dir else REPO / ".bench-tmp"
    created_parent = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="ringlog-bench-", dir=parent)
    try:
        fs = fs_of(workdir)
        if args.profile:
            run_profile(workdir, total)
            return 0
        print("ringlog storage benchmark")
        print(
            f"  Python {platform.python_version()}, {platform.system()} {platform.release()},"
            f" {os.cpu_count()} CPUs; files in {workdir} on {fs}"
        )
        if fs.startswith(("tmpfs", "ramfs")):
            print("  WARNING: a memory file system; use --dir on the disk the broker would use")
        print(f"  code: {code_version()}")
        print(
            f"  {total // MIB} MiB per configuration; Log.read max_bytes = raw read chunk = 1 MiB;"
            f" segment_bytes {size_label(SEGMENT_BYTES)}; MB = 10^6 bytes"
        )
        print(
            "  No fsync in the timed loops and no page-cache drop: writes land in the page cache and"
            " reads are served from it, for log and raw alike"
        )
        if args.validation_only:
            warm_up(workdir, 4 * VALIDATION_BYTES)
            print_validation(bench_validation(workdir, args.validation_rounds), args.validation_rounds)
            return 0
        warm_up(workdir, 2 * total)
        results = []
        for batch_target in BATCH_SIZES:
            for record_size in RECORD_SIZES:
                w = make_workload(record_size, batch_target, total)
                results.append(bench_io(w, workdir, f"{batch_target}-{record_size}"))
                del w
        print_io(results)
        codec = []
        for record_size in RECORD_SIZES:
            for kind in ("bytes", "record"):
                enc, dec, n, size = bench_codec(record_size, kind, codec_total)
                codec.append((record_size, kind, enc, dec, n, size))
        print_codec(codec)
        rows, w = bench_group_commit(workdir, group_batches)
        print_group_commit(rows, w)
        print_validation(bench_validation(workdir, args.validation_rounds), args.validation_rounds)
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if created_parent:
            with contextlib.suppress(OSError):  # someone else's files are in it
                parent.rmdir()


if __name__ == "__main__":
    sys.exit(main())
