"""What a core opens at start lives as long as the core: kept out of the cyclic collector's walk.

CPython's full collection (its oldest generation) walks every tracked object while holding the
loop, and a partition is ~30 of them (its log, segment, index, producer state, epochs, lists and
deques): ~13-22 µs a partition here, 306-446 ms at 20 000 (docs/LIMITS.md). It runs when what was
promoted since the last one reaches a quarter of what survived it, so opening a node's stored
partitions ran it again at each quarter of growth, and later, however rarely, it walked them all
again. So the collector is off while they open (`collector_off`); then one collection, and what
is left is frozen (`freeze_long_lived`, `gc.freeze`: the permanent generation, never walked; an
object there is still freed by its reference count when dropped).

Partitions opened while the core serves (created, first used) grow the walk the same way: 20 000
touched after start ran 18 full collections, the longest 376-421 ms, each one holding every
client of the core. So every `FREEZE_EVERY` of them (`OpenedWhileServing`) the young generations
are collected and everything is frozen again: a few ms, against a walk that grows with the node.

Why freezing them loses nothing: the request paths leave no reference cycle (a parked fetch and
io_uring's flush steps were the last ones, tests/backends/test_cyclic_garbage.py), and a deleted
topic's partitions, logs and segments are freed by their reference counts (the same test), so
nothing frozen waits on the collector to be freed. An object that did end in a cycle after the
freeze would stay until the process exits; so would one that became cyclic garbage after it
reached the oldest generation and before a freeze while serving (that freeze collects the young
generations only: a full collection there is the pause it exists to avoid).

What the collector costs is measured here too (`collector_pauses`), and published with each
core's metrics.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache


@contextmanager
def collector_off() -> Iterator[None]:
    """The cyclic collector off while the body runs (it makes objects that live on, no garbage
    cycles); its state restored after, whatever the body raised."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def freeze_long_lived() -> None:
    """One full collection (what start made and dropped in cycles goes), then everything left out
    of the collector's walk. Once, after a core opened stored partitions: it walks the whole
    process (a core made on an empty data dir, as most tests make, skips it)."""
    gc.collect()
    gc.freeze()


# partitions opened while serving between two freezes: ~30 tracked objects each, so the oldest
# generation a full collection walks stays under ~8 000 of theirs (a few ms), and the freeze's
# young collection, ~1 ms, is paid once for each 256 opened
FREEZE_EVERY = 256


def freeze_young() -> None:
    """Collect the young generations, then freeze everything tracked: what is left of a burst of
    opened partitions out of every later walk, without the full collection that would walk it."""
    gc.collect(1)
    gc.freeze()


class OpenedWhileServing:
    """Counts the partitions a core opens after its start, and freezes (`freeze_young`) once
    `every` of them were opened since the last freeze. One per core (`Core`)."""

    __slots__ = ("_every", "_since")

    def __init__(self, every: int = FREEZE_EVERY) -> None:
        self._every = every
        self._since = 0

    def opened(self) -> None:
        self._since += 1
        if self._since >= self._every:
            self._since = 0
            freeze_young()


class CollectorPauses:
    """How long the cyclic collector held this process: collections per generation, their total
    time and the longest (a full collection walks every tracked object, so at many partitions it
    is the loop's longest pause that no request caused). One per process, made by
    `collector_pauses`, read into each core's metrics (broker/core/metrics.py); its `gc.callbacks`
    hook costs two clock reads a collection."""

    __slots__ = ("_started_ns", "collections", "longest_us", "total_us")

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.total_us = 0
        self.longest_us = 0
        self._started_ns = 0

    def _timed(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started_ns = time.perf_counter_ns()
            return
        us = (time.perf_counter_ns() - self._started_ns) // 1000
        self.collections[info["generation"]] += 1
        self.total_us += us
        self.longest_us = max(self.longest_us, us)


@cache
def collector_pauses() -> CollectorPauses:
    """This process's `CollectorPauses`, hooked into the collector at the first call."""
    pauses = CollectorPauses()
    gc.callbacks.append(pauses._timed)
    return pauses
