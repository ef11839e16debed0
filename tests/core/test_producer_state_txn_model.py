"""Random transactional histories on ProducerState, checked against a model of Kafka's rules.

The model keeps only the log: every batch stored, in offset order (data batches with or without
the transactional bit, commit and abort markers with their coordinator epoch), and the high
watermark. From it alone it derives what ProducerState must answer (Kafka's ProducerStateManager
and ProducerAppendInfo): a producer's transaction opens at its first transactional batch after
its last marker and ends at its next marker; a marker older than the producer's epoch, or than
the coordinator epoch of its last marker, is refused; a marker of a producer with nothing open
completes nothing; a completed transaction stays unstable until its marker is below the high
watermark; a non-transactional batch of a producer with a transaction open is refused; a higher
epoch (of a batch or a marker) restarts sequences at 0. After every step the state rebuilt from
the log (a restart's open walk) must answer the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.core.producer_state import (
    CompletedTxn,
    CoordinatorFencedError,
    FencedEpochError,
    InvalidTxnStateError,
    ProducerState,
)
from ringlog_proto.batch import MAGIC, BatchHeader
from ringlog_proto.batch_control import CONTROL_ABORT, CONTROL_COMMIT, ControlRecord
from ringlog_proto.batch_header import CONTROL_BIT, NO_SEQUENCE, TRANSACTIONAL_BIT

PIDS = (1, 2, 3)


@dataclass(frozen=True)
class Stored:
    pid: int
    epoch: int
    offset: int
    count: int = 1
    first_sequence: int = 0
    transactional: bool = False
    marker: ControlRecord | None = None  # set for a commit/abort marker

    def header(self) -> BatchHeader:
        attributes = (TRANSACTIONAL_BIT if self.transactional or self.marker else 0) | (
            CONTROL_BIT if self.marker else 0
        )
        sequence = NO_SEQUENCE if self.marker else self.first_sequence
        return BatchHeader(
            self.offset,
            0,
            0,
            MAGIC,
            0,
            attributes,
            self.count - 1,
            0,
            0,
            self.pid,
            self.epoch,
            sequence,
            self.count,
        )


def controls(log: list[Stored]) -> dict[int, ControlRecord]:
    return {b.offset: b.marker for b in log if b.marker is not None}


class Model:
    """What the log says, derived afresh each time."""

    def __init__(self, log: list[Stored]) -> None:
        self.log = log

    def epoch(self, pid: int) -> int:
        return max((b.epoch for b in self.log if b.pid == pid), default=-1)

    def coordinator_epoch(self, pid: int) -> int:
        return max((b.marker.coordinator_epoch for b in self.log if b.pid == pid and b.marker), default=-1)

    def next_sequence(self, pid: int) -> int:
        epoch = self.epoch(pid)
        data = [b for b in self.log if b.pid == pid and b.epoch == epoch and b.marker is None]
        return data[-1].first_sequence + data[-1].count if data else 0

    def txn_first(self, pid: int) -> int:
        first = -1
        for b in self.log:
            if b.pid != pid:
                continue
            if b.marker is not None:
                first = -1
            elif b.transactional and first < 0:
                first = b.offset
        return first

    def completed(self) -> list[CompletedTxn]:
        out, open_at = [], {}
        for b in self.log:
            if b.marker is None:
                if b.transactional:
                    open_at.setdefault(b.pid, b.offset)
                continue
            first = open_at.pop(b.pid, None)
            if first is not None:
                lso = min(open_at.values()) if open_at else b.offset + 1
                out.append(CompletedTxn(b.pid, first, b.offset, b.marker.type == CONTROL_COMMIT, lso))
        return out

    def first_unstable(self, hw: int) -> int | None:
        firsts = [self.txn_first(pid) for pid in PIDS if self.txn_first(pid) >= 0]
        firsts += [c.first_offset for c in self.completed() if c.last_offset >= hw]
        return min(firsts) if firsts else None


class TxnStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ProducerState()
        self.log: list[Stored] = []
        self.hw = 0
        self.end = 0

    @property
    def model(self) -> Model:
        return Model(self.log)

    def _store(self, batch: Stored) -> list[CompletedTxn]:
        self.log.append(batch)
        self.end = batch.offset + batch.count
        return self.state.stored([batch.header()], controls([batch]))

    @rule(pid=st.sampled_from(PIDS), transactional=st.booleans(), bump=st.booleans(), count=st.integers(1, 3))
    def data(self, pid: int, transactional: bool, bump: bool, count: int) -> None:
        model = self.model
        epoch = max(model.epoch(pid), 0) + (1 if bump else 0)
        sequence = 0 if epoch > model.epoch(pid) else model.next_sequence(pid)
        batch = Stored(pid, epoch, self.end, count, sequence, transactional)
        refused = model.txn_first(pid) >= 0 and not transactional
        try:
            assert self.state.check([batch.header()]) is None
        except InvalidTxnStateError:
            assert refused
            return
        assert not refused, "a non-transactional write inside an open transaction was taken"
        self.state.reserve([batch.header()])
        assert self._store(batch) == []

    @rule(
        pid=st.sampled_from(PIDS),
        epoch_delta=st.sampled_from((-1, 0, 0, 1)),
        coordinator_delta=st.sampled_from((-1, 0, 0, 1)),
        commit=st.booleans(),
    )
    def marker(self, pid: int, epoch_delta: int, coordinator_delta: int, commit: bool) -> None:
        model = self.model
        known = any(b.pid == pid for b in self.log)
        epoch = max(model.epoch(pid) + epoch_delta, 0)
        coordinator_epoch = max(model.coordinator_epoch(pid) + coordinator_delta, 0)
        expect: type[Exception] | None = None
        if known and epoch < model.epoch(pid):
            expect = FencedEpochError
        elif known and coordinator_epoch < model.coordinator_epoch(pid):
            expect = CoordinatorFencedError
        try:
            self.state.check_marker(pid, epoch, coordinator_epoch)
        except (FencedEpochError, CoordinatorFencedError) as exc:
            assert type(exc) is expect
            return
        assert expect is None, f"{expect} expected"
        before = model.completed()
        record = ControlRecord(CONTROL_COMMIT if commit else CONTROL_ABORT, coordinator_epoch)
        done = self._store(Stored(pid, epoch, self.end, marker=record))
        assert done == self.model.completed()[len(before) :]

    @rule(data=st.data())
    def high_watermark(self, data: st.DataObject) -> None:
        self.hw = data.draw(st.integers(self.hw, self.end))

    @invariant()
    def agrees(self) -> None:
        model = self.model
        assert self.state.first_unstable_offset(self.hw) == model.first_unstable(self.hw)
        for pid in PIDS:
            first, coordinator_epoch = self.state.transaction_of(pid)
            assert first == model.txn_first(pid)
            if any(b.pid == pid for b in self.log):
                assert coordinator_epoch == model.coordinator_epoch(pid)
                assert self.state.producer(pid)[0] == model.epoch(pid)
        assert self.state.ongoing() == {p: model.txn_first(p) for p in PIDS if model.txn_first(p) >= 0}

    @invariant()
    def rebuilt_agrees(self) -> None:
        rebuilt = ProducerState.rebuild((b.header() for b in self.log), controls(self.log))
        assert rebuilt.first_unstable_offset(self.hw) == self.state.first_unstable_offset(self.hw)
        assert rebuilt.ongoing() == self.state.ongoing()
        for pid in PIDS:
            assert rebuilt.producer(pid) == self.state.producer(pid)
            assert rebuilt.transaction_of(pid) == self.state.transaction_of(pid)


TxnStateMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestProducerStateTransactions = TxnStateMachine.TestCase


def test_retention_keeps_an_open_transaction_at_the_log_start() -> None:
    state = ProducerState()
    state.stored([Stored(1, 0, 0, 2, 0, transactional=True).header()])
    state.stored([Stored(1, 0, 2, 1, 2, transactional=True).header()])
    state.expire(2)
    assert state.first_unstable_offset(3) == 2, "never below the log start"
    marker = Stored(1, 0, 3, marker=ControlRecord(CONTROL_ABORT, 0))
    assert state.stored([marker.header()], controls([marker])) == [CompletedTxn(1, 2, 3, False, 4)]
    state.expire(4)
    assert state.producer(1) is None and state.first_unstable_offset(4) is None


def test_an_open_transaction_keeps_its_producer_past_the_expiration_and_a_marker_is_a_write() -> None:
    """Kafka's removeExpiredProducers keeps a producer while its transaction is open, and dates
    its last write by its marker too (KAFKA-9144)."""
    state = ProducerState()
    state.stored([Stored(1, 0, 0, 2, 0, transactional=True).header()], write_ms=1_000)
    assert state.expire_idle(1_000_000, 100) == 0, "a transaction open: kept"
    marker = Stored(1, 0, 2, marker=ControlRecord(CONTROL_COMMIT, 0))
    state.stored([marker.header()], controls([marker]), write_ms=5_000)
    assert state.expire_idle(5_099, 100) == 0, "the marker's write is its last"
    assert state.expire_idle(5_100, 100) == 1 and state.producer(1) is None
