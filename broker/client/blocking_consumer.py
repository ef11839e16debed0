"""The blocking consumer: an `AsyncConsumer` on an event loop in a daemon thread (`loop_thread.py`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping

from broker.client.client import DEFAULT_BOOTSTRAP, TopicPartition
from broker.client.consumer import AsyncConsumer, TPLike
from broker.client.errors import ClientClosedError
from broker.client.loop_thread import LoopThread
from broker.client.records import ConsumerRecord
from broker.client.transactions import ConsumerGroupMetadata


class Consumer:
    """The blocking consumer: an `AsyncConsumer` on an event loop in a daemon thread.

    Same parameters as `AsyncConsumer`. Iterating (`for record in consumer`) polls and yields
    records one by one until `close()` or, with `iter_timeout_ms`, until that long passes idle.

    The loop thread fetches and decodes ahead while the caller works; `poll` takes what is
    buffered straight from the caller's thread (a lock, no round trip through the loop: that
    cost ~5% of the CPU at the default 500 records a poll) and goes through the loop only to wait
    for records, raise what a fetch met, reset positions or auto-commit.
    """

    def __init__(self, bootstrap: str = DEFAULT_BOOTSTRAP, **config: object) -> None:
        self._thread = LoopThread("ringlog-consumer")
        try:
            self._async: AsyncConsumer = self._thread.run(self._make(bootstrap, config))
        except BaseException:
            self._thread.stop()
            raise
        self._buffer: deque[ConsumerRecord] = deque()
        self._closed = False

    @staticmethod
    async def _make(bootstrap: str, config: dict[str, object]) -> AsyncConsumer:
        consumer = AsyncConsumer(bootstrap, **config)  # type: ignore[arg-type]
        try:
            await consumer.start()
        except BaseException:
            await consumer.close(commit=False)
            raise
        return consumer

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: object, timeout: float | None = None) -> object:
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        return self._thread.run(coro, timeout)  # type: ignore[arg-type]

    @property
    def group(self) -> str | None:
        return self._async.group

    def assign(self, partitions: Iterable[TPLike]) -> None:
        self._run(self._async.assign(list(partitions)))

    def subscribe(self, *topics: str) -> None:
        self._run(self._async.subscribe(*topics))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """See `AsyncConsumer.group_metadata`."""
        return self._async.group_metadata()

    def assignment(self) -> list[TopicPartition]:
        return self._async.assignment()

    def position(self, tp: TPLike) -> int | None:
        return self._async.position(tp)

    def highwater(self, tp: TPLike) -> int:
        return self._async.highwater(tp)

    def seek(self, tp: TPLike, offset: int) -> None:
        self._buffer.clear()
        self._thread.run(_call(self._async.seek, tp, offset))

    def seek_to_beginning(self, *tps: TPLike) -> dict[TopicPartition, int]:
        self._buffer.clear()
        return self._run(self._async.seek_to_beginning(*tps))  # type: ignore[return-value]

    def seek_to_end(self, *tps: TPLike) -> dict[TopicPartition, int]:
        self._buffer.clear()
        return self._run(self._async.seek_to_end(*tps))  # type: ignore[return-value]

    def seek_to_timestamp(self, timestamp: int, *tps: TPLike) -> dict[TopicPartition, int]:
        self._buffer.clear()
        return self._run(self._async.seek_to_timestamp(timestamp, *tps))  # type: ignore[return-value]

    def poll(self, timeout_ms: float = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """See `AsyncConsumer.poll`. Records already buffered are taken from this thread
        (`AsyncConsumer.poll_buffered`); only waiting and the rest go through the loop thread."""
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        got = self._async.poll_buffered(max_records)
        if got is not None:
            return got
        return self._run(self._async.poll(timeout_ms, max_records))  # type: ignore[return-value]

    def commit(self, offsets: Mapping[TPLike, int] | None = None, metadata: str = "") -> None:
        self._run(self._async.commit(offsets, metadata))

    def committed(self, tp: TPLike) -> int | None:
        return self._run(self._async.committed(tp))  # type: ignore[return-value]

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Records one by one, polled `max_poll_records` at a time (one thread round trip per
        poll, not per record). Positions advance per poll, so an explicit `commit()` in the middle
        of a polled batch covers the rest of the batch too; auto-commit runs inside the next poll,
        after the whole batch was iterated, and stays at-least-once."""
        idle_ms = self._async.iter_timeout_ms
        while not self._closed:
            if not self._buffer:
                got = self.poll(1000 if idle_ms is None else idle_ms)
                if not got:
                    if idle_ms is not None:
                        return
                    continue
                self._buffer.extend(got)
            yield self._buffer.popleft()

    def close(self, *, commit: bool | None = None, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        try:
            self._thread.run(self._async.close(commit=commit), timeout)
        finally:
            self._closed = True
            self._thread.stop()


async def _call(fn: object, *args: object) -> object:
    return fn(*args)  # type: ignore[operator]
