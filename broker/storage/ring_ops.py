"""Storage operations on an io_uring ring: the asynchronous twin of fileio.py's `run_ops`.

Rules this module keeps:
- The same operations (`Write`, `Sync`, `SyncFile`, `SyncDir`) and the same meaning as `run_ops`
  (fileio.py), submitted as SQEs instead of run at once: a short write continues where it
  stopped, a failed write is a `WriteError`, a failed sync a plain `OSError`, a `SyncFile` whose
  file is gone is nothing to sync. Reads of an `Extent` pin their segment while the SQE is in
  flight (`Segment.borrow_store_fd`).
- Storage imports only `ringlog_proto` and itself: the ring is a parameter (`OpRing`, the part of
  `native.ring.Ring` used here) and so is the loop's way of naming a continuation (`register`,
  which gives the user_data whose completion calls it). Nothing here imports `native` or the broker.
- Operations run one after another, on purpose: an index write must land before the fsync that
  covers it, and the common case is one operation.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from typing import Protocol

from broker.storage.fileio import Buffer, Op, Sync, SyncDir, Write, WriteError, remaining_buffers
from broker.storage.segment import Extent

Completion = Callable[[int, int], None]  # (res, flags) of a CQE
Register = Callable[[Completion], int]  # a continuation -> the user_data of its SQE


class OpRing(Protocol):
    """What the runner needs of a ring (native/ring.py `Ring` has it)."""

    def prep_writev(self, fd: int, buffers: Sequence[Buffer], offset: int, user_data: int) -> None: ...
    def prep_fsync(self, fd: int, user_data: int, datasync: bool = True) -> None: ...
    def prep_read(self, fd: int, buf: bytearray, offset: int, user_data: int) -> None: ...


class RingOps:
    """Runs storage operations and extent reads on `ring`, continuations through `register`."""

    __slots__ = ("register", "ring")

    def __init__(self, ring: OpRing, register: Register) -> None:
        self.ring = ring
        self.register = register

    def run(self, ops: Sequence[Op], done: Callable[[OSError | None], None]) -> None:
        """Execute `ops` in order; `done(None)` when all succeeded, `done(error)` at the first failure."""
        self._next(list(ops), 0, done)

    def _next(self, ops: list[Op], i: int, done: Callable[[OSError | None], None]) -> None:
        if i == len(ops):
            done(None)
            return
        op = ops[i]
        if isinstance(op, Write):

            def written(res: int, flags: int) -> None:
                if res < 0:
                    done(WriteError(-res, f"pwritev at offset {op.offset}: {os.strerror(-res)}"))
                elif res == 0:
                    done(WriteError(errno.EIO, f"pwritev wrote 0 bytes at offset {op.offset}"))
                elif res < op.length:
                    ops[i] = Write(
                        op.fd, remaining_buffers(op.buffers, res), op.offset + res, op.length - res
                    )
                    self._next(ops, i, done)
                else:
                    self._next(ops, i + 1, done)

            self.ring.prep_writev(op.fd, op.buffers, op.offset, self.register(written))
        elif isinstance(op, Sync):

            def synced(res: int, flags: int) -> None:
                if res < 0:
                    done(OSError(-res, f"fdatasync: {os.strerror(-res)}"))
                else:
                    self._next(ops, i + 1, done)

            self.ring.prep_fsync(op.fd, self.register(synced), datasync=True)
        else:  # SyncFile (a closed segment's file) or SyncDir: a descriptor of its own for the sync
            is_dir = isinstance(op, SyncDir)
            try:  # open(2) is not worth a ring round trip; the fsync is
                path_fd = os.open(op.path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else 0))
            except OSError as exc:
                if not is_dir and exc.errno == errno.ENOENT:  # deleted meanwhile (retention): no sync
                    self._next(ops, i + 1, done)
                else:
                    done(exc)
                return
            what = "fsync of directory" if is_dir else "fdatasync of"

            def path_synced(res: int, flags: int) -> None:
                os.close(path_fd)
                if res < 0:
                    done(OSError(-res, f"{what} {op.path}: {os.strerror(-res)}"))
                else:
                    self._next(ops, i + 1, done)

            self.ring.prep_fsync(path_fd, self.register(path_synced), datasync=not is_dir)

    def read(self, extent: Extent, done: Callable[[bytearray | BaseException], None]) -> None:
        """Read `extent` whole; `done(data)` (shorter only at the end of the file) or `done(error)`.

        Its segment is pinned while the SQE is in flight: the descriptor cache must not close (and
        the kernel hand out again) the number the read names. Retention and DeleteTopic may delete
        the segment meanwhile; its files then close when the read completes.
        """
        segment = extent.segment
        try:
            fd = segment.borrow_store_fd()
        except Exception as exc:  # cannot open a closed segment's file
            done(exc)
            return
        buf = bytearray(extent.length)

        def read(res: int, flags: int) -> None:
            segment.unpin()
            if res < 0:
                done(OSError(-res, f"read of {segment.store_path}: {os.strerror(-res)}"))
            else:
                # The buffer itself, not a copy: it is this read's alone, and a fetch reply sends
                # it as it is (a 1 MiB copy per fetch was a third of the io_uring fetch's CPU).
                if res < len(buf):
                    del buf[res:]
                done(buf)

        self.ring.prep_read(fd, buf, extent.position, self.register(read))
