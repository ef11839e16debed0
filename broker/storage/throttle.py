"""The log cleaner's I/O cap and its manners towards the core's loop (Kafka's `Throttler` under
log.cleaner.io.max.bytes.per.second).

Rules this module keeps:
- `account(n)` is told every byte the cleaner reads or writes; past the rate it sleeps until the
  bytes so far fit it (the rate measured over `WINDOW_S`, so a pause does not bank a burst).
- The cleaner runs on a thread of the core's worker process, which shares the interpreter (and
  its lock) with the loop serving requests: a thread that keeps the lock for the interpreter's
  whole switch interval (5 ms) adds that to a request's latency. So `account` also gives the lock
  away (a zero sleep) once `YIELD_S` of work has passed since it last did: a request waits at
  most about that long for it.
- Cancelled (`cancel()`, from the loop's thread), the next `account` raises `CleanCancelled`:
  a clean stops between two of its reads or writes, leaving only files that recovery removes.
- The clock and the sleep are parameters (tests run them fake).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

WINDOW_S = 1.0  # the span the rate is held over: bytes beyond rate * window are never banked
YIELD_S = 0.0005  # the longest the cleaner works before it lets the loop's thread run


class CleanCancelled(Exception):
    """The cleaning was cancelled (its log closed, or the core stopped)."""


class Throttle:
    """Bytes per second, at most (None: no cap), with the loop yielded to (module rules)."""

    def __init__(
        self,
        bytes_per_s: float | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ValueError(f"a rate of {bytes_per_s} bytes/s: give a positive rate or None")
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._sleep = sleep
        self._cancelled = threading.Event()
        now = clock()
        self._window_start = now
        self._window_bytes = 0.0
        self._yielded = now
        self.total_bytes = 0
        self.slept_s = 0.0

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Raise `CleanCancelled` if cancelled; give the loop its turn when due."""
        if self._cancelled.is_set():
            raise CleanCancelled("the cleaning was cancelled")
        now = self._clock()
        if now - self._yielded >= YIELD_S:
            self._sleep(0)
            self._yielded = self._clock()

    def account(self, n: int) -> None:
        """`n` bytes were read or written: sleep as the cap asks, yield, or raise if cancelled."""
        self.total_bytes += n
        self.check()
        rate = self.bytes_per_s
        if rate is None:
            return
        now = self._clock()
        if now - self._window_start > WINDOW_S:
            # Carry over only what is still owed: a long pause banks nothing.
            owed = max(0.0, self._window_bytes - rate * (now - self._window_start))
            self._window_start, self._window_bytes = now, owed
        self._window_bytes += n
        wait = self._window_bytes / rate - (now - self._window_start)
        if wait > 0:
            self._sleep(wait)
            self.slept_s += wait
            self._yielded = self._clock()
            if self._cancelled.is_set():
                raise CleanCancelled("the cleaning was cancelled")
