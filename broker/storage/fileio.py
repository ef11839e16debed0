"""File I/O as a parameter of the storage engine.

Rules this module keeps:
- The storage engine never calls `os` for file I/O itself. Its cold paths (open, recovery, roll,
  truncate, retention) call a `FileIO`; its hot paths (append, flush, read) return *operations*
  (`Write`, `Sync`, `SyncFile`, `SyncDir`) for the caller to execute. The synchronous `SyncFileIO`
  runs them at once (`run_ops`), for tools, tests and the uvloop backend; its asynchronous twin
  `RingOps` (ring_ops.py) submits them to an io_uring ring as SQEs without blocking; tests swap
  in a `FileIO` that injects short writes and errors.
- A short write is not an error: `run_ops` continues it. An `OSError` from the file system is an
  operating error (full disk, EIO): it propagates to the log, which undoes the append.
- A failed write raises `WriteError` (an `OSError`), a failed sync a plain `OSError`: the log
  must tell them apart. A write that fails (ENOSPC) put nothing in doubt; a sync that fails may
  have lost data already written (see `Log.fail_flush`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True)
class Write:
    """Write `buffers` back to back at `offset` of `fd` (a pwritev)."""

    fd: int
    buffers: tuple[Buffer, ...]
    offset: int
    length: int  # total bytes of the buffers, known to whoever built them


@dataclass(slots=True)
class Sync:
    """fdatasync(fd): data and the metadata needed to read it back (the file size) reach the disk."""

    fd: int


@dataclass(frozen=True, slots=True)
class SyncFile:
    """fdatasync the file at `path` through a descriptor opened for this operation and closed after
    it: for closed segments, whose descriptors belong to the descriptor cache (fdcache.py) and
    may be closed before the operation runs. Linux syncs the file, whichever descriptor asks, and
    reports a writeback error not yet seen to a descriptor opened after it. A file gone meanwhile
    (retention deleted the segment) needs no sync: that is not an error."""

    path: str


@dataclass(frozen=True, slots=True)
class SyncDir:
    """fsync a directory, so that segment files created or deleted in it stay so after a crash."""

    path: str


Op = Write | Sync | SyncFile | SyncDir


class WriteError(OSError):
    """A `Write` failed (ENOSPC, EIO, ...): the bytes it carried may be partly in the file, the
    data before them is as it was. Not a failed sync. Keeps the errno of the system call."""


class FileIO(Protocol):
    """The file operations the storage engine needs; see `SyncFileIO` for their meaning."""

    def open(self, path: str, create: bool) -> int: ...
    def close(self, fd: int) -> None: ...
    def size(self, fd: int) -> int: ...
    def mtime_ms(self, fd: int) -> int: ...
    def pread(self, fd: int, length: int, offset: int) -> bytes: ...
    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int: ...
    def fdatasync(self, fd: int) -> None: ...
    def ftruncate(self, fd: int, length: int) -> None: ...
    def allocate(self, fd: int, length: int) -> None: ...
    def unlink(self, path: str) -> None: ...
    def listdir(self, path: str) -> list[str]: ...
    def makedirs(self, path: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def device(self, target: int | str) -> int: ...
    def open_dir(self, path: str) -> int: ...
    def syncfs(self, fd: int) -> None: ...


class SyncFileIO:
    """Plain blocking system calls. What tools, tests and the uvloop backend use."""

    def open(self, path: str, create: bool) -> int:
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        return os.open(path, flags, 0o600)  # private, as the data dir (docs/SECURITY.md)

    def close(self, fd: int) -> None:
        os.close(fd)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def mtime_ms(self, fd: int) -> int:
        return os.fstat(fd).st_mtime_ns // 1_000_000

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        # A regular file returns short only at EOF, so one call is the whole answer.
        return os.pread(fd, length, offset)

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        return os.pwritev(fd, buffers, offset)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def allocate(self, fd: int, length: int) -> None:
        os.posix_fallocate(fd, 0, length)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        """Give `src` the name `dst`, replacing what had it, atomically (the log cleaner's swap)."""
        os.replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        """Make creations and deletions of names in `path` durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.fsync(fd)
        finally:
            os.close(fd)

    def device(self, target: int | str) -> int:
        """The file system (`st_dev`) a descriptor's file, or a path's (symlinks followed), is on."""
        return os.stat(target).st_dev

    def open_dir(self, path: str) -> int:
        """A read-only descriptor of the directory `path`: what `syncfs` is called on."""
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def syncfs(self, fd: int) -> None:
        """syncfs(2): every dirty page and inode of the file system `fd` is on reaches the disk,
        and its journal commits. Since Linux 5.8 it fails with a writeback error (EIO, ENOSPC)
        of any file of that file system not yet reported to `fd` (`errseq` per superblock)."""
        if _libc_syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))


# The one a log uses unless given its own (a test's faulty disk): it keeps no state, and logs
# that share it share a syncfs (`run_together`, `sync_recovered` group by it).
SYNC_IO = SyncFileIO()

_libc = ctypes.CDLL(None, use_errno=True)
_libc_syncfs = _libc.syncfs  # not in `os`
_libc_syncfs.argtypes = [ctypes.c_int]
_libc_syncfs.restype = ctypes.c_int


def remaining_buffers(buffers: tuple[Buffer, ...], written: int) -> tuple[Buffer, ...]:
    """The part of `buffers` not yet written after a short write of `written` bytes."""
    rest: list[Buffer] = []
    for buf in buffers:
        if written >= len(buf):
            written -= len(buf)
            continue
        rest.append(memoryview(buf)[written:] if written else buf)
        written = 0
    return tuple(rest)


def run_write(io: FileIO, op: Write) -> None:
    """Execute one `Write` completely, continuing after short writes (usually one call)."""
    assert op.length > 0
    buffers, offset, remaining = op.buffers, op.offset, op.length
    while True:
        try:
            n = io.pwritev(op.fd, buffers, offset)
        except WriteError:
            raise
        except OSError as exc:
            raise WriteError(exc.errno, exc.strerror or str(exc)) from exc
        if n == remaining:
            return
        if n <= 0:
            raise WriteError(errno.EIO, f"pwritev wrote {n} bytes at offset {offset} of fd {op.fd}")
        remaining -= n
        offset += n
        buffers = remaining_buffers(buffers, n)


def sync_file(io: FileIO, path: str) -> None:
    """Execute a `SyncFile`."""
    try:
        fd = io.open(path, create=False)
    except FileNotFoundError:
        return
    try:
        io.fdatasync(fd)
    finally:
        io.close(fd)


def run_ops(io: FileIO, ops: Sequence[Op]) -> None:
    """Execute operations in order, synchronously. The first failure raises and stops the rest."""
    for op in ops:
        if isinstance(op, Write):
            run_write(io, op)
        elif isinstance(op, Sync):
            io.fdatasync(op.fd)
        elif isinstance(op, SyncFile):
            sync_file(io, op.path)
        else:
            io.fsync_dir(op.path)


# A group commit over this many partitions or more (a core's, counting its flushes in flight; a
# start's recovery; a chunk of a close) syncs each file system once (syncfs) instead of each
# partition's files (fdatasync). On this VM's ext4, N files with 1 KiB newly written each (median of
# 9, two runs, machine shared): 4 threads of fdatasync took 0.4-0.7 ms for 4-8 files, 1.1-1.4 for
# 16, 1.9-3.2 for 32, 4-5 for 64, 8 for 128; one syncfs 0.1-1.9 ms whatever N, and 6-10 ms for 1000
# files against 49-58 ms on 16 threads. Below it each partition keeps its own syncs: a syncfs also
# writes back every other dirty page of the file system (other cores', other programs'), a cost that
# grows with them, not with this group; for a few partitions the fdatasyncs on threads are about as
# fast and touch only what they cover. Once the disk is busy with many partitions, though, a few at
# a time already sync faster together: 52 KiB newly written to each of 2 / 4 / 8 / 16 files, median
# of 15: 0.19 / 0.26 / 0.32 / 0.65 ms for a syncfs against 0.28 / 0.47 / 0.69 / 1.5 ms of fdatasyncs
# on threads; which is why a core's group commit keeps grouping two or more soon after a group
# (broker/backends/appends.py).
SYNCFS_MIN = 32


class FileSystems:
    """One descriptor per file system (`st_dev`) to call `syncfs` on, opened on the first
    directory of it that a group of flushes names, and kept; and whether a syncfs ever failed.

    A failed syncfs reports a writeback error once (it advances its descriptor's `errseq`, and
    marks the error seen for the superblock), without saying which file failed. The flushes of
    its group learn which from their own syncs, but a log outside the group whose file failed
    would not: a later syncfs succeeds, and its flush would call durable what writeback lost.
    So after one failure no syncfs is trusted again (`failed`): every flush keeps its own syncs,
    whose per-file error reporting each log's next sync still receives. For the same reason the
    syncfs calls are serialized: two at once on one descriptor would hand the error to only one
    of them."""

    __slots__ = ("failed", "fds", "lock")

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}
        self.failed: OSError | None = None  # the first syncfs failure, if any
        self.lock = threading.Lock()  # groups may run on several threads at once (uvloop's pool)

    def sync(self, io: FileIO, device: int, directory: str) -> bool:
        """syncfs the file system `device`, through a descriptor opened on `directory` (which
        must be on it) if none is yet; False if it failed, now or before."""
        with self.lock:
            if self.failed is not None:
                return False
            try:
                fd = self._fd(io, device, directory)
            except OSError:  # no descriptor: nothing was synced, and no error was reported
                return False
            try:
                io.syncfs(fd)
            except OSError as exc:
                self.failed = exc
                log.warning(
                    "syncfs of the file system holding %s failed (%s): flushes sync their own "
                    "files from now on",
                    directory,
                    exc,
                )
                return False
            return True

    def _fd(self, io: FileIO, device: int, directory: str) -> int:
        fd = self.fds.get(device)
        if fd is not None:
            return fd
        fd = io.open_dir(directory)
        try:
            on = io.device(fd)
        except OSError:
            io.close(fd)
            raise
        if on != device:  # renamed or remounted meanwhile: not the file system asked for
            io.close(fd)
            raise OSError(errno.EXDEV, f"{directory} is not on device {device:#x}")
        self.fds[device] = fd
        return fd

    def close(self, io: FileIO) -> None:
        with self.lock:
            fds, self.fds = self.fds, {}
        for fd in fds.values():
            io.close(fd)


def _sync_targets(io: FileIO, ops: Sequence[Op], directory: str) -> dict[int, str] | None:
    """The file systems the syncs of `ops` are on, each with a directory on it; None if one
    cannot be told (the flush's own syncs then meet the cause and report it)."""
    targets: dict[int, str] = {}
    try:
        for op in ops:
            if isinstance(op, Sync):  # the log's active segment, in the log's directory
                targets.setdefault(io.device(op.fd), directory)
            elif isinstance(op, SyncFile):
                try:
                    targets.setdefault(io.device(op.path), os.path.dirname(op.path))
                except FileNotFoundError:  # gone (retention): nothing to sync, as `sync_file`
                    continue
            elif isinstance(op, SyncDir):
                targets.setdefault(io.device(op.path), op.path)
    except OSError:
        return None
    return targets


def run_together(
    io: FileIO, flushes: Sequence[tuple[Sequence[Op], str]], filesystems: FileSystems
) -> tuple[list[OSError | None], int]:
    """Execute many flushes' operations with one `syncfs` per file system instead of each
    flush's syncs: first every flush's writes, then the syncfs calls, then, for a flush on a file
    system whose syncfs failed, now or ever (`FileSystems`), or could not be told, its own syncs. Each of
    `flushes` is (its operations, the directory of its files); the result is each one's error
    (None: durable) and how many syncfs calls succeeded.

    A syncfs that succeeded made durable everything written to its file system before it, data
    and metadata (the journal commits: new files' directory entries too), which is what each
    flush's fdatasyncs and directory fsyncs promise. A failed syncfs says some file of that file
    system failed writeback, not which: the flushes' own fdatasyncs say, each reporting its file's
    error (`errseq` per file), so the failure lands on the flush it belongs to, and from then on
    every flush keeps its own syncs (`FileSystems` says why)."""
    errors: list[OSError | None] = [None] * len(flushes)
    targets: list[dict[int, str] | None] = []
    for i, (ops, directory) in enumerate(flushes):
        try:
            for op in ops:
                if isinstance(op, Write):
                    run_write(io, op)
        except OSError as exc:
            errors[i] = exc
            targets.append({})
            continue
        targets.append(_sync_targets(io, ops, directory))
    wanted: dict[int, str] = {}
    for found in targets:
        for device, directory in (found or {}).items():
            wanted.setdefault(device, directory)
    failed: set[int] = set()
    synced = 0
    for device, directory in wanted.items():
        if filesystems.sync(io, device, directory):
            synced += 1
        else:
            failed.add(device)
    for i, (ops, _) in enumerate(flushes):
        found = targets[i]
        if errors[i] is not None or (found is not None and not failed.intersection(found)):
            continue
        try:
            run_ops(io, [op for op in ops if not isinstance(op, Write)])
        except OSError as exc:
            errors[i] = exc
    return errors, synced
