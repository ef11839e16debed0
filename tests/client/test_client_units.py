"""Client pieces that need no broker: partitioner, batch sizes, backoff, errors, arguments, the
blocking producer's futures."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
import random
import subprocess
import sys
import threading
import time

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from broker.client import (
    BrokerUnavailable,
    ClientError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RingLogError,
    UnknownTopicError,
    error_for,
    key_partition,
)
from broker.client.accumulator import BATCH_OVERHEAD, RECORD_SLACK, ProducerBatch, prepare_record, record_size
from broker.client.backoff import backoff_delay
from broker.client.blocking_producer import _SendFuture
from broker.client.client import parse_bootstrap
from broker.client.errors import ERROR_CLASSES, BrokerStorageError, DeliveryTimeoutError, NotOwnerError
from broker.client.partitioner import Partitioner
from broker.client.producer import AsyncProducer
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT, Record, decode_records, encode_batch, read_header
from ringlog_proto.messages import ErrorCode

# ----------------------------------------------------------------------------------- partitioner


def test_key_partition_is_crc32c_mod_count() -> None:
    assert key_partition(b"customer-7", 12) == crc32c(b"customer-7") % 12
    # Fixed vectors: a change here moves every keyed record to another partition.
    assert [key_partition(k, 8) for k in (b"", b"a", b"customer-7", b"\x00" * 16)] == [
        crc32c(k) % 8 for k in (b"", b"a", b"customer-7", b"\x00" * 16)
    ]
    assert crc32c(b"123456789") == 0xE3069283  # the Castagnoli check value


def test_key_partition_is_stable_across_processes() -> None:
    """Python's hash() is salted per process; the partitioner must not be."""
    keys = [f"key-{i}".encode() for i in range(50)]
    here = [key_partition(k, 7) for k in keys]
    code = (
        "from broker.client import key_partition;"
        "print([key_partition(f'key-{i}'.encode(), 7) for i in range(50)])"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        assert out.stdout.strip() == str(here)


@given(st.binary(max_size=64), st.integers(1, 10_000))
def test_key_partition_in_range(key: bytes, n: int) -> None:
    assert 0 <= key_partition(key, n) < n


def test_partitioner_explicit_then_key_then_sticky() -> None:
    p = Partitioner(random.Random(3))
    assert p.partition("t", b"k", 5, explicit=4) == 4
    assert p.partition("t", b"k", 5) == key_partition(b"k", 5)
    first = p.partition("t", None, 5)
    assert all(p.partition("t", None, 5) == first for _ in range(100))  # sticky until sealed
    p.batch_sealed("t", (first + 1) % 5, 5)  # another partition's batch: no move
    assert p.partition("t", None, 5) == first
    seen = []
    for _ in range(10):
        cur = p.partition("t", None, 5)
        seen.append(cur)
        p.batch_sealed("t", cur, 5)
    assert seen == [(first + i) % 5 for i in range(10)]  # round-robin, one batch each


def test_partitioner_sticky_skips_partitions_with_no_leader() -> None:
    """A cluster's keyless records avoid partitions with no live leader while any has one;
    keyed and explicit records keep theirs."""
    p = Partitioner(random.Random(3))
    first = p.partition("t", None, 5)
    down = {first, (first + 1) % 5}
    usable = lambda q: q not in down  # noqa: E731
    assert p.partition("t", None, 5, usable=usable) == (first + 2) % 5
    assert p.partition("t", None, 5) == (first + 2) % 5, "the sticky partition moved"
    assert p.partition("t", b"k", 5, usable=lambda q: False) == key_partition(b"k", 5)
    assert p.partition("t", None, 5, explicit=first, usable=usable) == first
    assert p.partition("t", None, 5, usable=lambda q: False) == (first + 2) % 5, "none usable: stay"


def test_partitioner_sticky_start_is_random() -> None:
    starts = {Partitioner(random.Random(seed)).partition("t", None, 16) for seed in range(40)}
    assert len(starts) > 4


# ----------------------------------------------------------------------------------- batch sizes


@given(
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=20),
            st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_record_size_is_a_tight_upper_bound(records: list[tuple[bytes | None, bytes | None, list]]) -> None:
    batch = ProducerBatch(1_700_000_000_000, 0.0, 1.0)
    for value, key, headers in records:
        item, size = prepare_record(value, key, headers)
        assert size == record_size(value, key, headers)
        batch.add(item, size, None, None)
    data = batch.encode(7, 0, 0)
    assert batch.size - RECORD_SLACK * len(records) <= len(data) <= batch.size
    decoded = decode_records(data)
    assert [(r.value, r.key, list(r.headers)) for r in decoded] == [
        (v, k, [tuple(h) for h in hs]) for v, k, hs in records
    ]


def test_records_with_their_own_timestamps_stay_within_the_bound() -> None:
    """The first record's timestamp is the batch's base: far from it, deltas take 10 bytes."""
    batch = ProducerBatch(1_700_000_000_000, 0.0, 1.0)
    for i in range(300):
        ts = 0 if i == 0 else None if i % 2 else 2**50 + i
        item, size = prepare_record(b"v" * 70, timestamp=ts)
        batch.add(item, size, None, None)
    assert len(batch.encode(-1, -1, -1)) <= batch.size


def test_value_only_records_are_stored_as_plain_bytes() -> None:
    item, size = prepare_record(b"hello")
    assert item == b"hello" and type(item) is bytes
    assert size == 7 + 5 + RECORD_SLACK
    item, _ = prepare_record(b"hello", key=b"k")
    assert isinstance(item, Record)
    item, _ = prepare_record(bytearray(b"buf"))
    assert item == b"buf" and type(item) is bytes  # copied: the caller may reuse its buffer


def test_batch_fits_up_to_batch_bytes_exactly() -> None:
    record = 7 + 10 + RECORD_SLACK  # a 10-byte value: 7 bytes of framing, and the slack
    batch_bytes = BATCH_OVERHEAD + 3 * record  # room for exactly three 10-byte values
    b = ProducerBatch(0, 0.0, 1.0)
    for _ in range(3):
        item, size = prepare_record(b"x" * 10)
        assert size == record
        assert b.fits(size, batch_bytes)
        b.add(item, size, None, None)
    assert b.size == batch_bytes
    assert not b.fits(1 + 7 + RECORD_SLACK, batch_bytes)  # one more byte does not fit
    assert len(b.encode(-1, -1, -1)) == batch_bytes - 3 * RECORD_SLACK


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_batch_stays_within_its_uncompressed_bound(codec: int) -> None:
    """Text is sent in the producer's codec, smaller; random bytes, which every codec grows a
    little, go uncompressed: the batch never exceeds the size it was checked against."""
    rng = random.Random(codec)
    text = [b"compressible text %d " % i * 20 for i in range(5)]
    noise = [rng.randbytes(100_000)]  # one record: a few bytes of slack, less than any codec adds
    for values, compressed in ((text, True), (noise, False)):
        b = ProducerBatch(0, 0.0, 1.0, codec)
        for value in values:
            item, size = prepare_record(value, key=b"k")
            b.add(item, size, None, None)
        data = b.encode(7, 0, 0)
        h = read_header(data)
        assert h.compression == (codec if compressed else 0)
        assert len(data) <= b.size
        assert [(r.key, r.value) for r in decode_records(data)] == [(b"k", v) for v in values]
        assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 0, 0)


def test_a_producer_refuses_an_unknown_codec() -> None:
    for name in ("none", "gzip", "snappy", "lz4", "zstd"):
        assert AsyncProducer(compression=name).compression == name
    with pytest.raises(ValueError, match="compression must be one of none, gzip, snappy, lz4, zstd"):
        AsyncProducer(compression="brotli")


def test_oversized_record_travels_alone() -> None:
    b = ProducerBatch(0, 0.0, 1.0)
    assert b.fits(10_000, 100)  # an empty batch takes any record the hard limit allows


def test_prepare_record_limits_and_types() -> None:
    limit = 1024
    framing = 9 + RECORD_SLACK  # a ~950-byte value: 2-byte length varints
    prepare_record(b"x" * (limit - BATCH_OVERHEAD - framing), max_batch_bytes=limit)
    with pytest.raises(MessageTooLargeError) as info:
        prepare_record(b"x" * (limit - BATCH_OVERHEAD - framing + 1), max_batch_bytes=limit)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
    with pytest.raises(TypeError):
        prepare_record("text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        prepare_record(5)  # type: ignore[arg-type]  # bytes(5) would be five zero bytes
    with pytest.raises(TypeError):
        prepare_record(b"v", key="k")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        prepare_record(b"v", headers=[("h", "not bytes")])  # type: ignore[list-item]


@pytest.mark.parametrize("ts", [-1, -(2**63), 2**63, 1.5])
def test_a_timestamp_outside_int64_milliseconds_is_refused_at_send(ts: object) -> None:
    """As Kafka's producers do: a negative timestamp (or one past an i64, or not an int) raises
    here, not later where the batch is encoded (then a caller's future never heard of it)."""
    with pytest.raises(ValueError, match="timestamp"):
        prepare_record(b"v", timestamp=ts)  # type: ignore[arg-type]


def test_the_extreme_timestamps_share_a_batch() -> None:
    """0 and 2**63-1 are both accepted, and their delta fits the batch."""
    b = ProducerBatch(1_000, 0.0, 1.0)
    for ts in (2**63 - 1, 0, None):
        item, size = prepare_record(b"v", timestamp=ts)
        b.add(item, size, None, None)
    assert [r.timestamp for r in decode_records(b.encode(-1, -1, -1))] == [2**63 - 1, 0, 1_000]


def test_batch_timestamp_applies_to_records_without_one() -> None:
    b = ProducerBatch(1_000, 0.0, 1.0)
    for item, size in (prepare_record(b"a"), prepare_record(b"b", timestamp=2_000)):
        b.add(item, size, None, None)
    assert [r.timestamp for r in decode_records(b.encode(-1, -1, -1))] == [1_000, 2_000]


def test_producer_config_validation() -> None:
    with pytest.raises(ValueError, match="acks"):
        AsyncProducer(acks=3)
    with pytest.raises(ValueError, match="batch_bytes"):
        AsyncProducer(batch_bytes=2 * 1024 * 1024)
    with pytest.raises(ValueError, match="max_in_flight"):
        AsyncProducer(max_in_flight=6)  # the broker remembers 5 batches per producer
    AsyncProducer(max_in_flight=6, enable_idempotence=False)
    p = AsyncProducer()
    assert BROKER_PRODUCER_ID_LIMIT <= p.producer_id < 1 << 63 and p.producer_epoch == 0
    assert AsyncProducer(producer_id=(1 << 40) + 42, producer_epoch=3).producer_id == (1 << 40) + 42
    with pytest.raises(ValueError, match="broker's to assign"):
        AsyncProducer(producer_id=42)  # Kafka clients' ids, InitProducerId's space
    assert AsyncProducer(enable_idempotence=False).producer_id == -1


def test_encode_batch_is_the_wire_format() -> None:
    """The producer encodes with ringlog_proto's codec: producer fields land in the header."""
    b = ProducerBatch(5, 0.0, 1.0)
    item, size = prepare_record(b"v")
    b.add(item, size, None, None)
    data = b.encode(123, 4, 99)
    assert data == encode_batch([b"v"], timestamp=5, producer_id=123, producer_epoch=4, base_sequence=99)


# ----------------------------------------------------------------------------------- backoff


@given(st.integers(-3, 200), st.floats(0.001, 2.0), st.floats(0.001, 60.0), st.floats(0.0, 1.0))
def test_backoff_bounds(attempt: int, base: float, cap: float, jitter: float) -> None:
    d = backoff_delay(attempt, base, cap, jitter=jitter)
    assert d <= cap
    assert d >= (1 - jitter) * min(cap, base) - 1e-12
    assert d <= min(cap, base * 2 ** max(0, attempt))


def test_backoff_grows_exponentially_to_the_cap() -> None:
    no_jitter = [backoff_delay(a, 0.1, 1.0, jitter=0) for a in range(8)]
    assert no_jitter == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert backoff_delay(10**6, 0.1, 1.0, jitter=0) == 1.0
    assert backoff_delay(3, 0.1, 1.0, rand=lambda: 1.0) == pytest.approx(0.8 * 0.8)
    with pytest.raises(ValueError):
        backoff_delay(0, 0.1, 1.0, jitter=1.5)


# ----------------------------------------------------------------------------------- errors


def test_every_error_code_maps_to_its_class() -> None:
    for code in ErrorCode:
        if code == ErrorCode.NONE:
            continue
        exc = error_for(code, "detail")
        assert isinstance(exc, RingLogError) and isinstance(exc, ClientError)
        assert type(exc) is ERROR_CLASSES[code]
        assert exc.code == code and exc.message == "detail"
        assert exc.retriable == code.retriable
        assert code.name in str(exc) and "detail" in str(exc)


def test_error_mapping_examples() -> None:
    assert isinstance(error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), UnknownTopicError)
    assert isinstance(error_for(10), OffsetOutOfRangeError)
    assert error_for(ErrorCode.STORAGE_ERROR).retriable and isinstance(error_for(11), BrokerStorageError)
    assert error_for(ErrorCode.NOT_OWNER).retriable and isinstance(error_for(15), NotOwnerError)
    assert not error_for(ErrorCode.OFFSET_OUT_OF_RANGE).retriable
    unknown = error_for(999, "from the future")  # a newer broker's code: treated as unknown
    assert type(unknown) is ERROR_CLASSES[ErrorCode.UNKNOWN_SERVER_ERROR]
    assert unknown.code == ErrorCode.UNKNOWN_SERVER_ERROR


def test_error_classes_pickle_and_connection_errors_are_connection_errors() -> None:
    exc = error_for(ErrorCode.OFFSET_OUT_OF_RANGE, "at 7")
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is OffsetOutOfRangeError and again.code == exc.code and again.message == "at 7"
    down = BrokerUnavailable("gone")
    assert isinstance(down, ConnectionError) and isinstance(down, ClientError) and down.retriable
    assert isinstance(DeliveryTimeoutError("late"), TimeoutError)


# ----------------------------------------------------------------------------------- bootstrap


def test_parse_bootstrap() -> None:
    assert parse_bootstrap("127.0.0.1:9092") == ("127.0.0.1", 9092)
    assert parse_bootstrap("broker.example") == ("broker.example", 9092)
    assert parse_bootstrap("[::1]:19092") == ("::1", 19092)
    assert parse_bootstrap("[::1]") == ("::1", 9092)
    for bad in (":9092", "host:port"):
        with pytest.raises(ValueError):
            parse_bootstrap(bad)


def test_client_package_imports_no_server_module() -> None:
    code = (
        "import sys, broker.client;"
        "bad = [m for m in sys.modules if m.startswith('broker.') and not m.startswith('broker.client')];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------------- send futures


def test_send_future_is_a_concurrent_future_that_waits_and_calls_back() -> None:
    done = _SendFuture()
    done.set_result("md")
    assert done.done() and done.result() == "md" and done.exception() is None
    assert not done.cancel() and not done.cancelled()
    with pytest.raises(concurrent.futures.InvalidStateError):
        done.set_result("again")
    calls: list[object] = []
    done.add_done_callback(lambda f: calls.append(f.result()))  # already done: called at once
    assert calls == ["md"]

    failed = _SendFuture()
    failed.add_done_callback(lambda f: calls.append(f.exception()))
    err = ValueError("refused")
    failed.set_exception(err)
    assert calls == ["md", err]
    with pytest.raises(ValueError, match="refused"):
        failed.result(0)

    pending = [_SendFuture() for _ in range(3)]
    assert not pending[0].cancel()
    with pytest.raises(concurrent.futures.TimeoutError):
        pending[0].result(0.01)
    threading.Timer(0.05, pending[1].set_result, ("late",)).start()
    finished, waiting = concurrent.futures.wait(
        pending, timeout=5, return_when=concurrent.futures.FIRST_COMPLETED
    )
    assert finished == {pending[1]} and len(waiting) == 2
    pending[0].set_result(0)
    pending[2].set_exception(KeyError("k"))
    assert set(concurrent.futures.as_completed(pending, timeout=5)) == set(pending)

    async def wrapped() -> object:
        f = _SendFuture()
        asyncio.get_running_loop().call_later(0.01, f.set_result, "via asyncio")
        return await asyncio.wrap_future(f)

    assert asyncio.run(wrapped()) == "via asyncio"


def test_send_future_result_wakes_every_waiter() -> None:
    """`result()`'s first waiter blocks on the future's own gate, any other on the Condition: a
    completion wakes them all, with the exception too; a waiter that timed out leaves nothing
    that breaks a later wait."""
    for outcome in ("value", ValueError("refused")):
        f = _SendFuture()
        with pytest.raises(concurrent.futures.TimeoutError):
            f.result(0.01)  # takes the gate and gives up: the next waiters take the Condition
        g = _SendFuture()
        got: list[object] = []

        def wait(fut: _SendFuture, got: list[object] = got) -> None:
            try:
                got.append(fut.result(5))
            except ValueError as exc:
                got.append(exc)

        threads = [threading.Thread(target=wait, args=(fut,)) for fut in (f, f, g, g, g)]
        for t in threads:
            t.start()
        time.sleep(0.05)  # all five waiting
        for fut in (f, g):
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads)
        assert got == [outcome] * 5


def test_send_future_waiters_racing_completion_are_never_lost() -> None:
    """A waiter that makes the lazy Condition while another thread completes the future must wake."""
    for _ in range(300):
        futs = [_SendFuture() for _ in range(20)]
        got: list[object] = []
        calls: list[int] = []

        def wait_all(
            futs: list[_SendFuture] = futs, got: list[object] = got, calls: list[int] = calls
        ) -> None:
            for i, f in enumerate(futs):
                if i % 2:
                    f.add_done_callback(lambda _f: calls.append(1))
                got.append(f.result(5))

        t = threading.Thread(target=wait_all)
        t.start()
        for i, f in enumerate(futs):
            f.set_result(i)
        t.join(10)
        assert not t.is_alive()
        assert got == list(range(20))
        assert len(calls) == 10
