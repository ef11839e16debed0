"""What every batch passes before it is stored: header, size limit, crc32c, then its records.

Rules this module keeps:
- Every path that stores a batch passes `validate` once (the produce handler of either backend,
  forwarded produces, idempotent retries, a follower's copies, `Log.append`); it changes nothing
  and one bad batch refuses them all.
- The checks run in C when native._records is built (`produced_checker`, one call for the batches
  that pass them all); the Python checks below say why a batch fails, and are the fallback.
- A compressed batch is checked as Kafka's LogValidator does (inflated within
  `LogConfig.max_decompressed_bytes`, walked, counted) and stored compressed.
"""

from __future__ import annotations

import logging

from broker.storage.errors import (
    BatchTooLargeError,
    InvalidBatchError,
    RecordFramingError,
    UnsupportedBatchError,
)
from broker.storage.log_config import LogConfig
from ringlog_proto.batch import (
    COMPRESSION_MASK,
    HEADER_SIZE,
    MAGIC,
    BatchError,
    BatchHeader,
    DecompressedTooLarge,
    batch_crc,
    bytes_walker,
    invalid_compressed_records,
    invalid_header,
    invalid_records,
    invalid_stored_header,
    produced_checker,
    records_walker,
    unpack_header,
    unsupported_batch,
)

log = logging.getLogger("broker.storage.log")  # the log's lines, as before this module was apart

_walk_records = records_walker()  # C when native._records is built (see ringlog_proto/batch.py)
_walk_bytes = bytes_walker()  # the same C function without the wrapper: requests are bytes
_check_produced = produced_checker()  # all of a produce's checks in C, for the batches that pass
if _walk_bytes is None:
    log.warning(
        "native._records is not built: the record-framing walk of every produced batch runs in "
        "Python, about a microsecond per record (run `make setup` to build it)"
    )


def validate(
    records: bytes | bytearray | memoryview, config: LogConfig, stored: bool = False
) -> list[BatchHeader]:
    """Headers of the whole batches in `records` (one or more), or an error; changes nothing.

    Every path that stores a batch passes here once (the produce handler of either backend,
    forwarded produces, idempotent retries, `append`): header, crc32c, then the record
    framing walk, in C when native._records is built (~1-2 µs a batch). `stored`: a follower's
    copy of its leader's batches, which may be batches the leader's cleaner rewrote (fewer
    records than offsets, none, a delete horizon: `invalid_stored_header`); those are checked in
    Python, record offsets rising within the batch's span.
    """
    size = len(records)
    max_batch = config.max_batch_bytes
    check = config.check_records
    headers = []
    pos = 0
    if _check_produced is not None:
        # Every check below in one C call for the batches that pass them all: here only
        # their headers are read. From the first that does not, the loop below says why.
        passed = _check_produced(records, max_batch, check)
        while pos < passed:
            h = BatchHeader._make(unpack_header(records, pos))
            if check and h.attributes & COMPRESSION_MASK:  # C checked all but its records
                check_compressed(records, pos, h, config)
            headers.append(h)
            pos += h.size
        if pos == size and headers:
            return headers
    walk = _walk_records
    # The C function itself when `records` is bytes: a Python frame less per batch is a
    # third of the walk's cost for small batches. `raw` is `records` whenever it is called.
    raw = records if type(records) is bytes else b""
    c_walk = _walk_bytes if check and type(records) is bytes else None
    while pos < size:
        if size - pos < HEADER_SIZE:
            raise InvalidBatchError(f"{size - pos} bytes at {pos}: less than a batch header")
        h = BatchHeader._make(unpack_header(records, pos))
        if h.magic != MAGIC:  # before the size check: garbage is corrupt, not "too large"
            raise InvalidBatchError(f"batch at byte {pos}: unknown batch magic {h.magic}")
        batch_size = h.size
        if batch_size > max_batch:
            raise BatchTooLargeError(f"batch of {batch_size} bytes exceeds max_batch_bytes {max_batch}")
        reason = invalid_stored_header(h, size - pos) if stored else invalid_header(h, size - pos)
        if reason is None and batch_crc(records, pos, batch_size) != h.crc:
            reason = "crc32c mismatch"
        if reason is not None:
            where = f"batch at byte {pos}: " if pos else ""
            if unsupported_batch(h) == reason:  # well formed, but transactional or control
                raise UnsupportedBatchError(where + reason)
            raise InvalidBatchError(where + reason)
        if check and h.attributes & COMPRESSION_MASK:
            check_compressed(records, pos, h, config)
        elif check and not h.dense:  # a leader's cleaned batch (only `stored` lets one here)
            reason = invalid_records(records, pos, h)
            if reason is not None:
                raise RecordFramingError(f"batch at byte {pos}: {reason}")
        elif check and (
            c_walk(raw, size, pos + HEADER_SIZE, pos + batch_size, h.record_count)
            if c_walk is not None
            else walk(records, pos + HEADER_SIZE, pos + batch_size, h.record_count)
        ):
            where = f"batch at byte {pos}: " if pos else ""
            raise RecordFramingError(where + (invalid_records(records, pos, h) or "bad records"))
        headers.append(h)
        pos += batch_size
    if not headers:
        raise InvalidBatchError("no batch to append")
    return headers


def check_compressed(
    records: bytes | bytearray | memoryview, pos: int, h: BatchHeader, config: LogConfig
) -> None:
    """The records of a compressed batch, as Kafka's LogValidator checks them: inflated (at
    most `max_decompressed_bytes`), walked, counted. The batch is stored compressed."""
    where = f"batch at byte {pos}: " if pos else ""
    limit = config.max_decompressed_bytes
    try:
        reason = invalid_compressed_records(records, pos, h, limit)
    except DecompressedTooLarge as exc:
        raise BatchTooLargeError(where + str(exc)) from None
    except BatchError as exc:  # does not decompress: corrupt, as Kafka answers it
        raise InvalidBatchError(where + str(exc)) from None
    if reason is not None:
        raise RecordFramingError(where + reason)
