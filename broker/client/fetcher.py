"""The fetcher: the half of `AsyncConsumer` that keeps each assigned partition's fetch going and
decodes what it brings into the partition's buffer.

`Fetcher` is `AsyncConsumer`'s base class: the consumer assigns partitions, sets their positions,
hands out buffered records and commits offsets (broker/client/consumer.py), and calls
`_start_fetch` when a partition may fetch again; fetches, their answers, decoding and retries are
here. The state both halves share is declared on `Fetcher` and set by `AsyncConsumer.__init__`.

How records arrive:
- Every assigned partition has at most one Fetch in flight, sent without waiting for the others
  (pipelined), starting at the partition's *fetch offset*. Responses are decoded (crc checked)
  into a per-partition buffer of at most two responses: one being handed out by `poll`, one
  prefetched. The next fetch goes out as soon as the batch headers of a response say where it
  ends, before its records are decoded, when that leaves room in the buffer: the broker reads the
  next response while this one is decoded. (A batch that then fails to decode drops that fetch's
  answer: see "Damaged data".)
- A response's records are decoded straight from the frame it arrived in (no copy of the record
  set) into `ConsumerRecord` tuples, built column by column by C iterators (`decode_rows`): no
  Python code and no intermediate object per record. Control batches (transaction markers) are
  skipped, as Kafka's consumer skips them: the fetch offset moves past them, no record is
  handed out.
- `isolation_level="read_committed"`: fetches read below the last stable offset, and each
  answer names the aborted transactions its batches overlap (producer id, first offset); a
  transactional batch of such a producer from that first offset up to its ABORT marker is
  dropped, as Kafka's consumer drops it (`_aborted_filter`). Each answer's list covers its own
  range, so a fetch sent ahead needs nothing of the one before it.
- `poll` hands out buffered records, round-robin over partitions, and advances each partition's
  *position* (the offset of the next record `poll` returns) past them. When nothing is buffered it
  waits, up to its timeout, for the first fetch that brings something.
- Long polling: a fetch for a partition with nothing new waits on the broker up to
  `fetch_max_wait_ms` and is answered as soon as data arrives, so an idle consumer costs nothing
  and a new record is delivered at once. Because the broker answers the requests of one
  connection strictly in order, a waiting fetch delays every response behind it on its
  connection; so fetches use connections of their own, apart from commits and metadata, one per
  partition up to `max_fetch_connections` per core. Partitions that must share a fetch connection
  never long-poll there: when idle they re-fetch every `fetch_idle_ms` instead, so a busy
  partition's fetches never queue behind an idle one's wait.
- Fetches go to the route key Metadata gives the partition (broker/client/client.py: its core;
  in a cluster, its leader node's core). A partition with no live leader, NOT_OWNER and, in a
  cluster, a lost connection back off, forget the topic's Metadata and fetch where a fresh one
  says.

Damaged data is the application's to see, never hidden:
- A stored batch that does not decode (a poison batch from before the broker walked record
  framing, or damage its crc missed): `poll` delivers every record of the partition before it,
  then raises `UndecodableBatchError` (topic, partition, offset, and `next_offset` to seek to) on
  every call until the application seeks past it, as Kafka's consumer does.
- STORAGE_ERROR (the broker cannot read the partition: disk damage, I/O errors) is retried with
  the usual backoff (`retry_backoff_ms` doubling to `retry_backoff_max_ms`), and after
  `storage_error_retries` failures in a row the next `poll` raises `BrokerStorageError` naming
  topic, partition and offset. The partition keeps retrying behind it and raises again after as
  many more failures, so a broker that recovers is picked up without a seek.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from broker.client.backoff import backoff_delay
from broker.client.client import NO_ROUTE, AsyncClient, TopicPartition
from broker.client.errors import (
    BrokerStorageError,
    BrokerUnavailable,
    ClientClosedError,
    ClientError,
    CorruptMessageError,
    LeaderNotAvailableError,
    NotOwnerError,
    OffsetOutOfRangeError,
    RingLogError,
    UndecodableBatchError,
    UnknownTopicError,
    error_for,
)
from broker.client.records import ConsumerRecord
from ringlog_proto.batch import CONTROL_BIT, TRANSACTIONAL_BIT, BatchError, decode_rows, iter_batches
from ringlog_proto.batch_control import control_of
from ringlog_proto.batch_header import BatchHeader
from ringlog_proto.messages import ErrorCode, FetchRecords, FetchRequest, Isolation, read_fetch_response

log = logging.getLogger(__name__)


class _Assigned:
    """One assigned partition: its position, its buffered records, its fetch."""

    __slots__ = (
        "busy",
        "chunk_pos",
        "chunks",
        "errors",
        "fetch_offset",
        "high_watermark",
        "lane",
        "lock",
        "poison",
        "position",
        "solo",
        "storage_errors",
        "timer",
        "tp",
    )

    def __init__(self, tp: TopicPartition, lock: threading.Lock) -> None:
        self.tp = tp
        self.lock = lock  # the consumer's `_take`: guards chunks, chunk_pos and position
        self.position: int | None = None  # next offset poll returns; None: to be reset
        self.fetch_offset = 0  # next offset to fetch (ahead of position by what is buffered)
        self.chunks: deque[list[ConsumerRecord]] = deque()  # decoded fetch responses
        self.chunk_pos = 0  # records of chunks[0] already handed out
        # What is under way for the next fetch: the fetch's future, or a token for a metadata
        # lookup or connect. Its completion carries on only if it is still the one here: a seek
        # resets this, so answers to older fetches are dropped.
        self.busy: object | None = None
        self.high_watermark = -1
        self.timer: asyncio.TimerHandle | None = None  # a delayed re-fetch
        self.errors = 0  # consecutive failed fetches (for backoff)
        self.lane = ""
        self.solo = True  # alone on its fetch connection: may long-poll
        # An undecodable batch met at fetch_offset: raised by poll once the records before it are
        # handed out, until a seek. Fetching stops meanwhile.
        self.poison: UndecodableBatchError | None = None
        self.storage_errors = 0  # consecutive STORAGE_ERROR answers since the last raise

    def seek(self, offset: int) -> None:
        with self.lock:
            self.position = offset
            self.chunks.clear()
            self.chunk_pos = 0
        self.fetch_offset = offset
        self.poison = None
        self.storage_errors = 0
        self.busy = None  # what is in flight (if anything) is now stale; a new fetch may go
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Fetcher:
    """Fetches and decodes for `AsyncConsumer`'s partitions: its base class (see the module)."""

    # Set by `AsyncConsumer.__init__`: its configuration, validated there ...
    auto_offset_reset: str
    fetch_max_bytes: int
    fetch_max_wait_ms: int
    fetch_min_bytes: int
    isolation: Isolation
    fetch_idle: float  # seconds
    request_timeout: float
    retry_backoff: float
    retry_backoff_max: float
    check_crcs: bool
    storage_error_retries: int
    # ... and the state both halves share.
    _client: AsyncClient
    _assigned: dict[TopicPartition, _Assigned]
    _take: threading.Lock
    _errors: list[BaseException]
    _wakeup: asyncio.Event | None
    _loop: asyncio.AbstractEventLoop | None
    _tasks: set[asyncio.Task[None]]
    _closed: bool

    def _loop_or_fail(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        if self._loop is None:
            raise RuntimeError("call `await consumer.start()` first (or use `async with`)")
        return self._loop

    # ----------------------------------------------------------------------------------- fetching

    def _start_fetch(self, st: _Assigned, *, from_timer: bool = False, ahead: bool = False) -> None:
        """Send the next fetch for `st` if it may have one now (`ahead`: a response about to be
        buffered is not counted yet)."""
        if from_timer:
            st.timer = None
        if (
            self._closed
            or st.busy is not None
            or st.timer is not None
            or st.position is None
            or st.poison is not None
            or len(st.chunks) + ahead > 1
            or self._assigned.get(st.tp) is not st
        ):
            return
        info = self._client.cached_topic(st.tp.topic)
        if info is None:
            token = st.busy = object()
            self._spawn(self._refresh_then_fetch(st, token))
            return
        core = info.owners[st.tp.partition]
        if core == NO_ROUTE:  # no live leader now: back off, then a fresh Metadata
            why = f"{st.tp.topic}/{st.tp.partition}: no live leader"
            self._fetch_failed(st, LeaderNotAvailableError(ErrorCode.NOT_OWNER, why))
            return
        conn = self._client.connection_nowait(core, st.lane)
        if conn is None:
            token = st.busy = object()
            self._spawn(self._connect_then_fetch(st, core, token))
            return
        wait = self.fetch_max_wait_ms if st.solo else 0
        req = FetchRequest(
            info.topic_id,
            st.tp.partition,
            st.fetch_offset,
            self.fetch_max_bytes,
            wait,
            self.fetch_min_bytes,
            self.isolation,
        )
        try:
            fut = conn.request_nowait(
                req, timeout=self.request_timeout + wait / 1000, decode=read_fetch_response
            )
        except BrokerUnavailable as exc:
            self._fetch_failed(st, exc)
            return
        st.busy = fut
        fut.add_done_callback(functools.partial(self._fetched, st, st.fetch_offset))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        loop = self._loop_or_fail()
        task = loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh_then_fetch(self, st: _Assigned, token: object) -> None:
        try:
            await self._client.topic(st.tp.topic)
        except (RingLogError, BrokerUnavailable) as exc:
            if st.busy is token:
                self._fetch_failed(st, exc)
            return
        if st.busy is token:
            st.busy = None
            self._start_fetch(st)

    async def _connect_then_fetch(self, st: _Assigned, core: int, token: object) -> None:
        try:
            await self._client.connection(core, st.lane)
        except BrokerUnavailable as exc:
            if st.busy is token:
                self._fetch_failed(st, exc)
            return
        except ClientClosedError:
            return
        if st.busy is token:
            st.busy = None
            self._start_fetch(st)

    def _fetched(self, st: _Assigned, offset: int, fut: asyncio.Future[FetchRecords]) -> None:
        if st.busy is not fut or self._closed:
            return  # a seek (or close) made this answer stale; the seek started a new fetch
        st.busy = None
        if fut.cancelled():
            self._fetch_failed(st, BrokerUnavailable("fetch cancelled"))
            return
        exc = fut.exception()
        if exc is not None:
            self._fetch_failed(st, exc)
            return
        resp = fut.result()
        if resp.error != ErrorCode.NONE:
            self._fetch_failed(st, error_for(resp.error, resp.message))
            return
        st.errors = 0
        st.storage_errors = 0
        st.high_watermark = resp.high_watermark
        if resp.start == resp.end:
            if st.solo:
                self._start_fetch(st)  # long-poll again
            else:
                self._later(st, self.fetch_idle)
            return
        ahead = _after_whole_batches(resp.body, resp.start, resp.end)
        if ahead > offset:
            # Ask for what follows before decoding this: the broker reads it meanwhile.
            st.fetch_offset = ahead
            self._start_fetch(st, ahead=True)
        records, next_offset, poison = self._decode(
            st.tp, resp.body, resp.start, resp.end, offset, resp.aborted
        )
        if poison is not None:
            # Hand out what decoded; poll raises once those are gone (see the module docstring).
            st.busy = None  # the fetch sent ahead (if any) is past the bad batch: drop its answer
            st.fetch_offset = next_offset
            st.poison = poison
            if records:
                with self._take:
                    st.chunks.append(records)
            log.warning("%s", poison)
            self._wake()
            return
        if next_offset <= offset:  # only a partial batch: cannot happen with a conforming broker
            self._errors.append(
                CorruptMessageError(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"{st.tp.topic}/{st.tp.partition}: no whole batch at offset {offset}",
                )
            )
            self._later(st, self.retry_backoff_max)
            self._wake()
            return
        st.fetch_offset = next_offset
        if records:
            with self._take:
                st.chunks.append(records)
            self._wake()
        self._start_fetch(st)

    def _decode(
        self,
        tp: TopicPartition,
        data: bytes | memoryview,
        start: int,
        end: int,
        offset: int,
        aborted: tuple[tuple[int, int], ...] = (),
    ) -> tuple[list[ConsumerRecord], int, UndecodableBatchError | None]:
        """Records at or after `offset` in `data[start:end]` (the first batch may start before it), the
        offset after the last whole batch decoded, and the batch that did not decode, if any
        (the records are then those before it, and the offset is where it starts). `aborted`:
        the answer's aborted transactions, whose batches are dropped (read_committed)."""
        dropped = _aborted_filter(aborted, data) if aborted else None
        out: list[ConsumerRecord] = []
        extend = out.extend
        next_offset = offset
        verify = self.check_crcs
        prefix = (tp.topic, tp.partition)
        batches = iter_batches(data, start, end)
        while True:
            try:
                item = next(batches, None)
            except BatchError as exc:  # a header that does not frame: where the batch ends is unknown
                return out, next_offset, UndecodableBatchError(*tp, next_offset, None, str(exc))
            if item is None:
                return out, next_offset, None
            pos, h = item
            after = h.next_offset
            if after <= offset:
                continue
            if dropped is not None and dropped(pos, h):
                next_offset = after
                continue
            if h.attributes & CONTROL_BIT:  # a transaction's marker: no record of the application's
                next_offset = after
                continue
            try:
                rows = decode_rows(data, pos, verify, prefix, ConsumerRecord)
            except BatchError as exc:
                at = max(h.base_offset, offset)
                return out, at, UndecodableBatchError(*tp, at, after, str(exc))
            if h.base_offset < offset:  # the fetch started inside this batch
                rows = [r for r in rows if r.offset >= offset]
            extend(rows)
            next_offset = after

    def _fetch_failed(self, st: _Assigned, exc: BaseException) -> None:
        st.busy = None
        if self._closed:
            return
        if isinstance(exc, OffsetOutOfRangeError):
            log.info(
                "%s/%d: offset %d out of range; resetting to %s",
                *st.tp,
                st.fetch_offset,
                self.auto_offset_reset,
            )
            st.seek(0)
            st.position = None  # poll resets it
            self._wake()
            return
        if isinstance(exc, UnknownTopicError | NotOwnerError) or (
            self._client.clustered and isinstance(exc, BrokerUnavailable)
        ):
            self._client.invalidate(st.tp.topic)  # in a cluster the leader's node may be down
        st.errors += 1
        if isinstance(exc, BrokerStorageError):
            st.storage_errors += 1
            if st.storage_errors > self.storage_error_retries:
                st.storage_errors = 0
                self._errors.append(
                    BrokerStorageError(
                        exc.code,
                        f"{st.tp.topic}/{st.tp.partition} at offset {st.fetch_offset}: "
                        f"{self.storage_error_retries + 1} fetches in a row failed: {exc.message}",
                    )
                )
                self._wake()
                log.warning("%s/%d: fetch at offset %d keeps failing: %s", *st.tp, st.fetch_offset, exc)
        retriable = isinstance(exc, BrokerUnavailable | NotOwnerError) or (
            isinstance(exc, ClientError) and exc.retriable
        )
        if not retriable:
            self._errors.append(exc)
            self._wake()
        log.debug("%s/%d: fetch failed: %s", *st.tp, exc)
        self._later(st, backoff_delay(st.errors - 1, self.retry_backoff, self.retry_backoff_max))

    def _later(self, st: _Assigned, delay: float) -> None:
        loop = self._loop_or_fail()
        if st.timer is not None:
            st.timer.cancel()
        st.timer = loop.call_later(delay, functools.partial(self._start_fetch, st, from_timer=True))

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()


def _aborted_filter(
    aborted: tuple[tuple[int, int], ...], data: bytes | memoryview
) -> Callable[[int, BatchHeader], bool]:
    """Whether a batch of one fetch answer is to be dropped as aborted, asked of each batch in
    log order (Kafka's consumer, `CompletedFetch`): a producer joins the aborted set when a
    batch at or past its aborted transaction's first offset is reached, and leaves it at its
    ABORT marker; its transactional batches in between are dropped. Markers are dropped too
    (the caller skips them anyway)."""
    pending = sorted(aborted, key=lambda a: a[1])  # by first offset
    active: set[int] = set()

    def dropped(pos: int, h: BatchHeader) -> bool:
        last = h.next_offset - 1
        while pending and pending[0][1] <= last:
            active.add(pending.pop(0)[0])
        if h.attributes & CONTROL_BIT:
            if h.producer_id in active:
                try:
                    marker = control_of(data, pos, False)
                except BatchError:
                    return True
                if not marker.commit:
                    active.discard(h.producer_id)
            return True
        return bool(h.attributes & TRANSACTIONAL_BIT) and h.producer_id in active

    return dropped


def _after_whole_batches(data: bytes | memoryview, start: int, end: int) -> int:
    """The offset after the last whole batch of `data[start:end]` whose header frames (-1: none),
    from the headers alone: where the next fetch starts if this one decodes."""
    after = -1
    try:
        for _pos, h in iter_batches(data, start, end):
            after = h.next_offset
    except BatchError:
        pass  # the decode names it; the batches before it are still whole
    return after
