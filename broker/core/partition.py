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
  from the batch headers in the log when the partition opens (after a clean shutdown, loaded
  from the snapshot its close wrote instead: `_restore`), so it survives a broker restart,
  and loses what retention deletes (`apply_retention`), so it lives as long as its batches, or
  until its producer has been idle for the broker's producer id expiration (`expire_producers`).
- Consumer-group offsets are not the partition's: they live with the group's coordinator core
  (broker/core/groups.py).
- Leader epochs: every batch a leader stores carries its epoch (stamped when offsets are
  assigned); `epochs` (broker/storage/epochs.py) is rebuilt from the batch headers at open, in
  the same walk as the producer state, and follows appends and truncations.
- Replication (broker/core/replication.py): `replica` is None when the partition is not
  replicated (a single node: leader of itself at epoch 0, high watermark = log end, the produce
  path exactly as before), else the role it holds (`become_leader` / `become_follower`). A
  follower has a second door, `append_replica` (the leader's batches, offsets and epochs kept,
  in the same two phases as a produce), and `truncate_to`; a produce to it is `NotLeaderError`.
  Consumers read below `high_watermark`. That side is broker/core/partition_roles.py
  (`PartitionRoles`, this class's base).
- A read has one door too: `read(offset, max_bytes, isolation, leader_epoch)` (Kafka's
  `UnifiedLog.read(isolation)`), whatever asks: our Fetch and Kafka's read below the high
  watermark (`Isolation.HIGH_WATERMARK`), a follower reads to the log end (`read_for_follower`,
  which first answers a diverging epoch and counts the follower's position, then reads through
  the same door). It returns the extent to pread and the finish that checks the bytes read; the
  caller only carries them out. `list_offset(spec)` answers both protocols' ListOffsets.
- Transactions (KIP-98), as Kafka's UnifiedLog keeps them: the producer state knows each
  producer's open transaction and the ones completed whose marker is not below the high
  watermark yet; the last stable offset is the first offset of those, bounded by the high
  watermark and the log start (`last_stable_offset`; the high watermark with none). A
  read_committed read (`Isolation.LAST_STABLE`) stops there and is given the aborted
  transactions it overlaps (broker/storage/txn_index.py); every read reports the last stable
  offset. A marker is written by `write_marker` (the coordinator's door: acks=all, checked by
  the producer state first); the open walk learns open transactions from transactional
  headers and their ends from the markers' records, so a restart (kill -9 too) keeps the last
  stable offset and the aborted list; a follower learns the same from the leader's batches.
- The log start moves up by retention, by `delete_records` on the leader (Kafka's DeleteRecords,
  at most to the high watermark) and, on a follower, by `follow_log_start` (the leader's start, as
  far as the follower's high watermark reaches); the producer state and epoch history forget
  what went each time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import Enum
from typing import NamedTuple

from broker.core.acks import Waits, check_acks
from broker.core.partition_roles import PartitionRoles, run_isolated
from broker.core.producer_state import (
    CompletedTxn,
    PredecessorPendingError,
    ProducerState,
    SequenceGapError,
)
from broker.core.replication import (
    FollowerState,
    LeaderState,
    NotLeaderError,
)
from broker.storage import log_flush, producer_snapshot
from broker.storage.diskspace import DiskSpace
from broker.storage.epochs import EpochHistory
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.fdcache import FdCache
from broker.storage.fileio import Buffer, FileIO
from broker.storage.log import CleanEnd, Log, LogConfig, PendingAppend
from broker.storage.log_reads import TimestampAndOffset
from broker.storage.segment import Extent
from broker.storage.txn_index import AbortedTxn, TxnIndex
from ringlog_proto.batch import TIMESTAMP_TYPE_BIT, now_ms, read_header
from ringlog_proto.batch_control import ControlRecord, control_batch, control_of
from ringlog_proto.messages import Acks

log = logging.getLogger(__name__)

# How long after a replica begins to lead a producer's sequence gap is answered retriably
# (`PredecessorPendingError`), not OUT_OF_ORDER_SEQUENCE: the batches before it were refused by
# this replica while it still followed, a moment ago, and the producer resends them first (its
# retry backoff and a Metadata refresh: well under this). A gap that outlasts it is a real one.
SEQUENCE_GAP_GRACE_S = 10.0


class Stored(NamedTuple):
    """Where a produce's batches are in the log (a NamedTuple: one is built per produce)."""

    base_offset: int
    end_offset: int  # one past the last record: the next offset to be assigned after them
    log_start_offset: int
    durable: bool  # fsynced already (end_offset <= the log's durable offset)
    waits: Waits = Waits.WRITE  # what the answer to this produce waits for (`Partition.produce`)
    log_append_time: int = -1  # the time the log stamped the batches with (LogAppendTime), else -1


# `list_offset` specs, the same numbers in both protocols; a spec >= 0 is a timestamp (ms)
LATEST = (
    -1
)  # the high watermark (read_committed: the last stable offset): where a consumer starting now reads from
EARLIEST = -2  # the log start
NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP, beside an offset not found by time


class RecordDeletionRefused(ValueError):
    """A DeleteRecords of a partition whose cleanup policy does not delete (Kafka's
    PolicyViolationException, POLICY_VIOLATION; INVALID_REQUEST in our protocol's mapping)."""


class Isolation(Enum):
    """How far a read may go: what tells a follower's read from a consumer's, and a
    read_uncommitted consumer's from a read_committed one's (Kafka's FetchIsolation)."""

    LOG_END = "log end"  # a follower copies everything its leader has
    HIGH_WATERMARK = "high watermark"  # a consumer reads what every in-sync replica holds
    LAST_STABLE = "last stable offset"  # read_committed: no further than any open transaction


class ReadAnswer(NamedTuple):
    """What a read found: the batches as stored and the partition's bounds when it finished;
    a read_committed read's answer names the aborted transactions its batches overlap."""

    records: Buffer
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int
    aborted: tuple[AbortedTxn, ...] = ()


class Diverging(NamedTuple):
    """KIP-320, on the leader: the follower's last fetched epoch ends here at `end_offset`
    (epoch -1: unknown here), below where it fetches: it truncates before it reads."""

    epoch: int
    end_offset: int


class PendingRead:
    """A read the door prepared: pread `extent` (None: nothing to read yet, the reader may wait
    for the partition to grow), then `finish(data)`; `nothing()` answers without records."""

    __slots__ = ("_committed", "_offset", "_partition", "extent")

    def __init__(
        self, partition: Partition, extent: Extent | None, offset: int = -1, committed: bool = False
    ) -> None:
        self._partition = partition
        self.extent = extent
        self._offset = offset  # where the reader asked to read from
        self._committed = committed  # a read_committed read: its answer names aborted transactions

    def finish(self, data: Buffer) -> ReadAnswer:
        """The intact batches of `data` (the bytes read for `extent`). Damage after at least one
        whole batch is logged and the batches before it answered; damage at the first raises
        (`CorruptBatchError`)."""
        assert self.extent is not None
        p = self._partition
        result = p.log.complete_read(self.extent, data)
        if result.error is not None:
            log.error("%s", result.error)
        aborted: tuple[AbortedTxn, ...] = ()
        if self._committed and p.aborted:
            aborted = tuple(p.aborted.collect(self._offset, result.next_offset))
        return ReadAnswer(result.data, p.high_watermark, p.log.start_offset, p.last_stable_offset, aborted)

    def without_records(self) -> PendingRead:
        """The same read with nothing to pread: a multi-partition fetch whose response has no
        room left for this partition's batches (broker/core/read_budget.py)."""
        return PendingRead(self._partition, None, self._offset, self._committed)

    def nothing(self) -> ReadAnswer:
        """No records (nothing there yet, or a long poll's deadline): the bounds as they are now."""
        p = self._partition
        return ReadAnswer(b"", p.high_watermark, p.log.start_offset, p.last_stable_offset)


class PendingProduce:
    """A produce whose append is prepared: run `pending.ops`, then `complete()` or `fail()`."""

    __slots__ = ("_controls", "_partition", "pending", "waits")

    def __init__(
        self,
        partition: Partition,
        pending: PendingAppend,
        waits: Waits,
        controls: dict[int, ControlRecord] | None = None,
    ) -> None:
        self._partition = partition
        self.pending = pending
        self.waits = waits  # what the reply waits for once the writes are visible
        self._controls = controls  # a marker's record, by its base offset (`write_marker`)

    def complete(self) -> None:
        """The writes all succeeded: make the batches visible, remember their sequences, wake
        the long polls. Appends complete in the order prepared (the log asserts it). Where they
        are is `stored()`, known before (the reply is made from it)."""
        p = self._partition
        pending = self.pending
        p.log.complete_append(pending, self._controls)
        # Stored and visible from here: a failure of what follows (a bug) must not make the
        # produce an error answer, which its producer would resend.
        try:
            completed = p.producers.stored(pending.headers, self._controls, write_ms=pending.append_ms)
            if completed:
                p.transactions_completed(completed)
            h = pending.headers[0]
            if h.partition_leader_epoch != p.epochs.latest_epoch:  # the first batch of a new epoch
                p.epochs.assign(h.partition_leader_epoch, h.base_offset)
            if p.replica is not None:
                p.leader_end_moved()
        except Exception:
            log.exception("bookkeeping after a stored append to partition %d/%d failed", p.topic_id, p.index)
        p.wake_waiters()

    def stored(self) -> Stored:
        """Where the batches are, known before `complete()` runs: the offsets were assigned when
        the append was prepared, and publishing moves neither the log start nor the durable
        offset."""
        log_ = self._partition.log
        end = self.pending.next_offset
        h = self.pending.headers[0]
        stamp = h.max_timestamp if h.attributes & TIMESTAMP_TYPE_BIT else -1
        return Stored(
            self.pending.base_offset, end, log_.start_offset, log_.durable_offset >= end, self.waits, stamp
        )

    def fail(self) -> None:
        """The append failed or was undone (`Log.abort_append`): its sequences are free again."""
        self._partition.producers.released(self.pending.headers)


class Partition(PartitionRoles):
    """One partition's state on its owning core."""

    def __init__(
        self,
        topic_id: int,
        index: int,
        directory: str,
        config: LogConfig,
        cache: FdCache | None = None,
        io: FileIO | None = None,
        clean: int | None = None,
        recovered: list[Log] | None = None,
    ) -> None:
        """`io`: the file calls the log makes itself (recovery, rolls, reads of its own), the
        process's synchronous ones unless given (a faulty disk in tests). `clean`: the token of
        the last run, when its core's marker says that run closed every partition it had open
        cleanly (broker/storage/clean_marker.py): the snapshot that close left, if it is that
        run's and describes the log as it opens, stands for the recovery scan, the syncs and the
        header walk. `recovered`: where a start gathers the logs whose recovery syncs it makes
        at once (`Log.open`)."""
        self.topic_id = topic_id
        self.index = index
        self.directory = directory
        snap: producer_snapshot.Snapshot | str = "no clean marker"
        if clean is not None:
            snap = producer_snapshot.read(directory)
            if not isinstance(snap, str) and snap.token != clean:
                snap = "written by an earlier run"
        end = None if isinstance(snap, str) else CleanEnd(snap.active_base, snap.active_size, snap.log_end)
        self.log = Log.open(directory, config, io, cache=cache, clean=end, recovered=recovered)
        self.producers = ProducerState()
        self.epochs = EpochHistory()
        self.aborted = TxnIndex()
        if isinstance(snap, str) or not self.log.opened_clean or snap.log_start != self.log.start_offset:
            if clean is not None:
                log.info("%s: the header walk (snapshot: %s)", directory, _why_not(snap, self.log))
            self._rebuild()
        else:
            self._restore(snap)
        self.waiters: list[Callable[[], None]] = []  # consumers' long polls: log end or HW
        self.replica_waiters: list[Callable[[], None]] = []  # followers' fetches: log end only
        self._wake_held: bool | None = None  # None, or held wakes are due: their log_end (`hold_wakes`)
        self._holding_wakes = False
        # None: not replicated (module rules); else this replica's role in the current term
        self.replica: LeaderState | FollowerState | None = None
        self.leader_epoch = max(self.epochs.latest_epoch, 0)  # stamped into produced batches
        self._led_since = -SEQUENCE_GAP_GRACE_S  # time.monotonic() when this replica began to lead

    def _rebuild(self) -> None:
        """Producer state (transactions too), aborted transactions and epoch history from the
        batch headers, in one walk (a pread per batch: what opening a partition already cost for
        the producer state alone, and one more per marker, whose type is in its record)."""
        epochs = EpochHistory()
        producers = ProducerState()
        aborted = TxnIndex()
        for h, control in self.log.batches_and_markers(self.log.start_offset):
            epochs.assign(h.partition_leader_epoch, h.base_offset)
            done = producers.learn(h, control, self.log.written_by_ms(h.base_offset))
            if done is not None and not done.commit:
                aborted.add(
                    AbortedTxn(done.producer_id, done.first_offset, done.last_offset, done.last_stable_offset)
                )
        self.producers = producers
        self.epochs = epochs
        self.aborted = aborted

    def _restore(self, snap: producer_snapshot.Snapshot) -> None:
        """What `_rebuild` would find, from the snapshot a clean close left at this log's end."""
        self.producers = ProducerState.restore(snap.producers, snap.completed)
        epochs = EpochHistory()
        for epoch, start in snap.epochs:
            epochs.assign(epoch, start)
        self.epochs = epochs
        aborted = TxnIndex()
        for entry in snap.aborted:
            aborted.add(AbortedTxn(*entry))
        self.aborted = aborted

    def snapshot(self, token: int) -> producer_snapshot.Snapshot:
        """The state `_rebuild` derives from the headers, at the log's end (written at a clean
        close: broker/storage/producer_snapshot.py)."""
        active = self.log.segments[-1]
        return producer_snapshot.Snapshot(
            token,
            self.log.start_offset,
            self.log.end_offset,
            active.base_offset,
            active.size,
            self.producers.snapshot(),
            self.producers.completed(),
            tuple(self.epochs.entries()),
            tuple(self.aborted.entries()),
        )

    def transactions_completed(self, completed: list[CompletedTxn]) -> None:
        """Markers were stored: the aborted transactions among those they ended are kept for
        read_committed readers (Kafka's `LogSegment.updateTxnIndex`)."""
        for done in completed:
            if not done.commit:
                self.aborted.add(
                    AbortedTxn(done.producer_id, done.first_offset, done.last_offset, done.last_stable_offset)
                )

    def configure(self, config: LogConfig, min_insync: int | None = None) -> None:
        """The topic's configs changed (a config alter, seen on the registry's reload): the log
        takes its new settings at once (the next append, roll and retention pass use them) and a
        leader its new `min_insync` (None: unchanged). Retention runs now rather than on its
        next pass: a shorter retention is seen to take effect when it is set."""
        reason = config.invalid()
        if reason is not None:
            raise ValueError(f"invalid log config: {reason}")
        old = self.log.config
        self.log.config = config
        if min_insync is not None and isinstance(self.replica, LeaderState):
            self.replica.min_insync = min_insync
        if (config.retention_ms, config.retention_bytes) != (old.retention_ms, old.retention_bytes):
            self.apply_retention()

    def close(self, discard: bool = False, token: int | None = None) -> producer_snapshot.Snapshot | None:
        """`discard`: the partition's topic was deleted, its files go next: nothing is flushed
        (`Log.discard`). `token`: the run's (broker/storage/clean_marker.py). Returns, with a
        token, the snapshot to write when it closed clean (flushed and closed with no error: what
        its core's clean-shutdown marker vouches for), else None; a failure to flush raises, as
        the log's close does. The caller writes it (`write_snapshot`), after every partition's
        syncs: written before them, each sync's journal commit would carry it too."""
        if discard:
            self._release_waiters()
            self.log.discard()
            return None
        snap, plan = self.prepare_close(token)
        if plan is not None:
            failed = None
            try:
                log_flush.run_close(self.log.io, plan)
            except OSError as exc:
                failed = exc
            self.log.complete_close(plan, failed)
        return snap

    def prepare_close(
        self, token: int | None = None
    ) -> tuple[producer_snapshot.Snapshot | None, log_flush.ClosePlan | None]:
        """`close` (not discarding) in three steps, for `Core.close`, which runs the disk work of
        many partitions at once: this (waiters failed and woken, the snapshot taken, the log's
        `prepare_close`), `log_flush.run_close` of the plan (any thread), then the log's
        `complete_close`; the snapshot is what `close` would return once that raised nothing."""
        self._release_waiters()
        snap = self.snapshot(token) if token is not None and not self.log.closed else None
        return snap, self.log.prepare_close()

    def _release_waiters(self) -> None:
        if isinstance(self.replica, LeaderState):
            self.replica.fail_waiters(NotLeaderError("the partition closed"))
        self.wake_waiters()

    def write_snapshot(self, snap: producer_snapshot.Snapshot) -> bool:
        """Write what `close` returned (broker/storage/producer_snapshot.py); whether it was."""
        try:
            producer_snapshot.write(self.directory, snap)
        except OSError as exc:
            log.debug("%s: no snapshot written (%s)", self.directory, exc)  # the core counts them
            return False
        return True

    # ------------------------------------------------------------------------- produce

    def produce(
        self,
        records: bytes | memoryview,
        space: DiskSpace,
        acks: int = Acks.WRITTEN,
        transactional: bool = False,
    ) -> Stored | PendingProduce:
        """Store `records` (one or more whole batches), in two phases: `Stored` when they are a
        producer's retry of batches already stored (nothing to write), else the prepared append.
        Either carries what its answer waits for (`waits_for(acks)`), which the caller's backend
        carries out.

        Raises what refuses the produce, with nothing changed: the log's validation errors (a
        compacted topic's records without a key among them: `KeylessRecordError`, Kafka's rule),
        `SequenceError` / `RetryInFlightError` (broker/core/producer_state.py; a gap in the first
        `SEQUENCE_GAP_GRACE_S` of this replica's lead is `PredecessorPendingError`), `LogClosedError`
        (a retry is confirmed only by a log that stands behind it, not one that failed an fsync),
        `OutOfSpaceError` from `space` (asked after the retry check: a retry of stored batches
        is answered even on a full disk), and storage errors of a segment roll. `transactional`:
        a transactional batch is taken (the log's validation switch; refused otherwise).
        """
        log_ = self.log
        if self.replica is not None:
            self.check_leader()
        waits = self.waits_for(acks)
        # A compacted topic's records need keys, as Kafka's LogValidator requires (KeylessRecordError)
        headers = log_.validate(records, log_.config.compacts, transactional)
        try:
            duplicate_of = self.producers.check(headers)
        except SequenceGapError as exc:
            if self.replica is not None and time.monotonic() - self._led_since < SEQUENCE_GAP_GRACE_S:
                raise PredecessorPendingError(
                    f"{exc}; this replica began to lead a moment ago: resend the batches before it"
                ) from exc
            raise
        if duplicate_of is not None:
            log_.check_usable()
            end = duplicate_of + sum(h.record_count for h in headers)
            return Stored(duplicate_of, end, log_.start_offset, log_.durable_offset >= end, waits)
        space.check_writable()
        pending = log_.prepare_append(records, headers, self.leader_epoch)
        self.producers.reserve(pending.headers)
        return PendingProduce(self, pending, waits)

    def waits_for(self, acks: int) -> Waits:
        """The acks rule, in one place (docs/CLUSTER.md, "What each acks guarantees"): 0 and 1
        are answered once written; durable (2) after a flush; all (-1) after a flush when this
        partition is kept in one copy, else once the high watermark passes the batches, which
        durable becomes too (a replicated partition's durability is its in-sync copies). Such a
        produce with fewer in-sync replicas than `min_insync` is refused before anything is
        written (`NotEnoughReplicasError`), as Kafka refuses it. Any other value is
        `InvalidAcksError` (`check_acks`, broker/core/acks.py)."""
        if acks in (Acks.NONE, Acks.WRITTEN):
            return Waits.WRITE
        check_acks(acks)  # durable or all from here on
        if self.replica is None:
            return Waits.FLUSH
        self.check_replicas()
        return Waits.HIGH_WATERMARK

    def write_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool
    ) -> PendingProduce:
        """The coordinator's door: end `producer_id`'s transaction here with a COMMIT (or ABORT)
        marker, appended as a produce is, in two phases, waiting as an acks=all produce does
        (Kafka's coordinator writes markers with acks=-1: `NotEnoughReplicasError` below
        min_insync). Raises, with nothing written, `NotLeaderError` off the leader, and what the
        producer state refuses (Kafka's ProducerAppendInfo.appendEndTxnMarker):
        `FencedEpochError` for an epoch older than the producer's, `CoordinatorFencedError` for a
        coordinator epoch older than its last marker's. A marker never touches sequences."""
        log_ = self.log
        if self.replica is not None:
            self.check_leader()
        waits = self.waits_for(Acks.ALL)
        self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        records = control_batch(producer_id, producer_epoch, commit, coordinator_epoch, now_ms())
        pending = log_.prepare_append(records, [read_header(records)], self.leader_epoch)
        marker = pending.headers[0].base_offset
        return PendingProduce(self, pending, waits, {marker: control_of(records, verify=False)})

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed readers stop (Kafka's `UnifiedLog.lastStableOffset`): the first
        offset of a transaction not known to have ended below the high watermark, else the high
        watermark; never below the log start."""
        hw = self.high_watermark
        first = self.producers.first_unstable_offset(hw)
        if first is None or first >= hw:
            return hw
        return max(first, self.log.start_offset)

    # ------------------------------------------------------------------------- reads

    def read(
        self,
        offset: int,
        max_bytes: int,
        isolation: Isolation = Isolation.HIGH_WATERMARK,
        leader_epoch: int = -1,
    ) -> PendingRead:
        """The batches from `offset`, whole, at least one, about `max_bytes`, no further than
        `isolation` allows. A consumer's read of a replicated partition is the leader's
        (`NotLeaderError` on a follower, or when `leader_epoch`, if not -1, is not this
        leader's). `OffsetOutOfRangeError` outside the log (its start and end, whatever the
        isolation: a read_committed read between the last stable offset and the high watermark
        is empty, as Kafka's); a read at the bound is an empty extent (the reader waits or
        answers `nothing()`)."""
        upto = None
        if isolation is not Isolation.LOG_END:
            if self.replica is not None:
                self.check_leader(leader_epoch)
                upto = self.high_watermark
            if isolation is Isolation.LAST_STABLE:
                upto = self.last_stable_offset
                return PendingRead(self, self.log.prepare_read(offset, max_bytes, upto), offset, True)
        return PendingRead(self, self.log.prepare_read(offset, max_bytes, upto), offset)

    def read_for_follower(
        self,
        node: int,
        fetch_offset: int,
        last_fetched_epoch: int,
        leader_epoch: int,
        max_bytes: int,
        now: int,
        woken: bool = False,
    ) -> PendingRead | Diverging:
        """A follower's fetch at `fetch_offset` (its log end), on the leader: a diverging epoch
        when its log went another way (it truncates first), else its position is counted (which
        may advance the high watermark: acks=all answers, consumers woken) and it reads to the
        log end through `read`. `NotLeaderError` unless this replica leads at `leader_epoch`;
        `OffsetOutOfRangeError` past the log end, or below its start (the follower starts over
        at `log_start_offset`).

        `woken`: the same fetch again, parked at the log end and woken by an append. Its position
        was counted when it came, and counting it again changes nothing (a follower the ISR
        dropped meanwhile joins again by fetching again); nor does its divergence, which can only
        change with the leader epoch that `check_leader` holds it to. So a woken fetch only reads:
        the leader's part of an acks=all record runs each follower's fetch twice."""
        if not isinstance(self.replica, LeaderState):
            raise NotLeaderError("this replica does not lead it")
        self.check_leader(leader_epoch)
        if not woken or leader_epoch < 0:
            diverging = self.diverging(last_fetched_epoch, fetch_offset)
            if diverging is not None:
                return Diverging(*diverging)
        end = self.log.end_offset
        if fetch_offset > end:
            raise OffsetOutOfRangeError(f"follower at {fetch_offset}, past this leader's end {end}")
        if not woken:
            self.replica_fetched(node, fetch_offset, now)
        return self.read(fetch_offset, max_bytes, Isolation.LOG_END)

    def list_offset(
        self, spec: int, leader_epoch: int = -1, isolation: Isolation = Isolation.HIGH_WATERMARK
    ) -> int:
        """ListOffsets, in both protocols: `LATEST` the high watermark (the last stable offset
        for `Isolation.LAST_STABLE`), `EARLIEST` the log start, a timestamp (>= 0) the first
        offset whose record is at or after it (-1 when none is). Asked of the leader when
        replicated (as `read`)."""
        return self.list_offset_and_time(spec, leader_epoch, isolation).offset

    def list_offset_and_time(
        self, spec: int, leader_epoch: int = -1, isolation: Isolation = Isolation.HIGH_WATERMARK
    ) -> TimestampAndOffset:
        """`list_offset` with the timestamp Kafka's ListOffsets answers beside it: for a timestamp
        the found record's own, else -1 (latest, earliest, or no record at or after the time), as
        Kafka's log answers (its clients' offsetsForTimes refuse a found offset without one). A
        read_committed one (`Isolation.LAST_STABLE`) finds no offset at or past the last stable
        offset, as Kafka's `Partition.fetchOffsetForTimestamp`."""
        if self.replica is not None:
            self.check_leader(leader_epoch)
        committed = isolation is Isolation.LAST_STABLE
        if spec == LATEST:
            return TimestampAndOffset(
                self.last_stable_offset if committed else self.high_watermark, NO_TIMESTAMP
            )
        if spec == EARLIEST:
            return TimestampAndOffset(self.log.start_offset, NO_TIMESTAMP)
        if spec >= 0:
            found = self.log.timestamp_and_offset(spec)
            if found is None or (committed and found.offset >= self.last_stable_offset):
                return TimestampAndOffset(-1, NO_TIMESTAMP)
            return found
        raise ValueError(f"offset spec {spec}: use -1 (latest), -2 (earliest) or a timestamp")

    @property
    def log_start_offset(self) -> int:
        return self.log.start_offset

    def apply_retention(self) -> int:
        """Delete the segments past the topic's retention (the log decides which); the producer
        state forgets the batches they held. Returns the segments deleted."""
        deleted = self.log.apply_retention()
        if deleted:
            self._start_moved(self.log.start_offset)
        return deleted

    def expire_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget the idempotent producers idle for `expiration_ms` at `now_ms` (the broker's
        `--producer-id-expiration-ms`: broker/core/producer_state.py `expire_idle`). Returns
        how many were forgotten."""
        return self.producers.expire_idle(now_ms, expiration_ms)

    def delete_records(self, offset: int) -> int:
        """Kafka's DeleteRecords on the leader: the log start moves up to `offset` (-1: the high
        watermark), which must not pass the high watermark (`OffsetOutOfRangeError`, as Kafka's
        `maybeIncrementLogStartOffset`); never back. Returns the new log start (Kafka's low
        watermark). The producer state and epoch history forget what went, as after retention;
        followers take the new start from the leader's fetch answers (`follow_log_start`). A log
        whose cleanup policy does not delete (compact only) refuses it, as Kafka's leader does
        (`RecordDeletionRefused`: POLICY_VIOLATION)."""
        self.check_leader()
        if not self.log.config.deletes:
            raise RecordDeletionRefused(
                f"records of partition {self.index} of topic id {self.topic_id} cannot be deleted: "
                f"its cleanup.policy is {self.log.config.cleanup_policy}"
            )
        hw = self.high_watermark
        if offset == LATEST:
            offset = hw
        if not 0 <= offset <= hw:
            raise OffsetOutOfRangeError(
                f"cannot delete records below {offset}: outside [0, {hw}], the high watermark"
            )
        return self._start_moved(self.log.delete_records(offset))

    def follow_log_start(self, leader_start: int) -> None:
        """A follower takes its leader's log start (a DeleteRecords, or retention there), as far
        as its own high watermark reaches (Kafka's follower does the same after each fetch)."""
        replica = self.replica
        if not isinstance(replica, FollowerState):
            return
        target = min(leader_start, replica.high_watermark)
        if target > self.log.start_offset:
            self._start_moved(self.log.delete_records(target))

    def _start_moved(self, start: int) -> int:
        self.producers.expire(start)
        self.epochs.expire_before(start)
        self.aborted.expire(start)
        return start

    # ------------------------------------------------------------------------- long polls

    def wake_waiters(self, log_end: bool = True) -> None:
        """Wake every parked long poll; with `log_end` False (only the high watermark moved)
        the consumers' alone: a follower's fetch reads to the log end, and woken by an HW move
        it found nothing and parked again (with RF 3, each follower's fetch woke the other's).
        A change of role or the partition's closing wakes both (their default). Called from
        inside what grew the partition (an append's completion, a moved high watermark): a
        waiter that fails is logged and the others still run; nothing escapes into that request
        (it was a stored produce answered UNKNOWN_SERVER_ERROR, then resent by its producer as a
        duplicate)."""
        if self._holding_wakes:
            held = self._wake_held
            self._wake_held = log_end if held is None else held or log_end
            return
        waiters, self.waiters = self.waiters, []
        if log_end and self.replica_waiters:
            waiters += self.replica_waiters
            self.replica_waiters = []
        for wake in waiters:
            run_isolated(wake, "a long poll's wake")

    def hold_wakes(self) -> None:
        """Until `release_wakes`, what would wake the long polls is remembered, not done: the
        backend completes the appends one write made (a producer's pipelined batches) between
        the two, and the woken fetches then answer with all of them. Woken at the first one's
        completion, a follower's fetch took that batch alone and fetched the rest in a round of
        its own (docs/CLUSTER.md has the figures). A lone append is not held: its wake is not
        delayed."""
        self._holding_wakes = True

    def release_wakes(self) -> None:
        """The wake `hold_wakes` held, if any was asked for (a log-end one if any of them was)."""
        self._holding_wakes = False
        held, self._wake_held = self._wake_held, None
        if held is not None:
            self.wake_waiters(held)


def _why_not(snap: producer_snapshot.Snapshot | str, opened: Log) -> str:
    if isinstance(snap, str):
        return snap
    if not opened.opened_clean:
        return "its log is not as the clean close left it"
    return f"it starts at {snap.log_start}, the log at {opened.start_offset}"
