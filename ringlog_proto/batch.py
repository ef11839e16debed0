"""Record batches: the unit of storage and of the wire.

Rules this module keeps:
- No I/O. Bytes in, bytes out; the broker, the clients and the Spark source all use this one codec.
- The broker never decodes records. It reads the fixed header, checks length, crc32c and counts with
  `invalid_batch()`, walks the record framing with `invalid_records()` (lengths, counts, header
  counts; never the payload), writes the base offset into the header with `set_base_offset()` (or
  beside it, `rebased()`), and stores the bytes as they came; reading them back, it checks them
  with `stored_damage()`. The crc does not cover the base offset, so assigning it costs 8 bytes,
  not a checksum over the batch. The walk is what keeps a batch no client can decode (a "poison"
  batch with a valid crc) out of the log.
- No module outside ringlog_proto reads or writes batch bytes at an offset: they use the named
  fields of `BatchHeader` and the helpers here, so a format change is made in this file (and in
  the C twin of the records walk, native/_records_build.py).
- The walk runs in C (`native._records`, a small cffi extension) when it is built, and in Python
  (`walk_records_python`, its exact twin) when it is not: ringlog_proto needs nothing of native/,
  and clients never walk (they decode, which checks the same things).
- Records are encoded and decoded only by clients, so that code is the client's hot path: fixed-width
  lengths (one `struct` call per record) rather than varints, which cost a Python loop per byte.

Fileformat (version 1, all integers big-endian, 61-byte header):

    offset size field               meaning
    0      8    base_offset   i64   offset of the first record; written by the broker, 0 from clients
    8      4    batch_length  i32   bytes after this field (the whole batch is 12 + batch_length)
    12     1    magic         u8    format version, 1
    13     4    crc           u32   crc32c (Castagnoli) of bytes [17, 12 + batch_length)
    17     2    attributes    i16   bit 0-2 compression (0 = none; others rejected for now), rest zero
    19     4    last_offset_delta i32  record_count - 1
    23     8    first_timestamp i64  ms since the epoch, of the first record
    31     8    max_timestamp   i64  ms since the epoch, largest record timestamp in the batch
    39     8    producer_id     i64  -1 when the producer is not idempotent
    47     2    producer_epoch  i16  -1 when not idempotent
    49     4    base_sequence   i32  sequence of the first record, -1 when not idempotent
    53     4    record_count    i32  number of records, >= 1
    57     4    records_length  i32  bytes of the record section that follows (= batch_length - 49)
    61     ...  records

Each record (offset deltas are implicit: the i-th record has offset base_offset + i):

    size field
    4    record_length   u32  bytes after this field
    4    timestamp_delta i32  ms relative to first_timestamp
    4    key_length      i32  -1 for a null key
    4    value_length    i32  -1 for a null value
    2    header_count    u16
    ...  key bytes, then value bytes
    then header_count times:
      2  header_key_length   u16, then the key as UTF-8
      4  header_value_length i32 (-1 for null), then the value bytes

Every record's fields end exactly at its record_length, exactly record_count records fill
records_length, lengths are >= -1, header keys are UTF-8: a batch that breaks any of these is
refused at produce (INVALID_BATCH) and fails `decode_records`.

`records_length` is redundant with `batch_length`; keeping both lets `invalid_batch` catch a header
whose length field was damaged in a way the crc range would otherwise follow.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from crc32c import crc32c

MAGIC = 1
HEADER_SIZE = 61
LENGTH_PREFIX_SIZE = 12  # base_offset + batch_length: the part of the header outside batch_length
CRC_START = 17  # the crc covers everything from here to the end of the batch
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
COMPRESSION_MASK = 0x07

# The smallest possible record: the 18-byte record header with null key and value, no headers.
RECORD_HEADER_SIZE = 18
RECORD_COUNT_MAX = 1 << 20  # a batch of 1 MiB empty records; more is a malformed count, not data

_HEADER = struct.Struct(">qiBIhiqqqhiii")
unpack_header = _HEADER.unpack_from  # the raw 13-tuple, for loops that cannot afford a BatchHeader
_LENGTHS = struct.Struct(">qi")
_BASE_OFFSET = struct.Struct(">q")
_CRC = struct.Struct(">I")
_RECORD = struct.Struct(">IiiiH")
_HKEY = struct.Struct(">H")
_HVAL = struct.Struct(">i")
_ABSENT = -1

assert _HEADER.size == HEADER_SIZE
assert _RECORD.size == RECORD_HEADER_SIZE

Header = tuple[str, bytes | None]


class BatchError(ValueError):
    """A batch that cannot be decoded; the message says which field and why."""


class BatchHeader(NamedTuple):
    """The fixed 61-byte header, which is all the broker ever reads of a batch.

    A NamedTuple, not a dataclass: the broker builds one per batch on its hot path, and a tuple is
    several times cheaper to construct.
    """

    base_offset: int
    batch_length: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    records_length: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch on disk and on the wire."""
        return LENGTH_PREFIX_SIZE + self.batch_length

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

    def with_base_offset(self, base_offset: int) -> BatchHeader:
        """This header as stored at `base_offset` (what the broker's append assigns)."""
        return BatchHeader._make((base_offset, *self[1:]))  # _replace is several times slower


# Positions in the raw tuple of `unpack_header`, for the loops here that cannot afford a BatchHeader.
_BASE_OFFSET_FIELD, _BATCH_LENGTH, _MAGIC, _CRC_FIELD, _RECORD_COUNT = (
    BatchHeader._fields.index(name)
    for name in ("base_offset", "batch_length", "magic", "crc", "record_count")
)


class Record:
    """One record as a client sees it. Plain slots class: cheaper to build than a dataclass."""

    __slots__ = ("headers", "key", "offset", "timestamp", "value")

    def __init__(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
        timestamp: int | None = None,
        offset: int = -1,
    ) -> None:
        self.value = value
        self.key = key
        self.headers = headers
        self.timestamp = timestamp
        self.offset = offset

    def __repr__(self) -> str:
        return (
            f"Record(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
            f"value={self.value!r}, headers={self.headers!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (self.offset, self.timestamp, self.key, self.value, tuple(self.headers)) == (
            other.offset,
            other.timestamp,
            other.key,
            other.value,
            tuple(other.headers),
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _encode_headers(headers: Sequence[Header]) -> bytes:
    parts = []
    for hkey, hval in headers:
        kb = hkey.encode()
        parts.append(_HKEY.pack(len(kb)))
        parts.append(kb)
        if hval is None:
            parts.append(_HVAL.pack(_ABSENT))
        else:
            parts.append(_HVAL.pack(len(hval)))
            parts.append(hval)
    return b"".join(parts)


def encode_batch(
    records: Iterable[Record | bytes],
    *,
    timestamp: int | None = None,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    base_offset: int = 0,
) -> bytes:
    """Encode records into one batch.

    A plain `bytes` item is a value with no key, headers or timestamp: the common producer case
    gets a fast path with one `struct.pack` per record. Records without a timestamp take
    `timestamp` (default: now), so a batch built in one call shares one clock reading.
    """
    pack = _RECORD.pack
    default_ts = now_ms() if timestamp is None else timestamp
    first_ts: int | None = None
    max_ts = -(1 << 63)
    parts: list[bytes] = []
    append = parts.append
    count = 0
    try:
        for rec in records:
            if type(rec) is bytes:
                if first_ts is None:
                    first_ts = default_ts
                if default_ts > max_ts:
                    max_ts = default_ts
                ts_delta = default_ts - first_ts
                n = len(rec)
                append(pack(14 + n, ts_delta, _ABSENT, n, 0))
                append(rec)
                count += 1
                continue
            ts = default_ts if rec.timestamp is None else rec.timestamp
            if first_ts is None:
                first_ts = ts
            if ts > max_ts:
                max_ts = ts
            key = rec.key
            value = rec.value
            klen = _ABSENT if key is None else len(key)
            vlen = _ABSENT if value is None else len(value)
            hdrs = rec.headers
            hbytes = _encode_headers(hdrs) if hdrs else b""
            body = 14 + (klen if klen > 0 else 0) + (vlen if vlen > 0 else 0) + len(hbytes)
            append(pack(body, ts - first_ts, klen, vlen, len(hdrs)))
            if key:
                append(key)
            if value:
                append(value)
            if hbytes:
                append(hbytes)
            count += 1
    except struct.error as exc:
        raise BatchError(f"record {count} cannot be encoded: {exc}") from None
    if count == 0:
        raise BatchError("a batch needs at least one record")
    if count > RECORD_COUNT_MAX:
        raise BatchError(f"{count} records in one batch; at most {RECORD_COUNT_MAX}")
    assert first_ts is not None
    return seal_batch(
        b"".join(parts),
        count,
        first_ts,
        max_ts,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
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
) -> bytes:
    """The batch header (lengths, crc32c) around an encoded records `section` of `count` records.

    Trusts `section`: `encode_batch` is the way to make a valid batch; tests use this alone to
    wrap record framing that does not parse in a header whose lengths and crc are right."""
    tail = struct.pack(
        ">hiqqqhiii",
        0,
        count - 1,
        first_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
        len(section),
    )
    crc = crc32c(section, crc32c(tail))
    batch_length = 1 + 4 + len(tail) + len(section)
    return b"".join(
        (_LENGTHS.pack(base_offset, batch_length), bytes((MAGIC,)), _CRC.pack(crc), tail, section)
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


def invalid_header(h: BatchHeader, available: int | None = None) -> str | None:
    """Why this header cannot start a valid batch, or None. Cheap: no checksum."""
    if h.magic != MAGIC:
        return f"unknown batch magic {h.magic} (expected {MAGIC})"
    if h.batch_length < HEADER_SIZE - LENGTH_PREFIX_SIZE:
        return f"batch_length {h.batch_length} shorter than the header"
    if h.records_length != h.batch_length - (HEADER_SIZE - LENGTH_PREFIX_SIZE):
        return f"records_length {h.records_length} disagrees with batch_length {h.batch_length}"
    if available is not None and h.size > available:
        return f"batch of {h.size} bytes but only {available} bytes present"
    if not 1 <= h.record_count <= RECORD_COUNT_MAX:
        return f"record_count {h.record_count} out of range 1..{RECORD_COUNT_MAX}"
    if h.last_offset_delta != h.record_count - 1:
        return f"last_offset_delta {h.last_offset_delta} != record_count - 1 ({h.record_count - 1})"
    if h.records_length < h.record_count * RECORD_HEADER_SIZE:
        return f"{h.record_count} records cannot fit in {h.records_length} bytes"
    if h.attributes & ~COMPRESSION_MASK:
        return f"unknown attribute bits {h.attributes:#x}"
    if h.attributes & COMPRESSION_MASK:
        return f"compression codec {h.attributes & COMPRESSION_MASK} is not supported"
    if h.base_offset < 0:
        return f"negative base_offset {h.base_offset}"
    if h.max_timestamp < h.first_timestamp:
        return f"max_timestamp {h.max_timestamp} before first_timestamp {h.first_timestamp}"
    return None


def batch_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """crc32c of the checked range of the batch at `pos` (no copy: crc32c reads a memoryview)."""
    return crc32c(memoryview(buf)[pos + CRC_START : pos + size])


def invalid_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> str | None:
    """Why the batch at `pos` is not valid (header, lengths, counts, crc32c), or None.

    This is the broker's whole validation: records are not parsed. Returns a reason rather than
    raising so callers choose between an error response (produce) and a cut (recovery).
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


# What `walk_records_*` found, by code (the C twin in native/_records_build.py uses the same codes).
RECORD_ERRORS: dict[int, str] = {
    1: "the record section ends before record_count records",
    2: "the record section ends inside a record header",
    3: "record_length runs past the end of the record section",
    4: "record_length is shorter than the record header",
    5: "key_length is negative but not -1 (null)",
    6: "the key runs past record_length",
    7: "value_length is negative but not -1 (null)",
    8: "the value runs past record_length",
    9: "a header length field runs past record_length",
    10: "a header key runs past record_length",
    11: "a header key is not UTF-8",
    12: "a header value length is negative but not -1 (null)",
    13: "a header value runs past record_length",
    14: "the record's fields end before record_length",
    15: "bytes left after record_count records",
    16: "the record section lies outside the buffer",
}
_WALK_BOUNDS = 16
_RECORD_SECTION_MAX = 1 << 31


def _utf8_ok(raw: bytes | bytearray | memoryview) -> bool:
    try:
        bytes(raw).decode()
    except UnicodeDecodeError:
        return False
    return True


def walk_records_python(buf: bytes | bytearray | memoryview, start: int, end: int, count: int) -> int:
    """Walk the framing of `count` records in `buf[start:end]`: 0 when it holds exactly those, else
    `code | record_index << 8 | byte_offset << 32` (offset from `start`; codes in RECORD_ERRORS).

    The twin of the C walk (`native._records.lib.rr_walk_records`), check for check, so the two
    can be tested against each other; this one serves when the extension is not built.
    """
    if not 0 <= start <= end <= len(buf) or end - start > _RECORD_SECTION_MAX:
        return _WALK_BOUNDS
    unpack = _RECORD.unpack_from
    length = end - start
    p = 0
    i = 0
    while i < count:
        if p == length:
            return 1 | i << 8 | p << 32
        if length - p < RECORD_HEADER_SIZE:
            return 2 | i << 8 | p << 32
        rlen, _ts, klen, vlen, hcount = unpack(buf, start + p)
        if rlen > length - p - 4:
            return 3 | i << 8 | p << 32
        if rlen < RECORD_HEADER_SIZE - 4:
            return 4 | i << 8 | p << 32
        rend = p + 4 + rlen
        q = p + RECORD_HEADER_SIZE
        if klen < -1:
            return 5 | i << 8 | (p + 8) << 32
        if klen > 0:
            if klen > rend - q:
                return 6 | i << 8 | (p + 8) << 32
            q += klen
        if vlen < -1:
            return 7 | i << 8 | (p + 12) << 32
        if vlen > 0:
            if vlen > rend - q:
                return 8 | i << 8 | (p + 12) << 32
            q += vlen
        for _ in range(hcount):
            if rend - q < 2:
                return 9 | i << 8 | q << 32
            (hk,) = _HKEY.unpack_from(buf, start + q)
            if hk > rend - q - 2:
                return 10 | i << 8 | q << 32
            if hk and not _utf8_ok(buf[start + q + 2 : start + q + 2 + hk]):
                return 11 | i << 8 | q << 32
            q += 2 + hk
            if rend - q < 4:
                return 9 | i << 8 | q << 32
            (hv,) = _HVAL.unpack_from(buf, start + q)
            if hv < -1:
                return 12 | i << 8 | q << 32
            q += 4
            if hv > 0:
                if hv > rend - q:
                    return 13 | i << 8 | (q - 4) << 32
                q += hv
        if q != rend:
            return 14 | i << 8 | p << 32
        p = rend
        i += 1
    if p != length:
        return 15 | i << 8 | p << 32
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
    """Why the records of the batch at `pos` do not frame (lengths, counts, header counts,
    header-key UTF-8), or None. The header must already be valid (`invalid_header`).

    Not the payload: keys, values and header values are skipped by their lengths.
    """
    h = read_header(buf, pos) if header is None else header
    result = walk_records(buf, pos + HEADER_SIZE, pos + h.size, h.record_count)
    return None if result == 0 else describe_walk(result)


def set_base_offset(buf: bytearray | memoryview, base_offset: int, pos: int = 0) -> None:
    """Write the broker-assigned base offset. Outside the crc range, so the crc stays valid."""
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


def rebased(
    view: memoryview, header: BatchHeader, base_offset: int, pos: int = 0
) -> tuple[bytes, memoryview, BatchHeader]:
    """The batch at `pos` of `view` (its header: `header`) as it is stored at `base_offset`: two
    buffers for one vectored write, the base offset and a view of the rest of the batch, and the
    header as stored. The caller's bytes are neither copied nor changed (`set_base_offset`
    changes them in place). One call for all three: the broker runs it once per batch produced."""
    return (
        _BASE_OFFSET.pack(base_offset),
        view[pos + _BASE_OFFSET.size : pos + LENGTH_PREFIX_SIZE + header.batch_length],
        BatchHeader._make((base_offset, *header[1:])),
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


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each whole batch in `buf`; stop silently at a partial tail.

    A fetch response may end in a partial batch (max_bytes cut it): that is normal, not an error.
    Headers are checked (not crcs); a bad header raises, because what follows it cannot be framed.
    """
    pos = 0
    end = len(buf)
    while end - pos >= HEADER_SIZE:
        h = BatchHeader._make(_HEADER.unpack_from(buf, pos))
        reason = invalid_header(h)
        if reason is not None:
            raise BatchError(f"at byte {pos}: {reason}")
        if h.size > end - pos:
            return
        yield pos, h
        pos += h.size


def decode_records(buf: bytes | bytearray | memoryview, pos: int = 0, verify: bool = True) -> list[Record]:
    """Decode every record of the batch at `pos`, with absolute offsets and timestamps.

    `verify` checks the crc first: a client must never hand corrupted bytes to an application.
    """
    if verify:
        reason = invalid_batch(buf, pos)
        if reason is not None:
            raise BatchError(reason)
    h = read_header(buf, pos)
    if isinstance(buf, bytes):
        data = buf
    else:  # slices of bytes are what records hold, so copy this batch once
        data = bytes(buf[pos : pos + h.size])
        pos = 0
    end = pos + h.size
    p = pos + HEADER_SIZE
    unpack = _RECORD.unpack_from
    out: list[Record] = []
    append = out.append
    offset = h.base_offset
    first_ts = h.first_timestamp
    try:
        for _ in range(h.record_count):
            rlen, ts_delta, klen, vlen, hcount = unpack(data, p)
            rend = p + 4 + rlen
            if rend > end:
                raise BatchError(f"record at byte {p - pos} runs past the end of the batch")
            if klen < -1 or vlen < -1:
                raise BatchError(f"record {offset - h.base_offset}: negative length {min(klen, vlen)}")
            p += RECORD_HEADER_SIZE
            if klen >= 0:
                key = data[p : p + klen]
                p += klen
            else:
                key = None
            if vlen >= 0:
                value = data[p : p + vlen]
                p += vlen
            else:
                value = None
            headers: list[Header] = []
            if hcount:
                for _ in range(hcount):
                    (hk,) = _HKEY.unpack_from(data, p)
                    p += 2
                    hkey = data[p : p + hk].decode()
                    p += hk
                    (hv,) = _HVAL.unpack_from(data, p)
                    p += 4
                    if hv < -1:
                        raise BatchError(f"record {offset - h.base_offset}: header value length {hv}")
                    if hv >= 0:
                        hval: bytes | None = data[p : p + hv]
                        p += hv
                    else:
                        hval = None
                    headers.append((hkey, hval))
            if p != rend:
                raise BatchError(f"record {offset - h.base_offset}: length field says {rlen}")
            append(Record(value, key, headers, first_ts + ts_delta, offset))
            offset += 1
    except struct.error as exc:
        raise BatchError(f"record section truncated: {exc}") from None
    except UnicodeDecodeError as exc:
        raise BatchError(f"header key is not UTF-8: {exc}") from None
    if p != end:
        raise BatchError(f"{end - p} bytes left after {h.record_count} records")
    return out


def decode_batches(buf: bytes | bytearray | memoryview, verify: bool = True) -> list[Record]:
    """All records of all whole batches in `buf` (a fetch response's record set)."""
    out: list[Record] = []
    for pos, _h in iter_batches(buf):
        out.extend(decode_records(buf, pos, verify))
    return out
