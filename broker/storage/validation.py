"""What every batch passes before it is stored: header, size limit, crc32c, then (but on a
follower) its records.

Rules this module keeps:
- Every path that stores a batch passes `validate` once (the produce handler of either backend,
  forwarded produces, idempotent retries, `Log.append`), or a follower's copies `validate_stored`;
  either changes nothing and one bad batch refuses them all.
- What a producer may send is narrower than what may be stored (Kafka's LogValidator checks a
  client's append apart from a replica's): a control batch (a transaction's marker) is never a
  producer's, a transactional batch only when the caller says so (`transactional`, off until the
  broker runs a transaction coordinator); a follower's copies (`validate_stored`) take both.
- A follower's copies of its leader's batches pass `validate_stored`, as Kafka's follower checks
  them: each header (`invalid_stored_header`, a cleaned batch's included) and its crc32c, in one
  C call when native._records is built; the records are neither walked nor inflated. The leader
  walked them when they were produced and the crc has covered them since, on its disk and on
  the wire: what the follower's walk added was CPU per replicated byte (a compressed batch
  inflated again: ~1 ms a MiB of lz4 or zstd here, gzip more). A leader bug that stored bad
  framing now replicates as it is; the consumer side's walk and `broker storage check` still
  see it.
- The checks run in C when native._records is built (`produced_checker`, one call for the batches
  that pass them all); the Python checks below say why a batch fails, and are the fallback.
- A compressed batch is checked as Kafka's LogValidator does (inflated within
  `LogConfig.max_decompressed_bytes`, walked, counted) and stored compressed. On a log with a
  codec of its own, a batch in another codec keeps what was inflated (`Checked.inflated`), for
  the rewrite in the log's codec (recompression.py) not to inflate it a second time.
- `keys` (the caller's rule: a compacted topic's produce, `Partition.produce`): every record must
  have a key, as Kafka's LogValidator requires of a compacted topic; the first batch with records
  without one refuses them all (`KeylessRecordError`, their indexes in it). Read from the bytes
  the checks above walked, a compressed batch's from the same inflation: without `keys`, nothing
  more is done.
"""

from __future__ import annotations

import logging

from broker.storage.errors import (
    BatchTooLargeError,
    InvalidBatchError,
    KeylessRecordError,
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
    keyless_records,
    produced_checker,
    records_walker,
    refused_batch,
    stored_checker,
    unpack_header,
)

log = logging.getLogger("broker.storage.log")  # the log's lines, as before this module was apart

_walk_records = records_walker()  # C when native._records is built (see ringlog_proto/batch.py)
_walk_bytes = bytes_walker()  # the same C function without the wrapper: requests are bytes
_check_produced = produced_checker()  # all of a produce's checks in C, for the batches that pass
_check_stored = stored_checker()  # a follower's checks in C, for the batches that pass
if _walk_bytes is None:
    log.warning(
        "native._records is not built: the record-framing walk of every produced batch runs in "
        "Python, about a microsecond per record (run `make setup` to build it)"
    )


class Checked(list[BatchHeader]):
    """The headers of the batches `validate` passed, in order, and the record sections it
    inflated of those the log will rewrite in its own codec: position in the records -> the
    section (empty unless the log has a codec of its own and a batch is in another)."""

    __slots__ = ("inflated",)

    def __init__(self) -> None:
        super().__init__()
        self.inflated: dict[int, bytes] = {}


def validate(
    records: bytes | bytearray | memoryview,
    config: LogConfig,
    keys: bool = False,
    transactional: bool = False,
) -> Checked:
    """Headers of the whole batches in `records` (one or more), or an error; changes nothing.

    Every path that stores a batch passes here once (the produce handler of either backend,
    forwarded produces, idempotent retries, `append`): header, crc32c, then the record
    framing walk, in C when native._records is built (~1-2 µs a batch). A follower's copies of
    its leader's batches pass `validate_stored` instead (module rules). `keys`: every
    record must have one (module rules). `transactional`: a produced transactional batch is
    taken (off: refused, UnsupportedBatchError, until the broker runs a transaction
    coordinator); a produced control batch never is (`refused_batch`).
    """
    size = len(records)
    max_batch = config.max_batch_bytes
    check = config.check_records
    headers = Checked()
    keep = headers.inflated if config.compression is not None else None
    pos = 0
    if _check_produced is not None:
        # Every check below in one C call for the batches that pass them all: here only
        # their headers are read. From the first that does not, the loop below says why.
        passed = _check_produced(records, max_batch, check, transactional)
        while pos < passed:
            h = BatchHeader._make(unpack_header(records, pos))
            if h.attributes & COMPRESSION_MASK and (check or keys):  # C checked all but its records
                check_compressed(records, pos, h, config, keys, keep)
            elif keys:
                check_keys(records, pos, h)
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
        reason = invalid_header(h, size - pos, transactional)
        if reason is None and batch_crc(records, pos, batch_size) != h.crc:
            reason = "crc32c mismatch"
        if reason is not None:
            where = f"batch at byte {pos}: " if pos else ""
            if refused_batch(h, transactional) == reason:  # well formed, but not a producer's
                raise UnsupportedBatchError(where + reason)
            raise InvalidBatchError(where + reason)
        if h.attributes & COMPRESSION_MASK and (check or keys):
            check_compressed(records, pos, h, config, keys, keep)
        elif check and (
            c_walk(raw, size, pos + HEADER_SIZE, pos + batch_size, h.record_count)
            if c_walk is not None
            else walk(records, pos + HEADER_SIZE, pos + batch_size, h.record_count)
        ):
            where = f"batch at byte {pos}: " if pos else ""
            raise RecordFramingError(where + (invalid_records(records, pos, h) or "bad records"))
        if keys and not h.attributes & COMPRESSION_MASK:
            check_keys(records, pos, h)
        headers.append(h)
        pos += batch_size
    if not headers:
        raise InvalidBatchError("no batch to append")
    return headers


def validate_stored(records: bytes | bytearray | memoryview, max_batch: int) -> Checked:
    """Headers of the whole batches in `records` (one or more), a follower's copy of its
    leader's, or an error; changes nothing. Each header passes `invalid_stored_header` and the
    size limit, and its crc32c matches (module rules: no record walk, no inflating). The
    batches that pass are found in one C call when native._records is built; the Python below,
    from the first that does not, says why (the C check's twin: the same batches pass both)."""
    size = len(records)
    headers = Checked()
    passed = _check_stored(records, max_batch) if _check_stored is not None else 0
    pos = 0
    while pos < passed:
        h = BatchHeader._make(unpack_header(records, pos))
        headers.append(h)
        pos += h.size
    while pos < size:
        where = f"batch at byte {pos}: " if pos else ""
        if size - pos < HEADER_SIZE:
            raise InvalidBatchError(f"{size - pos} bytes at {pos}: less than a batch header")
        h = BatchHeader._make(unpack_header(records, pos))
        if h.magic != MAGIC:  # before the size check: garbage is corrupt, not "too large"
            raise InvalidBatchError(f"batch at byte {pos}: unknown batch magic {h.magic}")
        if h.size > max_batch:
            raise BatchTooLargeError(f"batch of {h.size} bytes exceeds max_batch_bytes {max_batch}")
        reason = invalid_stored_header(h, size - pos)
        if reason is None and batch_crc(records, pos, h.size) != h.crc:
            reason = "crc32c mismatch"
        if reason is not None:
            raise InvalidBatchError(where + reason)
        headers.append(h)
        pos += h.size
    if not headers:
        raise InvalidBatchError("no batch to append")
    return headers


def check_compressed(
    records: bytes | bytearray | memoryview,
    pos: int,
    h: BatchHeader,
    config: LogConfig,
    keys: bool = False,
    keep: dict[int, bytes] | None = None,
) -> None:
    """The records of a compressed batch, as Kafka's LogValidator checks them: inflated (at
    most `max_decompressed_bytes`), walked, counted, and with `keys` each one's key there
    (module rules). The batch is stored compressed, unless it is not in the log's codec: then
    its inflated section is left in `keep` (see `Checked`)."""
    where = f"batch at byte {pos}: " if pos else ""
    limit = config.max_decompressed_bytes
    keyless: list[int] | None = [] if keys else None
    if h.attributes & COMPRESSION_MASK == config.compression:
        keep = None  # stored as it came
    try:
        reason = invalid_compressed_records(records, pos, h, limit, keyless, keep)
    except DecompressedTooLarge as exc:
        raise BatchTooLargeError(where + str(exc)) from None
    except BatchError as exc:  # does not decompress: corrupt, as Kafka answers it
        raise InvalidBatchError(where + str(exc)) from None
    if reason is not None:
        raise RecordFramingError(where + reason)
    if keyless:
        raise _keyless(pos, keyless)


def check_keys(records: bytes | bytearray | memoryview, pos: int, h: BatchHeader) -> None:
    """`KeylessRecordError` when a record of the uncompressed batch at `pos` (its framing
    walked) has no key (module rules)."""
    keyless = keyless_records(records, pos + HEADER_SIZE, pos + h.size, h.record_count)
    if keyless:
        raise _keyless(pos, keyless)


def _keyless(pos: int, indexes: list[int]) -> KeylessRecordError:
    where = f"batch at byte {pos}: " if pos else ""
    shown = ", ".join(map(str, indexes[:3])) + (", ..." if len(indexes) > 3 else "")
    return KeylessRecordError(
        f"{where}{len(indexes)} record(s) without a key (index {shown}): a compacted topic keeps each "
        "key's last record and takes none without one",
        indexes,
    )
