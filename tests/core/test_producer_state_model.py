"""Random produce histories on ProducerState, checked against a model of the documented semantics.

The model (docs/PROTOCOL.md §4.7) keeps no state of its own beyond what the log would hold: the
batches stored, in log order, and the requests prepared but not completed, in prepare order. Every
answer is derived from that history: a batch equal to one of the last 5 stored of its producer's
current epoch is a retry; one equal to a batch in flight is a retry of it (refused, retriable); an
older epoch is fenced; a new producer or a higher epoch starts at sequence 0; otherwise the batch
must follow the producer's last batch, stored or in flight. A request is all retries or all new.
The implementation keeps that state incrementally (a bounded deque per producer, the batches in
flight); a restart rebuilds it from the stored headers that retention left. A producer idle for
the expiration (its last stored batch written that long ago, nothing in flight) is forgotten: the
model then judges it by its batches written after that, as if the earlier ones were not there
(until a restart rebuilds the state from the log, and the expiration is applied again at once,
as a core does when it opens a partition).

Appends complete in prepare order, and a failed write undoes it and every append prepared after
it (Log.abort_append), so the machine completes the oldest request or fails them all, as a
backend does.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core.producer_state import (
    PRODUCER_BATCHES_KEPT,
    FencedEpochError,
    ProducerState,
    RetryInFlightError,
    SequenceError,
    UnknownProducerError,
)
from ringlog_proto.batch import MAGIC, NO_PRODUCER_ID, BatchHeader

PIDS = (1, 2, 3)
EXPIRATION = 10  # the producer id expiration, in the machine's clock ticks


@dataclass(frozen=True)
class Batch:
    pid: int
    epoch: int
    first: int
    count: int
    base_offset: int = -1  # assigned when prepared

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def header(self) -> BatchHeader:
        return BatchHeader(
            self.base_offset,
            0,
            0,
            MAGIC,
            0,
            0,
            self.count - 1,
            0,
            0,
            self.pid,
            self.epoch,
            self.first,
            self.count,
        )


def headers(batches: list[Batch]) -> list[BatchHeader]:
    return [b.header() for b in batches]


# The model's answers: None (new: append), an int (a retry: its base offset), or an error kind.
FENCED, OUT_OF_ORDER, IN_FLIGHT = "fenced", "out of order", "in flight"


def model_answer(stored: list[Batch], flying: list[list[Batch]], request: list[Batch]) -> int | str | None:
    retries: list[int] = []
    earlier: list[Batch] = []  # this request's new batches before the one judged
    for b in request:
        if b.pid == NO_PRODUCER_ID:
            earlier.append(b)
            continue
        hist = [x for x in stored if x.pid == b.pid]
        in_flight = [x for r in flying for x in r if x.pid == b.pid]
        if any((x.epoch, x.first, x.last) == (b.epoch, b.first, b.last) for x in in_flight):
            return IN_FLIGHT
        before = hist + in_flight + [x for x in earlier if x.pid == b.pid]
        epoch = before[-1].epoch if before else None
        if epoch is not None and b.epoch < epoch:
            return FENCED
        # a later batch of a producer this request already carries must follow that batch: it
        # can be no retry (a request is all retries or all new)
        carried = any(x.pid == b.pid for x in earlier)
        if epoch == b.epoch and hist and not carried:
            current = [x for x in hist if x.epoch == hist[-1].epoch][-PRODUCER_BATCHES_KEPT:]
            same = [x for x in current if x.epoch == b.epoch and (x.first, x.last) == (b.first, b.last)]
            if same:
                retries.append(same[0].base_offset)
                continue
        want = 0 if epoch is None or b.epoch > epoch else before[-1].last + 1
        if b.first != want:
            return OUT_OF_ORDER
        earlier.append(b)
    if retries and len(retries) != len(request):
        return OUT_OF_ORDER  # a request mixing retried and new batches
    return retries[0] if retries else None


def implementation_answer(state: ProducerState, request: list[Batch]) -> int | str | None:
    try:
        return state.check(headers(request))
    except RetryInFlightError:
        return IN_FLIGHT
    except FencedEpochError:
        return FENCED
    except SequenceError:
        return OUT_OF_ORDER


class ProducerStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ProducerState()
        self.stored: list[Batch] = []  # what the log holds, in log order (after retention)
        self.flying: list[list[Batch]] = []  # requests prepared, not completed, in prepare order
        self.next_offset = 0
        self.now = 0
        self.written: dict[int, int] = {}  # base offset of a stored batch -> when it was written
        self.forgotten: dict[int, int] = {}  # producer -> the offset below which it is forgotten

    def visible(self) -> list[Batch]:
        """The stored batches the producer state judges by: not those of a forgotten producer
        stored before it was forgotten."""
        return [b for b in self.stored if b.base_offset >= self.forgotten.get(b.pid, 0)]

    # ------------------------------------------------------------------------- what to send

    def projected(self, pid: int) -> Batch | None:
        """The producer's last batch, stored or in flight."""
        mine = [x for x in self.stored if x.pid == pid] + [x for r in self.flying for x in r if x.pid == pid]
        return mine[-1] if mine else None

    def draw_batch(self, data: st.DataObject, pid: int, after: Batch | None) -> Batch:
        """A batch a producer might send: mostly the right next one, sometimes a retry, a gap, a
        restart at 0, an epoch bump or a stale epoch."""
        if pid == NO_PRODUCER_ID:
            return Batch(pid, -1, -1, data.draw(st.integers(1, 3)))
        epoch = after.epoch if after is not None else 0
        nxt = after.last + 1 if after is not None else 0
        known = [x for x in self.stored if x.pid == pid] + [x for r in self.flying for x in r if x.pid == pid]
        kind = data.draw(st.sampled_from(["next", "next", "next", "retry", "gap", "zero", "bump", "stale"]))
        count = data.draw(st.integers(1, 3))
        if kind == "retry" and known:
            old = data.draw(st.sampled_from(known[-8:]))
            return Batch(pid, old.epoch, old.first, old.count)
        if kind == "gap":
            return Batch(pid, epoch, nxt + data.draw(st.sampled_from([-2, -1, 1, 2])), count)
        if kind == "zero":
            return Batch(pid, epoch, 0, count)
        if kind == "bump":
            return Batch(pid, epoch + data.draw(st.integers(1, 2)), 0, count)
        if kind == "stale":
            return Batch(pid, max(epoch - 1, 0), nxt, count)
        return Batch(pid, epoch, nxt, count)

    # ------------------------------------------------------------------------- rules

    @rule(data=st.data(), pids=st.lists(st.sampled_from((*PIDS, NO_PRODUCER_ID)), min_size=1, max_size=3))
    def produce(self, data: st.DataObject, pids: list[int]) -> None:
        request: list[Batch] = []
        for pid in pids:
            earlier = next((b for b in reversed(request) if b.pid == pid), None)
            b = self.draw_batch(data, pid, earlier or self.projected(pid))
            request.append(b)
        expected = model_answer(self.visible(), self.flying, request)
        got = implementation_answer(self.state, request)
        assert got == expected, (request, self.stored, self.flying)
        if got is None:  # new: the log assigns offsets, the partition reserves the sequences
            placed = []
            for b in request:
                placed.append(Batch(b.pid, b.epoch, b.first, b.count, self.next_offset))
                self.next_offset += b.count
            self.state.reserve(headers(placed))
            self.flying.append(placed)

    @precondition(lambda self: self.flying)
    @rule()
    def complete_oldest(self) -> None:
        placed = self.flying.pop(0)
        self.state.stored(headers(placed), write_ms=self.now)
        self.stored.extend(placed)
        self.written.update((b.base_offset, self.now) for b in placed)

    @rule(ticks=st.integers(1, 2 * EXPIRATION))
    def tick(self, ticks: int) -> None:
        self.now += ticks

    @rule()
    def expire_idle(self) -> None:
        """The retention pass forgets the producers idle for the expiration with nothing in flight."""
        flying = {b.pid for r in self.flying for b in r}
        idle = []
        for pid in PIDS:
            hist = [b for b in self.visible() if b.pid == pid]
            if hist and self.now - self.written[hist[-1].base_offset] >= EXPIRATION and pid not in flying:
                idle.append(pid)
                self.forgotten[pid] = hist[-1].base_offset + hist[-1].count
        assert self.state.expire_idle(self.now, EXPIRATION) == len(idle)
        for pid in idle:
            assert self.state.producer(pid) is None

    @precondition(lambda self: self.flying)
    @rule()
    def fail_from_oldest(self) -> None:
        """A write failed: the log undoes it and every later append; each producer hears of it."""
        failed, self.flying = self.flying, []
        self.next_offset = failed[0][0].base_offset
        for placed in failed:
            self.state.released(headers(placed))

    @precondition(lambda self: self.stored)
    @rule(data=st.data())
    def retention(self, data: st.DataObject) -> None:
        """Retention deletes a prefix of the log (whole segments: here any prefix of batches)."""
        drop = data.draw(st.integers(1, len(self.stored)))
        start = (
            self.stored[drop].base_offset
            if drop < len(self.stored)
            else self.stored[-1].base_offset + self.stored[-1].count
        )
        self.stored = self.stored[drop:]
        self.state.expire(start)

    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        """The broker restarts: writes in flight are lost, retention may have taken a prefix of the
        log, and the state is rebuilt from the headers of what is left."""
        if self.flying:
            self.next_offset = self.flying[0][0].base_offset
        self.flying = []
        drop = data.draw(st.integers(0, len(self.stored)))
        if drop and data.draw(st.booleans()):
            self.stored = self.stored[drop:]
        self.state = ProducerState.rebuild(headers(self.stored), written_by_ms=self.written.get)
        self.forgotten = {}
        self.expire_idle()

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def producers_agree(self) -> None:
        for pid in PIDS:
            hist = [x for x in self.visible() if x.pid == pid]
            assert self.state.producer(pid) == ((hist[-1].epoch, hist[-1].last) if hist else None)

    @invariant()
    def in_flight_agrees(self) -> None:
        assert self.state.in_flight == sum(1 for r in self.flying for b in r if b.pid != NO_PRODUCER_ID)


ProducerStateMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProducerStateModel = ProducerStateMachine.TestCase


# ----------------------------------------------------------------------------- the documented cases


def test_a_new_producer_starts_at_zero_and_a_higher_epoch_starts_over() -> None:
    state = ProducerState()
    with pytest.raises(SequenceError):
        state.check(headers([Batch(1, 0, 1, 1)]))
    first = [Batch(1, 0, 0, 2, base_offset=0)]
    assert state.check(headers(first)) is None
    state.reserve(headers(first))
    state.stored(headers(first), write_ms=0)
    assert state.check(headers([Batch(1, 0, 0, 2)])) == 0, "a retry gets the original offset"
    assert state.check(headers([Batch(1, 1, 0, 1)])) is None, "a higher epoch starts over at 0"
    with pytest.raises(SequenceError):
        state.check(headers([Batch(1, 1, 2, 1)]))


def test_an_older_epoch_is_fenced() -> None:
    state = ProducerState.rebuild(headers([Batch(1, 3, 0, 1, base_offset=0)]))
    with pytest.raises(FencedEpochError):
        state.check(headers([Batch(1, 2, 1, 1)]))


def test_only_the_last_five_batches_are_answered_as_retries() -> None:
    stored = [Batch(1, 0, i, 1, base_offset=i) for i in range(PRODUCER_BATCHES_KEPT + 1)]
    state = ProducerState.rebuild(headers(stored))
    with pytest.raises(SequenceError):
        state.check(headers([stored[0]]))
    assert state.check(headers([stored[1]])) == 1


def test_a_request_changing_a_producers_epoch_is_judged_batch_by_batch() -> None:
    """docs/PROTOCOL.md §4.7 for a request carrying two epochs of one producer: each batch is
    judged by its own epoch, as if it came in a request of its own."""
    state = ProducerState.rebuild(headers([Batch(1, 0, 0, 1, base_offset=0)]))
    with pytest.raises(FencedEpochError):  # e1 seq 0, then e0 seq 1: the older epoch is fenced
        state.check(headers([Batch(1, 1, 0, 1), Batch(1, 0, 1, 1)]))
    # e1 seq 1, then an epoch bump to e2 at seq 0: accepted
    assert state.check(headers([Batch(1, 0, 1, 1), Batch(1, 2, 0, 1)])) is None


def test_the_next_batch_is_new_and_the_one_in_flight_a_retry_of_it() -> None:
    """The single-batch shortcut of `check` (the next batch after the last stored): a batch in
    flight that also follows the stored ones is a retry of the one in flight, never new."""
    state = ProducerState()
    state.reserve(headers([Batch(1, 0, 0, 2, base_offset=0)]))
    state.stored(headers([Batch(1, 0, 0, 2, base_offset=0)]), write_ms=0)
    assert state.check(headers([Batch(1, 0, 2, 1)])) is None
    state.reserve(headers([Batch(1, 0, 2, 1, base_offset=2)]))
    with pytest.raises(RetryInFlightError):
        state.check(headers([Batch(1, 0, 2, 1)]))
    assert state.check(headers([Batch(1, 0, 3, 1)])) is None
    state.stored(headers([Batch(1, 0, 2, 1, base_offset=2)]), write_ms=0)
    assert state.check(headers([Batch(1, 0, 2, 1)])) == 2  # stored now: a retry answered
    assert state.check(headers([Batch(1, 0, 3, 1)])) is None
    with pytest.raises(FencedEpochError):
        state.check(headers([Batch(1, -1, 3, 1)]))
    with pytest.raises(SequenceError):
        state.check(headers([Batch(1, 0, 4, 1)]))


def test_a_producer_is_forgotten_once_idle_for_the_expiration_and_kept_while_it_writes() -> None:
    """Kafka's producer.id.expiration.ms: measured from the producer's last write; a producer
    forgotten is unknown, so its next batch starts at 0 or is refused as unknown (Kafka's
    UNKNOWN_PRODUCER_ID); one with a batch in flight is kept."""
    state = ProducerState()
    for i, written in enumerate((0, 50, 100)):  # writing every 50 ms: kept
        b = [Batch(1, 0, i, 1, base_offset=i)]
        state.reserve(headers(b))
        state.stored(headers(b), write_ms=written)
        assert state.expire_idle(written + 99, 100) == 0
    assert state.producer(1) == (0, 2)
    assert state.expire_idle(199, 100) == 0  # 99 ms after its last write
    state.reserve(headers([Batch(1, 0, 3, 1, base_offset=3)]))
    assert state.expire_idle(10_000, 100) == 0, "a batch in flight: never forgotten"
    state.released(headers([Batch(1, 0, 3, 1, base_offset=3)]))
    assert state.expire_idle(200, 100) == 1 and state.producer(1) is None
    with pytest.raises(UnknownProducerError):
        state.check(headers([Batch(1, 0, 3, 1)]))
    assert state.check(headers([Batch(1, 0, 0, 1)])) is None, "started over at 0: accepted"


def test_a_rebuilt_producer_is_idle_from_when_its_last_batch_was_written() -> None:
    """After a restart each producer's last write is the time the log gives for its last batch
    (the broker's, from the segment's index), else the batch's own max timestamp."""
    stored = [Batch(1, 0, 0, 1, base_offset=0), Batch(2, 0, 0, 1, base_offset=1)]
    state = ProducerState.rebuild(headers(stored), written_by_ms={0: 1_000, 1: 5_000}.get)
    assert state.expire_idle(5_999, 1_000) == 1
    assert state.producer(1) is None and state.producer(2) == (0, 0)
    from_timestamps = ProducerState.rebuild(headers(stored), written_by_ms=lambda _offset: None)
    assert from_timestamps.expire_idle(1_000, 1_000) == 2  # the headers' max timestamp: 0
