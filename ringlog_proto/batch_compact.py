"""A stored batch as the log cleaner sees it, and the batches it writes back: Kafka's compaction
of a RecordBatch v2 (the format is ringlog_proto/batch.py's), byte for byte.

Rules this module keeps (Kafka's `MemoryRecords.filterTo` and `DefaultRecordBatch`, which these
follow):
- A batch whose records all stay, and which needs no delete horizon, is written back as it is:
  the same bytes, crc and all.
- A rewritten batch keeps its base offset, `last_offset_delta` (so its last offset and last
  sequence: what an idempotent producer's state is rebuilt from), partition leader epoch,
  producer id, epoch and base sequence, max timestamp, timestamp type and codec; it holds the
  records kept, each with its own offset delta (offsets then skip: consumers see gaps), and
  `record_count` says how many.
- Records are copied as they are (their offset and timestamp deltas stay right: the base offset
  and first timestamp do not change) unless the batch gains a delete horizon (KIP-534:
  `DELETE_HORIZON_BIT`, the horizon in place of the first timestamp), when each kept record's
  timestamp delta is re-encoded against the horizon, so every record keeps its timestamp.
- A batch none of whose records stay is either dropped or, where its header must outlive its
  records (the last batch of an active idempotent producer; see broker/storage/cleaner.py), an
  empty batch: Kafka's `writeEmptyHeader`, the header alone (`record_count` 0, no codec, first
  timestamp -1, the original max timestamp and `last_offset_delta`).
- No I/O and no threads of its own: the cleaner calls it on its thread with bytes it read.
"""

from __future__ import annotations

from typing import NamedTuple

from ringlog_proto.batch_header import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    sealed,
)
from ringlog_proto.compression import compress, decompress
from ringlog_proto.record import BatchError
from ringlog_proto.varint import read_varint, zigzag_varint

NO_TIMESTAMP = -1  # Kafka's RecordBatch.NO_TIMESTAMP: an empty batch's first timestamp


class CleanedRecord(NamedTuple):
    """One record of a stored batch, as much as the cleaner needs: where its bytes are in the
    (inflated) record section, its offset, its key, and whether its value is null (a tombstone)."""

    start: int  # where the record (its length varint) begins in the section
    end: int  # one past its last byte
    body: int  # where its timestamp delta begins (after the length and the attributes byte)
    offset: int  # base offset + offset delta
    key: bytes | None
    tombstone: bool  # a null value: Kafka's delete marker for its key


def records_of(batch: bytes | memoryview, h: BatchHeader) -> tuple[bytes, list[CleanedRecord]]:
    """The record section of the stored batch `batch` (whole, header `h`), inflated, and its
    records. Raises `BatchError` for framing that does not parse (the batch was checked when it
    was stored: that is damage)."""
    section = bytes(memoryview(batch)[HEADER_SIZE : h.size])
    codec = h.attributes & COMPRESSION_MASK
    if codec:
        section = decompress(section, codec)
    out: list[CleanedRecord] = []
    p = 0
    end = len(section)
    base = h.base_offset
    try:
        for _ in range(h.record_count):
            start = p
            length, p = read_varint(section, p)
            rend = p + length
            if length < 6 or rend > end:
                raise BatchError(f"record at byte {start}: length {length} does not fit the section")
            body = p + 1  # past the attributes byte
            _ts, q = read_varint(section, body, True)
            delta, q = read_varint(section, q)
            klen, q = read_varint(section, q)
            key = section[q : q + klen] if klen >= 0 else None
            q += max(klen, 0)
            vlen, _ = read_varint(section, q)
            out.append(CleanedRecord(start, rend, body, base + delta, key, vlen < 0))
            p = rend
    except IndexError:
        raise BatchError("record section truncated") from None
    if p != end:
        raise BatchError(f"{end - p} bytes left after {h.record_count} records")
    return section, out


def rebuilt(
    h: BatchHeader, section: bytes, kept: list[CleanedRecord], delete_horizon_ms: int | None
) -> bytes:
    """The batch `h` holding only `kept` (records of `section`, in order, at least one), with
    `delete_horizon_ms` as its delete horizon (None: as it had, or none)."""
    if not kept:
        raise ValueError("a rebuilt batch holds at least one record: see `emptied`")
    attributes = h.attributes
    first_ts = h.base_timestamp
    if delete_horizon_ms is not None and delete_horizon_ms != h.delete_horizon_ms:
        parts: list[bytes] = []
        for r in kept:
            ts_delta, after = read_varint(section, r.body, True)
            timestamp = first_ts + ts_delta
            body = (
                section[r.body - 1 : r.body]
                + zigzag_varint(timestamp - delete_horizon_ms)
                + section[after : r.end]
            )
            parts += (zigzag_varint(len(body)), body)
        first_ts = delete_horizon_ms
        attributes |= DELETE_HORIZON_BIT
    else:
        parts = [section[r.start : r.end] for r in kept]
    records = b"".join(parts)
    codec = attributes & COMPRESSION_MASK
    if codec:
        records = compress(records, codec)
    return sealed(h, attributes, first_ts, h.max_timestamp, len(kept), records)


def emptied(h: BatchHeader) -> bytes:
    """The batch `h` with no record left: its header alone (Kafka's `writeEmptyHeader`)."""
    attributes = h.attributes & (TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT)
    return sealed(h, attributes, NO_TIMESTAMP, h.max_timestamp, 0, b"")
