"""A produced batch rewritten with another codec: what Kafka's LogValidator does to a batch whose
codec is not its topic's compression.type (`buildRecordsAndAssignOffsets`, which rebuilds the batch
with a MemoryRecordsBuilder). The format is ringlog_proto/batch.py's.

Rules this module keeps (Kafka's, where it rebuilds a batch):
- One batch in, one batch out: the same records, in the same order, each with its offset delta (a
  produced batch's are 0..n-1, as the broker's check requires: the offsets the log assigns are
  those Kafka's builder would), key, value, headers and timestamp.
- The header keeps the producer id, epoch and base sequence, the transactional and timestamp-type
  bits, `last_offset_delta` and `record_count`: an idempotent producer's sequences mean what they
  meant, and its retries are still recognised. The codec bits become the new codec; the crc is
  computed anew; the base offset and leader epoch are the log's to write, as for any batch.
- The base timestamp is the first record's timestamp, as Kafka's builder takes it. Every client
  writes its batches so (the first record's delta is 0) and then the timestamps are copied as they
  are, the max timestamp the producer's; a batch whose first delta is not 0 has every delta
  written against the first record's timestamp and its max timestamp taken from the records, as
  the builder computes it.
- The batch was checked before (validation.py: framed, counted, inflated within its bound): the
  records are copied by their lengths, never decoded.
- No I/O. The work is CPU: an inflate and a compression of the whole section (see
  broker/storage/recompression.py for what that costs the loop).
"""

from __future__ import annotations

from ringlog_proto.batch_header import COMPRESSION_MASK, HEADER_SIZE, BatchHeader, sealed
from ringlog_proto.compression import compress, decompress_bounded
from ringlog_proto.varint import read_varint, zigzag_varint


def recompressed(
    buf: bytes | bytearray | memoryview,
    pos: int,
    h: BatchHeader,
    codec: int,
    level: int | None,
    limit: int,
    inflated: bytes | None = None,
) -> bytes:
    """The batch at `pos` of `buf` (header `h`, already checked) with its records in `codec`
    (0: uncompressed) at Kafka's compression level `level` (None: the codec's default). `limit`:
    the bound its section was inflated within when it was checked (`decompress_bounded`).
    `inflated`: its section as that check inflated it, when kept (not inflated again)."""
    source = h.attributes & COMPRESSION_MASK
    with memoryview(buf) as view:
        section = view[pos + HEADER_SIZE : pos + h.size]
        if inflated is not None:
            records: bytes | memoryview = inflated
        else:
            records = decompress_bounded(section, source, limit) if source else section
        try:
            first_ts, max_ts = h.base_timestamp, h.max_timestamp
            body = records
            if _first_timestamp_delta(records) != 0:
                body, first_ts, max_ts = _rebased(records, h)
            packed = compress(body, codec, level) if codec else bytes(body)
        finally:
            if isinstance(records, memoryview):
                records.release()
            section.release()
    attributes = (h.attributes & ~COMPRESSION_MASK) | codec
    return sealed(h, attributes, first_ts, max_ts, h.record_count, packed)


def _first_timestamp_delta(records: bytes | memoryview) -> int:
    """The first record's timestamp delta: past its length varint and its attributes byte."""
    _length, p = read_varint(records, 0)
    return read_varint(records, p + 1, True)[0]


def _rebased(records: bytes | memoryview, h: BatchHeader) -> tuple[bytes, int, int]:
    """`records` (the `h.record_count` records of a checked section) with each timestamp delta
    written against the first record's timestamp: (the section, that timestamp, the largest)."""
    parts: list[bytes] = []
    stamps: list[int] = []
    rows: list[tuple[int, int, int]] = []  # (attributes at, rest from, record end)
    p = 0
    for _ in range(h.record_count):
        length, body = read_varint(records, p)
        delta, rest = read_varint(records, body + 1, True)
        stamps.append(h.base_timestamp + delta)
        rows.append((body, rest, body + length))
        p = body + length
    first = stamps[0]
    for (body, rest, end), ts in zip(rows, stamps, strict=True):
        record = bytes(records[body : body + 1]) + zigzag_varint(ts - first) + bytes(records[rest:end])
        parts += (zigzag_varint(len(record)), record)
    return b"".join(parts), first, max(stamps)
