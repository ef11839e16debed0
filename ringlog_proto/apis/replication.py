"""Requests and responses between brokers: ReplicaFetch, a follower's fetch of every partition it
follows on one leader core.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from ringlog_proto.apis.body import (
    REQUEST_ARRAY_MAX,
    Reader,
    Request,
    Response,
    Writer,
    _error,
)
from ringlog_proto.apis.codes import ApiKey, ErrorCode
from ringlog_proto.frames import Buffer, Frame

NO_DIVERGENCE = -1  # a ReplicaFetch answer's diverging epoch and end offset when there is none


@dataclass(frozen=True, slots=True)
class ReplicaFetchPartition:
    # topic_id u32, partition u32, fetch_offset i64 (the follower's log end), last_fetched_epoch
    # i32 (the epoch of its last batch, -1 if none), current_leader_epoch i32
    topic_id: int
    partition: int
    fetch_offset: int
    last_fetched_epoch: int
    current_leader_epoch: int


_REPLICA_PARTITION = "IIqii"


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
        for p in self.partitions:
            w.pack(
                _REPLICA_PARTITION,
                p.topic_id,
                p.partition,
                p.fetch_offset,
                p.last_fetched_epoch,
                p.current_leader_epoch,
            )

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> ReplicaFetchRequest:
        node, wait, min_bytes, max_bytes = r.unpack("iiii")
        size = struct.calcsize(">" + _REPLICA_PARTITION)
        count = r.array(size, REQUEST_ARRAY_MAX)
        parts = tuple(ReplicaFetchPartition(*r.unpack(_REPLICA_PARTITION)) for _ in range(count))
        return cls(node, wait, min_bytes, max_bytes, parts)


@dataclass(frozen=True, slots=True)
class ReplicaFetchPartitionData:
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
        for p in self.partitions:
            w.pack(
                "IIhqqiq",
                p.topic_id,
                p.partition,
                p.error,
                p.high_watermark,
                p.log_start_offset,
                p.diverging_epoch,
                p.diverging_end_offset,
            ).bytes(p.records)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        parts = []
        for _ in range(r.array(42)):
            tid, index, error, hw, start, epoch, end, size = r.unpack("IIhqqiqI")
            # the records as a view of the answer's body, not a copy: the follower writes them
            parts.append(
                ReplicaFetchPartitionData(tid, index, _error(error), hw, start, epoch, end, r.view(size))
            )
        return {"partitions": tuple(parts)}
