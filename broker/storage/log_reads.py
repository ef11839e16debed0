"""Reads of a log's segments: where a read's batches are, the check of the bytes read, and the
cold reads by time and of every header. `Log` (broker/storage/log.py) checks that it is usable
and the offset in range, then calls these; they change nothing.

Rules this module keeps:
- A read returns whole batches as stored, at least one, from one segment; bytes that do not check
  out end it: the intact batches before them are returned with the damage (`ReadResult.error`),
  and a read whose first batch is damaged raises it.
- The index finds batches; the cold paths (a time's offset, every header) pread what it points at.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.storage.errors import CorruptBatchError
from broker.storage.fileio import Buffer, FileIO
from broker.storage.segment import Extent, Segment
from broker.storage.txn_index import MarkerEntry
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_NONE,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    BatchError,
    BatchHeader,
    decode_records,
    read_header,
)
from ringlog_proto.batch_control import ControlRecord, control_of

log = logging.getLogger(__name__)

DECODED_CODECS = frozenset({COMPRESSION_NONE, COMPRESSION_GZIP})  # what `decode_records` can read


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole batches as stored, back to back; `next_offset` is where the next read starts."""

    data: Buffer
    first_offset: int
    next_offset: int
    error: CorruptBatchError | None = field(default=None)  # damage right after `data`, if any


def locate(
    segments: list[Segment], bases: list[int], offset: int, max_bytes: int, upto: int | None
) -> Extent | None:
    """`Log.prepare_read`'s extent, once the log checked the offset: from the segment holding
    `offset` (`bases`: the segments' base offsets), or the first after it with a batch to read."""
    i = bisect.bisect_right(bases, offset) - 1
    for seg in segments[max(i, 0) :]:
        extent = seg.locate(max(offset, seg.base_offset), max_bytes, upto)
        if extent is not None:
            return extent
    return None


def checked(extent: Extent, data: Buffer) -> ReadResult:
    """`Log.complete_read`: the intact batches of the bytes read for `extent`, before any damage."""
    seg = extent.segment
    valid, next_offset, error = seg.check_batches(data, extent)
    if error is None and len(data) < extent.length:
        error = CorruptBatchError(seg.store_path, extent.position + len(data), "store shorter than its index")
    if valid == 0:
        assert error is not None
        raise error
    # Whole (the usual case): the bytes as read, never a copy (a slice of a bytearray is one).
    return ReadResult(data if valid == len(data) else data[:valid], extent.first_offset, next_offset, error)


class TimestampAndOffset(NamedTuple):
    """The record a time finds: its offset and its own timestamp (what Kafka's ListOffsets
    answers for a timestamp, as `TimestampAndOffset` does in Kafka's log)."""

    offset: int
    timestamp: int


def timestamp_and_offset(segments: list[Segment], io: FileIO, timestamp: int) -> TimestampAndOffset | None:
    """`Log.offset_for_timestamp` (it says how), over the log's segments, with the timestamp of
    the record found: of the batch's first record where its records are not decoded (with
    LogAppendTime every record's is the batch's max timestamp)."""
    for seg in segments:
        if seg.find_timestamp(timestamp) is None:
            continue
        index = seg.index
        for i in range(index.find_timestamp(timestamp), len(index)):
            position = index.position(i)
            h = read_header(io.pread(seg.store_fd, HEADER_SIZE, position))
            if h.max_timestamp < timestamp:
                continue  # the running max came from a record the log cleaner removed
            if h.compression not in DECODED_CODECS:
                # (a cleaned batch's first timestamp may be its delete horizon: its max then)
                late = h.attributes & TIMESTAMP_TYPE_BIT or h.delete_horizon_ms is not None
                return TimestampAndOffset(h.base_offset, h.max_timestamp if late else h.base_timestamp)
            data = io.pread(seg.store_fd, h.size, position)
            try:
                records = decode_records(data)
            except BatchError as exc:
                raise CorruptBatchError(seg.store_path, position, str(exc)) from None
            for rec in records:
                assert rec.timestamp is not None
                if rec.timestamp >= timestamp:
                    return TimestampAndOffset(rec.offset, rec.timestamp)
            if h.dense:  # every record of a produced batch is there: its max timestamp must be too
                raise CorruptBatchError(seg.store_path, position, "index timestamp not found in the batch")
            # a cleaned batch keeps its max timestamp, not always the record that had it
    return None


def batch_headers(segments: list[Segment], io: FileIO, from_offset: int) -> Iterator[BatchHeader]:
    """`Log.batch_headers`, over the log's segments."""
    for seg in segments:
        if seg.next_offset <= from_offset:
            continue
        index = seg.index
        start = max(index.find_offset(from_offset - seg.base_offset), 0)
        for i in range(start, len(index)):
            data = io.pread(seg.store_fd, HEADER_SIZE, index.position(i))
            yield read_header(data)


def batches_and_markers(
    segments: list[Segment], io: FileIO, from_offset: int
) -> Iterator[tuple[BatchHeader, ControlRecord | None]]:
    """`Log.batches_and_markers`: `batch_headers`, each control batch with what its record says
    (a second pread of the batch, ~80 bytes: a marker's type is in its record, not its header).
    A control batch whose record does not read as one is named in the log and given as None:
    it ends no transaction, which a read that trips on it reports."""
    for seg in segments:
        if seg.next_offset <= from_offset:
            continue
        index = seg.index
        start = max(index.find_offset(from_offset - seg.base_offset), 0)
        known = seg.markers  # from its `.txnindex`, or kept since its appends
        # The markers read here become the segment's when the walk covers all of it.
        found: dict[int, MarkerEntry] | None = {} if known is None and start == 0 else None
        for i in range(start, len(index)):
            position = index.position(i)
            h = read_header(io.pread(seg.store_fd, HEADER_SIZE, position))
            control = None
            if h.control:
                entry = None if known is None else known.get(h.base_offset)
                if entry is not None:
                    control = ControlRecord(entry.type, entry.coordinator_epoch)
                else:
                    try:
                        control = control_of(io.pread(seg.store_fd, h.size, position))
                    except BatchError as exc:
                        log.error(
                            "%s at %d: a control batch that is no marker: %s", seg.store_path, position, exc
                        )
                        found = None
                    if found is not None and control is not None:
                        found[h.base_offset] = MarkerEntry(
                            h.base_offset, control.coordinator_epoch, control.type
                        )
            yield h, control
        if found is not None and seg.markers is None:
            seg.markers = found
