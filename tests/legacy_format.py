"""ringlog's record batch format 1 (before Kafka's RecordBatch v2), rebuilt from its old layout so
tests can hand the broker a data dir written by an older version. Only what tests need: plain
values, no keys or headers.

Format 1 (big-endian): base_offset i64, batch_length i32, magic u8 = 1, crc u32 (crc32c of bytes
[17, end)), attributes i16, last_offset_delta i32, first_timestamp i64, max_timestamp i64,
producer_id i64, producer_epoch i16, base_sequence i32, record_count i32, records_length i32;
then per record: record_length u32, timestamp_delta i32, key_length i32, value_length i32,
header_count u16, key, value.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

_TAIL = struct.Struct(">hiqqqhiii")
_RECORD = struct.Struct(">IiiiH")


def legacy_batch(values: list[bytes], base_offset: int = 0, timestamp: int = 1_700_000_000_000) -> bytes:
    """One format-1 batch of `values` at `base_offset`, crc and all, as the old broker stored it."""
    section = b"".join(_RECORD.pack(14 + len(v), 0, -1, len(v), 0) + v for v in values)
    n = len(values)
    tail = _TAIL.pack(0, n - 1, timestamp, timestamp, -1, -1, -1, n, len(section))
    crc = crc32c(section, crc32c(tail))
    return struct.pack(">qiBI", base_offset, 1 + 4 + len(tail) + len(section), 1, crc) + tail + section


def legacy_store(batches: list[list[bytes]], base_offset: int = 0) -> bytes:
    """A format-1 segment store: the batches back to back, offsets following each other."""
    out = []
    offset = base_offset
    for values in batches:
        out.append(legacy_batch(values, offset))
        offset += len(values)
    return b"".join(out)
