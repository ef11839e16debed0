"""Requests and responses between brokers: ReplicaFetch, a follower's fetch of every partition it
follows on one leader core.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from ringlog_proto.apis.body import (
    REQUEST_ARRAY_MAX,
    MalformedBody,
    Reader,
    Request,
    Response,
    Writer,
    _error,
)
from ringlog_proto.apis.codes import ApiKey, ErrorCode
from ringlog_proto.frames import Buffer, Frame

NO_DIVERGENCE = -1  # a ReplicaFetch answer's diverging epoch and end offset when there is none


class ReplicaFetchPartition(NamedTuple):
    """A tuple, not a frozen dataclass: a follower makes one per partition it follows for every
    fetch, and a leader reads as many (a frozen dataclass's `__init__` sets each field through
    `object.__setattr__`)."""

    # topic_id u32, partition u32, fetch_offset i64 (the follower's log end), last_fetched_epoch
    # i32 (the epoch of its last batch, -1 if none), current_leader_epoch i32
    topic_id: int
    partition: int
    fetch_offset: int
    last_fetched_epoch: int
    current_leader_epoch: int


_REPLICA_PARTITION = struct.Struct(">IIqii")


@dataclass(frozen=True, slots=True)
class ReplicaFetchRequest(Request):
    # replica_node i32, max_wait_ms i32, min_bytes i32, max_bytes i32,
    # partitions array<ReplicaFetchPartition>
    # (a follower's fetch from one leader core, every partition it follows there)
    API_KEY: ClassVar[ApiKey] = ApiKey.REPLICA_FETCH
    replica_node: int = -1
    max_wait_ms: int = 0
    min_bytes: int = 1
    max_bytes: int = 8 << 20
    partitions: tuple[ReplicaFetchPartition, ...] = ()

    def write(self, w: Writer) -> None:
        w.pack("iiii", self.replica_node, self.max_wait_ms, self.min_bytes, self.max_bytes)
        w.array(len(self.partitions))
        pack = _REPLICA_PARTITION.pack
        w.parts += [pack(*p) for p in self.partitions]

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> ReplicaFetchRequest:
        node, wait, min_bytes, max_bytes = r.unpack("iiii")
        size = _REPLICA_PARTITION.size
        count = r.array(size, REQUEST_ARRAY_MAX)
        fixed = r.view(count * size)  # `array` checked that the body holds them
        parts = tuple(map(ReplicaFetchPartition._make, _REPLICA_PARTITION.iter_unpack(fixed)))
        return cls(node, wait, min_bytes, max_bytes, parts)


class ReplicaFetchPartitionData(NamedTuple):
    """A tuple, as `ReplicaFetchPartition`: a leader makes up to three of each for an answer."""

    # topic_id u32, partition u32, error i16, high_watermark i64, log_start i64,
    # diverging_epoch i32, diverging_end_offset i64 (both -1: no divergence), records bytes
    topic_id: int
    partition: int
    error: ErrorCode = ErrorCode.NONE
    high_watermark: int = -1
    log_start_offset: int = -1
    diverging_epoch: int = NO_DIVERGENCE
    diverging_end_offset: int = NO_DIVERGENCE
    records: Buffer = b""  # as the leader read it (a segment's pages, a read's buffer); decoded: a view


@dataclass(frozen=True, slots=True)
class ReplicaFetchResponse(Response):
    # partitions array<ReplicaFetchPartitionData>, in the request's order
    API_KEY: ClassVar[ApiKey] = ApiKey.REPLICA_FETCH
    partitions: tuple[ReplicaFetchPartitionData, ...] = ()

    def write(self, w: Writer) -> None:
        w.array(len(self.partitions))
        parts, pack = w.parts, _PARTITION_DATA_HEAD.pack
        for p in self.partitions:  # as Writer.pack and Writer.bytes would, without their calls
            records = p.records
            parts.append(pack(*p[:7], len(records)))
            parts.append(records)  # kept as is: no copy of record data

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"partitions": _partitions_of(r)}


def read_answer(body: bytes | memoryview) -> ReplicaFetchResponse | None:
    """A successful ReplicaFetch answer (no error, no message) read at once, without the generic
    decode's error enum, message and keyword arguments: a follower reads one for every round
    trip, acks=all waits on it. None for any other body (an error answer: the generic decode
    reads it)."""
    if len(body) < _OK_HEAD.size:
        return None
    error, message_length = _OK_HEAD.unpack_from(body)
    if error or message_length:
        return None
    r = Reader(body)
    r.pos = _OK_HEAD.size
    parts = _partitions_of(r)
    r.done()
    return ReplicaFetchResponse(ErrorCode.NONE, "", parts)


def _partitions_of(r: Reader) -> tuple[ReplicaFetchPartitionData, ...]:
    """An answer's array of partitions, from where `r` stands, their records views of its body,
    not copies (the follower writes them). Read by hand, not through `Reader`'s calls: an answer
    names every partition the follower fetched, a thousand or more when it follows that many on
    the core."""
    count = r.array(_PARTITION_DATA_HEAD.size)
    body, pos = r.buf, r.pos
    size = len(body)
    view = memoryview(body)
    unpack, head = _PARTITION_DATA_HEAD.unpack_from, _PARTITION_DATA_HEAD.size
    parts = []
    for _ in range(count):
        if size - pos < head:
            raise MalformedBody(f"body ends at byte {size}, a partition needs {head} from {pos}")
        tid, index, error, hw, start, epoch, end, length = unpack(body, pos)
        pos += head
        if size - pos < length:
            raise MalformedBody(f"records of {length} bytes at byte {pos} run past the body")
        code = ErrorCode.NONE if error == 0 else _error(error)
        parts.append(
            ReplicaFetchPartitionData(tid, index, code, hw, start, epoch, end, view[pos : pos + length])
        )
        pos += length
    r.pos = pos
    return tuple(parts)


# A partition's fields in a ReplicaFetch answer, up to the length of its records; and the answer's
# head when it succeeded: its error (0) and its message's length (0).
_PARTITION_DATA_HEAD = struct.Struct(">IIhqqiqI")
_OK_HEAD = struct.Struct(">hH")
