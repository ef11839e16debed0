"""The descriptor cache: closed segments open lazily, at most `capacity` descriptors stay open for
them, a pinned segment's files are never closed under it, and deleting a segment drops it."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.storage.fdcache import FdCache
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import decode_batches, encode_batch

CONFIG = LogConfig(segment_bytes=200, max_batch_bytes=200, retention_ms=None)


ROOT: list[str] = []  # the running test's tmp_path


@pytest.fixture(autouse=True)
def _root(tmp_path: Path) -> Iterator[None]:
    ROOT.append(str(tmp_path))
    yield
    ROOT.pop()


def open_fds() -> int:
    """This process's descriptors on files of the running test. Not all of them: under
    pytest-xdist a worker's other threads (a reader of an earlier test's subprocess) may open
    and close descriptors of their own meanwhile."""
    root = ROOT[-1] + os.sep
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        count += target.startswith(root)
    return count


def rolled_log(directory: Path, cache: FdCache, batches: int) -> Log:
    """A log whose every batch (over half a segment) is a segment of its own."""
    log = Log.open(str(directory), CONFIG, cache=cache)
    for i in range(batches):
        log.append(encode_batch([b"%06d" % i + b"x" * 60]))
    assert len(log.segments) == batches
    return log


def value_at(log: Log, offset: int) -> bytes:
    result = log.read(offset, 4096)
    return next(r.value for r in decode_batches(result.data) if r.offset == offset)


def test_closed_segments_keep_at_most_the_cache_open(tmp_path: Path) -> None:
    before = open_fds()
    cache = FdCache(8)
    log = rolled_log(tmp_path / "log", cache, 100)
    assert open_fds() - before <= 2 + 8  # the active segment, and the cache
    for offset in (0, 50, 99, 3, 77, 12, 64, 31, 88, 5, 42):  # reads of old segments reopen them
        assert value_at(log, offset) == b"%06d" % offset + b"x" * 60
        assert cache.open_fds <= 8 and open_fds() - before <= 2 + 8
    log.flush()  # syncs the 99 closed segments by path, one descriptor at a time
    assert open_fds() - before <= 2 + 8
    log.close()
    assert open_fds() == before and cache.open_fds == 0


def test_open_checks_closed_segments_and_closes_them(tmp_path: Path) -> None:
    rolled_log(tmp_path / "log", FdCache(8), 300).close()
    before = open_fds()
    cache = FdCache(4)
    log = Log.open(str(tmp_path / "log"), CONFIG, cache=cache)
    assert open_fds() - before == 2, "only the active segment's files stay open"
    assert value_at(log, 0) == b"000000" + b"x" * 60
    assert log.end_offset == 300
    log.close()
    assert open_fds() == before


def test_a_pinned_segment_outlives_eviction_and_deletion(tmp_path: Path) -> None:
    """What an io_uring read in flight relies on: its descriptor stays open, naming the same file,
    whatever the cache evicts meanwhile and even when retention deletes the segment."""
    before = open_fds()
    cache = FdCache(2)
    log = rolled_log(tmp_path / "log", cache, 20)
    first = log.segments[0]
    fd = first.borrow_store_fd()
    inode = os.fstat(fd).st_ino
    for offset in range(1, 19):  # every other closed segment passes through the cache
        value_at(log, offset)
    assert cache.evictions > 0
    assert os.fstat(fd).st_ino == inode and os.pread(fd, 8, 0) == (0).to_bytes(8, "big")
    log.config = LogConfig(segment_bytes=200, max_batch_bytes=200, retention_ms=None, retention_bytes=0)
    assert log.apply_retention() == 19
    assert not os.path.exists(first.store_path)
    assert os.fstat(fd).st_ino == inode, "deleted, but the pinned descriptor stays valid"
    first.unpin()  # the read completed: now its files close
    log.close()
    assert open_fds() == before


def test_a_cache_of_zero_still_serves_reads(tmp_path: Path) -> None:
    cache = FdCache(0)
    log = rolled_log(tmp_path / "log", cache, 10)
    for offset in range(10):
        assert value_at(log, offset).startswith(b"%06d" % offset)
    assert cache.segments <= 1
    log.close()


def test_a_segment_rolled_with_appends_in_flight_keeps_its_files_until_they_complete(
    tmp_path: Path,
) -> None:
    """The io_uring backend prepares several appends before their writes run; each roll leaves the
    previous segment with writes in flight, whose descriptors must stay open until they ran."""
    cache = FdCache(0)  # evicts whatever it may
    log = Log.open(str(tmp_path / "log"), CONFIG, cache=cache)
    pendings = [log.prepare_append(encode_batch([b"%06d" % i + b"x" * 60])) for i in range(5)]
    assert len(log.segments) == 5
    for p in pendings:  # every write still names an open descriptor of its own segment
        for op in p.ops:
            assert os.fstat(op.fd).st_ino == os.stat(p.segment.store_path).st_ino
    for i, p in enumerate(pendings):
        run_ops(SyncFileIO(), p.ops)
        log.complete_append(p)
        done = log.segments[: i + 1]  # the active one too, once its appends completed
        assert sum(s.open_files for s in done) == cache.open_fds <= 2, "completed: the cache's"
        assert all(s.open_files == 2 for s in log.segments[i + 1 :]), "still in flight: pinned open"
    assert [value_at(log, i)[:6] for i in range(5)] == [b"%06d" % i for i in range(5)]
    # An undone append (a failed write) releases the segments it rolled too.
    more = [log.prepare_append(encode_batch([b"%06d" % i + b"x" * 60])) for i in range(5, 8)]
    log.abort_append(more[0])
    assert len(log.segments) == 6 and log.end_offset == 5
    assert sum(s.open_files for s in log.segments) == cache.open_fds <= 2, "none pinned: the cache's"
    log.close()


def test_out_of_descriptors_the_cache_gives_its_own_back(tmp_path: Path) -> None:
    class OneEmfile(SyncFileIO):
        armed = False

        def open(self, path: str, create: bool) -> int:
            if self.armed:
                self.armed = False
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return super().open(path, create)

    io = OneEmfile()
    cache = FdCache(8)
    log = Log.open(str(tmp_path / "log"), CONFIG, io=io, cache=cache)
    for i in range(20):
        log.append(encode_batch([b"%06d" % i + b"x" * 60]))
    for offset in range(10, 14):
        value_at(log, offset)
    assert cache.open_fds > 0
    io.armed = True
    assert value_at(log, 0).startswith(b"000000"), "the read succeeds after the cache closed its files"
    assert cache.segments == 1
    log.close()
