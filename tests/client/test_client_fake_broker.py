"""Connection and producer behaviour against an in-process fake broker with scripted failures:
pipelining, connection loss, timeouts, batching boundaries, retries with the same bytes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from fakebroker import Action, FakeBroker, Received

from broker.client import (
    AsyncConnection,
    AsyncConsumer,
    AsyncProducer,
    BrokerUnavailable,
    CorruptMessageError,
    DeliveryTimeoutError,
    InvalidRequestError,
    OutOfOrderSequenceError,
    Producer,
    UnknownTopicError,
)
from broker.client.accumulator import BATCH_OVERHEAD, RECORD_SLACK
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches, encode_batch

T = TypeVar("T")


def run(fn: Callable[[FakeBroker], Awaitable[T]], topics: dict[str, int] | None = None) -> T:
    async def main() -> T:
        broker = await FakeBroker(topics).start()
        try:
            return await asyncio.wait_for(fn(broker), 30)
        finally:
            await broker.stop()

    return asyncio.run(main())


# ----------------------------------------------------------------------------------- connection


def test_pipelined_requests_resolve_by_correlation_id() -> None:
    async def body(broker: FakeBroker) -> None:
        conn = await AsyncConnection.connect("127.0.0.1", broker.port)
        resps = await asyncio.gather(*(conn.request(m.MetadataRequest(("t",))) for _ in range(50)))
        assert all(isinstance(r, m.MetadataResponse) and r.topics[0].topic_id == 1 for r in resps)
        err = await conn.request(m.MetadataRequest(("nope",)))
        assert err.topics[0].error == m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        await conn.close()
        assert conn.closed

    run(body)


def test_connection_loss_fails_everything_in_flight() -> None:
    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda r, i: Action.HANG
        conn = await AsyncConnection.connect("127.0.0.1", broker.port)
        futs = [
            asyncio.ensure_future(conn.request(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x"))))
            for _ in range(5)
        ]
        while len(broker.received) < 5:
            await asyncio.sleep(0.01)
        broker.drop_all()
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert all(isinstance(r, BrokerUnavailable) and isinstance(r, ConnectionError) for r in results)
        assert conn.closed
        with pytest.raises(BrokerUnavailable):
            await conn.request(m.MetadataRequest())

    run(body)


def test_request_timeout_closes_the_connection() -> None:
    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda r, i: Action.HANG
        conn = await AsyncConnection.connect("127.0.0.1", broker.port, request_timeout=0.2)
        t0 = time.monotonic()
        with pytest.raises(BrokerUnavailable, match=r"within 0\.2 s"):
            await conn.request(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x")))
        assert 0.15 < time.monotonic() - t0 < 2
        assert conn.closed

    run(body)


def test_one_timer_follows_the_earliest_deadline() -> None:
    """The connection's one timer (module docstring): a request answered in time leaves no
    deadline behind, a later one times out at its own deadline rather than the first one's, and a
    shorter timeout sent behind a longer one still fires at its own."""

    async def body(broker: FakeBroker) -> None:
        conn = await AsyncConnection.connect("127.0.0.1", broker.port, request_timeout=0.3)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:  # three timeouts' worth of answered requests
            await conn.request(m.MetadataRequest(("t",)))
        assert not conn.closed
        await conn.request(m.MetadataRequest(("t",)))  # arms the timer for now + 0.3
        await asyncio.sleep(0.2)
        broker.on_produce = lambda r, i: Action.HANG
        t1 = time.monotonic()
        with pytest.raises(BrokerUnavailable, match=r"within 0\.3 s"):
            await conn.request(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x")))
        assert 0.25 < time.monotonic() - t1 < 2  # its own deadline, not the first request's
        assert conn.closed

        conn = await AsyncConnection.connect("127.0.0.1", broker.port, request_timeout=30)
        slow = conn.request_nowait(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x")), timeout=20)
        t2 = time.monotonic()
        with pytest.raises(BrokerUnavailable, match=r"within 0\.2 s"):
            await conn.request(m.ProduceRequest(1, 0, 1, 1000, _batch(b"y")), timeout=0.2)
        assert time.monotonic() - t2 < 2
        with pytest.raises(BrokerUnavailable):
            await slow  # everything in flight fails with the connection

    run(body)


class _Sink:
    """A `ResponseSink` that records what reached it, and whether the read callback was still
    running (a call made in `buffer_updated` itself, not a loop turn later)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.results: list[object] = []
        self.errors: list[BaseException] = []
        self.inline: list[bool] = []
        self.arrived = asyncio.Event()

    def done(self) -> bool:
        return bool(self.results or self.errors)

    def set_result(self, result: object) -> None:
        self.results.append(result)
        self.inline.append(self.conn._in_read)  # type: ignore[attr-defined]
        self.arrived.set()

    def set_exception(self, exc: BaseException) -> None:
        self.errors.append(exc)
        self.arrived.set()


def test_a_sink_gets_its_response_in_the_read_callback() -> None:
    """`request_to`: the decoded response is handed over inside the read callback (the producer's
    loop turn saved); a failure of the connection reaches the sink as `BrokerUnavailable`, and a
    request on a failed connection raises at once."""

    async def body(broker: FakeBroker) -> None:
        conn = await AsyncConnection.connect("127.0.0.1", broker.port)
        conn._in_read = False  # type: ignore[attr-defined]
        reads = conn._buffer_updated  # what the transport's read callback calls

        def buffer_updated(nbytes: int) -> None:
            conn._in_read = True  # type: ignore[attr-defined]
            try:
                reads(nbytes)
            finally:
                conn._in_read = False  # type: ignore[attr-defined]

        conn._buffer_updated = buffer_updated  # type: ignore[method-assign]
        sink = _Sink(conn)
        conn.request_to(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x")), sink)
        await sink.arrived.wait()
        (resp,) = sink.results
        assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE
        assert sink.inline == [True] and not sink.errors and conn.in_flight == 0

        broker.on_produce = lambda r, i: Action.HANG
        hung = _Sink(conn)
        conn.request_to(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x")), hung)
        while len(broker.received) < 2:
            await asyncio.sleep(0.01)
        broker.drop_all()
        await hung.arrived.wait()
        assert not hung.results and isinstance(hung.errors[0], BrokerUnavailable)
        with pytest.raises(BrokerUnavailable):
            conn.request_to(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x")), _Sink(conn))

    run(body)


def test_error_responses_raise_their_class_unless_unchecked() -> None:
    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda r, i: m.ErrorCode.CORRUPT_MESSAGE
        conn = await AsyncConnection.connect("127.0.0.1", broker.port)
        with pytest.raises(CorruptMessageError) as info:
            await conn.request(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x")))
        assert info.value.code == m.ErrorCode.CORRUPT_MESSAGE and not info.value.retriable
        resp = await conn.request(m.ProduceRequest(1, 0, 1, 1000, _batch(b"x")), check=False)
        assert resp.error == m.ErrorCode.CORRUPT_MESSAGE
        with pytest.raises(ValueError, match="send_no_response"):
            await conn.request(m.ProduceRequest(1, 0, 0, 1000, _batch(b"x")))
        await conn.close()

    run(body)


def test_connect_refused_is_broker_unavailable() -> None:
    async def body(broker: FakeBroker) -> None:
        await broker.stop()
        with pytest.raises(BrokerUnavailable, match="cannot connect"):
            await AsyncConnection.connect("127.0.0.1", broker.port)

    async def main() -> None:
        broker = await FakeBroker().start()
        await body(broker)

    asyncio.run(main())


# ----------------------------------------------------------------------------------- batching


def test_batches_fill_to_batch_bytes_and_no_further() -> None:
    record = 9 + 100 + RECORD_SLACK  # 2-byte length varints: 9 bytes of framing
    batch_bytes = BATCH_OVERHEAD + 10 * record  # exactly ten 100-byte values

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, batch_bytes=batch_bytes, linger_ms=1000) as p:
            futs = [await p.send("t", b"v" * 100, partition=0) for _ in range(35)]
            await p.flush()
            offsets = [f.result().offset for f in futs]
        assert offsets == list(range(35))
        sizes = [len(r.records) for r in broker.received]
        counts = [r.record_count for r in broker.received]
        assert counts == [10, 10, 10, 5]  # sealed when full, the rest sent by flush
        assert sizes[:3] == [batch_bytes - 10 * RECORD_SLACK] * 3  # the slack is not sent
        assert all(s <= batch_bytes for s in sizes)

    run(body)


def test_linger_sends_a_partial_batch() -> None:
    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, linger_ms=50) as p:
            t0 = time.monotonic()
            fut = await p.send("t", b"one")
            md = await fut
            elapsed = time.monotonic() - t0
        assert md.offset == 0 and md.topic == "t" and md.partition == 0
        assert 0.04 < elapsed < 1.0

    run(body)


def test_each_batch_goes_at_the_end_of_its_own_linger() -> None:
    """One timer serves every lingering batch, in the order they opened (`_lingers_due`): each
    still goes when its own linger ends, not with an earlier one's; and a batch that went early
    (full) does not send the one opened after it on its partition at the first one's time."""

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, linger_ms=300, batch_bytes=1000) as p:
            t0 = time.monotonic()
            acked: dict[str, float] = {}

            async def sent(name: str, fut: asyncio.Future[Any]) -> None:
                await fut
                acked[name] = time.monotonic() - t0

            waits = [asyncio.ensure_future(sent("a", await p.send("t", b"a", partition=0)))]
            waits.append(asyncio.ensure_future(sent("full", await p.send("t", b"f" * 1000, partition=1))))
            await asyncio.sleep(0.15)
            waits.append(asyncio.ensure_future(sent("b", await p.send("t", b"b", partition=2))))
            waits.append(asyncio.ensure_future(sent("after", await p.send("t", b"x", partition=1))))
            await asyncio.gather(*waits)
        assert acked["full"] < 0.15, acked  # full at once: sealed and sent
        assert 0.28 < acked["a"] < 0.42, acked  # its own linger
        # opened 0.15 s later: their own linger, not a's (nor the full batch's, on partition 1)
        assert acked["b"] > 0.43 and acked["after"] > 0.43, acked

    run(body, topics={"t": 3})


def test_a_connection_at_its_bound_lets_lingered_batches_fill() -> None:
    """With `max_in_flight_per_connection` requests unanswered, the other partitions' lingered
    batches wait and keep taking records: one request each carries them all once answers come,
    and the connection never holds more than the bound unanswered."""

    async def body(broker: FakeBroker) -> None:
        most = 0

        def hold(rec: Received, i: int) -> Action:
            nonlocal most
            if i == 0:
                return Action.OK  # the warm-up: metadata and the connection made
            most = max(most, len(broker.held) + 1)
            return Action.HOLD

        broker.on_produce = hold
        async with AsyncProducer(broker.bootstrap, linger_ms=1, max_in_flight_per_connection=3) as p:
            await (await p.send("w", b"warm-up"))
            futs = [await p.send("t", b"first", partition=k) for k in range(20)]
            await _until(lambda: len(broker.received) == 4)
            await asyncio.sleep(0.05)  # every linger has passed: 17 partitions wait for room
            assert len(broker.received) == 4
            futs += [await p.send("t", b"more", partition=k) for k in range(20) for _ in range(5)]
            while not all(f.done() for f in futs):
                broker.release()
                await asyncio.sleep(0.005)
            mds = [f.result() for f in futs]
        assert most == 3
        waited = broker.received[4:21]
        assert sorted(r.partition for r in waited) == list(range(3, 20))
        assert all(r.record_count == 6 for r in waited)  # its first record and the 5 after
        for k in range(20):
            values = [r.value for r in decode_batches(b"".join(broker.log("t", k).batches))]
            assert values == [b"first"] + [b"more"] * 5
        assert sorted((md.partition, md.offset) for md in mds) == [
            (k, o) for k in range(20) for o in range(6)
        ]

    run(body, topics={"t": 20, "w": 1})


def test_partitions_waiting_for_room_go_once_the_connection_is_lost() -> None:
    """A connection lost with partitions waiting for room: its failures free the room, and the
    waiting batches go (with the failed ones, retried) on the next connection."""

    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda rec, i: Action.HANG if 1 <= i <= 2 else Action.OK
        async with AsyncProducer(
            broker.bootstrap, linger_ms=1, max_in_flight_per_connection=2, retry_backoff_ms=10
        ) as p:
            await (await p.send("w", b"warm-up"))
            futs = [await p.send("t", b"x", partition=k) for k in range(8)]
            await _until(lambda: len(broker.received) == 3)
            await asyncio.sleep(0.03)
            assert len(broker.received) == 3
            broker.drop_all()
            mds = await asyncio.gather(*futs)
        assert sorted((md.partition, md.offset) for md in mds) == [(k, 0) for k in range(8)]
        assert broker.connections >= 2  # the lost one and the one they went on

    run(body, topics={"t": 8, "w": 1})


async def _until(what: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.002)


def test_keyed_records_keep_order_per_partition() -> None:
    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, batch_bytes=4096) as p:
            futs = [await p.send("t", f"{i}".encode(), key=f"k{i % 7}".encode()) for i in range(500)]
            await p.flush()
        by_key: dict[bytes, list[int]] = {}
        for part in range(4):
            recs = decode_batches(b"".join(broker.log("t", part).batches))
            for r in recs:
                assert r.key is not None and r.value is not None
                by_key.setdefault(r.key, []).append(int(r.value))
        assert all(v == sorted(v) for v in by_key.values())
        assert sum(len(v) for v in by_key.values()) == 500
        parts = {f.result().partition for f in futs}
        assert len(parts) > 1

    run(body, topics={"t": 4})


def test_unknown_topic_and_partition_fail_the_future() -> None:
    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap) as p:
            fut = await p.send("missing", b"x")
            with pytest.raises(UnknownTopicError):
                await fut
            fut = await p.send("t", b"x", partition=3)
            with pytest.raises(UnknownTopicError, match="no partition 3"):
                await fut

    run(body)


def test_callbacks_run_with_metadata_or_error() -> None:
    async def body(broker: FakeBroker) -> None:
        seen: list[tuple[object, object]] = []
        async with AsyncProducer(broker.bootstrap) as p:
            await p.send("t", b"a", callback=lambda md, exc: seen.append((md, exc)))
            await p.send("missing", b"b", callback=lambda md, exc: seen.append((md, exc)))
            await p.flush()
            await asyncio.sleep(0.05)
        assert len(seen) == 2
        ok = next(s for s in seen if s[1] is None)
        bad = next(s for s in seen if s[1] is not None)
        assert ok[0].offset == 0  # type: ignore[union-attr]
        assert bad[0] is None and isinstance(bad[1], UnknownTopicError)

    run(body)


# ----------------------------------------------------------------------------------- retries


def test_retry_after_lost_connection_resends_same_bytes_and_dedupes() -> None:
    """The broker appended the batch, then the connection died before the answer: the retry
    carries the same producer id, epoch and sequence, and the broker answers from its dedupe."""

    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda r, i: Action.APPEND_THEN_DROP if i == 0 else Action.OK
        async with AsyncProducer(broker.bootstrap, retry_backoff_ms=10) as p:
            fut = await p.send("t", b"once")
            md = await fut
        assert md.offset == 0
        first, second = broker.received
        assert first.records == second.records  # byte for byte
        assert first.producer_id == p.producer_id and first.base_sequence == 0
        assert broker.log("t", 0).end == 1  # appended once
        assert broker.connections >= 2

    run(body)


def test_retriable_error_is_retried_non_retriable_is_not() -> None:
    async def body(broker: FakeBroker) -> None:
        codes = {0: m.ErrorCode.STORAGE_ERROR, 1: m.ErrorCode.NOT_OWNER}
        broker.on_produce = lambda r, i: codes.get(i, Action.OK)
        async with AsyncProducer(broker.bootstrap, retry_backoff_ms=5) as p:
            assert (await (await p.send("t", b"a"))).offset == 0
            assert len(broker.received) == 3
            broker.on_produce = lambda r, i: m.ErrorCode.CORRUPT_MESSAGE
            with pytest.raises(CorruptMessageError):
                await (await p.send("t", b"b"))
            assert len(broker.received) == 4  # not retried

    run(body)


def test_send_and_wait_does_not_wait_for_the_linger() -> None:
    """`send_and_wait` sends its record's batch at once, with the records already waiting in it,
    also when the record was parked while the topic's metadata was looked up (the first send)."""

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, linger_ms=5000) as p:
            t0 = time.monotonic()
            first = await p.send_and_wait("t", b"first", partition=0)
            early = await p.send("t", b"early", partition=0)
            late = await p.send_and_wait("t", b"late", partition=0)
            assert time.monotonic() - t0 < 2.5  # the linger is 5 s
            assert (first.offset, (await early).offset, late.offset) == (0, 1, 2)
        assert [r.record_count for r in broker.received] == [1, 2]

    run(body)


def _lane_counted(p: AsyncProducer) -> list[bool]:
    """Whether each `send_and_wait` from now on went out alone (True) or took the general path."""
    taken: list[bool] = []
    alone = p._send_alone

    def counted(*args: object) -> object:
        fut = alone(*args)  # type: ignore[arg-type]
        taken.append(fut is not None)
        return fut

    p._send_alone = counted  # type: ignore[method-assign]
    return taken


def test_send_and_wait_on_an_idle_partition_sends_its_batch_at_once() -> None:
    """Once the topic's metadata and connection are there, a one-at-a-time caller's record is
    made into its batch and written in the call itself (the lane), numbered in sequence as the
    general path numbers it; the broker's dedupe takes every one."""

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, linger_ms=5000) as p:
            taken = _lane_counted(p)
            offsets = [(await p.send_and_wait("t", b"%d" % i, partition=0)).offset for i in range(6)]
        assert offsets == list(range(6))
        assert taken == [False] + [True] * 5  # the first waited for metadata and a connection
        assert [(r.base_sequence, r.record_count) for r in broker.received] == [(i, 1) for i in range(6)]
        assert {r.producer_id for r in broker.received} == {p.producer_id}
        assert [_value(r) for r in broker.received] == [b"%d" % i for i in range(6)]

    run(body)


def test_send_and_wait_beside_batching_sends_keeps_order_and_sequences() -> None:
    """Callers waiting one record at a time and others batching share a partition: each record
    lands once, in its caller's order, and the sequences the broker sees run on without a gap
    whichever path each batch took."""

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, linger_ms=1) as p:
            await p.send_and_wait("t", b"warm", partition=0)
            taken = _lane_counted(p)

            async def waiter(name: bytes, n: int) -> None:
                for i in range(n):
                    await p.send_and_wait("t", b"%s%d" % (name, i), partition=0)

            async def batcher(n: int) -> None:
                futs = []
                for i in range(n):
                    futs.append(await p.send("t", b"b%d" % i, partition=0))
                    if i % 7 == 0:
                        await asyncio.sleep(0)
                await asyncio.gather(*futs)

            await asyncio.gather(waiter(b"a", 40), batcher(200), waiter(b"c", 40))
        assert True in taken and False in taken  # both paths ran
        seq = 0
        for r in broker.received:
            assert r.base_sequence == seq
            seq += r.record_count
        values = [rec.value for r in broker.received for rec in decode_batches(r.records)]
        assert values[0] == b"warm" and len(values) == len(set(values)) == 281
        for name, n in ((b"a", 40), (b"b", 200), (b"c", 40)):
            assert [v for v in values if v[:1] == name] == [b"%s%d" % (name, i) for i in range(n)]
        assert broker.log("t", 0).end == 281

    run(body)


def test_a_batch_sent_alone_is_retried_with_the_same_bytes() -> None:
    """The lane's batch is the general path's: appended, its answer lost with the connection, it
    is sent again byte for byte and the broker answers from its dedupe."""

    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda r, i: Action.APPEND_THEN_DROP if i == 1 else Action.OK
        async with AsyncProducer(broker.bootstrap, retry_backoff_ms=10) as p:
            await p.send_and_wait("t", b"warm", partition=0)
            taken = _lane_counted(p)
            md = await p.send_and_wait("t", b"once", partition=0)
            after = await p.send_and_wait("t", b"after", partition=0)
        assert taken[0] is True and (md.offset, after.offset) == (1, 2)
        _warm, first, second, _after = broker.received
        assert first.records == second.records and first.base_sequence == 1
        assert broker.log("t", 0).end == 3

    run(body)


def test_a_lane_write_that_fails_changes_nothing_and_the_record_takes_the_general_path() -> None:
    """The lane writes before it touches the partition: a write that fails leaves the sequence
    where it was, and the record goes the general way (a new connection) with that sequence."""

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, linger_ms=0, retry_backoff_ms=5) as p:
            await p.send_and_wait("t", b"warm", partition=0)
            conn = p._client.connection_nowait(p._client.cached_topic("t").owners[0])  # type: ignore[union-attr]
            assert conn is not None
            real = conn.write_frame

            def failing(frame: bytes) -> None:
                conn._fail(BrokerUnavailable("cut"))  # what a failed write does, then raises
                raise BrokerUnavailable("cut")

            conn.write_frame = failing  # type: ignore[method-assign]
            taken = _lane_counted(p)
            md = await p.send_and_wait("t", b"after a failed write", partition=0)
            conn.write_frame = real  # type: ignore[method-assign]
        assert taken == [False] and md.offset == 1
        assert [(_value(r), r.base_sequence) for r in broker.received] == [
            (b"warm", 0),
            (b"after a failed write", 1),
        ]

    run(body)


def test_expect_after_the_connection_failed_tells_the_sink() -> None:
    """`expect` on a connection that failed after `write_frame` wrote: the sink hears of it (on
    the loop, as a failure it would have met in flight), nothing is left pending."""

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap) as p:
            await p.send_and_wait("t", b"warm", partition=0)
            conn = p._client.connection_nowait(p._client.cached_topic("t").owners[0])  # type: ignore[union-attr]
            assert conn is not None
            tid = p._client.cached_topic("t").topic_id  # type: ignore[union-attr]
            corr = conn.claim_id()
            conn.write_frame(m.encode_produce_values(corr, tid, 0, 1, 5000, [b"x"], 1, -1, -1, -1))
            conn._fail(BrokerUnavailable("gone"))
            sink: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            conn.expect(corr, sink, m.ProduceRequest.API_KEY)
            with pytest.raises(BrokerUnavailable, match="gone"):
                await asyncio.wait_for(sink, 5)
            assert not conn._pending

    run(body)


def test_a_batch_sent_alone_behind_one_in_flight_is_retried_behind_it() -> None:
    """Both batches in flight fail: the round retries them in the order they were first sent,
    the lane's batch numbered in that order like any other."""

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, linger_ms=0, retry_backoff_ms=5) as p:
            await p.send_and_wait("t", b"warm", partition=0)
            broker.on_produce = lambda r, i: m.ErrorCode.STORAGE_ERROR if i in (1, 2) else Action.OK
            taken = _lane_counted(p)
            batched = await p.send("t", b"batched", partition=0)
            await asyncio.sleep(0)  # its linger (0) ends: it is in flight
            alone = await p.send_and_wait("t", b"alone", partition=0)
            assert ((await batched).offset, alone.offset) == (1, 2)
        assert taken == [True]
        assert [_value(r) for r in broker.received] == [b"warm", b"batched", b"alone", b"batched", b"alone"]

    run(body)


def test_keyless_send_and_wait_moves_the_sticky_partition_on_each_batch() -> None:
    """A keyless record waited for alone is a sealed batch: the sticky partition moves on after
    each, round robin, in the lane as in the general path."""

    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap) as p:
            first = (await p.send_and_wait("t", b"x")).partition
            taken = _lane_counted(p)
            parts = [(await p.send_and_wait("t", b"x")).partition for _ in range(9)]
        assert all(taken[3:])  # each partition's first send opened its state: general path
        assert parts == [(first + 1 + i) % 3 for i in range(9)]

    run(body, topics={"t": 3})


def test_blocking_producer_sends_a_lone_record_alone_with_its_callback() -> None:
    """With linger 0, a hand-off of one record (a caller waiting on each send) goes out through
    the lane on the loop thread, its callback run with its metadata, in sequence."""

    async def body(broker: FakeBroker) -> None:
        def produce() -> tuple[list[int], list[bool], list[int]]:
            called: list[int] = []
            with Producer(broker.bootstrap, linger_ms=0) as p:
                p.send("t", b"warm", partition=0).result(5)
                taken = _lane_counted(p._async)
                offsets = [
                    p.send("t", b"%d" % i, partition=0, callback=lambda md, exc: called.append(md.offset))
                    .result(5)
                    .offset
                    for i in range(5)
                ]
            return offsets, taken, called

        offsets, taken, called = await asyncio.to_thread(produce)
        assert offsets == called == [1, 2, 3, 4, 5]
        assert taken == [True] * 5
        assert [(r.base_sequence, r.record_count) for r in broker.received] == [(i, 1) for i in range(6)]

    run(body)


def test_blocking_producer_with_linger_0_sends_each_hand_off_as_one_batch() -> None:
    """With linger 0 the blocking producer sends what one hand-off brought at once, as one batch
    per partition (not a record per request, nor one loop turn later)."""

    async def body(broker: FakeBroker) -> None:
        def produce() -> list[int]:
            with Producer(broker.bootstrap, linger_ms=0) as p:
                p.send("t", b"warm", partition=0).result(5)  # metadata and connection
                p._thread.call_soon(time.sleep, 0.3)  # the loop busy: the next sends make one hand-off
                futs = [p.send("t", b"%d" % i, partition=0) for i in range(10)]
                return [f.result(5).offset for f in futs]

        assert await asyncio.to_thread(produce) == list(range(1, 11))
        assert [r.record_count for r in broker.received] == [1, 10]

    run(body)


def test_gap_after_a_refused_batch_is_renumbered() -> None:
    """Batch 1 of 3 in flight is refused for good; the broker then refuses batch 2 and 3 as out of
    order. The producer gives batch 1 up, renumbers 2 and 3 from batch 1's sequence, and they land."""

    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda r, i: m.ErrorCode.INVALID_REQUEST if i == 1 else Action.OK
        async with AsyncProducer(broker.bootstrap, batch_bytes=BATCH_OVERHEAD + 19, linger_ms=0) as p:
            f0 = await p.send("t", b"0")
            await f0
            futs = [await p.send("t", f"{i}".encode()) for i in (1, 2, 3)]
            results = await asyncio.gather(*futs, return_exceptions=True)
        assert isinstance(results[0], InvalidRequestError)
        assert [r.offset for r in results[1:]] == [1, 2]  # type: ignore[union-attr]
        values = [r.value for r in decode_batches(b"".join(broker.log("t", 0).batches))]
        assert values == [b"0", b"2", b"3"]
        seqs = [(r.base_sequence, r.epoch) for r in broker.received]
        assert seqs[0] == (0, 0) and seqs[1] == (1, 0)
        assert seqs[-2:] == [(1, 0), (2, 0)]  # renumbered into the gap, same epoch

    run(body)


def test_delivery_timeout_when_the_broker_is_gone() -> None:
    async def body(broker: FakeBroker) -> None:
        p = AsyncProducer(broker.bootstrap, delivery_timeout_ms=300, retry_backoff_ms=20)
        await p.start()
        await broker.stop()
        broker.drop_all()
        t0 = time.monotonic()
        fut = await p.send("t", b"lost")
        with pytest.raises(DeliveryTimeoutError):
            await fut
        assert time.monotonic() - t0 < 3
        await p.close()

    run(body)


def test_acks_zero_gets_no_response_and_offsets_are_unknown() -> None:
    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, acks=0) as p:
            futs = [await p.send("t", b"x") for _ in range(10)]
            await p.flush()
        assert all(f.result().offset == -1 for f in futs)
        for _ in range(100):
            if broker.log("t", 0).end == 10:
                break
            await asyncio.sleep(0.01)
        assert broker.log("t", 0).end == 10

    run(body)


def test_consumer_skips_records_before_the_position_in_a_fetched_batch() -> None:
    async def body(broker: FakeBroker) -> None:
        async with AsyncProducer(broker.bootstrap, linger_ms=50) as p:
            for i in range(10):
                await p.send("t", f"{i}".encode())
            await p.flush()
        assert len(broker.log("t", 0).batches) == 1  # one batch holding offsets 0..9
        async with AsyncConsumer(broker.bootstrap, fetch_max_wait_ms=0) as c:
            await c.assign([("t", 0)])
            c.seek(("t", 0), 6)
            recs = await c.poll(2000)
        assert [r.offset for r in recs] == [6, 7, 8, 9]
        assert [r.value for r in recs] == [b"6", b"7", b"8", b"9"]

    run(body)


def _value(r: Received) -> bytes | None:
    return decode_batches(r.records)[0].value


def test_unexplained_out_of_order_moves_to_a_new_epoch() -> None:
    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda r, i: m.ErrorCode.OUT_OF_ORDER_SEQUENCE if i == 1 else Action.OK
        async with AsyncProducer(broker.bootstrap, linger_ms=0, producer_epoch=4) as p:
            assert (await (await p.send("t", b"a"))).offset == 0
            with pytest.raises(OutOfOrderSequenceError):
                await (await p.send("t", b"b"))
            assert (await (await p.send("t", b"c"))).offset == 1
        assert [(r.epoch, r.base_sequence) for r in broker.received] == [(4, 0), (4, 1), (5, 0)]

    run(body)


def test_batch_given_up_with_unknown_fate_is_resolved_by_the_next_answer() -> None:
    """Batch "lost" never reaches the log (every attempt loses the connection) and is given up at
    its delivery timeout: the producer cannot know it was not appended. The next batch, numbered
    after it, is refused as out of order, which settles it: "next" is renumbered and lands."""

    async def body(broker: FakeBroker) -> None:
        broker.on_produce = lambda r, i: Action.DROP if _value(r) == b"lost" else Action.OK
        async with AsyncProducer(
            broker.bootstrap, linger_ms=0, delivery_timeout_ms=300, retry_backoff_ms=20
        ) as p:
            assert (await (await p.send("t", b"first"))).offset == 0
            with pytest.raises(DeliveryTimeoutError) as info:
                await (await p.send("t", b"lost"))
            assert isinstance(info.value.__cause__, BrokerUnavailable)
            assert (await (await p.send("t", b"next"))).offset == 1
        values = [r.value for r in decode_batches(b"".join(broker.log("t", 0).batches))]
        assert values == [b"first", b"next"]
        seqs = [(_value(r), r.base_sequence) for r in broker.received]
        assert seqs[0] == (b"first", 0) and seqs[1] == (b"lost", 1)
        assert seqs[-2:] == [(b"next", 2), (b"next", 1)]  # refused as a gap, renumbered

    run(body)


def test_collateral_out_of_order_behind_a_retried_batch_keeps_its_bytes() -> None:
    """Five batches in flight; the first fails retriably, so the broker refuses the other four as
    out of order. All five are resent in order with their original bytes and land once each."""

    async def body(broker: FakeBroker) -> None:
        failed = set()

        def script(r: Received, i: int) -> Action | m.ErrorCode:
            if _value(r) == b"0" and not failed:
                failed.add(i)
                return m.ErrorCode.REQUEST_TIMED_OUT
            return Action.OK

        broker.on_produce = script
        async with AsyncProducer(
            broker.bootstrap, batch_bytes=BATCH_OVERHEAD + 19, linger_ms=0, retry_backoff_ms=5
        ) as p:
            assert (await (await p.send("t", b"start"))).offset == 0
            futs = [await p.send("t", f"{i}".encode()) for i in range(5)]
            assert [(await f).offset for f in futs] == [1, 2, 3, 4, 5]
        values = [r.value for r in decode_batches(b"".join(broker.log("t", 0).batches))]
        assert values == [b"start", b"0", b"1", b"2", b"3", b"4"]
        first_try = [(_value(r), r.base_sequence, r.records) for r in broker.received[1:6]]
        retried = [(_value(r), r.base_sequence, r.records) for r in broker.received[6:]]
        assert retried == first_try  # the same five, in order, with the same bytes

    run(body)


def test_out_of_order_behind_a_batch_still_unanswered_waits_for_it() -> None:
    """A batch refused as out of order while an earlier batch of its partition is still
    unanswered (answered first on another connection after a re-route, or here, the earlier one
    never answered): the broker has not seen the earlier one, so the refusal is collateral, not a
    disagreement. Once the earlier one fails (its reply times out), both are resent in order with
    their bytes and land once each, in the same epoch, and no send fails."""

    async def body(broker: FakeBroker) -> None:
        hung: set[int] = set()

        def script(r: Received, i: int) -> Action | m.ErrorCode:
            if _value(r) == b"0" and not hung:
                hung.add(i)
                return Action.HANG
            return Action.OK

        broker.on_produce = script
        async with AsyncProducer(
            broker.bootstrap,
            batch_bytes=BATCH_OVERHEAD + 19,
            linger_ms=0,
            retry_backoff_ms=5,
            request_timeout_ms=100,
        ) as p:
            assert (await (await p.send("t", b"start"))).offset == 0
            futs = [await p.send("t", v) for v in (b"0", b"1")]
            assert [(await f).offset for f in futs] == [1, 2]
        values = [r.value for r in decode_batches(b"".join(broker.log("t", 0).batches))]
        assert values == [b"start", b"0", b"1"]
        sent = [(_value(r), r.epoch, r.base_sequence, r.records) for r in broker.received]
        assert [x[:3] for x in sent[1:3]] == [(b"0", 0, 1), (b"1", 0, 2)]  # "1" refused: a gap
        assert sent[3:] == sent[1:3]  # resent in order, with the same bytes

    run(body)


def test_first_batch_of_an_epoch_is_not_overtaken() -> None:
    """The broker takes any sequence from a producer it does not know yet: if the first batch
    failed while later ones were in flight, they would land first. The first batch goes alone."""

    async def body(broker: FakeBroker) -> None:
        attempts: list[bytes | None] = []

        def script(r: Received, i: int) -> Action | m.ErrorCode:
            attempts.append(_value(r))
            return m.ErrorCode.STORAGE_ERROR if i == 0 else Action.OK

        broker.on_produce = script
        async with AsyncProducer(
            broker.bootstrap, batch_bytes=BATCH_OVERHEAD + 19, linger_ms=0, retry_backoff_ms=5
        ) as p:
            futs = [await p.send("t", f"{i}".encode()) for i in range(4)]
            assert [(await f).offset for f in futs] == [0, 1, 2, 3]
        assert attempts == [b"0", b"0", b"1", b"2", b"3"]

    run(body)


def _batch(value: bytes) -> bytes:

    return encode_batch([value])
