"""Records without a key, which a compacted topic refuses (Kafka's LogValidator): the walk that
finds them (`ringlog_proto.batch.keyless_records`) against the records encoded, and `validate`
with `keys` (broker/storage/validation.py) refusing the first batch that has any, uncompressed
or compressed (found in the inflation that checks the framing), with the C check and without it,
and nothing appended; the partition's door asks it for a compacted topic alone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import broker.storage.validation as validation_module
from broker.core.errors import error_of
from broker.core.partition import Partition, PendingProduce
from broker.storage.diskspace import DiskSpace
from broker.storage.errors import KeylessRecordError, RecordFramingError
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import Log, LogConfig
from labkit.poison_batches import POISON, compress, compressed_batch, poison_batch
from ringlog_proto import messages as m
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    Record,
    encode_batch,
    keyless_records,
    read_header,
)

IO = SyncFileIO()
CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]
keys = st.none() | st.binary(max_size=20)
records = st.lists(
    st.tuples(keys, st.none() | st.binary(max_size=40), st.booleans()), min_size=1, max_size=30
)


def batch_of(rows: list[tuple[bytes | None, bytes | None, bool]], codec: int = COMPRESSION_NONE) -> bytes:
    """A batch of (key, value, with a header) rows, its records compressed with `codec` as a
    producer compresses them (snappy raw, lz4 and zstd frames: labkit's `compress`)."""
    plain = encode_batch([Record(v, key=k, headers=(("h", b"x"),) if h else ()) for k, v, h in rows])
    if codec == COMPRESSION_NONE:
        return plain
    return compressed_batch(compress(plain[HEADER_SIZE:], codec), len(rows), codec)


@settings(max_examples=200, deadline=None)
@given(rows=records)
def test_the_walk_finds_exactly_the_records_without_a_key(
    rows: list[tuple[bytes | None, bytes | None, bool]],
) -> None:
    data = b"pad" + batch_of(rows)  # inside a larger buffer, as a request's
    h = read_header(data, 3)
    found = keyless_records(data, 3 + HEADER_SIZE, 3 + h.size, h.record_count)
    assert found == [i for i, (k, _, _) in enumerate(rows) if k is None]


@pytest.fixture(params=["c", "python"])
def compacted(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A compacted log, validated with the C check and with the Python checks alone."""
    if request.param == "python":
        monkeypatch.setattr(validation_module, "_check_produced", None)
    log_ = Log.open(str(tmp_path / "log"), LogConfig(cleanup_policy="compact"))
    yield log_
    log_.close()


@pytest.mark.parametrize("codec", CODECS)
def test_validate_with_keys_refuses_a_batch_with_records_without_one(compacted: Log, codec: int) -> None:
    rows = [(b"k0", b"v", False), (None, b"v", True), (b"k2", None, False), (None, None, False)]
    with pytest.raises(KeylessRecordError) as info:
        compacted.validate(batch_of(rows, codec), keys=True)
    assert info.value.indexes == (1, 3)
    assert "2 record(s) without a key (index 1, 3)" in str(info.value)
    assert error_of(info.value)[0] == m.ErrorCode.INVALID_RECORD
    keyed = batch_of([(b"k", b"v", False), (b"t", None, True)], codec)  # a tombstone has its key
    assert len(compacted.validate(keyed, keys=True)) == 1
    assert len(compacted.validate(batch_of(rows, codec))) == 1, "without `keys`, nothing more is asked"


def test_the_first_batch_with_keyless_records_refuses_them_all(compacted: Log) -> None:
    good = batch_of([(b"k", b"v", False)])
    bad = batch_of([(b"k", b"v", False), (None, b"v", False)], COMPRESSION_GZIP)
    with pytest.raises(KeylessRecordError) as info:
        compacted.validate(good + bad + good, keys=True)
    assert info.value.indexes == (1,) and str(info.value).startswith(f"batch at byte {len(good)}: ")


@pytest.mark.parametrize("name", sorted(POISON))
def test_framing_is_checked_before_keys(compacted: Log, name: str) -> None:
    """Poison (records that do not frame, without keys) is refused for its framing
    (INVALID_BATCH), never for its keys: the key walk reads only what the framing walk passed."""
    with pytest.raises(RecordFramingError):
        compacted.validate(poison_batch(name), keys=True)


# ------------------------------------------------------------------------------ the partition's door


def written(p: Partition, records: bytes, space: DiskSpace) -> None:
    produced = p.produce(records, space)
    assert isinstance(produced, PendingProduce)
    run_ops(IO, produced.pending.ops)
    produced.complete()


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_a_compacted_partition_refuses_records_without_a_key(tmp_path: Path, policy: str) -> None:
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig(cleanup_policy=policy))
    try:
        with pytest.raises(KeylessRecordError):
            p.produce(encode_batch([Record(b"v")]), space)
        assert p.log.end_offset == 0 and p.log.next_offset == 0, "nothing prepared"
        written(p, encode_batch([Record(b"v", key=b"k")]), space)
        assert p.log.end_offset == 1
        # a topic that stops compacting takes them again (configs apply live)
        p.configure(replace(p.log.config, cleanup_policy="delete"))
        written(p, encode_batch([Record(b"v")]), space)
        assert p.log.end_offset == 2
    finally:
        p.close()


def test_a_partition_that_does_not_compact_takes_records_without_a_key(tmp_path: Path) -> None:
    space = DiskSpace(str(tmp_path), 0)
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    try:
        written(p, encode_batch([Record(b"v"), Record(None)]), space)
        assert p.log.end_offset == 2
    finally:
        p.close()
