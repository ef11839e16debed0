"""A partition's replicated side: the role it holds (leader or follower), what the leader keeps
of its followers, and the follower's door for the leader's batches.

Apart from the partition's own doors (broker/core/partition.py) because none of it runs for a
partition that is not replicated (a single node: `replica` None, leader of itself at epoch 0),
and all of it is the one unit that follows the cluster's roles. `Partition` is a
`PartitionRoles`: the methods here are the partition's, on its state, owned by its core.

Rules this module keeps:
- A role changes only forward: an older epoch is ignored, the same epoch updates the replicas
  and ISR (leader) or the leader (follower). Stepping down fails the acks=all waiters; the long
  polls are woken once the new role is set, so they answer with what it allows.
- The leader's high watermark moves with its followers' fetches (`replica_fetched`), the ISR
  (`update_isr`, `isr_answered`) and its own log end (`leader_end_moved`); each move answers
  the acks=all produces it passes and wakes the consumers' long polls, not the followers'
  (their fetches read to the log end, which did not move).
- A follower stores the leader's batches as they are (`append_replica`, in two phases as a
  produce, `PendingReplicaAppend`), takes the leader's high watermark as far as its log reaches,
  and truncates where the leader says its log diverged (KIP-320), rebuilding the producer state
  and epoch history from what stays.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.core.producer_state import CompletedTxn, ProducerState
from broker.core.replication import (
    DEFAULT_MIN_INSYNC,
    FollowerState,
    IsrProposal,
    LeaderState,
    NotEnoughReplicasError,
    NotLeaderError,
)
from broker.storage.epochs import EpochHistory
from broker.storage.fileio import Buffer
from broker.storage.log import Log, PendingAppend
from ringlog_proto.batch import BatchError, BatchHeader, now_ms
from ringlog_proto.batch_control import ControlRecord, control_of

log = logging.getLogger("broker.core.partition")  # the partition's lines, as before this module was apart


class PendingReplicaAppend:
    """A follower's append of the leader's batches: run `pending.ops`, then `complete()` or
    `fail()` (undoing the write is the log's `abort_append`, as for a produce)."""

    __slots__ = ("_controls", "_partition", "pending")

    def __init__(
        self,
        partition: PartitionRoles,
        pending: PendingAppend,
        controls: dict[int, ControlRecord] | None = None,
    ) -> None:
        self._partition = partition
        self.pending = pending
        self._controls = controls  # what the markers among the batches say, by base offset

    def complete(self) -> int:
        """Make the batches visible; the producer state and epoch history learn them (a
        follower that becomes leader must know its producers). Returns the new log end."""
        p = self._partition
        headers: list[BatchHeader] = self.pending.headers
        p.log.complete_append(self.pending, self._controls)
        completed = p.producers.stored(headers, self._controls, write_ms=self.pending.append_ms)
        if completed:
            p.transactions_completed(completed)
        epochs = p.epochs
        for h in headers:
            epochs.assign(h.partition_leader_epoch, h.base_offset)
        p.wake_waiters()
        return self.pending.next_offset

    def fail(self) -> None:
        """Nothing to release: a follower reserves no sequences."""


class PartitionRoles:
    """The replicated side of a `Partition` (module rules): its base class, on its state."""

    # the partition's state these methods share, set by `Partition.__init__`
    log: Log
    producers: ProducerState
    epochs: EpochHistory
    replica: LeaderState | FollowerState | None  # None: not replicated
    leader_epoch: int  # stamped into produced batches
    _led_since: float  # time.monotonic() when this replica began to lead

    if TYPE_CHECKING:  # the partition's own, which these call

        def wake_waiters(self, log_end: bool = True) -> None: ...
        def transactions_completed(self, completed: list[CompletedTxn]) -> None: ...
        def _rebuild(self) -> None: ...

    # ------------------------------------------------------------------------- roles

    def become_leader(
        self,
        epoch: int,
        replicas: tuple[int, ...],
        isr: tuple[int, ...],
        node_id: int,
        now: int | None = None,
        min_insync: int = DEFAULT_MIN_INSYNC,
        high_watermark: int | None = None,
    ) -> None:
        """Lead this partition at `epoch` (the controller's). The same epoch again updates the
        replicas and ISR only; an older one is ignored (a restarted worker never steps back).
        The HW starts at `high_watermark` if given, else where it was (a follower's, or the log
        end of a partition that was not replicated), and only grows from there."""
        now = now_ms() if now is None else now
        current = self.replica
        if current is not None and epoch < current.epoch:
            return
        end = self.log.end_offset
        if isinstance(current, LeaderState) and current.epoch == epoch:
            current.replicas = tuple(replicas)
            for gone in [r for r in current.followers if r not in current.replicas]:
                del current.followers[gone]  # reassigned away: never proposed back into the ISR
            current.min_insync = min_insync
            self._run_ready(current.set_isr(isr, end))
            return
        hw = self.high_watermark if high_watermark is None else high_watermark
        self._step_down(epoch)
        self.replica = LeaderState(node_id, epoch, replicas, isr, min(hw, end), now, min_insync)
        self.leader_epoch = epoch
        self._led_since = time.monotonic()
        self.wake_waiters()  # long polls answer with what the new term allows
        self._run_ready(self.replica.advance(end))

    def become_follower(self, epoch: int, leader: int, high_watermark: int | None = None) -> None:
        """Follow `leader` at `epoch`; acks=all produces waiting here fail (NOT_OWNER). The HW
        starts as `become_leader`'s does; the leader's answers move it."""
        current = self.replica
        if current is not None and epoch < current.epoch:
            return
        if isinstance(current, FollowerState) and current.epoch == epoch:
            current.leader = leader
            return
        hw = self.high_watermark if high_watermark is None else high_watermark
        self._step_down(epoch)
        self.replica = FollowerState(epoch, leader, min(hw, self.log.end_offset))
        self.leader_epoch = epoch
        self.wake_waiters()  # long polls answer with what the new role allows (NOT_OWNER)

    def _step_down(self, epoch: int) -> None:
        if isinstance(self.replica, LeaderState):
            self.replica.fail_waiters(NotLeaderError(f"no longer the leader (epoch {epoch} began)"))
        # the long polls are woken by the caller once the new role is set: woken before it, a
        # follower's fetch found the old term still there and parked again until its deadline

    def update_isr(self, isr: tuple[int, ...]) -> None:
        """The controller accepted a new ISR for this leader's term."""
        if isinstance(self.replica, LeaderState):
            self._run_ready(self.replica.set_isr(isr, self.log.end_offset))

    def proposing_isr(self, epoch: int, isr: tuple[int, ...]) -> None:
        """This leader (at `epoch`) proposes `isr` to the store (`LeaderState.proposing`)."""
        replica = self.replica
        if isinstance(replica, LeaderState) and replica.epoch == epoch:
            replica.proposing(isr)

    def isr_answered(self, epoch: int, isr: tuple[int, ...] | None) -> None:
        """The store's answer to this leader's proposal at `epoch` (`LeaderState.proposal_answered`)."""
        replica = self.replica
        if isinstance(replica, LeaderState) and replica.epoch == epoch:
            self._run_ready(replica.proposal_answered(isr, self.log.end_offset))

    def isr_proposal(self, now: int, lag_max_ms: int) -> IsrProposal | None:
        """A leader's: which followers should leave the ISR (not caught up for `lag_max_ms`)
        and which may join it (caught up to its end). None when this replica does not lead."""
        replica = self.replica
        if not isinstance(replica, LeaderState):
            return None
        return replica.isr_proposal(now, lag_max_ms, self.log.end_offset)

    @property
    def high_watermark(self) -> int:
        """What consumers may read below: the log end when not replicated."""
        replica = self.replica
        return self.log.end_offset if replica is None else replica.high_watermark

    @property
    def is_leader(self) -> bool:
        return not isinstance(self.replica, FollowerState)

    def check_leader(self, current_epoch: int = -1) -> None:
        """Raise `NotLeaderError` unless this replica leads (at `current_epoch`, when not -1)."""
        replica = self.replica
        if replica is None:
            if current_epoch not in (-1, self.leader_epoch):
                raise NotLeaderError(f"epoch {current_epoch} asked, this partition is at {self.leader_epoch}")
            return
        if not isinstance(replica, LeaderState):
            raise NotLeaderError(f"a follower of node {replica.leader} at epoch {replica.epoch}")
        if current_epoch not in (-1, replica.epoch):
            raise NotLeaderError(f"epoch {current_epoch} asked, this leader is at epoch {replica.epoch}")

    def check_replicas(self) -> None:
        """Before an acks=all produce: `NotEnoughReplicasError` when too few are in sync."""
        replica = self.replica
        if isinstance(replica, LeaderState) and not replica.enough_in_sync():
            raise NotEnoughReplicasError(
                f"{len(replica.isr)} of {len(replica.replicas)} replicas in sync, "
                f"min_insync is {replica.min_insync}"
            )

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) of `epoch` here (KIP-101; broker/storage/epochs.py)."""
        lead = None if isinstance(self.replica, FollowerState) else self.leader_epoch
        return self.epochs.end_offset_for_epoch(epoch, self.log.end_offset, lead)

    # ------------------------------------------------------------------------- leader side

    def leader_end_moved(self) -> None:
        """The leader's log end grew: with no follower in the ISR the HW follows it."""
        replica = self.replica
        if isinstance(replica, LeaderState):
            self._run_ready(replica.advance(self.log.end_offset))

    def replica_fetched(self, node: int, fetch_offset: int, now: int) -> None:
        """A follower's ReplicaFetch at `fetch_offset` (its log end): the HW may advance, which
        answers acks=all produces and wakes consumers long-polling at the old HW."""
        replica = self.replica
        if isinstance(replica, LeaderState):
            self._run_ready(replica.follower_fetched(node, fetch_offset, self.log.end_offset, now))

    def after_replicated(
        self, offset: int, done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        """`done()` once the HW reaches `offset` (acks=all), `failed(exc)` if it cannot."""
        replica = self.replica
        if not isinstance(replica, LeaderState):
            if replica is None:
                done()
            else:
                failed(NotLeaderError("no longer the leader"))
            return
        replica.wait(offset, done, failed)

    def _run_ready(self, advanced: bool) -> None:
        replica = self.replica
        if not advanced or not isinstance(replica, LeaderState):
            return
        for done in replica.take_ready():
            run_isolated(done, "an acks=all answer")
        self.wake_waiters(log_end=False)  # the log end did not move: a follower's fetch reads to it

    def diverging(self, last_fetched_epoch: int, fetch_offset: int) -> tuple[int, int] | None:
        """KIP-320 on the leader: (epoch, end offset) the follower must truncate to when its
        last fetched epoch ends here below its fetch offset (or is unknown here), else None."""
        if last_fetched_epoch < 0:
            return None
        epoch, end = self.end_offset_for_epoch(last_fetched_epoch)
        if epoch == -1 or end < fetch_offset or epoch < last_fetched_epoch:
            return epoch, end
        return None

    # ------------------------------------------------------------------------- follower side

    def append_replica(self, records: Buffer) -> list[PendingReplicaAppend]:
        """The follower's door: store the leader's batches as they are (offsets and epochs
        kept; crc and framing validated; the first must start at the log's next offset, else
        `OffsetOutOfRangeError`), one append per segment they fill. Run each one's
        `pending.ops`, then `complete()` them in order (or `fail()`)."""
        if not isinstance(self.replica, FollowerState):
            raise NotLeaderError("only a follower appends a leader's batches")
        pendings = self.log.prepare_copies(records)
        controls: dict[int, ControlRecord] | None = None
        position = 0
        for pending in pendings:
            for h in pending.headers:
                if h.control:
                    controls = {} if controls is None else controls
                    try:
                        controls[h.base_offset] = control_of(records, position, verify=False)
                    except BatchError as exc:
                        log.error("a control batch at offset %d that is no marker: %s", h.base_offset, exc)
                position += h.size
        return [PendingReplicaAppend(self, pending, controls) for pending in pendings]

    def follower_high_watermark(self, leader_hw: int) -> None:
        """The leader's HW, as far as this follower's log reaches."""
        replica = self.replica
        if isinstance(replica, FollowerState):
            hw = min(leader_hw, self.log.end_offset)
            if hw > replica.high_watermark:
                replica.high_watermark = hw

    def truncate_to(self, offset: int) -> int:
        """Drop every batch at or above `offset` (to the batch boundary at or below it); the
        epoch history and producer state are rebuilt. Returns the new log end. Synchronous (a
        cold path, durable on return); refused with appends in flight."""
        log_ = self.log
        if offset >= log_.end_offset:
            return log_.end_offset
        end = log_.truncate(max(offset, log_.start_offset))
        self._rebuild()
        replica = self.replica
        if replica is not None and replica.high_watermark > end:
            replica.high_watermark = end
        return end

    def restart_at(self, offset: int) -> None:
        """A follower whose leader's log now starts above this log's end: drop everything and
        start over, empty, at `offset` (the leader's log start; everything below it was
        committed, so the HW is at least there)."""
        self.log.restart_at(offset)
        self._rebuild()
        replica = self.replica
        if replica is not None and replica.high_watermark < offset:
            replica.high_watermark = offset

    def truncate_diverged(self, epoch: int, end_offset: int) -> int:
        """The leader said (KIP-320) that our last epoch diverges: truncate to the smaller of its
        end for that epoch and ours; an epoch the leader does not know falls back to our HW."""
        if epoch < 0 or end_offset < 0:
            target = self.high_watermark
        else:
            _, ours = self.epochs.end_offset_for_epoch(epoch, self.log.end_offset)
            target = end_offset if ours < 0 else min(end_offset, ours)
        return self.truncate_to(target)


def run_isolated(call: Callable[[], None], what: str) -> None:
    """`call()`, its failure (a bug) logged instead of raised into the caller's request."""
    try:
        call()
    except Exception:
        log.exception("%s failed", what)
