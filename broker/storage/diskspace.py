"""Free space on the data dir's file system: when writes are refused, and the room kept for our own.

Rules this module keeps (docs/LIMITS.md, "Disk"):
- A full disk refuses writes, never reads. Each core asks `DiskSpace.check_writable()` before a
  write a client asked for (Produce, CreateTopic, OffsetCommit); it raises `OutOfSpaceError`
  (wire error OUT_OF_SPACE, retriable) while the file system has less than `--min-free-bytes`
  free or no free inode, so the disk does not fill to its last byte under the broker: what stays
  free is room for the broker's own small writes (index entries, a segment roll, the registry),
  as Redpanda's `storage_min_free_bytes` does. Reads, Metadata, DeleteTopic and retention never ask.
- Cheap: one statvfs per `CHECK_S` per core, not one per request. A real ENOSPC/EDQUOT from a write
  (`saw_full`) refuses at once, until a statvfs finds `--min-free-bytes` and at least
  `ROOM_AFTER_ENOSPC_BYTES` free (with --min-free-bytes 0, a full disk then costs no write per
  request and no flapping). Once space is back, writes are taken again, no restart.
- The reserve file: `<data_dir>/reserve.space`, `RESERVE_BYTES` allocated while there is room
  (the supervisor at start, then each core's check). Something else may fill the disk to the last
  byte (another program, a log file): the broker then gives up the reserve, once, to rewrite its
  topic registry (a DeleteTopic, which frees space, must not need free space to happen), and
  allocates it again once space is back.
- State changes are logged once per change and core (not per request).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable

from broker.storage.errors import OutOfSpaceError
from broker.storage.layout import reserve_path

log = logging.getLogger(__name__)

CHECK_S = 1.0  # statvfs at most this often per core; also how soon freed space is noticed
ROOM_AFTER_ENOSPC_BYTES = 1024 * 1024  # after a write failed for space, this much free (at least) clears it
RESERVE_BYTES = 4 * 1024 * 1024  # a few rewrites of a registry of thousands of topics
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_out_of_space(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, says the disk (or a quota) is full."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OutOfSpaceError):
            return True
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def ensure_reserve(data_dir: str) -> bool:
    """Allocate the reserve file if it is missing or short; False when there is no room for it
    (then nothing is left allocated). Never raises."""
    path = reserve_path(data_dir)
    try:
        if os.stat(path).st_size >= RESERVE_BYTES:
            return True
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        log.debug("cannot create %s: %s", path, exc)
        return False
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
        return True
    except OSError as exc:
        with contextlib.suppress(OSError):  # give back whatever part it got
            os.unlink(path)
        log.debug("no room for the reserve file %s: %s", path, exc)
        return False
    finally:
        os.close(fd)


def release_reserve(data_dir: str) -> bool:
    """Give the reserve's space back to the file system; whether there was one to give."""
    try:
        os.unlink(reserve_path(data_dir))
    except OSError:
        return False
    log.warning(
        "the disk is full: released the reserve file (%d bytes) for the broker's own writes", RESERVE_BYTES
    )
    return True


class DiskSpace:
    """Whether one core may write now (see the module rules). Owned by that core's loop thread."""

    def __init__(
        self, data_dir: str, min_free_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.data_dir = data_dir
        self.min_free_bytes = min_free_bytes
        self.clock = clock
        self.free_bytes: int | None = None  # at the last statvfs
        self._checked_at = float("-inf")
        self._refusal: str | None = None  # why writes are refused now, or None
        self._saw_enospc = False  # since writes were last taken

    def check_writable(self) -> None:
        """Raise `OutOfSpaceError` if a write must be refused now."""
        now = self.clock()
        if now - self._checked_at >= CHECK_S:
            self._check(now)
        if self._refusal is not None:
            raise OutOfSpaceError(self._refusal)

    def writable(self) -> bool:
        try:
            self.check_writable()
        except OutOfSpaceError:
            return False
        return True

    def saw_full(self, exc: BaseException) -> None:
        """A write failed with ENOSPC/EDQUOT: refuse writes until the next statvfs says otherwise."""
        self._checked_at = self.clock()
        self._saw_enospc = True
        self._set(
            f"the disk holding the data dir is full ({_reason(exc)}); writes are refused until space is freed"
        )

    def _check(self, now: float) -> None:
        self._checked_at = now
        try:
            st = os.statvfs(self.data_dir)
        except OSError as exc:  # keep what we knew: a failing statvfs says nothing about space
            log.debug("statvfs of %s: %s", self.data_dir, exc)
            return
        free = st.f_bavail * st.f_frsize
        self.free_bytes = free
        if free < self.min_free_bytes:
            self._set(
                f"{free} bytes free on the data dir's file system, below --min-free-bytes "
                f"{self.min_free_bytes}: writes are refused until space is freed"
            )
        elif self._saw_enospc and free < ROOM_AFTER_ENOSPC_BYTES:
            pass  # a write failed for space and the disk has not really changed: stay refused
        elif st.f_files and st.f_favail == 0:
            self._set("no free inode on the data dir's file system: writes are refused until some are freed")
        else:
            self._saw_enospc = False
            self._set(None)
            if free >= self.min_free_bytes + RESERVE_BYTES:
                ensure_reserve(self.data_dir)

    def _set(self, refusal: str | None) -> None:
        if (refusal is None) != (self._refusal is None):
            if refusal is None:
                log.info("disk space is back (%s bytes free): taking writes again", self.free_bytes)
            else:
                log.warning("refusing writes: %s", refusal)
        self._refusal = refusal


def _reason(exc: BaseException) -> str:
    while exc.__cause__ is not None and not isinstance(exc, OSError):
        exc = exc.__cause__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
