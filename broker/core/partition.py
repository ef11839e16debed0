"""A partition as the request handlers see it: its log, idempotent-producer state and the
consumers long-polling at its end.

Rules this module keeps:
- Owned by one core (the one `routing.owner` names); no locks, no threads.
- A produce has one door: `produce(records, space)`. The partition validates the batches (the
  log's `validate`), asks its producer state (broker/core/producer_state.py) whether they are new,
  a retry or out of order, asks `space` whether a write is allowed, prepares the append and
  reserves the batches' sequences; the caller runs the returned writes and calls `complete()`
  (the log makes them visible, then the producer state remembers them, then long polls wake) or
  `fail()` (their sequences are released; undoing the write is the log's `abort_append`, which the
  backend calls once for the oldest failed append). The handler never drives the log or the
  producer state of a produce itself.
- Duplicate detection is by (producer id, epoch, sequence range): a producer retrying a batch it
  already sent gets the original offsets back and nothing is appended twice. The state is rebuilt
  from the batch headers in the log when the partition opens, so it survives a broker restart,
  and loses what retention deletes (`apply_retention`), so it lives as long as its batches.
- Consumer-group offsets are not the partition's: they live with the group's coordinator core
  (broker/core/groups.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from broker.core.producer_state import ProducerState
from broker.storage.diskspace import DiskSpace
from broker.storage.fdcache import FdCache
from broker.storage.log import Log, LogConfig, PendingAppend


class Stored(NamedTuple):
    """Where a produce's batches are in the log (a NamedTuple: one is built per produce)."""

    base_offset: int
    end_offset: int  # one past the last record: the next offset to be assigned after them
    log_start_offset: int
    durable: bool  # fsynced already (end_offset <= the log's durable offset)


class PendingProduce:
    """A produce whose append is prepared: run `pending.ops`, then `complete()` or `fail()`."""

    __slots__ = ("_partition", "pending")

    def __init__(self, partition: Partition, pending: PendingAppend) -> None:
        self._partition = partition
        self.pending = pending

    def complete(self) -> Stored:
        """The writes all succeeded: make the batches visible, remember their sequences, wake
        the long polls. Appends complete in the order prepared (the log asserts it)."""
        p = self._partition
        pending = self.pending
        log_ = p.log
        log_.complete_append(pending)
        p.producers.stored(pending.headers)
        p.wake_waiters()
        end = pending.next_offset
        return Stored(pending.base_offset, end, log_.start_offset, log_.durable_offset >= end)

    def fail(self) -> None:
        """The append failed or was undone (`Log.abort_append`): its sequences are free again."""
        self._partition.producers.released(self.pending.headers)


class Partition:
    """One partition's state on its owning core."""

    def __init__(
        self, topic_id: int, index: int, directory: str, config: LogConfig, cache: FdCache | None = None
    ) -> None:
        self.topic_id = topic_id
        self.index = index
        self.directory = directory
        self.log = Log.open(directory, config, cache=cache)
        self.producers = ProducerState.rebuild(self.log.batch_headers(self.log.start_offset))
        self.waiters: list[Callable[[], None]] = []

    def close(self) -> None:
        self.wake_waiters()
        self.log.close()

    # ------------------------------------------------------------------------- produce

    def produce(self, records: bytes, space: DiskSpace) -> Stored | PendingProduce:
        """Store `records` (one or more whole batches), in two phases: `Stored` when they are a
        producer's retry of batches already stored (nothing to write), else the prepared append.

        Raises what refuses the produce, with nothing changed: the log's validation errors,
        `SequenceError` / `RetryInFlightError` (broker/core/producer_state.py), `LogClosedError`
        (a retry is confirmed only by a log that stands behind it, not one that failed an fsync),
        `OutOfSpaceError` from `space` (asked after the retry check: a retry of stored batches
        is answered even on a full disk), and storage errors of a segment roll.
        """
        log_ = self.log
        headers = log_.validate(records)
        duplicate_of = self.producers.check(headers)
        if duplicate_of is not None:
            log_.check_usable()
            end = duplicate_of + sum(h.record_count for h in headers)
            return Stored(duplicate_of, end, log_.start_offset, log_.durable_offset >= end)
        space.check_writable()
        pending = log_.prepare_append(records, headers)
        self.producers.reserve(pending.headers)
        return PendingProduce(self, pending)

    def apply_retention(self) -> int:
        """Delete the segments past the topic's retention (the log decides which); the producer
        state forgets the batches they held. Returns the segments deleted."""
        deleted = self.log.apply_retention()
        if deleted:
            self.producers.expire(self.log.start_offset)
        return deleted

    # ------------------------------------------------------------------------- long polls

    def wake_waiters(self) -> None:
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()
