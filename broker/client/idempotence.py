"""The delivery state of one partition's batches, as a pure machine: rounds, sequences, epochs.

Rules this module keeps:
- No I/O, no event loop, no clock, no log: the sender feeds it events (a batch sealed, sent,
  acknowledged, failed; the time, passed in) and acts on its answers. A new producer id comes
  from a function given at construction.
- Batches are numbered in seal order (`ProducerBatch.order`) and sent in that order; a batch is
  numbered and encoded once, when first sent, and every retry resends those bytes. Only a batch
  the broker certainly did not append may lose its numbers (`reset_encoding`) and be numbered
  again, and only at the end of a round.
- Until the broker has acknowledged a batch of the current producer id and epoch, one batch is
  in flight (`confirmed`): the broker takes *any* first sequence from a producer it does not
  know, so a second batch could land before a first one that failed and had to be retried:
  records reordered, and the retry stranded as out of sequence.
- A failure opens a *round*: nothing new is sent until every batch in flight has answered;
  then (`end_round`) the failed batches go back to the head of the queue in seal order, renumbered
  if batches before them were given up unappended, or in a new epoch if the broker and this
  state disagreed.
- A batch given up is recorded by what the broker may have done with it: `released` (it
  certainly did not append it: the sequences after it are taken back when the round ends) or
  `unknown` (it may have: the next answers of the partition tell; a later batch's success means
  it was appended, a later batch's OUT_OF_ORDER_SEQUENCE with nothing else to explain it that the
  last such batch was not — only that one, as the broker appends in sequence order).
- The epoch is per partition, as the broker's producer state is. Sequence numbers that would pass
  `SEQUENCE_MAX` start a new epoch, and an epoch past `EPOCH_MAX` a new producer id. A
  transactional producer's id and epoch are its coordinator's (`restart`), never made up here.
- UNKNOWN_PRODUCER_ID (the partition forgot the producer: its batches deleted, or idle past the
  broker's producer id expiration) for the oldest batch not acknowledged, with nothing before it
  in doubt, is no disagreement: that batch is resent in a new epoch, not failed, as librdkafka
  does ("no risk of duplication/reordering"). Elsewhere it is judged as OUT_OF_ORDER_SEQUENCE.

Without idempotence there are no sequences (`seq` stays -1, batches are encoded without a
producer id), but rounds still hold new batches back behind a failed one.
"""

from __future__ import annotations

import enum
import secrets
from collections import deque
from collections.abc import Callable
from typing import Final

from broker.client.accumulator import ProducerBatch
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT

SEQUENCE_MAX: Final = (1 << 31) - 1  # base_sequence is an i32
EPOCH_MAX: Final = (1 << 15) - 1  # producer_epoch is an i16
# Batches per producer the broker remembers for dedupe (`broker/core/producer_state.py`): more in
# flight and a retry could come after its original left the broker's memory, and be written twice.
IDEMPOTENT_IN_FLIGHT_MAX: Final = 5


def random_producer_id() -> int:
    """A producer id picked at random above the broker's own (`BROKER_PRODUCER_ID_LIMIT`): two
    producers share one with odds of about n**2 / 2**64 among n producers, never with a Kafka
    client's broker-assigned id."""
    return BROKER_PRODUCER_ID_LIMIT + secrets.randbelow((1 << 63) - BROKER_PRODUCER_ID_LIMIT)


class Failure(enum.Enum):
    """What a failed attempt says about the batch, as the sender classifies its error."""

    OUT_OF_ORDER = enum.auto()  # OUT_OF_ORDER_SEQUENCE (idempotent only): certainly not appended
    UNKNOWN_PRODUCER = enum.auto()  # UNKNOWN_PRODUCER_ID (idempotent only): not appended either
    RETRIABLE = enum.auto()  # a retriable error code or a lost connection: it may have been appended
    REFUSED = enum.auto()  # any other error response: certainly not appended, and never will be


class Verdict(enum.Enum):
    """What becomes of a failed batch."""

    RETRY = enum.auto()  # held until the round ends, then resent with the same bytes
    GIVE_UP = enum.auto()  # failed for good
    NEW_EPOCH = enum.auto()  # failed for good: an OUT_OF_ORDER_SEQUENCE nothing explains, so the
    # broker's state and ours disagree; the partition moves to a new epoch when the round ends


class DeliveryState:
    """The batches of one partition from sealed to answered, and its producer id, epoch and
    sequences. Owned by the producer's event loop (`broker/client/sender.py` drives it)."""

    __slots__ = (
        "acked_order",
        "confirmed",
        "epoch",
        "failed",
        "idempotent",
        "inflight",
        "max_in_flight",
        "new_producer_id",
        "next_order",
        "next_seq",
        "producer_id",
        "queue",
        "recovering",
        "released",
        "reset_epoch",
        "retries",
        "transactional",
        "unknown",
    )

    def __init__(
        self,
        producer_id: int,
        epoch: int,
        *,
        idempotent: bool,
        max_in_flight: int,
        retries: int | None,
        new_producer_id: Callable[[], int] = random_producer_id,
    ) -> None:
        self.idempotent = idempotent
        self.transactional = False  # a transactional producer's batches carry the attribute
        self.max_in_flight = max_in_flight
        self.retries = retries  # retries per batch; None: bounded only by its deadline
        self.new_producer_id = new_producer_id
        self.queue: deque[ProducerBatch] = deque()  # sealed, to send (retries first)
        self.inflight: deque[ProducerBatch] = deque()  # sent, unanswered, in send order
        self.failed: list[ProducerBatch] = []  # to retry when the round ends
        self.recovering = False  # a batch failed: send nothing new until in-flight drains
        self.next_order = 0
        self.producer_id = producer_id
        self.epoch = epoch
        self.next_seq = 0
        self.released: list[ProducerBatch] = []  # given up, known not appended: free their sequences
        self.unknown: list[ProducerBatch] = []  # given up, fate unknown
        self.reset_epoch = False
        # Whether the broker has acknowledged a batch of this producer id and epoch (see the module).
        self.confirmed = not idempotent
        # The latest batch (seal order) the broker acknowledged in this producer id and epoch: every
        # batch of the epoch before it was appended too, whatever its own answer said.
        self.acked_order = -1

    # ------------------------------------------------------------------------- questions

    def may_send(self) -> bool:
        """Whether one more batch may go in flight now (a round still open aside)."""
        inflight = self.inflight
        return len(inflight) < self.max_in_flight and (self.confirmed or not inflight)

    def lane_open(self) -> bool:
        """Whether a lone one-record batch may be sent at once, numbered `next_seq` (`sent_alone`):
        nothing queued or being retried, room in flight, and no new epoch needed."""
        inflight = self.inflight  # `may_send` written out: a one-at-a-time caller's every send
        return (
            not self.queue
            and not self.recovering
            and len(inflight) < self.max_in_flight
            and (self.confirmed or not inflight)
            and self.next_seq <= SEQUENCE_MAX
        )

    # ------------------------------------------------------------------------- events

    def seal(self, b: ProducerBatch) -> None:
        """`b` takes no more records: it goes to the back of the queue, in seal order."""
        b.order = self.next_order
        self.next_order += 1
        self.queue.append(b)

    def number(self, b: ProducerBatch) -> bool:
        """Give the head of the queue, `b`, its sequence and bytes if it has none yet (a retry
        keeps its own). False: it must wait until nothing is in flight, its sequences passing
        `SEQUENCE_MAX` (a new epoch must not overtake batches of the old one)."""
        if b.data is not None:
            return True
        if not self.idempotent:
            b.encode(-1, -1, -1)
            return True
        if self.next_seq + len(b) - 1 > SEQUENCE_MAX:
            if self.inflight:
                return False
            self._next_epoch()
        b.seq = self.next_seq
        self.next_seq += len(b)
        b.encode(self.producer_id, self.epoch, b.seq, self.transactional)
        return True

    def dequeue(self) -> ProducerBatch:
        """The head of the queue leaves it to be written (then `sent`, unless acks=0 succeeds)."""
        return self.queue.popleft()

    def sent(self, b: ProducerBatch) -> None:
        """`b` was written and awaits its answer."""
        self.inflight.append(b)

    def sent_alone(self, b: ProducerBatch) -> None:
        """`b`, one record, was encoded with sequence `next_seq` and written while `lane_open`,
        without passing through the queue: it takes its place in seal and sequence order."""
        b.order = self.next_order
        self.next_order += 1
        if self.idempotent:
            b.seq = self.next_seq
            self.next_seq += 1

    def acknowledged(self, b: ProducerBatch) -> bool:
        """`b` was appended. False: it was not in flight (the state was cleared meanwhile)."""
        try:
            self.inflight.remove(b)
        except ValueError:
            return False
        self.confirmed = True
        if b.order > self.acked_order:
            self.acked_order = b.order
        if self.unknown:  # a later batch fit the broker's sequence: earlier ones were appended
            self.unknown = [x for x in self.unknown if x.order > b.order]
        return True

    def failed_attempt(self, b: ProducerBatch, failure: Failure, now: float) -> Verdict | None:
        """`b`'s attempt failed at time `now`. None: it was not in flight (cleared meanwhile).
        A batch given up is recorded (`released` or `unknown`); the caller fails its records."""
        try:
            self.inflight.remove(b)
        except ValueError:
            return None
        retry: bool
        known_refused: bool  # the broker certainly did not append this batch
        new_epoch = False
        if failure is Failure.OUT_OF_ORDER or failure is Failure.UNKNOWN_PRODUCER:
            known_refused = True
            earlier_unknown = [x for x in self.unknown if x.order < b.order]
            if self.recovering:
                retry = True  # behind a failed batch of this round: collateral
            elif any(x.order < b.order for x in self.inflight):
                # Behind a batch still unanswered (sent on the connection a re-route left, or
                # answered late): the broker has not seen that one yet. Collateral too: both are
                # resent in order once it answers.
                retry = True
            elif earlier_unknown:
                # `b` follows the batches given up with unknown fate, and the broker appends in
                # sequence order only, so what it holds of them is a prefix: had the last one been
                # appended, `b` would fit. That one certainly was not; an earlier one may have
                # been, and taking its sequences back would renumber a batch onto an appended one
                # (answered as its duplicate: acknowledged, never written). Release the last only;
                # if the broker held none of them, the retry's own OUT_OF_ORDER releases the next.
                last = max(earlier_unknown, key=lambda x: x.order)
                self.unknown.remove(last)
                self.released.append(last)
                retry = True
            elif failure is Failure.UNKNOWN_PRODUCER:
                # The oldest batch not acknowledged, nothing before it in doubt, and the broker
                # holds nothing of the producer: resent in a new epoch, from sequence 0.
                retry = self.reset_epoch = True
            else:
                retry = False
                new_epoch = self.reset_epoch = True
        elif failure is Failure.RETRIABLE:
            known_refused = False
            b.attempts += 1
            retry = self.retries is None or b.attempts <= self.retries
        else:
            known_refused = True
            retry = False
        self.recovering = True
        if retry and now < b.deadline:
            self.failed.append(b)
            return Verdict.RETRY
        self._given_up(b, known_refused=known_refused)
        return Verdict.NEW_EPOCH if new_epoch else Verdict.GIVE_UP

    def pop_expired(self, now: float) -> ProducerBatch | None:
        """The head of the queue if its deadline has passed at `now`, given up (the caller fails
        its records); None if the head is still in time. Oldest first, so call until None."""
        queue = self.queue
        if queue and now >= queue[0].deadline:
            b = queue.popleft()
            self._given_up(b, known_refused=b.data is None)  # never sent: certainly not appended
            return b
        return None

    def end_round(self) -> list[ProducerBatch]:
        """All batches of a failed round have answered: renumber what must be, requeue the
        failed ones in seal order. Returns them (the sender backs off before resending)."""
        self.recovering = False
        retry = sorted(self.failed, key=lambda x: x.order)
        self.failed = []
        pending = [*retry, *self.queue]
        if self.reset_epoch:
            self.reset_epoch = False
            self.released.clear()
            self.unknown.clear()
            self._next_epoch()
            for x in pending:
                x.reset_encoding()
        elif self.released:
            low = min(x.seq for x in self.released)
            self.released.clear()
            self.next_seq = low
            for x in pending:
                if x.seq > low:
                    x.reset_encoding()
        if retry:
            self.queue.extendleft(reversed(retry))
        return retry

    def take_queued(self) -> list[ProducerBatch]:
        """Empty the queue (the partition cannot be sent to) and return what it held."""
        batches = list(self.queue)
        self.queue.clear()
        return batches

    def clear(self) -> None:
        """Forget every batch (the producer closed); answers still to come find nothing."""
        self.queue.clear()
        self.inflight.clear()
        self.failed.clear()

    def _given_up(self, b: ProducerBatch, *, known_refused: bool) -> None:
        if self.idempotent and b.seq >= 0 and not self.reset_epoch:
            if b.order < self.acked_order:
                return  # a later batch of this epoch was acknowledged: this one was appended
            if known_refused:
                self.released.append(b)
                self.recovering = True  # its sequences are released when the round ends
            else:
                self.unknown.append(b)  # the next answer on this partition tells

    def restart(self, producer_id: int, epoch: int) -> None:
        """A new producer id or epoch given from outside (a transactional producer's, by its
        coordinator), with nothing in flight: sequences start again at 0."""
        self.producer_id = producer_id
        self.epoch = epoch
        self.next_seq = 0
        self.confirmed = not self.idempotent
        self.acked_order = -1
        self.reset_epoch = False
        self.released.clear()
        self.unknown.clear()
        for b in self.queue:
            b.reset_encoding()

    def _next_epoch(self) -> None:
        if self.transactional:
            # Epochs are the coordinator's: a transactional producer never makes one up (a
            # partition taking it would fence the coordinator's markers). Sequences start again
            # in the epoch it has, which a partition that forgot the producer takes; any other
            # failure has made the transaction abortable already, and the abort brings a new
            # epoch (`restart`).
            self.next_seq = 0
            self.confirmed = False
            self.acked_order = -1
            return
        if self.epoch >= EPOCH_MAX:
            self.producer_id = self.new_producer_id()
            self.epoch = 0
        else:
            self.epoch += 1
        self.next_seq = 0
        self.confirmed = False
        self.acked_order = -1
