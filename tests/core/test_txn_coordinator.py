"""The transaction coordinator's state machine, driven without sockets under a fake clock: every
API's paths and Kafka's error for each wrong call, durable-before-visible, timeouts, expiry, loading;
then random histories of client calls, crashes and completion orders checked against invariants."""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.core.producer_ids import EPOCH_LAST, ProducerIds, ProducerIdsUnavailable
from broker.core.txn_coordinator import (
    PREVIOUS,
    RETRY_BACKOFF_S,
    TRANSACTION_MAX_TIMEOUT_MS,
    TXN_PARTITIONS_MAX,
    InitResult,
    MarkerRequest,
    TransactionCoordinator,
    TxnCode,
    TxnListing,
    TxnView,
)
from broker.core.txn_log import TxnRecord, TxnState, decode_key, decode_value, load

TIMEOUT_MS = 60_000
S = TxnState
C = TxnCode


class Timer:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """call_later and a clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = 0

    def clock_ms(self) -> int:
        return int(self.now * 1000)

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(fn)
        self._seq += 1
        heapq.heappush(self._timers, (self.now + delay_s, self._seq, timer))
        return timer

    def due_within(self, seconds: float) -> bool:
        """Whether a timer not cancelled runs within `seconds` from now."""
        return any(at <= self.now + seconds and not t.cancelled for at, _, t in self._timers)

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self._timers and self._timers[0][0] <= end:
            at, _, timer = heapq.heappop(self._timers)
            self.now = at
            if not timer.cancelled:
                timer.fn()
        self.now = end


@dataclass
class Append:
    partition: int
    key: bytes
    value: bytes | None
    done: Callable[[TxnCode], None]


@dataclass
class FakeIO:
    """The state log (records per partition) and the marker sender. `auto`: appends are durable
    at once; otherwise they wait in `pending` for `complete`/`fail`."""

    auto: bool = True
    log: dict[int, list[tuple[bytes, bytes | None]]] = field(default_factory=dict)
    pending: list[Append] = field(default_factory=list)
    markers: list[tuple[MarkerRequest, Callable[[], None]]] = field(default_factory=list)
    fail_with: TxnCode | None = None

    def append(
        self, partition: int, key: bytes, value: bytes | None, done: Callable[[TxnCode], None]
    ) -> None:
        a = Append(partition, key, value, done)
        if self.fail_with is not None:
            done(self.fail_with)
        elif self.auto:
            self.write(a)
        else:
            self.pending.append(a)

    def write(self, a: Append) -> None:
        self.log.setdefault(a.partition, []).append((a.key, a.value))
        a.done(C.NONE)

    def complete(self, i: int = 0) -> None:
        self.write(self.pending.pop(i))

    def fail(self, i: int = 0, code: TxnCode = C.COORDINATOR_NOT_AVAILABLE) -> None:
        self.pending.pop(i).done(code)

    def send_markers(self, markers: MarkerRequest, done: Callable[[], None]) -> None:
        self.markers.append((markers, done))

    def write_markers(self, i: int = 0) -> MarkerRequest:
        request, done = self.markers.pop(i)
        done()
        return request

    def records(self, partition: int) -> list[tuple[str, TxnRecord | None]]:
        return [(decode_key(k), decode_value(v)) for k, v in self.log.get(partition, [])]


class MemorySource:
    def __init__(self) -> None:
        self.next = 1000
        self.down = False

    def claim_block(self, size: int) -> int:
        if self.down:
            raise ProducerIdsUnavailable("etcd is away")
        first, self.next = self.next, self.next + size
        return first


def partition_for(txn_id: str) -> int:
    return zlib.crc32(txn_id.encode()) % 2


def make(loop: FakeLoop, io: FakeIO, source: MemorySource | None = None, **kw: int) -> TransactionCoordinator:
    c = TransactionCoordinator(
        io,
        ProducerIds(source or MemorySource(), block_size=3),
        partition_for,
        loop.call_later,
        loop.clock_ms,
        **kw,
    )
    for p in (0, 1):
        c.load(p, 5, {})
    return c


class Got:
    """Collects callback answers."""

    def __init__(self) -> None:
        self.got: list[object] = []

    def __call__(self, result: object) -> None:
        self.got.append(result)

    @property
    def one(self) -> object:
        assert len(self.got) == 1, self.got
        return self.got[0]


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def io() -> FakeIO:
    return FakeIO()


@pytest.fixture
def coord(loop: FakeLoop, io: FakeIO) -> TransactionCoordinator:
    return make(loop, io)


def init(
    c: TransactionCoordinator,
    txn_id: str = "t",
    timeout_ms: int = TIMEOUT_MS,
    expected: tuple[int, int] | None = None,
    knows_fenced: bool = True,
) -> InitResult:
    got = Got()
    c.init_producer_id(txn_id, timeout_ms, got, expected=expected, knows_fenced=knows_fenced)
    result = got.one
    assert isinstance(result, InitResult)
    return result


def add(
    c: TransactionCoordinator, r: InitResult, parts: list[tuple[int, int]], txn_id: str = "t", **kw: bool
) -> object:
    got = Got()
    c.add_partitions(txn_id, r.producer_id, r.producer_epoch, parts, got, **kw)
    return got.one


def end(c: TransactionCoordinator, r: InitResult, commit: bool, txn_id: str = "t", **kw: bool) -> object:
    got = Got()
    c.end_txn(txn_id, r.producer_id, r.producer_epoch, commit, got, **kw)
    return got.one


def state(c: TransactionCoordinator, txn_id: str = "t") -> TxnState:
    view = c.describe(txn_id)
    assert isinstance(view, TxnView), view
    return view.state


# ----------------------------------------------------------------------------- the state table


def test_allowed_predecessors_are_kafkas() -> None:
    """TransactionState.validPreviousStates of Kafka, transaction version 1."""
    kafka = {
        S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_COMMIT: {S.ONGOING},
        S.PREPARE_ABORT: {S.ONGOING, S.PREPARE_EPOCH_FENCE},
        S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
        S.COMPLETE_ABORT: {S.PREPARE_ABORT},
        S.DEAD: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_EPOCH_FENCE: {S.ONGOING},
    }
    assert kafka == PREVIOUS


# ----------------------------------------------------------------------------- InitProducerId


def test_a_new_id_gets_a_new_producer_id_at_epoch_0_then_bumps(
    coord: TransactionCoordinator, io: FakeIO
) -> None:
    first = init(coord)
    assert (first.code, first.producer_epoch) == (C.NONE, 0) and first.producer_id >= 1000
    again = init(coord)
    assert (again.code, again.producer_id, again.producer_epoch) == (C.NONE, first.producer_id, 1)
    other = init(coord, "u")
    assert other.producer_id not in (first.producer_id, -1)
    records = io.records(partition_for("t"))
    assert [r.producer_epoch for i, r in records if i == "t" and r] == [0, 1]
    assert coord.describe("t") == TxnView("t", first.producer_id, 1, S.EMPTY, TIMEOUT_MS, -1, (), ())


@pytest.mark.parametrize(
    ("txn_id", "timeout_ms", "code"),
    [
        ("", TIMEOUT_MS, C.INVALID_REQUEST),
        ("t", 0, C.INVALID_TRANSACTION_TIMEOUT),
        ("t", -1, C.INVALID_TRANSACTION_TIMEOUT),
        ("t", TRANSACTION_MAX_TIMEOUT_MS + 1, C.INVALID_TRANSACTION_TIMEOUT),
    ],
)
def test_init_refuses_bad_ids_and_timeouts(
    coord: TransactionCoordinator, io: FakeIO, txn_id: str, timeout_ms: int, code: TxnCode
) -> None:
    assert init(coord, txn_id, timeout_ms).code == code
    assert not io.log
    assert init(coord, "t", TRANSACTION_MAX_TIMEOUT_MS).code == C.NONE


def test_the_timeout_cap_is_the_coordinators(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io, max_timeout_ms=1000)
    assert init(c, timeout_ms=1001).code == C.INVALID_TRANSACTION_TIMEOUT
    assert init(c, timeout_ms=1000).code == C.NONE


def test_ids_of_partitions_not_led_or_still_loading(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io)
    c.unload(partition_for("t"))
    assert init(c).code == C.NOT_COORDINATOR
    c.begin_load(partition_for("t"), 6)
    assert init(c).code == C.COORDINATOR_LOAD_IN_PROGRESS
    assert c.describe("t") == C.COORDINATOR_LOAD_IN_PROGRESS
    assert c.list_transactions() == C.COORDINATOR_LOAD_IN_PROGRESS
    c.complete_load(partition_for("t"), 6, {})
    assert init(c).code == C.NONE


def test_no_producer_id_to_give_is_retriable(loop: FakeLoop, io: FakeIO) -> None:
    source = MemorySource()
    source.down = True
    c = make(loop, io, source)
    assert init(c).code == C.COORDINATOR_LOAD_IN_PROGRESS
    assert c.describe("t") == C.TRANSACTIONAL_ID_NOT_FOUND
    source.down = False
    assert init(c).code == C.NONE


def test_nothing_changes_before_the_record_is_durable(loop: FakeLoop) -> None:
    io = FakeIO(auto=False)
    c = make(loop, io)
    got = Got()
    c.init_producer_id("t", TIMEOUT_MS, got)
    assert got.got == [] and c.describe("t") == C.TRANSACTIONAL_ID_NOT_FOUND
    c.init_producer_id("t", TIMEOUT_MS, got2 := Got())
    assert got2.got == [] and len(io.pending) == 1, "a pending transition holds others"
    io.complete()
    assert isinstance(got.one, InitResult) and got.one.producer_epoch == 0
    assert got2.got == [] and len(io.pending) == 1, "the held one runs again: its own record"
    assert state(c) == S.EMPTY and c.describe("t") == TxnView(
        "t", got.one.producer_id, 0, S.EMPTY, TIMEOUT_MS, -1, (), ()
    )
    io.fail()
    assert got2.one == InitResult(C.COORDINATOR_NOT_AVAILABLE)
    view = c.describe("t")
    assert isinstance(view, TxnView) and view.producer_epoch == 0, "a failed append changed nothing"


def test_a_new_ids_failed_first_record_leaves_nothing(loop: FakeLoop) -> None:
    io = FakeIO(auto=False)
    c = make(loop, io)
    c.init_producer_id("t", TIMEOUT_MS, got := Got())
    io.fail()
    assert got.one == InitResult(C.COORDINATOR_NOT_AVAILABLE)
    assert c.describe("t") == C.TRANSACTIONAL_ID_NOT_FOUND and c.state_of(partition_for("t")) == {}


def test_kip360_a_producer_bumps_its_own_epoch_and_a_retry_gets_the_same(
    coord: TransactionCoordinator,
) -> None:
    r0 = init(coord)
    r1 = init(coord, expected=(r0.producer_id, r0.producer_epoch))
    assert (r1.producer_id, r1.producer_epoch) == (r0.producer_id, 1)
    retry = init(coord, expected=(r0.producer_id, r0.producer_epoch))
    assert retry == r1, "the answer to a bump the producer never heard is the same epoch"
    md = coord.metadata("t")
    assert md is not None and (md.last_producer_id, md.last_producer_epoch) == (r0.producer_id, 0)


def test_kip360_a_stale_or_foreign_producer_is_fenced(coord: TransactionCoordinator) -> None:
    r0 = init(coord)
    init(coord, expected=(r0.producer_id, 0))  # epoch 1, last 0
    init(coord)  # another producer: epoch 2, last -1
    assert init(coord, expected=(r0.producer_id, 0)).code == C.PRODUCER_FENCED
    assert init(coord, expected=(r0.producer_id, 1)).code == C.PRODUCER_FENCED
    assert init(coord, expected=(r0.producer_id + 77, 2)).code == C.PRODUCER_FENCED
    below_v4 = init(coord, expected=(r0.producer_id, 0), knows_fenced=False)
    assert below_v4.code == C.INVALID_PRODUCER_EPOCH
    assert init(coord, expected=(r0.producer_id, 2)).producer_epoch == 3


def test_kip360_recovery_on_a_coordinator_that_lost_the_id(coord: TransactionCoordinator) -> None:
    """An expired id (or one written nowhere yet): a producer recovering with its old id is given
    a new one, not fenced (Kafka: the metadata was just created)."""
    r = init(coord, expected=(5, 7))
    assert r.code == C.NONE and r.producer_epoch == 0 and r.producer_id != 5


def test_an_exhausted_epoch_gets_a_new_producer_id(coord: TransactionCoordinator, loop: FakeLoop) -> None:
    old = TxnRecord(42, EPOCH_LAST, 42, EPOCH_LAST - 1, TIMEOUT_MS, S.EMPTY, update_ms=1)
    coord.load(partition_for("t"), 5, {"t": old})
    fresh = init(coord)
    assert fresh.code == C.NONE and fresh.producer_id != 42 and fresh.producer_epoch == 0
    md = coord.metadata("t")
    assert md is not None and (md.last_producer_id, md.last_producer_epoch) == (42, -1)
    # the producer itself rotating: its last epoch is kept, so a retry of the rotation is answered
    coord.load(partition_for("t"), 5, {"t": old})
    rotated = init(coord, expected=(42, EPOCH_LAST))
    assert rotated.producer_epoch == 0 and rotated.producer_id not in (42, fresh.producer_id)
    assert init(coord, expected=(42, EPOCH_LAST)) == rotated
    assert init(coord, expected=(42, EPOCH_LAST - 1)).code == C.PRODUCER_FENCED


def test_init_while_a_transaction_is_ongoing_aborts_it_with_a_bumped_epoch(
    coord: TransactionCoordinator, io: FakeIO
) -> None:
    r = init(coord)
    assert add(coord, r, [(1, 0), (2, 3)]) == C.NONE
    coord.init_producer_id("t", TIMEOUT_MS, first := Got())
    assert first.got == [] and state(coord) == S.PREPARE_ABORT, "held while the abort completes"
    request = io.markers[0][0]
    assert request == MarkerRequest("t", r.producer_id, 1, 5, False, frozenset({(1, 0), (2, 3)}), frozenset())
    coord.init_producer_id("t", TIMEOUT_MS, second := Got())
    assert second.got == [], "until the markers are written"
    assert end(coord, r, True) == C.PRODUCER_FENCED, "the zombie is fenced"
    io.write_markers()
    assert [first.one, second.one] == [
        InitResult(C.NONE, r.producer_id, 2),
        InitResult(C.NONE, r.producer_id, 3),
    ], "in arrival order, each as an ask after the abort"
    states = [rec.state for _, rec in io.records(partition_for("t")) if rec]
    assert states == [S.EMPTY, S.ONGOING, S.PREPARE_ABORT, S.COMPLETE_ABORT, S.EMPTY, S.EMPTY]


def test_init_during_a_commit_is_held_until_it_completes(coord: TransactionCoordinator, io: FakeIO) -> None:
    r = init(coord)
    add(coord, r, [(1, 0)])
    assert end(coord, r, True) == C.NONE
    coord.init_producer_id("t", TIMEOUT_MS, got := Got())
    assert got.got == []
    io.write_markers()
    assert isinstance(got.one, InitResult) and (got.one.code, got.one.producer_epoch) == (C.NONE, 1)
    assert state(coord) == S.EMPTY


# ----------------------------------------------------------------------------- AddPartitions / AddOffsets


def test_add_partitions_starts_and_grows_a_transaction(
    coord: TransactionCoordinator, io: FakeIO, loop: FakeLoop
) -> None:
    r = init(coord)
    assert add(coord, r, [(1, 0)]) == C.NONE
    start = loop.clock_ms()
    loop.advance(1)
    assert add(coord, r, [(1, 1)]) == C.NONE
    n = len(io.log[partition_for("t")])
    assert add(coord, r, [(1, 0), (1, 1)]) == C.NONE
    assert len(io.log[partition_for("t")]) == n, "partitions already in it: nothing written"
    view = coord.describe("t")
    assert isinstance(view, TxnView)
    assert (view.state, view.partitions, view.start_ms) == (S.ONGOING, ((1, 0), (1, 1)), start)


def test_add_offsets_adds_the_group(coord: TransactionCoordinator) -> None:
    r = init(coord)
    coord.add_offsets("t", r.producer_id, r.producer_epoch, "g", got := Got())
    assert got.one == C.NONE
    coord.add_offsets("t", r.producer_id, r.producer_epoch, "", got := Got())
    assert got.one == C.INVALID_REQUEST
    view = coord.describe("t")
    assert isinstance(view, TxnView) and (view.state, view.groups) == (S.ONGOING, ("g",))
    coord.add_offsets("t", r.producer_id, r.producer_epoch + 1, "g", got := Got())
    assert got.one == C.PRODUCER_FENCED


def test_add_partitions_errors_in_kafkas_order(loop: FakeLoop) -> None:
    io = FakeIO()
    c = make(loop, io)
    assert add(c, InitResult(C.NONE, 5, 0), [(1, 0)]) == C.INVALID_PRODUCER_ID_MAPPING, "unknown id"
    r = init(c)
    assert add(c, InitResult(C.NONE, r.producer_id + 1, 0), [(1, 0)]) == C.INVALID_PRODUCER_ID_MAPPING
    stale = InitResult(C.NONE, r.producer_id, 1)
    assert add(c, stale, [(1, 0)]) == C.PRODUCER_FENCED
    assert add(c, stale, [(1, 0)], knows_fenced=False) == C.INVALID_PRODUCER_EPOCH
    assert add(c, r, [], txn_id="") == C.INVALID_REQUEST
    io.auto = False
    c.add_partitions("t", r.producer_id, 0, [(1, 0)], got := Got())
    c.add_partitions("t", r.producer_id, 0, [(1, 1)], held := Got())
    assert held.got == [] and len(io.pending) == 1, "pending: held (Kafka: CONCURRENT_TRANSACTIONS)"
    assert add(c, stale, [(1, 1)]) == C.PRODUCER_FENCED, "the producer's checks come first"
    io.complete()
    assert got.one == C.NONE and held.got == [] and len(io.pending) == 1, "run again: its own record"
    io.complete()
    assert held.one == C.NONE
    io.auto = True
    assert end(c, r, True) == C.NONE
    c.add_partitions("t", r.producer_id, 0, [(1, 1)], held := Got())
    assert held.got == [], "PrepareCommit: held"
    assert add(c, stale, [(1, 1)]) == C.PRODUCER_FENCED, "the producer's checks come first"
    assert add(c, InitResult(C.NONE, r.producer_id + 1, 0), [(1, 1)]) == C.INVALID_PRODUCER_ID_MAPPING
    io.write_markers()
    assert held.one == C.NONE, "CompleteCommit: a new transaction"
    view = c.describe("t")
    assert isinstance(view, TxnView) and (view.state, view.partitions) == (S.ONGOING, ((1, 1),))


def test_a_transaction_holds_at_most_txn_partitions_max(coord: TransactionCoordinator) -> None:
    r = init(coord)
    assert add(coord, r, [(1, p) for p in range(TXN_PARTITIONS_MAX)]) == C.NONE
    assert add(coord, r, [(2, 0)]) == C.LIMIT_EXCEEDED


def test_an_add_while_the_last_transaction_completes_is_held_until_it_is_durable(loop: FakeLoop) -> None:
    """Kafka answers CONCURRENT_TRANSACTIONS here and the client asks again 20 ms later; the
    request is held instead and answered as that later ask would be, once CompleteCommit is
    durable, its own record after it."""
    io = FakeIO()
    c = make(loop, io)
    r = init(c)
    add(c, r, [(1, 0)])
    assert end(c, r, True) == C.NONE
    io.auto = False
    c.add_partitions("t", r.producer_id, 0, [(1, 1)], held := Got())
    c.add_offsets("t", r.producer_id, 0, "g", held_group := Got())
    io.write_markers()
    assert held.got == [] and state(c) == S.PREPARE_COMMIT, "CompleteCommit is not durable yet"
    io.complete()
    assert state(c) == S.COMPLETE_COMMIT and held.got == [], "its own record now"
    io.complete()
    assert held.one == C.NONE and held_group.got == []
    io.complete()
    assert held_group.one == C.NONE
    states = [(rec.state, rec.partitions, rec.groups) for _, rec in io.records(partition_for("t")) if rec]
    assert states[-3:] == [
        (S.COMPLETE_COMMIT, frozenset(), frozenset()),
        (S.ONGOING, frozenset({(1, 1)}), frozenset()),
        (S.ONGOING, frozenset({(1, 1)}), frozenset({"g"})),
    ]


def test_a_request_held_past_the_limit_is_concurrent(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io, hold_ms=1000)
    r = init(c)
    add(c, r, [(1, 0)])
    end(c, r, True)
    c.add_partitions("t", r.producer_id, 0, [(1, 1)], held := Got())
    c.init_producer_id("t", TIMEOUT_MS, held_init := Got())
    loop.advance(0.9)
    assert held.got == [] and held_init.got == []
    loop.advance(0.2)
    assert held.one == C.CONCURRENT_TRANSACTIONS
    assert held_init.one == InitResult(C.CONCURRENT_TRANSACTIONS)
    md = c.metadata("t")
    assert md is not None and md.held == []
    io.write_markers()
    assert len(held.got) == 1 and len(held_init.got) == 1, "answered once"
    assert state(c) == S.COMPLETE_COMMIT


def test_held_requests_of_an_unloaded_partition_are_not_coordinator(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io)
    r = init(c)
    add(c, r, [(1, 0)])
    end(c, r, True)
    c.add_partitions("t", r.producer_id, 0, [(1, 1)], held := Got())
    c.unload(partition_for("t"))
    assert held.one == C.NOT_COORDINATOR
    c.load(partition_for("t"), 6, load(io.log[partition_for("t")]))
    c.add_partitions("t", r.producer_id, 0, [(1, 1)], held := Got())
    c.close()
    assert held.one == C.NOT_COORDINATOR
    loop.advance(5)
    assert len(held.got) == 1


# ----------------------------------------------------------------------------- EndTxn


def test_commit_answers_once_prepared_then_markers_then_complete(loop: FakeLoop) -> None:
    io = FakeIO()
    c = make(loop, io)
    r = init(c)
    add(c, r, [(1, 0), (3, 2)])
    c.add_offsets("t", r.producer_id, r.producer_epoch, "g", Got())
    io.auto = False
    c.end_txn("t", r.producer_id, r.producer_epoch, True, got := Got())
    assert got.got == [] and io.markers == [] and state(c) == S.ONGOING
    io.complete()
    assert got.one == C.NONE and state(c) == S.PREPARE_COMMIT
    request = io.markers[0][0]
    assert request == MarkerRequest(
        "t", r.producer_id, 0, 5, True, frozenset({(1, 0), (3, 2)}), frozenset({"g"})
    )
    io.write_markers()
    assert state(c) == S.PREPARE_COMMIT, "CompleteCommit is not durable yet"
    io.complete()
    view = c.describe("t")
    assert isinstance(view, TxnView) and (view.state, view.partitions, view.groups) == (
        S.COMPLETE_COMMIT,
        (),
        (),
    )


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_retries_and_wrong_endings(coord: TransactionCoordinator, io: FakeIO, commit: bool) -> None:
    r = init(coord)
    assert end(coord, r, commit) == C.INVALID_TXN_STATE, "Empty: nothing to end"
    add(coord, r, [(1, 0)])
    assert end(coord, r, commit) == C.NONE
    assert end(coord, r, commit) == C.CONCURRENT_TRANSACTIONS, "the same ending, still preparing"
    assert end(coord, r, not commit) == C.INVALID_TXN_STATE
    io.write_markers()
    assert end(coord, r, commit) == C.NONE, "a retry of an ended transaction: the same answer"
    assert end(coord, r, not commit) == C.INVALID_TXN_STATE
    assert len(io.markers) == 0


def test_end_txn_producer_checks(coord: TransactionCoordinator, io: FakeIO) -> None:
    assert end(coord, InitResult(C.NONE, 9, 0), True) == C.INVALID_PRODUCER_ID_MAPPING
    r = init(coord)
    add(coord, r, [(1, 0)])
    assert end(coord, InitResult(C.NONE, r.producer_id + 1, 0), True) == C.INVALID_PRODUCER_ID_MAPPING
    assert end(coord, InitResult(C.NONE, r.producer_id, 1), True) == C.PRODUCER_FENCED
    assert (
        end(coord, InitResult(C.NONE, r.producer_id, 1), True, knows_fenced=False) == C.INVALID_PRODUCER_EPOCH
    )
    assert end(coord, r, True, txn_id="") == C.INVALID_REQUEST
    io.auto = False
    coord.end_txn("t", r.producer_id, 0, True, Got())
    assert end(coord, r, True) == C.CONCURRENT_TRANSACTIONS, "pending"


def test_a_failed_completion_is_tried_again(loop: FakeLoop) -> None:
    io = FakeIO()
    c = make(loop, io, retry_backoff_s=0)
    r = init(c)
    add(c, r, [(1, 0)])
    end(c, r, False)
    io.fail_with = C.COORDINATOR_NOT_AVAILABLE
    io.write_markers()
    assert state(c) == S.PREPARE_ABORT
    held = Got()
    c.init_producer_id("t", TIMEOUT_MS, held)  # waits for the completion, however it is tried
    assert held.got == []
    io.fail_with = None
    loop.advance(0.5)
    states = [rec.state for _, rec in io.records(partition_for("t")) if rec is not None]
    assert states[-2:] == [S.COMPLETE_ABORT, S.EMPTY]  # completed, then the held init ran
    again = held.one
    assert isinstance(again, InitResult) and again.code == C.NONE
    assert (again.producer_id, again.producer_epoch) == (r.producer_id, r.producer_epoch + 1)


# ----------------------------------------------------------------------------- timeouts and expiry


def test_a_transaction_past_its_timeout_is_aborted_with_an_epoch_bump(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io, abort_interval_ms=1000)
    c.start()
    r = init(c, timeout_ms=5000)
    add(c, r, [(1, 0)])
    loop.advance(4.5)
    assert state(c) == S.ONGOING and not io.markers
    loop.advance(2)
    assert state(c) == S.PREPARE_ABORT
    request = io.markers[0][0]
    assert (request.commit, request.producer_epoch, request.partitions) == (False, 1, frozenset({(1, 0)}))
    assert end(c, r, True) == C.PRODUCER_FENCED
    assert add(c, r, [(1, 1)]) == C.PRODUCER_FENCED
    c.init_producer_id("t", TIMEOUT_MS, got := Got(), expected=(r.producer_id, 0))
    assert got.got == [], "held while the abort completes"
    io.write_markers()
    assert state(c) == S.COMPLETE_ABORT
    assert got.one == InitResult(C.PRODUCER_FENCED), "then fenced, not bumped (TV1)"
    assert init(c, expected=(r.producer_id, 0)).code == C.PRODUCER_FENCED
    assert init(c).producer_epoch == 2
    c.close()


def test_a_timed_out_abort_that_failed_to_write_bumps_from_the_same_epoch(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io)
    r = init(c, timeout_ms=1000)
    add(c, r, [(1, 0)])
    loop.advance(2)
    io.fail_with = C.COORDINATOR_NOT_AVAILABLE
    c.abort_timed_out()
    assert state(c) == S.ONGOING and c.describe("t") == TxnView(
        "t", r.producer_id, 0, S.ONGOING, 1000, 1_000_000, ((1, 0),), ()
    )
    io.fail_with = None
    c.abort_timed_out()
    view = c.describe("t")
    assert isinstance(view, TxnView) and (view.state, view.producer_epoch) == (S.PREPARE_ABORT, 1)


def test_idle_ids_expire_with_a_tombstone(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io, id_expiration_ms=10_000, expiry_interval_ms=1000)
    c.start()
    r = init(c)
    init(c, "u")
    add(c, init(c, "u"), [(1, 0)], txn_id="u")  # Ongoing: never expires
    loop.advance(11)
    assert c.describe("t") == C.TRANSACTIONAL_ID_NOT_FOUND
    assert io.records(partition_for("t"))[-1] == ("t", None)
    assert state(c, "u") == S.ONGOING
    again = init(c)
    assert again.producer_id != r.producer_id and again.producer_epoch == 0
    c.close()


def test_an_expiry_pending_holds_init(loop: FakeLoop) -> None:
    io = FakeIO()
    c = make(loop, io, id_expiration_ms=0)
    r = init(c)
    io.auto = False
    c.expire_ids()
    c.init_producer_id("t", TIMEOUT_MS, got := Got())
    assert got.got == [] and len(io.pending) == 1
    io.fail()
    assert state(c) == S.EMPTY, "a tombstone not written forgets nothing"
    io.complete()  # the held init, run again: a bump of the id still there
    assert got.one == InitResult(C.NONE, r.producer_id, 1)
    c.expire_ids()
    c.init_producer_id("t", TIMEOUT_MS, got := Got())
    io.complete()  # the tombstone: the held init finds no id and makes one
    assert got.got == [] and c.describe("t") == C.TRANSACTIONAL_ID_NOT_FOUND
    io.complete()
    assert isinstance(got.one, InitResult) and got.one.producer_epoch == 0
    assert got.one.producer_id != r.producer_id


# ----------------------------------------------------------------------------- Describe / List


def test_describe_and_list(coord: TransactionCoordinator, loop: FakeLoop) -> None:
    a = init(coord, "a")
    b = init(coord, "b")
    add(coord, b, [(1, 0)], txn_id="b")
    loop.advance(10)
    assert coord.describe("") == C.INVALID_REQUEST
    assert coord.describe("zz") == C.TRANSACTIONAL_ID_NOT_FOUND
    everything = coord.list_transactions()
    assert everything == (
        [TxnListing("a", a.producer_id, S.EMPTY), TxnListing("b", b.producer_id, S.ONGOING)],
        [],
    )
    assert coord.list_transactions(states=["Ongoing", "Nope"]) == (
        [TxnListing("b", b.producer_id, S.ONGOING)],
        ["Nope"],
    )
    assert coord.list_transactions(producer_ids=[a.producer_id]) == (
        [TxnListing("a", a.producer_id, S.EMPTY)],
        [],
    )
    assert coord.list_transactions(min_duration_ms=10_000) == (
        [TxnListing("b", b.producer_id, S.ONGOING)],
        [],
    )
    assert coord.list_transactions(min_duration_ms=10_001) == ([], [])


# ----------------------------------------------------------------------------- loading and leadership


def test_a_loaded_partition_resends_the_markers_of_prepared_transactions(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io)
    p = partition_for("t")
    records = {
        "t": TxnRecord(
            50, 2, 50, 1, TIMEOUT_MS, S.PREPARE_COMMIT, frozenset({(4, 0)}), frozenset({"g"}), 10, 20
        ),
    }
    c.load(p, 9, records)
    assert io.write_markers() == MarkerRequest("t", 50, 2, 9, True, frozenset({(4, 0)}), frozenset({"g"}))
    assert state(c) == S.COMPLETE_COMMIT
    assert load(io.log[p]) == c.state_of(p)


def test_answers_waiting_when_leadership_moves_are_not_coordinator(loop: FakeLoop) -> None:
    io = FakeIO()
    c = make(loop, io)
    r = init(c)
    add(c, r, [(1, 0)])
    io.auto = False
    c.end_txn("t", r.producer_id, 0, True, got := Got())
    c.unload(partition_for("t"))
    io.complete()
    assert got.one == C.NOT_COORDINATOR and io.markers == []
    c.load(partition_for("t"), 6, load(io.log[partition_for("t")]))
    assert io.markers[0][0].coordinator_epoch == 6, "the next coordinator sends them"


def test_markers_written_after_a_reload_complete_nothing_stale(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io)
    r = init(c)
    add(c, r, [(1, 0)])
    end(c, r, True)
    p = partition_for("t")
    c.load(p, 6, load(io.log[p]))  # loaded again: the markers go again at epoch 6
    assert [m.coordinator_epoch for m, _ in io.markers] == [5, 6]
    io.write_markers(0)  # the old epoch's: ignored
    assert state(c) == S.PREPARE_COMMIT
    io.write_markers(0)
    assert state(c) == S.COMPLETE_COMMIT


def test_a_load_overtaken_by_a_newer_one_is_dropped(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io)
    c.begin_load(0, 7)
    c.begin_load(0, 8)
    c.complete_load(0, 7, {"x": TxnRecord(1, 0, -1, -1, 1000, S.EMPTY)})
    assert c.list_transactions() == C.COORDINATOR_LOAD_IN_PROGRESS
    c.complete_load(0, 8, {})
    assert c.state_of(0) == {}


# ----------------------------------------------------------------------------- the model

IDS = ("a", "b", "c")
PARTS = ((1, 0), (1, 1), (2, 0))


class TxnCoordinatorMachine(RuleBasedStateMachine):
    """Clients (a few per id, each holding the producer id and epoch it was last given) call in
    random order; appends and markers complete in any order or fail; the coordinator crashes and
    a new one loads what was written (records acknowledged, and some not yet). Checked: the
    coordinator's state is what its records say; one transaction at a time per id; an id's
    (producer id, epoch) only grows; a fenced producer never succeeds; the markers of a
    transaction go to exactly its partitions and groups; a request is held only while its id
    completes, and once everything under way has landed every request is answered."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = FakeLoop()
        self.io = FakeIO(auto=False)
        self.source = MemorySource()
        self.coord = self.fresh()
        self.commits_unanswered: set[tuple[str, int, int]] = set()  # PrepareCommit landed in a crash
        self.handed: dict[str, list[tuple[int, int]]] = {i: [] for i in IDS}  # pairs given, in order
        self.fenced: set[tuple[str, int, int]] = set()  # pairs another producer or a timeout fenced
        self.acked: dict[str, set[object]] = {i: set() for i in IDS}  # added and answered NONE
        self.tried: dict[str, set[object]] = {i: set() for i in IDS}  # added, whatever the answer
        self.open_markers: dict[str, MarkerRequest] = {}
        self.resend: dict[str, tuple[frozenset[object], bool]] = {}  # ending when a crash came
        self.decided: dict[tuple[str, int, int], bool] = {}  # EndTxn answered NONE: commit?
        # requests not answered yet (held, or waiting for their record): what each would add
        self.unanswered: dict[object, tuple[str, frozenset[object]]] = {}

    def fresh(self) -> TransactionCoordinator:
        c = TransactionCoordinator(
            self.io, ProducerIds(self.source, block_size=2), partition_for, self.loop.call_later,
            self.loop.clock_ms, abort_interval_ms=1000, id_expiration_ms=30_000,
        )  # fmt: skip
        for p in (0, 1):
            c.load(p, 0, load(self.io.log.get(p, [])))
        return c

    def note_markers(self) -> None:
        for request, _ in self.io.markers:
            txn_id = request.txn_id
            if self.open_markers.get(txn_id) is request:
                continue
            assert txn_id not in self.open_markers, "two transactions of one id ending at once"
            self.open_markers[txn_id] = request
            key = (txn_id, request.producer_id, request.producer_epoch)
            got: frozenset[object] = request.partitions | request.groups
            if txn_id in self.resend:  # sent again by the coordinator that loaded it
                assert self.resend.pop(txn_id) == (got, request.commit)
                continue
            assert self.acked[txn_id] <= got <= self.tried[txn_id], "markers for exactly its parts"
            md = self.coord.metadata(txn_id)
            assert md is not None and md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT) and md.pending is None
            assert (md.partitions | md.groups, md.state == S.PREPARE_COMMIT) == (got, request.commit)
            assert not request.commit or key in self.decided or key in self.commits_unanswered, (
                "a commit not asked"
            )
            self.acked[txn_id], self.tried[txn_id] = set(), self.still_asked(txn_id)
            self.commits_unanswered.discard(key)
            if key in self.decided:
                assert self.decided.pop(key) == request.commit

    def still_asked(self, txn_id: str) -> set[object]:
        """What requests not answered yet may still add to the id's next transaction (a held
        request runs against the state after the one ending now)."""
        return {x for i, asked in self.unanswered.values() if i == txn_id for x in asked}

    def asking(self, txn_id: str, asked: frozenset[object]) -> object:
        token = object()
        self.unanswered[token] = (txn_id, asked)
        return token

    def pair(self, data: st.DataObject, txn_id: str) -> tuple[int, int]:
        handed = self.handed[txn_id]
        kind = data.draw(st.integers(0, 7))
        if not handed or kind == 0:
            return data.draw(st.sampled_from([(5, 0), (7, 1)]))  # ids the coordinator never gives
        return data.draw(st.sampled_from(handed)) if kind == 1 else handed[-1]

    def check_success(self, txn_id: str, pair: tuple[int, int]) -> None:
        assert (txn_id, *pair) not in self.fenced, "a fenced producer succeeded"
        assert self.handed[txn_id] and pair == self.handed[txn_id][-1], (
            "only the last producer given succeeds"
        )
        md = self.coord.metadata(txn_id)
        assert md is not None and (md.producer_id, md.producer_epoch) == pair

    # ------------------------------------------------------------------------- client calls

    @rule(txn_id=st.sampled_from(IDS), data=st.data())
    def init(self, txn_id: str, data: st.DataObject) -> None:
        expected = self.pair(data, txn_id) if data.draw(st.booleans()) else None
        token = self.asking(txn_id, frozenset())

        def answered(r: InitResult) -> None:
            del self.unanswered[token]
            if r.code != C.NONE:
                return
            if expected is not None and r.producer_id == expected[0]:
                assert (txn_id, *expected) not in self.fenced, "a fenced producer recovered"
            else:
                self.fenced.update((txn_id, *p) for p in self.handed[txn_id])
            self.handed[txn_id].append((r.producer_id, r.producer_epoch))
            self.acked[txn_id], self.tried[txn_id] = set(), self.still_asked(txn_id)

        self.coord.init_producer_id(txn_id, 20_000, answered, expected=expected)
        self.maybe_land(data)

    @rule(
        txn_id=st.sampled_from(IDS),
        data=st.data(),
        parts=st.sets(st.sampled_from(PARTS), min_size=1, max_size=2),
    )
    def add_partitions(self, txn_id: str, data: st.DataObject, parts: set[tuple[int, int]]) -> None:
        pair = self.pair(data, txn_id)
        self.tried[txn_id] |= parts
        token = self.asking(txn_id, frozenset(parts))

        def answered(code: TxnCode) -> None:
            del self.unanswered[token]
            if code == C.NONE:
                self.check_success(txn_id, pair)
                assert txn_id not in self.open_markers, "a new transaction while the last one ends"
                self.acked[txn_id] |= parts

        self.coord.add_partitions(txn_id, *pair, parts, answered)
        self.maybe_land(data)

    @rule(txn_id=st.sampled_from(IDS), data=st.data(), group=st.sampled_from(["g", "h"]))
    def add_offsets(self, txn_id: str, data: st.DataObject, group: str) -> None:
        pair = self.pair(data, txn_id)
        self.tried[txn_id].add(group)
        token = self.asking(txn_id, frozenset({group}))

        def answered(code: TxnCode) -> None:
            del self.unanswered[token]
            if code == C.NONE:
                self.check_success(txn_id, pair)
                self.acked[txn_id].add(group)

        self.coord.add_offsets(txn_id, *pair, group, answered)
        self.maybe_land(data)

    @rule(txn_id=st.sampled_from(IDS), data=st.data(), commit=st.booleans())
    def end_txn(self, txn_id: str, data: st.DataObject, commit: bool) -> None:
        pair = self.pair(data, txn_id)
        md = self.coord.metadata(txn_id)
        ongoing = md is not None and md.state == S.ONGOING and md.pending is None

        def answered(code: TxnCode) -> None:
            if code == C.NONE:
                self.check_success(txn_id, pair)
                if ongoing:  # its markers are asked for next
                    self.decided[(txn_id, *pair)] = commit

        self.coord.end_txn(txn_id, *pair, commit, answered)
        self.note_markers()
        self.maybe_land(data)

    def maybe_land(self, data: st.DataObject) -> None:
        """Often, the append just asked for lands before anything else happens."""
        if self.io.pending and data.draw(st.integers(0, 3)) > 0:
            self.durable(self.io.pending.pop())

    # ------------------------------------------------------------------------- the world

    @precondition(lambda self: self.io.pending)
    @rule(data=st.data())
    def append_durable(self, data: st.DataObject) -> None:
        self.durable(self.io.pending.pop(data.draw(st.integers(0, len(self.io.pending) - 1))))

    @precondition(lambda self: self.io.pending or self.io.markers)
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        """Everything under way lands, in a random order, and what that starts too: a completion
        record whose append failed is under way too, tried again after RETRY_BACKOFF_S."""
        while True:
            while self.io.pending or self.io.markers:
                if self.io.pending and (not self.io.markers or data.draw(st.booleans())):
                    self.durable(self.io.pending.pop(data.draw(st.integers(0, len(self.io.pending) - 1))))
                else:
                    self.markers_written(data)
            if not (self.unanswered and self.loop.due_within(RETRY_BACKOFF_S)):
                break
            self.loop.advance(RETRY_BACKOFF_S)
            self.note_markers()
        assert not self.unanswered, "a request still held with nothing under way"

    def durable(self, a: Append) -> None:
        txn_id = decode_key(a.key)
        before = self.coord.metadata(txn_id)
        old = None if before is None or not before.durable else (before.producer_id, before.producer_epoch)
        self.io.write(a)
        new = decode_value(a.value)
        if (
            old is not None
            and new is not None
            and new.state == S.PREPARE_ABORT
            and new.producer_epoch > old[1]
        ):
            self.fenced.add((txn_id, *old))  # an epoch fence (a timeout, or InitProducerId on Ongoing)
        self.note_markers()

    @precondition(lambda self: self.io.pending)
    @rule(data=st.data())
    def append_fails(self, data: st.DataObject) -> None:
        self.io.fail(data.draw(st.integers(0, len(self.io.pending) - 1)))

    @precondition(lambda self: self.io.markers)
    @rule(data=st.data())
    def markers_written(self, data: st.DataObject) -> None:
        request = self.io.write_markers(data.draw(st.integers(0, len(self.io.markers) - 1)))
        if self.open_markers.get(request.txn_id) is request:
            del self.open_markers[request.txn_id]
        self.note_markers()

    @rule(seconds=st.sampled_from([0.5, 3.0, 25.0, 40.0]))
    def time_passes(self, seconds: float) -> None:
        self.loop.advance(seconds)
        self.coord.abort_timed_out()
        self.coord.expire_ids()
        self.note_markers()

    @precondition(lambda self: self.io.pending or self.io.markers)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """The coordinator's core dies: appends under way may or may not have landed (a prefix of
        each partition's, in append order), answers and markers under way are lost."""
        landed_prepared = set()
        for p in (0, 1):
            mine = [a for a in self.io.pending if a.partition == p]
            landed = data.draw(st.integers(0, len(mine)))
            for a in mine[:landed]:
                self.io.log.setdefault(p, []).append((a.key, a.value))
                r = decode_value(a.value)
                if r is not None and r.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                    landed_prepared.add(decode_key(a.key))
                if r is not None and r.state == S.PREPARE_COMMIT:
                    self.commits_unanswered.add((decode_key(a.key), r.producer_id, r.producer_epoch))
        # the transactions being ended before the crash: their markers were asked for already
        self.resend = {}
        for p in (0, 1):
            for txn_id, r in load(self.io.log.get(p, [])).items():
                if r.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT) and txn_id not in landed_prepared:
                    self.resend[txn_id] = (r.partitions | r.groups, r.state == S.PREPARE_COMMIT)
        self.io.pending.clear()
        self.io.markers.clear()
        self.open_markers.clear()
        self.coord.close()  # answers the held requests (NOT_COORDINATOR)
        self.unanswered.clear()  # the rest waited for appends lost in the crash: never answered
        self.coord = self.fresh()
        self.note_markers()

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def rebuilt_state_is_the_same(self) -> None:
        for p in (0, 1):
            assert load(self.io.log.get(p, [])) == self.coord.state_of(p)

    @invariant()
    def producers_only_grow(self) -> None:
        for p in (0, 1):
            last: dict[str, tuple[int, int]] = {}
            for key, value in self.io.log.get(p, []):
                txn_id, r = decode_key(key), decode_value(value)
                if r is None:
                    continue
                now = (r.producer_id, r.producer_epoch)
                assert now >= last.get(txn_id, (-1, -1)), (txn_id, last, now)
                last[txn_id] = now

    @invariant()
    def held_only_while_completing(self) -> None:
        for txn_id in IDS:
            md = self.coord.metadata(txn_id)
            if md is not None and md.held:
                assert md.pending is not None or md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT), md

    @invariant()
    def one_transaction_per_id(self) -> None:
        for txn_id in IDS:
            md = self.coord.metadata(txn_id)
            if md is None:
                assert txn_id not in self.open_markers
                continue
            prepared = md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)
            assert prepared or md.state == S.ONGOING or not md.partitions | md.groups, md
            if txn_id in self.open_markers:
                assert md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT), md


TxnCoordinatorMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTxnCoordinatorModel = TxnCoordinatorMachine.TestCase


def test_holding_names_the_open_transactions_partitions_of_producer_ids(
    coord: TransactionCoordinator, io: FakeIO
) -> None:
    """What the hanging-transaction sweep asks (broker/core/txn_sweep.py)."""
    a, b = init(coord, "a"), init(coord, "b")
    assert coord.holding([a.producer_id, b.producer_id, 999]) == {}  # Empty: nothing open
    add(coord, a, [(1, 0), (2, 3)], txn_id="a")
    assert coord.holding([a.producer_id, 999]) == {a.producer_id: frozenset({(1, 0), (2, 3)})}
    io.auto = False
    coord.end_txn("a", a.producer_id, a.producer_epoch, True, Got())
    coord.add_partitions("b", b.producer_id, b.producer_epoch, [(5, 5)], Got())
    # a's PrepareCommit and b's first partition are being written: a change under way
    assert coord.holding([a.producer_id, b.producer_id]) == {a.producer_id: None, b.producer_id: None}
    io.complete()
    assert coord.holding([a.producer_id])[a.producer_id] == frozenset({(1, 0), (2, 3)})  # type: ignore[index]
    io.write_markers()
    io.complete(0)
    io.complete(0)
    assert coord.holding([a.producer_id, b.producer_id]) == {b.producer_id: frozenset({(5, 5)})}


def test_holding_cannot_tell_while_a_partition_loads(loop: FakeLoop, io: FakeIO) -> None:
    c = make(loop, io)
    c.begin_load(7, 0)
    assert c.holding([1]) is None
