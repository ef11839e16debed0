"""Log.validate walks the record framing of every batch: a poison batch (valid crc, records that do
not frame) is refused with RecordFramingError before anything is written, alone or among good
batches; `check_records=False` (the bench's switch) lets it through unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from crc32c import crc32c

from broker.storage.errors import InvalidBatchError, RecordFramingError, UnsupportedBatchError
from broker.storage.log import Log, LogConfig
from labkit.poison_batches import POISON, poison_batch
from ringlog_proto.batch import COMPRESSION_GZIP, decode_batches, encode_batch


@pytest.mark.parametrize("name", sorted(POISON))
def test_poison_is_refused_and_the_log_is_untouched(tmp_path: Path, name: str) -> None:
    log = Log.open(str(tmp_path / "p"))
    try:
        log.append(encode_batch([b"a", b"b"]))
        store = log.segments[-1].store_path
        before = (log.end_offset, log.segments[-1].size, os.path.getsize(store))
        for records in (poison_batch(name), encode_batch([b"c"]) + poison_batch(name)):
            with pytest.raises(RecordFramingError) as info:
                log.append(records)
            assert "record" in str(info.value)
            assert (log.end_offset, log.segments[-1].size, os.path.getsize(store)) == before
        assert log.append(encode_batch([b"c"])) == 2
    finally:
        log.close()


def test_a_bad_crc_stays_corrupt_message_not_invalid_batch(tmp_path: Path) -> None:
    batch = bytearray(poison_batch("trailing_bytes"))
    batch[-1] ^= 1
    log = Log.open(str(tmp_path / "p"))
    try:
        with pytest.raises(InvalidBatchError) as info:
            log.append(bytes(batch))
        assert not isinstance(info.value, RecordFramingError)
    finally:
        log.close()


def test_check_records_off_stores_a_poison_batch_as_is(tmp_path: Path) -> None:
    log = Log.open(str(tmp_path / "p"), LogConfig(check_records=False))
    try:
        log.append(encode_batch([b"a"]))
        assert log.append(poison_batch("count_below_records")) == 1
        data = log.read(0, 1 << 20).data
        assert len(decode_batches(data[: len(encode_batch([b"a"]))])) == 1
    finally:
        log.close()


def test_transactional_and_control_batches_are_refused_as_unsupported(tmp_path: Path) -> None:
    log = Log.open(str(tmp_path / "p"))
    try:
        for bit, what in ((0x10, "transactional"), (0x20, "control")):
            batch = bytearray(encode_batch([b"x"], producer_id=1, producer_epoch=0, base_sequence=0))
            batch[21:23] = bit.to_bytes(2, "big")
            batch[17:21] = crc32c(bytes(batch[21:])).to_bytes(4, "big")
            with pytest.raises(UnsupportedBatchError, match=what):
                log.append(bytes(batch))
        assert log.end_offset == 0
    finally:
        log.close()


def test_a_compressed_batch_is_stored_as_it_came(tmp_path: Path) -> None:
    """gzip (and any codec): header and crc checked, records not walked, bytes kept."""
    log = Log.open(str(tmp_path / "p"))
    try:
        batch = encode_batch([b"v" * 100] * 10, compression=COMPRESSION_GZIP)
        assert log.append(batch) == 0
        stored = log.read(0, 1 << 20).data
        assert stored[16:] == batch[16:]  # all but base offset, length and leader epoch: as sent
        assert [r.value for r in decode_batches(stored)] == [b"v" * 100] * 10
    finally:
        log.close()
