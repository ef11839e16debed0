"""Records into a batch: `encode_batch` (as Kafka's producers write it, byte for byte), the header
sealed around an encoded section (`seal_batch`), a produce frame's one batch in one call
(`encode_batch_framed`), and a record's size. In C when native._batch (a batch of plain values,
whole) or native._codec (the section, through records_codec.py) is built, else in Python: both
give the same bytes. The rules are in ringlog_proto/batch.py's docstring.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from crc32c import crc32c

from ringlog_proto import records_codec
from ringlog_proto.batch_header import (
    _CRC,
    _HEAD,
    _TAIL,
    COMPRESSION_NONE,
    CRC_START,
    HEADER_SIZE,
    LENGTH_PREFIX_SIZE,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    RECORD_COUNT_MAX,
    TRANSACTIONAL_BIT,
    _field_at,
)
from ringlog_proto.compression import compress
from ringlog_proto.record import BatchError, Header, Record
from ringlog_proto.varint import _NULL, _ZZ, _ZZ_TABLE_SIZE, _zz, varint_size, zigzag_varint

_U32 = struct.Struct(">I")  # a request head's length fields (`encode_batch_framed`)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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
    return encode_values


FramedEncoder = Callable[[bytes, int, int, Sequence[Any], int, int, int, int, int, int], "bytes | None"]
_framed: FramedEncoder | None = _UNRESOLVED


def _native_framed_encoder() -> FramedEncoder | None:
    """native._batch's `encode_framed` (the batch after a caller's head, two of the head's u32
    fields set), once `_native_plain_encoder` has checked the build's header layout; None
    without the build."""
    if _native_plain_encoder() is None:
        return None
    from native._batch import encode_framed  # noqa: PLC0415 - optional, as above

    return encode_framed


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
    base_timestamp is its first record's. `compression`: a codec of CODEC_NAMES (0: none), at
    its default level, framed as Kafka's own producers frame it (ringlog_proto/compression.py).
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
        # Anything else first (a str, a bytearray) takes the path below, which names it in a BatchError.
        if type(first) is bytes or (isinstance(first, Record) and first.timestamp is None):
            if len(recs) > RECORD_COUNT_MAX:
                raise BatchError(f"{len(recs)} records in one batch; at most {RECORD_COUNT_MAX}")
            header = {
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "base_sequence": base_sequence,
                "base_offset": base_offset,
                "partition_leader_epoch": partition_leader_epoch,
            }
            try:
                out, count, max_ts = records_codec.encode_section(
                    recs, default_ts, prefix=0 if compression else HEADER_SIZE, codec=codec
                )
            except (TypeError, AttributeError) as exc:  # a later record, key, value or header of another type
                raise BatchError(f"a record cannot be encoded: {exc}") from None
            if compression:
                return seal_batch(
                    compress(bytes(out), compression), count, default_ts, max_ts,
                    attributes=compression, **header,
                )  # fmt: skip
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
            # Not exactly bytes: a Record, or what fails below as one (isinstance would cost a
            # Record ~40 ns more than type() does a bytes).
            record: Record = rec  # type: ignore[assignment]
            ts = default_ts if record.timestamp is None else record.timestamp
            if first_ts is None:
                first_ts = ts
            if ts > max_ts:
                max_ts = ts
            d = ts - first_ts
            tsb = zz[d] if 0 <= d < table else zigzag_varint(d)
            key = record.key
            if key is None:
                kb = _NULL
                key = b""
            else:
                n = len(key)
                kb = zz[n] if n < table else zigzag_varint(n)
            value = record.value
            if value is None:
                vb = _NULL
                value = b""
            else:
                n = len(value)
                vb = zz[n] if n < table else zigzag_varint(n)
            hdrs = record.headers
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


_ATTRIBUTES_AT = _field_at("attributes")
_CRC_AT = _field_at("crc")
_ATTRIBUTES = struct.Struct(">h")
_U32_CRC = struct.Struct(">I")


def as_transactional(batch: bytes) -> bytes:
    """`batch` (one whole batch as `encode_batch` made it) with its transactional attribute set
    and its crc made again: what a transactional producer sends (KIP-98). A copy and a crc pass
    more than a plain batch: only transactional producers pay it."""
    out = bytearray(batch)
    (attributes,) = _ATTRIBUTES.unpack_from(out, _ATTRIBUTES_AT)
    _ATTRIBUTES.pack_into(out, _ATTRIBUTES_AT, attributes | TRANSACTIONAL_BIT)
    _U32_CRC.pack_into(out, _CRC_AT, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)
