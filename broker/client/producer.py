"""The producer: records in, acknowledged offsets out.

How a record travels:
1. `send` picks the partition (`partitioner.py`) and appends the record to that partition's open
   `ProducerBatch`. The batch is sealed when the next record would take it past `batch_bytes`, or
   it is sent once `linger_ms` has passed since it opened (or `flush` asks).
2. A sealed batch is encoded once (`encode_batch`) with the producer id, epoch and the partition's
   next sequence number, and written to the connection of the core that owns the partition. At
   most `max_in_flight` batches per partition are unacknowledged at a time; while all are busy a
   lingered batch keeps filling, so a loaded producer sends fuller batches.
3. The response resolves every record's future with its `RecordMetadata`.
A record that is to go at once (`send_and_wait`'s; a blocking `Producer`'s lone hand-off with
linger 0) to a partition with nothing open, queued or failing takes a lane, `_send_alone`: the
same batch, sealed, numbered and written in the call rather than through steps 1 and 2's
general machinery: the request's whole frame made in one call (`encode_produce_values`, C when
built) and written before the producer's bookkeeping for it (which then runs while the request
travels). A one-at-a-time caller waits for each microsecond of that.

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
batch and moves the partition to the next epoch, where the broker accepts a fresh sequence.
The epoch is therefore per partition, as the broker's producer state is. Sequence numbers that
would pass 2**31 - 1 also start a new epoch.

Without idempotence (`enable_idempotence=False`) retries may write a batch twice and, with
`max_in_flight > 1`, reorder batches.

Routing follows the client's (broker/client/client.py): a batch goes to the route key Metadata
gives its partition. NOT_OWNER and UNKNOWN_TOPIC_OR_PARTITION forget the topic's Metadata, so the
retry goes where a fresh Metadata says; in a cluster a lost connection does too (the leader's node
may be down). A partition with no live leader (`NO_ROUTE`) keeps its batches queued and asks
Metadata again with backoff until a leader appears or their delivery timeout passes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from broker.client.accumulator import (
    BATCH_OVERHEAD,
    MAX_BATCH_BYTES,
    Callback,
    ProducerBatch,
    call_callback,
    record_size,
)
from broker.client.backoff import backoff_delay
from broker.client.client import DEFAULT_BOOTSTRAP, NO_ROUTE, AsyncClient
from broker.client.connection import AsyncConnection
from broker.client.errors import (
    BrokerUnavailable,
    ClientClosedError,
    ClientError,
    DeliveryTimeoutError,
    MessageTooLargeError,
    NotOwnerError,
    OutOfOrderSequenceError,
    RingLogError,
    UnknownTopicError,
    error_for,
)
from broker.client.loop_thread import LoopThread
from broker.client.partitioner import Partitioner
from broker.client.records import Header, RecordMetadata
from broker.client.security import Security
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT, Record, now_ms
from ringlog_proto.messages import (
    PRODUCE_HEAD_SIZE,
    Acks,
    ErrorCode,
    ProduceRequest,
    Response,
    decode_produce_reply,
    encode_produce_values,
)

log = logging.getLogger(__name__)

SEQUENCE_MAX: Final = (1 << 31) - 1  # base_sequence is an i32
TIMESTAMP_MAX: Final = (1 << 63) - 1  # a record's timestamp is an i64 of milliseconds
EPOCH_MAX: Final = (1 << 15) - 1  # producer_epoch is an i16


def random_producer_id() -> int:
    """A producer id picked at random above the broker's own (`BROKER_PRODUCER_ID_LIMIT`): two
    producers share one with odds of about n**2 / 2**64 among n producers, never with a Kafka
    client's broker-assigned id."""
    return BROKER_PRODUCER_ID_LIMIT + secrets.randbelow((1 << 63) - BROKER_PRODUCER_ID_LIMIT)


IDEMPOTENT_IN_FLIGHT_MAX: Final = 5  # batches per producer the broker remembers for dedupe
WRITE_BUFFER_HIGH: Final = 8 * 1024 * 1024  # unsent bytes on a connection before we wait for it

# 256 KiB: the per-request cost in Python (a frame, a future, a syscall, a response to decode) is
# tens of microseconds, noise against encoding a quarter megabyte of records; a fetch of the
# default 1 MiB still carries several batches; and the memory held per busy partition, one open
# batch plus `max_in_flight` in flight, stays near 1.5 MiB. linger_ms bounds the latency a big
# batch could otherwise add: a batch goes when full or when it has waited linger_ms.
BATCH_BYTES_DEFAULT: Final = 256 * 1024


def prepare_record(
    value: bytes | None,
    key: bytes | None = None,
    headers: Sequence[Header] = (),
    timestamp: int | None = None,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> tuple[bytes | Record, int]:
    """Check a record's arguments and return what the batch stores and its encoded size.

    Raises `TypeError` for a value or key that is not bytes-like, `ValueError` for a timestamp
    outside 0..2**63-1 and `MessageTooLargeError` for a record that could never fit in a batch the
    broker accepts: argument errors surface at `send`, broker errors through the record's future.
    """
    if value is not None and type(value) is not bytes:
        if not isinstance(value, bytearray | memoryview):
            raise TypeError(f"value must be bytes or None, not {type(value).__name__}")
        value = bytes(value)  # a copy: the caller may reuse its buffer before the batch is sent
    if key is not None and type(key) is not bytes:
        if not isinstance(key, bytearray | memoryview):
            raise TypeError(f"key must be bytes or None, not {type(key).__name__}")
        key = bytes(key)
    if timestamp is not None and not (isinstance(timestamp, int) and 0 <= timestamp <= TIMESTAMP_MAX):
        # Kafka's producers refuse a negative timestamp too; and any two of these fit the int64
        # delta a batch stores between its records.
        raise ValueError(f"timestamp {timestamp!r} is not milliseconds since the epoch in 0..2**63-1")
    if headers:
        headers = tuple(headers)
        for h in headers:
            if not (len(h) == 2 and isinstance(h[0], str) and (h[1] is None or isinstance(h[1], bytes))):
                raise TypeError(f"header {h!r} is not a (str, bytes | None) pair")
    size = record_size(value, key, headers, timestamp)
    if size + BATCH_OVERHEAD > max_batch_bytes:
        raise MessageTooLargeError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"a record of {size} bytes encoded cannot fit in a batch of at most {max_batch_bytes} bytes",
        )
    if key is None and not headers and timestamp is None and value is not None:
        return value, size
    return Record(value, key, headers or (), timestamp), size


class _Partition:
    """Send state of one partition: batches open, queued, in flight, failed; sequence numbers."""

    __slots__ = (
        "backoff",
        "confirmed",
        "epoch",
        "failed",
        "inflight",
        "linger",
        "next_order",
        "next_seq",
        "open",
        "partition",
        "partitions",
        "producer_id",
        "queue",
        "recovering",
        "released",
        "reset_epoch",
        "topic",
        "topic_id",
        "unknown",
    )

    def __init__(
        self, topic: str, partition: int, partitions: int, producer_id: int, epoch: int, idempotent: bool
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.partitions = partitions  # the topic's partition count (for the sticky partitioner)
        self.topic_id = 0
        self.open: ProducerBatch | None = None
        self.linger: asyncio.TimerHandle | None = None
        self.queue: deque[ProducerBatch] = deque()  # sealed, to send (retries first)
        self.inflight: deque[ProducerBatch] = deque()  # sent, unanswered, in send order
        self.failed: list[ProducerBatch] = []  # to retry when the round ends
        self.recovering = False  # a batch failed: send nothing new until in-flight drains
        self.backoff: asyncio.TimerHandle | None = None
        self.next_order = 0
        self.producer_id = producer_id
        self.epoch = epoch
        self.next_seq = 0
        self.released: list[ProducerBatch] = []  # given up, known not appended: free their sequences
        self.unknown: list[ProducerBatch] = []  # given up, fate unknown
        self.reset_epoch = False
        # Whether the broker has acknowledged a batch of this producer id and epoch. Until it has,
        # only one batch is in flight: the broker accepts *any* sequence from a producer it does
        # not know, so a second batch could land first if the first one failed and had to be
        # retried; that would reorder records and strand the retry as out of sequence.
        self.confirmed = not idempotent

    def batches(self) -> list[ProducerBatch]:
        out = [*self.queue, *self.inflight, *self.failed]
        if self.open is not None:
            out.append(self.open)
        return out


class _Parked:
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


class AsyncProducer:
    """An asyncio producer. `await start()` (or `async with`), then `await send(...)`.

    Parameters (times in milliseconds, sizes in bytes):
      acks: 0 (no response: fire and forget), 1 (written to the broker's page cache: survives a
        broker crash) or 2 (fdatasync'ed: survives a power loss).
      batch_bytes: seal a partition's batch when the next record would take it past this
        (default 256 KiB, see BATCH_BYTES_DEFAULT); at most `max_batch_bytes`.
      linger_ms: how long an open batch waits for more records (default 5).
      max_in_flight: unacknowledged batches per partition (default 5; at most 5 when idempotent).
      retries: retries per batch (default None: bounded only by delivery_timeout_ms, since how long
        a broker restart takes is unknown, and the delivery timeout is the bound that matters).
      retry_backoff_ms, retry_backoff_max_ms: exponential backoff between retries, capped.
      delivery_timeout_ms: a record not acknowledged this long after its batch opened fails with
        `DeliveryTimeoutError`.
      request_timeout_ms: how long one produce request may go unanswered (also the broker's
        timeout_ms for meeting `acks`).
      buffer_memory: bytes of records accepted and not yet acknowledged before `send` waits.
      max_batch_bytes: the broker's limit on a batch (default 1 MiB, the broker's default).
      enable_idempotence: producer id + sequences, so retries never duplicate (default True).
      producer_id, producer_epoch: a stable identity for a producer that restarts (the new
        instance uses a higher epoch, fencing the old), at least 2**40 (ids below are the broker's
        to assign to Kafka clients); default a random id in 2**40..2**63-1, epoch 0.
      client: share an `AsyncClient` (connections and metadata) with other users; else own one.
    """

    def __init__(
        self,
        bootstrap: str = DEFAULT_BOOTSTRAP,
        *,
        acks: int = Acks.WRITTEN,
        batch_bytes: int = BATCH_BYTES_DEFAULT,
        linger_ms: float = 5,
        max_in_flight: int = 5,
        retries: int | None = None,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        buffer_memory: int = 32 * 1024 * 1024,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        enable_idempotence: bool = True,
        producer_id: int | None = None,
        producer_epoch: int = 0,
        client: AsyncClient | None = None,
        client_name: str = "ringlog-python-producer",
        security: Security | None = None,
    ) -> None:
        if acks not in (Acks.NONE, Acks.WRITTEN, Acks.DURABLE):
            raise ValueError(f"acks must be 0, 1 or 2, not {acks}")
        if not 0 < max_batch_bytes <= (1 << 31) - 1:
            raise ValueError(f"max_batch_bytes {max_batch_bytes} out of range")
        if not BATCH_OVERHEAD < batch_bytes <= max_batch_bytes:
            raise ValueError(
                f"batch_bytes must be in {BATCH_OVERHEAD + 1}..{max_batch_bytes}, not {batch_bytes}"
            )
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if enable_idempotence and max_in_flight > IDEMPOTENT_IN_FLIGHT_MAX:
            raise ValueError(
                f"max_in_flight {max_in_flight} > {IDEMPOTENT_IN_FLIGHT_MAX}: the broker remembers only the "
                f"last {IDEMPOTENT_IN_FLIGHT_MAX} batches of a producer, so retries could duplicate"
            )
        if retries is not None and retries < 0:
            raise ValueError("retries must be >= 0 or None")
        if linger_ms < 0 or delivery_timeout_ms <= 0 or request_timeout_ms <= 0:
            raise ValueError("linger_ms must be >= 0, delivery_timeout_ms and request_timeout_ms > 0")
        if producer_id is not None and not BROKER_PRODUCER_ID_LIMIT <= producer_id < (1 << 63):
            raise ValueError(
                f"producer_id must be in {BROKER_PRODUCER_ID_LIMIT}..2**63-1 "
                "(ids below are the broker's to assign)"
            )
        if not 0 <= producer_epoch <= EPOCH_MAX:
            raise ValueError(f"producer_epoch must be in 0..{EPOCH_MAX}")
        self.acks = Acks(acks)
        self.batch_bytes = batch_bytes
        self.max_batch_bytes = max_batch_bytes
        self.linger = linger_ms / 1000
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.retry_backoff = retry_backoff_ms / 1000
        self.retry_backoff_max = max(retry_backoff_ms, retry_backoff_max_ms) / 1000
        self.delivery_timeout = delivery_timeout_ms / 1000
        self.request_timeout_ms = request_timeout_ms
        # The broker answers REQUEST_TIMED_OUT at timeout_ms; a produce's reply is waited for a
        # little longer than that.
        self._reply_timeout = request_timeout_ms / 1000 + 5
        self.buffer_memory = buffer_memory
        self.idempotent = enable_idempotence
        self.producer_id = (
            (random_producer_id() if producer_id is None else producer_id) if enable_idempotence else -1
        )
        self.producer_epoch = producer_epoch if enable_idempotence else -1
        self._own_client = client is None
        self._client = client or AsyncClient(
            bootstrap, client_name=client_name, request_timeout_ms=request_timeout_ms, security=security
        )
        self._partitioner = Partitioner()
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._appended_to: _Partition | None = None  # where `_append` last put a record
        self._parked: dict[str, list[_Parked]] = {}
        self._lookups: dict[str, asyncio.Task[None]] = {}
        self._connecting: dict[int, asyncio.Task[None]] = {}
        self._draining: dict[int, asyncio.Task[None]] = {}
        self._buffered = 0
        self._space: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._closed = False

    # ----------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Connect to the broker (and check its API versions)."""
        self._loop = asyncio.get_running_loop()
        self._space = asyncio.Event()
        self._space.set()
        await self._client.start()

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def client(self) -> AsyncClient:
        return self._client

    @property
    def buffered_bytes(self) -> int:
        """Bytes of records accepted by `send` and not yet acknowledged or failed."""
        return self._buffered

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything accepted so far now, and wait until each record is acknowledged or
        has failed (failures are reported through the records' futures, not raised here)."""
        loop = self._ensure_loop()
        if self._lookups:
            await asyncio.wait([asyncio.shield(t) for t in list(self._lookups.values())], timeout=timeout)
        waits = []
        for ps in list(self._parts.values()):
            if ps.open is not None:
                ps.open.ready = True
            for b in ps.batches():
                if b.done is None:
                    b.done = loop.create_future()
                waits.append(b.done)
            self._pump(ps)
        if waits:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*waits)

    async def close(self, timeout: float | None = None) -> None:
        """Flush (waiting up to `timeout` seconds), then close. Records still unacknowledged after
        that fail with `ClientClosedError`."""
        if self._closed:
            return
        self._closing = True
        try:
            if self._loop is not None:
                with contextlib.suppress(TimeoutError):
                    await self.flush(timeout)
        finally:
            self._closed = True
            err = ClientClosedError("the producer was closed before the record was acknowledged")
            for task in [*self._lookups.values(), *self._connecting.values(), *self._draining.values()]:
                task.cancel()
            for parked in self._parked.values():
                for p in parked:
                    p.fail(err)
            self._parked.clear()
            for ps in self._parts.values():
                for handle in (ps.linger, ps.backoff):
                    if handle is not None:
                        handle.cancel()
                for b in ps.batches():
                    self._finish_failed(b, err)
                ps.queue.clear()
                ps.inflight.clear()
                ps.failed.clear()
                ps.open = None
            if self._own_client:
                await self._client.close()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("call `await producer.start()` first (or use `async with`)")
        return self._loop

    # ----------------------------------------------------------------------------------- sending

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
        partition: int | None = None,
        timestamp: int | None = None,
        callback: Callback | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; return the future of its `RecordMetadata`.

        A coroutine only so that it can wait: for buffer space when `buffer_memory` is taken by
        unacknowledged records (backpressure reaches the caller here, not as an error). Usually it
        returns at once: `fut = await producer.send(...)`, later `md = await fut`.

        `timestamp` defaults to the time the record's batch was opened (at most `linger_ms` or one
        batch's worth of records earlier). `callback(metadata, exception)` runs on the producer's
        loop when the record is acknowledged or has failed. Argument errors (types, a record too
        large for any batch) raise here; broker errors arrive through the future.
        """
        item, size = prepare_record(value, key, headers, timestamp, self.max_batch_bytes)
        if self._buffered >= self.buffer_memory:
            await self.wait_for_space()
        loop = self._ensure_loop()
        fut: asyncio.Future[RecordMetadata] = loop.create_future()
        self._enqueue(topic, item, key, size, partition, fut, callback)
        return fut

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> RecordMetadata:
        """Send one record and wait for its acknowledgement (slow: no batching across calls).

        The caller waits for this one record, so its batch goes out now rather than at the end
        of the linger (or, with linger_ms=0, one loop turn later): that turn is latency.
        """
        item, size = prepare_record(value, key, headers, timestamp, self.max_batch_bytes)
        if self._buffered >= self.buffer_memory:
            await self.wait_for_space()
        loop = self._ensure_loop()
        fut = self._send_alone(topic, item, key, size, partition, None, None)
        if fut is None:
            fut = loop.create_future()
            self._appended_to = None
            self._enqueue(topic, item, key, size, partition, fut, None, linger=False)
            if self._appended_to is not None:  # None: parked until the topic's metadata comes
                self._send_open(self._appended_to)
        return await fut

    def _send_alone(
        self,
        topic: str,
        item: bytes | Record,
        key: bytes | None,
        size: int,
        explicit: int | None,
        fut: Any | None,
        callback: Callback | None,
    ) -> Any | None:
        """A record that is to go now (`send_and_wait`'s, or a blocking `Producer`'s lone record
        with linger 0) as a batch of its own, made and written here, when its partition is idle
        (nothing open, queued or being retried, room in flight) and its connection is open and
        keeping up: what `_enqueue`, `_append`, `_send_open` and `_pump` would do in that state,
        without their generality (a one-at-a-time caller waits for every microsecond of it).
        Returns the record's future (`fut`, or one made on the loop when None); None: take that
        general path (it picks the same partition)."""
        if self._closing or self._closed or topic in self._parked:
            return None
        info = self._client.cached_topic(topic)
        if info is None:
            return None
        owners = info.owners
        partitions = len(owners)
        usable = self._usable(topic) if self._client.clustered and key is None else None
        p = self._partitioner.partition(topic, key, partitions, explicit, usable)
        ps = self._parts.get((topic, p))
        if ps is None or ps.open is not None or ps.queue or ps.recovering or ps.backoff is not None:
            return None
        inflight = ps.inflight
        if inflight and (not ps.confirmed or len(inflight) >= self.max_in_flight):
            return None
        if not 0 <= p < partitions or owners[p] == NO_ROUTE or ps.next_seq > SEQUENCE_MAX:
            return None
        conn = self._client.connection_nowait(owners[p])
        if conn is None or conn.write_buffer_size() > WRITE_BUFFER_HIGH:
            return None
        # The request's whole frame is made in one call and written first, the producer's
        # bookkeeping done while it travels: nothing of the partition changes until the write
        # has succeeded (an encoding that raises, or a failed write, leaves the record to the
        # caller or the general path).
        timestamp = now_ms()
        idempotent = self.idempotent
        seq = ps.next_seq if idempotent else -1
        acks = self.acks
        try:
            corr = conn.claim_id()
            frame = encode_produce_values(
                corr, info.topic_id, p, acks, self.request_timeout_ms, (item,), timestamp,
                ps.producer_id if idempotent else -1, ps.epoch if idempotent else -1, seq,
            )  # fmt: skip
            conn.write_frame(frame)
        except BrokerUnavailable:
            return None
        if fut is None:
            fut = self._loop.create_future()  # type: ignore[union-attr]
        mono = time.monotonic()
        b = ProducerBatch(timestamp, mono, mono + self.delivery_timeout)
        b.add(item, size, fut, callback)
        b.data = memoryview(frame)[PRODUCE_HEAD_SIZE:]  # the batch, for a retry to send again
        if idempotent:
            b.seq = seq
            ps.next_seq = seq + 1
        self._buffered += size
        b.ready = True
        b.order = ps.next_order
        ps.next_order += 1
        self._partitioner.batch_sealed(topic, p, ps.partitions)
        ps.topic_id = info.topic_id
        if acks == Acks.NONE:
            self._finish_ok(ps, b, -1)
            return fut
        ps.inflight.append(b)
        reply = _Reply(self, ps, b)
        conn.expect(corr, reply, ProduceRequest.API_KEY, self._reply_timeout, decode_produce_reply)
        return fut

    async def wait_for_space(self) -> None:
        """Wait until records buffered for sending take less than `buffer_memory`."""
        assert self._space is not None
        while self._buffered >= self.buffer_memory and not self._closed:
            self._space.clear()
            await self._space.wait()

    def _enqueue(
        self,
        topic: str,
        item: bytes | Record,
        key: bytes | None,
        size: int,
        partition: int | None,
        fut: Any,
        callback: Callback | None,
        *,
        linger: bool = True,
    ) -> None:
        """Add a prepared record (see `prepare_record`); its outcome goes to `fut`. No awaiting:
        the blocking `Producer` calls this from its loop thread for many records at a time.

        `linger=False`: a batch this opens gets no linger timer, because the caller sends the
        partition's open batch itself at once (`_send_open` on `_appended_to`); a record parked
        for metadata has its batch sent when it is placed."""
        if self._closing:
            raise ClientClosedError("the producer is closed")
        info = self._client.cached_topic(topic)
        self._buffered += size
        if info is None or self._parked.get(topic):
            # Records parked for this topic's metadata go first: the metadata can reach the cache
            # a loop turn before the lookup task resumes and appends them (seen: a record sent
            # in that turn overtook the topic's first records, breaking per-key order).
            deadline = time.monotonic() + self.delivery_timeout
            self._parked.setdefault(topic, []).append(
                _Parked(item, key, size, partition, fut, callback, deadline, not linger)
            )
            self._lookup(topic)
            return
        self._append(topic, info.partitions, item, key, size, partition, fut, callback, linger)

    def _send_open(self, ps: _Partition) -> None:
        """Send `ps`'s open batch now rather than at the end of its linger."""
        b = ps.open
        if b is not None and not b.ready:
            b.ready = True
            self._pump(ps)

    def _append(
        self,
        topic: str,
        partitions: int,
        item: bytes | Record,
        key: bytes | None,
        size: int,
        explicit: int | None,
        fut: Any,
        callback: Callback | None,
        linger: bool = True,
    ) -> None:
        if explicit is not None and not 0 <= explicit < partitions:
            self._buffered -= size
            exc = UnknownTopicError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has {partitions} partitions; there is no partition {explicit}",
            )
            _Parked(item, key, size, explicit, fut, callback, 0).fail(exc)
            return
        usable = self._usable(topic) if self._client.clustered and key is None else None
        p = self._partitioner.partition(topic, key, partitions, explicit, usable)
        ps = self._parts.get((topic, p))
        if ps is None:
            ps = self._parts[(topic, p)] = _Partition(
                topic, p, partitions, self.producer_id, self.producer_epoch, self.idempotent
            )
        b = ps.open
        if b is not None and not b.fits(size, self.batch_bytes):
            self._seal(ps)
            if key is None and explicit is None:  # the sticky partition moved on: follow it
                p2 = self._partitioner.partition(topic, None, partitions, None, usable)
                if p2 != p:
                    self._append(topic, partitions, item, key, size, p2, fut, callback, linger)
                    return
            b = None
        if b is None:
            mono = time.monotonic()
            b = ps.open = ProducerBatch(now_ms(), mono, mono + self.delivery_timeout)
            loop = self._loop
            assert loop is not None
            if not linger:
                pass  # the caller sends it (see `_enqueue`)
            elif self.linger > 0:
                ps.linger = loop.call_later(self.linger, self._linger_expired, ps, b)
            else:
                ps.linger = loop.call_soon(self._linger_expired, ps, b)  # type: ignore[assignment]
        b.add(item, size, fut, callback)
        self._appended_to = ps
        if b.size >= self.batch_bytes:
            self._seal(ps)

    def _usable(self, topic: str) -> Callable[[int], bool] | None:
        """A cluster's partitions of `topic` with a live leader, for the sticky partitioner."""
        info = self._client.cached_topic(topic)
        if info is None:
            return None
        owners = info.owners
        return lambda p: p < len(owners) and owners[p] != NO_ROUTE

    def _seal(self, ps: _Partition) -> None:
        """Close the open batch to new records, queue it, and try to send."""
        b = ps.open
        if b is None:
            return
        ps.open = None
        if ps.linger is not None:
            ps.linger.cancel()
            ps.linger = None
        b.ready = True
        b.order = ps.next_order
        ps.next_order += 1
        ps.queue.append(b)
        self._partitioner.batch_sealed(ps.topic, ps.partition, ps.partitions)
        self._pump(ps)

    def _linger_expired(self, ps: _Partition, b: ProducerBatch) -> None:
        if ps.open is b:
            ps.linger = None
            b.ready = True
            self._pump(ps)

    # ----------------------------------------------------------------------------------- the sender

    def _pump(self, ps: _Partition) -> None:
        """Send what this partition may send now. Called whenever something changed for it."""
        if self._closed:
            return
        if ps.recovering:
            if ps.inflight:
                return  # the round is not over
            self._end_round(ps)
        if ps.backoff is not None:
            return
        now = time.monotonic()
        conn: AsyncConnection | None = None
        while len(ps.inflight) < self.max_in_flight:
            if ps.inflight and not ps.confirmed:
                return  # the first batch of an epoch goes alone (see _Partition.confirmed)
            if not ps.queue:
                b = ps.open
                if b is None or not b.ready:
                    return
                ps.open = None  # seal without recursing into _pump
                if ps.linger is not None:
                    ps.linger.cancel()
                    ps.linger = None
                b.order = ps.next_order
                ps.next_order += 1
                ps.queue.append(b)
                self._partitioner.batch_sealed(ps.topic, ps.partition, ps.partitions)
            b = ps.queue[0]
            if now >= b.deadline:
                self._expire(ps)
                continue
            if conn is None:
                conn = self._connection_for(ps)
                if conn is None:
                    return  # a lookup or connect is under way; it pumps again
            if conn.write_buffer_size() > WRITE_BUFFER_HIGH:
                self._wait_drain(conn)  # the socket is behind: it pumps again once drained
                return
            if self.idempotent and b.data is None:
                if ps.next_seq + len(b) - 1 > SEQUENCE_MAX:
                    if ps.inflight:
                        return  # the new epoch must not overtake batches of the old one
                    self._next_epoch(ps)
                b.seq = ps.next_seq
                ps.next_seq += len(b)
                b.encode(ps.producer_id, ps.epoch, b.seq)
            elif b.data is None:
                b.encode(-1, -1, -1)
            ps.queue.popleft()
            self._send(ps, b, conn)
            if conn.closed:
                conn = None

    def _send(self, ps: _Partition, b: ProducerBatch, conn: AsyncConnection) -> None:
        assert b.data is not None
        req = ProduceRequest(ps.topic_id, ps.partition, self.acks, self.request_timeout_ms, b.data)
        if self.acks == Acks.NONE:
            try:
                conn.send_no_response_nowait(req)
            except BrokerUnavailable as exc:
                ps.inflight.append(b)
                self._on_result(ps, b, -1, exc)
                return
            self._finish_ok(ps, b, -1)
            return
        ps.inflight.append(b)
        reply = _Reply(self, ps, b)
        try:
            conn.request_to(req, reply, timeout=self._reply_timeout, decode=decode_produce_reply)
        except BrokerUnavailable as exc:
            if not reply.settled:  # else the connection's failure reached the reply first
                reply.settled = True
                self._on_result(ps, b, -1, exc)

    def _on_result(
        self, ps: _Partition, b: ProducerBatch, base_offset: int, err: BaseException | None
    ) -> None:
        """`b`'s answer: acknowledged at `base_offset` (`err` None), or failed with `err`."""
        try:
            ps.inflight.remove(b)
        except ValueError:  # the producer was closed meanwhile
            return
        if err is None:
            ps.confirmed = True
            if ps.unknown:  # a later batch fit the broker's sequence: earlier ones were appended
                ps.unknown = [x for x in ps.unknown if x.order > b.order]
            self._finish_ok(ps, b, base_offset)
            if not (ps.queue or ps.recovering or (ps.open is not None and ps.open.ready)):
                return  # nothing is waiting to go: the pump would find nothing to send
        else:
            self._on_failure(ps, b, err)
        self._pump(ps)

    def _on_failure(self, ps: _Partition, b: ProducerBatch, err: BaseException) -> None:
        b.last_error = err
        if isinstance(err, UnknownTopicError | NotOwnerError) or (
            self._client.clustered and isinstance(err, BrokerUnavailable | OSError)
        ):
            self._client.invalidate(ps.topic)  # re-route after a fresh Metadata
        retry: bool
        known_refused: bool  # the broker certainly did not append this batch
        if isinstance(err, OutOfOrderSequenceError) and self.idempotent:
            known_refused = True
            earlier_unknown = [x for x in ps.unknown if x.order < b.order]
            if ps.recovering:
                retry = True  # behind a failed batch of this round: collateral
            elif any(x.order < b.order for x in ps.inflight):
                # Behind a batch still unanswered (sent on the connection a re-route left, or
                # answered late): the broker has not seen that one yet. Collateral too: both are
                # resent in order once it answers.
                retry = True
            elif earlier_unknown:
                # Batches given up before this one with unknown fate were not appended after all.
                ps.released.extend(earlier_unknown)
                ps.unknown = [x for x in ps.unknown if x.order > b.order]
                retry = True
            else:
                log.warning("%s/%d: %s; moving to a new producer epoch", ps.topic, ps.partition, err)
                retry = False
                ps.reset_epoch = True
        elif (isinstance(err, RingLogError | BrokerUnavailable) and err.retriable) or isinstance(
            err, OSError
        ):
            known_refused = False
            b.attempts += 1
            retry = self.retries is None or b.attempts <= self.retries
        else:
            known_refused = True  # an error response: the broker refused the batch
            retry = False
        ps.recovering = True
        if retry and time.monotonic() < b.deadline:
            ps.failed.append(b)
            return
        self._give_up(ps, b, err, known_refused=known_refused)

    def _give_up(
        self, ps: _Partition, b: ProducerBatch, err: BaseException | None, *, known_refused: bool
    ) -> None:
        """Fail a batch for good, keeping the partition's sequence bookkeeping right."""
        if err is None or time.monotonic() >= b.deadline:
            timeout = DeliveryTimeoutError(
                f"{ps.topic}/{ps.partition}: {len(b)} record(s) not acknowledged within "
                f"{self.delivery_timeout * 1000:.0f} ms"
                + (f" (last error: {b.last_error})" if b.last_error is not None else "")
            )
            timeout.__cause__ = err or b.last_error
            err = timeout
        if self.idempotent and b.seq >= 0 and not ps.reset_epoch:
            if known_refused:
                ps.released.append(b)
                ps.recovering = True  # its sequences are released when the round ends
            else:
                ps.unknown.append(b)  # the next answer on this partition tells
        self._finish_failed(b, err)

    def _end_round(self, ps: _Partition) -> None:
        """All batches of a failed round have answered: renumber what must be, requeue the
        failed ones in sequence order, back off."""
        ps.recovering = False
        retry = sorted(ps.failed, key=lambda x: x.order)
        ps.failed = []
        pending = [*retry, *ps.queue]
        if ps.reset_epoch:
            ps.reset_epoch = False
            ps.released.clear()
            ps.unknown.clear()
            self._next_epoch(ps)
            for x in pending:
                x.reset_encoding()
        elif ps.released:
            low = min(x.seq for x in ps.released)
            ps.released.clear()
            ps.next_seq = low
            for x in pending:
                if x.seq > low:
                    x.reset_encoding()
        if retry:
            ps.queue.extendleft(reversed(retry))
            attempts = max(x.attempts for x in retry)
            delay = backoff_delay(max(0, attempts - 1), self.retry_backoff, self.retry_backoff_max)
            loop = self._loop
            assert loop is not None
            ps.backoff = loop.call_later(delay, self._backoff_done, ps)
            log.debug("%s/%d: retrying %d batch(es) in %.3f s", ps.topic, ps.partition, len(retry), delay)

    def _backoff_done(self, ps: _Partition) -> None:
        ps.backoff = None
        self._pump(ps)

    def _next_epoch(self, ps: _Partition) -> None:
        if ps.epoch >= EPOCH_MAX:
            ps.producer_id = random_producer_id()
            ps.epoch = 0
        else:
            ps.epoch += 1
        ps.next_seq = 0
        ps.confirmed = False

    def _finish_ok(self, ps: _Partition, b: ProducerBatch, base_offset: int) -> None:
        self._release(b)
        b.complete(ps.topic, ps.partition, base_offset)

    def _finish_failed(self, b: ProducerBatch, err: BaseException) -> None:
        self._release(b)
        b.fail(err)

    def _release(self, b: ProducerBatch) -> None:
        self._buffered -= b.size - BATCH_OVERHEAD
        b.size = BATCH_OVERHEAD
        if self._space is not None and self._buffered < self.buffer_memory:
            self._space.set()

    # ----------------------------------------------------------------------------------- routing

    def _connection_for(self, ps: _Partition) -> AsyncConnection | None:
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
                    info = await self._client.topic(topic, refresh=refresh)
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
                        p.fail(exc)
                    for ps in [ps for ps in self._parts.values() if ps.topic == topic]:
                        self._fail_partition(ps, exc)
                    return
        finally:
            self._lookups.pop(topic, None)
        self._place_parked(topic, info.partitions)
        for ps in [ps for ps in self._parts.values() if ps.topic == topic]:
            self._pump(ps)

    def _place_parked(self, topic: str, partitions: int) -> None:
        """Records that waited for the topic's partition count go to their partitions."""
        for p in self._parked.pop(topic, []):
            self._appended_to = None
            self._append(topic, partitions, p.item, p.key, p.size, p.partition, p.future, p.callback)
            if p.now and self._appended_to is not None:
                self._send_open(self._appended_to)

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
                p.fail(err)
        if parked:
            self._parked[topic] = keep

    def _fail_partition(self, ps: _Partition, exc: BaseException) -> None:
        """Fail everything not yet sent on `ps` (what is in flight answers for itself)."""
        if ps.linger is not None:
            ps.linger.cancel()
            ps.linger = None
        batches = [*ps.queue, *([ps.open] if ps.open is not None else [])]
        ps.queue.clear()
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

    def _expire(self, ps: _Partition) -> None:
        """Fail the queued batches past their delivery deadline (oldest first, at the head)."""
        now = time.monotonic()
        while ps.queue and now >= ps.queue[0].deadline:
            b = ps.queue.popleft()
            self._give_up(ps, b, None, known_refused=b.data is None)

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

    def _pump_all(self) -> None:
        for ps in list(self._parts.values()):
            self._pump(ps)


_FINISHED: Final = "FINISHED"  # concurrent.futures._base's state names
_PENDING: Final = "PENDING"
_DONE_STATES: Final = frozenset({"CANCELLED", "CANCELLED_AND_NOTIFIED", _FINISHED})
_LAZY = threading.Lock()  # orders a future's lazy Condition against its completion (see _SendFuture)
_allocate_lock = threading.Lock  # a bare lock (`_thread.allocate_lock`), a name lookup less


class _Reply:
    """The `ResponseSink` of one produce request (`AsyncConnection.request_to`).

    A success is acted on in the connection's read callback: the records' futures resolve and the
    partition's next batch goes out there, a loop turn earlier than through a future's
    done-callback (one-at-a-time latency). Anything else takes that turn, as it always did, so the
    retry logic never runs inside the connection's own failure or write.
    """

    __slots__ = ("_b", "_producer", "_ps", "settled")

    def __init__(self, producer: AsyncProducer, ps: _Partition, b: ProducerBatch) -> None:
        self._producer = producer
        self._ps = ps
        self._b = b
        self.settled = False

    def done(self) -> bool:
        return self.settled

    def set_result(self, resp: int | Response) -> None:
        """`decode_produce_reply`'s result: a success's base offset, or the decoded response."""
        self.settled = True
        if type(resp) is int:
            self._producer._on_result(self._ps, self._b, resp, None)
        elif resp.error == ErrorCode.NONE:  # type: ignore[union-attr]
            self._producer._on_result(self._ps, self._b, resp.base_offset, None)  # type: ignore[union-attr]
        else:
            self._later(error_for(resp.error, resp.message))  # type: ignore[union-attr]

    def set_exception(self, exc: BaseException) -> None:
        self.settled = True
        self._later(exc)

    def _later(self, exc: BaseException) -> None:
        producer = self._producer
        assert producer._loop is not None
        producer._loop.call_soon(producer._on_result, self._ps, self._b, -1, exc)


class _SendFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """The future `Producer.send` returns: a `concurrent.futures.Future` (waitable with
    `concurrent.futures.wait`, `as_completed`, `asyncio.wrap_future`) that cannot be cancelled, a
    record handed to the producer being sent whatever happens to its future, and that costs one
    object until someone waits on it.

    A plain Future builds a Condition (a lock, a deque, bound methods) and a callback list per
    instance: about ten objects the garbage collector tracks, per record, alive until the record
    is acknowledged. With a producer's backlog of 10^5 records that made the collections the
    blocking producer's main cost, and spreading records over partitions (more of them in flight)
    doubled it. Here the Condition, waiter and callback lists are made on first use by whoever
    waits or adds a callback (the base class's methods reach them through properties), and
    `set_result` / `set_exception` touch them only if they exist. `_LAZY` makes "made" and
    "finished" atomic with respect to each other: a waiter that made the Condition after the result
    was set sees the state FINISHED under it, and one that made it before is notified.

    `result()`, the common wait (`send(...).result()`), needs no Condition either: its first
    waiter blocks on a bare lock of its own (`_gate`), which completion releases. The Condition's
    wait and notify are some fifteen Python calls on each side of every one-at-a-time send.
    """

    __slots__ = ("_exception", "_gate", "_lazy", "_result", "_state")

    def __init__(self) -> None:  # the base's __init__ builds the Condition eagerly: not called
        self._state = _PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._lazy: tuple[threading.Condition, list[Any], list[Any]] | None = None
        self._gate: Any = None  # a held lock that completion releases (see `result`)

    def _parts(self) -> tuple[threading.Condition, list[Any], list[Any]]:
        lazy = self._lazy
        if lazy is None:
            with _LAZY:
                lazy = self._lazy
                if lazy is None:
                    lazy = self._lazy = (threading.Condition(), [], [])
        return lazy

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._parts()[0]

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        return self._parts()[1]

    @property
    def _done_callbacks(self) -> list[Any]:  # type: ignore[override]
        return self._parts()[2]

    def cancel(self) -> bool:
        return False

    def done(self) -> bool:
        return self._state in _DONE_STATES

    def result(self, timeout: float | None = None) -> Any:
        if self._state != _FINISHED:
            gate = _allocate_lock()
            gate.acquire()
            with _LAZY:
                if self._state == _FINISHED or self._gate is not None:
                    gate = None  # finished meanwhile, or another waiter has the gate
                else:
                    self._gate = gate
            if gate is None:
                if self._state != _FINISHED:
                    return super().result(timeout)  # a second waiter: the Condition's way
            elif not gate.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError  # the gate stays: completion releases it, nobody waits on it
        exc = self._exception
        if exc is not None:
            raise exc
        return self._result

    def set_result(self, result: Any) -> None:
        with _LAZY:
            if self._state in _DONE_STATES:
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._state = _FINISHED
            lazy = self._lazy
            gate = self._gate
        if gate is not None:
            gate.release()
        if lazy is not None:
            self._notify(lazy, result=True)

    def set_exception(self, exception: BaseException | None) -> None:
        with _LAZY:
            if self._state in _DONE_STATES:
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            self._exception = exception
            self._state = _FINISHED
            lazy = self._lazy
            gate = self._gate
        if gate is not None:
            gate.release()
        if lazy is not None:
            self._notify(lazy, result=False)

    def _notify(self, lazy: tuple[threading.Condition, list[Any], list[Any]], *, result: bool) -> None:
        cond, waiters, _callbacks = lazy
        with cond:
            for waiter in waiters:
                if result:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            cond.notify_all()
        self._invoke_callbacks()  # type: ignore[attr-defined]


class Producer:
    """The blocking producer: an `AsyncProducer` on an event loop in a daemon thread.

    Same parameters as `AsyncProducer`. `send` returns a `concurrent.futures.Future`.

    Records cross to the loop thread in bursts, not one by one: `send` appends to a hand-off list
    and wakes the loop only if it is not already due to take the list. `run_coroutine_threadsafe`
    per record would cost a Task, two futures and a self-pipe write each, several times the cost
    of encoding the record. Everything else (start, flush, close, waiting for buffer space) runs as
    coroutines through `run_coroutine_threadsafe`. Callbacks run on the loop thread: keep them short.
    """

    def __init__(self, bootstrap: str = DEFAULT_BOOTSTRAP, **config: Any) -> None:
        self._thread = LoopThread("ringlog-producer")
        try:
            self._async: AsyncProducer = self._thread.run(self._make(bootstrap, config))
        except BaseException:
            self._thread.stop()
            raise
        self._max_batch_bytes = self._async.max_batch_bytes
        self._lock = threading.Lock()
        self._handoff: list[
            tuple[str, bytes | Record, bytes | None, int, int | None, Any, Callback | None]
        ] = []
        self._handoff_bytes = 0
        self._scheduled = False
        self._closed = False

    @staticmethod
    async def _make(bootstrap: str, config: dict[str, Any]) -> AsyncProducer:
        producer = AsyncProducer(bootstrap, **config)
        try:
            await producer.start()
        except BaseException:
            await producer.close()
            raise
        return producer

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def producer_id(self) -> int:
        return self._async.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._async.producer_epoch

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
        partition: int | None = None,
        timestamp: int | None = None,
        callback: Callback | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue a record; see `AsyncProducer.send`. Blocks only while `buffer_memory` is full."""
        if self._closed:
            raise ClientClosedError("the producer is closed")
        item, size = prepare_record(value, key, headers, timestamp, self._max_batch_bytes)
        ap = self._async
        if ap._buffered + self._handoff_bytes >= ap.buffer_memory and not self._thread.in_loop_thread:
            self._thread.run(self._wait_for_space())
        fut: concurrent.futures.Future[RecordMetadata] = _SendFuture()
        with self._lock:
            self._handoff.append((topic, item, key, size, partition, fut, callback))
            self._handoff_bytes += size
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            self._thread.call_soon(self._take_handoff)
        return fut

    def _take_handoff(self) -> None:
        """On the loop thread: enqueue every record handed over since the last call."""
        with self._lock:
            items, self._handoff = self._handoff, []
            self._handoff_bytes = 0
            self._scheduled = False
        ap = self._async
        enqueue = ap._enqueue
        # With linger 0 the hand-off is the batch: sent here, not one loop turn later.
        now = ap.linger == 0
        if now and len(items) == 1:  # one record waited for at a time, usually: it goes alone
            topic, item, key, size, partition, fut, callback = items[0]
            try:
                if ap._send_alone(topic, item, key, size, partition, fut, callback) is not None:
                    return
            except Exception as exc:  # its caller waits on the future: it must hear of it
                if not fut.done():
                    fut.set_exception(exc)
                return
        touched: dict[_Partition, None] = {}  # in the order first touched
        for topic, item, key, size, partition, fut, callback in items:
            ap._appended_to = None
            try:
                enqueue(topic, item, key, size, partition, fut, callback, linger=not now)
            except Exception as exc:  # closed meanwhile
                if not fut.done():
                    fut.set_exception(exc)
            if now and ap._appended_to is not None:
                touched[ap._appended_to] = None
        for ps in touched:
            ap._send_open(ps)

    async def _wait_for_space(self) -> None:
        self._take_handoff()
        await self._async.wait_for_space()

    async def _flush(self, timeout: float | None) -> None:
        self._take_handoff()
        await self._async.flush(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is acknowledged or has failed."""
        if self._closed:
            return
        self._thread.run(self._flush(timeout))

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to `timeout` seconds), close the connections and stop the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._close(timeout))
        finally:
            self._thread.stop()

    async def _close(self, timeout: float | None) -> None:
        self._take_handoff()
        await self._async.close(timeout)
