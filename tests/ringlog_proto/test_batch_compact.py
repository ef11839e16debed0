"""The batches the log cleaner writes (ringlog_proto/batch_compact.py): Kafka's compacted shapes,
read back by our decoder and by kafka-python's (a Kafka client's own reading of the format), and
the header checks that tell a stored batch from a produced one."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    BatchError,
    Record,
    decode_batches,
    decode_records,
    encode_batch,
    invalid_batch,
    invalid_stored_batch,
    iter_batches,
    read_header,
    set_base_offset,
    span_shortfall,
    walk_records_python,
)
from ringlog_proto.batch_compact import emptied, rebuilt, records_of
from ringlog_proto.compression import compress

kafka_records = pytest.importorskip("kafka.record.default_records")

T = 1_700_000_000_000


def stored(records: list[Record], base: int = 100, compression: int = COMPRESSION_NONE, **kw: int) -> bytes:
    batch = bytearray(encode_batch(records, timestamp=T, compression=compression, **kw))
    set_base_offset(batch, base, leader_epoch=4)
    return bytes(batch)


def kafka_python_read(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(offset, timestamp, key, value) of each record as kafka-python decodes the batch."""
    b = kafka_records.DefaultRecordBatch(batch)
    assert b.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value) for r in b]


def records(n: int) -> list[Record]:
    return [
        Record(None if i % 4 == 3 else b"v%d" % i, key=b"k%d" % (i % 3), timestamp=T + 10 * i)
        for i in range(n)
    ]


def test_a_rebuilt_batch_keeps_its_offsets_sequences_and_timestamps() -> None:
    batch = stored(records(8), producer_id=9, producer_epoch=2, base_sequence=40)
    h = read_header(batch)
    section, recs = records_of(batch, h)
    assert [r.offset for r in recs] == list(range(100, 108))
    assert [r.tombstone for r in recs] == [i % 4 == 3 for i in range(8)]
    kept = [recs[1], recs[4], recs[6]]
    out = rebuilt(h, section, kept, None)
    g = read_header(out)
    assert (g.base_offset, g.last_offset_delta, g.record_count) == (100, 7, 3)
    assert (g.producer_id, g.producer_epoch, g.base_sequence, g.partition_leader_epoch) == (9, 2, 40, 4)
    assert (g.next_offset, g.last_sequence, g.max_timestamp) == (
        h.next_offset,
        h.last_sequence,
        h.max_timestamp,
    )
    assert not g.dense and span_shortfall(out) == 5
    got = [(r.offset, r.timestamp, r.key, r.value) for r in decode_records(out)]
    want = [(100 + i, T + 10 * i, b"k%d" % (i % 3), b"v%d" % i) for i in (1, 4, 6)]
    assert got == want == kafka_python_read(out)
    assert invalid_stored_batch(out) is None
    assert invalid_batch(out) is not None, "never taken as a produced batch"


def test_all_records_kept_and_no_horizon_needed_is_not_a_rewrite_candidate_but_decodes_the_same() -> None:
    batch = stored([Record(b"a", key=b"x", timestamp=T), Record(b"b", key=b"y", timestamp=T + 1)])
    h = read_header(batch)
    section, recs = records_of(batch, h)
    assert rebuilt(h, section, recs, None) == batch, "the same bytes, crc and all"


def test_a_delete_horizon_replaces_the_first_timestamp_and_every_record_keeps_its_own() -> None:
    batch = stored(records(4))
    h = read_header(batch)
    section, recs = records_of(batch, h)
    horizon = T + 86_400_000
    out = rebuilt(h, section, [recs[2], recs[3]], horizon)
    g = read_header(out)
    assert g.attributes & DELETE_HORIZON_BIT and g.delete_horizon_ms == horizon == g.base_timestamp
    assert g.max_timestamp == h.max_timestamp < g.base_timestamp
    assert [(r.offset, r.timestamp, r.value) for r in decode_records(out)] == [
        (102, T + 20, b"v2"),
        (103, T + 30, None),
    ]
    assert [(o, t) for o, t, _, _ in kafka_python_read(out)] == [(102, T + 20), (103, T + 30)]
    assert invalid_stored_batch(out) is None
    # cleaned again: the horizon it has stays, and so do the timestamps
    section2, recs2 = records_of(out, g)
    again = rebuilt(g, section2, [recs2[1]], None)
    assert read_header(again).delete_horizon_ms == horizon
    assert [(r.offset, r.timestamp) for r in decode_records(again)] == [(103, T + 30)]


def test_an_emptied_batch_is_kafkas_empty_header() -> None:
    batch = stored(
        records(5), compression=COMPRESSION_GZIP, producer_id=3, producer_epoch=1, base_sequence=10
    )
    h = read_header(batch)
    out = emptied(h)
    g = read_header(out)
    assert len(out) == HEADER_SIZE == g.size
    assert (g.record_count, g.last_offset_delta, g.compression, g.base_timestamp) == (0, 4, 0, -1)
    assert (g.max_timestamp, g.producer_id, g.producer_epoch, g.base_sequence) == (h.max_timestamp, 3, 1, 10)
    assert (g.next_offset, g.last_sequence) == (105, 14)
    assert decode_records(out) == [] and kafka_python_read(out) == []
    assert [h.base_offset for _, h in iter_batches(out + batch)] == [100, 100]
    assert invalid_stored_batch(out) is None


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_a_compressed_batch_is_rewritten_with_its_codec(codec: int) -> None:
    plain = stored(records(6))
    h = read_header(plain)
    section, _ = records_of(plain, h)
    batch = bytearray(plain[:HEADER_SIZE]) + compress(section, codec)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    compressed = bytes(batch)
    hc = read_header(compressed)
    section_c, recs = records_of(compressed, hc)
    assert section_c == section
    out = rebuilt(hc, section_c, [recs[0], recs[5]], None)
    assert read_header(out).compression == codec
    assert [(o, v) for o, _, _, v in kafka_python_read(out)] == [(100, b"v0"), (105, b"v5")]


def test_stored_header_rules() -> None:
    batch = stored(records(3))
    h = read_header(batch)
    section, recs = records_of(batch, h)
    out = bytearray(rebuilt(h, section, [recs[2]], None))

    def with_field(at: int, fmt: str, value: int) -> bytes:
        b = bytearray(out)
        struct.pack_into(fmt, b, at, value)
        struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
        return bytes(b)

    assert "record_count" in str(invalid_stored_batch(with_field(57, ">i", 4)))  # more than it spans
    assert "last_offset_delta" in str(invalid_stored_batch(with_field(23, ">i", -1)))
    assert "unknown attribute" in str(invalid_stored_batch(with_field(21, ">h", 0x80)))
    empty = bytearray(emptied(h)) + b"x"
    struct.pack_into(">i", empty, 8, len(empty) - 12)
    struct.pack_into(">I", empty, 17, crc32c(bytes(empty[21:])))
    assert "empty batch" in str(invalid_stored_batch(bytes(empty)))


def test_decode_refuses_offsets_that_do_not_rise_in_a_cleaned_batch() -> None:
    batch = stored(records(4))
    h = read_header(batch)
    section, recs = records_of(batch, h)
    out = rebuilt(h, section, [recs[2], recs[1]], None)  # out of order: not what a cleaner writes
    with pytest.raises(BatchError, match="offset delta"):
        decode_records(out)
    start, end = HEADER_SIZE, len(out)
    assert walk_records_python(out, start, end, 2, 4) & 0xFF == 19
    good = rebuilt(h, section, [recs[1], recs[2]], None)
    assert walk_records_python(good, start, len(good), 2, 4) == 0
    assert walk_records_python(good, start, len(good), 2) & 0xFF == 17, "a produced batch must be dense"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=20), st.booleans())
def test_any_subset_decodes_to_those_records(keep: list[bool], horizon: bool) -> None:
    recs_in = records(len(keep))
    batch = stored(recs_in)
    h = read_header(batch)
    section, recs = records_of(batch, h)
    kept = [r for r, k in zip(recs, keep, strict=True) if k]
    out = rebuilt(h, section, kept, T + 1000 if horizon else None) if kept else emptied(h)
    want = [
        (100 + i, r.timestamp, r.key, r.value)
        for i, (r, k) in enumerate(zip(recs_in, keep, strict=True))
        if k
    ]
    assert [(r.offset, r.timestamp, r.key, r.value) for r in decode_batches(out)] == want
    assert kafka_python_read(out) == want
    assert read_header(out).next_offset == h.next_offset
