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

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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
