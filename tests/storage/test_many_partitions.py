"""Descriptors bounded by the descriptor cache whatever the partition count: 10 000 partitions'
logs in one process under an open-file limit of 512, every one appended to, read back and
flushed, on both backends' ways of running storage operations (`run_ops` at once, as uvloop
does, and `RingOps` on a real io_uring ring, with many operations in flight at a time: an SQE
in flight names a descriptor the cache must not close). The active segment of an idle log is a
cache entry like any other; a reopen continues where the last descriptor left (append position,
index entries not yet written, preallocation, what is synced), and a process killed with active
segments evicted loses nothing that was written."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.storage.fdcache import FdCache
from broker.storage.fileio import run_ops
from broker.storage.log import Log, LogConfig
from broker.storage.log_config import PREALLOCATE_BYTES
from broker.storage.log_segments import PendingAppend
from ringlog_proto.batch import decode_batches, encode_batch

PARTITIONS = 10_000
NOFILE = 512
CACHE = 128  # descriptors (64 idle segments' store and index)
IN_FLIGHT = 100  # logs with an append, a flush or a read in flight at once on the ring
CONFIG = LogConfig(segment_bytes=1 << 20, max_batch_bytes=1 << 16, retention_ms=None)


def files_under(root: str) -> int:
    """This process's descriptors on files under `root`."""
    prefix = root + os.sep
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(prefix)
        except OSError:  # closed since the listing
            continue
    return count


@pytest.fixture
def low_nofile() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # NOFILE more than what this process already holds (a pytest worker that ran other tests
    # holds more than a fresh one: at a flat 512 the logs' share was left to chance)
    held = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(held + NOFILE, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def value(p: int, round_: int) -> bytes:
    return b"p%05d-r%d-" % (p, round_) + b"x" * 40


class Runner:
    """Runs a batch of logs' operations: at once (uvloop's way) or as SQEs on a ring, all in flight
    together before any completes."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.ring = None
        if backend == "io_uring":
            from native import probe  # only where the bindings exist
            from native.ring import Ring

            if (why := probe()) is not None:
                pytest.skip(f"io_uring unavailable: {why}")
            from broker.storage.ring_ops import RingOps

            self.ring = Ring(1024)
            self.continuations: dict[int, Callable[[int, int], None]] = {}
            self.next_ud = 1

            def register(callback: Callable[[int, int], None]) -> int:
                ud = self.next_ud
                self.next_ud += 1
                self.continuations[ud] = callback
                return ud

            self.ops = RingOps(self.ring, register)

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()

    def wait(self, results: list[object], count: int, peak: Callable[[], None]) -> None:
        assert self.ring is not None
        deadline = time.monotonic() + 60
        while len(results) < count:
            assert time.monotonic() < deadline, f"{len(results)} of {count} completed"
            peak()  # every SQE still in flight holds its descriptor open
            self.ring.submit_and_wait(1, timeout=0.5)
            for ud, res, flags in self.ring.completions():
                self.continuations.pop(ud)(res, flags)

    def appends(self, logs: list[Log], records: list[bytes], peak: Callable[[], None]) -> None:
        pendings = [log.prepare_append(r) for log, r in zip(logs, records, strict=True)]
        if self.ring is None:
            for log, pending in zip(logs, pendings, strict=True):
                run_ops(log.io, pending.ops)
        else:
            results: list[object] = []
            for pending in pendings:
                self.ops.run(pending.ops, results.append)
            self.wait(results, len(pendings), peak)
            assert results == [None] * len(pendings)
        peak()
        for log, pending in zip(logs, pendings, strict=True):
            log.complete_append(pending)

    def flushes(self, logs: list[Log], peak: Callable[[], None]) -> None:
        plans = [log.prepare_flush() for log in logs]
        if self.ring is None:
            for log, plan in zip(logs, plans, strict=True):
                run_ops(log.io, plan.ops)
        else:
            results: list[object] = []
            for plan in plans:
                self.ops.run(plan.ops, results.append)
            self.wait(results, len(plans), peak)
            assert results == [None] * len(plans)
        for log, plan in zip(logs, plans, strict=True):
            log.complete_flush(plan)
            assert log.durable_offset == log.end_offset

    def reads(self, logs: list[Log], peak: Callable[[], None]) -> list[bytes]:
        extents = [log.prepare_read(0, 1 << 16) for log in logs]
        if self.ring is None:
            return [log.read(0, 1 << 16).data for log in logs]
        results: list[object] = []
        for extent in extents:
            assert extent is not None
            self.ops.read(extent, results.append)
        self.wait(results, len(extents), peak)
        assert all(isinstance(data, bytearray) for data in results)
        return [bytes(data) for data in results]  # in completion order: the caller sorts


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sync", "io_uring"])
def test_ten_thousand_partitions_under_512_descriptors(
    tmp_path: Path, backend: str, low_nofile: None
) -> None:
    root = str(tmp_path)
    cache = FdCache(CACHE)
    runner = Runner(backend)
    seen_max = [0]

    def peak() -> None:
        n = files_under(root)
        seen_max[0] = max(seen_max[0], n)
        # the cache's (and the one segment last used), plus per log with an operation in
        # flight its store, index and (a flush) its directory: an evicted segment's flush
        # reopens its files to sync them
        assert n <= CACHE + 2 + 3 * IN_FLIGHT, n

    try:
        logs: list[Log] = []
        for p in range(PARTITIONS):
            logs.append(Log.open(os.path.join(root, f"t-{p}"), CONFIG, cache=cache))
            if p % 1000 == 0:
                peak()
        assert files_under(root) <= CACHE + 2, "opened logs hold only the cache's descriptors"
        for round_ in range(2):
            for i in range(0, PARTITIONS, IN_FLIGHT):
                group = logs[i : i + IN_FLIGHT]
                runner.appends(group, [encode_batch([value(i + k, round_)]) for k in range(len(group))], peak)
        peak()
        for i in range(0, PARTITIONS, IN_FLIGHT):
            runner.flushes(logs[i : i + IN_FLIGHT], peak)
        for i in range(0, PARTITIONS, IN_FLIGHT):
            group = logs[i : i + IN_FLIGHT]
            datas = runner.reads(group, peak)
            got = sorted(tuple(r.value for r in decode_batches(data)) for data in datas)
            want = sorted((value(i + k, 0), value(i + k, 1)) for k in range(len(group)))
            assert got == want
        for p, log in enumerate(logs):
            assert log.end_offset == 2 and log.durable_offset == 2, p
        assert cache.evictions > PARTITIONS, "every log's active segment was evicted and reopened"
        assert files_under(root) <= CACHE + 2
        for log in logs:
            log.close()
        assert files_under(root) == 0
        print(f"\n{backend}: at most {seen_max[0]} descriptors of the logs' files open at once")
    finally:
        runner.close()
        for log in logs:
            if not log.closed:
                log.abandon()


def test_a_reopened_active_segment_continues_where_its_descriptors_left(tmp_path: Path) -> None:
    """Evicted between appends: the next append reopens the files and writes at the append
    position, index entries kept in memory are written to the reopened index, the preallocation
    step is not taken again, and a flush after the eviction syncs nothing twice but leaves the
    log durable."""
    cache = FdCache(0)  # the last used segment only
    a = Log.open(str(tmp_path / "a"), CONFIG, cache=cache)
    b = Log.open(str(tmp_path / "b"), CONFIG, cache=cache)
    seg = a.segments[-1]
    a.append(encode_batch([b"a0"]))
    allocated = seg.allocated
    assert allocated == seg.size + PREALLOCATE_BYTES
    for i in range(1, 300):  # past INDEX_PENDING_ENTRIES_MAX: an index write rides on an append
        b.append(encode_batch([b"b%d" % i]))  # uses the cache's one place: `a` is evicted
        assert seg.open_files == 0
        assert seg.synced_size < seg.size, "evicted dirty, not synced: the flush syncs it"
        a.append(encode_batch([b"a%d" % i]))
        assert seg.allocated == allocated, "the preallocation is not taken again"
    assert seg.index.persisted_count >= 256, "the index write went to the reopened index file"
    assert a.end_offset == 300 and a.durable_offset == 0
    a.flush()
    assert a.durable_offset == 300 and seg.synced_size == seg.size
    assert os.stat(seg.store_path).st_size == seg.allocated
    a.close()
    b.close()
    again = Log.open(str(tmp_path / "a"), CONFIG, cache=cache)
    assert [r.value for r in decode_batches(again.read(0, 1 << 20).data)] == [b"a%d" % i for i in range(300)]
    assert len(again.segments[-1].index) == 300
    again.close()


def pending_ops(pending: PendingAppend) -> list[int]:
    return [op.fd for op in pending.ops]


def test_an_append_in_flight_keeps_its_descriptors_whatever_the_cache_evicts(tmp_path: Path) -> None:
    """The one rule: an append prepared and not completed pins its segment; other logs' use of
    a cache of zero never closes the descriptors its writes name."""
    cache = FdCache(0)
    a = Log.open(str(tmp_path / "a"), CONFIG, cache=cache)
    others = [Log.open(str(tmp_path / f"o{i}"), CONFIG, cache=cache) for i in range(5)]
    pending = a.prepare_append(encode_batch([b"in flight"]))
    inode = os.fstat(pending.ops[0].fd).st_ino
    for o in others:
        o.append(encode_batch([b"other"]))
        o.read(0, 1 << 10)
    assert os.fstat(pending.ops[0].fd).st_ino == inode == os.stat(a.segments[-1].store_path).st_ino
    run_ops(a.io, pending.ops)
    a.complete_append(pending)
    others[0].append(encode_batch([b"evicts a"]))
    assert a.segments[-1].open_files == 0, "completed: the cache's to close"
    assert [r.value for r in decode_batches(a.read(0, 1 << 10).data)] == [b"in flight"]
    for log in (a, *others):
        log.close()


CRASH_CHILD = """
import os, sys
from broker.storage.fdcache import FdCache
from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import encode_batch
root, n = sys.argv[1], int(sys.argv[2])
config = LogConfig(segment_bytes=1 << 20, max_batch_bytes=1 << 16, retention_ms=None)
cache = FdCache(4)
logs = [Log.open(os.path.join(root, f"t-{p}"), config, cache=cache) for p in range(n)]
for round_ in range(3):
    for p, log in enumerate(logs):
        log.append(encode_batch([b"p%d-r%d" % (p, round_)]))
        print(p, round_, flush=True)  # acked: in the page cache
# one more append prepared, its write started and not completed (its log's active segment
# reopened for it), while every other log's active segment is evicted: then killed
pending = logs[0].prepare_append(encode_batch([b"torn"]))
op = pending.ops[0]
os.pwritev(op.fd, [bytes(op.buffers[0])], op.offset)  # a part of the batch only
print("killing", flush=True)
os.kill(os.getpid(), 9)
"""


def test_killed_with_active_segments_evicted_loses_nothing_acked(tmp_path: Path) -> None:
    """kill -9 of a process whose logs' active segments were evicted (closed without a flush)
    and one append half written: recovery finds every acknowledged append, cuts the torn one,
    and appends go on at the next offsets."""
    n = 40
    root = str(tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", CRASH_CHILD, root, str(n)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert child.returncode == -9, child.stderr
    acked = [line.split() for line in child.stdout.splitlines() if line != "killing"]
    assert len(acked) == 3 * n and child.stdout.endswith("killing\n")
    cache = FdCache(4)
    for p in range(n):
        log = Log.open(os.path.join(root, f"t-{p}"), CONFIG, cache=cache)
        values = [r.value for r in decode_batches(log.read(0, 1 << 16).data)]
        assert values == [b"p%d-r%d" % (p, r) for r in range(3)], p
        assert log.append(encode_batch([b"after"])) == 3
        log.close()
