"""Many logs' flushes made durable together: one syncfs per file system instead of each flush's
fdatasyncs and directory fsyncs (broker/storage/fileio.py's `run_together`), and, when a syncfs
fails, each flush's own syncs, so that the failure lands on the log whose file failed. Real
files and real syncs in `tmp_path`; faults added through the `FileIO`."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.storage import log_flush
from broker.storage.fileio import FileSystems, SyncFile, SyncFileIO, run_together
from broker.storage.log import Log, LogConfig
from broker.storage.log_flush import FlushPlan
from ringlog_proto.batch import decode_batches, encode_batch


class CountingIO(SyncFileIO):
    """The real calls, counted; a syncfs failure and a file's fdatasync failure on request."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {"syncfs": 0, "fdatasync": 0, "fsync_dir": 0}
        self.synced_devices: list[int] = []
        self.syncfs_error: int | None = None  # the next syncfs fails with it
        self.failing_dir: str | None = None  # fdatasync of any file in it fails (EIO)

    def syncfs(self, fd: int) -> None:
        self.calls["syncfs"] += 1
        self.synced_devices.append(os.fstat(fd).st_dev)
        if self.syncfs_error is not None:
            code, self.syncfs_error = self.syncfs_error, None
            raise OSError(code, os.strerror(code))
        super().syncfs(fd)

    def fdatasync(self, fd: int) -> None:
        self.calls["fdatasync"] += 1
        if self.failing_dir is not None and os.readlink(f"/proc/self/fd/{fd}").startswith(self.failing_dir):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        self.calls["fsync_dir"] += 1
        super().fsync_dir(path)


CONFIG = LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=None)


def _logs(root: Path, n: int) -> list[Log]:
    return [Log.open(str(root / str(i)), CONFIG) for i in range(n)]


def _append(logs: Sequence[Log], batches: int = 1) -> list[list[bytes]]:
    values = []
    for i, log in enumerate(logs):
        mine = [b"%d-%d-" % (i, k) + b"v" * 900 for k in range(batches)]
        for value in mine:
            log.append(encode_batch([value]))
        values.append(mine)
    return values


def _flush_together(io: CountingIO, logs: Sequence[Log], fs: FileSystems) -> tuple[list[OSError | None], int]:
    plans: list[FlushPlan] = [log.prepare_flush() for log in logs]
    flushes = [(plan.ops, log.directory) for plan, log in zip(plans, logs, strict=True)]
    errors, synced = run_together(io, flushes, fs)
    for log, plan, exc in zip(logs, plans, errors, strict=True):
        if exc is None:
            log.complete_flush(plan)
        else:
            log.fail_flush(exc, plan)
    return errors, synced


def _read_back(directory: Path) -> list[bytes]:
    log = Log.open(str(directory), CONFIG)
    try:
        out, offset = [], 0
        while offset < log.end_offset:
            result = log.read(offset, 1 << 16)
            assert result.error is None and result.data
            out += [r.value for r in decode_batches(result.data)]
            offset = result.next_offset
        return out
    finally:
        log.close()


def test_many_flushes_take_one_syncfs_and_no_sync_of_their_own(tmp_path: Path) -> None:
    """New logs (their directories unsynced) and rolled segments (synced by path): one syncfs
    covers every flush; each log's durable offset moves to its end, and all of it reads back."""
    logs = _logs(tmp_path, 40)
    values = _append(logs[:35], 1) + _append(logs[35:], 8)  # 8 batches of ~1 KiB: rolled segments
    unused = logs[-1].prepare_flush()
    assert any(isinstance(op, SyncFile) for op in unused.ops)
    log_flush.unpin(unused)
    io, fs = CountingIO(), FileSystems()
    try:
        errors, synced = _flush_together(io, logs, fs)
        assert errors == [None] * 40 and synced == 1
        assert io.calls == {"syncfs": 1, "fdatasync": 0, "fsync_dir": 0}
        assert [log.durable_offset for log in logs] == [log.end_offset for log in logs]
        # the next group syncs on the same descriptor: one per file system, kept
        for mine, more in zip(values, _append(logs[:2]), strict=False):
            mine.extend(more)
        assert _flush_together(io, logs[:2], fs) == ([None, None], 1) and len(fs.fds) == 1
    finally:
        fs.close(io)
        for log in logs:
            log.close()
    assert [_read_back(tmp_path / str(i)) for i in range(40)] == values


def test_a_failed_syncfs_falls_back_to_each_flushs_own_syncs(tmp_path: Path) -> None:
    """The syncfs fails: every flush runs its own syncs; the log whose fdatasync fails then gets
    the error (and refuses work until reopened, as after any failed sync), the others are durable;
    later groups keep their own syncs."""
    logs = _logs(tmp_path, 33)
    _append(logs)
    io, fs = CountingIO(), FileSystems()
    io.syncfs_error = errno.EIO
    io.failing_dir = str(tmp_path / "7") + "/"
    try:
        errors, synced = _flush_together(io, logs, fs)
        assert synced == 0 and io.calls["syncfs"] == 1 and io.calls["fdatasync"] >= 33
        assert isinstance(errors[7], OSError) and errors[7].errno == errno.EIO
        assert errors[:7] + errors[8:] == [None] * 32
        assert [log.durable_offset for log in logs[8:]] == [log.end_offset for log in logs[8:]]
        with pytest.raises(Exception, match="fdatasync failed"):
            logs[7].prepare_flush()
        # No syncfs after one failed: the error it reported is seen, and a log outside the group
        # whose file failed would hear of it only from its own sync.
        io.failing_dir = None
        fdatasyncs = io.calls["fdatasync"]
        _append(logs[:3])
        assert _flush_together(io, logs[:3], fs) == ([None] * 3, 0) and io.calls["syncfs"] == 1
        assert io.calls["fdatasync"] >= fdatasyncs + 3 and fs.failed is not None
    finally:
        fs.close(io)
        for log in logs:
            if log is not logs[7]:
                log.close()


def test_a_log_directory_on_another_file_system_is_synced_there_too(tmp_path: Path) -> None:
    """A log directory symlinked to another file system: one syncfs on each."""
    other_root = Path("/dev/shm")
    if not other_root.is_dir() or other_root.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system (/dev/shm) to link a log directory to")
    other = other_root / f"ringlog-syncfs-{os.getpid()}"
    other.mkdir()
    try:
        (tmp_path / "0").symlink_to(other)
        logs = _logs(tmp_path, 3)
        _append(logs)
        io, fs = CountingIO(), FileSystems()
        try:
            errors, synced = _flush_together(io, logs, fs)
            assert errors == [None] * 3 and synced == 2
            assert set(io.synced_devices) == {tmp_path.stat().st_dev, other.stat().st_dev}
        finally:
            fs.close(io)
            for log in logs:
                log.close()
    finally:
        for name in os.listdir(other):
            os.unlink(other / name)
        other.rmdir()


def test_a_failed_write_fails_only_its_own_flush(tmp_path: Path) -> None:
    """A flush whose write (index entries) fails is not made durable by anyone's syncfs: it
    fails alone, as a `WriteError`, and the log stays usable; the others are durable."""
    logs = _logs(tmp_path, 3)
    _append(logs, 8)  # enough for index entries to write
    plans = [log.prepare_flush() for log in logs]
    writes = [op for op in plans[1].ops if type(op).__name__ == "Write"]
    if not writes:
        for log, plan in zip(logs, plans, strict=True):
            log.complete_flush(plan)
            log.close()
        pytest.skip("no index write in the flush plan with this config")

    class FailingWrite(CountingIO):
        def pwritev(self, fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int) -> int:
            if fd == writes[0].fd:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().pwritev(fd, buffers, offset)

    io, fs = FailingWrite(), FileSystems()
    try:
        flushes = [(p.ops, log.directory) for p, log in zip(plans, logs, strict=True)]
        errors, synced = run_together(io, flushes, fs)
        assert errors[0] is None and errors[2] is None and synced == 1
        assert isinstance(errors[1], OSError) and errors[1].errno == errno.ENOSPC
        for log, plan, exc in zip(logs, plans, errors, strict=True):
            if exc is None:
                log.complete_flush(plan)
            else:
                log.fail_flush(exc, plan)
        logs[1].flush()  # still usable: the next flush writes and syncs the same again
    finally:
        fs.close(io)
        for log in logs:
            log.close()


def test_syncfs_reports_a_bad_descriptor_as_an_os_error() -> None:
    with pytest.raises(OSError) as caught:
        SyncFileIO().syncfs(-1)
    assert caught.value.errno == errno.EBADF
