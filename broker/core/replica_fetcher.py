"""A follower's fetching from one leader core, without I/O: the ReplicaFetch request for every
partition it follows there, and what to do with the answer.

Rules this module keeps:
- One `ReplicaFetcher` per leader core this node follows partitions on (the network link owns
  it and moves the frames). A partition with appends still in flight is left out of a request
  (its fetch offset is not known yet); fetch offset = the log end, last fetched epoch = the
  epoch of its last batch (broker/storage/epochs.py), current leader epoch = the follower's.
- Applying an answer: OFFSET_OUT_OF_RANGE with the leader's log start above the follower's end
  (retention deleted what it still needs) starts the follower's log over, empty, there
  (`Partition.restart_at`); a diverging epoch (KIP-320) truncates to the smaller of the leader's end
  for that epoch and the follower's own (`Partition.truncate_diverged`, synchronous: a cold
  path); records become `FollowerAppend`s, one per segment they fill, carried out by the caller
  in order (`Partition.append_replica`: offsets and epochs as the leader wrote them); the
  leader's high watermark is taken as far as the local log reaches, and so is its log start
  (Kafka's DeleteRecords, or its retention: `Partition.follow_log_start`). An error backs the
  partition off, doubling from 100 ms to 5 s; a good answer resets it.
- A request names the partitions in turn: one that got records goes to the back of the next
  request, as Kafka's fetcher moves it (`PartitionStates.updateAndMoveToEnd`). The leader fills
  an answer in request order up to its max_bytes (broker/core/read_budget.py), so a partition far
  behind would otherwise fill every answer while the ones after it get nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.core.outcomes import FollowerAppend
from broker.core.partition import Partition
from broker.core.partition_roles import PendingReplicaAppend
from broker.core.replication import FollowerState
from broker.storage.errors import StorageError
from ringlog_proto import messages as m
from ringlog_proto.frames import Buffer

log = logging.getLogger(__name__)

BACKOFF_MIN_MS = 100
BACKOFF_MAX_MS = 5_000


def append_outcomes(partition: Partition, records: Buffer, leader_hw: int) -> list[FollowerAppend]:
    """`Partition.append_replica` as `FollowerAppend`s: the backend runs each one's ops and
    completes or fails them in order (`run_replica_append`); each completed one takes the
    leader's HW as far as the log reaches."""
    outcomes = []
    for pending in partition.append_replica(records):

        def publish(pending: PendingReplicaAppend = pending) -> None:
            pending.complete()
            partition.follower_high_watermark(leader_hw)

        outcomes.append(FollowerAppend(partition, pending.pending, publish))
    return outcomes


@dataclass(slots=True)
class _Fetched:
    partition: Partition
    backoff_ms: int = 0
    retry_at_ms: int = 0
    last_error: m.ErrorCode = m.ErrorCode.NONE


@dataclass(slots=True)
class Applied:
    """What applying one ReplicaFetch response did: the appends to carry out (each a `FollowerAppend`
    outcome: run its ops, then `complete()` or `fail(exc)`), the partitions truncated, errors."""

    appends: list[FollowerAppend] = field(default_factory=list)
    truncated: dict[tuple[int, int], int] = field(default_factory=dict)  # key -> new log end
    # the leader's error code, or what refused the records here (handlers.error_of maps it)
    errors: dict[tuple[int, int], m.ErrorCode | BaseException] = field(default_factory=dict)


class ReplicaFetcher:
    """This node's fetching from one leader core: every partition it follows there."""

    def __init__(
        self,
        node_id: int,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 8 << 20,
    ) -> None:
        self.node_id = node_id
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self._partitions: dict[tuple[int, int], _Fetched] = {}

    def add(self, partition: Partition) -> None:
        key = (partition.topic_id, partition.index)
        if key not in self._partitions:
            self._partitions[key] = _Fetched(partition)
        else:
            self._partitions[key].partition = partition

    def remove(self, topic_id: int, index: int) -> None:
        self._partitions.pop((topic_id, index), None)

    def partitions(self) -> list[Partition]:
        return [f.partition for f in self._partitions.values()]

    def __len__(self) -> int:
        return len(self._partitions)

    def request(self, now_ms: int) -> m.ReplicaFetchRequest | None:
        """The next ReplicaFetch: every followed partition not backing off (None if none is).
        Partitions with appends still in flight are left out (their fetch offset is not known)."""
        parts = []
        for (tid, index), f in self._partitions.items():
            p = f.partition
            if f.retry_at_ms > now_ms or p.log.next_offset != p.log.end_offset:
                continue
            state = p.replica
            if not isinstance(state, FollowerState):
                continue
            parts.append(
                m.ReplicaFetchPartition(tid, index, p.log.end_offset, p.epochs.latest_epoch, state.epoch)
            )
        if not parts:
            return None
        return m.ReplicaFetchRequest(
            self.node_id, self.max_wait_ms, self.min_bytes, self.max_bytes, tuple(parts)
        )

    def next_retry_ms(self) -> int | None:
        """When the earliest backing-off partition may be fetched again (None: none backs off)."""
        times = [f.retry_at_ms for f in self._partitions.values() if f.backoff_ms]
        return min(times) if times else None

    def apply(self, response: m.ReplicaFetchResponse, now_ms: int) -> Applied:
        """Apply the leader's answer: truncations happen here (synchronous, a cold path), the
        appends are returned to be carried out, in order per partition."""
        out = Applied()
        for r in response.partitions:
            key = (r.topic_id, r.partition)
            f = self._partitions.get(key)
            if f is None:
                continue
            p = f.partition
            state = p.replica
            if (
                r.error == m.ErrorCode.OFFSET_OUT_OF_RANGE
                and isinstance(state, FollowerState)
                and r.log_start_offset > p.log.end_offset
            ):  # the leader deleted what this follower still needs: start over at its log start
                p.restart_at(r.log_start_offset)
                out.truncated[key] = r.log_start_offset
                continue
            if r.error != m.ErrorCode.NONE or not isinstance(state, FollowerState):
                code = r.error if r.error != m.ErrorCode.NONE else m.ErrorCode.NOT_OWNER
                f.backoff_ms = min(max(f.backoff_ms * 2, BACKOFF_MIN_MS), BACKOFF_MAX_MS)
                f.retry_at_ms = now_ms + f.backoff_ms
                f.last_error = code
                out.errors[key] = code
                continue
            f.backoff_ms = 0
            f.retry_at_ms = 0
            f.last_error = m.ErrorCode.NONE
            if r.diverging_epoch != m.NO_DIVERGENCE or r.diverging_end_offset != m.NO_DIVERGENCE:
                out.truncated[key] = p.truncate_diverged(r.diverging_epoch, r.diverging_end_offset)
                continue
            try:
                p.follow_log_start(r.log_start_offset)  # the leader's DeleteRecords or retention
            except (StorageError, OSError) as exc:
                log.error("partition %d/%d: taking the leader's log start: %s", *key, exc)
            if r.records:
                self._partitions[key] = self._partitions.pop(key)  # its turn is over: to the back
                try:
                    out.appends += append_outcomes(p, r.records, r.high_watermark)
                except Exception as exc:  # refused before anything was written: back off
                    f.backoff_ms = min(max(f.backoff_ms * 2, BACKOFF_MIN_MS), BACKOFF_MAX_MS)
                    f.retry_at_ms = now_ms + f.backoff_ms
                    out.errors[key] = exc
            else:
                p.follower_high_watermark(r.high_watermark)
        return out


def follower_states(partitions: Mapping[tuple[int, int], Partition]) -> dict[tuple[int, int], int]:
    """(topic id, partition) -> leader node of every partition this core follows (for the agent)."""
    return {k: p.replica.leader for k, p in partitions.items() if isinstance(p.replica, FollowerState)}
