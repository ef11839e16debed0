"""Record batches: the unit of storage and of the wire. Kafka's RecordBatch v2 (magic 2), byte for byte.

The format is written down here; its code is in one module per noun, whose public names this
module re-exports (code imports them from ringlog_proto.batch):
- batch_header.py: the header's fields and constants, `BatchHeader`, the header and crc checks,
  the format 1 check, the two fields the broker writes;
- batch_encode.py: records into a batch (Python, native._batch, native._codec);
- batch_decode.py: a batch into records, for clients;
- batch_control.py: control batches, the commit and abort markers of transactions;
- batch_checks.py: the records walk, the check of produced batches and the scan of stored ones,
  with their C twins in native._records;
- compression.py: the record section's codecs, every one Kafka has, for clients and broker alike
  (and bounded, for the broker's check of produced batches);
- batch_recompress.py: a produced batch rewritten in its topic's codec (compression.type), and
  batch_compact.py: the batches the log cleaner writes (both imported from their modules);
- varint.py and record.py: the varints, `Record`, `Header` and `BatchError`, which both record
  codecs name.

Rules these modules keep:
- No I/O. Bytes in, bytes out; the broker, the clients and the Spark source all use this one codec.
- One format: Kafka's RecordBatch v2, on disk and in both protocols, so a Kafka Fetch is a plain
  extent read. A data dir written by the old format 1 is refused at open (`legacy_format`), not
  converted and never mistaken for damage.
- The broker never decodes records. It reads the fixed header, checks length, crc32c and counts with
  `invalid_batch()`, walks the record framing with `invalid_records()` (a compressed batch's
  after inflating it, bounded: `invalid_compressed_records()`)
  (varint lengths, offset deltas, counts, header keys; never the payload), writes the base offset
  and partition leader epoch with `set_base_offset()` (or beside it, `rebased()`), and stores the
  bytes as they came (unless the topic's compression.type names another codec than the batch's:
  then the records are copied, not decoded, into a batch of that codec, batch_recompress.py);
  reading them back, it checks them with `scan_stored()` (`stored_damage()` batch after batch,
  in C when native._records is built). The crc does not
  cover those two fields, so assigning them costs 16 bytes, not a checksum over the batch. The walk
  is what keeps a batch no client can decode (a "poison" batch with a valid crc) out of the log.
- No module outside ringlog_proto reads or writes batch bytes at an offset: they use the named
  fields of `BatchHeader` and the helpers here, so a format change is made in these modules (and in
  the C twins of the records walk, of a produce's checks and of the stored-batch scan,
  native/_records_build.py, whose header offsets and limits are checked against batch_header.py's
  when it loads).
- The walk runs in C (`native._records`, a small cffi extension) when it is built, and in Python
  (`walk_records_python`, its exact twin) when it is not: ringlog_proto needs nothing of native/,
  and clients never walk (they decode, which checks the same things).
- Clients encode and decode the records section in C (`native._codec` through
  ringlog_proto/records_codec.py, one call per batch) when it is built, and a batch of plain
  values whole, header and crc included (`native._batch`, one CPython call, whose header
  offsets are checked against batch_header.py's when it loads); the encode and decode
  here are the pure-Python codec, used when it is not (and for the rare shapes the C path leaves
  to it: a first record with a timestamp of its own, LogAppendTime batches). Both give the same
  bytes and the same records and fail on the same batches (tests/ringlog_proto/test_batch_codecs.py runs
  each). Varints cost a Python branch per field, so the Python encode takes precomputed varints
  from a table, and its decode first matches a record against the previous record's shape
  (`startswith` in C) and parses field by field only when it differs. Records without headers
  share one empty tuple as `headers`, in both codecs.

Fileformat (Kafka RecordBatch v2, all fixed-width integers big-endian, 61-byte header):

    offset size field                      meaning
    0      8    base_offset            i64  offset of the first record; the broker overwrites it
                                            (a client's value is ignored, Kafka clients send 0)
    8      4    batch_length           i32  bytes after this field (the whole batch is 12 + batch_length)
    12     4    partition_leader_epoch i32  written by the broker (0 until replication has epochs);
                                            clients send -1 (Java) or 0 (librdkafka, kafka-python)
    16     1    magic                  i8   2
    17     4    crc                    u32  crc32c (Castagnoli) of bytes [21, 12 + batch_length)
    21     2    attributes             i16  bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4,
                                            4 zstd), bit 3 timestamp type (0 create, 1 log append),
                                            bit 4 transactional, bit 5 control, bit 6 delete horizon
                                            (a stored batch the log cleaner wrote, KIP-534:
                                            base_timestamp is the horizon); the rest zero
    23     4    last_offset_delta      i32  record_count - 1
    27     8    base_timestamp         i64  ms since the epoch, of the first record
    35     8    max_timestamp          i64  ms since the epoch, largest record timestamp in the batch
    43     8    producer_id            i64  -1 when the producer is not idempotent
    51     2    producer_epoch         i16  -1 when not idempotent
    53     4    base_sequence          i32  sequence of the first record, -1 when not idempotent
    57     4    record_count           i32  number of records, >= 1
    61     ...  records: record_count records back to back, or, when compressed, one stream of the
                codec's framing (gzip; snappy as Kafka's xerial framing; lz4 frame; zstd frame)
                holding them

Each record (varint = zigzag base-128 varint, at most 5 bytes; varlong: at most 10 bytes):

    varint   length           bytes of the record after this field
    i8       attributes       unused (0)
    varlong  timestamp_delta  ms relative to base_timestamp
    varint   offset_delta     the record's index in the batch: offset = base_offset + offset_delta
    varint   key_length       -1 for a null key
    ...      key
    varint   value_length     -1 for a null value
    ...      value
    varint   header_count
    then header_count times:
      varint header_key_length, then the key as UTF-8 (never null)
      varint header_value_length (-1 for null), then the value bytes

What a produced batch must satisfy, as Kafka's broker checks it; a header failure or a wrong crc
is CORRUPT_MESSAGE, a framing failure or a batch of a kind not taken yet is INVALID_BATCH:
- magic 2; batch_length covers the header and fits the bytes sent and `max_batch_bytes`; the crc;
- 1 <= record_count <= RECORD_COUNT_MAX, last_offset_delta == record_count - 1, and
  max_timestamp >= base_timestamp;
- a known codec and no unknown attribute bit; no control bit (markers are the broker's to write)
  and no transactional bit unless the caller allows it (off until the broker runs a transaction
  coordinator): INVALID_BATCH, with that reason, see `refused_batch`;
- in an uncompressed batch, the walk, record by record: every varint ends inside its record and
  within its width, record lengths fit, each offset_delta equals the record's index, key and value
  lengths are >= -1 and inside the record, header counts >= 0, header key lengths >= 0 and keys
  UTF-8, header value lengths >= -1, each record's fields end exactly at its length, and exactly
  record_count records fill the batch.
- in a compressed batch, the same walk over its inflated record section (`invalid_compressed_records`,
  as Kafka's LogValidator decompresses and counts): a stream that does not decompress (garbage
  with a valid crc, truncated, trailing bytes) is CORRUPT_MESSAGE, records that do not frame or
  are fewer or more than record_count are INVALID_BATCH, and a section inflating past the bound
  (`decompress_bounded`: never more than it is produced, whatever the stream claims) is
  MESSAGE_TOO_LARGE. The batch is then stored as it came, compressed (or in its topic's codec).
The same rules make `decode_records` fail.

Clients' base offsets are overwritten, never checked: Kafka clients send 0, our encoder 0 by default.

A stored batch may also be one the log cleaner rewrote (batch_compact.py, Kafka's compaction):
the same base offset and last_offset_delta with fewer records (offset deltas rising, skipping
offsets) or none (an empty batch, the header alone), and bit 6 with a delete horizon. Next offsets
and last sequences are therefore always computed from last_offset_delta (`BatchHeader.next_offset`,
`last_sequence`), as Kafka's readers do. Such a batch passes `invalid_stored_header` (reads,
recovery, a follower's copy, clients), never `invalid_header` (produce).

A stored batch may be transactional (bit 4) or a control batch (bit 5 with bit 4: a transaction's
commit or abort marker, batch_control.py has its one record byte by byte): both pass
`invalid_stored_header`, and clients skip control batches when they hand out records.
"""

from __future__ import annotations

from ringlog_proto.batch_checks import (
    RECORD_ERRORS,
    Checker,
    Scan,
    bytes_walker,
    describe_walk,
    invalid_compressed_records,
    invalid_records,
    keyless_records,
    produced_checker,
    records_walker,
    scan_implementation,
    scan_stored,
    scan_stored_python,
    stored_checker,
    stored_damage,
    walk_implementation,
    walk_records,
    walk_records_python,
)
from ringlog_proto.batch_control import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_TYPE_NAMES,
    MARKER_ATTRIBUTES,
    NO_COORDINATOR_EPOCH,
    ControlRecord,
    control_batch,
    control_of,
)
from ringlog_proto.batch_decode import decode_batches, decode_records, decode_rows, iter_batches
from ringlog_proto.batch_encode import (
    FramedEncoder,
    PlainEncoder,
    encode_batch,
    encode_batch_framed,
    now_ms,
    record_size,
    seal_batch,
)
from ringlog_proto.batch_header import (
    BROKER_PRODUCER_ID_LIMIT,
    CODEC_NAMES,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CONTROL_BIT,
    CRC_START,
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    LEGACY_MAGIC,
    LENGTH_PREFIX_SIZE,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    RECORD_COUNT_MAX,
    RECORD_HEADER_SIZE,
    STORED_LEADER_EPOCH,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    batch_crc,
    invalid_batch,
    invalid_header,
    invalid_stored_batch,
    invalid_stored_header,
    legacy_format,
    peek_codec,
    peek_size,
    read_header,
    rebased,
    refused_batch,
    set_base_offset,
    span_shortfall,
    stamped,
    unpack_header,
)
from ringlog_proto.compression import DecompressedTooLarge, compress, decompress, decompress_bounded
from ringlog_proto.record import BatchError, Header, Record
from ringlog_proto.varint import read_varint, varint_size, zigzag_varint

__all__ = [
    "BROKER_PRODUCER_ID_LIMIT",
    "CODEC_NAMES",
    "COMPRESSION_GZIP",
    "COMPRESSION_LZ4",
    "COMPRESSION_MASK",
    "COMPRESSION_NONE",
    "COMPRESSION_SNAPPY",
    "COMPRESSION_ZSTD",
    "CONTROL_ABORT",
    "CONTROL_BIT",
    "CONTROL_COMMIT",
    "CONTROL_TYPE_NAMES",
    "CRC_START",
    "DELETE_HORIZON_BIT",
    "HEADER_SIZE",
    "LEGACY_MAGIC",
    "LENGTH_PREFIX_SIZE",
    "MAGIC",
    "MARKER_ATTRIBUTES",
    "NO_COORDINATOR_EPOCH",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "RECORD_COUNT_MAX",
    "RECORD_ERRORS",
    "RECORD_HEADER_SIZE",
    "STORED_LEADER_EPOCH",
    "TIMESTAMP_TYPE_BIT",
    "TRANSACTIONAL_BIT",
    "BatchError",
    "BatchHeader",
    "Checker",
    "ControlRecord",
    "DecompressedTooLarge",
    "FramedEncoder",
    "Header",
    "PlainEncoder",
    "Record",
    "Scan",
    "batch_crc",
    "bytes_walker",
    "compress",
    "control_batch",
    "control_of",
    "decode_batches",
    "decode_records",
    "decode_rows",
    "decompress",
    "decompress_bounded",
    "describe_walk",
    "encode_batch",
    "encode_batch_framed",
    "invalid_batch",
    "invalid_compressed_records",
    "invalid_header",
    "invalid_records",
    "invalid_stored_batch",
    "invalid_stored_header",
    "iter_batches",
    "keyless_records",
    "legacy_format",
    "now_ms",
    "peek_codec",
    "peek_size",
    "produced_checker",
    "read_header",
    "read_varint",
    "rebased",
    "record_size",
    "records_walker",
    "refused_batch",
    "scan_implementation",
    "scan_stored",
    "scan_stored_python",
    "seal_batch",
    "set_base_offset",
    "span_shortfall",
    "stamped",
    "stored_checker",
    "stored_damage",
    "unpack_header",
    "varint_size",
    "walk_implementation",
    "walk_records",
    "walk_records_python",
    "zigzag_varint",
]
