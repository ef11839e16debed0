"""A `run_blocking` for handler tests without a loop: each call is held until the test carries it
out (`Blocking.run`, one loop turn's worth), so a test sees what the core does while a blocking
call is still on the pool (broker/core/blocking.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Blocking:
    """A `run_blocking` whose calls wait until `run()` (a loop turn) carries them out."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []

    def __call__(self, fn: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.calls.append((fn, done))

    def run(self) -> int:
        calls, self.calls = self.calls, []
        for fn, done in calls:
            try:
                result = fn()
            except Exception as exc:
                result = exc
            done(result)
        return len(calls)
