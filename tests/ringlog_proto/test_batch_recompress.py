"""A produced batch rewritten in another codec (ringlog_proto/batch_recompress.py), as Kafka's
LogValidator rebuilds it: every pair of codecs, read back by our decoder and by kafka-python's (a
Kafka client's own reading of the format and of each codec's framing), the header fields an
idempotent producer and a consumer depend on kept, the base timestamp made the first record's;
and the codecs' framing as Kafka's own writers frame them (lz4's independent blocks)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.poison_batches import frame_batch
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    Record,
    decode_records,
    encode_batch,
    invalid_batch,
    invalid_compressed_records,
    invalid_records,
    read_header,
    seal_batch,
    zigzag_varint,
)
from ringlog_proto.batch_recompress import recompressed
from ringlog_proto.compression import compress, decompress

kafka_records = pytest.importorskip("kafka.record.default_records")

T = 1_700_000_000_000
CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]
LIMIT = 32 << 20


def records(n: int) -> list[Record]:
    return [
        Record(
            None if i % 7 == 6 else b"value %d " % i * (1 + i % 5),
            key=None if i % 5 == 4 else b"k%d" % (i % 3),
            headers=[("h", b"x%d" % i), ("n", None)] if i % 2 else (),
            timestamp=T + 10 * i,
        )
        for i in range(n)
    ]


def in_codec(plain: bytes, codec: int) -> bytes:
    """`plain` (an uncompressed batch) as a producer of `codec` sends it."""
    if codec == COMPRESSION_NONE:
        return plain
    h = read_header(plain)
    return seal_batch(
        compress(plain[HEADER_SIZE:], codec),
        h.record_count,
        h.base_timestamp,
        h.max_timestamp,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
        attributes=h.attributes | codec,
    )


def kafka_python_read(batch: bytes) -> list[tuple]:
    """Each record as kafka-python decodes the batch: (offset, timestamp, key, value, headers)."""
    b = kafka_records.DefaultRecordBatch(batch)
    assert b.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in b]


def section_of(batch: bytes) -> bytes:
    h = read_header(batch)
    codec = h.attributes & COMPRESSION_MASK
    data = batch[HEADER_SIZE : h.size]
    return decompress(data, codec) if codec else data


@pytest.mark.parametrize("source", CODECS)
@pytest.mark.parametrize("target", CODECS)
def test_every_codec_into_every_other(source: int, target: int) -> None:
    plain = encode_batch(records(40), timestamp=T, producer_id=77, producer_epoch=3, base_sequence=120)
    sent = in_codec(plain, source)
    h = read_header(sent)
    out = recompressed(sent, 0, h, target, None, LIMIT)
    assert invalid_batch(out) is None
    g = read_header(out)
    assert g.attributes & COMPRESSION_MASK == target
    assert g.attributes & ~COMPRESSION_MASK == h.attributes & ~COMPRESSION_MASK
    kept = ("last_offset_delta", "base_timestamp", "max_timestamp", "producer_id", "producer_epoch")
    kept += ("base_sequence", "record_count", "base_offset", "partition_leader_epoch")
    assert [getattr(g, f) for f in kept] == [getattr(h, f) for f in kept]
    assert (g.last_sequence, g.next_offset) == (159, 40)
    assert section_of(out) == plain[HEADER_SIZE:], "the records byte for byte"
    assert kafka_python_read(out) == kafka_python_read(plain)
    reason = invalid_compressed_records(out, 0, g, LIMIT) if target else invalid_records(out, 0, g)
    assert reason is None
    if target in (COMPRESSION_NONE, COMPRESSION_GZIP):
        assert decode_records(out) == decode_records(plain)


def test_the_rest_of_a_buffer_is_left_alone() -> None:
    first = encode_batch(records(3), timestamp=T)
    second = in_codec(encode_batch(records(5), timestamp=T + 1), COMPRESSION_SNAPPY)
    h = read_header(first + second, len(first))
    out = recompressed(memoryview(first + second), len(first), h, COMPRESSION_ZSTD, None, LIMIT)
    assert kafka_python_read(out) == kafka_python_read(encode_batch(records(5), timestamp=T + 1))


def test_a_log_append_time_bit_is_kept() -> None:
    plain = encode_batch(records(4), timestamp=T)
    h = read_header(plain)
    stamped = seal_batch(
        plain[HEADER_SIZE:], 4, h.base_timestamp, h.max_timestamp, attributes=TIMESTAMP_TYPE_BIT
    )
    out = recompressed(stamped, 0, read_header(stamped), COMPRESSION_LZ4, None, LIMIT)
    assert read_header(out).attributes == TIMESTAMP_TYPE_BIT | COMPRESSION_LZ4


def raw_record(index: int, ts_delta: int, value: bytes) -> bytes:
    body = b"\x00" + zigzag_varint(ts_delta) + zigzag_varint(index) + zigzag_varint(-1)
    body += zigzag_varint(len(value)) + value + zigzag_varint(0)
    return zigzag_varint(len(body)) + body


def test_the_base_timestamp_becomes_the_first_records() -> None:
    """A producer whose base timestamp is not its first record's (deltas 50, -20, 90 from T): the
    rewritten batch is based at the first record's, every record keeping its timestamp, the max
    taken from the records, as Kafka's MemoryRecordsBuilder writes it."""
    section = raw_record(0, 50, b"a") + raw_record(1, -20, b"b") + raw_record(2, 90, b"c")
    sent = frame_batch(section, 3, timestamp=T - 5)  # min and max: T - 5, lower than the records
    assert kafka_python_read(sent)[0][1] == T + 45
    for target in (COMPRESSION_NONE, COMPRESSION_ZSTD):
        sent_in = in_codec(sent, COMPRESSION_GZIP)
        out = recompressed(sent_in, 0, read_header(sent_in), target, None, LIMIT)
        g = read_header(out)
        assert (g.base_timestamp, g.max_timestamp) == (T + 45, T + 85)
        assert [(o, ts, v) for o, ts, _k, v, _h in kafka_python_read(out)] == [
            (0, T + 45, b"a"),
            (1, T - 25, b"b"),
            (2, T + 85, b"c"),
        ]
        assert invalid_batch(out) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-(10**6), 10**6), st.binary(max_size=40)), min_size=1, max_size=20),
    st.sampled_from(CODECS),
    st.sampled_from(CODECS),
)
def test_timestamps_survive_any_deltas(rows: list[tuple[int, bytes]], source: int, target: int) -> None:
    section = b"".join(raw_record(i, d, v) for i, (d, v) in enumerate(rows))
    top = max(d for d, _ in rows)
    sent = in_codec(seal_batch(section, len(rows), T, T + max(top, 0)), source)
    before = kafka_python_read(sent)
    out = recompressed(sent, 0, read_header(sent), target, None, LIMIT)
    assert invalid_batch(out) is None
    assert kafka_python_read(out) == before
    g = read_header(out)
    assert g.base_timestamp == before[0][1]
    assert g.max_timestamp >= max(ts for _, ts, *_ in before)


def test_lz4_frames_are_of_independent_blocks() -> None:
    """The Java client reads only lz4 frames of independent blocks (its Lz4BlockInputStream
    refuses others): FLG's block-independence bit, version 01, 64 KiB blocks (BD 0x40)."""
    data = bytes(range(256)) * 2000
    for level in (None, 1, 9, 12):
        frame = compress(data, COMPRESSION_LZ4, level)
        assert frame[:4] == b"\x04\x22\x4d\x18"
        flg, bd = frame[4], frame[5]
        assert flg & 0x20 and flg >> 6 == 1 and not flg & 0x08, hex(flg)
        assert bd == 0x40
        assert decompress(frame, COMPRESSION_LZ4) == data


def test_levels_are_kafkas() -> None:
    """compression.<codec>.level reaches the codec: a higher level compresses text harder (gzip -1
    is zlib's 6; lz4 9, Kafka's default, its fast compressor; zstd 3 its default)."""
    text = b"".join(b"user-%d clicked /products/%d " % (i * 7919 % 10007, i % 313) for i in range(20000))

    def size(codec: int, level: int | None) -> int:
        out = compress(text, codec, level)
        assert decompress(out, codec) == text
        return len(out)

    assert size(COMPRESSION_GZIP, 1) > size(COMPRESSION_GZIP, 9)
    assert size(COMPRESSION_GZIP, -1) == size(COMPRESSION_GZIP, None) == size(COMPRESSION_GZIP, 6)
    assert size(COMPRESSION_LZ4, 9) == size(COMPRESSION_LZ4, None) > size(COMPRESSION_LZ4, 12)
    assert size(COMPRESSION_ZSTD, 3) == size(COMPRESSION_ZSTD, None)
    assert size(COMPRESSION_ZSTD, -5) > size(COMPRESSION_ZSTD, 19)
