"""The sender: the half of `AsyncProducer` that delivers sealed batches to their partitions' owners.

`Sender` is `AsyncProducer`'s base class: the producer accumulates records into each partition's
open batch (broker/client/producer.py) and calls `_pump` when a partition has something to send;
what follows, until every record's future is resolved, is here. The state both halves share is
declared on `Sender` and set by `AsyncProducer.__init__`. The one thing the sender asks of the
producer is to place the records parked for a topic once its metadata is known (`_place_parked`).
What each partition's answers mean for its batches (rounds, sequences, epochs) is decided by a
pure machine, `DeliveryState` (broker/client/idempotence.py); the sender does the I/O around it.

Retries and idempotence. A batch that fails retriably (a retriable error code, a lost connection,
no answer in time) is retried with bounded exponential backoff until `retries` or
`delivery_timeout_ms` runs out, *with the same bytes*: same producer id, epoch and sequence, so a
broker that had already appended it answers with the original offsets and appends nothing
(`broker/core/partition.py` keeps the last 5 batches per producer; hence `max_in_flight <= 5`).
Failures are handled per partition in *rounds*: after the first failure nothing new is sent until
every batch in flight has answered, then the failed ones are resent in sequence order. A batch
refused with OUT_OF_ORDER_SEQUENCE behind a failed one, or behind one still unanswered (in flight
on the connection a re-route left behind), is collateral damage and retried too.

When a batch is given up while the broker is known not to have appended it (a non-retriable
refusal), its sequence numbers are released: the partition's later batches, which the broker also
refused (there was a gap), are encoded again from that sequence. A batch given up with unknown
fate (its retries ran out on lost connections) keeps its numbers; the next answer tells: a success
means it was appended, OUT_OF_ORDER_SEQUENCE means it was not, and sequences are released then. An
OUT_OF_ORDER_SEQUENCE with no such explanation (the broker's state and ours disagree) fails that
batch and moves the partition to the next epoch, where the broker accepts a fresh sequence; an
UNKNOWN_PRODUCER_ID there (the broker forgot the producer: retention, or its producer id
expiration after an idle spell) moves it to the next epoch too, and resends the batch.
The epoch is therefore per partition, as the broker's producer state is. Sequence numbers that
would pass 2**31 - 1 also start a new epoch.

Without idempotence (`enable_idempotence=False`) retries may write a batch twice and, with
`max_in_flight > 1`, reorder batches.

Routing follows the client's (broker/client/client.py): a batch goes to the route key Metadata
gives its partition. NOT_OWNER and UNKNOWN_TOPIC_OR_PARTITION forget the topic's Metadata, so the
retry goes where a fresh Metadata says; in a cluster a lost connection does too (the leader's node
may be down). In a cluster UNKNOWN_TOPIC_OR_PARTITION is retried as Kafka's producers retry it: a
node learns a new topic from the metadata store a moment after its creator answered, and Metadata
may already name it the leader (one node in three, since placement spreads leaders). A topic that
is gone for good is not in the fresh Metadata, and fails there (on a broker that auto-creates
topics it is made again, as for any record to a new topic). A partition with no live leader
(`NO_ROUTE`) keeps its batches queued and asks Metadata again with backoff until a leader appears
or their delivery timeout passes.
A topic's Metadata is asked allowing its creation, as Kafka's producers ask it: on a broker that
auto-creates topics (`--auto-create-topics`, the default) a record for a new topic creates it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Final

from broker.client.accumulator import BATCH_OVERHEAD, Callback, ProducerBatch, call_callback
from broker.client.backoff import backoff_delay
from broker.client.client import NO_ROUTE, AsyncClient
from broker.client.connection import AsyncConnection
from broker.client.errors import (
    BrokerUnavailable,
    ClientClosedError,
    ClientError,
    DeliveryTimeoutError,
    NotOwnerError,
    OutOfOrderSequenceError,
    RingLogError,
    TransactionError,
    UnknownProducerIdError,
    UnknownTopicError,
    error_for,
)
from broker.client.idempotence import DeliveryState, Failure, Verdict
from broker.client.partitioner import Partitioner
from broker.client.transactions import TransactionState, TxnState
from ringlog_proto.batch import Record
from ringlog_proto.messages import (
    Acks,
    AddPartitionsToTxnRequest,
    ErrorCode,
    ProduceRequest,
    Response,
    decode_produce_reply,
)

log = logging.getLogger(__name__)

WRITE_BUFFER_HIGH: Final = 8 * 1024 * 1024  # unsent bytes on a connection before we wait for it


class ProducerPartition(DeliveryState):
    """Send state of one partition: its open batch and timers beside the pure delivery state
    (batches queued, in flight, failed; producer id, epoch, sequences)."""

    __slots__ = ("backoff", "linger", "open", "partition", "partitions", "topic", "topic_id", "waiting")

    def __init__(
        self,
        topic: str,
        partition: int,
        partitions: int,
        producer_id: int,
        epoch: int,
        *,
        idempotent: bool,
        max_in_flight: int,
        retries: int | None,
    ) -> None:
        super().__init__(
            producer_id, epoch, idempotent=idempotent, max_in_flight=max_in_flight, retries=retries
        )
        self.topic = topic
        self.partition = partition
        self.partitions = partitions  # the topic's partition count (for the sticky partitioner)
        self.topic_id = 0
        self.open: ProducerBatch | None = None
        self.linger: asyncio.TimerHandle | None = None
        self.backoff: asyncio.TimerHandle | None = None
        self.waiting = False  # for its connection's requests in flight to go below the bound

    def batches(self) -> list[ProducerBatch]:
        out = [*self.queue, *self.inflight, *self.failed]
        if self.open is not None:
            out.append(self.open)
        return out


class ParkedRecord:
    """A record sent to a topic whose metadata is not known yet."""

    __slots__ = ("callback", "deadline", "future", "item", "key", "now", "partition", "size")

    def __init__(
        self,
        item: bytes | Record,
        key: bytes | None,
        size: int,
        partition: int | None,
        future: Any,
        callback: Callback | None,
        deadline: float,
        now: bool = False,
    ) -> None:
        self.item = item
        self.key = key
        self.size = size
        self.partition = partition
        self.future = future
        self.callback = callback
        self.deadline = deadline
        self.now = now  # its batch goes out once it is placed, not after the linger

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)
        if self.callback is not None:
            call_callback(self.callback, None, exc)


# between retries of a transaction request the previous transaction holds up
# (CONCURRENT_TRANSACTIONS): Kafka's client waits 20 ms, not its retry backoff
TXN_RETRY_BACKOFF: Final = 0.02


class Sender:
    """Delivers the sealed batches of `AsyncProducer`'s partitions: its base class (see the module)."""

    # Set by `AsyncProducer.__init__`: its configuration, validated there ...
    acks: Acks
    max_in_flight: int
    max_in_flight_per_connection: int
    retries: int | None
    retry_backoff: float  # seconds
    retry_backoff_max: float
    delivery_timeout: float
    request_timeout_ms: int
    buffer_memory: int
    idempotent: bool
    _reply_timeout: float
    # ... and the state both halves share.
    _client: AsyncClient
    _partitioner: Partitioner
    _parts: dict[tuple[str, int], ProducerPartition]
    _parked: dict[str, list[ParkedRecord]]
    _lookups: dict[str, asyncio.Task[None]]
    _connecting: dict[int, asyncio.Task[None]]
    _draining: dict[int, asyncio.Task[None]]
    # partitions with a batch ready whose connection has `max_in_flight_per_connection` requests
    # unanswered, in the order they became ready: each answer on it lets the first go
    _slot_waiters: dict[AsyncConnection, deque[ProducerPartition]]
    _unanswered: dict[AsyncConnection, int]  # produce requests unanswered, by connection
    _buffered: int
    _space: asyncio.Event | None
    _loop: asyncio.AbstractEventLoop | None
    _closed: bool
    # a transactional producer's (None: not one): its state, and partitions to add to the
    # transaction at the next AddPartitionsToTxn (broker/client/transactions.py)
    _txn: TransactionState | None
    _txn_to_add: set[tuple[str, int]]
    _txn_adding: asyncio.Task[None] | None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("call `await producer.start()` first (or use `async with`)")
        return self._loop

    # ----------------------------------------------------------------------------------- the sender

    def _pump(self, ps: ProducerPartition) -> None:
        """Send what this partition may send now. Called whenever something changed for it."""
        if self._closed:
            return
        if ps.recovering:
            if ps.inflight:
                return  # the round is not over
            self._end_round(ps)
        if ps.backoff is not None:
            return
        if ps.waiting:
            return  # its connection's next answer pumps it
        now = time.monotonic()
        conn: AsyncConnection | None = None
        while ps.may_send():
            if ps.queue:
                if now >= ps.queue[0].deadline:
                    self._expire(ps)
                    continue
            elif ps.open is None or not ps.open.ready:
                return
            if conn is None:
                conn = self._connection_for(ps)
                if conn is None:
                    self._seal_ready(ps)  # queued: what waits for a route expires in the queue
                    return  # a lookup or connect is under way; it pumps again
                if self._txn is not None:
                    self._seal_ready(ps)
                    if not self._in_transaction(ps):
                        return  # being added to the transaction: it pumps again once added
            if conn.write_buffer_size() > WRITE_BUFFER_HIGH:
                self._seal_ready(ps)
                self._wait_drain(conn)  # the socket is behind: it pumps again once drained
                return
            if self._unanswered.get(conn, 0) >= self.max_in_flight_per_connection:
                self._wait_slot(conn, ps)  # an open batch keeps filling meanwhile
                return
            self._seal_ready(ps)
            b = ps.queue[0]
            if now >= b.deadline:
                self._expire(ps)
                continue
            if not ps.number(b):
                return  # a new epoch is due: it waits for the old one's batches in flight
            ps.dequeue()
            self._send(ps, b, conn)
            if conn.closed:
                conn = None

    def _seal_ready(self, ps: ProducerPartition) -> None:
        """Queue `ps`'s open batch if it is ready to go and nothing is queued before it."""
        b = ps.open
        if ps.queue or b is None or not b.ready:
            return
        ps.open = None  # sealed here, not by `_seal`, which would pump again
        if ps.linger is not None:
            ps.linger.cancel()
            ps.linger = None
        ps.seal(b)
        self._partitioner.batch_sealed(ps.topic, ps.partition, ps.partitions)

    def _send(self, ps: ProducerPartition, b: ProducerBatch, conn: AsyncConnection) -> None:
        assert b.data is not None
        txn_id = None if self._txn is None else self._txn.txn_id
        req = ProduceRequest(ps.topic_id, ps.partition, self.acks, self.request_timeout_ms, b.data, txn_id)
        if self.acks == Acks.NONE:
            try:
                conn.send_no_response_nowait(req)
            except BrokerUnavailable as exc:
                ps.sent(b)
                self._on_result(ps, b, -1, exc)
                return
            self._finish_ok(ps, b, -1)
            return
        ps.sent(b)
        reply = ProduceReply(self, ps, b, conn)
        unanswered = self._unanswered
        unanswered[conn] = unanswered.get(conn, 0) + 1
        try:
            conn.request_to(req, reply, timeout=self._reply_timeout, decode=decode_produce_reply)
        except BrokerUnavailable as exc:
            if not reply.settled:  # else the connection's failure reached the reply first
                reply.settled = True
                self._answered(conn)
                self._on_result(ps, b, -1, exc)

    def _on_result(
        self, ps: ProducerPartition, b: ProducerBatch, base_offset: int, err: BaseException | None
    ) -> None:
        """`b`'s answer: acknowledged at `base_offset` (`err` None), or failed with `err`."""
        if err is None:
            if not ps.acknowledged(b):
                return  # the producer was closed meanwhile
            self._finish_ok(ps, b, base_offset)
            if not (ps.queue or ps.recovering or (ps.open is not None and ps.open.ready)):
                return  # nothing is waiting to go: the pump would find nothing to send
        elif not self._on_failure(ps, b, err):
            return  # the producer was closed meanwhile
        self._pump(ps)

    def _on_failure(self, ps: ProducerPartition, b: ProducerBatch, err: BaseException) -> bool:
        """Judge `b`'s failed attempt; False if it was no longer in flight."""
        failure: Failure
        if isinstance(err, UnknownProducerIdError) and self.idempotent:
            failure = Failure.UNKNOWN_PRODUCER
        elif isinstance(err, OutOfOrderSequenceError) and self.idempotent:
            failure = Failure.OUT_OF_ORDER
        elif (
            (isinstance(err, RingLogError | BrokerUnavailable) and err.retriable)
            or isinstance(err, OSError)
            or (self._client.clustered and isinstance(err, UnknownTopicError))
        ):
            failure = Failure.RETRIABLE
        else:
            failure = Failure.REFUSED  # an error response: the broker refused the batch
        verdict = ps.failed_attempt(b, failure, time.monotonic())
        if verdict is None:
            return False
        b.last_error = err
        if isinstance(err, UnknownTopicError | NotOwnerError) or (
            self._client.clustered and isinstance(err, BrokerUnavailable | OSError)
        ):
            self._client.invalidate(ps.topic)  # re-route after a fresh Metadata
        if verdict is Verdict.NEW_EPOCH:
            log.warning("%s/%d: %s; moving to a new producer epoch", ps.topic, ps.partition, err)
        if verdict is not Verdict.RETRY:
            self._give_up(ps, b, err)
        return True

    def _give_up(self, ps: ProducerPartition, b: ProducerBatch, err: BaseException | None) -> None:
        """Fail a batch for good (the delivery state has recorded it): with `err`, or with a
        `DeliveryTimeoutError` once its deadline has passed."""
        if err is None or time.monotonic() >= b.deadline:
            timeout = DeliveryTimeoutError(
                f"{ps.topic}/{ps.partition}: {len(b)} record(s) not acknowledged within "
                f"{self.delivery_timeout * 1000:.0f} ms"
                + (f" (last error: {b.last_error})" if b.last_error is not None else "")
            )
            timeout.__cause__ = err or b.last_error
            err = timeout
        self._finish_failed(b, err)

    def _end_round(self, ps: ProducerPartition) -> None:
        """All batches of a failed round have answered: requeue the failed ones, renumbered as
        they must be (`DeliveryState.end_round`), and back off before resending them."""
        retry = ps.end_round()
        if retry:
            attempts = max(x.attempts for x in retry)
            delay = backoff_delay(max(0, attempts - 1), self.retry_backoff, self.retry_backoff_max)
            loop = self._loop
            assert loop is not None
            ps.backoff = loop.call_later(delay, self._backoff_done, ps)
            log.debug("%s/%d: retrying %d batch(es) in %.3f s", ps.topic, ps.partition, len(retry), delay)

    def _backoff_done(self, ps: ProducerPartition) -> None:
        ps.backoff = None
        self._pump(ps)

    def _finish_ok(self, ps: ProducerPartition, b: ProducerBatch, base_offset: int) -> None:
        self._release(b)
        b.complete(ps.topic, ps.partition, base_offset)

    def _finish_failed(self, b: ProducerBatch, err: BaseException) -> None:
        self._release(b)
        if self._txn is not None and not isinstance(err, ClientClosedError):
            self._txn.failed(err)  # a record of the transaction is lost: it must be aborted
        b.fail(err)

    def _fail_parked(self, p: ParkedRecord, err: BaseException) -> None:
        """A record that never reached a batch fails: in a transaction, the transaction too."""
        if self._txn is not None and not isinstance(err, ClientClosedError):
            self._txn.failed(err)
        p.fail(err)

    # ----------------------------------------------------------------------------------- transactions

    def _in_transaction(self, ps: ProducerPartition) -> bool:
        """Whether `ps` may send its batches of the open transaction: it has been added to it
        (KIP-98: before its first batch). Else its AddPartitionsToTxn is started (one request
        for the partitions of a loop turn), or, when the transaction failed or is being aborted,
        its queued batches (none sent: never numbered) fail at once."""
        txn = self._txn
        assert txn is not None
        key = (ps.topic, ps.partition)
        if key in txn.added:
            return True
        if txn.state in (TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR, TxnState.ABORTING):
            err = TransactionError(
                f"{ps.topic}/{ps.partition}: not sent: the transaction "
                + ("is being aborted" if txn.error is None else f"failed: {txn.error}"),
                abortable=txn.state is not TxnState.FATAL_ERROR,
                fatal=txn.state is TxnState.FATAL_ERROR,
            )
            aborting = txn.state is TxnState.ABORTING and txn.error is None
            for b in ps.take_queued():
                if aborting:  # the abort's own doing, not a failure of the transaction
                    self._release(b)
                    b.fail(err)
                else:
                    self._finish_failed(b, err)
            return False
        if txn.ask_add(key):
            self._txn_to_add.add(key)
            if self._txn_adding is None:
                self._txn_adding = self._ensure_loop().create_task(self._add_partitions())
        return False

    async def _add_partitions(self) -> None:
        """AddPartitionsToTxn for what `_in_transaction` asked, until nothing is left: retriable
        errors (the previous transaction completing, a coordinator moving) asked again after a
        backoff; others fail the transaction (fatal ones the producer)."""
        txn = self._txn
        assert txn is not None
        attempt = 0
        try:
            await asyncio.sleep(0)  # the partitions of this loop turn go in one request
            while self._txn_to_add and not self._closed:
                keys = set(self._txn_to_add)
                self._txn_to_add.clear()
                parts = tuple(sorted((self._parts[k].topic_id, k[1]) for k in keys))
                req = AddPartitionsToTxnRequest(txn.txn_id, txn.producer_id, txn.producer_epoch, parts)
                try:
                    await self._client.request(req, timeout=self.request_timeout_ms / 1000)
                except (RingLogError, BrokerUnavailable) as exc:
                    if exc.retriable and not self._closed:
                        txn.not_added(keys)
                        for k in keys:
                            txn.ask_add(k)
                        self._txn_to_add |= keys
                        await asyncio.sleep(backoff_delay(attempt, TXN_RETRY_BACKOFF, self.retry_backoff_max))
                        attempt += 1
                        continue
                    txn.not_added(keys)
                    txn.failed(exc)
                else:
                    attempt = 0
                    txn.added_partitions(keys)
                for k in keys:
                    ps = self._parts.get(k)
                    if ps is not None:
                        self._pump(ps)
        finally:
            self._txn_adding = None

    def _release(self, b: ProducerBatch) -> None:
        self._buffered -= b.size - BATCH_OVERHEAD
        b.size = BATCH_OVERHEAD
        if self._space is not None and self._buffered < self.buffer_memory:
            self._space.set()

    # ----------------------------------------------------------------------------------- routing

    def _connection_for(self, ps: ProducerPartition) -> AsyncConnection | None:
        """The open connection to the partition's owner core, or None after starting whatever
        (metadata lookup, connect) will make one; that task pumps the partition when done."""
        info = self._client.cached_topic(ps.topic)
        if info is None:
            self._lookup(ps.topic)
            return None
        if ps.partition >= info.partitions:
            self._fail_partition(
                ps,
                UnknownTopicError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {ps.topic!r} has no partition {ps.partition}",
                ),
            )
            return None
        ps.topic_id = info.topic_id
        core = info.owners[ps.partition]
        if core == NO_ROUTE:
            self._lookup(ps.topic)  # waits for a leader (see _lookup_task)
            return None
        conn = self._client.connection_nowait(core)
        if conn is None:
            self._connect(core)
        return conn

    def _lookup(self, topic: str) -> None:
        if topic not in self._lookups and not self._closed:
            loop = self._ensure_loop()
            self._lookups[topic] = loop.create_task(self._lookup_task(topic))

    async def _lookup_task(self, topic: str) -> None:
        attempt = 0
        refresh = False
        try:
            while True:
                try:
                    info = await self._client.topic(topic, refresh=refresh, auto_create=True)
                    if not self._leaderless(topic, info.owners):
                        break
                    # Batches wait for a partition with no live leader: ask again after a backoff.
                    # Records waiting for the topic go to their partitions meanwhile: those with
                    # a leader are sent (their pump finds this lookup under way for the others).
                    refresh = True
                    self._place_parked(topic, info.partitions)
                    for ps in [ps for ps in self._parts.values() if ps.topic == topic]:
                        self._expire(ps)
                    if not self._leaderless(topic, info.owners):
                        break
                    log.debug("%s: a partition with batches has no live leader; asking again", topic)
                    await asyncio.sleep(backoff_delay(attempt, self.retry_backoff, self.retry_backoff_max))
                    attempt += 1
                except (BrokerUnavailable, OSError) as exc:
                    self._expire_parked(topic, exc)
                    waiting = [ps for ps in self._parts.values() if ps.topic == topic]
                    for ps in waiting:
                        self._expire(ps)
                    if not self._parked.get(topic) and not any(ps.batches() for ps in waiting):
                        return
                    await asyncio.sleep(backoff_delay(attempt, self.retry_backoff, self.retry_backoff_max))
                    attempt += 1
                except ClientError as exc:  # unknown topic, client closed: fail what waits for it
                    for p in self._parked.pop(topic, []):
                        self._buffered -= p.size
                        self._fail_parked(p, exc)
                    for ps in [ps for ps in self._parts.values() if ps.topic == topic]:
                        self._fail_partition(ps, exc)
                    return
        finally:
            self._lookups.pop(topic, None)
        self._place_parked(topic, info.partitions)
        for ps in [ps for ps in self._parts.values() if ps.topic == topic]:
            self._pump(ps)

    def _leaderless(self, topic: str, owners: tuple[int, ...]) -> bool:
        """Whether a partition of `topic` with batches queued has no route now."""
        return any(
            ps.topic == topic and ps.partition < len(owners) and owners[ps.partition] == NO_ROUTE and ps.queue
            for ps in self._parts.values()
        )

    def _expire_parked(self, topic: str, cause: BaseException) -> None:
        now = time.monotonic()
        parked = self._parked.get(topic, [])
        keep = [p for p in parked if p.deadline > now]
        for p in parked:
            if p.deadline <= now:
                self._buffered -= p.size
                err = DeliveryTimeoutError(f"no metadata for topic {topic!r} within the delivery timeout")
                err.__cause__ = cause
                self._fail_parked(p, err)
        if parked:
            self._parked[topic] = keep

    def _fail_partition(self, ps: ProducerPartition, exc: BaseException) -> None:
        """Fail everything not yet sent on `ps` (what is in flight answers for itself)."""
        if ps.linger is not None:
            ps.linger.cancel()
            ps.linger = None
        batches = [*ps.take_queued(), *([ps.open] if ps.open is not None else [])]
        ps.open = None
        for b in batches:
            self._finish_failed(b, exc)

    def _connect(self, core: int) -> None:
        if core not in self._connecting and not self._closed:
            loop = self._ensure_loop()
            self._connecting[core] = loop.create_task(self._connect_task(core))

    async def _connect_task(self, core: int) -> None:
        attempt = 0
        try:
            while True:
                try:
                    await self._client.connection(core)
                    break
                except ClientClosedError:
                    return
                except RingLogError as exc:  # credentials refused: no retry can succeed
                    for ps in list(self._parts.values()):
                        self._fail_partition(ps, exc)
                    return
                except BrokerUnavailable as exc:
                    log.debug("connect to core %d: %s", core, exc)
                    for ps in self._parts.values():
                        for b in ps.queue:
                            b.last_error = b.last_error or exc
                        self._expire(ps)
                    if not any(ps.queue or ps.open for ps in self._parts.values()):
                        return
                    await asyncio.sleep(backoff_delay(attempt, self.retry_backoff, self.retry_backoff_max))
                    attempt += 1
                    if self._client.clustered:
                        # Its node may be down: the pump asks Metadata who leads those partitions now.
                        self._client.invalidate_route(core)
                        break
        finally:
            self._connecting.pop(core, None)
        self._pump_all()

    def _expire(self, ps: ProducerPartition) -> None:
        """Fail the queued batches past their delivery deadline (oldest first, at the head)."""
        now = time.monotonic()
        while (b := ps.pop_expired(now)) is not None:
            self._give_up(ps, b, None)

    def _wait_drain(self, conn: AsyncConnection) -> None:
        key = id(conn)
        if key not in self._draining and not self._closed:
            loop = self._ensure_loop()
            self._draining[key] = loop.create_task(self._drain_task(key, conn))

    async def _drain_task(self, key: int, conn: AsyncConnection) -> None:
        try:
            await conn.drain()
        except BrokerUnavailable:
            pass
        finally:
            self._draining.pop(key, None)
        self._pump_all()

    def _wait_slot(self, conn: AsyncConnection, ps: ProducerPartition) -> None:
        ps.waiting = True
        waiters = self._slot_waiters.get(conn)
        if waiters is None:
            waiters = self._slot_waiters[conn] = deque()
        waiters.append(ps)

    def _answered(self, conn: AsyncConnection) -> None:
        """One of `conn`'s produce requests is settled (answered, or failed with it)."""
        left = self._unanswered[conn] - 1
        if left:
            self._unanswered[conn] = left
        else:
            del self._unanswered[conn]

    def _slot_freed(self, conn: AsyncConnection) -> None:
        """After an answer (or the connection's failure) settled one of `conn`'s requests: the
        partitions waiting for room go, first come first, while there is room (a failed
        connection's go to wherever their pump routes them now)."""
        waiters = self._slot_waiters.get(conn)
        if waiters is None:
            return
        bound = self.max_in_flight_per_connection
        while waiters and (conn.closed or self._unanswered.get(conn, 0) < bound):
            ps = waiters.popleft()
            ps.waiting = False
            self._pump(ps)
        if not waiters and self._slot_waiters.get(conn) is waiters:
            del self._slot_waiters[conn]

    def _pump_all(self) -> None:
        for ps in list(self._parts.values()):
            self._pump(ps)

    def _place_parked(self, topic: str, partitions: int) -> None:
        """Records that waited for the topic's partition count go to their partitions: the
        producer's to do (`AsyncProducer._place_parked`)."""
        raise NotImplementedError


class ProduceReply:
    """The `ResponseSink` of one produce request (`AsyncConnection.request_to`).

    A success is acted on in the connection's read callback: the records' futures resolve and the
    partition's next batch goes out there, a loop turn earlier than through a future's
    done-callback (one-at-a-time latency). Anything else takes that turn, as it always did, so the
    retry logic never runs inside the connection's own failure or write.
    """

    __slots__ = ("_b", "_conn", "_producer", "_ps", "settled")

    def __init__(
        self, producer: Sender, ps: ProducerPartition, b: ProducerBatch, conn: AsyncConnection
    ) -> None:
        self._producer = producer
        self._ps = ps
        self._b = b
        self._conn = conn
        self.settled = False

    def done(self) -> bool:
        return self.settled

    def set_result(self, resp: int | Response) -> None:
        """`decode_produce_reply`'s result: a success's base offset, or the decoded response."""
        self.settled = True
        producer = self._producer
        producer._answered(self._conn)
        if type(resp) is int:
            producer._on_result(self._ps, self._b, resp, None)
        elif resp.error == ErrorCode.NONE:  # type: ignore[union-attr]
            producer._on_result(self._ps, self._b, resp.base_offset, None)  # type: ignore[union-attr]
        else:
            self._later(error_for(resp.error, resp.message))  # type: ignore[union-attr]
            return
        if producer._slot_waiters:
            producer._slot_freed(self._conn)

    def set_exception(self, exc: BaseException) -> None:
        self.settled = True
        self._producer._answered(self._conn)
        self._later(exc)

    def _later(self, exc: BaseException) -> None:
        producer = self._producer
        assert producer._loop is not None
        producer._loop.call_soon(self._failed, exc)

    def _failed(self, exc: BaseException) -> None:
        producer = self._producer
        producer._on_result(self._ps, self._b, -1, exc)
        if producer._slot_waiters:
            producer._slot_freed(self._conn)
