"""Transactional batches and transaction markers (control batches) in a log, written through the
storage layer as a follower's copy writes them (`prepare_copy`): stored checks take both, so
reads serve them, recovery after a kill keeps them, the cleaner keeps whole the markers whose
transactions left a batch, a topic's codec leaves them as written and `broker dump` shows them
as markers. A produce (`validate`) never takes a marker and takes a transactional batch only
when its caller allows it."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from broker.cli import main
from broker.storage import recompression
from broker.storage.errors import UnsupportedBatchError
from broker.storage.fileio import run_ops
from broker.storage.log import Log, LogConfig
from broker.storage.log_cleaning import CleanerCheckpoint
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    CONTROL_ABORT,
    CONTROL_BIT,
    CONTROL_COMMIT,
    CRC_START,
    TRANSACTIONAL_BIT,
    Record,
    control_batch,
    control_of,
    decode_batches,
    encode_batch,
    iter_batches,
    read_header,
)

from compaction_kit import COMPACT, T0, clean_round  # isort: skip  (tests/storage's own helpers)

PID, EPOCH = 900, 2


def transactional(records: list[Record], base_offset: int, sequence: int) -> bytes:
    batch = bytearray(
        encode_batch(
            records,
            timestamp=T0,
            producer_id=PID,
            producer_epoch=EPOCH,
            base_sequence=sequence,
            base_offset=base_offset,
        )
    )
    struct.pack_into(">h", batch, 21, TRANSACTIONAL_BIT)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))
    return bytes(batch)


def copy(log_: Log, records: bytes) -> None:
    """Append as a follower copies its leader's batches: offsets kept, stored checks."""
    pending = log_.prepare_copy(records)
    run_ops(log_.io, pending.ops)
    log_.complete_append(pending)


def write_txn_log(log_: Log) -> list[tuple[int, bool | None]]:
    """Plain records, a committed and an aborted transaction: (offset, marker kind or None)."""
    log_.append(encode_batch([Record(b"v0", key=b"a"), Record(b"v1", key=b"b")], timestamp=T0))
    copy(log_, transactional([Record(b"t2", key=b"a"), Record(b"t3", key=b"c")], 2, 0))
    copy(log_, control_batch(PID, EPOCH, True, 4, T0, base_offset=4))
    copy(log_, transactional([Record(b"t5", key=b"b")], 5, 2))
    copy(log_, control_batch(PID, EPOCH, False, 4, T0, base_offset=6))
    log_.append(encode_batch([Record(b"v7", key=b"a")], timestamp=T0))
    return [(4, True), (6, False)]


def stored(log_: Log) -> tuple[list[tuple[int, bytes | None]], list[tuple[int, int, int]]]:
    """(offset, value) of every record a client gets, and (offset, type, coordinator epoch) of
    every marker, read back through the log's read door."""
    data = log_.read(log_.start_offset, 1 << 20).data
    records = [(r.offset, r.value) for r in decode_batches(data)]
    markers = [(h.base_offset, *control_of(data, pos)) for pos, h in iter_batches(data) if h.control]
    return records, markers


EXPECTED_RECORDS = [(0, b"v0"), (1, b"v1"), (2, b"t2"), (3, b"t3"), (5, b"t5"), (7, b"v7")]
EXPECTED_MARKERS = [(4, CONTROL_COMMIT, 4), (6, CONTROL_ABORT, 4)]


def test_markers_are_stored_read_and_survive_a_kill(tmp_path: Path) -> None:
    log_ = Log.open(str(tmp_path / "p"))
    write_txn_log(log_)
    assert stored(log_) == (EXPECTED_RECORDS, EXPECTED_MARKERS)
    assert log_.end_offset == 8
    log_.abandon()  # killed: nothing flushed, the index's lazy entries lost
    for index in (tmp_path / "p").glob("*.index"):
        index.unlink()  # and the index rebuilt from the store, batch by batch
    log_ = Log.open(str(tmp_path / "p"))
    try:
        assert log_.end_offset == 8
        assert stored(log_) == (EXPECTED_RECORDS, EXPECTED_MARKERS)
        headers = list(log_.batch_headers(0))
        assert [(h.base_offset, h.transactional, h.control) for h in headers] == [
            (0, False, False), (2, True, False), (4, True, True), (5, True, False), (6, True, True),
            (7, False, False),
        ]  # fmt: skip
    finally:
        log_.close()


def test_a_produce_refuses_markers_and_transactional_batches_unless_allowed(tmp_path: Path) -> None:
    log_ = Log.open(str(tmp_path / "p"))
    try:
        marker = control_batch(PID, EPOCH, True, 0, T0)
        txn = transactional([Record(b"t")], 0, 0)
        for batch in (marker, txn):
            with pytest.raises(UnsupportedBatchError, match="transactional batches are not supported"):
                log_.validate(batch)
        with pytest.raises(UnsupportedBatchError, match="control batches are written by brokers"):
            log_.validate(marker, transactional=True)
        with pytest.raises(UnsupportedBatchError, match="control batches"):
            log_.validate(txn + marker, transactional=True)
        only_control = bytearray(encode_batch([b"x"]))
        struct.pack_into(">h", only_control, 21, CONTROL_BIT)
        struct.pack_into(">I", only_control, 17, crc32c(bytes(only_control[CRC_START:])))
        with pytest.raises(UnsupportedBatchError, match="control batches"):
            log_.validate(bytes(only_control), transactional=True)
        headers = log_.validate(txn, transactional=True)
        pending = log_.prepare_append(txn, headers)
        run_ops(log_.io, pending.ops)
        log_.complete_append(pending)
        assert log_.end_offset == 1 and read_header(log_.read(0, 1 << 20).data).transactional
    finally:
        log_.close()


def test_the_cleaner_keeps_markers_whole(tmp_path: Path) -> None:
    log_ = Log.open(str(tmp_path / "p"), COMPACT)
    try:
        write_txn_log(log_)
        for i in range(60):  # key a overwritten, rolling segments: the markers' segment is cleaned
            log_.append(encode_batch([Record(b"x" * 100 + str(i).encode(), key=b"a")], timestamp=T0))
        assert clean_round(log_, CleanerCheckpoint(), producers_last={PID: 6}).ok
        records, markers = stored(log_)
        assert markers == EXPECTED_MARKERS
        assert (0, b"v0") not in records  # key a was cleaned below the markers
    finally:
        log_.close()


def test_a_topics_codec_leaves_a_marker_as_written() -> None:
    marker = control_batch(PID, EPOCH, True, 1, T0)
    txn = transactional([Record(b"t" * 200)], 0, 0)
    config = LogConfig(compression=COMPRESSION_GZIP)
    records, headers = recompression.in_log_codec(marker, [read_header(marker)], config)
    assert bytes(records) == marker and headers == [read_header(marker)]
    both = [read_header(txn), read_header(marker)]
    records, headers = recompression.in_log_codec(txn + marker, both, config)
    assert headers[0].compression == COMPRESSION_GZIP and headers[0].transactional
    assert bytes(records)[headers[0].size :] == marker


def test_dump_shows_markers_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p"
    log_ = Log.open(str(path))
    write_txn_log(log_)
    log_.close()
    assert main(["dump", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"offset 4: COMMIT marker, coordinator epoch 4 (producer {PID} epoch {EPOCH}, 78 B" in out, out
    assert f"offset 6: ABORT marker, coordinator epoch 4 (producer {PID} epoch {EPOCH}" in out, out
    assert f"transactional, producer {PID} epoch {EPOCH}" in out, out
    assert "DAMAGED" not in out

    # a control batch whose record is not a marker's (a key of 2 bytes) is named as damage
    bad = bytearray(encode_batch([Record(b"\x00\x00\x00\x00\x00\x01", key=b"\x00\x00")], base_offset=8))
    struct.pack_into(">h", bad, 21, CONTROL_BIT | TRANSACTIONAL_BIT)
    struct.pack_into(">I", bad, 17, crc32c(bytes(bad[CRC_START:])))
    log_ = Log.open(str(path))
    copy(log_, bytes(bad))
    log_.close()
    assert main(["dump", str(path)]) == 1
    out = capsys.readouterr().out
    assert "does not read as a marker" in out and "DAMAGED" in out, out
    assert os.path.isdir(path)
