"""The byte budget of one fetch that reads several partitions: Kafka's response cap
(`fetch.max.bytes`, KIP-74), for both protocols' multi-partition fetches.

Rules this module keeps (Kafka's `ReplicaManager.readFromLog`):
- Partitions are read in the order the request names them, each up to the smaller of its own
  limit and what is left of the response's.
- Until one partition has given records, a read takes at least one batch whole, however large
  (each partition's read door, `Partition.read`, does: so a consumer always progresses past a
  batch above both limits; `max.message.bytes` is what bounds a batch). After it, a partition
  whose first batch does not fit what is left gives no records: its answer is the partition's
  bounds alone (error none), and the fetch is `full`.
- A read is asked of the door even when nothing is left, so its checks (leader, epoch, offset in
  range) answer as they would in any fetch.

`full` is what a long poll needs: a response with a batch left out for lack of room is as full as
it can be, so it answers now whatever its min_bytes (Kafka counts the bytes a partition could
give towards min_bytes, not what the response cap lets through). Made per fetch attempt, so a
long poll that looks again, or answers at its deadline, keeps the cap too.
"""

from __future__ import annotations

from broker.core.partition import PendingRead


class ReadBudget:
    """What is left of one fetch's response cap (made by the request's handler, on its core)."""

    __slots__ = ("_first", "full", "left_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.left_bytes = max(max_bytes, 0)
        self._first = True  # no partition has given records yet: the next read takes one batch
        self.full = False  # a partition's batch was left out for lack of room

    def limit(self, partition_max_bytes: int) -> int:
        """The `max_bytes` to ask the read door for a partition whose own limit is
        `partition_max_bytes` (at least 1, which the door asks: `take` drops what exceeds it)."""
        return max(min(partition_max_bytes, self.left_bytes), 1)

    def take(self, read: PendingRead, limit: int) -> PendingRead:
        """`read` (prepared with `limit`) counted against the budget: as it is while it fits or
        while no partition has given records, else without records (and the fetch `full`). A
        read's extent above `limit` is its first batch alone (the door stops at the last batch
        within it, at least one), which fits nowhere but first."""
        extent = read.extent
        if extent is None:
            return read
        if not self._first and (extent.length > limit or extent.length > self.left_bytes):
            self.full = True
            return read.without_records()
        self._first = False
        self.left_bytes = max(self.left_bytes - extent.length, 0)
        return read
