"""Poison batches for tests: a valid header and crc32c over record framing that does not parse.

`frame_batch(section, count)` wraps any record-section bytes in a batch header whose lengths and
crc are right, so only the record walk (or a client's decode) can tell it is bad. `POISON` names
one batch per way the framing can be wrong.
"""

from __future__ import annotations

import struct

from ringlog_proto.batch import seal_batch

RECORD = struct.Struct(">IiiiH")


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


def record(value: bytes | None, key: bytes | None = None, headers: bytes = b"", hcount: int = 0) -> bytes:
    """One well-formed record (headers given already encoded)."""
    k = b"" if key is None else key
    v = b"" if value is None else value
    body = RECORD.pack(
        14 + len(k) + len(v) + len(headers),
        0,
        -1 if key is None else len(k),
        -1 if value is None else len(v),
        hcount,
    )
    return body + k + v + headers


def _raw(rlen: int, klen: int, vlen: int, hcount: int, rest: bytes) -> bytes:
    return RECORD.pack(rlen, 0, klen, vlen, hcount) + rest


GOOD = record(b"g" * 20)

# name -> (record section, record_count): each passes the header and crc checks, none decodes.
POISON: dict[str, tuple[bytes, int]] = {
    "record_length_past_end": (GOOD + _raw(10_000, -1, 20, 0, b"x" * 20), 2),
    "count_above_records": (GOOD + GOOD, 3),
    "count_below_records": (GOOD + GOOD + GOOD, 2),
    "trailing_bytes": (GOOD + GOOD + b"\0" * 7, 2),
    "record_length_short": (GOOD + _raw(10, -1, -1, 0, b"") + b"\0" * 20, 2),
    "fields_short_of_length": (GOOD + _raw(14 + 30, -1, 20, 0, b"v" * 30), 2),
    "key_length_minus_2": (GOOD + _raw(14 + 20, -2, 20, 0, b"v" * 20), 2),
    "value_length_minus_5": (GOOD + _raw(14, -1, -5, 0, b""), 2),
    "value_past_record": (GOOD + _raw(14 + 4, -1, 40, 0, b"v" * 4) + GOOD, 3),
    "header_count_past_record": (GOOD + record(b"v", headers=b"\0\1k\0\0\0\1z", hcount=2), 2),
    "header_key_past_record": (GOOD + record(b"v", headers=b"\0\x40k\0\0\0\1z", hcount=1), 2),
    "header_value_length_minus_3": (GOOD + record(b"v", headers=b"\0\1k\xff\xff\xff\xfd", hcount=1), 2),
    "header_value_past_record": (GOOD + record(b"v", headers=b"\0\1k\0\0\0\x40z", hcount=1), 2),
    "header_key_not_utf8": (GOOD + record(b"v", headers=b"\0\2\xc3\x28\xff\xff\xff\xff", hcount=1), 2),
}


def poison_batch(name: str, **kw: int) -> bytes:
    section, count = POISON[name]
    return frame_batch(section, count, **kw)
