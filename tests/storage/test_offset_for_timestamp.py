"""Log.offset_for_timestamp (Kafka's ListOffsets by timestamp, our seek_to_timestamp): the first
offset whose record timestamp is at or after the one asked, found in the batch's records when the
broker can decode them (uncompressed, gzip), else that batch's first offset (snappy, lz4, zstd:
their libraries are not dependencies), never an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.storage.log import Log
from labkit.poison_batches import G1, G2, GOOD, compress
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    TIMESTAMP_TYPE_BIT,
    encode_batch,
    seal_batch,
)
from ringlog_proto.record import Record


def timed(first_ts: int, compression: int = COMPRESSION_NONE) -> bytes:
    """Three records one second apart from `first_ts`."""
    return encode_batch(
        [Record(b"v%d" % i, timestamp=first_ts + i * 1000) for i in range(3)], compression=compression
    )


@pytest.mark.parametrize("codec", [COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_inside_a_batch_we_cannot_decompress_its_first_offset(tmp_path: Path, codec: int) -> None:
    log = Log.open(str(tmp_path / "p"))
    try:
        log.append(timed(1000, COMPRESSION_GZIP))  # offsets 0-2 at 1000, 2000, 3000
        # Offsets 3-5 at 10000..12000, in a codec `decode_records` does not read (appends inflate
        # it to check its records, offset_for_timestamp does not decode it).
        section = compress(GOOD + G1 + G2, codec)
        log.append(seal_batch(section, 3, 10_000, 12_000, attributes=codec))
        log.append(timed(20_000))  # offsets 6-8
        assert log.offset_for_timestamp(2000) == 1  # gzip: decoded, exact
        assert log.offset_for_timestamp(2500) == 2
        assert log.offset_for_timestamp(9000) == 3
        assert log.offset_for_timestamp(10_000) == 3
        assert log.offset_for_timestamp(11_000) == 3  # inside: the batch's first offset
        assert log.offset_for_timestamp(12_000) == 3
        assert log.offset_for_timestamp(12_001) == 6
        assert log.offset_for_timestamp(21_000) == 7  # uncompressed: exact
        assert log.offset_for_timestamp(22_001) is None
    finally:
        log.close()


def test_the_record_found_comes_with_its_own_timestamp(tmp_path: Path) -> None:
    """Kafka's ListOffsets answers the found record's timestamp beside its offset: the record's
    where its batch is decoded, the batch's first record's where it is not, the batch's max
    timestamp for every record of a LogAppendTime batch."""
    log = Log.open(str(tmp_path / "p"))
    try:
        log.append(timed(1000, COMPRESSION_GZIP))  # offsets 0-2 at 1000, 2000, 3000
        section = compress(GOOD + G1 + G2, COMPRESSION_ZSTD)
        log.append(seal_batch(section, 3, 10_000, 12_000, attributes=COMPRESSION_ZSTD))  # 3-5
        log.append(timed(20_000))  # offsets 6-8 at 20000, 21000, 22000
        section = compress(GOOD + G1 + G2, COMPRESSION_LZ4)
        appended = seal_batch(section, 3, 30_000, 31_000, attributes=COMPRESSION_LZ4 | TIMESTAMP_TYPE_BIT)
        log.append(appended)  # offsets 9-11, all at 31000 (LogAppendTime)
        assert log.timestamp_and_offset(1500) == (1, 2000)
        assert log.timestamp_and_offset(3000) == (2, 3000)
        assert log.timestamp_and_offset(11_000) == (3, 10_000)  # not decoded: its first record's
        assert log.timestamp_and_offset(20_500) == (7, 21_000)
        assert log.timestamp_and_offset(25_000) == (9, 31_000)
        assert log.timestamp_and_offset(31_001) is None
        assert log.offset_for_timestamp(20_500) == 7
    finally:
        log.close()
