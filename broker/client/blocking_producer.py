"""The blocking producer: an `AsyncProducer` on an event loop in a daemon thread (`loop_thread.py`)."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from broker.client.accumulator import Callback, prepare_record
from broker.client.client import DEFAULT_BOOTSTRAP
from broker.client.errors import ClientClosedError
from broker.client.loop_thread import LoopThread
from broker.client.producer import AsyncProducer
from broker.client.records import Header, RecordMetadata
from broker.client.sender import ProducerPartition
from broker.client.transactions import ConsumerGroupMetadata
from ringlog_proto.batch import Record

_FINISHED: Final = "FINISHED"  # concurrent.futures._base's state names
_PENDING: Final = "PENDING"
_DONE_STATES: Final = frozenset({"CANCELLED", "CANCELLED_AND_NOTIFIED", _FINISHED})
_LAZY = threading.Lock()  # orders a future's lazy Condition against its completion (see _SendFuture)
_allocate_lock = threading.Lock  # a bare lock (`_thread.allocate_lock`), a name lookup less


class _SendFuture(concurrent.futures.Future[Any]):
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
        self._gate: threading.Lock | None = None  # a held lock that completion releases (see `result`)

    def _parts(self) -> tuple[threading.Condition, list[Any], list[Any]]:
        lazy = self._lazy
        if lazy is None:
            with _LAZY:
                lazy = self._lazy
                if lazy is None:
                    lazy = self._lazy = (threading.Condition(), [], [])
        return lazy

    # The base class's methods reach these as attributes; read-only properties made on first use
    # stand in for them, which mypy sees as overriding writable attributes.
    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._parts()[0]

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        return self._parts()[1]

    @property
    def _done_callbacks(self) -> list[Any]:
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
                # Blocks on its own gate unless finished meanwhile or another waiter has the gate.
                gated = self._state != _FINISHED and self._gate is None
                if gated:
                    self._gate = gate
            if not gated:
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
        # The base class's own (private, so absent from typeshed): it runs the done-callbacks.
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

    # ----------------------------------------------------------------------------------- transactions
    # AsyncProducer's, on the loop thread; records handed over before a commit or abort belong
    # to that transaction (the hand-off is taken first).

    def init_transactions(self) -> None:
        """See `AsyncProducer.init_transactions`."""
        self._thread.run(self._async.init_transactions())

    def begin_transaction(self) -> None:
        """See `AsyncProducer.begin_transaction`."""
        self._thread.run(self._in_loop(self._async.begin_transaction))

    def send_offsets_to_transaction(
        self, offsets: Mapping[tuple[str, int], int], group: str | ConsumerGroupMetadata
    ) -> None:
        """See `AsyncProducer.send_offsets_to_transaction`."""
        self._thread.run(self._async.send_offsets_to_transaction(offsets, group))

    def commit_transaction(self) -> None:
        """See `AsyncProducer.commit_transaction`."""
        self._thread.run(self._ending(self._async.commit_transaction))

    def abort_transaction(self) -> None:
        """See `AsyncProducer.abort_transaction`."""
        self._thread.run(self._ending(self._async.abort_transaction))

    async def _in_loop(self, call: Callable[[], None]) -> None:
        self._take_handoff()
        call()

    async def _ending(self, end: Callable[[], Awaitable[None]]) -> None:
        self._take_handoff()
        await end()

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
        if ap._txn is not None:
            ap._txn.check_send()  # misuse raised here, in the caller's thread
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
        touched: dict[ProducerPartition, None] = {}  # in the order first touched
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
