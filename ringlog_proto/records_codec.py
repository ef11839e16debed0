"""The records section of a Kafka RecordBatch v2 (the bytes after its 61-byte header): encode and
decode, in C when `native._codec` is built, else in pure Python.

Rules this module keeps:
- No I/O, and nothing of the batch header: the caller (ringlog_proto.batch) frames the section,
  computes the crc32c and decides which batches to decode. This module owns the record bytes.
- Two codecs, exact twins: `native._codec` (native/_codec_build.py) and the Python functions here,
  `PYTHON`. Both go through the same gather (records -> blobs and length arrays) and the same
  build (field positions -> Records), so what differs is only the part that touches bytes, and
  the tests hold that part to identical bytes out, identical fields and identical error codes.
  The C codec is loaded on first use and is optional: without it, `PYTHON` runs.
- The hot cases cost no Python loop per record of their own: a list of plain values is gathered
  with `b"".join` and `map(len, ...)`; null keys, absent timestamps and absent headers are
  detected with one C-speed scan and passed as NULL (no array at all). Headers, which are rare,
  take a Python loop only over records that have them.
- Decode trusts nothing (every varint and length is checked against its record before use).
  Records hold `bytes` slices of the buffer (a buffer that is not `bytes` is copied once first):
  at 1 KiB values, that slice and `Record(...)` are most of a decode's cost, so the build does
  nothing else per record in the common shapes.

Record layout (Kafka's; every "varint" is a zigzag varint, int32 or, for the timestamp, int64):

    length varint (bytes after it) | attributes i8 (0) | timestampDelta varlong |
    offsetDelta varint | keyLength varint (-1 null) | key | valueLength varint (-1 null) | value |
    headerCount varint | headerCount x (keyLength varint | key (UTF-8) | valueLength varint | value)
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import add
from typing import Any, NamedTuple

from ringlog_proto.record import BatchError, Record
from ringlog_proto.varint import zigzag_varint

# One record's fixed overhead at most: 5 (length) + 1 (attributes) + 10 (timestamp delta)
# + 5 (offset delta) + 5 (key length) + 5 (value length) + 5 (header count); a header's: 5 + 5.
RECORD_OVERHEAD_MAX = 36
HEADER_OVERHEAD_MAX = 10
# The smallest record: a 1-byte length, then attributes and six 1-byte varints.
RECORD_SIZE_MIN = 7
FIELDS = 8  # int64s per record in a decode's field array
_NO_FIELDS = array("q")  # a failed decode's fields (never written to)
SECTION_MAX = 1 << 31
_INT32_MAX = (1 << 31) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

# Codes of a failed encode (`rc_encode` returns minus code | index << 8).
ENCODE_ERRORS: dict[int, str] = {
    1: "the output buffer is too small",
    2: "a length is out of range (-1 .. 2**31 - 1)",
    3: "the lengths disagree with the joined bytes",
    4: "a timestamp delta does not fit in 64 bits",
    5: "a record is larger than 2**31 - 1 bytes",
}
_ENC_LENGTH_INVALID, _ENC_BLOB_MISMATCH, _ENC_TIMESTAMP_RANGE, _ENC_RECORD_TOO_BIG = 2, 3, 4, 5

# Codes of a failed decode (result `code | record_index << 8 | byte_offset << 32`, offset from start).
DECODE_ERRORS: dict[int, str] = {
    1: "the records section ends before record_count records",
    2: "the records section ends inside a record's length",
    3: "a varint is longer than its type allows",
    4: "a record's length is negative",
    5: "a record runs past the end of the records section",
    6: "a field runs past the end of its record",
    7: "keyLength is negative but not -1 (null)",
    8: "the key runs past the end of its record",
    9: "valueLength is negative but not -1 (null)",
    10: "the value runs past the end of its record",
    11: "the header count is negative",
    12: "a header keyLength is negative",
    13: "a header key runs past the end of its record",
    14: "a header key is not UTF-8",
    15: "a header valueLength is negative but not -1 (null)",
    16: "a header value runs past the end of its record",
    17: "the record's fields end before its length",
    18: "bytes left after record_count records",
    19: "the records section lies outside the buffer",
}
(
    _TOO_FEW_RECORDS,
    _LENGTH_TRUNCATED,
    _VARINT_TOO_LONG,
    _LENGTH_NEGATIVE,
    _RECORD_PAST_END,
    _FIELD_PAST_RECORD,
    _KEY_LENGTH_INVALID,
    _KEY_PAST_RECORD,
    _VALUE_LENGTH_INVALID,
    _VALUE_PAST_RECORD,
    _HEADER_COUNT_NEGATIVE,
    _HEADER_KEY_LENGTH_INVALID,
    _HEADER_KEY_PAST_RECORD,
    _HEADER_KEY_NOT_UTF8,
    _HEADER_VALUE_LENGTH_INVALID,
    _HEADER_VALUE_PAST_RECORD,
    _RECORD_LENGTH_MISMATCH,
    _TRAILING_BYTES,
    _BOUNDS,
) = range(1, 20)


class SectionError(BatchError):
    """A records section that cannot be encoded or decoded; `code` is a key of ENCODE_ERRORS or
    DECODE_ERRORS (by `encoding`), `index` the record, `at` the byte offset in the section (decode)."""

    def __init__(self, encoding: bool, code: int, index: int, at: int = 0) -> None:
        self.encoding = encoding
        self.code = code
        self.index = index
        self.at = at
        if encoding:
            message = f"record {index} cannot be encoded: {ENCODE_ERRORS.get(code, code)}"
        elif code in (_TOO_FEW_RECORDS, _TRAILING_BYTES, _BOUNDS):  # about the section
            message = f"{DECODE_ERRORS[code]} (after {index} records, byte {at} of the section)"
        else:
            message = f"record {index} (byte {at} of the section): {DECODE_ERRORS.get(code, code)}"
        super().__init__(message)

    @classmethod
    def from_decode(cls, result: int) -> SectionError:
        """The error a non-zero decode result stands for."""
        return cls(False, result & 0xFF, (result >> 8) & 0xFFFFFF, result >> 32)


class Gathered(NamedTuple):
    """Records as C takes them: keys and values each joined into one blob, their lengths in int64
    arrays (-1 for null), header keys and values likewise. None stands for "all null" (keys),
    "all at the base timestamp" (timestamps) and "no headers" (header counts)."""

    record_count: int
    kblob: bytes
    klens: array[int] | None
    vblob: bytes
    vlens: array[int] | None
    timestamps: array[int] | None
    base_timestamp: int
    hcounts: array[int] | None
    hblob: bytes
    hlens: array[int] | None  # key length, value length per header
    max_timestamp: int

    def capacity(self) -> int:
        """Bytes enough for the encoded section, whatever the varints' sizes."""
        nh = 0 if self.hlens is None else len(self.hlens) // 2
        return (
            len(self.kblob)
            + len(self.vblob)
            + len(self.hblob)
            + self.record_count * RECORD_OVERHEAD_MAX
            + nh * HEADER_OVERHEAD_MAX
        )


def _lengths(items: list[Any]) -> tuple[array[int] | None, bytes]:
    """Lengths (-1 for None; None when all are None) and the join of the non-null items, at C
    speed when none or all are null."""
    try:
        return array("q", map(len, items)), b"".join(items)
    except TypeError:  # some are None
        pass
    if items.count(None) == len(items):
        return None, b""
    return array("q", [-1 if x is None else len(x) for x in items]), b"".join(filter(None, items))


def gather(records: Iterable[Record | bytes], base_timestamp: int) -> Gathered:
    """What `encode_section` hands a codec. A plain bytes-like item is a value with no key,
    headers or timestamp (the producer's common case, gathered with no Python loop at all)."""
    if not _INT64_MIN <= base_timestamp <= _INT64_MAX:
        raise SectionError(True, _ENC_TIMESTAMP_RANGE, 0)
    # Tried as all plain values, then as all Records: what they are not raises.
    recs: list[Any] = records if type(records) is list else list(records)
    n = len(recs)
    try:
        vblob = b"".join(recs)
    except TypeError:
        pass
    else:
        return Gathered(
            n,
            b"",
            None,
            vblob,
            array("q", map(len, recs)),
            None,
            base_timestamp,
            None,
            b"",
            None,
            base_timestamp,
        )
    try:
        values = [r.value for r in recs]
    except AttributeError:  # plain values among Records
        recs = [r if isinstance(r, Record) else Record(r) for r in recs]
        values = [r.value for r in recs]
    vlens, vblob = _lengths(values)
    klens, kblob = _lengths([r.key for r in recs])
    stamps = [r.timestamp for r in recs]
    try:
        timestamps: array[int] | None = array("q", stamps)
    except TypeError:  # some are None: they take the base timestamp
        if stamps.count(None) == n:
            timestamps = None
        else:
            timestamps = _timestamps([base_timestamp if t is None else t for t in stamps])
    except OverflowError:  # some do not fit (their index is what the error names)
        timestamps = _timestamps([base_timestamp if t is None else t for t in stamps])
    max_ts = base_timestamp if timestamps is None else max(timestamps, default=base_timestamp)
    headers = [r.headers for r in recs]
    if not any(headers):
        return Gathered(n, kblob, klens, vblob, vlens, timestamps, base_timestamp, None, b"", None, max_ts)
    hcounts = array("q", map(len, headers))
    hparts: list[bytes] = []
    hlens = array("q")
    for hs in headers:
        for hkey, hval in hs:
            kb = hkey.encode()
            hparts.append(kb)
            hlens.append(len(kb))
            if hval is None:
                hlens.append(-1)
            else:
                hparts.append(hval)
                hlens.append(len(hval))
    return Gathered(
        n, kblob, klens, vblob, vlens, timestamps, base_timestamp, hcounts, b"".join(hparts), hlens, max_ts
    )


def _timestamps(stamps: list[int]) -> array[int]:
    """`stamps` as int64s, or the error naming the first that does not fit."""
    try:
        return array("q", stamps)
    except OverflowError:
        index = next(i for i, t in enumerate(stamps) if not _INT64_MIN <= t <= _INT64_MAX)
        raise SectionError(True, _ENC_TIMESTAMP_RANGE, index) from None


# ---- the Python codec ----

_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(v: int) -> bytes:
    """Zigzag varint of `v` (an int64): one byte from a table, else `zigzag_varint`."""
    u = (v << 1) ^ (v >> 63)
    return _SMALL[u] if 0 <= u < 0x80 else zigzag_varint(v)


def encode_python(g: Gathered, prefix: int = 0) -> bytearray:
    """`prefix` zero bytes, then the section of `g`: the twin of `rc_encode`, check for check."""
    parts: list[bytes] = [bytes(prefix)]
    append = parts.append
    kblob, klens, vblob, vlens = g.kblob, g.klens, g.vblob, g.vlens
    timestamps, base_ts, hcounts, hblob, hlens = g.timestamps, g.base_timestamp, g.hcounts, g.hblob, g.hlens
    nh = 0 if hlens is None else len(hlens) // 2
    kp = vp = hp = hi = 0
    for i in range(g.record_count):
        klen = -1 if klens is None else klens[i]
        vlen = -1 if vlens is None else vlens[i]
        if not -1 <= klen <= _INT32_MAX or not -1 <= vlen <= _INT32_MAX:
            raise SectionError(True, _ENC_LENGTH_INVALID, i)
        kbytes = klen if klen > 0 else 0
        vbytes = vlen if vlen > 0 else 0
        if kbytes > len(kblob) - kp or vbytes > len(vblob) - vp:
            raise SectionError(True, _ENC_BLOB_MISMATCH, i)
        delta = 0
        if timestamps is not None:
            delta = timestamps[i] - base_ts
            if not _INT64_MIN <= delta <= _INT64_MAX:
                raise SectionError(True, _ENC_TIMESTAMP_RANGE, i)
        hc = 0 if hcounts is None else hcounts[i]
        if hc < 0 or hc > nh - hi:
            raise SectionError(True, _ENC_BLOB_MISMATCH, i)
        body = [b"\0", _varint(delta), _varint(i), _varint(klen), kblob[kp : kp + kbytes]]
        kp += kbytes
        body += (_varint(vlen), vblob[vp : vp + vbytes], _varint(hc))
        vp += vbytes
        if hc:
            assert hlens is not None
            hbytes = 0
            for h in range(hi, hi + hc):
                hk, hv = hlens[2 * h], hlens[2 * h + 1]
                if not 0 <= hk <= _INT32_MAX or not -1 <= hv <= _INT32_MAX:
                    raise SectionError(True, _ENC_LENGTH_INVALID, i)
                hbytes += hk + (hv if hv > 0 else 0)
            if hbytes > len(hblob) - hp:
                raise SectionError(True, _ENC_BLOB_MISMATCH, i)
            for h in range(hi, hi + hc):
                hk, hv = hlens[2 * h], hlens[2 * h + 1]
                body += (_varint(hk), hblob[hp : hp + hk], _varint(hv))
                hp += hk
                if hv > 0:
                    body.append(hblob[hp : hp + hv])
                    hp += hv
            hi += hc
        joined = b"".join(body)
        if len(joined) > _INT32_MAX:
            raise SectionError(True, _ENC_RECORD_TOO_BIG, i)
        append(_varint(len(joined)))
        append(joined)
    if kp != len(kblob) or vp != len(vblob) or hp != len(hblob) or hi != nh:
        raise SectionError(True, _ENC_BLOB_MISMATCH, g.record_count)
    out = bytearray()
    out += b"".join(parts)
    return out


def _get(buf: bytes, q: int, lim: int, maxb: int) -> tuple[int, int, int]:
    """(error code or 0, value, position after) of the zigzag varint at `q`, before `lim`; bits
    beyond its type (32 bits when `maxb` is 5, else 64) dropped, as `rc_get` and Kafka drop them."""
    u = 0
    for k in range(maxb):
        if q == lim:
            return _FIELD_PAST_RECORD, 0, q
        b = buf[q]
        q += 1
        u |= (b & 0x7F) << (7 * k)
        if not b & 0x80:
            u &= 0xFFFF_FFFF if maxb == 5 else 0xFFFF_FFFF_FFFF_FFFF
            return 0, (u >> 1) ^ -(u & 1), q
    return _VARINT_TOO_LONG, 0, q


def _utf8_ok(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def decode_fields_python(buf: bytes, start: int, end: int, count: int) -> tuple[int, array[int]]:
    """(result, fields) for the `count` records of `buf[start:end]`: the twin of `rc_decode`, check
    for check. Result 0 or `code | index << 8 | offset << 32`; fields, FIELDS ints per record, are
    empty unless the result is 0."""
    out: list[int] = []
    if not 0 <= start <= end <= len(buf) or end - start > SECTION_MAX or not 0 <= count <= 0xFFFFFFFF:
        return _BOUNDS, _NO_FIELDS
    length = end - start
    p = 0
    i = 0
    while i < count:
        if p == length:
            return _TOO_FEW_RECORDS | i << 8 | p << 32, _NO_FIELDS
        rc, rlen, q = _get(buf, start + p, end, 5)
        q -= start
        if rc:
            return (_LENGTH_TRUNCATED if rc == _FIELD_PAST_RECORD else rc) | i << 8 | p << 32, _NO_FIELDS
        if rlen < 0:
            return _LENGTH_NEGATIVE | i << 8 | p << 32, _NO_FIELDS
        if rlen > length - q:
            return _RECORD_PAST_END | i << 8 | p << 32, _NO_FIELDS
        rend = q + rlen
        if q == rend:
            return _FIELD_PAST_RECORD | i << 8 | q << 32, _NO_FIELDS
        q += 1  # attributes
        lim = start + rend
        at = q
        rc, ts, q = _get(buf, start + q, lim, 10)
        q -= start
        if rc:
            return rc | i << 8 | at << 32, _NO_FIELDS
        at = q
        rc, od, q = _get(buf, start + q, lim, 5)
        q -= start
        if rc:
            return rc | i << 8 | at << 32, _NO_FIELDS
        at = q
        rc, klen, q = _get(buf, start + q, lim, 5)
        q -= start
        if rc:
            return rc | i << 8 | at << 32, _NO_FIELDS
        if klen < -1:
            return _KEY_LENGTH_INVALID | i << 8 | at << 32, _NO_FIELDS
        ko = q
        if klen > 0:
            if klen > rend - q:
                return _KEY_PAST_RECORD | i << 8 | at << 32, _NO_FIELDS
            q += klen
        at = q
        rc, vlen, q = _get(buf, start + q, lim, 5)
        q -= start
        if rc:
            return rc | i << 8 | at << 32, _NO_FIELDS
        if vlen < -1:
            return _VALUE_LENGTH_INVALID | i << 8 | at << 32, _NO_FIELDS
        vo = q
        if vlen > 0:
            if vlen > rend - q:
                return _VALUE_PAST_RECORD | i << 8 | at << 32, _NO_FIELDS
            q += vlen
        at = q
        rc, hc, q = _get(buf, start + q, lim, 5)
        q -= start
        if rc:
            return rc | i << 8 | at << 32, _NO_FIELDS
        if hc < 0:
            return _HEADER_COUNT_NEGATIVE | i << 8 | at << 32, _NO_FIELDS
        ho = q
        for _ in range(hc):
            at = q
            rc, hk, q = _get(buf, start + q, lim, 5)
            q -= start
            if rc:
                return rc | i << 8 | at << 32, _NO_FIELDS
            if hk < 0:
                return _HEADER_KEY_LENGTH_INVALID | i << 8 | at << 32, _NO_FIELDS
            if hk > rend - q:
                return _HEADER_KEY_PAST_RECORD | i << 8 | at << 32, _NO_FIELDS
            if not _utf8_ok(buf[start + q : start + q + hk]):
                return _HEADER_KEY_NOT_UTF8 | i << 8 | at << 32, _NO_FIELDS
            q += hk
            at = q
            rc, hv, q = _get(buf, start + q, lim, 5)
            q -= start
            if rc:
                return rc | i << 8 | at << 32, _NO_FIELDS
            if hv < -1:
                return _HEADER_VALUE_LENGTH_INVALID | i << 8 | at << 32, _NO_FIELDS
            if hv > 0:
                if hv > rend - q:
                    return _HEADER_VALUE_PAST_RECORD | i << 8 | at << 32, _NO_FIELDS
                q += hv
        if q != rend:
            return _RECORD_LENGTH_MISMATCH | i << 8 | p << 32, _NO_FIELDS
        out += (start + ko, klen, start + vo, vlen, ts, od, start + ho, hc)
        p = rend
        i += 1
    if p != length:
        return _TRAILING_BYTES | i << 8 | p << 32, _NO_FIELDS
    return 0, array("q", out)


class Codec(NamedTuple):
    """One implementation of the byte work: `encode(gathered, prefix) -> bytearray` (raises
    SectionError) and `decode(buf, start, end, count) -> (result, fields)`."""

    name: str
    encode: Callable[[Gathered, int], bytearray]
    decode: Callable[[bytes, int, int, int], tuple[int, array[int]]]


PYTHON = Codec("python", encode_python, decode_fields_python)


def native_codec() -> Codec | None:
    """The C codec, or None when `native._codec` is not built (or native/ is absent)."""
    try:
        from native._codec import ffi, lib  # noqa: PLC0415 - optional, and loaded on first use
    except ImportError:
        return None
    from_buffer = ffi.from_buffer
    release = ffi.release
    null = ffi.NULL
    c_encode = lib.rc_encode
    c_decode = lib.rc_decode

    def q(arr: array[int] | None) -> object:
        return null if arr is None else from_buffer("int64_t[]", arr)

    def encode_native(g: Gathered, prefix: int = 0) -> bytearray:
        cap = g.capacity()
        out = bytearray(prefix + cap)
        hlens = g.hlens
        nh = 0 if hlens is None else len(hlens) // 2
        view = from_buffer("unsigned char[]", out)  # held through the call, released before the resize
        try:
            written = c_encode(
                view + prefix,
                cap,
                g.record_count,
                g.kblob,
                len(g.kblob),
                q(g.klens),
                g.vblob,
                len(g.vblob),
                q(g.vlens),
                q(g.timestamps),
                g.base_timestamp,
                q(g.hcounts),
                g.hblob,
                len(g.hblob),
                q(hlens),
                nh,
            )
        except OverflowError:  # only a count beyond 2**32 gets here: gather checks the rest
            raise SectionError(True, _ENC_LENGTH_INVALID, 0) from None
        finally:
            release(view)
        if written < 0:
            raise SectionError(True, -written & 0xFF, -written >> 8)
        del out[prefix + written :]
        return out

    def decode_native(buf: bytes, start: int, end: int, count: int) -> tuple[int, array[int]]:
        try:
            if count < 0 or count * RECORD_SIZE_MIN > end - start:  # cannot fit: find why, no array
                return c_decode(buf, len(buf), start, end, count, null, 0), _NO_FIELDS
            fields = array("q", bytes(8 * FIELDS * count))
            result = c_decode(buf, len(buf), start, end, count, from_buffer("int64_t[]", fields), len(fields))
        except OverflowError:  # a negative start, end or count, or count beyond 32 bits
            return _BOUNDS, _NO_FIELDS
        return result, fields if result == 0 else _NO_FIELDS

    return Codec("native", encode_native, decode_native)


_codec: Codec | None = None


def current_codec() -> Codec:
    """The codec `encode_section` and `decode_section` use: C when built, else `PYTHON`. Resolved
    on first use, so a program that never encodes or decodes never imports native."""
    global _codec  # noqa: PLW0603 - resolved once
    if _codec is None:
        _codec = native_codec() or PYTHON
    return _codec


def implementation() -> str:
    """ "native" or "python": which codec runs here."""
    return current_codec().name


def encode_section(
    records: Iterable[Record | bytes], base_timestamp: int, *, prefix: int = 0, codec: Codec | None = None
) -> tuple[bytearray, int, int]:
    """(prefix zero bytes + the encoded section, record count, max timestamp).

    A record's timestampDelta is its timestamp minus `base_timestamp` (Kafka's batch
    baseTimestamp: the caller passes the first record's timestamp, or now); a record without a
    timestamp, or a plain bytes value, takes `base_timestamp`. The max timestamp is over the
    records' timestamps so filled in. `prefix` leaves room for the batch header in the same
    buffer, so the batch is never copied to put a header in front of it. Raises SectionError.
    """
    g = gather(records, base_timestamp)
    return (codec or current_codec()).encode(g, prefix), g.record_count, g.max_timestamp


def _headers(data: bytes, p: int, count: int) -> list[tuple[str, bytes | None]]:
    """The headers at `p`, whose framing the decode has checked (lengths, bounds, UTF-8)."""
    out: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        _rc, hk, p = _get(data, p, len(data), 5)
        key = data[p : p + hk].decode()
        p += hk
        _rc, hv, p = _get(data, p, len(data), 5)
        if hv < 0:
            out.append((key, None))
        else:
            out.append((key, data[p : p + hv]))
            p += hv
    return out


def decode_section(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    *,
    codec: Codec | None = None,
) -> list[Record]:
    """The `count` records of the section `buf[start:end]`, offsets `base_offset` + offsetDelta and
    timestamps `base_timestamp` + timestampDelta. Raises SectionError when the section does not
    frame exactly `count` records. Records without headers share one empty tuple as `headers`."""
    if type(buf) is not bytes:  # records hold slices of bytes: copy the section once
        if not 0 <= start <= end <= len(buf):
            raise SectionError(False, _BOUNDS, 0)
        buf = bytes(memoryview(buf)[start:end])
        end -= start
        start = 0
    result, fields = (codec or current_codec()).decode(buf, start, end, count)
    if result:
        raise SectionError.from_decode(result)
    return _build(buf, fields, count, base_offset, base_timestamp)


def _build(buf: bytes, fields: array[int], count: int, base_offset: int, base_timestamp: int) -> list[Record]:
    """Records from a decode's field array, read by columns (strided slices made lists in C).

    The two common shapes (no null value, no header; keys all null or none null) are one list
    comprehension each, a `Record(...)` call and a slice per record and nothing else: at 1 KiB
    values those two are most of the cost (the allocation of the slice and Record.__init__),
    so a general loop's tests and unpacking would add a third. Records without headers share one
    empty tuple as `headers`."""
    vlens = fields[3::FIELDS]
    klens = fields[1::FIELDS]
    hcounts = fields[7::FIELDS]
    stamps = fields[4::FIELDS].tolist()
    deltas = fields[5::FIELDS].tolist()
    bt, bo = base_timestamp, base_offset
    R = Record
    if hcounts.count(0) == count and vlens.count(-1) == 0:
        voffs = fields[2::FIELDS].tolist()
        vls = vlens.tolist()
        if klens.count(-1) == count:
            return [
                R(buf[o : o + n], None, (), bt + t, bo + d)
                for o, n, t, d in zip(voffs, vls, stamps, deltas, strict=True)
            ]
        if klens.count(-1) == 0:
            return [
                R(buf[o : o + n], buf[ko : ko + kn], (), bt + t, bo + d)
                for ko, kn, o, n, t, d in zip(
                    fields[0::FIELDS].tolist(), klens.tolist(), voffs, vls, stamps, deltas, strict=True
                )
            ]
    it = iter(fields.tolist())
    return [
        R(
            buf[vo : vo + vl] if vl >= 0 else None,
            buf[ko : ko + kl] if kl >= 0 else None,
            _headers(buf, ho, hc) if hc else (),
            bt + td,
            bo + od,
        )
        for ko, kl, vo, vl, td, od, ho, hc in zip(it, it, it, it, it, it, it, it, strict=False)
    ]


def decode_rows(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    prefix: tuple[Any, ...] = (),
    cls: type[tuple[Any, ...]] = tuple,
    *,
    codec: Codec | None = None,
) -> list[tuple[Any, ...]]:
    """`decode_section`'s records as tuples of type `cls` (a tuple subclass, a NamedTuple say):
    `prefix + (offset, timestamp, key, value, headers)` each. Checks and errors as
    `decode_section`."""
    if type(buf) is not bytes:  # values are slices of bytes: copy the section once
        if not 0 <= start <= end <= len(buf):
            raise SectionError(False, _BOUNDS, 0)
        buf = bytes(memoryview(buf)[start:end])
        end -= start
        start = 0
    result, fields = (codec or current_codec()).decode(buf, start, end, count)
    if result:
        raise SectionError.from_decode(result)
    return rows(buf, fields, count, base_offset, base_timestamp, prefix, cls)


def rows(
    buf: bytes,
    fields: array[int],
    count: int,
    base_offset: int,
    base_timestamp: int,
    prefix: tuple[Any, ...] = (),
    cls: type[tuple[Any, ...]] = tuple,
) -> list[tuple[Any, ...]]:
    """Tuples from a decode's field array, built column by column with no Python code per record:
    every column is a C iterator (`repeat` for a constant, `map` over the field array's strided
    slices for the rest, `buf.__getitem__` of `slice`s for keys and values) and `zip` plus
    `tuple.__new__` assemble the rows. At 1 KiB values this is about a third of `_build` followed
    by a tuple per record (no `Record` and no Python frame per record). Columns holding nulls or
    headers take a list comprehension."""
    vlens = fields[3::FIELDS]
    klens = fields[1::FIELDS]
    hcounts = fields[7::FIELDS]
    deltas = fields[4::FIELDS]
    get = buf.__getitem__
    offsets = map(add, repeat(base_offset, count), fields[5::FIELDS])
    stamps = (
        repeat(base_timestamp, count)
        if deltas.count(0) == count
        else map(add, repeat(base_timestamp), deltas)
    )
    voffs = fields[2::FIELDS]
    if vlens.count(-1) == 0:
        values: Iterable[bytes | None] = map(get, map(slice, voffs, map(add, voffs, vlens)))
    else:
        values = [None if n < 0 else buf[o : o + n] for o, n in zip(voffs, vlens, strict=True)]
    nulls = klens.count(-1)
    if nulls == count:
        keys: Iterable[bytes | None] = repeat(None, count)
    else:
        koffs = fields[0::FIELDS]
        if nulls == 0:
            keys = map(get, map(slice, koffs, map(add, koffs, klens)))
        else:
            keys = [None if n < 0 else buf[o : o + n] for o, n in zip(koffs, klens, strict=True)]
    if hcounts.count(0) == count:
        headers: Iterable[object] = repeat((), count)
    else:
        headers = [
            _headers(buf, ho, hc) if hc else () for ho, hc in zip(fields[6::FIELDS], hcounts, strict=True)
        ]
    columns = [repeat(x, count) for x in prefix]
    return list(
        map(
            tuple.__new__,
            repeat(cls, count),
            zip(*columns, offsets, stamps, keys, values, headers, strict=False),
        )
    )


__all__ = [
    "DECODE_ERRORS",
    "ENCODE_ERRORS",
    "PYTHON",
    "Codec",
    "Gathered",
    "SectionError",
    "current_codec",
    "decode_fields_python",
    "decode_rows",
    "decode_section",
    "encode_python",
    "encode_section",
    "gather",
    "implementation",
    "native_codec",
    "rows",
]
