"""Warnings about connections, at most one line per reason per interval (`RateLimitedLog`): what
the served connections, memory admission and the sweep log when they refuse or close one."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """Warnings about connections, at most one line per reason per interval.

    A flood of connections (thousands stalled, or beyond the cap) must not become a flood of log
    lines: the first event of a reason in an interval is logged, the others are counted, and the
    count is given with the next line of that reason (or by `flush`, from the sweep).
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 1.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, reason: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval_s:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last[reason] = now
        suppressed = self._suppressed.pop(reason, 0)
        if suppressed and last is not None:
            self.logger.warning(
                "%s: " + msg + " (and %d more suppressed in the last %.1fs)",
                reason,
                *args,
                suppressed,
                now - last,
            )
        else:
            self.logger.warning("%s: " + msg, reason, *args)

    def flush(self) -> None:
        """Report the counts of reasons that had no line for a whole interval."""
        now = time.monotonic()
        for reason, count in list(self._suppressed.items()):
            last = self._last.get(reason, now)
            if now - last >= self.interval_s:
                del self._suppressed[reason]
                self._last[reason] = now
                self.logger.warning("%s: %d more suppressed in the last %.1fs", reason, count, now - last)
