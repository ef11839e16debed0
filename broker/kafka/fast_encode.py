"""Produce and Fetch responses written by hand, the two answers on the hot path, and Metadata's,
whose topic entries are kept between requests (broker/kafka/metadata_entries.py).

Rules this module keeps:
- Only the versions we serve: Produce v3-8, Fetch v4-11 (non-flexible), Metadata v0-12
  (`PRODUCE_VERSIONS`, `FETCH_VERSIONS`, `METADATA_VERSIONS`). Every other response, and every
  request, goes through kio (codec.py), which stays the reference: tests/kafka/test_fast_encode.py
  and test_metadata_entries.py compare these bytes with kio's for every version, over random
  inputs too. Why by hand: kio decodes in native code (about 1 us for a
  one-partition Produce request) but encodes in Python, 14 us for a one-partition Produce
  response and most of the time of a Fetch response, which it also copies twice (the records into
  its buffer, the buffer into bytes).
- Each function returns the framed response as buffers for the backend's vectored write: the size,
  the response header v0 (correlation id) and the body. A Fetch's record bytes are their own
  buffers, never copied (the stored batches as read, sent as they are).
- Fields we never vary are written with kio's defaults for them: preferred_read_replica -1
  (Fetch v11), throttle time 0. A Produce's log_append_time is -1 but for a topic whose timestamps
  are the broker's (LogAppendTime): the time it stamped; its record errors (v8) are none but for a
  batch refused for some of its records (a compacted topic's records without a key).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from ringlog_proto.frames import Buffer

PRODUCE_VERSIONS: Final = (3, 8)
FETCH_VERSIONS: Final = (4, 11)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">ii")  # size, correlation id
_NULL_STRING: Final = b"\xff\xff"
_NULL_ARRAY: Final = b"\xff\xff\xff\xff"
_EMPTY_ARRAY: Final = b"\0\0\0\0"
_THROTTLE_NONE: Final = b"\0\0\0\0"
_NO_REPLICA: Final = b"\xff\xff\xff\xff"  # preferred_read_replica -1
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset

# Produce partition: index, error code, base offset, log append time, then v5+ log start offset
_PRODUCE_PART_V3 = struct.Struct(">ihqq")
_PRODUCE_PART_V5 = struct.Struct(">ihqqq")
# Fetch partition: index, error code, high watermark, last stable offset, then v5+ log start offset
_FETCH_PART_V4 = struct.Struct(">ihqq")
_FETCH_PART_V5 = struct.Struct(">ihqqq")
_FETCH_HEAD_V4 = struct.Struct(">iii")  # size, correlation id, throttle
_FETCH_HEAD_V7 = struct.Struct(">iiihi")  # size, correlation id, throttle, error code, session id
_COPY_MAX: Final = 256  # records up to this many bytes are copied: cheaper than a buffer of their own

# (index, error code, base offset, log start offset, error message, log append time (-1: none),
# record errors: (index in the batch, message) of each record that refused it)
RecordErrors = Sequence[tuple[int, str | None]]
ProducePartition = tuple[int, int, int, int, str | None, int, RecordErrors]
# (index, error code, high watermark, last stable offset, log start offset, aborted, records):
# aborted None (read_uncommitted) or (producer id, first offset) pairs; records None or the
# stored batches as read (bytes, a read's bytearray or a view of a segment's pages)
FetchPartition = tuple[int, int, int, int, int, Sequence[tuple[int, int]] | None, Buffer | None]


def _string(out: bytearray, value: str) -> None:
    raw = value.encode()
    out += _I16.pack(len(raw))
    out += raw


def produce_response(
    version: int, correlation_id: int, topics: Sequence[tuple[str, Sequence[ProducePartition]]]
) -> list[bytes]:
    """The framed Produce response of `version` (3-8): one buffer."""
    assert PRODUCE_VERSIONS[0] <= version <= PRODUCE_VERSIONS[1], f"Produce v{version}"
    out = bytearray(8)
    out += _I32.pack(len(topics))
    v5 = version >= 5
    v8 = version >= 8
    for name, partitions in topics:
        _string(out, name)
        out += _I32.pack(len(partitions))
        for index, code, base_offset, log_start, message, append_time, record_errors in partitions:
            if v5:
                out += _PRODUCE_PART_V5.pack(index, code, base_offset, append_time, log_start)
            else:
                out += _PRODUCE_PART_V3.pack(index, code, base_offset, append_time)
            if v8:
                if not record_errors:
                    out += _EMPTY_ARRAY
                else:
                    out += _I32.pack(len(record_errors))
                    for batch_index, why in record_errors:
                        out += _I32.pack(batch_index)
                        if why is None:
                            out += _NULL_STRING
                        else:
                            _string(out, why)
                if message is None:
                    out += _NULL_STRING
                else:
                    _string(out, message)
    out += _THROTTLE_NONE
    _HEAD.pack_into(out, 0, len(out) - 4, correlation_id)
    return [bytes(out)]


def fetch_response(
    version: int,
    correlation_id: int,
    error_code: int,
    session_id: int,
    topics: Sequence[tuple[str, Sequence[FetchPartition]]],
) -> list[Buffer]:
    """The framed Fetch response of `version` (4-11): the fields around the records in small
    buffers, each partition's records as the buffer it was given."""
    assert FETCH_VERSIONS[0] <= version <= FETCH_VERSIONS[1], f"Fetch v{version}"
    v5 = version >= 5
    v11 = version >= 11
    v7 = version >= 7
    head = bytearray(_FETCH_HEAD_V7.size if v7 else _FETCH_HEAD_V4.size)  # packed at the end
    out: list[Buffer] = [b""]  # out[0]: the head, once the size is known
    cur = head
    cur += _I32.pack(len(topics))
    total = 0  # bytes in `out` after the head
    for name, partitions in topics:
        _string(cur, name)
        cur += _I32.pack(len(partitions))
        for index, code, high, stable, log_start, aborted, records in partitions:
            if v5:
                cur += _FETCH_PART_V5.pack(index, code, high, stable, log_start)
            else:
                cur += _FETCH_PART_V4.pack(index, code, high, stable)
            if aborted is None:
                cur += _NULL_ARRAY
            else:
                cur += _I32.pack(len(aborted))
                for producer_id, first_offset in aborted:
                    cur += _ABORTED.pack(producer_id, first_offset)
            if v11:
                cur += _NO_REPLICA
            if records is None:
                cur += _NULL_ARRAY
                continue
            cur += _I32.pack(len(records))
            if len(records) <= _COPY_MAX:
                cur += records
                continue
            if cur is not head:
                out.append(bytes(cur))
                total += len(cur)
            out.append(records)
            total += len(records)
            cur = bytearray()
    if cur is not head and cur:
        out.append(bytes(cur))
        total += len(cur)
    if v7:
        _FETCH_HEAD_V7.pack_into(head, 0, len(head) + total - 4, correlation_id, 0, error_code, session_id)
    else:
        _FETCH_HEAD_V4.pack_into(head, 0, len(head) + total - 4, correlation_id, 0)
    out[0] = bytes(head)
    return out


# ------------------------------------------------------------------------------------ Metadata

METADATA_VERSIONS: Final = (0, 12)
# (error code, index, leader id, leader epoch, replica ids, in-sync ids, offline ids)
MetadataPartition = tuple[int, int, int, int, Sequence[int], Sequence[int], Sequence[int]]
MetadataBroker = tuple[int, str, int, str | None]  # broker id, host, port, rack
OPERATIONS_OMITTED: Final = -(2**31)  # Kafka's "authorized operations not asked for"
_UUID_NONE: Final = bytes(16)
_PARTITION_HEAD = struct.Struct(">hii")  # error code, index, leader id
_PARTITION_HEAD_V7 = struct.Struct(">hiii")  # ... and leader epoch


def metadata_layout(version: int) -> int:
    """The first version of those whose topic entries are the same bytes as `version`'s: an
    entry encoded for one serves them all (v1-4: is_internal; v5-6: offline replicas; v7: leader
    epochs; v8: the topic's authorized operations; v9: flexible; v10-12: topic ids)."""
    for first in (10, 9, 8, 7, 5, 1):
        if version >= first:
            return first
    return 0


def _uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _meta_string(out: bytearray, value: str | None, flexible: bool) -> None:
    if value is None:
        out += b"\0" if flexible else _NULL_STRING
        return
    raw = value.encode()
    if flexible:
        _uvarint(out, len(raw) + 1)
    else:
        out += _I16.pack(len(raw))
    out += raw


def _ids(ids: Sequence[int], flexible: bool) -> bytes:
    out = bytearray()
    n = len(ids)
    if flexible:
        _uvarint(out, n + 1)
    else:
        out += _I32.pack(n)
    out += struct.pack(f">{n}i", *ids)
    return bytes(out)


def metadata_topic(
    version: int,
    error_code: int,
    name: str | None,
    topic_id: bytes | None,
    is_internal: bool,
    partitions: Sequence[MetadataPartition],
    operations: int = OPERATIONS_OMITTED,
) -> bytes:
    """One topic entry of a Metadata response of `version` (the same bytes for every version of
    its `metadata_layout`): `topic_id` the 16 bytes of its UUID (None: the zero UUID)."""
    flexible = version >= 9
    out = bytearray(_I16.pack(error_code))
    _meta_string(out, name, flexible)
    if version >= 10:
        out += topic_id or _UUID_NONE
    if version >= 1:
        out.append(1 if is_internal else 0)
    if flexible:
        _uvarint(out, len(partitions) + 1)
    else:
        out += _I32.pack(len(partitions))
    epochs, offline = version >= 7, version >= 5
    arrays: dict[tuple[int, ...], bytes] = {}  # a topic's partitions share a few replica sets
    for code, index, leader, epoch, replicas, isr, gone in partitions:
        if epochs:
            out += _PARTITION_HEAD_V7.pack(code, index, leader, epoch)
        else:
            out += _PARTITION_HEAD.pack(code, index, leader)
        for ids in (replicas, isr, gone) if offline else (replicas, isr):
            key = tuple(ids)
            packed = arrays.get(key)
            if packed is None:
                packed = arrays[key] = _ids(key, flexible)
            out += packed
        if flexible:
            out.append(0)  # no tagged fields
    if version >= 8:
        out += _I32.pack(operations)
    if flexible:
        out.append(0)
    return bytes(out)


def with_operations(version: int, entry: bytes, operations: int) -> bytes:
    """`entry` (a `metadata_topic` of `version`, 8+) with its authorized operations replaced."""
    tail = 5 if version >= 9 else 4
    return entry[:-tail] + _I32.pack(operations) + entry[len(entry) - tail + 4 :]


def metadata_response(
    version: int,
    correlation_id: int,
    brokers: Sequence[MetadataBroker],
    cluster_id: str | None,
    controller_id: int,
    topics: Sequence[bytes],
    cluster_operations: int = OPERATIONS_OMITTED,
) -> list[bytes]:
    """The framed Metadata response of `version` (0-12), its topics the entries given (each a
    `metadata_topic` of this version's layout): one buffer."""
    assert METADATA_VERSIONS[0] <= version <= METADATA_VERSIONS[1], f"Metadata v{version}"
    flexible = version >= 9
    out = bytearray(8)
    if flexible:
        out.append(0)  # response header v1: no tagged fields
    if version >= 3:
        out += _THROTTLE_NONE
    if flexible:
        _uvarint(out, len(brokers) + 1)
    else:
        out += _I32.pack(len(brokers))
    for broker_id, host, port, rack in brokers:
        out += _I32.pack(broker_id)
        _meta_string(out, host, flexible)
        out += _I32.pack(port)
        if version >= 1:
            _meta_string(out, rack, flexible)
        if flexible:
            out.append(0)
    if version >= 2:
        _meta_string(out, cluster_id, flexible)
    if version >= 1:
        out += _I32.pack(controller_id)
    if flexible:
        _uvarint(out, len(topics) + 1)
    else:
        out += _I32.pack(len(topics))
    tail = bytearray()
    if 8 <= version <= 10:
        tail += _I32.pack(cluster_operations)
    if flexible:
        tail.append(0)
    _HEAD.pack_into(out, 0, len(out) + sum(map(len, topics)) + len(tail) - 4, correlation_id)
    return [b"".join([out, *topics, tail])]
