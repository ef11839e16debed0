"""The record batch codec: round trips, validation, and bad bytes that must never crash a reader."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringlog_proto.batch import (
    CRC_START,
    HEADER_SIZE,
    RECORD_COUNT_MAX,
    BatchError,
    Record,
    decode_batches,
    decode_records,
    encode_batch,
    invalid_batch,
    iter_batches,
    read_header,
    set_base_offset,
)

maybe_bytes = st.one_of(st.none(), st.binary(max_size=64))
headers = st.lists(st.tuples(st.text(max_size=8), maybe_bytes), max_size=3)
timestamps = st.integers(1_600_000_000_000, 1_600_000_000_000 + 10_000_000)
records = st.builds(Record, value=maybe_bytes, key=maybe_bytes, headers=headers, timestamp=timestamps)


@given(st.lists(records, min_size=1, max_size=20), st.integers(0, 2**40))
def test_round_trip_keeps_every_field(recs: list[Record], base: int) -> None:
    batch = bytearray(encode_batch(recs))
    set_base_offset(batch, base)
    assert invalid_batch(batch) is None, "the base offset lies outside the crc"
    h = read_header(batch)
    assert h.size == len(batch)
    assert h.record_count == len(recs)
    assert h.first_timestamp == recs[0].timestamp
    assert h.max_timestamp == max(r.timestamp for r in recs)
    got = decode_records(batch)
    for i, (want, rec) in enumerate(zip(recs, got, strict=True)):
        assert rec.offset == base + i
        assert (rec.key, rec.value, rec.timestamp, list(rec.headers)) == (
            want.key,
            want.value,
            want.timestamp,
            list(want.headers),
        )


def test_plain_bytes_take_the_given_timestamp_and_no_key() -> None:
    batch = encode_batch([b"a", b"", b"ccc"], timestamp=42)
    got = decode_records(batch)
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in got] == [
        (0, None, b"a", 42, []),
        (1, None, b"", 42, []),
        (2, None, b"ccc", 42, []),
    ]


def test_producer_fields_are_carried() -> None:
    batch = encode_batch([b"x"], producer_id=7, producer_epoch=2, base_sequence=99)
    h = read_header(batch)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 2, 99)


def test_empty_batch_is_refused() -> None:
    with pytest.raises(BatchError, match="at least one record"):
        encode_batch([])


def test_timestamp_delta_overflow_is_a_batch_error() -> None:
    with pytest.raises(BatchError, match="cannot be encoded"):
        encode_batch([Record(b"a", timestamp=0), Record(b"b", timestamp=2**40)])


def test_every_single_byte_flip_after_the_crc_is_detected() -> None:
    batch = encode_batch([Record(b"value", key=b"key", headers=[("h", b"v")], timestamp=5)] * 3)
    for pos in range(CRC_START, len(batch)):
        damaged = bytearray(batch)
        damaged[pos] ^= 0x01
        assert invalid_batch(damaged) is not None, f"flip at byte {pos} went unnoticed"


def test_every_truncation_is_detected() -> None:
    batch = encode_batch([b"v" * 10] * 4)
    for cut in range(len(batch)):
        assert invalid_batch(batch[:cut]) is not None


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "reason"),
    [
        (12, ">B", 2, "unknown batch magic"),
        (8, ">i", 10, "shorter than the header"),
        (57, ">i", 3, "records_length"),
        (53, ">i", 0, "record_count"),
        (53, ">i", RECORD_COUNT_MAX + 1, "record_count"),
        (19, ">i", 7, "last_offset_delta"),
        (17, ">h", 1, "compression codec 1"),
        (17, ">h", 0x100, "unknown attribute bits"),
        (0, ">q", -5, "negative base_offset"),
        (31, ">q", 0, "max_timestamp"),
    ],
)
def test_header_fields_are_validated(offset: int, fmt: str, value: int, reason: str) -> None:
    batch = bytearray(encode_batch([b"x", b"y"], timestamp=1000))
    struct.pack_into(fmt, batch, offset, value)
    if offset == 53:  # keep last_offset_delta consistent so the count check itself is reached
        struct.pack_into(">i", batch, 19, value - 1)
    got = invalid_batch(batch)
    assert got is not None
    assert reason in got


def test_iter_batches_stops_at_a_partial_tail() -> None:
    a = bytearray(encode_batch([b"a"]))
    b = bytearray(encode_batch([b"b", b"c"]))
    set_base_offset(b, 1)
    data = bytes(a + b)
    assert [h.base_offset for _, h in iter_batches(data)] == [0, 1]
    assert [h.base_offset for _, h in iter_batches(data[:-1])] == [0]
    assert [r.value for r in decode_batches(data)] == [b"a", b"b", b"c"]


def test_decode_rejects_a_record_length_that_lies() -> None:
    batch = bytearray(encode_batch([b"abc", b"def"]))
    struct.pack_into(">I", batch, HEADER_SIZE, 14 + 5)  # first record claims 2 bytes more
    # recompute the crc so only the record structure is wrong
    from crc32c import crc32c

    struct.pack_into(">I", batch, 13, crc32c(bytes(batch[CRC_START:])))
    assert invalid_batch(batch) is None
    with pytest.raises(BatchError):
        decode_records(batch)


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_yield_records_or_batch_error(data: bytes) -> None:
    with contextlib.suppress(BatchError):
        decode_batches(data)


@settings(max_examples=300)
@given(st.data())
def test_damaged_batches_yield_records_or_batch_error(data: st.DataObject) -> None:
    batch = bytearray(encode_batch([Record(b"v" * 5, key=b"k", headers=[("a", None)], timestamp=3)] * 2))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(batch) - 1))
        batch[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(BatchError):
        decode_records(batch, verify=False)
