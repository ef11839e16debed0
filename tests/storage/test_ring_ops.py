"""The ring's storage-op runner against a fake ring: the same meaning as `run_ops` (short writes
continue, a failed write is a WriteError, a failed sync a plain OSError, a vanished SyncFile is
nothing to sync), one operation in flight at a time, in order."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

from broker.storage.fileio import Sync, SyncFile, Write, WriteError
from broker.storage.ring_ops import RingOps


class FakeRing:
    def __init__(self) -> None:
        self.prepped: list[tuple[str, tuple[object, ...], int]] = []

    def prep_writev(self, fd: int, buffers: object, offset: int, user_data: int) -> None:
        self.prepped.append(("writev", (fd, tuple(bytes(b) for b in buffers), offset), user_data))  # type: ignore[attr-defined]

    def prep_fsync(self, fd: int, user_data: int, datasync: bool = True) -> None:
        self.prepped.append(("fsync", (fd, datasync), user_data))

    def prep_read(self, fd: int, buf: bytearray, offset: int, user_data: int) -> None:
        self.prepped.append(("read", (fd, offset), user_data))


def runner() -> tuple[FakeRing, RingOps, Callable[[int], None], list[OSError | None]]:
    ring = FakeRing()
    continuations: dict[int, Callable[[int, int], None]] = {}

    def register(callback: Callable[[int, int], None]) -> int:
        ud = len(continuations) + 1
        continuations[ud] = callback
        return ud

    def complete(res: int) -> None:
        continuations[ring.prepped[-1][2]](res, 0)

    return ring, RingOps(ring, register), complete, []


def test_a_short_write_continues_and_the_sync_waits_for_it() -> None:
    ring, ops, complete, results = runner()
    ops.run([Write(7, (b"abc", b"defg"), 100, 7), Sync(7)], results.append)
    assert ring.prepped[-1][:2] == ("writev", (7, (b"abc", b"defg"), 100))
    complete(4)
    assert ring.prepped[-1][:2] == ("writev", (7, (b"efg",), 104))
    complete(3)
    assert ring.prepped[-1][:2] == ("fsync", (7, True))
    complete(0)
    assert results == [None]


def test_a_failed_write_is_a_write_error_and_a_failed_sync_is_not() -> None:
    ring, ops, complete, results = runner()
    ops.run([Write(7, (b"abc",), 0, 3), Sync(7)], results.append)
    complete(-errno.ENOSPC)
    assert len(ring.prepped) == 1  # the sync never ran
    assert isinstance(results[0], WriteError) and results[0].errno == errno.ENOSPC
    ops.run([Sync(7)], results.append)
    complete(-errno.EIO)
    assert type(results[1]) is OSError and results[1].errno == errno.EIO


def test_a_file_deleted_before_its_sync_is_nothing_to_sync(tmp_path: Path) -> None:
    ring, ops, _, results = runner()
    ops.run([SyncFile(str(tmp_path / "gone.store"))], results.append)
    assert results == [None] and not ring.prepped
