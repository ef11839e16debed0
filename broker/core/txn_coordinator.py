"""The transaction coordinator: Kafka's transactions (KIP-98) as a state machine per transactional
id, with its I/O handed in.

Rules this module keeps:
- Kafka's TransactionCoordinator and TransactionMetadata (transaction version 1, KIP-360 epoch
  bumps) are the yardstick: the states and their allowed predecessors (`PREVIOUS`), the checks of
  each API in Kafka's order, and Kafka's error for each wrong call. Results are `TxnCode`s named
  as Kafka's error codes (as the group coordinator's `GroupCode`); the adapters encode them.
  PRODUCER_FENCED is answered as INVALID_PRODUCER_EPOCH to a caller that says it does not know
  the newer code (`knows_fenced=False`: Kafka's InitProducerId below v4, the other APIs below
  v2; the adapter knows the versions, this module does not).
- A state changes only after its record is durable. Each change is prepared (`pending` set: any
  other change of the id meanwhile is CONCURRENT_TRANSACTIONS), its record appended through
  `TxnIO.append`, and applied when the append reports it durable; a failed append changes
  nothing. Unlike Kafka, even the epoch bump of a fence waits for its record, so a fence whose
  write failed bumps from the same epoch again (what Kafka's hasFailedEpochFence arranges).
- Which ids live here: those of the state-log partitions this coordinator loaded (`load`). An id
  of another partition is NOT_COORDINATOR, one of a partition still loading
  COORDINATOR_LOAD_IN_PROGRESS. `unload` forgets a partition's ids; an answer still waiting for
  one of their appends gets NOT_COORDINATOR, whatever the append did (the next coordinator reads
  it back).
- Commit and abort: EndTxn prepares (PrepareCommit/PrepareAbort), answers the client once that is
  durable, asks `TxnIO.send_markers` to write the markers to exactly the transaction's partitions
  and groups, and when they are all written completes (CompleteCommit/CompleteAbort, partitions
  cleared). The sender retries until they are written; a completion whose append fails is tried
  again after `retry_backoff_s`. A loaded partition's prepared transactions send their markers
  again at once.
- Holding: an AddPartitionsToTxn, AddOffsetsToTxn or InitProducerId that passes its producer
  checks while the id is completing (a change pending, or PrepareCommit/PrepareAbort with its
  markers in flight) is held, not answered, and run again against the new state once the change
  or the completion is durable; after `hold_ms` (`HOLD_MS`) still waiting it is answered
  CONCURRENT_TRANSACTIONS. Kafka answers CONCURRENT_TRANSACTIONS at once, and clients back off
  (librdkafka and the Java client 20 ms for AddPartitionsToTxn, KAFKA-5477): a client's next
  transaction starts within a millisecond of EndTxn's answer, while the markers and the
  completion record still wait for their fsyncs here (one node: acks=all is a flush), so nearly
  every transaction would pay the back-off. Held requests are answered in arrival order; a
  partition unloaded runs them again at once (NOT_COORDINATOR then).
- Timeouts: `abort_timed_out` (every `abort_interval_ms`, armed by `start`) fences an Ongoing
  transaction past its timeout with an epoch bump (PrepareEpochFence) and aborts it with the
  bumped epoch, so the markers fence the old producer's late batches. `expire_ids` (every
  `expiry_interval_ms`) writes a tombstone for an id idle in Empty/CompleteCommit/CompleteAbort
  for `id_expiration_ms` and forgets it (Kafka's transactional.id.expiration.ms).
- A new id's producer id comes from `ProducerIds` (never given twice, on any core or node); an
  id whose epoch is exhausted (`EPOCH_LAST`) gets a new producer id at epoch 0 (Kafka's
  producer id rotation). Epochs of an id only grow while its producer id stays.
- Time: `clock_ms` (wall clock, milliseconds: start and update times are stored and outlive the
  node), timers through `call_later` (seconds), so tests run under a fake clock. Owned by one
  core's loop; no locks. Callbacks are called exactly once.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Protocol

from broker.core.groups import PartitionId
from broker.core.producer_ids import EPOCH_LAST, ProducerIds, ProducerIdsUnavailable
from broker.core.txn_log import (
    PREPARED,
    TXN_ID_MAX,
    TxnRecord,
    TxnState,
    encode_key,
    encode_value,
)

log = logging.getLogger(__name__)

NO_PRODUCER_ID: Final = -1
NO_EPOCH: Final = -1
TRANSACTION_MAX_TIMEOUT_MS: Final = 900_000  # Kafka's transaction.max.timeout.ms
ABORT_INTERVAL_MS: Final = 10_000  # Kafka's transaction.abort.timed.out.transaction.cleanup.interval.ms
ID_EXPIRATION_MS: Final = 7 * 24 * 3600 * 1000  # Kafka's transactional.id.expiration.ms
EXPIRY_INTERVAL_MS: Final = 3_600_000  # Kafka's transaction.remove.expired.transaction.cleanup.interval.ms
RETRY_BACKOFF_S: Final = 0.1  # a completion record whose append failed is tried again after this
# How long a request is held while its id completes (module rules): well under any client's
# request timeout (30 s and more), long enough for the markers' and the completion's fsyncs on a
# loaded disk; a longer completion answers CONCURRENT_TRANSACTIONS and the client asks again.
HOLD_MS: Final = 1_000
# Partitions plus groups one transaction may hold: every state record carries them all (a
# partition is ~12 bytes of JSON, so the largest record stays ~120 KiB, under a batch's limit)
# and the markers go to each. Kafka has no bound; no client comes near it.
TXN_PARTITIONS_MAX: Final = 10_000


class TxnCode(Enum):
    """What the coordinator answers; the values are Kafka's error names (kio's ErrorCode)."""

    NONE = "none"
    INVALID_REQUEST = "invalid_request"
    INVALID_TRANSACTION_TIMEOUT = "invalid_transaction_timeout"
    CONCURRENT_TRANSACTIONS = "concurrent_transactions"
    PRODUCER_FENCED = "producer_fenced"
    INVALID_PRODUCER_EPOCH = "invalid_producer_epoch"
    INVALID_PRODUCER_ID_MAPPING = "invalid_producer_id_mapping"
    INVALID_TXN_STATE = "invalid_txn_state"
    NOT_COORDINATOR = "not_coordinator"
    COORDINATOR_LOAD_IN_PROGRESS = "coordinator_load_in_progress"
    COORDINATOR_NOT_AVAILABLE = "coordinator_not_available"
    TRANSACTIONAL_ID_NOT_FOUND = "transactional_id_not_found"
    LIMIT_EXCEEDED = "limit_exceeded"  # ours: TXN_PARTITIONS_MAX
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = "transactional_id_authorization_failed"  # not served here


# Kafka's TransactionState.validPreviousStates (transaction version 1).
PREVIOUS: Final[Mapping[TxnState, frozenset[TxnState]]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset(
        {TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}
EXPIRABLE: Final = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})


class Cancellable(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], Any]
Done = Callable[[TxnCode], None]


@dataclass(slots=True, eq=False)
class _Held:
    """A request waiting for its id's completion (module rules)."""

    again: Callable[[_Held], None]  # the request run again against the state then
    give_up: Callable[[], None]  # answers CONCURRENT_TRANSACTIONS
    deadline_ms: int
    timer: Cancellable | None = None


@dataclass(frozen=True, slots=True)
class MarkerRequest:
    """The markers ending one transaction: to each data partition and each group."""

    txn_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: frozenset[PartitionId]
    groups: frozenset[str]


class TxnIO(Protocol):
    """What the coordinator asks of the core it runs on."""

    def append(self, partition: int, key: bytes, value: bytes | None, done: Done) -> None:
        """Append a record to state-log `partition`; `done(NONE)` once it is durable (acks=all),
        else `done(code)` (NOT_COORDINATOR: this node no longer leads it;
        COORDINATOR_NOT_AVAILABLE: anything else) with nothing written."""
        ...

    def send_markers(self, markers: MarkerRequest, done: Callable[[], None]) -> None:
        """Write the markers (retrying until each is written or its partition is gone), then
        `done()`."""
        ...


@dataclass(frozen=True, slots=True)
class InitResult:
    code: TxnCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class TxnView:
    """One id as DescribeTransactions shows it."""

    txn_id: str
    producer_id: int
    producer_epoch: int
    state: TxnState
    timeout_ms: int
    start_ms: int
    partitions: tuple[PartitionId, ...]
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TxnListing:
    """One id as ListTransactions shows it."""

    txn_id: str
    producer_id: int
    state: TxnState


@dataclass(slots=True, eq=False)
class TransactionMetadata:
    """One transactional id: its durable state (`record()`) and the change under way."""

    txn_id: str
    partition: int  # its state-log partition
    producer_id: int
    producer_epoch: int
    last_producer_id: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[PartitionId] = frozenset()
    groups: frozenset[str] = frozenset()
    start_ms: int = -1
    update_ms: int = -1
    pending: TxnState | None = None
    durable: bool = True  # False for a new id until its first record is
    held: list[_Held] = dataclasses.field(default_factory=list)  # requests waiting (module rules)

    def record(self) -> TxnRecord:
        return TxnRecord(
            self.producer_id,
            self.producer_epoch,
            self.last_producer_id,
            self.last_producer_epoch,
            self.timeout_ms,
            self.state,
            self.partitions,
            self.groups,
            self.start_ms,
            self.update_ms,
        )

    @classmethod
    def of(cls, txn_id: str, partition: int, r: TxnRecord) -> TransactionMetadata:
        return cls(
            txn_id,
            partition,
            r.producer_id,
            r.producer_epoch,
            r.last_producer_id,
            r.last_producer_epoch,
            r.timeout_ms,
            r.state,
            r.partitions,
            r.groups,
            r.start_ms,
            r.update_ms,
        )


@dataclass(slots=True, eq=False)
class _Owned:
    """A state-log partition this coordinator leads."""

    coordinator_epoch: int
    loading: bool = True
    txns: dict[str, TransactionMetadata] = dataclasses.field(default_factory=dict)


def completing(md: TransactionMetadata) -> bool:
    """Whether a request for `md` would have to wait: a change pending, or a transaction ending
    (Kafka answers CONCURRENT_TRANSACTIONS to these)."""
    return md.pending is not None or md.state in PREPARED


def epoch_exhausted(epoch: int) -> bool:
    """No epoch after this one may be given (Kafka's isEpochExhausted: the last one is kept for
    fencing)."""
    return epoch >= EPOCH_LAST


class TransactionCoordinator:
    """The transactional ids of the state-log partitions one core leads."""

    def __init__(
        self,
        io: TxnIO,
        producer_ids: ProducerIds,
        partition_for: Callable[[str], int],
        call_later: CallLater,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        *,
        max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS,
        abort_interval_ms: int = ABORT_INTERVAL_MS,
        id_expiration_ms: int = ID_EXPIRATION_MS,
        expiry_interval_ms: int = EXPIRY_INTERVAL_MS,
        retry_backoff_s: float = RETRY_BACKOFF_S,
        hold_ms: int = HOLD_MS,
    ) -> None:
        self.io = io
        self.producer_ids = producer_ids
        self.partition_for = partition_for
        self.call_later = call_later
        self.clock_ms = clock_ms
        self.max_timeout_ms = max_timeout_ms
        self.abort_interval_ms = abort_interval_ms
        self.id_expiration_ms = id_expiration_ms
        self.expiry_interval_ms = expiry_interval_ms
        self.retry_backoff_s = retry_backoff_s
        self.hold_ms = hold_ms
        self._owned: dict[int, _Owned] = {}
        self._timers: list[Cancellable] = []
        self._running = False

    # ------------------------------------------------------------------------- partitions

    def begin_load(self, partition: int, coordinator_epoch: int) -> None:
        """This coordinator leads `partition` now (at `coordinator_epoch`, its leader epoch);
        its ids answer COORDINATOR_LOAD_IN_PROGRESS until `complete_load`."""
        was = self._owned.get(partition)
        self._owned[partition] = _Owned(coordinator_epoch)
        if was is not None:
            self._release_all(was)

    def complete_load(self, partition: int, coordinator_epoch: int, txns: Mapping[str, TxnRecord]) -> None:
        """The partition's records are read (txn_log.TxnLogLoader.state()): its ids are served,
        and the transactions found prepared send their markers again."""
        owned = self._owned.get(partition)
        if owned is None or owned.coordinator_epoch != coordinator_epoch:
            return  # unloaded, or loaded again at a newer epoch, meanwhile
        owned.txns = {i: TransactionMetadata.of(i, partition, r) for i, r in txns.items()}
        owned.loading = False
        for md in list(owned.txns.values()):
            if md.state in PREPARED:
                self._send_markers(md)

    def load(self, partition: int, coordinator_epoch: int, txns: Mapping[str, TxnRecord]) -> None:
        self.begin_load(partition, coordinator_epoch)
        self.complete_load(partition, coordinator_epoch, txns)

    def owns(self, partition: int) -> bool:
        """Whether `partition` is loaded here, or loading."""
        return partition in self._owned

    def epoch_of(self, partition: int) -> int | None:
        """The coordinator epoch `partition` is loaded (or loading) at here; None: not here."""
        owned = self._owned.get(partition)
        return None if owned is None else owned.coordinator_epoch

    def owned(self) -> list[int]:
        """The state-log partitions loaded or loading here."""
        return sorted(self._owned)

    def loaded(self) -> list[int]:
        """The state-log partitions loaded here (served, not loading)."""
        return sorted(i for i, o in self._owned.items() if not o.loading)

    def unload(self, partition: int) -> None:
        """Another coordinator leads `partition` now: its ids are forgotten here."""
        was = self._owned.pop(partition, None)
        if was is not None:
            self._release_all(was)

    def state_of(self, partition: int) -> dict[str, TxnRecord]:
        """The durable state of a partition's ids: what loading its records gives."""
        owned = self._owned.get(partition)
        if owned is None:
            return {}
        return {i: md.record() for i, md in owned.txns.items() if md.durable}

    def metadata(self, txn_id: str) -> TransactionMetadata | None:
        owned = self._owned.get(self.partition_for(txn_id))
        return None if owned is None else owned.txns.get(txn_id)

    def _lookup(self, txn_id: str) -> tuple[_Owned, TransactionMetadata | None] | TxnCode:
        owned = self._owned.get(self.partition_for(txn_id))
        if owned is None:
            return TxnCode.NOT_COORDINATOR
        if owned.loading:
            return TxnCode.COORDINATOR_LOAD_IN_PROGRESS
        return owned, owned.txns.get(txn_id)

    def _producers_txn(self, txn_id: str, producer_id: int, epoch: int) -> TransactionMetadata | TxnCode:
        """The id's metadata if this coordinator serves it and the producer is its current one:
        the checks AddPartitionsToTxn, AddOffsetsToTxn and EndTxn share, in Kafka's order."""
        if not txn_id:
            return TxnCode.INVALID_REQUEST
        found = self._lookup(txn_id)
        if isinstance(found, TxnCode):
            return found
        _, md = found
        if md is None or md.producer_id != producer_id:
            return TxnCode.INVALID_PRODUCER_ID_MAPPING
        if md.producer_epoch != epoch:
            return TxnCode.PRODUCER_FENCED
        return md

    def _current(self, md: TransactionMetadata) -> _Owned | None:
        """The partition holding `md`, if `md` is still the one it holds."""
        owned = self._owned.get(md.partition)
        if owned is None or owned.loading or owned.txns.get(md.txn_id) is not md:
            return None
        return owned

    # ------------------------------------------------------------------------- transitions

    def _transit(
        self, md: TransactionMetadata, target: TxnRecord, done: Done, via: TxnState | None = None
    ) -> None:
        """Prepare `md`'s change to `target`, append its record and apply it once durable
        (module rules). `via`: the pending state shown meanwhile, when it is not the target's
        (PrepareEpochFence on the way to PrepareAbort)."""
        assert md.pending is None, f"{md.txn_id}: a change while {md.pending} is pending"
        shown = via or target.state
        assert md.state in PREVIOUS[shown], f"{md.txn_id}: {md.state} -> {shown}"
        assert via is None or via in PREVIOUS[target.state], f"{md.txn_id}: {via} -> {target.state}"
        md.pending = shown
        owned = self._owned[md.partition]
        epoch = owned.coordinator_epoch

        def durable(code: TxnCode) -> None:
            now = self._owned.get(md.partition)
            if now is None or now.coordinator_epoch != epoch or now.txns.get(md.txn_id) is not md:
                done(TxnCode.NOT_COORDINATOR)
                return
            was, md.pending = md.pending, None
            if code != TxnCode.NONE:
                if not md.durable:  # a new id whose first record failed: as if never asked
                    del now.txns[md.txn_id]
                done(code)
            else:
                self._apply(md, target, was)
                done(TxnCode.NONE)
            self._release(md)

        self.io.append(md.partition, encode_key(md.txn_id), encode_value(target), durable)

    def _hold(
        self,
        md: TransactionMetadata,
        again: Callable[[_Held], None],
        give_up: Callable[[], None],
        held: _Held | None,
    ) -> None:
        """Hold a request until `md` is no longer completing (module rules); `held`: the same
        request held before, whose deadline stays."""
        deadline_ms = held.deadline_ms if held is not None else self.clock_ms() + self.hold_ms
        left_ms = deadline_ms - self.clock_ms()
        if left_ms <= 0:
            give_up()
            return
        entry = _Held(again, give_up, deadline_ms)

        def expired() -> None:
            if entry in md.held:
                md.held.remove(entry)
                give_up()

        entry.timer = self.call_later(left_ms / 1000, expired)
        md.held.append(entry)

    def _release(self, md: TransactionMetadata) -> None:
        """Run again, in arrival order, the requests held on `md` once it is no longer
        completing or no longer served here; one that must wait again is held again."""
        while md.held and (self._current(md) is None or not completing(md)):
            entry = md.held.pop(0)
            if entry.timer is not None:
                entry.timer.cancel()
            entry.again(entry)

    def _release_all(self, owned: _Owned) -> None:
        """`owned` is no longer served (unloaded, or loading again): its held requests are run
        again now, and are answered as the coordinator is now."""
        for md in list(owned.txns.values()):
            self._release(md)

    @staticmethod
    def _apply(md: TransactionMetadata, r: TxnRecord, pending: TxnState | None) -> None:
        """Kafka's completeTransitionTo: the checks a change's record must pass, then the change."""
        same_producer = (r.producer_id, r.producer_epoch) == (md.producer_id, md.producer_epoch)
        if r.state == TxnState.EMPTY:
            bumped = r.producer_epoch == md.producer_epoch + 1 or (
                r.producer_epoch == 0 and r.producer_id != md.producer_id
            )
            retried = same_producer and r.last_producer_epoch == md.last_producer_epoch
            assert bumped or retried, (md, r)
            assert not r.partitions and not r.groups and r.start_ms == -1, r
        elif r.state == TxnState.ONGOING:
            assert same_producer and r.timeout_ms == md.timeout_ms, (md, r)
            assert md.partitions <= r.partitions and md.groups <= r.groups, (md, r)
        elif r.state == TxnState.PREPARE_ABORT and pending == TxnState.PREPARE_EPOCH_FENCE:
            assert r.producer_id == md.producer_id and r.producer_epoch == md.producer_epoch + 1, (md, r)
        elif r.state in PREPARED:
            assert same_producer and (r.partitions, r.groups) == (md.partitions, md.groups), (md, r)
        else:  # CompleteCommit, CompleteAbort
            assert same_producer and not r.partitions and not r.groups, (md, r)
        md.producer_id, md.producer_epoch = r.producer_id, r.producer_epoch
        md.last_producer_id, md.last_producer_epoch = r.last_producer_id, r.last_producer_epoch
        md.timeout_ms, md.state = r.timeout_ms, r.state
        md.partitions, md.groups = r.partitions, r.groups
        md.start_ms, md.update_ms = r.start_ms, r.update_ms
        md.durable = True

    # ------------------------------------------------------------------------- InitProducerId

    def init_producer_id(
        self,
        txn_id: str,
        timeout_ms: int,
        done: Callable[[InitResult], None],
        *,
        expected: tuple[int, int] | None = None,
        knows_fenced: bool = True,
    ) -> None:
        """A transactional producer starting, or recovering (KIP-360: `expected` = the producer
        id and epoch it has): `done` gets its producer id and epoch once they are durable.
        An id with a transaction under way has it aborted first, with an epoch bump that fences
        the old producer (Kafka); Kafka then answers CONCURRENT_TRANSACTIONS and the caller asks
        again, here the request is held until the abort completes (module rules) and answered
        as that second ask would be."""
        self._init(txn_id, timeout_ms, done, expected, knows_fenced, None)

    def _init(
        self,
        txn_id: str,
        timeout_ms: int,
        done: Callable[[InitResult], None],
        expected: tuple[int, int] | None,
        knows_fenced: bool,
        held: _Held | None,
    ) -> None:
        def fail(code: TxnCode) -> None:
            done(InitResult(_fenced(code, knows_fenced)))

        def hold(md: TransactionMetadata) -> None:
            self._hold(
                md,
                lambda entry: self._init(txn_id, timeout_ms, done, expected, knows_fenced, entry),
                lambda: fail(TxnCode.CONCURRENT_TRANSACTIONS),
                held,
            )

        if not txn_id or len(txn_id) > TXN_ID_MAX:
            fail(TxnCode.INVALID_REQUEST)
            return
        if not 0 < timeout_ms <= self.max_timeout_ms:
            fail(TxnCode.INVALID_TRANSACTION_TIMEOUT)
            return
        found = self._lookup(txn_id)
        if isinstance(found, TxnCode):
            fail(found)
            return
        owned, md = found
        now = self.clock_ms()
        if md is None:
            try:
                pid = self.producer_ids.new()
            except ProducerIdsUnavailable:
                fail(TxnCode.COORDINATOR_LOAD_IN_PROGRESS)  # as Kafka when no id block is ready
                return
            md = TransactionMetadata(
                txn_id, self.partition_for(txn_id), pid, NO_EPOCH, NO_PRODUCER_ID, NO_EPOCH, timeout_ms,
                TxnState.EMPTY, update_ms=now, durable=False,
            )  # fmt: skip
            owned.txns[txn_id] = md
        if md.pending is not None:
            hold(md)
            return
        if expected is not None and not self._may_recover(md, *expected):
            fail(TxnCode.PRODUCER_FENCED)
            return
        if md.state in PREPARED:
            hold(md)
            return
        if md.state == TxnState.ONGOING:
            fenced_md = md
            self._fence(md, lambda code: hold(fenced_md) if code == TxnCode.NONE else fail(code))
            return
        assert md.state in EXPIRABLE, md
        target = self._init_target(md, timeout_ms, expected, now)
        if isinstance(target, TxnCode):
            fail(target)
            return

        def written(code: TxnCode) -> None:
            if code != TxnCode.NONE:
                fail(code)
                return
            log.info(
                "transactional id %s: producer id %d epoch %d",
                txn_id,
                target.producer_id,
                target.producer_epoch,
            )
            done(InitResult(TxnCode.NONE, target.producer_id, target.producer_epoch))

        self._transit(md, target, written)

    @staticmethod
    def _may_recover(md: TransactionMetadata, pid: int, epoch: int) -> bool:
        """Kafka's isValidProducerId: an id just created, the current producer id (its epoch is
        judged next), or the last one when its epoch was exhausted (a retried rotation)."""
        return (
            md.producer_epoch == NO_EPOCH
            or pid == md.producer_id
            or (pid == md.last_producer_id and epoch_exhausted(epoch))
        )

    def _init_target(
        self, md: TransactionMetadata, timeout_ms: int, expected: tuple[int, int] | None, now: int
    ) -> TxnRecord | TxnCode:
        """The record an InitProducerId writes for an id with no transaction under way (Kafka's
        prepareProducerIdRotation / prepareIncrementProducerEpoch)."""
        if epoch_exhausted(md.producer_epoch) and (expected is None or expected[1] == md.producer_epoch):
            try:
                pid = self.producer_ids.new()
            except ProducerIdsUnavailable:
                return TxnCode.COORDINATOR_LOAD_IN_PROGRESS
            last_epoch = md.producer_epoch if expected is not None else NO_EPOCH
            return TxnRecord(pid, 0, md.producer_id, last_epoch, timeout_ms, TxnState.EMPTY, update_ms=now)
        if expected is None:
            epoch, last_epoch = md.producer_epoch + 1, NO_EPOCH
        elif md.producer_epoch == NO_EPOCH or expected[1] == md.producer_epoch:
            epoch, last_epoch = md.producer_epoch + 1, md.producer_epoch
        elif expected[1] == md.last_producer_epoch:  # a retry of a bump it never heard of
            epoch, last_epoch = md.producer_epoch, md.last_producer_epoch
        else:
            return TxnCode.PRODUCER_FENCED
        return TxnRecord(
            md.producer_id, epoch, md.producer_id, last_epoch, timeout_ms, TxnState.EMPTY, update_ms=now
        )

    # ------------------------------------------------------------------------- AddPartitions/AddOffsets

    def add_partitions(
        self,
        txn_id: str,
        producer_id: int,
        epoch: int,
        partitions: Collection[PartitionId],
        done: Done,
        *,
        knows_fenced: bool = True,
    ) -> None:
        """Data partitions join the id's transaction (starting one if none is under way); while
        the id's last transaction completes, once it has (module rules: held)."""
        self._add(txn_id, producer_id, epoch, frozenset(partitions), frozenset(), done, knows_fenced)

    def add_offsets(
        self, txn_id: str, producer_id: int, epoch: int, group: str, done: Done, *, knows_fenced: bool = True
    ) -> None:
        """A group's offsets join the id's transaction (Kafka's AddOffsetsToTxn: its marker goes
        to the group's coordinator)."""
        if not group:
            done(TxnCode.INVALID_REQUEST)
            return
        self._add(txn_id, producer_id, epoch, frozenset(), frozenset({group}), done, knows_fenced)

    def _add(
        self,
        txn_id: str,
        producer_id: int,
        epoch: int,
        partitions: frozenset[PartitionId],
        groups: frozenset[str],
        done: Done,
        knows_fenced: bool,
        held: _Held | None = None,
    ) -> None:
        def answer(code: TxnCode) -> None:
            done(_fenced(code, knows_fenced))

        md = self._producers_txn(txn_id, producer_id, epoch)
        if isinstance(md, TxnCode):
            answer(md)
            return
        if completing(md):  # Kafka: CONCURRENT_TRANSACTIONS at once (module rules)
            self._hold(
                md,
                lambda entry: self._add(
                    txn_id, producer_id, epoch, partitions, groups, done, knows_fenced, entry
                ),
                lambda: answer(TxnCode.CONCURRENT_TRANSACTIONS),
                held,
            )
            return
        if md.state == TxnState.ONGOING and partitions <= md.partitions and groups <= md.groups:
            answer(TxnCode.NONE)  # already in it: nothing to write (Kafka)
            return
        keep = md.state == TxnState.ONGOING
        new_parts = (md.partitions if keep else frozenset()) | partitions
        new_groups = (md.groups if keep else frozenset()) | groups
        if len(new_parts) + len(new_groups) > TXN_PARTITIONS_MAX:
            answer(TxnCode.LIMIT_EXCEEDED)
            return
        now = self.clock_ms()
        target = dataclasses.replace(
            md.record(),
            state=TxnState.ONGOING,
            partitions=new_parts,
            groups=new_groups,
            start_ms=md.start_ms if keep else now,
            update_ms=now,
        )
        self._transit(md, target, answer)

    # ------------------------------------------------------------------------- EndTxn

    def end_txn(
        self,
        txn_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        done: Done,
        *,
        knows_fenced: bool = True,
    ) -> None:
        """Commit or abort the id's transaction: answered once the decision is durable; the
        markers follow (module rules). A retry of an ended transaction's EndTxn gets the same
        answer; the other ending is INVALID_TXN_STATE (Kafka)."""

        def answer(code: TxnCode) -> None:
            done(_fenced(code, knows_fenced))

        md = self._producers_txn(txn_id, producer_id, epoch)
        if isinstance(md, TxnCode):
            answer(md)
            return
        if md.pending is not None:
            answer(TxnCode.CONCURRENT_TRANSACTIONS)
            return
        match md.state:
            case TxnState.ONGOING:
                self._prepare_end(md, commit, None, answer)
            case TxnState.COMPLETE_COMMIT | TxnState.COMPLETE_ABORT:
                ended_as_asked = (md.state == TxnState.COMPLETE_COMMIT) == commit
                answer(TxnCode.NONE if ended_as_asked else TxnCode.INVALID_TXN_STATE)
            case TxnState.PREPARE_COMMIT | TxnState.PREPARE_ABORT:
                ending_as_asked = (md.state == TxnState.PREPARE_COMMIT) == commit
                answer(TxnCode.CONCURRENT_TRANSACTIONS if ending_as_asked else TxnCode.INVALID_TXN_STATE)
            case _:  # Empty
                answer(TxnCode.INVALID_TXN_STATE)

    def _prepare_end(self, md: TransactionMetadata, commit: bool, via: TxnState | None, done: Done) -> None:
        """PrepareCommit/PrepareAbort durable, then the answer, then the markers."""
        target = dataclasses.replace(
            md.record(),
            state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
            update_ms=self.clock_ms(),
        )
        if via == TxnState.PREPARE_EPOCH_FENCE:
            target = dataclasses.replace(
                target, producer_epoch=md.producer_epoch + 1, last_producer_epoch=NO_EPOCH
            )

        def prepared(code: TxnCode) -> None:
            done(code)
            if code == TxnCode.NONE:
                self._send_markers(md)

        self._transit(md, target, prepared, via)

    def _fence(self, md: TransactionMetadata, done: Done) -> None:
        """Abort `md`'s Ongoing transaction at a bumped epoch (Kafka's prepareFenceProducerEpoch
        then endTransaction(ABORT)): the old producer is fenced everywhere the markers go."""
        assert md.producer_epoch < (1 << 15) - 1, md  # the last epoch is never given, so never fenced
        self._prepare_end(md, False, TxnState.PREPARE_EPOCH_FENCE, done)

    def _send_markers(self, md: TransactionMetadata) -> None:
        owned = self._current(md)
        assert owned is not None and md.state in PREPARED and md.pending is None, md
        commit = md.state == TxnState.PREPARE_COMMIT
        request = MarkerRequest(
            md.txn_id,
            md.producer_id,
            md.producer_epoch,
            owned.coordinator_epoch,
            commit,
            md.partitions,
            md.groups,
        )
        self.io.send_markers(request, lambda: self._complete(md, request))

    def _complete(self, md: TransactionMetadata, request: MarkerRequest) -> None:
        """Every marker of `request` is written: CompleteCommit/CompleteAbort (Kafka's
        TransactionMarkerChannelManager.tryAppendToLog, retried while this coordinator leads)."""
        owned = self._current(md)
        if owned is None or owned.coordinator_epoch != request.coordinator_epoch:
            return  # the next coordinator sends them again
        assert md.pending is None and md.state in PREPARED, md
        assert (md.producer_id, md.producer_epoch) == (request.producer_id, request.producer_epoch), md
        target = dataclasses.replace(
            md.record(),
            state=TxnState.COMPLETE_COMMIT if request.commit else TxnState.COMPLETE_ABORT,
            partitions=frozenset(),
            groups=frozenset(),
            update_ms=self.clock_ms(),
        )

        def completed(code: TxnCode) -> None:
            if code == TxnCode.NONE:
                log.info("transactional id %s: %s", md.txn_id, target.state.value)
            elif code != TxnCode.NOT_COORDINATOR:
                self.call_later(self.retry_backoff_s, lambda: self._complete(md, request))

        self._transit(md, target, completed)

    # ------------------------------------------------------------------------- timers

    def start(self) -> None:
        """Arm the timeout and expiry scans."""
        self._running = True
        self._every(self.abort_interval_ms, self.abort_timed_out)
        self._every(self.expiry_interval_ms, self.expire_ids)

    def _every(self, interval_ms: int, scan: Callable[[], None]) -> None:
        def tick() -> None:
            if self._running:
                scan()
                self._timers.append(self.call_later(interval_ms / 1000, tick))

        self._timers.append(self.call_later(interval_ms / 1000, tick))

    def close(self) -> None:
        """Stop the scans and forget every partition (answers still waiting get
        NOT_COORDINATOR as their appends finish)."""
        self._running = False
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        owned, self._owned = list(self._owned.values()), {}
        for was in owned:
            self._release_all(was)

    def abort_timed_out(self) -> None:
        """Abort, with an epoch bump, every Ongoing transaction past its timeout."""
        now = self.clock_ms()
        for md in self._served():
            if md.state == TxnState.ONGOING and md.pending is None and md.start_ms + md.timeout_ms < now:
                log.info("transactional id %s: transaction timed out after %d ms", md.txn_id, md.timeout_ms)
                self._fence(md, functools.partial(_log_failed, md.txn_id, "abort"))

    def expire_ids(self) -> None:
        """Forget ids idle longer than `id_expiration_ms` (a tombstone, then gone)."""
        now = self.clock_ms()
        for md in self._served():
            if (
                md.state in EXPIRABLE
                and md.pending is None
                and md.durable
                and md.update_ms + self.id_expiration_ms <= now
            ):
                self._expire(md)

    def _expire(self, md: TransactionMetadata) -> None:
        assert md.state in PREVIOUS[TxnState.DEAD], md
        md.pending = TxnState.DEAD
        owned = self._owned[md.partition]

        def durable(code: TxnCode) -> None:
            if self._current(md) is not owned:
                return
            md.pending = None
            if code == TxnCode.NONE:
                del owned.txns[md.txn_id]
                log.info("transactional id %s expired", md.txn_id)
            else:
                _log_failed(md.txn_id, "expiry", code)
            self._release(md)

        self.io.append(md.partition, encode_key(md.txn_id), None, durable)

    def _served(self) -> list[TransactionMetadata]:
        return [md for o in self._owned.values() if not o.loading for md in o.txns.values()]

    # ------------------------------------------------------------------------- Describe/List

    def holding(self, producer_ids: Collection[int]) -> dict[int, frozenset[PartitionId] | None] | None:
        """For each of `producer_ids` an id of this coordinator has a transaction of open
        (Ongoing or prepared): its partitions; None for one with a change under way (it may
        add any). None while a partition loads (it cannot tell). One pass over the ids: the
        hanging-transaction sweep asks (broker/core/txn_sweep.py), as Kafka's find-hanging asks
        ListTransactions by producer id and DescribeTransactions."""
        if any(o.loading for o in self._owned.values()):
            return None
        wanted = set(producer_ids)
        partitions: dict[int, set[PartitionId]] = {}
        changing: set[int] = set()
        for md in self._served():
            for pid in {md.producer_id, md.last_producer_id} & wanted:
                if md.pending is not None:
                    changing.add(pid)
                elif md.state == TxnState.ONGOING or md.state in PREPARED:
                    partitions.setdefault(pid, set()).update(md.partitions)
        out: dict[int, frozenset[PartitionId] | None] = {p: frozenset(s) for p, s in partitions.items()}
        out.update(dict.fromkeys(changing))
        return out

    def describe(self, txn_id: str) -> TxnView | TxnCode:
        if not txn_id:
            return TxnCode.INVALID_REQUEST
        found = self._lookup(txn_id)
        if isinstance(found, TxnCode):
            return found
        _, md = found
        if md is None or not md.durable:
            return TxnCode.TRANSACTIONAL_ID_NOT_FOUND
        return TxnView(
            md.txn_id,
            md.producer_id,
            md.producer_epoch,
            md.state,
            md.timeout_ms,
            md.start_ms,
            tuple(sorted(md.partitions)),
            tuple(sorted(md.groups)),
        )

    def list_transactions(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        min_duration_ms: int = -1,
    ) -> tuple[list[TxnListing], list[str]] | TxnCode:
        """The ids this coordinator serves, filtered as ListTransactions filters (state names,
        producer ids, v1's running at least `min_duration_ms`), and the state names it does not
        know. COORDINATOR_LOAD_IN_PROGRESS while any partition loads (Kafka)."""
        if any(o.loading for o in self._owned.values()):
            return TxnCode.COORDINATOR_LOAD_IN_PROGRESS
        names = set(states)
        known = {s.value for s in TxnState}
        wanted = {TxnState(n) for n in names & known}
        pids = set(producer_ids)
        now = self.clock_ms()
        out = [
            TxnListing(md.txn_id, md.producer_id, md.state)
            for md in self._served()
            if md.durable
            and (not names or md.state in wanted)
            and (not pids or md.producer_id in pids)
            and (min_duration_ms < 0 or (md.start_ms >= 0 and now - md.start_ms >= min_duration_ms))
        ]
        out.sort(key=lambda x: x.txn_id)
        return out, sorted(names - known)


def _fenced(code: TxnCode, knows_fenced: bool) -> TxnCode:
    return TxnCode.INVALID_PRODUCER_EPOCH if code == TxnCode.PRODUCER_FENCED and not knows_fenced else code


def _log_failed(txn_id: str, what: str, code: TxnCode) -> None:
    if code != TxnCode.NONE:
        log.info(
            "transactional id %s: %s not written now (%s); the next scan tries again",
            txn_id,
            what,
            code.value,
        )
