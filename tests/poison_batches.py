"""Poison batches for tests: a valid header and crc32c over record framing that does not parse.

`frame_batch(section, count)` wraps any record-section bytes in a batch header whose lengths and
crc are right, so only the record walk (or a client's decode) can tell it is bad. `POISON` names
one batch per way the framing can be wrong (Kafka's RecordBatch v2 records: zigzag varints).
"""

from __future__ import annotations

from ringlog_proto.batch import seal_batch, zigzag_varint

zz = zigzag_varint


def frame_batch(
    section: bytes,
    count: int,
    *,
    base_offset: int = 0,
    timestamp: int = 1_700_000_000_000,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A batch holding `section` as its records, with `count` as record_count and a valid crc."""
    return seal_batch(
        section,
        count,
        timestamp,
        timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
    )


def _field(data: bytes | None) -> bytes:
    return zz(-1) if data is None else zz(len(data)) + data


def fields(
    value: bytes | None, key: bytes | None = None, headers: bytes = b"", hcount: int = 0, index: int = 0
) -> bytes:
    """A record's fields after its length varint (headers given already encoded)."""
    return b"\x00" + zz(0) + zz(index) + _field(key) + _field(value) + zz(hcount) + headers


def record(
    value: bytes | None, key: bytes | None = None, headers: bytes = b"", hcount: int = 0, index: int = 0
) -> bytes:
    """One well-formed record at `index` in its batch (headers given already encoded)."""
    body = fields(value, key, headers, hcount, index)
    return zz(len(body)) + body


def _framed(body: bytes, length: int | None = None) -> bytes:
    return zz(len(body) if length is None else length) + body


def _header(key: bytes, value: bytes | None) -> bytes:
    return zz(len(key)) + key + _field(value)


GOOD = record(b"g" * 20)
G1 = record(b"g" * 20, index=1)
G2 = record(b"g" * 20, index=2)
_PREFIX_1 = b"\x00" + zz(0) + zz(1)  # attributes, timestamp delta, offset delta of record 1

# name -> (record section, record_count): each passes the header and crc checks, none decodes.
POISON: dict[str, tuple[bytes, int]] = {
    "record_length_past_end": (GOOD + _framed(fields(b"x" * 20, index=1), 10_000), 2),
    "count_above_records": (GOOD + G1, 3),
    "count_below_records": (GOOD + G1 + G2, 2),
    "trailing_bytes": (GOOD + G1 + b"\0" * 7, 2),
    "record_length_short": (GOOD + zz(4) + b"\0" * 20, 2),
    "record_length_negative": (GOOD + zz(-3) + b"\0" * 20, 2),
    "record_length_varint_too_long": (GOOD + b"\xff" * 5 + b"\x01" + b"\0" * 20, 2),
    "fields_short_of_length": (GOOD + _framed(fields(b"v" * 20, index=1) + b"\0" * 10), 2),
    "offset_delta_not_index": (GOOD + record(b"v", index=5), 2),
    "timestamp_varlong_too_long": (
        GOOD + _framed(b"\x00" + b"\x80" * 10 + b"\x00" + zz(1) + zz(-1) * 2 + zz(0)),
        2,
    ),
    "key_length_minus_2": (GOOD + _framed(_PREFIX_1 + zz(-2) + zz(20) + b"v" * 20 + zz(0)), 2),
    "key_past_record": (GOOD + _framed(_PREFIX_1 + zz(40) + b"k" * 4 + zz(-1) + zz(0)) + G2, 3),
    "value_length_minus_5": (GOOD + _framed(_PREFIX_1 + zz(-1) + zz(-5) + zz(0)), 2),
    "value_past_record": (GOOD + _framed(_PREFIX_1 + zz(-1) + zz(40) + b"v" * 4 + zz(0)) + G2, 3),
    "header_count_negative": (GOOD + record(b"v", hcount=-1, index=1), 2),
    "header_count_past_record": (GOOD + record(b"v", headers=_header(b"k", b"z"), hcount=2, index=1), 2),
    "header_key_past_record": (GOOD + record(b"v", headers=zz(0x20) + b"k" + zz(-1), hcount=1, index=1), 2),
    "header_key_length_negative": (GOOD + record(b"v", headers=zz(-1) + zz(-1), hcount=1, index=1), 2),
    "header_value_length_minus_3": (GOOD + record(b"v", headers=zz(1) + b"k" + zz(-3), hcount=1, index=1), 2),
    "header_value_past_record": (
        GOOD + record(b"v", headers=zz(1) + b"k" + zz(0x20) + b"z", hcount=1, index=1),
        2,
    ),
    "header_key_not_utf8": (GOOD + record(b"v", headers=_header(b"\xc3\x28", None), hcount=1, index=1), 2),
}


def poison_batch(name: str, **kw: int) -> bytes:
    section, count = POISON[name]
    return frame_batch(section, count, **kw)
