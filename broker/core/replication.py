"""A partition's replication state: its role, the leader's view of its followers, and the
follower's fetch loop towards one leader core. Pure classes: no I/O, no clock of their own.

Rules this module keeps:
- A `Partition` (broker/core/partition.py) holds at most one role: `LeaderState`, `FollowerState`,
  or None (not replicated: a single node, leader of itself at epoch 0, whose high watermark is
  its log end, exactly as before replication; nothing here runs on its produce path).
- The leader's high watermark is the smallest log end over the in-sync replicas, its own
  included, and never moves backwards within its term. A follower's log end is what its
  ReplicaFetch says (the fetch offset: everything below it is stored there), never more than the
  leader's end. A follower counts as caught up when a fetch reaches the leader's end; it should
  leave the ISR once it has not been caught up for `lag_max_ms`, and join it when caught up
  (`isr_proposal`: the controller decides, the leader learns the new ISR by `set_isr`).
- acks=all: a produce is answered once the high watermark passes its last offset (`wait`), and
  refused before anything is written when fewer than `min_insync` replicas are in sync
  (`NotEnoughReplicasError`); its waiters fail when the ISR shrinks below that or the leader
  steps down.
- The follower side (`ReplicaFetcher`) builds one ReplicaFetch for every partition it follows
  on one leader core and applies the answer: a diverging epoch (KIP-320) truncates to the
  smaller of the leader's end for that epoch and its own, records are appended as the leader
  wrote them (`Partition.append_replica`), the leader's high watermark is taken (bounded by the
  local log end). Errors back off per partition, doubling up to a cap.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ringlog_proto import messages as m

if TYPE_CHECKING:
    from broker.core.outcomes import Append
    from broker.core.partition import Partition

DEFAULT_MIN_INSYNC = 2
DEFAULT_LAG_MAX_MS = 30_000
BACKOFF_MIN_MS = 100
BACKOFF_MAX_MS = 5_000


class NotLeaderError(Exception):
    """A produce, consumer fetch or replica fetch reached a replica that does not lead the
    partition at the epoch asked (a follower, or a leader of a stale or future epoch)."""


class NotEnoughReplicasError(Exception):
    """acks=all with fewer replicas in sync than min_insync: refused, or (after the append)
    the ISR shrank below it before the batches were replicated."""


@dataclass(slots=True)
class FollowerProgress:
    log_end: int  # -1 until its first fetch this term
    caught_up_ms: int  # when a fetch last reached the leader's log end


@dataclass(frozen=True, slots=True)
class IsrProposal:
    leave: tuple[int, ...]  # in sync, but not caught up for longer than lag_max_ms
    join: tuple[int, ...]  # out of sync, now caught up to the leader's end

    def __bool__(self) -> bool:
        return bool(self.leave or self.join)


_Waiter = tuple[int, int, Callable[[], None], Callable[[BaseException], None]]


class LeaderState:
    """What a leader tracks for one partition in one term (epoch)."""

    __slots__ = (
        "_seq",
        "_waiters",
        "epoch",
        "followers",
        "high_watermark",
        "isr",
        "min_insync",
        "node_id",
        "replicas",
    )

    def __init__(
        self,
        node_id: int,
        epoch: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        high_watermark: int,
        now_ms: int,
        min_insync: int = DEFAULT_MIN_INSYNC,
    ) -> None:
        self.node_id = node_id
        self.epoch = epoch
        self.replicas = tuple(replicas)
        self.isr = frozenset(isr) | {node_id}
        self.min_insync = min_insync
        self.high_watermark = high_watermark
        self.followers = {r: FollowerProgress(-1, now_ms) for r in self.replicas if r != node_id}
        self._waiters: list[_Waiter] = []  # a heap by offset
        self._seq = itertools.count()

    # ------------------------------------------------------------------------- questions

    def enough_in_sync(self) -> bool:
        return len(self.isr) >= min(self.min_insync, len(self.replicas) or 1)

    def isr_proposal(self, now_ms: int, lag_max_ms: int, leader_end: int) -> IsrProposal:
        leave = tuple(
            sorted(
                r for r, f in self.followers.items() if r in self.isr and now_ms - f.caught_up_ms > lag_max_ms
            )
        )
        join = tuple(
            sorted(r for r, f in self.followers.items() if r not in self.isr and f.log_end >= leader_end)
        )
        return IsrProposal(leave, join)

    # ------------------------------------------------------------------------- events

    def follower_fetched(self, node: int, fetch_offset: int, leader_end: int, now_ms: int) -> bool:
        """A ReplicaFetch of `node` at `fetch_offset`: its log end. True if the HW advanced."""
        f = self.followers.get(node)
        if f is None:  # a replica the leader did not know of (assignment changed): track it
            f = self.followers[node] = FollowerProgress(-1, now_ms)
        f.log_end = min(fetch_offset, leader_end)
        if f.log_end >= leader_end:
            f.caught_up_ms = now_ms
        return self.advance(leader_end)

    def set_isr(self, isr: Iterable[int], leader_end: int) -> bool:
        """The controller's new ISR. True if the HW advanced; waiters fail when it is too small."""
        self.isr = frozenset(isr) | {self.node_id}
        if not self.enough_in_sync():
            self.fail_waiters(
                NotEnoughReplicasError(f"{len(self.isr)} replicas in sync, fewer than {self.min_insync}")
            )
        return self.advance(leader_end)

    def advance(self, leader_end: int) -> bool:
        """Recompute the HW from the ISR's log ends (the leader's is `leader_end`)."""
        hw = leader_end
        followers = self.followers
        for r in self.isr:
            if r != self.node_id:
                f = followers.get(r)
                end = -1 if f is None else f.log_end
                if end < hw:
                    hw = end
        if hw <= self.high_watermark:
            return False
        self.high_watermark = hw
        return True

    def wait(self, offset: int, done: Callable[[], None], failed: Callable[[BaseException], None]) -> None:
        """Call `done()` once the HW reaches `offset` (the end of a produce), `failed(exc)` if the
        ISR shrinks below min_insync or the leader steps down first."""
        if self.high_watermark >= offset:
            done()
            return
        heapq.heappush(self._waiters, (offset, next(self._seq), done, failed))

    def take_ready(self) -> list[Callable[[], None]]:
        """The waiters the HW has passed, oldest offset first (the caller runs them)."""
        ready = []
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.high_watermark:
            ready.append(heapq.heappop(waiters)[2])
        return ready

    def fail_waiters(self, exc: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, _, failed in sorted(waiters, key=lambda w: (w[0], w[1])):
            failed(exc)

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class FollowerState:
    """What a follower knows of its partition's leader in one term."""

    __slots__ = ("epoch", "high_watermark", "leader")

    def __init__(self, epoch: int, leader: int, high_watermark: int) -> None:
        self.epoch = epoch
        self.leader = leader
        self.high_watermark = high_watermark


# ----------------------------------------------------------------------------- the follower's fetch loop


@dataclass(slots=True)
class _Fetched:
    partition: Partition
    backoff_ms: int = 0
    retry_at_ms: int = 0
    last_error: m.ErrorCode = m.ErrorCode.NONE


@dataclass(slots=True)
class Applied:
    """What applying one ReplicaFetch response did: the appends to carry out (each an `Append`
    outcome: run its ops, then `complete()` or `fail(exc)`), the partitions truncated, errors."""

    appends: list[Append] = field(default_factory=list)
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
            if r.records:
                try:
                    out.appends += p.replica_append_outcomes(r.records, r.high_watermark)
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
