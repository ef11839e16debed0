"""Random delivery histories of one partition on DeliveryState, against a model broker and network.

The machine is driven as broker/client/sender.py drives it (seal, pump, answers, the lone-record
lane, round ends after a backoff), with the clock passed in. Its batches go to a model of the
network and the broker:
- The broker keeps the rule of docs/PROTOCOL.md §4.7 (as broker/core/producer_state.py does): per
  producer id, its epoch and last 5 batches; a new producer or a higher epoch starts at sequence
  0 (a producer it holds nothing of, elsewhere: UNKNOWN_PRODUCER_ID), a lower epoch is refused, a
  batch equal to one of the last 5 is a duplicate answered with its first offset, anything else
  must follow the last one or is OUT_OF_ORDER_SEQUENCE. A "poison"
  batch (what a broker refuses for its content: too large, corrupt) is always refused, and any
  request may be refused with a retriable code (NOT_OWNER, STORAGE_ERROR: nothing appended).
  Now and then retention deletes the whole log, and the producer's state with it.
- Connections deliver requests in order and answer in order; a lost connection fails every
  request it carried, those the broker appended included. A re-route leaves the old connection
  behind with requests the broker never sees (an isolated leader) until it is lost.

What must hold (the rules of broker/client/idempotence.py and what idempotence promises):
- the log holds no record twice, and the partition's batches in seal order;
- an acknowledged batch is in the log at the offset its answer gave; no batch is resolved twice;
- a batch given up as certainly not appended (refused, out of sequence), or whose sequences are
  taken back, is not in the log; an acknowledgement settles the batches of unknown fate before it;
- a batch's bytes change only while the broker holds none of its records, and the first batch of
  a new producer id or epoch has sequence 0;
- at most `max_in_flight` batches in flight, one until the epoch is confirmed; the batches in
  flight are exactly those with a request out;
- the broker never disagrees with the machine (no new epoch forced by an unexplained
  OUT_OF_ORDER_SEQUENCE): one that forgot the producer says so (UNKNOWN_PRODUCER_ID), and the
  machine resends in a new epoch, failing no batch for it;
- once faults stop, every batch is resolved and the machine is left holding nothing.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections import deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker.client.accumulator import ProducerBatch, record_size
from broker.client.idempotence import (
    EPOCH_MAX,
    IDEMPOTENT_IN_FLIGHT_MAX,
    SEQUENCE_MAX,
    DeliveryState,
    Failure,
    Verdict,
)
from ringlog_proto.batch import BatchHeader, read_header

PRODUCER_ID = 1 << 50
KEPT = IDEMPOTENT_IN_FLIGHT_MAX  # batches per producer the broker remembers
OUT_OF_ORDER = "out of order"
UNKNOWN_PRODUCER = "unknown producer"


@dataclass
class Request:
    batch: ProducerBatch
    header: BatchHeader  # as written on the wire
    values: tuple[bytes, ...]


@dataclass
class Connection:
    to_broker: deque[Request] = field(default_factory=deque)  # written, not yet read by the broker
    answers: deque[tuple[Request, int | Failure]] = field(default_factory=deque)  # read, answered
    stale: bool = False  # left behind by a re-route: the broker reads nothing more from it

    def requests(self) -> list[Request]:
        return [r for r, _ in self.answers] + list(self.to_broker)


class Broker:
    """One partition's log and its idempotent producers (no sequences without idempotence)."""

    def __init__(self, idempotent: bool) -> None:
        self.idempotent = idempotent
        self.log: list[bytes] = []
        self.batch_of: list[int] = []  # per record: the seal order of its batch
        self.start = 0  # retention deleted the records below
        self.producers: dict[int, tuple[int, deque[tuple[int, int, int]]]] = {}

    def held(self) -> list[int]:
        """The seal order of the batch of each record the log still holds."""
        return self.batch_of[self.start :]

    def retention(self) -> None:
        """Retention deletes every record, and with the batches the producers' state goes (it
        lives as long as the batches carrying it)."""
        self.start = len(self.log)
        self.producers.clear()

    def produce(self, r: Request) -> int | str:
        h = r.header
        if self.idempotent:
            last = h.base_sequence + h.record_count - 1
            state = self.producers.get(h.producer_id)
            if state is None or h.producer_epoch > state[0]:
                if h.base_sequence != 0:
                    return UNKNOWN_PRODUCER if state is None else OUT_OF_ORDER
                state = self.producers[h.producer_id] = (h.producer_epoch, deque(maxlen=KEPT))
            elif h.producer_epoch < state[0]:
                return OUT_OF_ORDER  # fenced: the broker answers it as any sequence error
            else:
                for first, end, offset in state[1]:
                    if (first, end) == (h.base_sequence, last):
                        return offset
                want = state[1][-1][1] + 1 if state[1] else 0
                if h.base_sequence != want:
                    return OUT_OF_ORDER
            state[1].append((h.base_sequence, last, len(self.log)))
        offset = len(self.log)
        self.log.extend(r.values)
        self.batch_of.extend([r.batch.order] * len(r.values))
        return offset


class DeliveryMachine(RuleBasedStateMachine):
    @initialize(
        idempotent=st.booleans() | st.just(True),
        max_in_flight=st.integers(1, IDEMPOTENT_IN_FLIGHT_MAX),
        retries=st.sampled_from([None, 0, 1, 3]),
        late_sequence=st.booleans(),
        late_epoch=st.booleans(),
    )
    def start(
        self, idempotent: bool, max_in_flight: int, retries: int | None, late_sequence: bool, late_epoch: bool
    ) -> None:
        self.now = 0.0
        self.ids = itertools.count(PRODUCER_ID + 1)
        epoch = EPOCH_MAX if late_epoch else 0
        self.st = DeliveryState(
            PRODUCER_ID if idempotent else -1,
            epoch if idempotent else -1,
            idempotent=idempotent,
            max_in_flight=max_in_flight,
            retries=retries,
            new_producer_id=lambda: next(self.ids),
        )
        self.idempotent = idempotent
        self.broker = Broker(idempotent)
        if idempotent and late_sequence:
            # As if the producer had sent all but the last few sequence numbers: a new epoch is near.
            start = SEQUENCE_MAX - 4
            self.st.next_seq = start
            self.broker.producers[PRODUCER_ID] = (epoch, deque([(start - 1, start - 1, -1)], maxlen=KEPT))
        self.epochs_seen = {(PRODUCER_ID, epoch)}
        self.connections: list[Connection] = [Connection()]
        self.backoff = False
        self.batches: list[tuple[ProducerBatch, list[concurrent.futures.Future[object]]]] = []
        self.poison: set[int] = set()  # seal orders of batches the broker refuses for their content
        self.values: dict[int, tuple[bytes, ...]] = {}
        self.wire: dict[int, tuple[int, int, int]] = {}  # seal order -> (producer id, epoch, seq) last sent
        self.resolved: dict[int, list[tuple[str, int | Failure | None]]] = {}
        self.new_epochs = 0
        self.values_made = itertools.count()

    # ------------------------------------------------------------------------- the sender's part

    @property
    def current(self) -> Connection | None:
        c = self.connections[-1] if self.connections else None
        return None if c is None or c.stale else c

    def new_batch(self, count: int, life: float) -> ProducerBatch:
        b = ProducerBatch(0, self.now, self.now + life)
        for _ in range(count):
            v = b"%d" % next(self.values_made)
            b.add(v, record_size(v, None), concurrent.futures.Future(), None)
        self.batches.append((b, list(b.futures)))
        return b

    def send(self, b: ProducerBatch) -> None:
        conn = self.current
        assert conn is not None and b.data is not None
        h = read_header(bytes(b.data))
        key = (h.producer_id, h.producer_epoch, h.base_sequence)
        if self.idempotent:
            assert h.base_sequence == b.seq and h.producer_id == self.st.producer_id
            if (h.producer_id, h.producer_epoch) not in self.epochs_seen:
                self.epochs_seen.add((h.producer_id, h.producer_epoch))
                assert h.base_sequence == 0, f"a new epoch starts at sequence {h.base_sequence}"
            prev = self.wire.get(b.order)
            if prev is not None and prev != key:
                assert b.order not in self.broker.held(), "renumbered a batch the broker holds"
        self.wire[b.order] = key
        self.values.setdefault(b.order, tuple(b.records))  # type: ignore[arg-type]
        conn.to_broker.append(Request(b, h, tuple(b.records)))  # type: ignore[arg-type]

    def pump(self) -> None:
        """Sender._pump without the open batch, the write buffer and the connect task."""
        st_ = self.st
        if st_.recovering:
            if st_.inflight:
                return
            epoch, seq = (st_.producer_id, st_.epoch), st_.next_seq
            if st_.end_round():
                self.backoff = True
            if (st_.producer_id, st_.epoch) != epoch:
                event("round ended in a new epoch")
            elif st_.next_seq < seq:
                event("round ended taking sequences back")
        if self.backoff:
            return
        while st_.may_send():
            if not st_.queue:
                return
            b = st_.queue[0]
            if self.now >= b.deadline:
                while (x := st_.pop_expired(self.now)) is not None:
                    self.finish(x, "expired", None)
                continue
            if self.current is None:
                return
            epoch = (st_.producer_id, st_.epoch)
            if not st_.number(b):
                event("numbering waits for the epoch's batches in flight")
                return
            if (st_.producer_id, st_.epoch) != epoch:
                event("sequences ran out: a new epoch")
            assert st_.dequeue() is b
            st_.sent(b)
            self.send(b)

    def finish(self, b: ProducerBatch, how: str, detail: int | Failure | None) -> None:
        self.resolved.setdefault(b.order, []).append((how, detail))
        if how == "acked":
            b.complete("t", 0, detail)  # type: ignore[arg-type]
        else:
            b.fail(RuntimeError(how))

    def answer(self, r: Request, outcome: int | Failure) -> None:
        b = r.batch
        if isinstance(outcome, int):
            if any(x.order < b.order for x in self.st.unknown):
                event("an acknowledgement settles batches of unknown fate")
            assert self.st.acknowledged(b)
            # It settles the batches given up before it with unknown fate: they were appended.
            assert all(x.order > b.order for x in self.st.unknown)
            self.finish(b, "acked", outcome)
        else:
            verdict = self.st.failed_attempt(b, outcome, self.now)
            assert verdict is not None
            if verdict is Verdict.NEW_EPOCH:
                self.new_epochs += 1
            event(f"{outcome.name} -> {verdict.name}")
            if verdict is not Verdict.RETRY:
                self.finish(b, verdict.name, outcome)
        self.pump()

    # ------------------------------------------------------------------------- rules

    @rule(count=st.integers(1, 3), life=st.sampled_from([2.0, 5.0, 1e9]), poison=st.booleans())
    def seal(self, count: int, life: float, poison: bool) -> None:
        b = self.new_batch(count, life)
        self.st.seal(b)
        if poison and count == 3:  # now and then
            self.poison.add(b.order)
        self.pump()

    @precondition(lambda self: self.current is not None and not self.backoff)
    @rule(life=st.sampled_from([2.0, 1e9]))
    def send_alone(self, life: float) -> None:
        """Producer._send_alone: one record encoded with `next_seq` and written at once."""
        st_ = self.st
        if not st_.lane_open():
            return
        b = self.new_batch(1, life)
        if self.idempotent:
            b.encode(st_.producer_id, st_.epoch, st_.next_seq)
        else:
            b.encode(-1, -1, -1)
        st_.sent_alone(b)
        st_.sent(b)
        self.send(b)

    @precondition(lambda self: self.current is not None and self.current.to_broker)
    @rule(fault=st.sampled_from(["none", "none", "none", "retriable"]))
    def broker_reads(self, fault: str) -> None:
        conn = self.current
        assert conn is not None
        r = conn.to_broker.popleft()
        outcome: int | Failure
        if r.batch.order in self.poison:
            outcome = Failure.REFUSED
        elif fault == "retriable":
            outcome = Failure.RETRIABLE
        else:
            got = self.broker.produce(r)
            sequence_errors = {OUT_OF_ORDER: Failure.OUT_OF_ORDER, UNKNOWN_PRODUCER: Failure.UNKNOWN_PRODUCER}
            outcome = sequence_errors.get(got, got)  # type: ignore[call-overload]
            if isinstance(outcome, Failure) and not self.idempotent:
                raise AssertionError("no sequences without idempotence")
        conn.answers.append((r, outcome))

    @precondition(lambda self: any(c.answers for c in self.connections))
    @rule(data=st.data())
    def answer_arrives(self, data: st.DataObject) -> None:
        conn = data.draw(st.sampled_from([c for c in self.connections if c.answers]))
        r, outcome = conn.answers.popleft()
        self.answer(r, outcome)

    @precondition(lambda self: self.connections)
    @rule(data=st.data())
    def connection_lost(self, data: st.DataObject) -> None:
        conn = data.draw(st.sampled_from(self.connections))
        self.connections.remove(conn)
        for r in conn.requests():
            self.answer(r, Failure.RETRIABLE)

    @precondition(lambda self: self.current is None)
    @rule()
    def connect(self) -> None:
        self.connections.append(Connection())
        self.pump()

    @precondition(lambda self: self.current is not None and not self.current.answers)
    @rule()
    def reroute(self) -> None:
        """The partition's requests go to a new connection; the broker never reads what the
        old one still carries (its leader was cut off), which waits until that one is lost."""
        assert self.current is not None
        self.current.stale = True
        self.connections.append(Connection())
        self.pump()

    @precondition(
        lambda self: (
            self.current
            and self.current.to_broker
            and not self.current.answers
            and self.st.may_send()
            and not (self.st.recovering or self.backoff)
        )
    )
    @rule(count=st.integers(1, 3))
    def reroute_and_overtake(self, count: int) -> None:
        """A re-route while batches are still on the old connection, and a new batch that
        reaches the broker, and is answered, before them (the rules above, in an order they
        rarely take)."""
        self.reroute()
        self.seal(count, 1e9, poison=False)
        conn = self.current
        assert conn is not None
        while conn.to_broker:
            self.broker_reads("none")
        while conn.answers and conn is self.current:
            r, outcome = conn.answers.popleft()
            self.answer(r, outcome)

    @precondition(lambda self: self.idempotent and self.broker.log)
    @rule(roll=st.integers(0, 4))
    def retention(self, roll: int) -> None:
        """Now and then, retention takes the whole log and with it the producer's state (as an
        idle spell past the producer id expiration would): its next batch is UNKNOWN_PRODUCER_ID."""
        if roll == 0:
            self.broker.retention()

    @precondition(lambda self: self.backoff)
    @rule()
    def backoff_done(self) -> None:
        self.backoff = False
        self.pump()

    @rule()
    def tick(self) -> None:
        self.now += 1
        self.pump()

    # ------------------------------------------------------------------------- invariants

    @invariant()
    def in_flight_is_bounded_and_matches_the_network(self) -> None:
        st_ = self.st
        assert len(st_.inflight) <= st_.max_in_flight
        if not st_.confirmed:
            assert len(st_.inflight) <= 1
        out = [r.batch for c in self.connections for r in c.requests()]
        assert sorted(b.order for b in out) == sorted(b.order for b in st_.inflight)

    @invariant()
    def batches_whose_sequences_are_taken_back_were_not_appended(self) -> None:
        held = set(self.broker.held())
        assert not any(x.order in held for x in self.st.released)

    @invariant()
    def each_batch_resolved_at_most_once(self) -> None:
        for order, outcomes in self.resolved.items():
            assert len(outcomes) == 1, (order, outcomes)

    @invariant()
    def acknowledged_batches_are_where_their_answer_says(self) -> None:
        for order, outcomes in self.resolved.items():
            how, offset = outcomes[0]
            if how == "acked" and offset >= self.broker.start:  # type: ignore[operator]
                vals = self.values[order]
                assert tuple(self.broker.log[offset : offset + len(vals)]) == vals  # type: ignore[operator]

    @invariant()
    def batches_known_not_appended_are_not(self) -> None:
        for order, outcomes in self.resolved.items():
            how, failure = outcomes[0]
            if how in ("GIVE_UP", "NEW_EPOCH") and failure in (
                Failure.REFUSED,
                Failure.OUT_OF_ORDER,
                Failure.UNKNOWN_PRODUCER,
            ):
                assert order not in self.broker.held(), (order, outcomes)

    @invariant()
    def the_log_holds_each_record_once_in_seal_order(self) -> None:
        if not self.idempotent:
            return  # retries may write a batch twice, and reorder batches
        log = self.broker.log[self.broker.start :]
        assert len(set(log)) == len(log), "a record written twice"
        orders = self.broker.held()
        assert all(a <= b for a, b in itertools.pairwise(orders)), orders

    @invariant()
    def the_broker_never_disagrees(self) -> None:
        assert self.new_epochs == 0

    def teardown(self) -> None:
        """Faults stop: every batch is resolved and the machine is left holding nothing."""
        if not hasattr(self, "st"):
            return
        self.settle()
        st_ = self.st
        assert not (st_.queue or st_.inflight or st_.failed or st_.recovering), "the machine is stuck"
        assert {b.order for b, _ in self.batches} == set(self.resolved), "a batch never resolved"
        self.each_batch_resolved_at_most_once()
        self.acknowledged_batches_are_where_their_answer_says()
        self.batches_known_not_appended_are_not()
        self.the_log_holds_each_record_once_in_seal_order()
        self.the_broker_never_disagrees()
        for _, futures in self.batches:
            assert all(f.done() for f in futures)

    def settle(self) -> None:
        """Connect, deliver, answer and back off until nothing moves (bounded: a machine that
        keeps sending forever fails the checks after it)."""
        for _ in range(10_000):
            for conn in [c for c in self.connections if c.stale]:
                self.connections.remove(conn)
                for r in conn.requests():
                    self.answer(r, Failure.RETRIABLE)
            if self.current is None:
                self.connect()
            conn = self.current
            assert conn is not None
            if conn.to_broker:
                self.broker_reads("none")
            elif conn.answers:
                r, outcome = conn.answers.popleft()
                self.answer(r, outcome)
            elif self.backoff:
                self.backoff_done()
            else:
                self.pump()
                if not conn.to_broker:
                    return


DeliveryMachine.TestCase.settings = settings(
    max_examples=400,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDeliveryModel = DeliveryMachine.TestCase


def test_an_appended_batch_given_up_is_never_renumbered_over() -> None:
    """Batch 1 is appended but its answer is lost, batch 2 never reaches the broker; both are
    given up with unknown fate (retries=0 here; the delivery timeout during an outage does the
    same). Batch 3's OUT_OF_ORDER_SEQUENCE shows that not all of them were appended, not that
    none was: renumbered from batch 1's sequence, batch 3 matches batch 1's record in the broker,
    which answers it as a duplicate with batch 1's offset."""
    machine = DeliveryMachine()
    machine.start(idempotent=True, max_in_flight=5, retries=0, late_sequence=False, late_epoch=False)
    st_, broker = machine.st, machine.broker

    def send_one() -> tuple[ProducerBatch, Request]:
        b = machine.new_batch(1, 1e9)
        st_.seal(b)
        assert st_.number(b) and st_.dequeue() is b
        st_.sent(b)
        machine.send(b)
        conn = machine.current
        assert conn is not None
        return b, conn.to_broker.popleft()

    b0, r0 = send_one()
    assert broker.produce(r0) == 0 and st_.acknowledged(b0)
    b1, r1 = send_one()
    assert broker.produce(r1) == 1  # appended; the connection is lost before the answer
    assert st_.failed_attempt(b1, Failure.RETRIABLE, 0) is Verdict.GIVE_UP
    st_.end_round()
    b2, _ = send_one()  # lost before the broker reads it
    assert st_.failed_attempt(b2, Failure.RETRIABLE, 0) is Verdict.GIVE_UP
    st_.end_round()
    b3, r3 = send_one()
    value = r3.values
    assert broker.produce(r3) == OUT_OF_ORDER  # the broker expects batch 2's sequence
    assert st_.failed_attempt(b3, Failure.OUT_OF_ORDER, 0) is Verdict.RETRY
    assert st_.end_round() == [b3]
    assert st_.number(b3) and st_.dequeue() is b3
    st_.sent(b3)
    retry = Request(b3, read_header(bytes(b3.data)), value)  # type: ignore[arg-type]
    got = broker.produce(retry)
    assert isinstance(got, int), "refused: an honest failure, not a false acknowledgement"
    assert st_.acknowledged(b3)
    assert tuple(broker.log[got : got + 1]) == value, "acknowledged at another batch's offset"


def test_a_forgotten_producer_resends_its_batch_in_a_new_epoch() -> None:
    """The broker forgot the producer after its last acknowledged batch (an idle spell past the
    producer id expiration): the next batch's UNKNOWN_PRODUCER_ID moves the partition to a new
    epoch and the batch is resent from sequence 0, stored once, failed never."""
    machine = DeliveryMachine()
    machine.start(idempotent=True, max_in_flight=5, retries=0, late_sequence=False, late_epoch=False)
    st_, broker = machine.st, machine.broker

    def send(b: ProducerBatch) -> Request:
        assert st_.number(b) and st_.dequeue() is b
        st_.sent(b)
        machine.send(b)
        conn = machine.current
        assert conn is not None
        return conn.to_broker.popleft()

    b0 = machine.new_batch(1, 1e9)
    st_.seal(b0)
    assert broker.produce(send(b0)) == 0 and st_.acknowledged(b0)
    broker.producers.clear()  # forgotten: the log keeps its batch
    b1 = machine.new_batch(2, 1e9)
    st_.seal(b1)
    assert broker.produce(send(b1)) == UNKNOWN_PRODUCER
    assert st_.failed_attempt(b1, Failure.UNKNOWN_PRODUCER, 0) is Verdict.RETRY
    assert st_.end_round() == [b1]
    assert broker.produce(send(b1)) == 1 and st_.acknowledged(b1)
    assert (st_.epoch, b1.seq) == (1, 0), "a new epoch, the batch at sequence 0"
    assert broker.log == [b"0", b"1", b"2"]
