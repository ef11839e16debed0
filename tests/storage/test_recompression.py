"""A log with a codec of its own (a topic's compression.type, `LogConfig.compression`): each batch
appended in another codec is stored in the log's (broker/storage/recompression.py), one batch for
one, offsets and producer sequences as they would have been; a batch already in it, and every
batch of a log that keeps the producer's codec, is stored as sent; the batch limit applies to the
batch as stored too. What it stores survives a reopen, is served to a follower as it is, and the
log cleaner reads and rewrites it; the partition's door keeps idempotence and takes a codec
changed live."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from broker.core.partition import Partition, PendingProduce, Stored
from broker.core.producer_state import SequenceError
from broker.storage.diskspace import DiskSpace
from broker.storage.errors import BatchTooLargeError
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import Log, LogConfig
from broker.storage.log_cleaning import CleanerCheckpoint
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
    encode_batch,
    invalid_stored_batch,
    iter_batches,
    read_header,
    seal_batch,
)
from ringlog_proto.batch_recompress import recompressed
from ringlog_proto.compression import compress

from compaction_kit import COMPACT, Model, clean_round  # isort: skip  (tests/storage's own helpers)

kafka_records = pytest.importorskip("kafka.record.default_records")

T = 1_700_000_000_000
NOW = 1_700_000_123_456
CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]
IO = SyncFileIO()


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
        attributes=codec,
    )


def kafka_python_read(batch: bytes) -> list[tuple]:
    """Each record as kafka-python decodes the batch: (offset, timestamp, key, value, headers)."""
    b = kafka_records.DefaultRecordBatch(batch)
    assert b.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in b]


def sent(n: int, codec: int, first: int = 0, **producer: int) -> bytes:
    """`n` records `r<first>`.. as a producer of `codec` sends them."""
    plain = encode_batch(
        [Record(b"r%d" % (first + i), key=b"k%d" % (i % 3), timestamp=T + first + i) for i in range(n)],
        **producer,
    )
    return in_codec(plain, codec)


def stored(log: Log) -> list[tuple[int, int, list[tuple]]]:
    """(base offset, codec, records as kafka-python reads them) of every batch the log serves."""
    out = []
    offset = log.start_offset
    while offset < log.end_offset:  # a read stops at the end of a segment
        r = log.read(offset, 1 << 24)
        data = bytes(r.data)
        for pos, h in iter_batches(data):
            assert invalid_stored_batch(data, pos) is None
            batch = data[pos : pos + h.size]
            out.append((h.base_offset, h.attributes & COMPRESSION_MASK, kafka_python_read(batch)))
        offset = r.next_offset
    return out


def values(batches: list[tuple[int, int, list[tuple]]]) -> list[tuple[int, bytes]]:
    return [(offset, value) for _, _, recs in batches for offset, _ts, _k, value, _h in recs]


@pytest.mark.parametrize("target", CODECS)
def test_every_batch_is_stored_in_the_logs_codec(tmp_path: Path, target: int) -> None:
    log = Log.open(str(tmp_path / "p"), LogConfig(compression=target))
    try:
        for i, codec in enumerate(CODECS):
            batch = sent(4, codec, first=4 * i)
            kept = bytes(batch)
            assert log.append(batch) == 4 * i
            assert batch == kept, "the caller's bytes are not changed"
        two = sent(2, COMPRESSION_GZIP, first=20) + sent(3, COMPRESSION_NONE, first=22)
        assert log.append(two) == 20, "several batches in one append: one stored for each"
        got = stored(log)
        assert [(base, codec) for base, codec, _ in got] == [(b, target) for b in (0, 4, 8, 12, 16, 20, 22)]
        assert values(got) == [(i, b"r%d" % i) for i in range(25)]
        assert [ts for _, _, recs in got for _, ts, *_ in recs] == [T + i for i in range(25)]
        assert log.next_offset == log.end_offset == 25
    finally:
        log.close()
    again = Log.open(str(tmp_path / "p"), LogConfig(compression=target))
    try:
        assert values(stored(again)) == [(i, b"r%d" % i) for i in range(25)], "the same after a reopen"
    finally:
        again.close()


def test_a_batch_in_the_logs_codec_and_a_producer_log_store_what_was_sent(tmp_path: Path) -> None:
    for name, config, codec in (
        ("same", LogConfig(compression=COMPRESSION_LZ4), COMPRESSION_LZ4),
        ("producer", LogConfig(), COMPRESSION_SNAPPY),
    ):
        log = Log.open(str(tmp_path / name), config)
        try:
            batch = sent(5, codec)
            log.append(batch)
            data = bytes(log.read(0, 1 << 20).data)
            assert data[16:] == batch[16:], "byte for byte past the base offset, length and epoch"
        finally:
            log.close()


def test_the_limit_applies_to_the_batch_as_stored(tmp_path: Path) -> None:
    """Kafka checks max.message.bytes on the batch as sent, and again on each rebuilt one: a gzip
    batch well within it whose records are not is MESSAGE_TOO_LARGE on an uncompressed topic."""
    log = Log.open(str(tmp_path / "p"), LogConfig(max_batch_bytes=4096, compression=COMPRESSION_NONE))
    try:
        big = in_codec(encode_batch([b"a" * 10_000], timestamp=T), COMPRESSION_GZIP)
        assert len(big) < 200
        with pytest.raises(BatchTooLargeError, match="once stored none exceeds max_batch_bytes 4096"):
            log.append(sent(1, COMPRESSION_NONE) + big)
        assert (log.next_offset, log.end_offset, log.size_bytes) == (0, 0, 0), "nothing appended"
        assert log.append(sent(1, COMPRESSION_GZIP)) == 0
    finally:
        log.close()


def test_log_append_time_stamps_the_rewritten_batch(tmp_path: Path) -> None:
    log = Log.open(
        str(tmp_path / "p"), LogConfig(compression=COMPRESSION_ZSTD, log_append_time=True), clock=lambda: NOW
    )
    try:
        log.append(sent(3, COMPRESSION_GZIP))
        ((base, codec, recs),) = stored(log)
        h = next(h for _, h in iter_batches(bytes(log.read(0, 1 << 20).data)))
        assert (base, codec, h.attributes) == (0, COMPRESSION_ZSTD, COMPRESSION_ZSTD | TIMESTAMP_TYPE_BIT)
        assert (h.base_timestamp, h.max_timestamp) == (T, NOW)
        assert [ts for _, ts, *_ in recs] == [NOW] * 3
    finally:
        log.close()


def test_a_follower_copies_the_leaders_batches_as_they_are(tmp_path: Path) -> None:
    """Only a leader's append recompresses: a follower's copy of what its leader stored keeps the
    leader's codec whatever its own config says (as Kafka's followers append as they fetch)."""
    leader = Log.open(str(tmp_path / "l"), LogConfig(compression=COMPRESSION_ZSTD))
    follower = Log.open(str(tmp_path / "f"), LogConfig(compression=COMPRESSION_GZIP))
    try:
        leader.append(sent(3, COMPRESSION_NONE))
        data = bytes(leader.read(0, 1 << 20).data)
        for pending in follower.prepare_copies(data):
            run_ops(IO, pending.ops)
            follower.complete_append(pending)
        assert bytes(follower.read(0, 1 << 20).data) == data
    finally:
        leader.close()
        follower.close()


@pytest.mark.parametrize("target", [COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_the_cleaner_reads_and_rewrites_what_a_codec_log_stores(tmp_path: Path, target: int) -> None:
    """A compacted topic stored in any codec: the cleaner inflates each batch and writes the kept
    records back in the same codec (Kafka's cleaner keeps a batch's codec)."""
    log = Log.open(str(tmp_path / "p"), replace(COMPACT, compression=target))
    model = Model()
    try:
        for i in range(150):
            model.append(
                log, [(b"k%d" % ((4 * i + j) % 7), b"value %d-%d" % (i * 7919 % 1009, j)) for j in range(4)]
            )
        assert len(log.segments) > 3
        r = clean_round(log, CleanerCheckpoint())
        assert r.ok and r.result is not None
        got = stored(log)
        assert {codec for _, codec, recs in got if recs} == {target}, "empty batches have no codec"
        assert any(0 < len(recs) < 4 for _, _, recs in got), "some batches rewritten, not only dropped"
        read = {offset: (key, value) for _, _, recs in got for offset, _ts, key, value, _h in recs}
        assert read == model.compacted(r.dirtiness.upto)
    finally:
        log.close()


# ------------------------------------------------------------------------------ the partition's door


def produce(p: Partition, records: bytes, space: DiskSpace) -> Stored:
    produced = p.produce(records, space)
    if isinstance(produced, Stored):
        return produced
    assert isinstance(produced, PendingProduce)
    run_ops(IO, produced.pending.ops)
    produced.complete()
    return produced.stored()


def test_idempotence_holds_across_the_rewrite(tmp_path: Path) -> None:
    """The producer's id, epoch and sequences are the rewritten batch's: its retry is answered
    with the original offsets and nothing is stored twice, the next sequence goes in, a gap is
    refused, and the producer state rebuilt from the log at open knows the same."""
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig(compression=COMPRESSION_ZSTD))
    try:
        first = sent(3, COMPRESSION_GZIP, producer_id=9, producer_epoch=0, base_sequence=0)
        assert produce(p, first, space)[:2] == (0, 3)
        assert produce(p, first, space)[:2] == (0, 3), "a retry: the original offsets"
        assert produce(
            p, sent(2, COMPRESSION_LZ4, 3, producer_id=9, producer_epoch=0, base_sequence=3), space
        )[:2] == (3, 5)
        with pytest.raises(SequenceError):
            p.produce(sent(1, COMPRESSION_GZIP, producer_id=9, producer_epoch=0, base_sequence=9), space)
        assert p.log.end_offset == 5
    finally:
        p.close()
    again = Partition(1, 0, str(tmp_path / "p"), LogConfig(compression=COMPRESSION_ZSTD))
    try:
        assert produce(again, first, space)[:2] == (0, 3), "known from the stored headers"
        got = stored(again.log)
        assert [(b, c) for b, c, _ in got] == [(0, COMPRESSION_ZSTD), (3, COMPRESSION_ZSTD)]
        assert values(got) == [(i, b"r%d" % i) for i in range(5)]
    finally:
        again.close()


def test_a_codec_changed_live_applies_to_later_appends(tmp_path: Path) -> None:
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    try:
        produce(p, sent(2, COMPRESSION_GZIP), space)
        p.configure(LogConfig(compression=COMPRESSION_LZ4, compression_level=3))
        produce(p, sent(2, COMPRESSION_GZIP, 2), space)
        p.configure(LogConfig())
        produce(p, sent(2, COMPRESSION_GZIP, 4), space)
        got = stored(p.log)
        assert [c for _, c, _ in got] == [COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_GZIP]
        assert values(got) == [(i, b"r%d" % i) for i in range(6)]
    finally:
        p.close()


def test_the_level_reaches_the_codec(tmp_path: Path) -> None:
    batch = sent(200, COMPRESSION_NONE)
    sizes = {}
    for level in (1, 19):
        log = Log.open(
            str(tmp_path / str(level)), LogConfig(compression=COMPRESSION_ZSTD, compression_level=level)
        )
        try:
            log.append(batch)
            sizes[level] = log.size_bytes
        finally:
            log.close()
    h = next(h for _, h in iter_batches(batch))
    assert sizes[19] == len(recompressed(batch, 0, h, COMPRESSION_ZSTD, 19, 1 << 20)) < sizes[1]


def test_an_unknown_codec_is_an_invalid_config() -> None:
    assert LogConfig(compression=7).invalid() is not None
    assert LogConfig(compression=COMPRESSION_NONE).invalid() is None


def test_a_batch_is_inflated_once_on_its_way_to_the_logs_codec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation keeps the sections it inflated of the batches the log will rewrite (none of a
    batch already in the log's codec, none on a log that keeps the producer's, none for a
    follower's copies); the rewrite starts from them, and the pending append does not hold them."""
    log = Log.open(str(tmp_path / "p"), LogConfig(compression=COMPRESSION_ZSTD))
    producer_log = Log.open(str(tmp_path / "q"), LogConfig())
    try:
        records = (
            sent(2, COMPRESSION_GZIP) + sent(3, COMPRESSION_ZSTD, first=2) + sent(2, COMPRESSION_LZ4, first=5)
        )
        checked = log.validate(records)
        gzip_at, lz4_at = 0, len(sent(2, COMPRESSION_GZIP)) + len(sent(3, COMPRESSION_ZSTD, first=2))
        assert sorted(checked.inflated) == [gzip_at, lz4_at]
        assert checked.inflated[gzip_at] == sent(2, COMPRESSION_NONE)[HEADER_SIZE:]
        assert not producer_log.validate(records).inflated
        assert not log.validate_copy(records).inflated

        def inflated_again(*_args: object) -> None:
            raise AssertionError("the rewrite inflated a batch validation had inflated")

        monkeypatch.setattr("ringlog_proto.batch_recompress.decompress_bounded", inflated_again)
        pending = log.prepare_append(records, checked)
        assert type(pending.headers) is list, "the inflated sections are not kept with the append"
        run_ops(IO, pending.ops)
        log.complete_append(pending)
        assert log.append(sent(1, COMPRESSION_GZIP, first=7)) == 7, "validated here: inflated once too"
        got = stored(log)
        assert {codec for _, codec, _ in got} == {COMPRESSION_ZSTD}
        assert values(got) == [(i, b"r%d" % i) for i in range(8)]
    finally:
        log.close()
        producer_log.close()
