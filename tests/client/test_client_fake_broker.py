"""Connection and producer behaviour against an in-process fake broker with scripted failures:
pipelining, connection loss, timeouts, batching boundaries, retries with the same bytes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

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
    UnknownTopicError,
)
from broker.client.accumulator import BATCH_OVERHEAD, RECORD_SLACK
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches

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
    from ringlog_proto.batch import encode_batch

    return encode_batch([value])
