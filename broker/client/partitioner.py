"""Which partition a record goes to.

1. An explicit `partition` wins.
2. A record with a key goes to `crc32c(key) % partition_count`: crc32c (Castagnoli, the checksum
   the batch format already uses, so no new dependency) of the raw key bytes as an unsigned 32-bit
   number. Stable across processes, machines and languages (Python's `hash()` is salted per
   process and could not be used), so every producer sends a key to the same partition and
   per-key order holds. It changes if the partition count changes.
3. A record without a key goes to the topic's *sticky* partition: all keyless records go to one
   partition until its batch is sealed (full, or lingered and sent), then the next partition in
   round-robin order takes over. Plain round-robin would spread a burst over every partition in
   tiny batches; sticking fills one batch at a time. The first sticky partition is random so that
   many producers do not all start on partition 0. In a cluster the producer passes `usable`
   (the partitions with a live leader): the sticky choice skips the others while any is usable,
   as Kafka's producer does, so keyless records do not wait for an election. Keyed and explicit
   records keep their partition whatever its state: moving them would break per-key order.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from crc32c import crc32c


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of a keyed record: `crc32c(key) % partitions`."""
    return crc32c(key) % partitions


class Partitioner:
    """Explicit, then key hash, then sticky round-robin (see the module docstring)."""

    __slots__ = ("_rng", "_sticky")

    def __init__(self, rng: random.Random | None = None) -> None:
        self._sticky: dict[str, int] = {}
        self._rng = rng or random.Random()

    def partition(
        self,
        topic: str,
        key: bytes | None,
        partitions: int,
        explicit: int | None = None,
        usable: Callable[[int], bool] | None = None,
    ) -> int:
        if explicit is not None:
            return explicit
        if key is not None:
            return crc32c(key) % partitions
        p = self._sticky.get(topic)
        if p is None or p >= partitions:
            p = self._sticky[topic] = self._rng.randrange(partitions)
        if usable is not None and not usable(p):
            for step in range(1, partitions):
                if usable((p + step) % partitions):
                    p = self._sticky[topic] = (p + step) % partitions
                    break
        return p

    def batch_sealed(self, topic: str, partition: int, partitions: int) -> None:
        """A batch of `partition` was sealed: if it was the sticky one, move on to the next."""
        if self._sticky.get(topic) == partition:
            self._sticky[topic] = (partition + 1) % partitions
