"""A topic's compression.type applied to what is appended: each batch whose codec is not the
log's (`LogConfig.compression`) is rewritten in it before offsets are assigned, as Kafka's
LogValidator rewrites it (ringlog_proto/batch_recompress.py says what the new batch keeps).

Rules this module keeps (Kafka's, UnifiedLog.append and LogValidator):
- Only a log with a codec of its own pays: compression.type=producer (None) never reaches here,
  and a batch already in the log's codec is stored as it came, whatever its level (Kafka's
  in-place assignment: the same codec is not recompressed).
- A compressed batch is inflated once: validation keeps the section it inflated to check it
  (validation.py `Checked`), and the rewrite starts from it; only a batch without one (headers
  validated elsewhere) is inflated here.
- One batch in, one batch out, in order; the batches are checked before (validation.py), and the
  batch limit (max.message.bytes) is checked twice, as Kafka checks it: on the batch as sent,
  there, and on each rewritten batch here (a batch stored uncompressed may grow past it:
  `BatchTooLargeError`, MESSAGE_TOO_LARGE, nothing appended).
- A control batch (a transaction's marker) is stored as written, whatever the log's codec (Kafka's
  LogValidator: control records are not compressed unless they were written compressed).
- Only a leader's append (`Log.prepare_append`) recompresses; a follower copies its leader's
  batches as they are (`prepare_copy`), as Kafka's followers do. A producer's retry of batches
  already stored is answered before the append (Partition.produce) and costs nothing here.

What it costs: the rewrite is CPU work on the loop of the core that owns the partition, the
whole record section compressed again (its inflation is the check's, kept) while nothing else of
that core runs. A batch of 1 MiB of JSON-like records (170 KiB as sent in gzip) stored in zstd
adds 3.3 ms to its append (5.6 ms in all, against 2.3 ms stored as sent) on the 2-CPU VM this
was written on; uncompressed to zstd adds 2.9 ms, to lz4 1.6 ms, zstd to uncompressed 0.4 ms,
gzip to lz4 1.9 ms, zstd to gzip 25 ms (zlib's level 6 is the slow one; bench/recompression.py,
medians of 9 alternated rounds; inflating a second time, as the rewrite did before it took the
check's section, added 1.8 ms from gzip, 0.9 ms from zstd). It scales with the records' inflated
size: a batch of the default max.message.bytes as sent in gzip (1 MiB, 6 MiB of such records)
adds 31 ms to zstd, and one in zstd to a gzip topic 152 ms (`--kib 6144`), during which the core
answers nothing else. Kafka pays the same CPU on its request handler threads
(LogValidator rebuilds such a batch with a MemoryRecordsBuilder), where it holds up one handler
rather than a core; its documentation's advice holds here: producers that compress with the
topic's codec make the rewrite a no-op.
"""

from __future__ import annotations

from broker.storage.errors import BatchTooLargeError
from broker.storage.log_config import LogConfig
from ringlog_proto.batch import CODEC_NAMES, COMPRESSION_MASK, BatchHeader, unpack_header
from ringlog_proto.batch_recompress import recompressed


def in_log_codec(
    records: bytes | bytearray | memoryview,
    headers: list[BatchHeader],
    config: LogConfig,
    inflated: dict[int, bytes] | None = None,
) -> tuple[bytes | bytearray | memoryview, list[BatchHeader]]:
    """`records` (whole batches, checked, with their `headers`) with every batch in the log's
    codec: as they are when all are, else the rewritten bytes and their headers. `inflated`:
    the record sections the check inflated, by position (`validation.Checked`)."""
    codec = config.compression
    assert codec is not None, "only a log with a codec of its own recompresses"
    if all(h.attributes & COMPRESSION_MASK == codec or h.control for h in headers):
        return records, headers
    parts: list[bytes | memoryview] = []
    out: list[BatchHeader] = []
    limit = config.max_decompressed_bytes
    pos = 0
    with memoryview(records) as view:
        for h in headers:
            if h.attributes & COMPRESSION_MASK == codec or h.control:
                parts.append(bytes(view[pos : pos + h.size]))
                out.append(h)
            else:
                section = None if inflated is None else inflated.get(pos)
                batch = recompressed(view, pos, h, codec, config.compression_level, limit, section)
                if len(batch) > config.max_batch_bytes:
                    where = f"batch at byte {pos}: " if pos else ""
                    raise BatchTooLargeError(
                        f"{where}batch of {len(batch)} bytes once stored {CODEC_NAMES[codec]} "
                        f"exceeds max_batch_bytes {config.max_batch_bytes}"
                    )
                parts.append(batch)
                out.append(BatchHeader._make(unpack_header(batch, 0)))
            pos += h.size
    return (parts[0] if len(parts) == 1 else b"".join(parts)), out
