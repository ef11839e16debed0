"""Which workers are up, as the supervisor sees them, shared with every worker through memory.

Why: the supervisor holds every inter-core listener, so a core forwarding to a peer whose worker
died connects fine (the connection waits in the backlog) and would wait for the restart to be
answered. The supervisor learns of a death at once (SIGCHLD) and of a restarted worker's readiness
from its ready pipe; it writes one byte per core into a shared memfd, and a forwarding core reads
that byte before each forward and while forwards are pending (broker/core/forwarding.py `PeerPool`),
answering NOT_OWNER (retriable) instead of waiting for a worker that is not there.

Layout: byte k is 1 while core k's worker is up (reported ready, not yet reaped), 0 otherwise.
One writer (the supervisor's loop), single-byte stores: readers never see a torn value.
"""

from __future__ import annotations

import mmap
import os

UP: int = 1
DOWN: int = 0


class LivenessTable:
    """The supervisor's side: owns the memfd that workers inherit (`fd`, pass it in pass_fds)."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.fd = os.memfd_create("ringlog-liveness")  # close-on-exec: only pass_fds hands it on
        size = max(cores, 1)
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def set(self, core: int, up: bool) -> None:
        self._map[core] = UP if up else DOWN

    def up(self, core: int) -> bool:
        return self._map[core] == UP

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)


class LivenessView:
    """A worker's read-only view of the table, from the inherited fd."""

    def __init__(self, fd: int, cores: int) -> None:
        self._map = mmap.mmap(fd, max(cores, 1), mmap.MAP_SHARED, mmap.PROT_READ)
        self.cores = cores

    def alive(self, core: int) -> bool:
        return self._map[core] == UP

    def close(self) -> None:
        self._map.close()


def always_alive(core: int) -> bool:
    """Without a supervisor (a backend run in-process by tests): every peer counts as up; the
    forward deadline (`--forward-timeout-ms`) is then the only bound."""
    return True


def peer_liveness(fd: int, cores: int) -> LivenessView | None:
    """The view for a worker given the spec's fd (-1: none), or None."""
    if fd < 0:
        return None
    return LivenessView(fd, cores)
