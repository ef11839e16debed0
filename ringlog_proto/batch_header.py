"""The batch header: its fields and constants, `BatchHeader`, the checks of a header and of the
crc (`invalid_header`, `invalid_batch`; the kinds of batch a produce refuses, `refused_batch`),
the recognition of ringlog's format 1 (`legacy_format`), the two fields the broker writes
(`set_base_offset`, `rebased`) and the header of a batch it writes anew (`sealed`). The layout,
field by field, is in ringlog_proto/batch.py's docstring ("Fileformat"); the C twins in native/
check their copy of it against this module's when they load.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from crc32c import crc32c

from ringlog_proto.record import BatchError

MAGIC = 2
LEGACY_MAGIC = 1  # ringlog's own format before this one: refused, see `legacy_format`
HEADER_SIZE = 61
LENGTH_PREFIX_SIZE = 12  # base_offset + batch_length: the part of the header outside batch_length
CRC_START = 21  # the crc covers everything from here (attributes) to the end of the batch
_STAMP_SIZE = 16  # base_offset, batch_length, partition_leader_epoch: what `rebased` writes
NO_PRODUCER_ID = -1
# Producer ids below this are assigned by the broker (Kafka's InitProducerId, broker/core/producer_ids.py);
# ids a client picks itself (our Producer's random ids) are at or above it, so the two never meet.
BROKER_PRODUCER_ID_LIMIT = 1 << 40
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
STORED_LEADER_EPOCH = 0  # what the broker writes until replication brings leader epochs

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
# Kafka's hasDeleteHorizonMs (KIP-534): set only by the log cleaner, on a batch it rewrote that
# holds tombstones; base_timestamp then holds the delete horizon (ms), not the first record's time.
DELETE_HORIZON_BIT = 0x40
_KNOWN_ATTRIBUTES = COMPRESSION_MASK | TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT
_STORED_ATTRIBUTES = _KNOWN_ATTRIBUTES | DELETE_HORIZON_BIT  # what a cleaned batch may carry too
COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
CODEC_NAMES: dict[int, str] = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# The smallest possible record: length, attributes, timestamp delta, offset delta, null key, null
# value and no headers, one byte each.
RECORD_HEADER_SIZE = 7
RECORD_COUNT_MAX = 1 << 20  # a batch of 1 MiB empty records; more is a malformed count, not data

_HEADER = struct.Struct(">qiibIhiqqqhii")
unpack_header = _HEADER.unpack_from  # the raw 13-tuple, for loops that cannot afford a BatchHeader
_STAMP = struct.Struct(">qii")
_LENGTHS = struct.Struct(">qi")
_CRC = struct.Struct(">I")
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. record_count: the crc's part of the header
_HEAD = struct.Struct(">qiib")  # base_offset, batch_length, partition_leader_epoch, magic

assert _HEADER.size == HEADER_SIZE
assert _STAMP.size == _STAMP_SIZE
assert _HEAD.size + _CRC.size == CRC_START
assert CRC_START + _TAIL.size == HEADER_SIZE


class BatchHeader(NamedTuple):
    """The fixed 61-byte header, which is all the broker ever reads of a batch.

    A NamedTuple, not a dataclass: the broker builds one per batch on its hot path, and a tuple is
    several times cheaper to construct.
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch on disk and on the wire."""
        return LENGTH_PREFIX_SIZE + self.batch_length

    @property
    def records_length(self) -> int:
        """Bytes of the record section (compressed, if the batch is)."""
        return self.batch_length - (HEADER_SIZE - LENGTH_PREFIX_SIZE)

    @property
    def compression(self) -> int:
        """The codec of the record section: 0 none, else a key of CODEC_NAMES."""
        return self.attributes & COMPRESSION_MASK

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """One past the batch's last offset. From `last_offset_delta`, as Kafka reads it: a
        batch the log cleaner rewrote keeps its original offsets with fewer records (or none)."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record (an idempotent producer numbers records, not batches);
        from `last_offset_delta`, which a cleaned batch keeps, so sequences survive compaction."""
        return self.base_sequence + self.last_offset_delta

    @property
    def dense(self) -> bool:
        """Whether the batch holds a record at every offset it spans (every produced batch does;
        one the log cleaner rewrote may not)."""
        return self.record_count == self.last_offset_delta + 1

    @property
    def control(self) -> bool:
        """Whether this is a control batch (a transaction marker): brokers write them, clients
        skip them when they read."""
        return bool(self.attributes & CONTROL_BIT)

    @property
    def transactional(self) -> bool:
        """Whether the batch belongs to a transaction (its records, or the marker that ends it)."""
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """When the log cleaner may drop this batch's tombstones (KIP-534), or None: not set."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_BIT else None

    def with_base_offset(self, base_offset: int, leader_epoch: int = STORED_LEADER_EPOCH) -> BatchHeader:
        """This header as stored at `base_offset` (what the broker's append assigns)."""
        return BatchHeader._make((base_offset, self[1], leader_epoch, *self[3:]))


# Positions in the raw tuple of `unpack_header`, for the loops here that cannot afford a BatchHeader.
_BASE_OFFSET_FIELD, _BATCH_LENGTH, _MAGIC, _CRC_FIELD, _RECORD_COUNT = (
    BatchHeader._fields.index(name)
    for name in ("base_offset", "batch_length", "magic", "crc", "record_count")
)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the fixed header at `pos`. Checks only that 61 bytes are there; see `invalid_batch`."""
    if len(buf) - pos < HEADER_SIZE:
        raise BatchError(f"batch header needs {HEADER_SIZE} bytes, {len(buf) - pos} available")
    return BatchHeader._make(_HEADER.unpack_from(buf, pos))


def peek_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """Whole size of the batch at `pos` from its length field, or None if fewer than 12 bytes."""
    if len(buf) - pos < LENGTH_PREFIX_SIZE:
        return None
    return LENGTH_PREFIX_SIZE + _LENGTHS.unpack_from(buf, pos)[1]


def peek_codec(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """The codec of the batch at `pos` from its attributes, or None when no format-2 header is
    there (too short, another magic): a look at one batch's codec without reading its records."""
    if len(buf) - pos < HEADER_SIZE or _HEAD.unpack_from(buf, pos)[3] != MAGIC:
        return None
    return int(_TAIL.unpack_from(buf, pos + CRC_START)[0]) & COMPRESSION_MASK


def invalid_header(h: BatchHeader, available: int | None = None, transactional: bool = False) -> str | None:
    """Why this header cannot start a valid batch, or None. Cheap: no checksum. What a produce
    passes: `refused_batch`'s refusals included (`transactional`: a transactional batch is let
    through)."""
    if h.magic != MAGIC:
        return f"unknown batch magic {h.magic} (expected {MAGIC})"
    if h.batch_length < HEADER_SIZE - LENGTH_PREFIX_SIZE:
        return f"batch_length {h.batch_length} shorter than the header"
    if available is not None and h.size > available:
        return f"batch of {h.size} bytes but only {available} bytes present"
    if not 1 <= h.record_count <= RECORD_COUNT_MAX:
        return f"record_count {h.record_count} out of range 1..{RECORD_COUNT_MAX}"
    if h.last_offset_delta != h.record_count - 1:
        return f"last_offset_delta {h.last_offset_delta} != record_count - 1 ({h.record_count - 1})"
    attributes = h.attributes
    if attributes & ~_KNOWN_ATTRIBUTES:
        return f"unknown attribute bits {attributes & 0xFFFF:#x}"
    if attributes & (TRANSACTIONAL_BIT | CONTROL_BIT):
        reason = refused_batch(h, transactional)
        if reason is not None:
            return reason
    codec = attributes & COMPRESSION_MASK
    if codec > COMPRESSION_ZSTD:
        return f"unknown compression codec {codec}"
    if not codec and h.records_length < h.record_count * RECORD_HEADER_SIZE:
        return f"{h.record_count} records cannot fit in {h.records_length} bytes"
    if h.max_timestamp < h.base_timestamp:
        return f"max_timestamp {h.max_timestamp} before base_timestamp {h.base_timestamp}"
    return None


def invalid_stored_header(h: BatchHeader, available: int | None = None) -> str | None:
    """Why this header cannot start a batch as stored, or None: `invalid_header`'s rules, but a
    batch the log cleaner rewrote (Kafka's compaction, broker/storage/cleaner.py) keeps its base
    offset and `last_offset_delta` with fewer records, none at all (an empty batch: the header
    alone, kept for its producer's sequence or its leader epoch), and may carry a delete horizon
    in place of its first timestamp; a transactional batch and a control batch (a transaction's
    marker) are stored batches like any other (`refused_batch` is a produce's rule, not a
    format's). What a read, a recovery, a follower's copy, the cleaner and a client accept; a
    produce passes `invalid_header`."""
    if h.magic != MAGIC:
        return f"unknown batch magic {h.magic} (expected {MAGIC})"
    if h.batch_length < HEADER_SIZE - LENGTH_PREFIX_SIZE:
        return f"batch_length {h.batch_length} shorter than the header"
    if available is not None and h.size > available:
        return f"batch of {h.size} bytes but only {available} bytes present"
    if not 0 <= h.last_offset_delta < RECORD_COUNT_MAX:
        return f"last_offset_delta {h.last_offset_delta} out of range 0..{RECORD_COUNT_MAX - 1}"
    if not 0 <= h.record_count <= h.last_offset_delta + 1:
        return (
            f"record_count {h.record_count} out of range 0..last_offset_delta + 1 ({h.last_offset_delta + 1})"
        )
    attributes = h.attributes
    if attributes & ~_STORED_ATTRIBUTES:
        return f"unknown attribute bits {attributes & 0xFFFF:#x}"
    codec = attributes & COMPRESSION_MASK
    if codec > COMPRESSION_ZSTD:
        return f"unknown compression codec {codec}"
    if h.record_count == 0:
        if h.records_length or codec:
            return "an empty batch holds nothing after its header"
        return None
    if not codec and h.records_length < h.record_count * RECORD_HEADER_SIZE:
        return f"{h.record_count} records cannot fit in {h.records_length} bytes"
    if not attributes & DELETE_HORIZON_BIT and h.max_timestamp < h.base_timestamp:
        return f"max_timestamp {h.max_timestamp} before base_timestamp {h.base_timestamp}"
    return None


def refused_batch(h: BatchHeader, transactional: bool = False) -> str | None:
    """Why a well-formed batch is refused from a producer anyway (INVALID_BATCH, not
    CORRUPT_MESSAGE), or None. A control batch always: markers are the broker's to write, as
    Kafka's LogValidator refuses them from a client ("Clients are not allowed to write control
    records") and takes them from the transaction coordinator. A transactional batch unless
    `transactional`: the caller's switch, off until the broker runs a transaction coordinator
    (the batch's records would otherwise wait for a marker nobody writes). Only a produce asks:
    stored batches of either kind pass `invalid_stored_header`."""
    if h.attributes & TRANSACTIONAL_BIT and not transactional:
        return "transactional batches are not supported (no transactions yet)"
    if h.attributes & CONTROL_BIT:
        return "control batches are written by brokers, not accepted from clients"
    return None


def batch_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """crc32c of the checked range of the batch at `pos` (no copy: crc32c reads a memoryview)."""
    return crc32c(memoryview(buf)[pos + CRC_START : pos + size])


def invalid_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, transactional: bool = False
) -> str | None:
    """Why the batch at `pos` is not valid as produced (header, lengths, counts, crc32c, and
    `refused_batch`'s refusals, `transactional` as there), or None.

    Records are not parsed (`invalid_records` walks them). Returns a reason rather than raising so
    callers choose between an error response (produce) and a cut (recovery).
    """
    if len(buf) - pos < HEADER_SIZE:
        return f"truncated batch: {len(buf) - pos} bytes, header needs {HEADER_SIZE}"
    h = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    reason = invalid_header(h, len(buf) - pos, transactional)
    if reason is not None:
        return reason
    actual = batch_crc(buf, pos, h.size)
    if actual != h.crc:
        return f"crc32c mismatch: stored {h.crc:#010x}, computed {actual:#010x}"
    return None


def invalid_stored_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> str | None:
    """`invalid_batch` for a batch read back from a log (`invalid_stored_header`'s rules: a batch
    the log cleaner rewrote passes): what a consumer checks before it decodes."""
    if len(buf) - pos < HEADER_SIZE:
        return f"truncated batch: {len(buf) - pos} bytes, header needs {HEADER_SIZE}"
    h = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    reason = invalid_stored_header(h, len(buf) - pos)
    if reason is not None:
        return reason
    actual = batch_crc(buf, pos, h.size)
    if actual != h.crc:
        return f"crc32c mismatch: stored {h.crc:#010x}, computed {actual:#010x}"
    return None


_LEGACY_HEADER = struct.Struct(">qiBIhiqqqhiii")  # format 1's header, only to recognise it


def legacy_format(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """LEGACY_MAGIC when the bytes at `pos` start a batch of ringlog's format 1 (magic 1 at byte
    12, its lengths and counts consistent), else None. A batch the broker stored in this format
    has its leader epoch at byte 12, 0 for now, so the two never look alike."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    (_b, length, magic, _c, _a, last_delta, _t, _m, _p, _e, _s, count, records_length) = (
        _LEGACY_HEADER.unpack_from(buf, pos)
    )
    if (
        magic == LEGACY_MAGIC
        and count >= 1
        and last_delta == count - 1
        and records_length == length - (HEADER_SIZE - LENGTH_PREFIX_SIZE)
    ):
        return LEGACY_MAGIC
    return None


def set_base_offset(
    buf: bytearray | memoryview, base_offset: int, pos: int = 0, leader_epoch: int = STORED_LEADER_EPOCH
) -> None:
    """Write the broker-assigned base offset and partition leader epoch. Both are outside the crc
    range, so the crc stays valid."""
    length = _LENGTHS.unpack_from(buf, pos)[1]
    _STAMP.pack_into(buf, pos, base_offset, length, leader_epoch)


def rebased(
    view: memoryview,
    header: BatchHeader,
    base_offset: int,
    pos: int = 0,
    leader_epoch: int = STORED_LEADER_EPOCH,
) -> tuple[bytes, memoryview, BatchHeader]:
    """The batch at `pos` of `view` (its header: `header`) as it is stored at `base_offset`: two
    buffers for one vectored write, the first 16 bytes (base offset, length, leader epoch) and a
    view of the rest of the batch, and the header as stored. The caller's bytes are neither copied
    nor changed (`set_base_offset` changes them in place). One call for all three: the broker runs
    it once per batch produced."""
    length = header.batch_length
    return (
        _STAMP.pack(base_offset, length, leader_epoch),
        view[pos + _STAMP_SIZE : pos + LENGTH_PREFIX_SIZE + length],
        BatchHeader._make((base_offset, length, leader_epoch, *header[3:])),
    )


def sealed(h: BatchHeader, attributes: int, first_ts: int, max_ts: int, count: int, records: bytes) -> bytes:
    """A whole batch the broker writes anew: `h`'s base offset, leader epoch, `last_offset_delta`
    and producer fields, with these attributes, first and max timestamps, record count and record
    section (compressed already, when `attributes` say so), under a crc of its own."""
    tail = _TAIL.pack(
        attributes,
        h.last_offset_delta,
        first_ts,
        max_ts,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
        count,
    )
    head = _HEAD.pack(
        h.base_offset, HEADER_SIZE - LENGTH_PREFIX_SIZE + len(records), h.partition_leader_epoch, MAGIC
    )
    return b"".join((head, _CRC.pack(crc32c(records, crc32c(tail))), tail, records))


def _field_at(name: str) -> int:
    """The byte offset of a header field, from `_HEADER`'s format."""
    return struct.calcsize(">" + _HEADER.format[1 : 1 + BatchHeader._fields.index(name)])


def stamped(
    view: memoryview,
    header: BatchHeader,
    base_offset: int,
    pos: int,
    leader_epoch: int,
    append_time: int,
) -> tuple[bytes, memoryview, BatchHeader]:
    """`rebased`, for a log whose timestamps are the broker's (Kafka's LogAppendTime): the whole
    header is written anew with the timestamp type bit set, `append_time` as the max timestamp
    (which readers give every record of such a batch) and the crc over the changed bytes; the
    records stay a view of the caller's bytes, which are not changed. Kafka's LogValidator does
    the same to an uncompressed or a compressed batch alike, leaving the records as they are."""
    h = header._replace(
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
        attributes=header.attributes | TIMESTAMP_TYPE_BIT,
        max_timestamp=append_time,
    )
    tail = _TAIL.pack(*h[5:])
    records = view[pos + HEADER_SIZE : pos + h.size]
    h = h._replace(crc=crc32c(records, crc32c(tail)))
    head = _HEAD.pack(base_offset, h.batch_length, leader_epoch, h.magic) + _CRC.pack(h.crc) + tail
    return head, records, h


_LAST_DELTA_AT = _field_at("last_offset_delta")
# last_offset_delta, then the bytes up to record_count, then record_count: one unpack for both
_SPAN = struct.Struct(f">i{_field_at('record_count') - _LAST_DELTA_AT - 4}xi")


def span_shortfall(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """How many offsets the batch at `pos` spans past its records (0 for every produced batch;
    more for one the log cleaner rewrote): its next offset minus (base offset + record count)."""
    last_delta, count = _SPAN.unpack_from(buf, pos + _LAST_DELTA_AT)
    return int(last_delta + 1 - count)
