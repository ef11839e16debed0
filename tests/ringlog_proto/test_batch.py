"""The record batch codec: round trips, validation, and bad bytes that must never crash a reader."""

from __future__ import annotations

import contextlib
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from legacy_format import legacy_batch

from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    CRC_START,
    HEADER_SIZE,
    RECORD_COUNT_MAX,
    TIMESTAMP_TYPE_BIT,
    BatchError,
    Record,
    decode_batches,
    decode_records,
    encode_batch,
    invalid_batch,
    invalid_records,
    iter_batches,
    legacy_format,
    read_header,
    read_varint,
    record_size,
    set_base_offset,
    varint_size,
    zigzag_varint,
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
    assert h.base_timestamp == recs[0].timestamp
    assert h.partition_leader_epoch == 0, "set_base_offset writes the stored leader epoch"
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
        (0, None, b"a", 42, ()),
        (1, None, b"", 42, ()),
        (2, None, b"ccc", 42, ()),
    ]


def test_producer_fields_are_carried() -> None:
    batch = encode_batch([b"x"], producer_id=7, producer_epoch=2, base_sequence=99)
    h = read_header(batch)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 2, 99)


def test_empty_batch_is_refused() -> None:
    with pytest.raises(BatchError, match="at least one record"):
        encode_batch([])


def test_timestamp_deltas_are_varlongs_and_out_of_range_timestamps_are_batch_errors() -> None:
    recs = decode_records(encode_batch([Record(b"a", timestamp=0), Record(b"b", timestamp=2**40)]))
    assert [r.timestamp for r in recs] == [0, 2**40]
    with pytest.raises(BatchError, match="out of range"):
        encode_batch([Record(b"a", timestamp=2**63)])


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
        (16, ">b", 1, "unknown batch magic"),
        (8, ">i", 10, "shorter than the header"),
        (57, ">i", 0, "record_count"),
        (57, ">i", RECORD_COUNT_MAX + 1, "record_count"),
        (57, ">i", 3, "cannot fit"),
        (23, ">i", 7, "last_offset_delta"),
        (21, ">h", 5, "unknown compression codec 5"),
        (21, ">h", 0x10, "transactional batches are not supported"),
        (21, ">h", 0x20, "control batches"),
        (21, ">h", 0x40, "unknown attribute bits"),
        (21, ">h", -1, "unknown attribute bits"),
        (35, ">q", 0, "max_timestamp"),
    ],
)
def test_header_fields_are_validated(offset: int, fmt: str, value: int, reason: str) -> None:
    batch = bytearray(encode_batch([b"x", b"y"], timestamp=1000))
    struct.pack_into(fmt, batch, offset, value)
    if offset == 57:  # keep last_offset_delta consistent so the count check itself is reached
        struct.pack_into(">i", batch, 23, value - 1)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))  # only the field is wrong
    got = invalid_batch(batch)
    assert got is not None
    assert reason in got


def test_base_offset_and_leader_epoch_from_a_client_are_outside_the_crc() -> None:
    """Kafka's broker overwrites both: a client's values are ignored, never refused."""
    batch = bytearray(encode_batch([b"x"], base_offset=-5, partition_leader_epoch=-1))
    assert invalid_batch(batch) is None
    set_base_offset(batch, 42, leader_epoch=3)
    h = read_header(batch)
    assert (h.base_offset, h.partition_leader_epoch, invalid_batch(batch)) == (42, 3, None)


def test_the_byte_layout_is_kafkas() -> None:
    """Spot checks of RecordBatch v2 at its documented offsets (the module docstring's table)."""
    batch = encode_batch(
        [Record(b"val", key=b"k", headers=[("h", None)], timestamp=1000)],
        producer_id=9,
        producer_epoch=2,
        base_sequence=5,
        partition_leader_epoch=7,
    )
    assert struct.unpack_from(">qiib", batch, 0) == (0, len(batch) - 12, 7, 2)
    assert struct.unpack_from(">I", batch, 17)[0] == crc32c(batch[21:])
    assert struct.unpack_from(">hiqqqhii", batch, 21) == (0, 0, 1000, 1000, 9, 2, 5, 1)
    # length 13, attributes 0, ts delta 0, offset delta 0, key 1 "k", value 3 "val", 1 header
    # "h" with a null value: zigzag varints (n -> 2n, -1 -> 1)
    assert batch[61:] == bytes([26, 0, 0, 0, 2]) + b"k" + bytes([6]) + b"val" + bytes([2, 2]) + b"h" + bytes(
        [1]
    )


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_every_codec_round_trips_and_a_mislabelled_section_names_its_codec(codec: int) -> None:
    recs = [Record(b"v" * 100, key=b"k", headers=[("a", b"b")], timestamp=5)] * 20
    batch = encode_batch(recs, compression=codec)
    h = read_header(batch)
    assert h.compression == codec
    assert invalid_batch(batch) is None and invalid_records(batch) is None
    assert h.size < 61 + 20 * 100
    assert [(r.offset, r.value, r.headers) for r in decode_records(batch)] == [
        (i, b"v" * 100, [("a", b"b")]) for i in range(20)
    ]
    # the same section under another codec's bits: the crc passes, the section does not inflate
    other = bytearray(batch)
    mislabelled = 1 + codec % 4
    struct.pack_into(">h", other, 21, mislabelled)
    struct.pack_into(">I", other, 17, crc32c(bytes(other[CRC_START:])))
    assert invalid_batch(other) is None
    name = ("gzip", "snappy", "lz4", "zstd")[mislabelled - 1]
    with pytest.raises(BatchError, match=f"{name} record section does not decompress"):
        decode_records(other)


def test_an_unknown_codec_is_a_batch_error_both_ways() -> None:
    with pytest.raises(BatchError, match="unknown compression codec 5"):
        encode_batch([b"x"], compression=5)
    batch = bytearray(encode_batch([b"x"] * 3, compression=COMPRESSION_GZIP))
    struct.pack_into(">h", batch, 21, 5)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))
    with pytest.raises(BatchError, match="codec 5"):
        decode_records(batch)


def test_a_damaged_gzip_section_is_a_batch_error() -> None:
    batch = bytearray(encode_batch([b"x" * 50] * 3, compression=COMPRESSION_GZIP))
    del batch[-6:]  # the gzip trailer and a little more
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))
    with pytest.raises(BatchError, match="gzip"):
        decode_records(batch)


def test_log_append_time_batches_give_every_record_the_max_timestamp() -> None:
    batch = bytearray(encode_batch([Record(b"a", timestamp=5), Record(b"b", timestamp=9)]))
    struct.pack_into(">h", batch, 21, TIMESTAMP_TYPE_BIT)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))
    assert [r.timestamp for r in decode_records(batch)] == [9, 9]


def test_a_format_1_batch_is_recognised_and_a_format_2_one_is_not() -> None:
    old = legacy_batch([b"a", b"bc"], base_offset=7)
    assert legacy_format(old) == 1
    assert invalid_batch(old) is not None and "magic" in str(invalid_batch(old))
    stored = bytearray(encode_batch([b"a", b"bc"]))
    set_base_offset(stored, 7)
    assert legacy_format(stored) is None
    assert legacy_format(encode_batch([b"a"], partition_leader_epoch=-1)) is None


@settings(max_examples=200)
@given(st.integers(-(2**63), 2**63 - 1))
def test_varints_round_trip_as_kafka_reads_them(value: int) -> None:
    encoded = zigzag_varint(value)
    assert len(encoded) == varint_size(value) <= 10
    assert read_varint(encoded, 0, wide=True) == (value, len(encoded))
    if -(2**31) <= value < 2**31:
        assert len(encoded) <= 5
        assert read_varint(encoded, 0) == (value, len(encoded))


def test_varints_longer_than_their_type_are_refused() -> None:
    with pytest.raises(BatchError, match="longer than 5"):
        read_varint(b"\x80" * 5 + b"\x00", 0)
    with pytest.raises(BatchError, match="longer than 10"):
        read_varint(b"\x80" * 10 + b"\x00", 0, wide=True)


@settings(max_examples=100)
@given(st.lists(records, min_size=1, max_size=10))
def test_record_size_is_exact(recs: list[Record]) -> None:
    batch = encode_batch(recs)
    first = recs[0].timestamp
    assert first is not None
    sizes = [
        record_size(r.value, r.key, r.headers, i, (r.timestamp or 0) - first) for i, r in enumerate(recs)
    ]
    assert HEADER_SIZE + sum(sizes) == len(batch)


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
    batch[HEADER_SIZE] += 4  # zigzag: the first record claims 2 bytes more
    # recompute the crc so only the record structure is wrong
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))
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


@settings(max_examples=50)
@given(
    st.lists(st.sampled_from([b"", b"a" * 5, b"b" * 70, b"c" * 9000]), min_size=60, max_size=300), st.data()
)
def test_runs_of_one_shape_decode_like_any_other(values: list[bytes], data: st.DataObject) -> None:
    """The decoder's same-shape fast path: runs of equal records, across the offset delta's growth
    from one byte to two (record 64), and a damaged byte anywhere is still refused or decoded as
    the walk says."""
    values = sorted(values, key=len)  # long runs of one shape
    batch = encode_batch(values, timestamp=5)
    assert [(r.offset, r.value) for r in decode_records(batch)] == list(enumerate(values))
    damaged = bytearray(batch)
    at = data.draw(st.integers(HEADER_SIZE, len(batch) - 1))
    damaged[at] ^= data.draw(st.integers(1, 255))
    struct.pack_into(">I", damaged, 17, crc32c(bytes(damaged[CRC_START:])))
    walk_ok = invalid_records(damaged) is None
    try:
        got = decode_records(damaged)
    except BatchError:
        assert not walk_ok
    else:
        assert walk_ok
        assert len(got) == len(values)


def test_the_worked_example_in_protocol_md_is_what_the_codec_makes() -> None:
    """docs/PROTOCOL.md §9's hex dump of a Produce frame, checked against the real codec."""
    import re
    from pathlib import Path

    from ringlog_proto.messages import ProduceRequest, encode_request

    doc = (Path(__file__).parents[2] / "docs" / "PROTOCOL.md").read_text()
    section = doc[doc.index("## 9. Worked example") :]
    dump = section[section.index("```\n0000") + 4 : section.index("```", section.index("```\n0000") + 4)]
    documented = bytes.fromhex("".join(re.sub(r"^[0-9a-f]{4}  ", "", line) for line in dump.splitlines()))
    frame = b"".join(
        encode_request(
            ProduceRequest(
                topic_id=1,
                partition=0,
                acks=1,
                timeout_ms=30000,
                records=encode_batch([b"hello"], timestamp=1700000000000),
            ),
            correlation_id=1,
        )
    )
    assert documented == frame
