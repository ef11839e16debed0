"""What the broker checks of a batch past its header, each in C when native._records
(native/_records_build.py) is built, loaded on first use and optional, else in Python, its exact
twin: the records walk (`walk_records_python`, `records_walker()`; the rules it checks are in
ringlog_proto/batch.py's docstring), the walk of a compressed batch's inflated section, the check
of produced batches in one call (`produced_checker`), and the scan of batches read back from
storage (`stored_damage`, `scan_stored`). Python only: the records without a key, which a
compacted topic refuses (`keyless_records`). native._records' copy of the header layout is checked
against batch_header.py's when it loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crc32c import crc32c

from ringlog_proto.batch_header import (
    _BASE_OFFSET_FIELD,
    _BATCH_LENGTH,
    _CRC_FIELD,
    _HEADER,
    _KNOWN_ATTRIBUTES,
    _MAGIC,
    _RECORD_COUNT,
    _STORED_ATTRIBUTES,
    CODEC_NAMES,
    COMPRESSION_MASK,
    COMPRESSION_ZSTD,
    CONTROL_BIT,
    CRC_START,
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    LENGTH_PREFIX_SIZE,
    MAGIC,
    RECORD_COUNT_MAX,
    RECORD_HEADER_SIZE,
    TRANSACTIONAL_BIT,
    BatchHeader,
    _field_at,
    read_header,
)
from ringlog_proto.compression import decompress_bounded
from ringlog_proto.varint import _MASK32, _MASK64, _VARINT_BITS, _VARLONG_BITS

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
    19: "a record's offset delta does not rise within the batch's last offset delta",  # cleaned batches
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


def walk_records_python(
    buf: bytes | bytearray | memoryview, start: int, end: int, count: int, span: int | None = None
) -> int:
    """Walk the framing of `count` records in `buf[start:end]`: 0 when it holds exactly those, else
    `code | record_index << 8 | byte_offset << 32` (offset from `start`; codes in RECORD_ERRORS).

    The twin of the C walk (`native._records.lib.rr_walk_records`), check for check, so the two
    can be tested against each other; this one serves when the extension is not built. `span`
    (a batch the log cleaner rewrote: its last offset delta + 1) lets offset deltas skip, rising
    below it (code 19 otherwise); only this walk knows that shape, which a follower copying a
    compacted leader's log meets (broker/storage/validation.py).
    """
    if not 0 <= start <= end <= len(buf) or end - start > _RECORD_SECTION_MAX or count < 0:
        return _WALK_BOUNDS
    v32 = _VARINT_BITS
    v64 = _VARLONG_BITS
    p = start
    i = 0
    prev = -1
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
        if span is None:
            if delta != i:
                return 17 | i << 8 | (n - start) << 32
        elif not prev < delta < span:
            return 19 | i << 8 | (n - start) << 32
        prev = delta
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
    broker binds it once (broker/storage/validation.py); importing native is left to the first caller."""
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
    if not h.dense:  # a batch the log cleaner rewrote: offsets may skip
        result = walk_records_python(
            buf, pos + HEADER_SIZE, pos + h.size, h.record_count, h.last_offset_delta + 1
        )
        return None if result == 0 else describe_walk(result)
    result = walk_records(buf, pos + HEADER_SIZE, pos + h.size, h.record_count)
    return None if result == 0 else describe_walk(result)


def keyless_records(buf: bytes | bytearray | memoryview, start: int, end: int, count: int) -> list[int]:
    """The indexes of the records without a key (key length -1, null) among the `count` records
    of `buf[start:end]`, whose framing was walked already (`walk_records`): each record's lengths
    are read up to its key's, nothing more. Kafka refuses such records on a compacted topic (its
    LogValidator's key check); the broker asks only for a topic that is one."""
    out = []
    p = start
    for i in range(count):
        length, q = _walk_varint(buf, p, end, _VARINT_BITS)
        record_end = q + length
        _timestamp, q = _walk_varint(buf, q + 1, record_end, _VARLONG_BITS)  # past the attributes
        _delta, q = _walk_varint(buf, q, record_end, _VARINT_BITS)
        key_length, _ = _walk_varint(buf, q, record_end, _VARINT_BITS)
        if key_length < 0:
            out.append(i)
        p = record_end
    return out


def invalid_compressed_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    h: BatchHeader,
    limit: int,
    keyless: list[int] | None = None,
    keep: dict[int, bytes] | None = None,
) -> str | None:
    """Why the compressed batch at `pos` (header `h`, already valid) holds no `h.record_count`
    records that frame, or None: its section is inflated (at most `limit` bytes,
    `decompress_bounded`, whose errors propagate) and walked as an uncompressed one is, as
    Kafka's LogValidator decompresses and counts every compressed batch it is given. `keyless`
    (a compacted topic's produce): the records without a key are appended to it, found in the
    same inflated bytes (`keyless_records`), when they frame. `keep`: where a batch that passes
    leaves its inflated section (`keep[pos]`, a copy), for a caller about to rewrite it in
    another codec, which then need not inflate it again."""
    with memoryview(buf) as view:
        section = view[pos + HEADER_SIZE : pos + h.size]
        try:
            data = decompress_bounded(section, h.attributes & COMPRESSION_MASK, limit)
        finally:
            section.release()
    try:
        if h.dense:
            result = walk_records(data, 0, len(data), h.record_count)
        else:  # a batch the log cleaner rewrote, copied from a leader
            result = walk_records_python(data, 0, len(data), h.record_count, h.last_offset_delta + 1)
        if result == 0 and keyless is not None:
            keyless += keyless_records(data, 0, len(data), h.record_count)
        if result == 0 and keep is not None:
            keep[pos] = bytes(data)  # `data` may be a view of the buffer the next batch reuses
    finally:
        if isinstance(data, memoryview):
            data.release()
    if result == 0:
        return None
    return f"{CODEC_NAMES[h.attributes & COMPRESSION_MASK]}-compressed: {describe_walk(result)}"


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


def _check_native_layout(lib: Any) -> None:
    """native._records' copy of the header layout and of `invalid_header`'s limits, against this
    file's (its C twins read batches by them): a build that disagrees raises, once, at load."""
    theirs = (
        lib.RR_BATCH_HEADER_SIZE, lib.RR_BATCH_CRC_START, lib.RR_BATCH_MAGIC, lib.RR_BATCH_LENGTH_AT,
        lib.RR_BATCH_MAGIC_AT, lib.RR_BATCH_CRC_AT, lib.RR_BATCH_ATTRIBUTES_AT, lib.RR_BATCH_LAST_DELTA_AT,
        lib.RR_BATCH_BASE_TS_AT, lib.RR_BATCH_MAX_TS_AT, lib.RR_BATCH_COUNT_AT, lib.RR_RECORD_COUNT_MAX,
        lib.RR_RECORD_HEADER_SIZE, lib.RR_ATTR_KNOWN, lib.RR_ATTR_COMPRESSION, lib.RR_ATTR_TRANSACTIONAL,
        lib.RR_ATTR_CONTROL, lib.RR_CODEC_MAX, lib.RR_ATTR_STORED_KNOWN, lib.RR_ATTR_DELETE_HORIZON,
    )  # fmt: skip
    ours = (
        HEADER_SIZE, CRC_START, MAGIC, *map(_field_at, (
            "batch_length", "magic", "crc", "attributes", "last_offset_delta", "base_timestamp",
            "max_timestamp", "record_count",
        )),
        RECORD_COUNT_MAX, RECORD_HEADER_SIZE, _KNOWN_ATTRIBUTES, COMPRESSION_MASK, TRANSACTIONAL_BIT,
        CONTROL_BIT, COMPRESSION_ZSTD, _STORED_ATTRIBUTES, DELETE_HORIZON_BIT,
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


Checker = Callable[[bytes | bytearray | memoryview, int, bool, bool], int]


def produced_checker() -> Checker | None:
    """The C check of produced batches, or None when native._records is not built.

    `check(buf, max_batch, walk, transactional)` is the end of the leading whole batches of
    `buf` that pass every check a produce makes (the header and its size limit,
    `invalid_header` with `transactional` as there, the crc, and `walk_records` when `walk` and
    the batch is uncompressed): `len(buf)` when all do. It says
    nothing of why one fails; the caller's own checks, from there on, find the reason (and accept
    whatever they accept: only a pass must never differ). One call where the Python checks make
    ~10 per batch (broker/storage/validation.py's `validate` uses it)."""
    try:
        from native._records import ffi, lib  # noqa: PLC0415 - optional, and loaded on first use
    except ImportError:
        return None
    _check_native_layout(lib)
    from_buffer = ffi.from_buffer
    c_check = lib.rr_check_produced
    walk_flag, transactional_flag = lib.RR_CHECK_WALK, lib.RR_CHECK_TRANSACTIONAL

    def check_produced_native(
        buf: bytes | bytearray | memoryview, max_batch: int, walk: bool, transactional: bool = False
    ) -> int:
        flags = (walk_flag if walk else 0) | (transactional_flag if transactional else 0)
        return c_check(buf if type(buf) is bytes else from_buffer(buf), len(buf), max_batch, flags)

    return check_produced_native


StoredChecker = Callable[[bytes | bytearray | memoryview, int], int]


def stored_checker() -> StoredChecker | None:
    """The C check of a follower's copies of its leader's batches, or None when native._records
    is not built.

    `check(buf, max_batch)` is the end of the leading whole batches of `buf` that pass a
    follower's checks (the size limit, `invalid_stored_header`, the crc; no record walk, no
    inflating: `broker.storage.validation.validate_stored`): `len(buf)` when all do. As
    `produced_checker`, it says nothing of why one fails."""
    try:
        from native._records import ffi, lib  # noqa: PLC0415 - optional, and loaded on first use
    except ImportError:
        return None
    _check_native_layout(lib)
    from_buffer = ffi.from_buffer
    c_check = lib.rr_check_stored

    def check_stored_native(buf: bytes | bytearray | memoryview, max_batch: int) -> int:
        return c_check(buf if type(buf) is bytes else from_buffer(buf), len(buf), max_batch)

    return check_stored_native
