"""Record batches: the unit of storage and of the wire. Kafka's RecordBatch v2 (magic 2), byte for byte.

Rules this module keeps:
- No I/O. Bytes in, bytes out; the broker, the clients and the Spark source all use this one codec.
- One format: Kafka's RecordBatch v2, on disk and in both protocols, so a Kafka Fetch is a plain
  extent read. A data dir written by the old format 1 is refused at open (`legacy_format`), not
  converted and never mistaken for damage.
- The broker never decodes records. It reads the fixed header, checks length, crc32c and counts with
  `invalid_batch()`, walks the record framing with `invalid_records()` (a compressed batch's
  after inflating it, bounded: `invalid_compressed_records()`)
  (varint lengths, offset deltas, counts, header keys; never the payload), writes the base offset
  and partition leader epoch with `set_base_offset()` (or beside it, `rebased()`), and stores the
  bytes as they came; reading them back, it checks them with `scan_stored()` (`stored_damage()`
  batch after batch, in C when native._records is built). The crc does not
  cover those two fields, so assigning them costs 16 bytes, not a checksum over the batch. The walk
  is what keeps a batch no client can decode (a "poison" batch with a valid crc) out of the log.
- No module outside ringlog_proto reads or writes batch bytes at an offset: they use the named
  fields of `BatchHeader` and the helpers here, so a format change is made in this file (and in
  the C twins of the records walk, of a produce's checks and of the stored-batch scan,
  native/_records_build.py, whose header offsets and limits are checked against this file's
  when it loads).
- The walk runs in C (`native._records`, a small cffi extension) when it is built, and in Python
  (`walk_records_python`, its exact twin) when it is not: ringlog_proto needs nothing of native/,
  and clients never walk (they decode, which checks the same things).
- Clients encode and decode the records section in C (`native._codec` through
  ringlog_proto/records_codec.py, one call per batch) when it is built, and a batch of plain
  values whole, header and crc included (`native._batch`, one CPython call, whose header
  offsets are checked against this file's when it loads); the encode and decode
  here are the pure-Python codec, used when it is not (and for the rare shapes the C path leaves
  to it: a first record with a timestamp of its own, LogAppendTime batches). Both give the same
  bytes and the same records and fail on the same batches (tests/ringlog_proto/test_batch_codecs.py runs
  each). Varints cost a Python branch per field, so the Python encode takes precomputed varints
  from a table, and its decode first matches a record against the previous record's shape
  (`startswith` in C) and parses field by field only when it differs. Records without headers
  share one empty tuple as `headers`, in both codecs.

Fileformat (Kafka RecordBatch v2, all fixed-width integers big-endian, 61-byte header):

    offset size field                      meaning
    0      8    base_offset            i64  offset of the first record; the broker overwrites it
                                            (a client's value is ignored, Kafka clients send 0)
    8      4    batch_length           i32  bytes after this field (the whole batch is 12 + batch_length)
    12     4    partition_leader_epoch i32  written by the broker (0 until replication has epochs);
                                            clients send -1 (Java) or 0 (librdkafka, kafka-python)
    16     1    magic                  i8   2
    17     4    crc                    u32  crc32c (Castagnoli) of bytes [21, 12 + batch_length)
    21     2    attributes             i16  bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4,
                                            4 zstd), bit 3 timestamp type (0 create, 1 log append),
                                            bit 4 transactional, bit 5 control; the rest zero
    23     4    last_offset_delta      i32  record_count - 1
    27     8    base_timestamp         i64  ms since the epoch, of the first record
    35     8    max_timestamp          i64  ms since the epoch, largest record timestamp in the batch
    43     8    producer_id            i64  -1 when the producer is not idempotent
    51     2    producer_epoch         i16  -1 when not idempotent
    53     4    base_sequence          i32  sequence of the first record, -1 when not idempotent
    57     4    record_count           i32  number of records, >= 1
    61     ...  records: record_count records back to back, or, when compressed, one stream of the
                codec's framing (gzip; snappy as Kafka's xerial framing; lz4 frame; zstd frame)
                holding them

Each record (varint = zigzag base-128 varint, at most 5 bytes; varlong: at most 10 bytes):

    varint   length           bytes of the record after this field
    i8       attributes       unused (0)
    varlong  timestamp_delta  ms relative to base_timestamp
    varint   offset_delta     the record's index in the batch: offset = base_offset + offset_delta
    varint   key_length       -1 for a null key
    ...      key
    varint   value_length     -1 for a null value
    ...      value
    varint   header_count
    then header_count times:
      varint header_key_length, then the key as UTF-8 (never null)
      varint header_value_length (-1 for null), then the value bytes

What a produced batch must satisfy, as Kafka's broker checks it; a header failure or a wrong crc
is CORRUPT_MESSAGE, a framing failure or a batch of a kind not taken yet is INVALID_BATCH:
- magic 2; batch_length covers the header and fits the bytes sent and `max_batch_bytes`; the crc;
- 1 <= record_count <= RECORD_COUNT_MAX, last_offset_delta == record_count - 1, and
  max_timestamp >= base_timestamp;
- a known codec and no unknown attribute bit; no transactional or control bit (transactions are not
  supported yet: INVALID_BATCH, with that reason, see `unsupported_batch`);
- in an uncompressed batch, the walk, record by record: every varint ends inside its record and
  within its width, record lengths fit, each offset_delta equals the record's index, key and value
  lengths are >= -1 and inside the record, header counts >= 0, header key lengths >= 0 and keys
  UTF-8, header value lengths >= -1, each record's fields end exactly at its length, and exactly
  record_count records fill the batch.
- in a compressed batch, the same walk over its inflated record section (`invalid_compressed_records`,
  as Kafka's LogValidator decompresses and counts): a stream that does not decompress (garbage
  with a valid crc, truncated, trailing bytes) is CORRUPT_MESSAGE, records that do not frame or
  are fewer or more than record_count are INVALID_BATCH, and a section inflating past the bound
  (`decompress_bounded`: never more than it is produced, whatever the stream claims) is
  MESSAGE_TOO_LARGE. The batch is then stored as it came, compressed.
The same rules make `decode_records` fail.

Clients' base offsets are overwritten, never checked: Kafka clients send 0, our encoder 0 by default.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from crc32c import crc32c

from ringlog_proto import records_codec
from ringlog_proto.record import BatchError, Header, Record
from ringlog_proto.varint import zigzag_varint

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
_KNOWN_ATTRIBUTES = COMPRESSION_MASK | TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT
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
_U32 = struct.Struct(">I")  # a request head's length fields (`encode_batch_framed`)
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
        return self.base_offset + self.record_count

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record (an idempotent producer numbers records, not batches)."""
        return self.base_sequence + self.record_count - 1

    def with_base_offset(self, base_offset: int, leader_epoch: int = STORED_LEADER_EPOCH) -> BatchHeader:
        """This header as stored at `base_offset` (what the broker's append assigns)."""
        return BatchHeader._make((base_offset, self[1], leader_epoch, *self[3:]))


# Positions in the raw tuple of `unpack_header`, for the loops here that cannot afford a BatchHeader.
_BASE_OFFSET_FIELD, _BATCH_LENGTH, _MAGIC, _CRC_FIELD, _RECORD_COUNT = (
    BatchHeader._fields.index(name)
    for name in ("base_offset", "batch_length", "magic", "crc", "record_count")
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ----------------------------------------------------------------------------- varints

_MASK32 = 0xFFFF_FFFF
_MASK64 = 0xFFFF_FFFF_FFFF_FFFF
_VARINT_BITS = 35  # 5 bytes of 7 bits: a sixth byte makes a varint too long (as Kafka reads them)
_VARLONG_BITS = 70  # 10 bytes


_ZZ_TABLE_SIZE = 1 << 14  # non-negative values with a precomputed encoding (lengths up to 16 KiB)
_ZZ: list[bytes] = [zigzag_varint(v) for v in range(_ZZ_TABLE_SIZE)]
_NULL = zigzag_varint(-1)  # b"\x01": a null key, value or header value
_UNZZ: tuple[int, ...] = tuple((b >> 1) ^ -(b & 1) for b in range(0x80))  # one-byte varints


def varint_size(value: int) -> int:
    """Bytes of `zigzag_varint(value)`."""
    z = ((value << 1) ^ (value >> 63)) & _MASK64
    return (z.bit_length() + 6) // 7 or 1


def _zz(value: int) -> bytes:
    return _ZZ[value] if 0 <= value < _ZZ_TABLE_SIZE else zigzag_varint(value)


def read_varint(buf: bytes | bytearray | memoryview, p: int, wide: bool = False) -> tuple[int, int]:
    """(value, next position) of the zigzag varint (`wide`: varlong) at `p`, read as Kafka reads it
    (bits past 32 or 64 dropped). BatchError when it is longer than 5 (10) bytes; IndexError past
    the end of `buf`."""
    limit = _VARLONG_BITS if wide else _VARINT_BITS
    shift = 0
    z = 0
    while True:
        b = buf[p]
        p += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            z &= _MASK64 if wide else _MASK32
            return (z >> 1) ^ -(z & 1), p
        shift += 7
        if shift >= limit:
            raise BatchError(f"a {'varlong' if wide else 'varint'} longer than {limit // 7} bytes")


# ----------------------------------------------------------------------------- encode


def _encode_headers(headers: Sequence[Header]) -> bytes:
    parts = [_zz(len(headers))]
    for hkey, hval in headers:
        kb = hkey.encode()
        parts.append(_zz(len(kb)))
        parts.append(kb)
        if hval is None:
            parts.append(_NULL)
        else:
            parts.append(_zz(len(hval)))
            parts.append(hval)
    return b"".join(parts)


def record_size(
    value: bytes | None,
    key: bytes | None = None,
    headers: Sequence[Header] = (),
    offset_delta: int = 0,
    timestamp_delta: int = 0,
) -> int:
    """Exact encoded size of one record (its length varint included) at these deltas."""
    body = (
        1
        + varint_size(timestamp_delta)
        + varint_size(offset_delta)
        + (1 if key is None else varint_size(len(key)) + len(key))
        + (1 if value is None else varint_size(len(value)) + len(value))
        + (len(_encode_headers(headers)) if headers else 1)
    )
    return varint_size(body) + body


PlainEncoder = Callable[[Sequence[Any], int, int, int, int, int, int], "bytes | None"]
_UNRESOLVED: Any = object()
_plain: PlainEncoder | None = _UNRESOLVED


def _native_plain_encoder() -> PlainEncoder | None:
    """`encode_batch` of plain values in one C call (native._batch's `encode_values`: the section,
    the header and its crc, written straight into the bytes returned), or None when native._batch
    is not built. Its copy of the header layout is checked against this file's first; a build
    that disagrees raises.

    The encoder returns None for what it does not encode (an item that is not bytes, a field or
    count out of range): `encode_batch`'s own path then does, or raises its error. In a
    producer's send one call instead of ~25, which cost a one-record send ~30 µs of client CPU."""
    try:
        from native._batch import LAYOUT, encode_values  # noqa: PLC0415 - optional, loaded on first use
    except ImportError:
        return None
    fields = (
        "base_offset", "batch_length", "partition_leader_epoch", "magic", "crc", "attributes",
        "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id", "producer_epoch",
        "base_sequence", "record_count",
    )  # fmt: skip
    ours = {"HEADER_SIZE": HEADER_SIZE, "CRC_START": CRC_START, "MAGIC": MAGIC}
    ours |= {"RECORD_COUNT_MAX": RECORD_COUNT_MAX} | {f: _field_at(f) for f in fields}
    if ours != LAYOUT:
        raise RuntimeError("native._batch writes another batch header layout than ringlog_proto/batch.py")
    return encode_values  # type: ignore[no-any-return]


FramedEncoder = Callable[[bytes, int, int, Sequence[Any], int, int, int, int, int, int], "bytes | None"]
_framed: FramedEncoder | None = _UNRESOLVED


def _native_framed_encoder() -> FramedEncoder | None:
    """native._batch's `encode_framed` (the batch after a caller's head, two of the head's u32
    fields set), once `_native_plain_encoder` has checked the build's header layout; None
    without the build."""
    if _native_plain_encoder() is None:
        return None
    from native._batch import encode_framed  # noqa: PLC0415 - optional, as above

    return encode_framed  # type: ignore[no-any-return]


def encode_batch_framed(
    head: bytes,
    total_at: int,
    length_at: int,
    values: Sequence[bytes | Record],
    timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytes:
    """`head`, then `encode_batch(values, ...)`, in one bytes object, with two big-endian u32
    fields of `head` set: at `total_at` the size of everything after that field, at `length_at`
    the batch's. A request frame around one batch, whose layout is the caller's
    (ringlog_proto/messages.py's `encode_produce_values`): a one-record send writes it whole. One
    C call for plain values when native._batch is built; `encode_batch` and a copy otherwise."""
    global _framed  # noqa: PLW0603 - resolved once, on the first encode
    if _framed is _UNRESOLVED:
        _framed = _native_framed_encoder()
    if _framed is not None and records_codec.current_codec() is not records_codec.PYTHON:
        frame = _framed(
            head, total_at, length_at, values, timestamp, 0, NO_PARTITION_LEADER_EPOCH, producer_id,
            producer_epoch, base_sequence,
        )  # fmt: skip
        if frame is not None:
            return frame
    batch = encode_batch(
        values,
        timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    out = bytearray(head)
    out += batch
    _U32.pack_into(out, length_at, len(batch))
    _U32.pack_into(out, total_at, len(out) - total_at - _U32.size)
    return bytes(out)


def encode_batch(
    records: Iterable[Record | bytes],
    *,
    timestamp: int | None = None,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    compression: int = COMPRESSION_NONE,
) -> bytes:
    """Encode records into one batch, as Kafka's producers do (byte for byte: tests compare).

    A plain `bytes` item is a value with no key, headers or timestamp: the common producer case,
    whose record framing is a few table lookups. Records without a timestamp take `timestamp`
    (default: now), so a batch built in one call shares one clock reading; the batch's
    base_timestamp is its first record's. `compression`: COMPRESSION_NONE or COMPRESSION_GZIP.
    """
    default_ts = now_ms() if timestamp is None else timestamp
    codec = records_codec.current_codec()
    if codec is not records_codec.PYTHON:
        # The C codec (native._codec) encodes the section whole. It takes deltas from one base
        # timestamp, which is this function's (the first record's) whenever the first record has
        # no timestamp of its own, the producer's case; otherwise the Python path below.
        recs = records if isinstance(records, (list, tuple)) else list(records)
        first = recs[0] if recs else None
        if type(first) is bytes and not compression:
            # Values alone, the producer's case: the whole batch in one C call when it can be
            # (None when it cannot: this function's own path then says why, or encodes it).
            global _plain  # noqa: PLW0603 - resolved once, on the first encode
            if _plain is _UNRESOLVED:
                _plain = _native_plain_encoder()
            if _plain is not None:
                batch = _plain(
                    recs, default_ts, base_offset, partition_leader_epoch, producer_id, producer_epoch,
                    base_sequence,
                )  # fmt: skip
                if batch is not None:
                    return batch
        if first is not None and (type(first) is bytes or first.timestamp is None):  # type: ignore[union-attr]
            if len(recs) > RECORD_COUNT_MAX:
                raise BatchError(f"{len(recs)} records in one batch; at most {RECORD_COUNT_MAX}")
            header = {
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "base_sequence": base_sequence,
                "base_offset": base_offset,
                "partition_leader_epoch": partition_leader_epoch,
            }
            if compression:
                section, count, max_ts = records_codec.encode_section(recs, default_ts, codec=codec)
                return seal_batch(
                    compress(bytes(section), compression), count, default_ts, max_ts,
                    attributes=compression, **header,
                )  # fmt: skip
            out, count, max_ts = records_codec.encode_section(
                recs, default_ts, prefix=HEADER_SIZE, codec=codec
            )
            _seal_into(out, count, default_ts, max_ts, **header)
            return bytes(out)
        records = recs
    zz = _ZZ
    table = _ZZ_TABLE_SIZE
    first_ts: int | None = None
    max_ts = -(1 << 63)
    parts: list[bytes] = []
    extend = parts.extend
    count = 0
    plain_prefix = b""  # attributes and timestamp delta of a plain bytes record, once first_ts is set
    last_n = -1
    value_len = b""
    fixed = 0
    try:
        for rec in records:
            od = zz[count] if count < table else zigzag_varint(count)
            if type(rec) is bytes:
                if first_ts is None:
                    first_ts = default_ts
                if not plain_prefix:
                    plain_prefix = b"\x00" + _zz(default_ts - first_ts)
                    if default_ts > max_ts:
                        max_ts = default_ts
                n = len(rec)
                if n != last_n:  # producers send runs of one size: encode the length once a run
                    last_n = n
                    value_len = _NULL + (zz[n] if n < table else zigzag_varint(n))  # null key, length
                    fixed = len(plain_prefix) + len(value_len) + n + 1
                body = fixed + len(od)
                extend(
                    (
                        zz[body] if body < table else zigzag_varint(body),
                        plain_prefix,
                        od,
                        value_len,
                        rec,
                        b"\x00",
                    )
                )
                count += 1
                continue
            ts = default_ts if rec.timestamp is None else rec.timestamp
            if first_ts is None:
                first_ts = ts
            if ts > max_ts:
                max_ts = ts
            d = ts - first_ts
            tsb = zz[d] if 0 <= d < table else zigzag_varint(d)
            key = rec.key
            if key is None:
                kb = _NULL
                key = b""
            else:
                n = len(key)
                kb = zz[n] if n < table else zigzag_varint(n)
            value = rec.value
            if value is None:
                vb = _NULL
                value = b""
            else:
                n = len(value)
                vb = zz[n] if n < table else zigzag_varint(n)
            hdrs = rec.headers
            hb = _encode_headers(hdrs) if hdrs else b"\x00"
            # No join per record: the key and value are copied once, into the section.
            body = 1 + len(tsb) + len(od) + len(kb) + len(key) + len(vb) + len(value) + len(hb)
            extend(
                (zz[body] if body < table else zigzag_varint(body), b"\x00", tsb, od, kb, key, vb, value, hb)
            )
            count += 1
    except (TypeError, AttributeError) as exc:
        raise BatchError(f"record {count} cannot be encoded: {exc}") from None
    if count == 0:
        raise BatchError("a batch needs at least one record")
    if count > RECORD_COUNT_MAX:
        raise BatchError(f"{count} records in one batch; at most {RECORD_COUNT_MAX}")
    assert first_ts is not None
    try:
        section = b"".join(parts)
    except TypeError as exc:  # a key, value or header value that is not bytes-like
        raise BatchError(f"a record cannot be encoded: {exc}") from None
    attributes = 0
    if compression:
        section = compress(section, compression)
        attributes = compression
    return seal_batch(
        section,
        count,
        first_ts,
        max_ts,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=attributes,
    )


def seal_batch(
    section: bytes,
    count: int,
    first_ts: int,
    max_ts: int,
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    attributes: int = 0,
) -> bytes:
    """The batch header (lengths, crc32c) around an encoded records `section` of `count` records.

    Trusts `section`: `encode_batch` is the way to make a valid batch; tests use this alone to
    wrap record framing that does not parse in a header whose lengths and crc are right."""
    batch_length = HEADER_SIZE - LENGTH_PREFIX_SIZE + len(section)
    try:
        tail = _TAIL.pack(
            attributes, count - 1, first_ts, max_ts, producer_id, producer_epoch, base_sequence, count
        )
        head = _HEAD.pack(base_offset, batch_length, partition_leader_epoch, MAGIC)
    except struct.error as exc:
        raise BatchError(f"batch header field out of range: {exc}") from None
    crc = crc32c(section, crc32c(tail))
    return b"".join((head, _CRC.pack(crc), tail, section))


def _seal_into(
    out: bytearray,
    count: int,
    first_ts: int,
    max_ts: int,
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int = 0,
) -> None:
    """`seal_batch` in place: the header written into the first HEADER_SIZE bytes of `out`, whose
    rest is the records section, so the batch is not copied to put its header in front."""
    try:
        _TAIL.pack_into(
            out, CRC_START, attributes, count - 1, first_ts, max_ts, producer_id, producer_epoch,
            base_sequence, count,
        )  # fmt: skip
        _HEAD.pack_into(out, 0, base_offset, len(out) - LENGTH_PREFIX_SIZE, partition_leader_epoch, MAGIC)
    except struct.error as exc:
        raise BatchError(f"batch header field out of range: {exc}") from None
    _CRC.pack_into(out, CRC_START - _CRC.size, crc32c(memoryview(out)[CRC_START:]))


# ----------------------------------------------------------------------------- compression


def compress(section: bytes, codec: int) -> bytes:
    """The record section compressed with `codec` (gzip only here: the stdlib has it)."""
    if codec == COMPRESSION_GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip stream, mtime 0
        return c.compress(section) + c.flush()
    raise BatchError(
        f"cannot compress with {CODEC_NAMES.get(codec, f'codec {codec}')}: only gzip is built in"
    )


def decompress(data: bytes | bytearray | memoryview, codec: int) -> bytes:
    """The record section of a compressed batch, uncompressed, for clients' decode: gzip always
    (stdlib zlib); the others raise a BatchError naming the codec (clients need no codec
    library; the broker checks every codec with `decompress_bounded`)."""
    if codec == COMPRESSION_GZIP:
        try:
            d = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, as producers write
            out = d.decompress(data)
            while d.eof and d.unused_data:  # a multi-member gzip stream
                rest = d.unused_data
                d = zlib.decompressobj(47)
                out += d.decompress(rest)
            if not d.eof:
                raise BatchError("gzip record section is truncated")
            return out
        except zlib.error as exc:
            raise BatchError(f"gzip record section does not decompress: {exc}") from None
    name = CODEC_NAMES.get(codec)
    if name is None:
        raise BatchError(f"unknown compression codec {codec}")
    raise BatchError(
        f"the batch is {name}-compressed, and this client decodes only uncompressed and gzip batches "
        f"(no {name} library)"
    )


class DecompressedTooLarge(BatchError):
    """A compressed record section that inflates past the bound it was checked against: a
    decompression bomb, or simply too much for one batch (MESSAGE_TOO_LARGE, not corruption)."""


_XERIAL_MAGIC = b"\x82SNAPPY\x00"  # Java's snappy framing: magic, i32 version, i32 compatible
_XERIAL_HEADER = 16
_OVERFLOW = "failed to write whole buffer"  # what cramjam says when its output buffer is full
_scratch = bytearray()  # the output of a bounded decompression, reused: one per process (core)


def _cramjam(codec: int) -> Any:
    try:
        import cramjam  # noqa: PLC0415 - the broker's codec library, loaded on the first such batch
    except ImportError:
        name = CODEC_NAMES[codec]
        raise BatchError(f"{name} batches cannot be checked here: cramjam is not installed") from None
    return cramjam


def decompress_bounded(data: bytes | bytearray | memoryview, codec: int, limit: int) -> bytes | memoryview:
    """The record section of a compressed batch, inflated, if it holds at most `limit` bytes:
    never more than `limit` + 1 bytes are produced, whatever the input claims (a decompression
    bomb costs its first `limit` bytes, not its size). The broker's check of produced batches,
    for every codec Kafka has (gzip streams of one or more members, snappy raw or in Java's
    xerial framing, lz4 frames, zstd frames), all in cramjam's Rust (its gzip inflates in 2/3 of
    the stdlib zlib's time: bench/compressed_validation.py). Raises
    `DecompressedTooLarge` past `limit`, `BatchError` for a stream that does not decompress
    (truncated, garbage, trailing bytes). The result may be a view of a buffer reused by the
    next call."""
    if codec == COMPRESSION_SNAPPY:
        return _unsnappy_bounded(data, limit)
    name = CODEC_NAMES.get(codec)
    if name is None or codec == COMPRESSION_NONE:
        raise BatchError(f"unknown compression codec {codec}")
    lib = getattr(_cramjam(codec), name)  # cramjam.gzip, .lz4 (frames), .zstd
    global _scratch  # noqa: PLW0603 - grown once to the largest bound asked for, then reused
    if len(_scratch) < limit + 1:
        _scratch = bytearray(limit + 1)
    out = memoryview(_scratch)[: limit + 1]
    try:
        n = lib.decompress_into(data, out)
    except Exception as exc:  # cramjam.DecompressionError: its text tells an overflow apart
        out.release()
        if _OVERFLOW in str(exc):
            raise DecompressedTooLarge(f"{name} record section inflates past {limit} bytes") from None
        raise BatchError(f"{name} record section does not decompress: {exc}") from None
    if n > limit:
        out.release()
        raise DecompressedTooLarge(f"{name} record section inflates past {limit} bytes")
    return out[:n]


def _unsnappy_bounded(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    snappy = _cramjam(COMPRESSION_SNAPPY).snappy
    blocks: list[bytes | bytearray | memoryview] = []
    view = memoryview(data)
    if bytes(view[: len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:  # Java's framing; librdkafka writes raw
        p = _XERIAL_HEADER
        while p < len(view):
            if len(view) - p < 4:
                raise BatchError("snappy (xerial) record section: a block length is cut")
            (n,) = struct.unpack_from(">i", view, p)
            if n < 0 or n > len(view) - p - 4:
                raise BatchError(f"snappy (xerial) record section: a block of {n} bytes runs past it")
            blocks.append(view[p + 4 : p + 4 + n])
            p += 4 + n
    else:
        blocks.append(view)
    parts = []
    total = 0
    try:
        for block in blocks:
            total += snappy.decompress_raw_len(block)  # the block's own header: nothing inflated
            if total > limit:
                raise DecompressedTooLarge(f"snappy record section inflates past {limit} bytes")
            parts.append(bytes(snappy.decompress_raw(block)))
    except DecompressedTooLarge:
        raise
    except Exception as exc:  # cramjam.DecompressionError
        raise BatchError(f"snappy record section does not decompress: {exc}") from None
    out = b"".join(parts)
    if len(out) != total:
        raise BatchError("snappy record section: a block inflates to other than its stated length")
    return out


# ----------------------------------------------------------------------------- headers and checks


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


def invalid_header(h: BatchHeader, available: int | None = None) -> str | None:
    """Why this header cannot start a valid batch, or None. Cheap: no checksum."""
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
    reason = unsupported_batch(h)
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


def unsupported_batch(h: BatchHeader) -> str | None:
    """Why a well-formed batch is refused anyway (INVALID_BATCH, not CORRUPT_MESSAGE): a
    transactional or control batch, until transactions exist. None for any other batch."""
    if h.attributes & TRANSACTIONAL_BIT:
        return "transactional batches are not supported (no transactions yet)"
    if h.attributes & CONTROL_BIT:
        return "control batches are written by brokers, not accepted from clients"
    return None


def batch_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """crc32c of the checked range of the batch at `pos` (no copy: crc32c reads a memoryview)."""
    return crc32c(memoryview(buf)[pos + CRC_START : pos + size])


def invalid_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> str | None:
    """Why the batch at `pos` is not valid (header, lengths, counts, crc32c), or None.

    Records are not parsed (`invalid_records` walks them). Returns a reason rather than raising so
    callers choose between an error response (produce) and a cut (recovery).
    """
    if len(buf) - pos < HEADER_SIZE:
        return f"truncated batch: {len(buf) - pos} bytes, header needs {HEADER_SIZE}"
    h = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    reason = invalid_header(h, len(buf) - pos)
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


# ----------------------------------------------------------------------------- the records walk

# What `walk_records_*` found, by code (the C twin in native/_records_build.py uses the same codes).
RECORD_ERRORS: dict[int, str] = {
    1: "the record section ends before record_count records",
    2: "a record's length varint runs past the record section or is longer than 5 bytes",
    3: "record length runs past the end of the record section",
    4: "record length is negative or shorter than the smallest record (6 bytes)",
    5: "key length is negative but not -1 (null)",
    6: "the key runs past the record's length",
    7: "value length is negative but not -1 (null)",
    8: "the value runs past the record's length",
    9: "a varint runs past the record's length or is longer than its type allows",
    10: "a header key length is negative or runs past the record's length",
    11: "a header key is not UTF-8",
    12: "a header value length is negative but not -1 (null)",
    13: "a header value runs past the record's length",
    14: "the record's fields end before its length",
    15: "bytes left after record_count records",
    16: "the record section lies outside the buffer",
    17: "a record's offset delta is not its index in the batch",
    18: "a record's header count is negative",
}
_WALK_BOUNDS = 16
_RECORD_SECTION_MAX = 1 << 31
_RECORD_BODY_MIN = RECORD_HEADER_SIZE - 1  # attributes .. header count, without the length varint


def _utf8_ok(raw: bytes | bytearray | memoryview) -> bool:
    try:
        bytes(raw).decode()
    except UnicodeDecodeError:
        return False
    return True


def _walk_varint(buf: bytes | bytearray | memoryview, p: int, end: int, bits: int) -> tuple[int, int]:
    """(value, next position) of the varint at `p` ending before `end`, else (0, -1)."""
    shift = 0
    z = 0
    while p < end:
        b = buf[p]
        p += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            z &= _MASK64 if bits == _VARLONG_BITS else _MASK32
            return (z >> 1) ^ -(z & 1), p
        shift += 7
        if shift >= bits:
            return 0, -1
    return 0, -1


def walk_records_python(buf: bytes | bytearray | memoryview, start: int, end: int, count: int) -> int:
    """Walk the framing of `count` records in `buf[start:end]`: 0 when it holds exactly those, else
    `code | record_index << 8 | byte_offset << 32` (offset from `start`; codes in RECORD_ERRORS).

    The twin of the C walk (`native._records.lib.rr_walk_records`), check for check, so the two
    can be tested against each other; this one serves when the extension is not built.
    """
    if not 0 <= start <= end <= len(buf) or end - start > _RECORD_SECTION_MAX or count < 0:
        return _WALK_BOUNDS
    v32 = _VARINT_BITS
    v64 = _VARLONG_BITS
    p = start
    i = 0
    while i < count:
        at = p - start
        if p == end:
            return 1 | i << 8 | at << 32
        rlen, q = _walk_varint(buf, p, end, v32)
        if q < 0:
            return 2 | i << 8 | at << 32
        if rlen < _RECORD_BODY_MIN:
            return 4 | i << 8 | at << 32
        if rlen > end - q:
            return 3 | i << 8 | at << 32
        rend = q + rlen
        q += 1  # attributes
        _ts, n = _walk_varint(buf, q, rend, v64)
        if n < 0:
            return 9 | i << 8 | (q - start) << 32
        delta, q2 = _walk_varint(buf, n, rend, v32)
        if q2 < 0:
            return 9 | i << 8 | (n - start) << 32
        if delta != i:
            return 17 | i << 8 | (n - start) << 32
        q = q2
        klen, n = _walk_varint(buf, q, rend, v32)
        if n < 0:
            return 9 | i << 8 | (q - start) << 32
        if klen < -1:
            return 5 | i << 8 | (q - start) << 32
        if klen > 0:
            if klen > rend - n:
                return 6 | i << 8 | (q - start) << 32
            n += klen
        q = n
        vlen, n = _walk_varint(buf, q, rend, v32)
        if n < 0:
            return 9 | i << 8 | (q - start) << 32
        if vlen < -1:
            return 7 | i << 8 | (q - start) << 32
        if vlen > 0:
            if vlen > rend - n:
                return 8 | i << 8 | (q - start) << 32
            n += vlen
        q = n
        hcount, n = _walk_varint(buf, q, rend, v32)
        if n < 0:
            return 9 | i << 8 | (q - start) << 32
        if hcount < 0:
            return 18 | i << 8 | (q - start) << 32
        q = n
        for _ in range(hcount):
            hk, n = _walk_varint(buf, q, rend, v32)
            if n < 0:
                return 9 | i << 8 | (q - start) << 32
            if hk < 0 or hk > rend - n:
                return 10 | i << 8 | (q - start) << 32
            if hk and not _utf8_ok(buf[n : n + hk]):
                return 11 | i << 8 | (q - start) << 32
            q = n + hk
            hv, n = _walk_varint(buf, q, rend, v32)
            if n < 0:
                return 9 | i << 8 | (q - start) << 32
            if hv < -1:
                return 12 | i << 8 | (q - start) << 32
            if hv > 0:
                if hv > rend - n:
                    return 13 | i << 8 | (q - start) << 32
                n += hv
            q = n
        if q != rend:
            return 14 | i << 8 | at << 32
        p = rend
        i += 1
    if p != end:
        return 15 | i << 8 | (p - start) << 32
    return 0


def _native_walk() -> Callable[[bytes | bytearray | memoryview, int, int, int], int] | None:
    """The C walk, or None when `native._records` is not built (or native/ is absent)."""
    try:
        from native._records import ffi, lib  # noqa: PLC0415 - optional, and loaded on first use
    except ImportError:
        return None
    from_buffer = ffi.from_buffer
    c_walk = lib.rr_walk_records

    def walk_records_native(buf: bytes | bytearray | memoryview, start: int, end: int, count: int) -> int:
        try:
            if type(buf) is bytes:  # passed as a pointer to its bytes: no from_buffer needed
                return c_walk(buf, len(buf), start, end, count)
            view = from_buffer(buf)
            return c_walk(view, len(view), start, end, count)
        except OverflowError:  # a negative start, end or count: outside the buffer by definition
            return _WALK_BOUNDS

    walk_records_native.for_bytes = c_walk  # type: ignore[attr-defined]  # see `bytes_walker`
    return walk_records_native


_walk: Callable[[bytes | bytearray | memoryview, int, int, int], int] | None = None


def records_walker() -> Callable[[bytes | bytearray | memoryview, int, int, int], int]:
    """The fastest walk here: C when native._records is built, else `walk_records_python`. The
    broker binds it once (broker/storage/log.py); importing native is left to the first caller."""
    global _walk  # noqa: PLW0603 - resolved once: clients that never walk never import native
    if _walk is None:
        _walk = _native_walk() or walk_records_python
    return _walk


def bytes_walker() -> Callable[[bytes, int, int, int, int], int] | None:
    """The C walk itself, for a caller that can afford no Python frame around it: call it as
    `f(buf, len(buf), start, end, count)` with `buf` a `bytes` (cffi passes a pointer to its
    contents) and start, end, count non-negative. None when the walk is Python."""
    return getattr(records_walker(), "for_bytes", None)


def walk_records(buf: bytes | bytearray | memoryview, start: int, end: int, count: int) -> int:
    """`walk_records_python`'s result, computed in C when the extension is built."""
    return records_walker()(buf, start, end, count)


def walk_implementation() -> str:
    """ "native" or "python": which walk `walk_records` uses here."""
    return "python" if records_walker() is walk_records_python else "native"


def describe_walk(result: int) -> str:
    """A message for a non-zero walk result: what is wrong, in which record, at which byte."""
    code = result & 0xFF
    index = (result >> 8) & 0xFFFFFF
    at = result >> 32
    what = RECORD_ERRORS.get(code, f"record framing error {code}")
    if code in (1, 15):  # about the section, not one record
        return f"{what} (after {index} records, byte {at} of the record section)"
    return f"record {index} (byte {at} of the record section): {what}"


def invalid_records(
    buf: bytes | bytearray | memoryview, pos: int = 0, header: BatchHeader | None = None
) -> str | None:
    """Why the records of the batch at `pos` do not frame (lengths, offset deltas, counts, header
    counts, header-key UTF-8), or None. The header must already be valid (`invalid_header`).

    Not the payload: keys, values and header values are skipped by their lengths. A compressed
    batch is not walked (None): the broker stores it as it came (module docstring).
    """
    h = read_header(buf, pos) if header is None else header
    if h.attributes & COMPRESSION_MASK:
        return None
    result = walk_records(buf, pos + HEADER_SIZE, pos + h.size, h.record_count)
    return None if result == 0 else describe_walk(result)


def invalid_compressed_records(
    buf: bytes | bytearray | memoryview, pos: int, h: BatchHeader, limit: int
) -> str | None:
    """Why the compressed batch at `pos` (header `h`, already valid) holds no `h.record_count`
    records that frame, or None: its section is inflated (at most `limit` bytes,
    `decompress_bounded`, whose errors propagate) and walked as an uncompressed one is, as
    Kafka's LogValidator decompresses and counts every compressed batch it is given."""
    with memoryview(buf) as view:
        section = view[pos + HEADER_SIZE : pos + h.size]
        try:
            data = decompress_bounded(section, h.attributes & COMPRESSION_MASK, limit)
        finally:
            section.release()
    try:
        result = walk_records(data, 0, len(data), h.record_count)
    finally:
        if isinstance(data, memoryview):
            data.release()
    if result == 0:
        return None
    return f"{CODEC_NAMES[h.attributes & COMPRESSION_MASK]}-compressed: {describe_walk(result)}"


# ----------------------------------------------------------------------------- what the broker writes


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


def stored_damage(
    buf: bytes | bytearray | memoryview, pos: int, end: int, base_offset: int
) -> tuple[int, int, str | None]:
    """Check a batch read back from storage, which must start at `base_offset`: (its size, its
    record count, None) when intact, else (0, 0, why).

    What was stored passed full validation at append time, so only damage is looked for: the
    fields outside the crc range (base offset, length, magic, the crc itself) against what must
    be there, and the crc for the rest. A raw tuple, not a BatchHeader: a read runs this once per
    batch served."""
    if end - pos < HEADER_SIZE:
        return 0, 0, "truncated batch header"
    fields = _HEADER.unpack_from(buf, pos)
    length = fields[_BATCH_LENGTH]
    size = LENGTH_PREFIX_SIZE + length
    if fields[_BASE_OFFSET_FIELD] != base_offset:
        return 0, 0, f"base offset {fields[_BASE_OFFSET_FIELD]}, index expects {base_offset}"
    if fields[_MAGIC] != MAGIC or size < HEADER_SIZE or size > end - pos:
        return 0, 0, f"bad magic {fields[_MAGIC]} or length {length}"
    if crc32c(memoryview(buf)[pos + CRC_START : pos + size]) != fields[_CRC_FIELD]:
        return 0, 0, "crc32c mismatch"
    return size, fields[_RECORD_COUNT], None


def scan_stored_python(
    buf: bytes | bytearray | memoryview, pos: int, end: int, base_offset: int
) -> tuple[int, int, str | None]:
    """`scan_stored` in Python: `stored_damage` batch after batch."""
    expected = base_offset
    while pos < end:
        size, count, reason = stored_damage(buf, pos, end, expected)
        if reason is not None:
            return pos, expected, reason
        pos += size
        expected += count
    return pos, expected, None


Scan = Callable[[bytes | bytearray | memoryview, int, int, int], tuple[int, int, str | None]]


def _field_at(name: str) -> int:
    """The byte offset of a header field, from `_HEADER`'s format."""
    return struct.calcsize(">" + _HEADER.format[1 : 1 + BatchHeader._fields.index(name)])


def _check_native_layout(lib: Any) -> None:
    """native._records' copy of the header layout and of `invalid_header`'s limits, against this
    file's (its C twins read batches by them): a build that disagrees raises, once, at load."""
    theirs = (
        lib.RR_BATCH_HEADER_SIZE, lib.RR_BATCH_CRC_START, lib.RR_BATCH_MAGIC, lib.RR_BATCH_LENGTH_AT,
        lib.RR_BATCH_MAGIC_AT, lib.RR_BATCH_CRC_AT, lib.RR_BATCH_ATTRIBUTES_AT, lib.RR_BATCH_LAST_DELTA_AT,
        lib.RR_BATCH_BASE_TS_AT, lib.RR_BATCH_MAX_TS_AT, lib.RR_BATCH_COUNT_AT, lib.RR_RECORD_COUNT_MAX,
        lib.RR_RECORD_HEADER_SIZE, lib.RR_ATTR_KNOWN, lib.RR_ATTR_COMPRESSION, lib.RR_ATTR_TRANSACTIONAL,
        lib.RR_ATTR_CONTROL, lib.RR_CODEC_MAX,
    )  # fmt: skip
    ours = (
        HEADER_SIZE, CRC_START, MAGIC, *map(_field_at, (
            "batch_length", "magic", "crc", "attributes", "last_offset_delta", "base_timestamp",
            "max_timestamp", "record_count",
        )),
        RECORD_COUNT_MAX, RECORD_HEADER_SIZE, _KNOWN_ATTRIBUTES, COMPRESSION_MASK, TRANSACTIONAL_BIT,
        CONTROL_BIT, COMPRESSION_ZSTD,
    )  # fmt: skip
    if theirs != ours:
        raise RuntimeError("native._records reads another batch header layout than ringlog_proto/batch.py")


def _native_scan() -> Scan | None:
    """The C scan (native/_records_build.py), or None when `native._records` is not built. Its
    copy of the header layout is checked against this file's here, once: a build that disagrees
    raises rather than checking batches by other offsets."""
    try:
        from native._records import ffi, lib  # noqa: PLC0415 - optional, and loaded on first use
    except ImportError:
        return None
    _check_native_layout(lib)
    from_buffer = ffi.from_buffer
    new = ffi.new
    c_scan = lib.rr_scan_stored
    truncated, wrong_base, framing, bad_crc = (
        lib.RR_SCAN_TRUNCATED,
        lib.RR_SCAN_BASE_OFFSET,
        lib.RR_SCAN_FRAMING,
        lib.RR_SCAN_CRC,
    )

    def scan_stored_native(
        buf: bytes | bytearray | memoryview, pos: int, end: int, base_offset: int
    ) -> tuple[int, int, str | None]:
        if pos < 0 or end < 0:
            raise ValueError(f"scan of [{pos}, {end}): negative bounds")
        out = new("int64_t[5]")
        code = c_scan(buf if type(buf) is bytes else from_buffer(buf), len(buf), pos, end, base_offset, out)
        if code == 0:
            return out[0], out[1], None
        if code == truncated:
            reason = "truncated batch header"
        elif code == wrong_base:
            reason = f"base offset {out[2]}, index expects {out[1]}"
        elif code == framing:
            reason = f"bad magic {out[4]} or length {out[3]}"
        elif code == bad_crc:
            reason = "crc32c mismatch"
        else:
            raise ValueError(f"scan of [{pos}, {end}) outside a buffer of {len(buf)} bytes")
        return out[0], out[1], reason

    return scan_stored_native


_scan: Scan | None = None


def scan_stored(
    buf: bytes | bytearray | memoryview, pos: int, end: int, base_offset: int
) -> tuple[int, int, str | None]:
    """Check the batches read back in `buf[pos:end]`, the first at `base_offset`, each starting at
    the offset the one before ends: (the end of the intact ones, the offset after them, why the
    scan stopped there or None when all are intact). `stored_damage` batch after batch, in one C
    call when native._records is built (a fetch serves ~16 batches per MiB: the loop's Python was
    ~120 calls per fetch)."""
    global _scan  # noqa: PLW0603 - resolved once, on the first read (clients never scan)
    if _scan is None:
        _scan = _native_scan() or scan_stored_python
    return _scan(buf, pos, end, base_offset)


def scan_implementation() -> str:
    """ "native" or "python": which scan `scan_stored` uses here."""
    scan_stored(b"", 0, 0, 0)
    return "python" if _scan is scan_stored_python else "native"


Checker = Callable[[bytes | bytearray | memoryview, int, bool], int]


def produced_checker() -> Checker | None:
    """The C check of produced batches, or None when native._records is not built.

    `check(buf, max_batch, walk)` is the end of the leading whole batches of `buf` that pass
    every check a produce makes (the header and its size limit, `invalid_header`, the crc, and
    `walk_records` when `walk` and the batch is uncompressed): `len(buf)` when all do. It says
    nothing of why one fails; the caller's own checks, from there on, find the reason (and accept
    whatever they accept: only a pass must never differ). One call where the Python checks make
    ~10 per batch (broker/storage/log.py's `validate` uses it)."""
    try:
        from native._records import ffi, lib  # noqa: PLC0415 - optional, and loaded on first use
    except ImportError:
        return None
    _check_native_layout(lib)
    from_buffer = ffi.from_buffer
    c_check = lib.rr_check_produced

    def check_produced_native(buf: bytes | bytearray | memoryview, max_batch: int, walk: bool) -> int:
        return c_check(buf if type(buf) is bytes else from_buffer(buf), len(buf), max_batch, walk)

    return check_produced_native


# ----------------------------------------------------------------------------- client decode


def iter_batches(
    buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position in `buf`, header) of each whole batch in `buf[start:end]`; stop silently at
    a partial tail.

    A fetch response may end in a partial batch (max_bytes cut it): that is normal, not an error.
    Headers are checked (not crcs); a bad header raises, because what follows it cannot be framed.
    """
    pos = start
    end = len(buf) if end is None else end
    while end - pos >= HEADER_SIZE:
        h = BatchHeader._make(_HEADER.unpack_from(buf, pos))
        reason = invalid_header(h)
        if reason is not None:
            raise BatchError(f"at byte {pos - start}: {reason}")
        if h.size > end - pos:
            return
        yield pos, h
        pos += h.size


def _decode_section(data: bytes, p: int, end: int, h: BatchHeader) -> list[Record]:
    """The records of `data[p:end]`, an uncompressed record section of the batch with header `h`.

    The hot loop of every consumer. Producers write runs of records of one shape (the same
    lengths and timestamp delta, no headers), so a record is first tried against the previous
    one's bytes: its length, attributes and timestamp delta, then its own offset delta, key and
    value length varints, each a `startswith` in C. Only a record of a new shape is parsed field
    by field (one-byte varints a table lookup, two-byte ones a branch, longer ones a call). Either
    way every record must end exactly where its length says, so a lying length raises."""
    unzz = _UNZZ
    zz = _ZZ
    table = _ZZ_TABLE_SIZE
    slow = read_varint
    startswith = data.startswith
    base_offset = h.base_offset
    base_ts = h.base_timestamp
    log_append = h.attributes & TIMESTAMP_TYPE_BIT
    out: list[Record] = []
    append = out.append
    # The previous record's shape: its bytes up to the offset delta, its key and value length
    # varints, its key and value lengths, its timestamp, its whole size. Empty: no shape yet.
    shape = b""
    shape_len = key_tpl_len = value_tpl_len = 0
    key_tpl = value_tpl = b""
    klen = vlen = 0
    size = 0
    ts = 0
    i = 0
    for i in range(h.record_count):
        if shape and startswith(shape, p):
            od = zz[i] if i < table else zigzag_varint(i)
            q = p + shape_len + len(od)
            if startswith(od, q - len(od)) and startswith(key_tpl, q):
                q += key_tpl_len
                if klen >= 0:
                    key: bytes | None = data[q : q + klen]
                    q += klen
                else:
                    key = None
                if startswith(value_tpl, q):
                    q += value_tpl_len
                    rend = p + size
                    if vlen >= 0:
                        value: bytes | None = data[q : q + vlen]
                        q += vlen
                    else:
                        value = None
                    if q + 1 == rend <= end and data[q] == 0:
                        append(Record(value, key, (), ts, base_offset + i))
                        p = rend
                        continue
        start = p
        b = data[p]
        if b < 0x80:
            rlen = unzz[b]
            p += 1
        else:
            c = data[p + 1]
            if c < 0x80:
                z = (b & 0x7F) | c << 7
                rlen = (z >> 1) ^ -(z & 1)
                p += 2
            else:
                rlen, p = slow(data, p)
        rend = p + rlen
        if rlen < _RECORD_BODY_MIN or rend > end:
            raise BatchError(f"record {i}: length {rlen} does not fit the batch")
        b = data[p + 1]  # after the attributes byte
        if b < 0x80:
            ts_delta = unzz[b]
            p += 2
        else:
            ts_delta, p = slow(data, p + 1, True)
        before_delta = p
        b = data[p]
        if b < 0x80:
            delta = unzz[b]
            p += 1
        else:
            delta, p = slow(data, p)
        if delta != i:  # what the broker's walk checks: offsets are dense in a batch
            raise BatchError(f"record {i}: offset delta {delta}")
        key_at = p
        b = data[p]
        if b < 0x80:
            klen = unzz[b]
            p += 1
        else:
            klen, p = slow(data, p)
        key_tpl = data[key_at:p]
        if klen >= 0:
            key = data[p : p + klen]
            p += klen
        elif klen == -1:
            key = None
        else:
            raise BatchError(f"record {i}: key length {klen}")
        value_at = p
        b = data[p]
        if b < 0x80:
            vlen = unzz[b]
            p += 1
        else:
            c = data[p + 1]
            if c < 0x80:
                z = (b & 0x7F) | c << 7
                vlen = (z >> 1) ^ -(z & 1)
                p += 2
            else:
                vlen, p = slow(data, p)
        value_tpl = data[value_at:p]
        if vlen >= 0:
            value = data[p : p + vlen]
            p += vlen
        elif vlen == -1:
            value = None
        else:
            raise BatchError(f"record {i}: value length {vlen}")
        if data[p] == 0:  # no headers: the common case, and a shape the next record may share
            headers: Sequence[Header] = ()  # one shared empty tuple, as the C codec's records have
            p += 1
            shape = data[start:before_delta] if p == rend else b""
        else:
            headers, p = _decode_headers(data, p, i)
            shape = b""
        if p != rend:
            raise BatchError(f"record {i}: its fields end at byte {p}, its length says {rend}")
        ts = h.max_timestamp if log_append else base_ts + ts_delta
        shape_len = len(shape)
        key_tpl_len = len(key_tpl)
        value_tpl_len = len(value_tpl)
        size = rend - start
        append(Record(value, key, headers, ts, base_offset + i))
    if p != end:
        raise BatchError(f"{end - p} bytes left after {h.record_count} records")
    return out


def _decode_headers(data: bytes, p: int, i: int) -> tuple[list[Header], int]:
    count, p = read_varint(data, p)
    if count < 0:
        raise BatchError(f"record {i}: header count {count}")
    headers: list[Header] = []
    for _ in range(count):
        hk, p = read_varint(data, p)
        if hk < 0 or p + hk > len(data):
            raise BatchError(f"record {i}: header key length {hk}")
        hkey = data[p : p + hk].decode()
        p += hk
        hv, p = read_varint(data, p)
        if hv < -1:
            raise BatchError(f"record {i}: header value length {hv}")
        if hv >= 0:
            hval: bytes | None = data[p : p + hv]
            p += hv
        else:
            hval = None
        headers.append((hkey, hval))
    return headers, p


def _section(
    buf: bytes | bytearray | memoryview, pos: int, verify: bool
) -> tuple[BatchHeader, bytes, int, int]:
    """(header, bytes holding the records section, its start, its end) of the batch at `pos`,
    crc checked when `verify`, decompressed when compressed, copied when `buf` is not bytes."""
    if verify:
        reason = invalid_batch(buf, pos)
        if reason is not None:
            raise BatchError(reason)
    h = read_header(buf, pos)
    codec = h.attributes & COMPRESSION_MASK
    if codec:
        data = decompress(memoryview(buf)[pos + HEADER_SIZE : pos + h.size], codec)
        return h, data, 0, len(data)
    if isinstance(buf, bytes):
        return h, buf, pos + HEADER_SIZE, pos + h.size
    data = bytes(buf[pos + HEADER_SIZE : pos + h.size])  # slices of bytes are what records hold
    return h, data, 0, len(data)


def _native_section(h: BatchHeader, data: bytes, p: int, end: int) -> bool:
    """Whether the C codec decodes this section (after the C walk said yes). LogAppendTime
    batches, whose records all take the batch's max timestamp, are rare enough for the Python
    path. The C decode keeps offset gaps, as Kafka's decoders do for compacted logs; ours fails
    exactly where the broker's walk refuses, so the walk (C too, ~15 ns a record) says no first."""
    if records_codec.current_codec() is records_codec.PYTHON or h.attributes & TIMESTAMP_TYPE_BIT:
        return False
    result = walk_records(data, p, end, h.record_count)
    if result:
        raise BatchError(describe_walk(result))
    return True


def _decode_python(data: bytes, p: int, end: int, h: BatchHeader) -> list[Record]:
    try:
        return _decode_section(data, p, end, h)
    except IndexError:
        raise BatchError("record section truncated") from None
    except UnicodeDecodeError as exc:
        raise BatchError(f"header key is not UTF-8: {exc}") from None


def decode_records(buf: bytes | bytearray | memoryview, pos: int = 0, verify: bool = True) -> list[Record]:
    """Decode every record of the batch at `pos`, with absolute offsets and timestamps.

    `verify` checks the crc first: a client must never hand corrupted bytes to an application.
    A compressed batch is decompressed first (gzip; other codecs raise a BatchError naming them).
    """
    h, data, p, end = _section(buf, pos, verify)
    if _native_section(h, data, p, end):
        return records_codec.decode_section(data, p, end, h.record_count, h.base_offset, h.base_timestamp)
    return _decode_python(data, p, end, h)


def decode_rows(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    verify: bool = True,
    prefix: tuple = (),
    cls: type[tuple] = tuple,
) -> list[tuple]:
    """`decode_records`, each record a `cls` tuple `prefix + (offset, timestamp, key, value,
    headers)`: what a consumer hands out, built with no `Record` and, on the C path, no Python
    code per record (see `records_codec.rows`). Same checks, same errors."""
    h, data, p, end = _section(buf, pos, verify)
    if _native_section(h, data, p, end):
        return records_codec.decode_rows(
            data, p, end, h.record_count, h.base_offset, h.base_timestamp, prefix, cls
        )
    new = tuple.__new__
    return [
        new(cls, (*prefix, r.offset, r.timestamp, r.key, r.value, r.headers))
        for r in _decode_python(data, p, end, h)
    ]


def decode_batches(buf: bytes | bytearray | memoryview, verify: bool = True) -> list[Record]:
    """All records of all whole batches in `buf` (a fetch response's record set)."""
    out: list[Record] = []
    for pos, _h in iter_batches(buf):
        out.extend(decode_records(buf, pos, verify))
    return out
