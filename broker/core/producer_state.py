"""The idempotent producers of one partition: their sequence and epoch state, as a pure machine.

Rules this module keeps:
- No I/O, no log, no clock: it is fed batch headers (producer id, epoch, base sequence, record
  count and, once stored, base offset) and answers. `check` answers a request's batches without
  changing anything: new (None: append them), a retry of stored batches (the base offset they were
  given), or an error: `SequenceError` (`SequenceGapError`: a gap; or a mix of retried and new
  batches), `FencedEpochError` (an epoch older than the producer's), `UnknownProducerError` (a
  producer this partition holds nothing of, new or expired, not starting at sequence 0: a gap
  too, but one a client may resolve by starting over), `RetryInFlightError` (a retry of a batch
  still being written, whose outcome is not known yet).
- Three calls change it, each batch going through them in this order: `reserve` (its append was
  prepared), then `stored` (the append completed) or `released` (it failed or was undone). A
  batch reserved counts for what the producer's next batch must be (a backend writing
  asynchronously checks a producer's next pipelined batch while the one before is in flight),
  but only a batch stored is answered as a retry.
- Per producer it remembers the last `PRODUCER_BATCHES_KEPT` batches of its current epoch: what a
  client may retry (it keeps at most that many in flight). A higher epoch starts over at
  sequence 0, as does a producer not seen before (as in Kafka: otherwise a retried first batch
  could land after its successor).
- `rebuild` makes it from the headers of the batches a log holds, in log order, so the state
  survives a restart, and lives only as long as the batches carrying it (docs/PROTOCOL.md §4.7);
  after a clean shutdown `restore` takes it from the snapshot the close wrote (`snapshot`,
  broker/storage/producer_snapshot.py), each producer's last write time exact there.
- A producer idle for the broker's producer id expiration is forgotten (`expire_idle`), as Kafka's
  `producer.id.expiration.ms` (KIP-854) has its ProducerStateManager forget it: without that,
  every short-lived producer (each process of a Kafka client gets a new id) stays for as long as
  its batches do. Idle is measured from its last write, in the broker's clock (the append's time,
  as retention measures a segment's age; after a restart, the append time of the segment
  holding its last batch, never earlier than the batch's own), where Kafka reads its last batch's
  timestamp, the client's clock with CreateTime: a producer writing old timestamps (a replay)
  is not forgotten while it writes. A producer with a batch in flight or a transaction open is
  never forgotten, and a marker counts as a write (as Kafka keeps them). One forgotten is
  unknown, as one never seen: its next batch starts at sequence 0 or is refused as
  `UnknownProducerError` (Kafka's UNKNOWN_PRODUCER_ID, on which its clients start over).
- Batches without a producer id (`NO_PRODUCER_ID`) pass through untouched.

Transactions (KIP-98), as Kafka's ProducerStateManager and ProducerAppendInfo keep them:
- A producer's first transactional batch (stored) opens its transaction at that batch's base
  offset; its later batches belong to it until its marker (a control batch, COMMIT or ABORT) is
  stored. While one is open, a batch of the same producer without the transactional bit is
  refused (`InvalidTxnStateError`, Kafka's INVALID_TXN_STATE).
- A marker is checked by `check_marker` before it is written: an epoch older than the
  producer's is `FencedEpochError` (Kafka's INVALID_PRODUCER_EPOCH), a coordinator epoch older
  than the last marker's is `CoordinatorFencedError` (TRANSACTION_COORDINATOR_FENCED). A marker
  never touches sequences; one at a higher epoch fences the producer's older epoch (its next
  batch starts at sequence 0), as a batch at a higher epoch does.
- A completed transaction stays unstable until its marker is below the high watermark (Kafka's
  unreplicated transactions): `first_unstable_offset(high_watermark)` is the smallest first
  offset of the open transactions and of those completed ones, the partition's last stable
  offset being that bounded by the high watermark and the log start.
- Markers come in through `stored(headers, controls)`: `controls` maps a control batch's base
  offset to what its record says (the header does not carry it); what completes is returned
  (`CompletedTxn`), so the partition keeps the aborted ones for read_committed readers.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.storage.producer_snapshot import SnapshotProducer
from ringlog_proto.batch import NO_PRODUCER_ID, BatchHeader
from ringlog_proto.batch_control import ControlRecord
from ringlog_proto.batch_header import CONTROL_BIT, TRANSACTIONAL_BIT

PRODUCER_BATCHES_KEPT = 5  # recent batches remembered per producer: what a client may retry
# How long a producer's state outlives its last write: Kafka's producer.id.expiration.ms default
# (one day, KIP-854), far above any client's delivery timeout, so no retry finds it forgotten.
PRODUCER_ID_EXPIRATION_MS_DEFAULT = 86_400_000


class SequenceError(Exception):
    """An idempotent producer skipped sequence numbers, or mixed retried and new batches."""


class FencedEpochError(SequenceError):
    """An idempotent producer used an epoch older than one this partition has seen from it."""


class SequenceGapError(SequenceError):
    """A producer's batch does not follow the last one this partition holds of it: records
    between them are missing here. On a leader whose term has just begun they may be on their
    way still (`Partition.produce` answers `PredecessorPendingError` then); otherwise Kafka's
    OUT_OF_ORDER_SEQUENCE."""


class UnknownProducerError(SequenceGapError):
    """A producer this partition remembers nothing of (never seen, or its batches were deleted by
    retention) sent a first sequence other than 0. A `SequenceError` (our protocol answers it as
    any gap); Kafka answers UNKNOWN_PRODUCER_ID, on which its clients start the partition over."""


class InvalidTxnStateError(SequenceError):
    """A producer with a transaction open here sent a batch outside it (Kafka's
    INVALID_TXN_STATE: "expected a transactional write")."""


class CoordinatorFencedError(Exception):
    """A transaction marker from a coordinator older than the one that wrote this producer's
    last marker (Kafka's TRANSACTION_COORDINATOR_FENCED): a zombie coordinator."""


class CompletedTxn(NamedTuple):
    """A transaction a stored marker ended: its producer, its first offset here (the marker's own
    when no batch of it is here), the marker's offset, whether it committed, and the last stable
    offset right after it (the first offset of another producer's open transaction, else one past
    the marker: Kafka's AbortedTxn.lastStableOffset, which bounds the search of aborted ones)."""

    producer_id: int
    first_offset: int
    last_offset: int
    commit: bool
    last_stable_offset: int


_TXN_BITS = CONTROL_BIT | TRANSACTIONAL_BIT
_NO_COMPLETED: list[CompletedTxn] = []  # what `stored` returns without a marker (never changed)


class RetryInFlightError(Exception):
    """A retried batch whose original is still being written: its outcome is not known yet, so
    the retry can be neither stored again nor answered with the original's offsets. Retriable."""


class PredecessorPendingError(RetryInFlightError):
    """A `SequenceGapError` at a leader whose term has just begun: the batches missing before
    this one were most likely refused a moment ago by this same replica, while it still
    followed (NOT_OWNER), and will be resent first. Retriable, where Kafka answers
    OUT_OF_ORDER_SEQUENCE: on that answer librdkafka bumps its epoch and resends every
    unacknowledged record, those this replica already holds included (duplicates)."""


@dataclass(slots=True)
class _Producer:
    """What is remembered of one producer's stored batches (its latest epoch only)."""

    epoch: int
    # (first sequence, last sequence, base offset) of the most recent batches, oldest first
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=PRODUCER_BATCHES_KEPT))
    last_timestamp: int = -1  # the max timestamp of its last batch stored (Kafka's DescribeProducers)
    txn_first_offset: int = -1  # the first offset of its open transaction, -1 if none is open
    coordinator_epoch: int = -1  # the coordinator epoch of its last marker
    marker_offset: int = -1  # the offset of its last marker (keeps a producer with no batch left)
    last_write_ms: int = -1  # when its last batch stored was written, in the broker's clock (module rules)

    @property
    def last_sequence(self) -> int:
        return self.batches[-1][1] if self.batches else -1


class ProducerState:
    """The sequence and epoch state of every idempotent producer of one partition."""

    __slots__ = ("_completed", "_in_flight", "_ongoing", "_producers")

    def __init__(self) -> None:
        self._producers: dict[int, _Producer] = {}
        # producer id -> first offset of its open transaction (the `txn_first_offset`s, for `min`)
        self._ongoing: dict[int, int] = {}
        # (first offset, marker offset) of completed transactions whose marker may still be at or
        # above the high watermark, in marker order
        self._completed: deque[tuple[int, int]] = deque()
        # Batches reserved but not yet stored or released, per producer, in reserve order:
        # (epoch, first sequence, last sequence).
        self._in_flight: dict[int, list[tuple[int, int, int]]] = {}

    @classmethod
    def rebuild(
        cls,
        stored: Iterable[BatchHeader],
        controls: dict[int, ControlRecord] | None = None,
        written_by_ms: Callable[[int], int | None] | None = None,
    ) -> ProducerState:
        """The state after `stored`, the headers (base offsets assigned) of a log's batches in
        order, with what their control records say (`stored`'s `controls`). `written_by_ms(offset)`:
        a time by which the batch at `offset` was written, in the broker's clock (None: not
        known), each producer's last write (module rules); without it, or where it is not known,
        the batch's own max timestamp."""
        state = cls()
        for h in stored:
            state._remember(h, controls, None if written_by_ms is None else written_by_ms(h.base_offset))
        return state

    @classmethod
    def restore(
        cls, producers: Iterable[SnapshotProducer], completed: Iterable[tuple[int, int]]
    ) -> ProducerState:
        """The state `snapshot` and `completed` gave (at a clean close:
        broker/storage/producer_snapshot.py)."""
        state = cls()
        for p in producers:
            kept = _Producer(
                p.epoch,
                deque(p.batches, maxlen=PRODUCER_BATCHES_KEPT),
                p.last_timestamp,
                p.txn_first_offset,
                p.coordinator_epoch,
                p.marker_offset,
                p.last_write_ms,
            )
            state._producers[p.producer_id] = kept
            if kept.txn_first_offset >= 0:
                state._ongoing[p.producer_id] = kept.txn_first_offset
        state._completed.extend(completed)
        return state

    def snapshot(self) -> tuple[SnapshotProducer, ...]:
        """Every producer held, as a snapshot keeps it (nothing in flight: at a clean close)."""
        return tuple(
            SnapshotProducer(
                pid,
                p.epoch,
                tuple(p.batches),
                p.last_timestamp,
                p.txn_first_offset,
                p.coordinator_epoch,
                p.marker_offset,
                p.last_write_ms,
            )
            for pid, p in self._producers.items()
        )

    def completed(self) -> tuple[tuple[int, int], ...]:
        """(first offset, marker offset) of the completed transactions still counted unstable."""
        return tuple(self._completed)

    def learn(
        self, header: BatchHeader, control: ControlRecord | None = None, write_ms: int | None = None
    ) -> CompletedTxn | None:
        """One more stored batch, in log order, with what its record says if it is a control
        batch (a partition's open walk, which keeps the transactions it completes), written by
        `write_ms` in the broker's clock (None: not known, its own max timestamp then)."""
        return self._remember(header, None if control is None else {header.base_offset: control}, write_ms)

    # ------------------------------------------------------------------------- questions

    def check(self, headers: Sequence[BatchHeader]) -> int | None:
        """Before appending the batches of one request: the base offset already given to them if
        they are a retry, else None (append them). Raises on a gap, a fenced epoch, a retry of a
        batch in flight, or a request mixing retried and new batches. Changes nothing."""
        if len(headers) == 1:
            # Nearly every request: one batch, of no producer, or the next of one with nothing in
            # flight here. That follows the last batch stored, so it cannot be a retry of one (the
            # batches kept are consecutive): answered without the general walk's search of them
            # (~1 us of a one-record idempotent produce's broker time).
            h = headers[0]
            if h.producer_id == NO_PRODUCER_ID:
                return None
            state = self._producers.get(h.producer_id)
            if (
                state is not None
                and state.batches
                and h.producer_epoch == state.epoch
                and h.base_sequence == state.batches[-1][1] + 1
                and not self._in_flight.get(h.producer_id)
                and (state.txn_first_offset < 0 or h.attributes & TRANSACTIONAL_BIT)
            ):
                return None
        dup_offsets: list[int] = []
        expected: dict[int, tuple[int, int]] = {}  # (epoch, next sequence) per producer, this request
        for h in headers:
            pid = h.producer_id
            if pid == NO_PRODUCER_ID:
                continue
            state = self._producers.get(pid)
            last = h.last_sequence
            flying = self._in_flight.get(pid)
            if flying:
                epoch, _, flying_last = flying[-1]
                if (h.producer_epoch, h.base_sequence, last) in flying:
                    raise RetryInFlightError(
                        f"producer {pid}: the batch of sequences {h.base_sequence}-{last} is still "
                        "being written; retry"
                    )
            else:
                epoch = state.epoch if state is not None else -1
                flying_last = -1
            seen = expected.get(pid)
            if seen is not None:  # a later batch of a producer this request already carries
                request_epoch, want = seen
                if h.producer_epoch < request_epoch:
                    raise FencedEpochError(
                        f"producer {pid} epoch {h.producer_epoch} is fenced by epoch {request_epoch} "
                        "earlier in the same request"
                    )
                if h.producer_epoch > request_epoch:
                    want = 0  # an epoch bump starts at sequence 0, as between requests
                if h.base_sequence != want:
                    raise SequenceError(
                        f"producer {pid} epoch {h.producer_epoch}: sequence {h.base_sequence} where "
                        f"{want} was expected (the batch before it in this request ends at {want - 1})"
                    )
                expected[pid] = (h.producer_epoch, last + 1)
                continue
            fresh = (state is None and not flying) or h.producer_epoch > epoch
            if not fresh:
                if h.producer_epoch < epoch:
                    raise FencedEpochError(
                        f"producer {pid} epoch {h.producer_epoch} is fenced by epoch {epoch}"
                    )
                if state is not None and state.epoch == h.producer_epoch:
                    cached = next(
                        (b for f, l_, b in state.batches if f == h.base_sequence and l_ == last), None
                    )
                    if cached is not None:
                        dup_offsets.append(cached)
                        continue
            if fresh:
                default = 0
            elif flying:
                default = flying_last + 1
            else:
                assert state is not None  # not fresh and nothing in flight: a producer we hold
                default = state.last_sequence + 1
            want = default
            if h.base_sequence != want and state is None and not flying:
                raise UnknownProducerError(
                    f"producer {pid} epoch {h.producer_epoch}: sequence {h.base_sequence} from a producer "
                    "this partition holds no batch of (new, or its batches were deleted by retention): "
                    "start at sequence 0"
                )
            if h.base_sequence != want:
                raise SequenceGapError(
                    f"producer {pid} epoch {h.producer_epoch}: sequence {h.base_sequence} where {want} "
                    "was expected (records lost, or producer state expired with the segments holding it)"
                )
            if state is not None and state.txn_first_offset >= 0 and not h.attributes & TRANSACTIONAL_BIT:
                raise InvalidTxnStateError(
                    f"producer {pid} has a transaction open at offset {state.txn_first_offset}: "
                    "expected a transactional write"
                )
            expected[pid] = (h.producer_epoch, last + 1)
        if dup_offsets and len(dup_offsets) != len(headers):
            raise SequenceError("a request mixing retried and new batches")
        return dup_offsets[0] if dup_offsets else None

    def producer(self, producer_id: int) -> tuple[int, int] | None:
        """(epoch, last sequence) of what is stored of `producer_id`, or None if it is unknown."""
        state = self._producers.get(producer_id)
        return None if state is None else (state.epoch, state.last_sequence)

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Before a transaction marker is written (Kafka's ProducerAppendInfo.appendEndTxnMarker):
        `FencedEpochError` when `producer_epoch` is older than the producer's,
        `CoordinatorFencedError` when `coordinator_epoch` is older than its last marker's. A
        producer this partition holds nothing of takes any marker (its transaction wrote
        nothing here). Changes nothing."""
        state = self._producers.get(producer_id)
        if state is None:
            return
        if producer_epoch < state.epoch:
            raise FencedEpochError(
                f"producer {producer_id} is at epoch {state.epoch}: "
                f"a marker of epoch {producer_epoch} is fenced"
            )
        if coordinator_epoch < state.coordinator_epoch:
            raise CoordinatorFencedError(
                f"producer {producer_id}'s last marker came from coordinator epoch "
                f"{state.coordinator_epoch}: one of epoch {coordinator_epoch} is fenced"
            )

    def active(self) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, last batch's max timestamp) of every producer this
        partition holds batches of (Kafka's DescribeProducers), by producer id."""
        return [
            (pid, p.epoch, p.last_sequence, p.last_timestamp)
            for pid, p in sorted(self._producers.items())
            if p.batches
        ]

    def transaction_of(self, producer_id: int) -> tuple[int, int]:
        """(first offset of its open transaction or -1, coordinator epoch of its last marker or
        -1): what Kafka's DescribeProducers adds for a producer."""
        state = self._producers.get(producer_id)
        return (-1, -1) if state is None else (state.txn_first_offset, state.coordinator_epoch)

    def open_transactions(self) -> list[tuple[int, int, int, int, int]]:
        """(producer id, epoch, first offset of its open transaction, when it last wrote here in
        the broker's clock (ms), coordinator epoch of its last marker or -1) of every producer
        with a transaction open, by first offset (broker/core/txn_sweep.py)."""
        return sorted(
            (
                (pid, p.epoch, p.txn_first_offset, p.last_write_ms, p.coordinator_epoch)
                for pid, p in self._producers.items()
                if p.txn_first_offset >= 0
            ),
            key=lambda t: t[2],
        )

    def ongoing(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction."""
        return dict(self._ongoing)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset a read_committed reader may not pass yet (Kafka's
        ProducerStateManager.firstUnstableOffset): the smallest first offset of the open
        transactions and of the completed ones whose marker is not below `high_watermark`;
        None when there is none. Completed ones below it are forgotten here (a high watermark
        only grows; a truncation rebuilds the state)."""
        completed = self._completed
        while completed and completed[0][1] < high_watermark:
            completed.popleft()
        if not completed and not self._ongoing:
            return None
        firsts = [first for first, _ in completed]
        if self._ongoing:
            firsts.append(min(self._ongoing.values()))
        return min(firsts)

    @property
    def in_flight(self) -> int:
        """Batches reserved and neither stored nor released yet."""
        return sum(len(v) for v in self._in_flight.values())

    # ------------------------------------------------------------------------- events

    def reserve(self, headers: Sequence[BatchHeader]) -> None:
        """An append of these batches was prepared: later batches of their producers follow them."""
        for h in headers:
            if h.producer_id != NO_PRODUCER_ID and not h.attributes & CONTROL_BIT:
                entry = (h.producer_epoch, h.base_sequence, h.last_sequence)
                self._in_flight.setdefault(h.producer_id, []).append(entry)

    def released(self, headers: Sequence[BatchHeader]) -> None:
        """The prepared append of these batches failed or was undone: forget them."""
        if not self._in_flight:
            return
        for h in headers:
            flying = self._in_flight.get(h.producer_id)
            if flying:
                entry = (h.producer_epoch, h.base_sequence, h.last_sequence)
                with contextlib.suppress(ValueError):
                    flying.remove(entry)
                if not flying:
                    del self._in_flight[h.producer_id]

    def stored(
        self,
        headers: Sequence[BatchHeader],
        controls: dict[int, ControlRecord] | None = None,
        *,
        write_ms: int | None = None,
    ) -> list[CompletedTxn]:
        """The append of these batches (headers with their assigned base offsets), written at
        `write_ms` in the broker's clock (None: at each batch's own max timestamp), completed.
        `controls`: base offset -> what the record of each control batch among them says (a
        control batch not in it, or not a marker, changes nothing). Returns the transactions
        their markers completed."""
        self.released(headers)
        completed = _NO_COMPLETED
        for h in headers:
            done = self._remember(h, controls, write_ms)
            if done is not None:
                if completed is _NO_COMPLETED:
                    completed = []
                completed.append(done)
        return completed

    def last_offsets(self) -> dict[int, int]:
        """Producer id -> the last offset of its last stored batch, for every producer held: the
        batches the log cleaner keeps (empty if need be), so that `rebuild` after a restart
        finds each producer's last sequence and epoch (Kafka's rule; broker/storage/cleaner.py)."""
        out = {}
        for pid, p in self._producers.items():
            if p.batches:
                first, last, base = p.batches[-1]
                out[pid] = base + last - first
        return out

    def last_markers(self) -> dict[int, int]:
        """Producer id -> the offset of its last marker, for every producer held that has one:
        markers the log cleaner keeps, so that `rebuild` finds each producer's epoch and
        coordinator epoch where the marker set them (broker/storage/cleaner.py)."""
        return {pid: p.marker_offset for pid, p in self._producers.items() if p.marker_offset >= 0}

    def expire(self, start_offset: int) -> None:
        """Retention deleted the log below `start_offset`: forget the batches it took, and a
        producer with nothing left (no batch, no marker, no open transaction), so the state is
        what `rebuild` would make of the log now (state lives as long as the batches carrying
        it, whether or not the broker restarted). Completed transactions whose marker went are
        forgotten; an open one that began below the start begins at the start now (Kafka's
        `onLogStartOffsetIncremented`: the last stable offset is never below the log start)."""
        for pid in [
            pid
            for pid, p in self._producers.items()
            if (p.batches and p.batches[0][2] < start_offset) or p.marker_offset < start_offset
        ]:
            state = self._producers[pid]
            batches = state.batches
            while batches and batches[0][2] < start_offset:
                batches.popleft()
            if state.marker_offset < start_offset:
                state.marker_offset = -1
            if 0 <= state.txn_first_offset < start_offset:
                state.txn_first_offset = self._ongoing[pid] = start_offset
            if not batches and state.marker_offset < 0 and state.txn_first_offset < 0:
                del self._producers[pid]
        completed = self._completed
        while completed and completed[0][1] < start_offset:
            completed.popleft()

    def expire_idle(self, now_ms: int, expiration_ms: int) -> int:
        """Forget every producer whose last write is `expiration_ms` or more before `now_ms`, that
        has no batch in flight and no transaction open (module rules; Kafka's
        `removeExpiredProducers`, which keeps a producer while its transaction is open). Returns
        how many were forgotten."""
        idle = [
            pid
            for pid, p in self._producers.items()
            if now_ms - p.last_write_ms >= expiration_ms
            and p.txn_first_offset < 0
            and pid not in self._in_flight
        ]
        for pid in idle:
            del self._producers[pid]
        return len(idle)

    def _remember(
        self, h: BatchHeader, controls: dict[int, ControlRecord] | None = None, write_ms: int | None = None
    ) -> CompletedTxn | None:
        if h.producer_id == NO_PRODUCER_ID:
            return None
        written = h.max_timestamp if write_ms is None else write_ms
        if h.attributes & _TXN_BITS:
            if h.attributes & CONTROL_BIT:
                control = None if controls is None else controls.get(h.base_offset)
                if control is None or control.type not in (0, 1):
                    return None  # not a marker (Kafka writes no other control batch to a partition)
                return self._marker(h, control, written)
            state = self._producers.get(h.producer_id)
            if state is None or h.producer_epoch > state.epoch:
                state = self._fresh(h.producer_id, h.producer_epoch, state)
            if state.txn_first_offset < 0:
                state.txn_first_offset = self._ongoing[h.producer_id] = h.base_offset
        else:
            state = self._producers.get(h.producer_id)
            if state is None or h.producer_epoch > state.epoch:
                state = self._fresh(h.producer_id, h.producer_epoch, state)
        state.batches.append((h.base_sequence, h.last_sequence, h.base_offset))
        state.last_timestamp = h.max_timestamp
        state.last_write_ms = written
        return None

    def _fresh(self, pid: int, epoch: int, old: _Producer | None) -> _Producer:
        """A producer's state at a new epoch: sequences start over; its open transaction, if
        any, and its coordinator epoch carry on (only a marker ends a transaction)."""
        state = self._producers[pid] = _Producer(epoch)
        if old is not None:
            state.txn_first_offset = old.txn_first_offset
            state.coordinator_epoch = old.coordinator_epoch
            state.marker_offset = old.marker_offset
        return state

    def _marker(self, h: BatchHeader, control: ControlRecord, write_ms: int) -> CompletedTxn | None:
        pid = h.producer_id
        state = self._producers.get(pid)
        if state is None or h.producer_epoch > state.epoch:
            state = self._fresh(pid, h.producer_epoch, state)
        state.last_write_ms = write_ms  # a marker keeps its producer from expiring (Kafka)
        state.coordinator_epoch = control.coordinator_epoch
        state.marker_offset = h.base_offset
        first = state.txn_first_offset
        if first < 0:
            # A marker of a transaction that wrote nothing here (or whose batches retention
            # took): it moves no last stable offset and aborts nothing a reader could see, so
            # Kafka emits no completed transaction for it either.
            return None
        state.txn_first_offset = -1
        del self._ongoing[pid]
        self._completed.append((first, h.base_offset))
        others = min(self._ongoing.values()) if self._ongoing else h.base_offset + 1
        return CompletedTxn(pid, first, h.base_offset, control.commit, others)
