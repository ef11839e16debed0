"""Producer batches: records accumulated for one partition, encoded once, sent (and resent) as bytes.

Rules this module keeps:
- No I/O and no event loop: the producer decides when to seal and send; this only holds records
  and knows an upper bound of their encoded size, a few bytes a record above the exact one
  (`record_size`): a batch never exceeds what it was sized for.
- A record is kept as the cheapest thing `encode_batch` accepts: the value `bytes` itself when it
  has no key, headers or timestamp (the common case), else one `Record`.
- A batch is encoded once, when first sent, with its producer id, epoch and base sequence; a retry
  resends the same bytes, so the broker recognises a duplicate. Only when the producer knows the
  broker never appended the batch may it drop the bytes and encode again (`reset_encoding`).
- A batch is sized by its records as encoded uncompressed (`record_size`'s bound), and stays
  within that bound in the producer's codec (`compression`): one the codec grows past it (values
  that do not compress) is sent uncompressed, as librdkafka sends a batch its codec does not
  shrink.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from broker.client.errors import MessageTooLargeError
from broker.client.records import Header, RecordMetadata
from ringlog_proto.batch import COMPRESSION_NONE, HEADER_SIZE, Record, encode_batch, varint_size
from ringlog_proto.batch import record_size as exact_record_size
from ringlog_proto.batch_encode import as_transactional
from ringlog_proto.messages import ErrorCode

BATCH_OVERHEAD: Final = HEADER_SIZE  # 61 bytes of batch header
MAX_BATCH_BYTES: Final = 1024 * 1024  # the broker's default max_batch_bytes (whole batch)
TIMESTAMP_MAX: Final = (1 << 63) - 1  # a record's timestamp is an i64 of milliseconds

log = logging.getLogger(__name__)

_INVALID_STATE = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)

Callback = Callable[[RecordMetadata | None, BaseException | None], Any]


# What `record_size` adds to a record's size at offset and timestamp deltas of 0: its offset delta
# may take 3 bytes (RECORD_COUNT_MAX records), 2 more than at index 0, and the record's length
# varint may grow by one with it. A record with a timestamp of its own may have a 10-byte delta.
RECORD_SLACK: Final = 3
TIMESTAMP_SLACK: Final = 9


def record_size(
    value: bytes | None, key: bytes | None, headers: Sequence[Header] = (), timestamp: int | None = None
) -> int:
    """An upper bound, within a few bytes, of one record's encoded size in a batch (varints make
    the exact size depend on its index and timestamp delta, known only when the batch is built)."""
    if key is None and not headers and value is not None:  # the common case: no call per varint
        n = len(value)
        body = n + (6 if n < 64 else 7 if n < 8192 else 5 + varint_size(n))
        size = body + (1 if body < 64 else 2 if body < 8192 else varint_size(body)) + RECORD_SLACK
    else:
        size = exact_record_size(value, key, headers) + RECORD_SLACK
    return size if timestamp is None else size + TIMESTAMP_SLACK


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


class ProducerBatch:
    """The records of one partition that travel in one record batch."""

    __slots__ = (
        "attempts",
        "callbacks",
        "codec",
        "created",
        "data",
        "deadline",
        "done",
        "futures",
        "last_error",
        "order",
        "own_first_ts",
        "ready",
        "records",
        "seq",
        "size",
        "timestamp",
    )

    def __init__(
        self, timestamp: int, created: float, deadline: float, codec: int = COMPRESSION_NONE
    ) -> None:
        self.codec = codec  # the records' compression (ringlog_proto.batch.CODEC_NAMES)
        self.records: list[bytes | Record] = []
        self.futures: list[Any] = []  # asyncio or concurrent futures: both have set_result
        self.callbacks: list[Callback | None] | None = None  # allocated by the first callback
        self.size = BATCH_OVERHEAD  # upper bound of the encoded size of the batch so far
        self.own_first_ts = False  # the first record has its own timestamp: see `add`
        self.timestamp = timestamp  # ms; records sent without a timestamp take this one
        self.created = created  # time.monotonic()
        self.deadline = deadline  # time.monotonic() after which delivery has failed
        self.ready = False  # linger passed or flush asked: send as soon as allowed
        self.order = -1  # seal order within the partition (= send order of first attempts)
        self.data: bytes | memoryview | None = None  # the encoded batch, once sent
        self.seq = -1  # unbounded sequence of the first record (wire value: seq % 2**31)
        self.attempts = 0  # sends that failed retriably
        self.last_error: BaseException | None = None
        self.done: Any = None  # a future made by whoever waits for the whole batch (flush)

    def __len__(self) -> int:
        return len(self.records)

    def fits(self, size: int, batch_bytes: int) -> bool:
        """Whether a record of encoded `size` may join: always when the batch is empty (a record
        larger than `batch_bytes` travels alone; the caller checks the hard limit)."""
        if self.own_first_ts:
            size += TIMESTAMP_SLACK
        return not self.records or self.size + size <= batch_bytes

    def add(self, item: bytes | Record, size: int, future: Any, callback: Callback | None) -> None:
        """`size` from `record_size`. Timestamp deltas are relative to the first record's: when it
        has its own timestamp, a later record taking the batch's may have a long delta too."""
        if not self.records:
            # Items are exactly bytes or Record (prepare_record), but a failed `type() is bytes`
            # does not narrow to Record for mypy; isinstance would cost a Record item more.
            self.own_first_ts = type(item) is not bytes and item.timestamp is not None  # type: ignore[union-attr]
        elif self.own_first_ts:
            size += TIMESTAMP_SLACK
        self.records.append(item)
        self.futures.append(future)
        self.size += size
        if callback is not None:
            if self.callbacks is None:
                self.callbacks = [None] * (len(self.records) - 1)
            self.callbacks.append(callback)
        elif self.callbacks is not None:
            self.callbacks.append(None)

    def encode(
        self, producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool = False
    ) -> bytes:
        """The batch's bytes, kept for every retry; `transactional`: a transaction's (the
        attribute set, KIP-98)."""
        codec = self.codec
        while True:
            data = encode_batch(
                self.records,
                timestamp=self.timestamp,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=base_sequence,
                compression=codec,
            )
            if not codec or len(data) <= self.size:
                break
            # The codec grew the records past their size uncompressed, the bound the batch was
            # checked against (values that do not compress): they go uncompressed.
            codec = COMPRESSION_NONE
        if transactional:
            data = as_transactional(data)
        self.data = data
        return data

    def reset_encoding(self) -> None:
        """Forget the bytes and sequence: only for a batch the broker certainly did not append."""
        self.data = None
        self.seq = -1

    def complete(self, topic: str, partition: int, base_offset: int) -> None:
        """Resolve every record's future with its `RecordMetadata` (offset -1 if unknown).

        The producer's per-record cost after encoding: the tuple is built with `tuple.__new__`
        (a NamedTuple's own constructor is a Python function), and `set_result` is tried rather
        than guarded by `done()` (a future is done here only if the caller cancelled it).
        """
        ts = self.timestamp
        new = tuple.__new__
        offset = base_offset
        step = 1 if base_offset >= 0 else 0
        callbacks = self.callbacks
        for i, (item, fut) in enumerate(zip(self.records, self.futures, strict=True)):
            # A failed `type() is bytes` does not narrow item to Record (as in `add`).
            t = ts if type(item) is bytes or item.timestamp is None else item.timestamp  # type: ignore[union-attr]
            md = new(RecordMetadata, (topic, partition, offset, t))
            try:  # noqa: SIM105 - contextlib.suppress costs a context manager per record
                fut.set_result(md)
            except _INVALID_STATE:
                pass
            if callbacks is not None and (callback := callbacks[i]) is not None:
                call_callback(callback, md, None)
            offset += step
        self._finished()

    def fail(self, exc: BaseException) -> None:
        callbacks = self.callbacks
        for i, fut in enumerate(self.futures):
            callback = callbacks[i] if callbacks is not None else None
            if not fut.done():
                fut.set_exception(exc)
                if callback is not None and hasattr(fut, "get_loop"):
                    fut.exception()  # the callback reports it: no "never retrieved" warning
            if callback is not None:
                call_callback(callback, None, exc)
        self._finished()

    def _finished(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
        self.records = []  # the futures hold the results; let the record bytes go
        self.futures = []
        self.callbacks = None
        self.data = None


def call_callback(callback: Callback, md: RecordMetadata | None, exc: BaseException | None) -> None:
    try:
        callback(md, exc)
    except Exception:  # a broken callback must not break delivery of the other records
        log.exception("producer callback raised")
