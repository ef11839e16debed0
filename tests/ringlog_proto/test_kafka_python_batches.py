"""Our RecordBatch v2 against an independent implementation, kafka-python 3's
`DefaultRecordBatchBuilder` / `DefaultRecordBatch`: the same records, timestamps and producer
fields give the same bytes, and each side decodes the other's batches (headers, null keys and
values, gzip)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringlog_proto.batch import COMPRESSION_GZIP, Record, decode_records, encode_batch, invalid_records

default_records = pytest.importorskip(
    "kafka.record.default_records", reason="kafka-python 3 is not installed"
)
Builder = default_records.DefaultRecordBatchBuilder
KafkaBatch = default_records.DefaultRecordBatch

maybe_bytes = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=8), maybe_bytes), max_size=3)
timestamps = st.integers(0, 2**45)
records = st.builds(Record, value=maybe_bytes, key=maybe_bytes, headers=headers, timestamp=timestamps)
producers = st.one_of(
    st.just((-1, -1, -1)),
    st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1)),
)


def kafka_python_batch(recs: list[Record], producer: tuple[int, int, int], compression: int = 0) -> bytes:
    pid, epoch, seq = producer
    builder = Builder(2, compression, False, pid, epoch, seq, 1 << 30)
    for i, r in enumerate(recs):
        assert builder.append(i, r.timestamp, r.key, r.value, list(r.headers)) is not None
    return bytes(builder.build())


def ours(recs: list[Record], producer: tuple[int, int, int], compression: int = 0) -> bytes:
    pid, epoch, seq = producer
    # kafka-python writes 0 as the partition leader epoch (Java writes -1): say so, to compare
    return encode_batch(
        recs,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        partition_leader_epoch=0,
        compression=compression,
    )


def kafka_python_records(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list]]:
    kb = KafkaBatch(bytearray(batch))
    assert kb.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, [(k, v) for k, v in r.headers]) for r in kb]


def as_tuples(recs: list[Record]) -> list[tuple[int, int | None, bytes | None, bytes | None, list]]:
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in recs]


@settings(max_examples=200, deadline=None)
@given(st.lists(records, min_size=1, max_size=15), producers)
def test_the_same_records_give_the_same_bytes(recs: list[Record], producer: tuple[int, int, int]) -> None:
    assert ours(recs, producer) == kafka_python_batch(recs, producer)


@settings(max_examples=100, deadline=None)
@given(st.lists(records, min_size=1, max_size=15), producers, st.booleans())
def test_each_decodes_the_others_batches(
    recs: list[Record], producer: tuple[int, int, int], gzip: bool
) -> None:
    codec = COMPRESSION_GZIP if gzip else 0
    expected = [(i, r.timestamp, r.key, r.value, list(r.headers)) for i, r in enumerate(recs)]
    theirs = kafka_python_batch(recs, producer, codec)
    assert invalid_records(theirs) is None, "the broker's walk accepts what kafka-python makes"
    assert as_tuples(decode_records(theirs)) == expected
    assert kafka_python_records(ours(recs, producer, codec)) == expected


def test_plain_values_with_the_batch_timestamp() -> None:
    """Our producer's fast path (bytes items) against kafka-python appending null-key records."""
    values = [b"", b"x", b"y" * 200, b"z" * 9000] * 20  # one-, two- and three-byte length varints
    builder = Builder(2, 0, False, 5, 1, 100, 1 << 30)
    for i, v in enumerate(values):
        builder.append(i, 1_700_000_000_000, None, v, [])
    theirs = bytes(builder.build())
    mine = encode_batch(
        values,
        timestamp=1_700_000_000_000,
        producer_id=5,
        producer_epoch=1,
        base_sequence=100,
        partition_leader_epoch=0,
    )
    assert mine == theirs
