"""A batch into records, for clients: the whole batches of a fetched record set (`iter_batches`)
and their records (`decode_records`, `decode_rows`, `decode_batches`, which skips control
batches: batch_control.py reads those), crc checked and inflated (every codec Kafka has:
ringlog_proto/compression.py). In C through records_codec.py when native._codec is built (once
the walk says the section frames), else the Python decode here, which fails on the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, overload

from ringlog_proto import records_codec
from ringlog_proto.batch_checks import _RECORD_BODY_MIN, describe_walk, walk_records
from ringlog_proto.batch_header import (
    _HEADER,
    COMPRESSION_MASK,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    invalid_stored_batch,
    invalid_stored_header,
    read_header,
)
from ringlog_proto.compression import decompress
from ringlog_proto.record import BatchError, Header, Record
from ringlog_proto.varint import _UNZZ, _ZZ, _ZZ_TABLE_SIZE, read_varint, zigzag_varint


def iter_batches(
    buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position in `buf`, header) of each whole batch in `buf[start:end]`; stop silently at
    a partial tail.

    A fetch response may end in a partial batch (max_bytes cut it): that is normal, not an error.
    Headers are checked (not crcs) as stored batches (`invalid_stored_header`: a compacted
    log's batches pass); a bad header raises, because what follows it cannot be framed.
    """
    pos = start
    end = len(buf) if end is None else end
    while end - pos >= HEADER_SIZE:
        h = BatchHeader._make(_HEADER.unpack_from(buf, pos))
        reason = invalid_stored_header(h)
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
    way every record must end exactly where its length says, so a lying length raises.

    A batch the log cleaner rewrote (`h.dense` false) may skip offsets: its offset deltas must
    rise, within its last offset delta, and each record takes base offset + its delta (as
    Kafka's decoders read a compacted log); such a batch is parsed record by record."""
    unzz = _UNZZ
    zz = _ZZ
    table = _ZZ_TABLE_SIZE
    slow = read_varint
    startswith = data.startswith
    base_offset = h.base_offset
    base_ts = h.base_timestamp
    log_append = h.attributes & TIMESTAMP_TYPE_BIT
    dense = h.dense
    last_delta = h.last_offset_delta
    prev = -1  # the previous record's offset delta (checked only where offsets may skip)
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
        # what the broker's walk checks: offsets are dense in a produced batch, and rise within
        # its span in one the cleaner rewrote
        if (delta != i) if dense else not prev < delta <= last_delta:
            raise BatchError(f"record {i}: offset delta {delta}")
        prev = delta
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
            shape = data[start:before_delta] if p == rend and dense else b""
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
        append(Record(value, key, headers, ts, base_offset + delta))
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
        reason = invalid_stored_batch(buf, pos)
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
    batches, whose records all take the batch's max timestamp, and batches the log cleaner
    rewrote are rare enough for the Python path. The C decode keeps offset gaps, as Kafka's
    decoders do for compacted logs; ours fails exactly where the broker's walk refuses, so the
    walk (C too, ~15 ns a record) says no first."""
    if (
        records_codec.current_codec() is records_codec.PYTHON
        or h.attributes & TIMESTAMP_TYPE_BIT
        or not h.dense  # a cleaned batch: offsets may skip, which the walk refuses
    ):
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
    A compressed batch is inflated first, whatever its codec (a section that does not inflate
    raises a BatchError naming its codec).
    """
    h, data, p, end = _section(buf, pos, verify)
    if _native_section(h, data, p, end):
        return records_codec.decode_section(data, p, end, h.record_count, h.base_offset, h.base_timestamp)
    return _decode_python(data, p, end, h)


_Row = TypeVar("_Row", bound=tuple[Any, ...])


# Overloads, so that a caller's rows have its `cls`'s type (a NamedTuple's fields by name).
@overload
def decode_rows(
    buf: bytes | bytearray | memoryview, pos: int = 0, verify: bool = True, prefix: tuple[Any, ...] = ()
) -> list[tuple[Any, ...]]: ...
@overload
def decode_rows(
    buf: bytes | bytearray | memoryview, pos: int, verify: bool, prefix: tuple[Any, ...], cls: type[_Row]
) -> list[_Row]: ...
@overload
def decode_rows(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    verify: bool = True,
    prefix: tuple[Any, ...] = (),
    *,
    cls: type[_Row],
) -> list[_Row]: ...
def decode_rows(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    verify: bool = True,
    prefix: tuple[Any, ...] = (),
    cls: type[tuple[Any, ...]] = tuple,
) -> list[Any]:
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
    """All records of all whole batches in `buf` (a fetch response's record set), but those of
    control batches: a transaction's markers are the broker's bookkeeping, never an
    application's records (Kafka's consumers skip them too)."""
    out: list[Record] = []
    for pos, h in iter_batches(buf):
        if not h.control:
            out.extend(decode_records(buf, pos, verify))
    return out
