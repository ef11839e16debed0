"""Control batches: the commit and abort markers that end a transaction in each of its partitions
(KIP-98), as Kafka writes them, byte for byte: `control_batch` builds one, `control_of` reads one.

Rules this module keeps:
- A marker is what Kafka's `MemoryRecords.withEndTransactionMarker` writes: a batch whose
  attributes carry the control and transactional bits (no compression, CreateTime), the
  producer's id and epoch, base sequence -1, and one record at offset delta 0 whose key is the
  control record type (Kafka's ControlRecordTypeSchema: version i16 = 0, type i16: 0 abort,
  1 commit) and whose value is Kafka's EndTxnMarker (version i16 = 0, coordinator_epoch i32),
  each prefixed by its version as Kafka's `MessageUtil.toVersionPrefixedBytes` does. 78 bytes.
- Reading follows Kafka's `ControlRecordType.parse` and `EndTransactionMarker.deserializeValue`:
  a key shorter than 4 bytes or of a negative version, and a marker's value shorter than 6
  bytes, are errors; a newer version is read by the fields this version knows. A control record
  of another type (KRaft's, never in a partition's log here) has no coordinator epoch.
- Clients never hand a control record to an application (batch_decode.py's `decode_batches`,
  the consumer, the Spark source skip them); only the broker and tools read them, here.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ringlog_proto.batch_decode import decode_records
from ringlog_proto.batch_encode import seal_batch
from ringlog_proto.batch_header import (
    CONTROL_BIT,
    NO_PARTITION_LEADER_EPOCH,
    NO_SEQUENCE,
    TRANSACTIONAL_BIT,
    read_header,
)
from ringlog_proto.record import BatchError

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_TYPE_NAMES: dict[int, str] = {CONTROL_ABORT: "abort", CONTROL_COMMIT: "commit"}
NO_COORDINATOR_EPOCH = -1  # what `control_of` gives a control record that is not a marker
MARKER_ATTRIBUTES = CONTROL_BIT | TRANSACTIONAL_BIT

_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator_epoch
_KEY_VERSION = 0
_VALUE_VERSION = 0
# The one record, before its key and after it: length 16 (zigzag 32), attributes 0, timestamp
# delta 0, offset delta 0, key length 4 (zigzag 8); then value length 6 (zigzag 12); then no
# headers.
_RECORD_HEAD = bytes((2 * (1 + 1 + 1 + 1 + _KEY.size + 1 + _VALUE.size + 1), 0, 0, 0, 2 * _KEY.size))
_RECORD_MID = bytes((2 * _VALUE.size,))
_RECORD_TAIL = b"\x00"


class ControlRecord(NamedTuple):
    """What a control batch says: its type (CONTROL_ABORT, CONTROL_COMMIT, or another of
    Kafka's) and, for a marker, the coordinator epoch that wrote it."""

    type: int
    coordinator_epoch: int

    @property
    def commit(self) -> bool:
        return self.type == CONTROL_COMMIT


def control_batch(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp: int,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    base_offset: int = 0,
) -> bytes:
    """The commit (or abort) marker of `producer_id`'s transaction at `producer_epoch`, written
    by the coordinator of `coordinator_epoch` at `timestamp` (ms): one control batch (module
    rules), whose base offset and leader epoch the append assigns as for any batch."""
    try:
        key = _KEY.pack(_KEY_VERSION, CONTROL_COMMIT if commit else CONTROL_ABORT)
        value = _VALUE.pack(_VALUE_VERSION, coordinator_epoch)
    except struct.error as exc:
        raise BatchError(f"marker field out of range: {exc}") from None
    section = b"".join((_RECORD_HEAD, key, _RECORD_MID, value, _RECORD_TAIL))
    return seal_batch(
        section,
        1,
        timestamp,
        timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=MARKER_ATTRIBUTES,
    )


def control_of(buf: bytes | bytearray | memoryview, pos: int = 0, verify: bool = True) -> ControlRecord:
    """The type and coordinator epoch of the control batch at `pos` (its crc checked first when
    `verify`); BatchError when it is not a control batch or its record does not read as one
    (module rules)."""
    h = read_header(buf, pos)
    if not h.control:
        raise BatchError(f"batch at offset {h.base_offset} is not a control batch")
    records = decode_records(buf, pos, verify)
    if len(records) != 1:
        raise BatchError(f"control batch at offset {h.base_offset} holds {len(records)} records, not 1")
    key, value = records[0].key, records[0].value
    if key is None or len(key) < _KEY.size:
        raise BatchError(f"control batch at offset {h.base_offset}: key of {len(key or b'')} bytes, not 4")
    version, kind = _KEY.unpack_from(key)
    if version < 0:
        raise BatchError(f"control batch at offset {h.base_offset}: key version {version}")
    if kind not in CONTROL_TYPE_NAMES:
        return ControlRecord(kind, NO_COORDINATOR_EPOCH)
    if value is None or len(value) < _VALUE.size:
        raise BatchError(
            f"control batch at offset {h.base_offset}: marker value of {len(value or b'')} bytes, not 6"
        )
    version, coordinator_epoch = _VALUE.unpack_from(value)
    if version < 0:
        raise BatchError(f"control batch at offset {h.base_offset}: marker value version {version}")
    return ControlRecord(kind, coordinator_epoch)
