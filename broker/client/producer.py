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

Retries, idempotence and routing: broker/client/sender.py (`Sender`, this class's base). The
blocking `Producer`: broker/client/blocking_producer.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from broker.client.accumulator import (
    BATCH_OVERHEAD,
    MAX_BATCH_BYTES,
    Callback,
    ProducerBatch,
    prepare_record,
)
from broker.client.backoff import backoff_delay
from broker.client.client import DEFAULT_BOOTSTRAP, NO_ROUTE, AsyncClient
from broker.client.errors import (
    BrokerUnavailable,
    ClientClosedError,
    RingLogError,
    TransactionError,
    UnknownTopicError,
)
from broker.client.idempotence import EPOCH_MAX, IDEMPOTENT_IN_FLIGHT_MAX, random_producer_id
from broker.client.partitioner import Partitioner
from broker.client.records import Header, RecordMetadata
from broker.client.security import Security
from broker.client.sender import (
    TXN_RETRY_BACKOFF,
    WRITE_BUFFER_HIGH,
    ParkedRecord,
    ProduceReply,
    ProducerPartition,
    Sender,
)
from broker.client.transactions import ConsumerGroupMetadata, TransactionState, TxnState, is_fatal
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT, CODEC_NAMES, Record, now_ms
from ringlog_proto.messages import (
    PRODUCE_HEAD_SIZE,
    Acks,
    AddOffsetsToTxnRequest,
    EndTxnRequest,
    ErrorCode,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    Request,
    Response,
    TxnOffsetCommitRequest,
    decode_produce_reply,
    encode_produce_values,
)

# 256 KiB: the per-request cost in Python (a frame, a future, a syscall, a response to decode) is
# tens of microseconds, noise against encoding a quarter megabyte of records; a fetch of the
# default 1 MiB still carries several batches; and the memory held per busy partition, one open
# batch plus `max_in_flight` in flight, stays near 1.5 MiB. linger_ms bounds the latency a big
# batch could otherwise add: a batch goes when full or when it has waited linger_ms.
BATCH_BYTES_DEFAULT: Final = 256 * 1024
# Unanswered requests on one connection before a partition's next batch waits for an answer.
# One request carries one partition's batch, and its fixed cost (a frame, a dispatch on the
# broker, a future, a reply) is most of the work when a batch holds a record or two: a producer
# spread over 1000 partitions with a 5 ms linger sent about one record a batch, and both ends
# spent their CPU on requests (1000 partitions / 1 at acks=2: 0.13-0.21). With a bound, a busy
# connection's partitions keep filling their lingered batches while earlier requests are
# answered (Kafka's producers bound requests per connection the same way,
# max.in.flight.requests.per.connection). Measured (one core, 1 KiB records, acks=2, 1000
# partitions / 1, two rounds of two, alternated): 8: 0.72-0.77 uvloop, 0.66-0.74 io_uring; 16:
# 0.75-0.79, 0.65-0.69; 32: 0.76-0.88, 0.67-0.78 (acks=1: 0.9-1.0 for all three). 32 keeps the
# broker fed (it takes a connection's requests of a loop turn together, and 32 partitions
# flushing or due at once are one syncfs: broker/backends/appends.py) and is above
# `max_in_flight`, so one partition alone never waits on it.
IN_FLIGHT_PER_CONNECTION_DEFAULT: Final = 32
CODECS: Final = {name: codec for codec, name in CODEC_NAMES.items()}  # `compression`'s values


class AsyncProducer(Sender):
    """An asyncio producer. `await start()` (or `async with`), then `await send(...)`.

    Parameters (times in milliseconds, sizes in bytes):
      acks: 0 (no response: fire and forget), 1 (written to the broker's page cache: survives a
        broker crash) or 2 (fdatasync'ed: survives a power loss).
      batch_bytes: seal a partition's batch when the next record would take it past this
        (default 256 KiB, see BATCH_BYTES_DEFAULT); at most `max_batch_bytes`.
      linger_ms: how long an open batch waits for more records (default 5).
      compression: the codec of the batches sent, Kafka's (confluent-kafka's compression.type):
        "none" (the default), "gzip", "snappy", "lz4" or "zstd", at the codec's default level and
        framed as Kafka's Java producer frames it. `batch_bytes` counts records uncompressed; a
        batch its codec grows past that size goes uncompressed, as librdkafka sends it. A topic whose
        compression.type names another codec stores the batches in that one.
      max_in_flight: unacknowledged batches per partition (default 5; at most 5 when idempotent).
      max_in_flight_per_connection: unanswered requests on one connection (default 32, see
        IN_FLIGHT_PER_CONNECTION_DEFAULT). While a connection has that many, its partitions'
        lingered batches keep filling instead of going out one request each: a producer spread
        over many partitions sends fuller batches the busier the broker is.
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
      transactional_id: makes a transactional producer (KIP-98): `await init_transactions()`
        once, then per transaction `begin_transaction()`, `send`s,
        `send_offsets_to_transaction(...)` for consume-transform-produce, and
        `commit_transaction()` or `abort_transaction()`. Records of a transaction are seen by
        read_committed consumers only once it commits, all of them, never if it aborts. A newer
        producer with the same id fences this one (`ProducerFencedError`, fatal). Needs
        idempotence; its producer id and epoch come from the broker's coordinator.
      transaction_timeout_ms: the coordinator aborts a transaction open longer (default 60 s,
        Kafka's; at most the broker's --transaction-max-timeout-ms).
    """

    def __init__(
        self,
        bootstrap: str = DEFAULT_BOOTSTRAP,
        *,
        acks: int = Acks.WRITTEN,
        batch_bytes: int = BATCH_BYTES_DEFAULT,
        linger_ms: float = 5,
        max_in_flight: int = 5,
        max_in_flight_per_connection: int = IN_FLIGHT_PER_CONNECTION_DEFAULT,
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
        compression: str = "none",
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        if transactional_id is not None:
            if not enable_idempotence:
                raise ValueError("a transactional producer needs enable_idempotence=True")
            if producer_id is not None:
                raise ValueError("a transactional producer's id is its coordinator's: give no producer_id")
            if not transactional_id:
                raise ValueError("transactional_id must not be empty")
            if transaction_timeout_ms <= 0:
                raise ValueError("transaction_timeout_ms must be > 0")
        if acks not in (Acks.NONE, Acks.WRITTEN, Acks.DURABLE):
            raise ValueError(f"acks must be 0, 1 or 2, not {acks}")
        if compression not in CODECS:
            raise ValueError(f"compression must be one of {', '.join(CODECS)}, not {compression!r}")
        if not 0 < max_batch_bytes <= (1 << 31) - 1:
            raise ValueError(f"max_batch_bytes {max_batch_bytes} out of range")
        if not BATCH_OVERHEAD < batch_bytes <= max_batch_bytes:
            raise ValueError(
                f"batch_bytes must be in {BATCH_OVERHEAD + 1}..{max_batch_bytes}, not {batch_bytes}"
            )
        if max_in_flight < 1 or max_in_flight_per_connection < 1:
            raise ValueError("max_in_flight and max_in_flight_per_connection must be at least 1")
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
        self.compression = compression
        self._codec = CODECS[compression]
        self.batch_bytes = batch_bytes
        self.max_batch_bytes = max_batch_bytes
        self.linger = linger_ms / 1000
        self.max_in_flight = max_in_flight
        self.max_in_flight_per_connection = max_in_flight_per_connection
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
        self._parts: dict[tuple[str, int], ProducerPartition] = {}
        self._appended_to: ProducerPartition | None = None  # where `_append` last put a record
        self._parked: dict[str, list[ParkedRecord]] = {}
        # Batches lingering, in the order they opened, so in the order they fall due (the linger
        # is one for the producer): (due, its partition, the batch). One timer, for the first,
        # serves them all (`_lingers_due`); a batch that went out before its linger ended is
        # passed over when its turn comes. A timer of its own each cost ~2.6 us to arm and cancel
        # (uvloop), for each batch of about one record when records are spread over 1000
        # partitions: 8.4 -> 8.1 us of the client's CPU a record there (medians of ten alternated
        # runs of 4-5 s, acks=1, one core; each run 5.7-9.4).
        self._lingering: deque[tuple[float, ProducerPartition, ProducerBatch]] = deque()
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lookups: dict[str, asyncio.Task[None]] = {}
        self._connecting: dict[int, asyncio.Task[None]] = {}
        self._draining: dict[int, asyncio.Task[None]] = {}
        self._slot_waiters = {}
        self._unanswered = {}
        self._buffered = 0
        self._space: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._closed = False
        self._txn = None if transactional_id is None else TransactionState(transactional_id)
        self._txn_to_add = set()
        self._txn_adding = None
        self.transaction_timeout_ms = transaction_timeout_ms

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
            if self._linger_timer is not None:
                self._linger_timer.cancel()
                self._linger_timer = None
            self._lingering.clear()
            for ps in self._parts.values():
                for handle in (ps.linger, ps.backoff):
                    if handle is not None:
                        handle.cancel()
                for b in ps.batches():
                    self._finish_failed(b, err)
                ps.clear()
                ps.open = None
            if self._own_client:
                await self._client.close()

    # ----------------------------------------------------------------------------------- transactions

    def _transaction(self) -> TransactionState:
        if self._txn is None:
            raise TransactionError("not a transactional producer: give transactional_id=")
        return self._txn

    async def init_transactions(self) -> None:
        """Register the transactional id with its coordinator: this producer's id and epoch
        (once per producer, before its first transaction). A transaction an earlier producer of
        the id left open is aborted by the coordinator first, and that producer is fenced."""
        txn = self._transaction()
        txn.check_init()
        self._ensure_loop()
        await self._new_epoch(-1, -1)

    def begin_transaction(self) -> None:
        """Open a transaction: every record sent until it commits or aborts belongs to it."""
        self._transaction().begin()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[tuple[str, int], int],
        group: str | ConsumerGroupMetadata,
    ) -> None:
        """Commit `offsets` ((topic, partition) -> the next offset to consume) for `group` as
        part of the transaction: they count only if it commits (consume-transform-produce).
        `group`: the consumer's `group_metadata()` (its member and generation are checked, so a
        zombie member of an old generation is refused: KIP-447), or a group id alone."""
        txn = self._transaction()
        txn.check_offsets()
        meta = ConsumerGroupMetadata(group) if isinstance(group, str) else group
        await self._txn_request(
            AddOffsetsToTxnRequest(txn.txn_id, txn.producer_id, txn.producer_epoch, meta.group_id)
        )
        txn.offsets_added = True
        items = []
        for (topic, partition), offset in offsets.items():
            info = await self._client.topic(topic)
            items.append((info.topic_id, partition, offset, ""))
        await self._txn_request(
            TxnOffsetCommitRequest(
                txn.txn_id,
                meta.group_id,
                txn.producer_id,
                txn.producer_epoch,
                meta.generation,
                meta.member_id,
                tuple(items),
            ),
            core=self._client.coordinator(meta.group_id),
        )

    async def commit_transaction(self) -> None:
        """Send every record of the transaction, then commit it: its records become visible to
        read_committed consumers, its offsets committed. A record that failed makes it
        abortable: `TransactionError(abortable=True)`, then call `abort_transaction()`."""
        txn = self._transaction()
        txn.begin_commit()
        await self.flush()
        if txn.state is not TxnState.COMMITTING:
            txn.begin_commit()  # raises the error that interrupted the commit
        if txn.started:
            await self._txn_request(EndTxnRequest(txn.txn_id, txn.producer_id, txn.producer_epoch, True))
        txn.completed()

    async def abort_transaction(self) -> None:
        """Abort the transaction: its records, sent or not, are never seen by read_committed
        consumers, its offsets never committed. Records of partitions not yet in the transaction
        fail unsent; the others are sent first (they carry sequences the next transaction
        follows). After an error the producer takes a new epoch from its coordinator."""
        txn = self._transaction()
        txn.begin_abort()
        await self.flush()
        if txn.started:
            await self._txn_request(EndTxnRequest(txn.txn_id, txn.producer_id, txn.producer_epoch, False))
        if txn.needs_epoch_bump():
            await self._new_epoch(txn.producer_id, txn.producer_epoch)
        txn.completed()

    async def _new_epoch(self, producer_id: int, producer_epoch: int) -> None:
        """InitProducerId: a first id and epoch (-1, -1), or the next epoch of the current ones
        (KIP-360); every partition's sequences start again."""
        txn = self._transaction()
        req = InitProducerIdRequest(txn.txn_id, self.transaction_timeout_ms, producer_id, producer_epoch)
        resp = await self._txn_request(req)
        assert isinstance(resp, InitProducerIdResponse)
        txn.initialized(resp.producer_id, resp.producer_epoch)
        self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
        for ps in self._parts.values():
            ps.restart(resp.producer_id, resp.producer_epoch)

    async def _txn_request(self, req: Request, core: int | None = None) -> Response:
        """A transaction request, asked again after retriable errors (the previous transaction
        completing, a coordinator loading or moving) until `delivery_timeout_ms`; any other
        error fails the transaction (fatal ones the producer) and is raised as a
        `TransactionError` whose cause it is."""
        txn = self._transaction()
        deadline = time.monotonic() + self.delivery_timeout
        attempt = 0
        while True:
            try:
                return await self._client.request(req, core=core, timeout=self.request_timeout_ms / 1000)
            except (RingLogError, BrokerUnavailable) as exc:
                if not exc.retriable or time.monotonic() >= deadline or self._closed:
                    txn.failed(exc)
                    fatal = is_fatal(exc)
                    raise TransactionError(
                        f"{txn.txn_id!r}: {type(req).__name__} failed: {exc}",
                        abortable=not fatal,
                        fatal=fatal,
                    ) from exc
            await asyncio.sleep(backoff_delay(attempt, TXN_RETRY_BACKOFF, self.retry_backoff_max))
            attempt += 1

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
        general path (it picks the same partition). A producer that compresses takes the general
        path: the lane's frame is made in one call, uncompressed."""
        if self._closing or self._closed or topic in self._parked or self._codec or self._txn is not None:
            return None
        info = self._client.cached_topic(topic)
        if info is None:
            return None
        owners = info.owners
        partitions = len(owners)
        usable = self._usable(topic) if self._client.clustered and key is None else None
        p = self._partitioner.partition(topic, key, partitions, explicit, usable)
        ps = self._parts.get((topic, p))
        if ps is None or ps.open is not None or ps.backoff is not None or not ps.lane_open():
            return None
        if not 0 <= p < partitions or owners[p] == NO_ROUTE:
            return None
        conn = self._client.connection_nowait(owners[p])
        if (
            conn is None
            or conn.write_buffer_size() > WRITE_BUFFER_HIGH
            or self._unanswered.get(conn, 0) >= self.max_in_flight_per_connection
        ):
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
        ps.sent_alone(b)
        self._buffered += size
        b.ready = True
        self._partitioner.batch_sealed(topic, p, ps.partitions)
        ps.topic_id = info.topic_id
        if acks == Acks.NONE:
            self._finish_ok(ps, b, -1)
            return fut
        ps.sent(b)
        reply = ProduceReply(self, ps, b, conn)
        self._unanswered[conn] = self._unanswered.get(conn, 0) + 1
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
        if self._txn is not None:
            self._txn.check_send()
        info = self._client.cached_topic(topic)
        if info is not None and partition is not None and partition >= info.partitions:
            # a partition added since the count was cached (topics grow, never shrink): the
            # record waits for fresh metadata, and is refused only if the topic lacks it then
            self._client.invalidate(topic)
            info = None
        self._buffered += size
        if info is None or self._parked.get(topic):
            # Records parked for this topic's metadata go first: the metadata can reach the cache
            # a loop turn before the lookup task resumes and appends them (seen: a record sent
            # in that turn overtook the topic's first records, breaking per-key order).
            deadline = time.monotonic() + self.delivery_timeout
            self._parked.setdefault(topic, []).append(
                ParkedRecord(item, key, size, partition, fut, callback, deadline, not linger)
            )
            self._lookup(topic)
            return
        self._append(topic, info.partitions, item, key, size, partition, fut, callback, linger)

    def _send_open(self, ps: ProducerPartition) -> None:
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
            self._fail_parked(ParkedRecord(item, key, size, explicit, fut, callback, 0), exc)
            return
        usable = self._usable(topic) if self._client.clustered and key is None else None
        p = self._partitioner.partition(topic, key, partitions, explicit, usable)
        ps = self._parts.get((topic, p))
        if ps is None:
            ps = self._parts[(topic, p)] = ProducerPartition(
                topic,
                p,
                partitions,
                self.producer_id,
                self.producer_epoch,
                idempotent=self.idempotent,
                max_in_flight=self.max_in_flight,
                retries=self.retries,
            )
            ps.transactional = self._txn is not None
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
            b = ps.open = ProducerBatch(now_ms(), mono, mono + self.delivery_timeout, self._codec)
            loop = self._loop
            assert loop is not None
            if not linger:
                pass  # the caller sends it (see `_enqueue`)
            elif self.linger > 0:
                self._lingering.append((loop.time() + self.linger, ps, b))
                if self._linger_timer is None:
                    self._linger_timer = loop.call_later(self.linger, self._lingers_due)
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

    def _seal(self, ps: ProducerPartition) -> None:
        """Close the open batch to new records, queue it, and try to send."""
        b = ps.open
        if b is None:
            return
        ps.open = None
        if ps.linger is not None:
            ps.linger.cancel()
            ps.linger = None
        b.ready = True
        ps.seal(b)
        self._partitioner.batch_sealed(ps.topic, ps.partition, ps.partitions)
        self._pump(ps)

    def _lingers_due(self) -> None:
        """The first lingering batch's time: it and every other one due go (those still open),
        and the timer is armed for the next."""
        self._linger_timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        lingering = self._lingering
        while lingering and lingering[0][0] <= now:
            _, ps, b = lingering.popleft()
            self._linger_expired(ps, b)
        if lingering and not self._closed:
            self._linger_timer = loop.call_later(lingering[0][0] - now, self._lingers_due)

    def _linger_expired(self, ps: ProducerPartition, b: ProducerBatch) -> None:
        if ps.open is b:
            ps.linger = None
            b.ready = True
            self._pump(ps)

    def _place_parked(self, topic: str, partitions: int) -> None:
        """Records that waited for the topic's partition count go to their partitions."""
        for p in self._parked.pop(topic, []):
            self._appended_to = None
            self._append(topic, partitions, p.item, p.key, p.size, p.partition, p.future, p.callback)
            if p.now and self._appended_to is not None:
                self._send_open(self._appended_to)
