"""A log whose timestamps are the broker's (Kafka's message.timestamp.type LogAppendTime,
`LogConfig.log_append_time`): every batch appended is stamped with the log's clock (timestamp type
bit, max timestamp, a crc over the changed bytes), readers give each record that time, and the
caller's bytes are not changed; a log that keeps CreateTime stores the producer's bytes as sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    TIMESTAMP_TYPE_BIT,
    decode_batches,
    encode_batch,
    invalid_batch,
    iter_batches,
    read_header,
)
from ringlog_proto.record import Record

NOW = 1_700_000_123_456


def _batch(first_ts: int, compression: int = 0) -> bytes:
    return encode_batch(
        [Record(b"v%d" % i, key=b"k", timestamp=first_ts + i) for i in range(3)], compression=compression
    )


@pytest.mark.parametrize("compression", [0, COMPRESSION_GZIP])
def test_appended_batches_are_stamped_with_the_append_time(tmp_path: Path, compression: int) -> None:
    log = Log.open(str(tmp_path / "p"), LogConfig(log_append_time=True), clock=lambda: NOW)
    try:
        sent = _batch(1000, compression)
        two = _batch(5000, compression) + _batch(6000, compression)
        kept = (bytes(sent), bytes(two))
        log.append(sent)
        log.append(two)  # several batches in one append: each stamped
        assert (sent, two) == kept, "the caller's bytes are not changed"
        data = log.read(0, 1 << 20).data
        for pos, _ in iter_batches(data):
            h = read_header(data, pos)
            assert h.attributes & TIMESTAMP_TYPE_BIT and h.max_timestamp == NOW
            assert h.compression == compression
            assert invalid_batch(data, pos) is None, "the crc covers the stamped header"
        records = decode_batches(data)
        assert [(r.offset, r.value, r.timestamp) for r in records] == [
            (i, b"v%d" % (i % 3), NOW) for i in range(9)
        ]
        assert log.offset_for_timestamp(NOW) == 0 and log.offset_for_timestamp(NOW + 1) is None
    finally:
        log.close()


def test_create_time_keeps_the_producers_bytes(tmp_path: Path) -> None:
    log = Log.open(str(tmp_path / "p"), LogConfig(), clock=lambda: NOW)
    try:
        sent = _batch(1000)
        log.append(sent)
        data = log.read(0, 1 << 20).data
        assert data[16:] == sent[16:], "only the base offset, length and leader epoch are written"
        assert [r.timestamp for r in decode_batches(data)] == [1000, 1001, 1002]
    finally:
        log.close()


def test_a_log_changed_to_log_append_time_stamps_what_follows(tmp_path: Path) -> None:
    log = Log.open(str(tmp_path / "p"), LogConfig(), clock=lambda: NOW)
    try:
        log.append(_batch(1000))
        log.config = LogConfig(log_append_time=True)  # a topic's config altered live
        log.append(_batch(2000))
        assert [r.timestamp for r in decode_batches(log.read(0, 1 << 20).data)] == [
            1000,
            1001,
            1002,
            NOW,
            NOW,
            NOW,
        ]
    finally:
        log.close()
