"""Passes over every partition of a core that hold its loop a bounded time per turn: `Sweep`.

Rules this module keeps:
- A pass walks a snapshot of the items it was given (a core's partitions, taken when the pass
  starts), at most `budget_s` of the clock or `items_max` items per loop turn, then hands the rest
  to the loop (`schedule`: the backend's `call_soon`, which runs after the I/O already due) and
  goes on from where it stopped. At 100 000 partitions and 3-10 us each, one pass in one turn
  held the loop 0.3-1 s; in turns of about a millisecond the requests between them wait no more.
- The budget is read after each visit: a turn overshoots it by at most one visit.
- An item that left the core during the pass (`alive` says no: its topic deleted, the partition
  closed) is skipped when its turn comes; one that arrived during the pass is not in the snapshot
  and is visited by the next pass. Every item of the snapshot still alive is visited exactly once.
- One pass at a time per `Sweep`: `start` while one runs returns False and changes nothing (the
  periodic callers skip a round, as a round that overran its period did before).
- A visit that raises is logged and the pass goes on: one partition's failure must not stop the
  housekeeping of the others (the callers catch what they expect; this is the last guard).
- Without a `schedule` (a core without a loop: tests, tools) a pass runs whole in `start`.
- Owned by its core's loop thread, as everything it visits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Final, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# About a millisecond of the loop per turn: a probe client's request waits at most that behind a
# pass (the goal is a p99 under 10 ms while passes run), and a pass over 100 000 partitions at
# ~5 us each still ends within ~500 turns.
SWEEP_BUDGET_S: Final = 0.001
# Visits per turn whatever the clock says: the bound holds under a coarse clock too.
SWEEP_ITEMS_MAX: Final = 512

Schedule = Callable[[Callable[[], None]], None]


class Sweep(Generic[T]):
    """One kind of pass of one core (module rules). `name` is for the log."""

    def __init__(
        self,
        name: str,
        schedule: Schedule | None,
        budget_s: float = SWEEP_BUDGET_S,
        items_max: int = SWEEP_ITEMS_MAX,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if items_max < 1:
            raise ValueError("a sweep visits at least one item per turn")
        self.name = name
        self.schedule = schedule
        self.budget_s = budget_s
        self.items_max = items_max
        self.clock = clock
        self._items: list[T] = []
        self._next = 0
        self._visit: Callable[[T], None] | None = None
        self._alive: Callable[[T], bool] | None = None
        self._done: Callable[[], None] | None = None
        self._pass = 0  # the pass a scheduled turn belongs to: a cancelled pass's turn does nothing
        self.turns = 0  # turns taken by all passes (tests, metrics)

    @property
    def running(self) -> bool:
        return self._visit is not None

    def start(
        self,
        items: Iterable[T],
        visit: Callable[[T], None],
        done: Callable[[], None] | None = None,
        alive: Callable[[T], bool] | None = None,
    ) -> bool:
        """Begin a pass over a snapshot of `items`: `visit(item)` for each (while `alive(item)`,
        checked just before), then `done()`. False, and nothing done, when a pass is running."""
        if self._visit is not None:
            return False
        self._items = list(items)
        self._next = 0
        self._visit, self._alive, self._done = visit, alive, done
        self._pass += 1
        this = self._pass
        if self.schedule is None:
            while self._visit is not None and self._pass == this:
                self._turn(this)
        else:
            self._turn(this)
        return True

    def cancel(self) -> None:
        """Stop the pass in progress, if any, without its `done` (the core is closing)."""
        self._items, self._visit, self._alive, self._done = [], None, None, None
        self._pass += 1

    def _turn(self, this: int) -> None:
        visit = self._visit
        if visit is None or this != self._pass:  # cancelled while this turn was scheduled
            return
        self.turns += 1
        items, alive, clock = self._items, self._alive, self.clock
        end = min(len(items), self._next + self.items_max)
        started = clock()
        i = self._next
        while i < end:
            item = items[i]
            i += 1
            if alive is None or alive(item):
                try:
                    visit(item)
                except Exception:
                    log.exception("%s: visiting %r failed", self.name, item)
                if self._visit is not visit:
                    return  # cancelled by the visit (the core closing)
                if clock() - started >= self.budget_s:
                    break
        self._next = i
        if i < len(items):
            if self.schedule is not None:
                self.schedule(partial(self._turn, this))
            return
        done = self._done
        self.cancel()
        if done is not None:
            done()
