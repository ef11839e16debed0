"""Our protocol's transaction messages: WRITE_TXN_MARKERS, how a transaction coordinator asks
another core to write the markers of one transaction to the partitions and groups it owns.

Sent only between cores of a node (a client's is refused: broker/ringlog/adapter.py). The answer
is NONE once every named marker is written or dropped (a deleted topic's, a fenced one's),
an error when any must be sent again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ringlog_proto.apis.body import REQUEST_ARRAY_MAX, Reader, Request, Response, Writer
from ringlog_proto.apis.codes import ApiKey
from ringlog_proto.frames import Frame


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersRequest(Request):
    # producer_id i64, producer_epoch i16, coordinator_epoch i32, commit u8,
    # [topic_id u32, partition u32], [group str]
    API_KEY: ClassVar[ApiKey] = ApiKey.WRITE_TXN_MARKERS
    producer_id: int = -1
    producer_epoch: int = -1
    coordinator_epoch: int = 0
    commit: bool = False
    partitions: tuple[tuple[int, int], ...] = ()
    groups: tuple[str, ...] = ()
    txn_id: str = ""  # for the target's log lines only

    def write(self, w: Writer) -> None:
        w.pack("qhiB", self.producer_id, self.producer_epoch, self.coordinator_epoch, int(self.commit))
        w.array(len(self.partitions))
        for topic_id, partition in self.partitions:
            w.pack("II", topic_id, partition)
        w.array(len(self.groups))
        for group in self.groups:
            w.str(group)
        w.str(self.txn_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> WriteTxnMarkersRequest:
        pid, epoch, coordinator_epoch, commit = r.unpack("qhiB")
        n = r.array(8, REQUEST_ARRAY_MAX)
        partitions = tuple((r.int("I"), r.int("I")) for _ in range(n))
        n = r.array(2, REQUEST_ARRAY_MAX)
        groups = tuple(r.str() for _ in range(n))
        return cls(pid, epoch, coordinator_epoch, bool(commit), partitions, groups, r.str())


@dataclass(frozen=True, slots=True)
class WriteTxnMarkersResponse(Response):
    # (error and message only)
    API_KEY: ClassVar[ApiKey] = ApiKey.WRITE_TXN_MARKERS
