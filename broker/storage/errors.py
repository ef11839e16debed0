"""Storage errors: operating errors the broker reports to clients, never crashes on.

Each maps to one wire error code at the request boundary (a later issue's `ErrorCode`).
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error the storage engine raises on purpose."""


class InvalidBatchError(StorageError):
    """The batch offered to `append` is malformed (bad crc, lengths or counts); nothing was written."""


class RecordFramingError(InvalidBatchError):
    """The batch's header and crc check out but its records do not frame (a record length past the
    batch, a count that disagrees, ...): a "poison" batch no client could decode. Nothing was
    written. INVALID_BATCH on the wire, apart from CORRUPT_MESSAGE (a crc or header failure)."""


class UnsupportedBatchError(InvalidBatchError):
    """A well-formed batch of a kind the broker does not take yet (transactional or control):
    INVALID_BATCH on the wire, with the reason. Nothing was written."""


class KeylessRecordError(InvalidBatchError):
    """Records without a key offered to a log whose appends must have one (a compacted topic's:
    Kafka's LogValidator refuses them, INVALID_RECORD). `indexes`: each such record's index in
    its batch, the first batch that has any. Nothing was written."""

    def __init__(self, message: str, indexes: list[int]) -> None:
        super().__init__(message)
        self.indexes = tuple(indexes)


class BatchTooLargeError(StorageError):
    """The batch exceeds `max_batch_bytes`; nothing was written."""


class OffsetOutOfRangeError(StorageError):
    """An offset outside [start_offset, end_offset] was asked for."""


class CorruptBatchError(StorageError):
    """Bytes on disk failed validation on read. Names the file and position so an operator can look."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"corrupt batch in {path} at byte {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class LogClosedError(StorageError):
    """The log was closed, or a failed write left it unusable until it is reopened."""


class OutOfSpaceError(StorageError):
    """The disk holding the data dir is full (or below the broker's free-space floor): a write
    was refused or failed with ENOSPC, and nothing was stored. Reads still work; retriable."""


class LegacyFormatError(StorageError):
    """A segment written by ringlog's record batch format 1, before Kafka's RecordBatch v2 became
    the one format: not damage (nothing is cut or repaired), and not readable by this version.
    The broker refuses the whole data dir at start (broker/storage/dataformat.py)."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} was written by ringlog's record batch format 1; this version stores Kafka's "
            "RecordBatch v2 (magic 2) and does not convert old data dirs: run the older ringlog on "
            "it, or move it away and start with an empty data dir"
        )
        self.path = path
