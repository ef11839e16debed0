"""Control batches (a transaction's commit and abort markers): `control_batch` writes Kafka's bytes,
field by field, with its key and value as kio's ControlRecordTypeSchema and EndTxnMarker schemas
serialise them (each after its version); kafka-python's and aiokafka's readers take it for the
marker it is; `control_of` reads it back and refuses what Kafka's parsers refuse. A produce never
passes a control batch, and a transactional one only when allowed; stored checks pass both; client
decoding skips control batches."""

from __future__ import annotations

import io
import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.control_record_type_schema.v0 import ControlRecordTypeSchema
from kio.schema.end_txn_marker.v0 import EndTxnMarker
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from ringlog_proto.batch import (
    CONTROL_ABORT,
    CONTROL_BIT,
    CONTROL_COMMIT,
    CRC_START,
    HEADER_SIZE,
    NO_COORDINATOR_EPOCH,
    TRANSACTIONAL_BIT,
    BatchError,
    Record,
    control_batch,
    control_of,
    decode_batches,
    decode_records,
    encode_batch,
    invalid_batch,
    invalid_header,
    invalid_stored_batch,
    iter_batches,
    read_header,
    refused_batch,
    seal_batch,
)

PID, EPOCH, COORDINATOR_EPOCH, TS, LEADER_EPOCH = 4711, 3, 9, 1_700_000_000_123, 5


def kio_bytes(entity: object) -> bytes:
    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def kafka_key(kind: int) -> bytes:
    """Kafka's control record key: ControlRecordTypeSchema, after its version (0)."""
    return struct.pack(">h", 0) + kio_bytes(ControlRecordTypeSchema(type_=i16(kind)))


def kafka_value(coordinator_epoch: int) -> bytes:
    """Kafka's marker value: EndTxnMarker, after its version (0)."""
    return struct.pack(">h", 0) + kio_bytes(EndTxnMarker(coordinator_epoch=i32(coordinator_epoch)))


def resealed(batch: bytes | bytearray) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


def with_attributes(batch: bytes, attributes: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">h", out, 21, attributes)
    return resealed(out)


def marker_with(key: bytes | None, value: bytes | None) -> bytes:
    """A control batch around one record of this key and value (what `control_of` must judge)."""
    plain = encode_batch([Record(value, key=key, timestamp=TS)], producer_id=PID, producer_epoch=EPOCH)
    return with_attributes(plain, CONTROL_BIT | TRANSACTIONAL_BIT)


@pytest.mark.parametrize("commit", [True, False])
def test_the_marker_is_kafkas_byte_for_byte(commit: bool) -> None:
    batch = control_batch(PID, EPOCH, commit, COORDINATOR_EPOCH, TS, partition_leader_epoch=LEADER_EPOCH)
    kind = CONTROL_COMMIT if commit else CONTROL_ABORT
    key, value = kafka_key(kind), kafka_value(COORDINATOR_EPOCH)
    # the record: length 16, attributes 0, timestamp delta 0, offset delta 0, key 4, value 6, no
    # headers (zigzag varints: n -> 2n)
    record = bytes([32, 0, 0, 0, 8]) + key + bytes([12]) + value + bytes([0])
    tail = struct.pack(">hiqqqhii", 0x30, 0, TS, TS, PID, EPOCH, -1, 1)
    head = struct.pack(">qiib", 0, len(tail) + 4 + 1 + 4 + len(record), LEADER_EPOCH, 2)
    assert batch == head + struct.pack(">I", crc32c(tail + record)) + tail + record
    assert len(batch) == 78
    # the same record as our encoder writes any record, under the same header
    plain = encode_batch([Record(value, key=key, timestamp=TS)])
    assert batch[HEADER_SIZE:] == plain[HEADER_SIZE:]


def test_kafka_python_reads_it_as_a_marker() -> None:
    default_records = pytest.importorskip("kafka.record.default_records")
    for commit in (True, False):
        theirs = default_records.DefaultRecordBatch(control_batch(PID, EPOCH, commit, COORDINATOR_EPOCH, TS))
        assert theirs.validate_crc()
        assert theirs.is_control_batch and theirs.is_transactional
        assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (PID, EPOCH, -1)
        (record,) = list(theirs)
        assert isinstance(record, default_records.ControlRecord)
        assert (record.version, record.commit, record.abort) == (0, commit, not commit)
        assert record.value == kafka_value(COORDINATOR_EPOCH)


def test_aiokafka_reads_it_as_a_marker() -> None:
    records = pytest.importorskip("aiokafka.record.default_records")
    from aiokafka.record.control_record import ABORT_MARKER, COMMIT_MARKER, ControlRecord

    for commit, expected in ((True, COMMIT_MARKER), (False, ABORT_MARKER)):
        theirs = records.DefaultRecordBatch(control_batch(PID, EPOCH, commit, COORDINATOR_EPOCH, TS))
        assert theirs.validate_crc() and theirs.is_control_batch and theirs.is_transactional
        (record,) = list(theirs)
        assert ControlRecord.parse(record.key) == expected


@given(
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**15 - 1),
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 2**45),
)
def test_control_of_reads_back_what_control_batch_wrote(
    pid: int, epoch: int, commit: bool, coordinator_epoch: int, ts: int
) -> None:
    batch = control_batch(pid, epoch, commit, coordinator_epoch, ts)
    control = control_of(batch)
    assert control == (CONTROL_COMMIT if commit else CONTROL_ABORT, coordinator_epoch)
    assert control.commit == commit
    h = read_header(batch)
    assert h.control and h.transactional
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (pid, epoch, -1, 1)
    assert (h.base_timestamp, h.max_timestamp) == (ts, ts)
    assert control_of(b"\x00" * 7 + batch, 7) == control  # at a position, as in a fetched record set


def test_out_of_range_fields_are_a_batch_error() -> None:
    with pytest.raises(BatchError):
        control_batch(PID, EPOCH, True, 2**31, TS)
    with pytest.raises(BatchError):
        control_batch(PID, 2**15, True, 0, TS)


def test_control_of_follows_kafkas_parsers() -> None:
    """ControlRecordType.parse and EndTransactionMarker.deserializeValue: short keys and values and
    negative versions are errors, newer versions are read by the fields known, other control types
    carry no coordinator epoch."""
    value = kafka_value(COORDINATOR_EPOCH)
    assert control_of(marker_with(kafka_key(1), value)) == (1, COORDINATOR_EPOCH)
    newer = struct.pack(">hh", 1, 0) + b"extra"
    assert control_of(marker_with(newer, struct.pack(">hi", 3, 7) + b"more")) == (0, 7)
    assert control_of(marker_with(struct.pack(">hh", 0, 2), None)) == (2, NO_COORDINATOR_EPOCH)
    for key, val, why in (
        (None, value, "key of 0 bytes"),
        (b"\x00\x00\x01", value, "key of 3 bytes"),
        (struct.pack(">hh", -1, 1), value, "key version -1"),
        (kafka_key(1), b"\x00\x00\x00\x00\x07", "value of 5 bytes"),
        (kafka_key(0), None, "value of 0 bytes"),
        (kafka_key(0), struct.pack(">hi", -1, 7), "value version -1"),
    ):
        with pytest.raises(BatchError, match=why):
            control_of(marker_with(key, val))


def test_control_of_refuses_other_batches() -> None:
    with pytest.raises(BatchError, match="not a control batch"):
        control_of(encode_batch([Record(kafka_value(1), key=kafka_key(1))]))
    two = with_attributes(encode_batch([Record(b"v", key=kafka_key(1))] * 2), CONTROL_BIT | TRANSACTIONAL_BIT)
    with pytest.raises(BatchError, match="2 records"):
        control_of(two)
    damaged = bytearray(control_batch(PID, EPOCH, True, 0, TS))
    damaged[-2] ^= 1
    with pytest.raises(BatchError, match="crc"):
        control_of(bytes(damaged))
    assert control_of(bytes(damaged), verify=False).type == CONTROL_COMMIT


def test_a_produce_never_passes_a_marker_and_a_transactional_batch_only_when_allowed() -> None:
    marker = control_batch(PID, EPOCH, True, 0, TS)
    txn = with_attributes(
        encode_batch([b"a", b"b"], producer_id=PID, producer_epoch=EPOCH, base_sequence=0), TRANSACTIONAL_BIT
    )
    # today's reasons, unchanged: a marker from a client is refused as transactional first
    assert invalid_batch(marker) == "transactional batches are not supported (no transactions yet)"
    assert invalid_batch(txn) == "transactional batches are not supported (no transactions yet)"
    assert invalid_batch(marker, transactional=True) == (
        "control batches are written by brokers, not accepted from clients"
    )
    assert invalid_batch(txn, transactional=True) is None
    for batch in (marker, txn):
        h = read_header(batch)
        assert refused_batch(h) == invalid_header(h)
    assert refused_batch(read_header(encode_batch([b"a"]))) is None
    control_only = with_attributes(encode_batch([b"a"]), CONTROL_BIT)
    assert invalid_batch(control_only) == invalid_batch(control_only, transactional=True)
    assert invalid_batch(control_only) == "control batches are written by brokers, not accepted from clients"


def test_stored_checks_pass_transactional_and_control_batches() -> None:
    marker = control_batch(PID, EPOCH, False, 2, TS)
    txn = with_attributes(encode_batch([b"a"], producer_id=PID, producer_epoch=EPOCH, base_sequence=0), 0x10)
    control_only = with_attributes(encode_batch([b"a"]), CONTROL_BIT)
    for batch in (marker, txn, control_only):
        assert invalid_stored_batch(batch) is None
    # a cleaned (emptied) transactional batch, as compaction may leave one, passes too
    emptied = seal_batch(b"", 0, TS, TS, producer_id=PID, producer_epoch=EPOCH, attributes=TRANSACTIONAL_BIT)
    emptied = bytearray(emptied)
    struct.pack_into(">i", emptied, 23, 2)  # it spanned 3 offsets
    assert invalid_stored_batch(resealed(emptied)) is None


def test_client_decoding_skips_markers() -> None:
    data = (
        encode_batch([b"r0", b"r1"], base_offset=0)
        + control_batch(PID, EPOCH, True, 0, TS, base_offset=2)
        + encode_batch([b"r3"], base_offset=3)
    )
    assert [h.control for _, h in iter_batches(data)] == [False, True, False]
    assert [(r.offset, r.value) for r in decode_batches(data)] == [(0, b"r0"), (1, b"r1"), (3, b"r3")]
    assert [r.key for r in decode_records(data, len(encode_batch([b"r0", b"r1"])))] == [kafka_key(1)]
