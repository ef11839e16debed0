"""Our protocol's transaction messages: a transactional producer's (INIT_PRODUCER_ID,
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT, below), and two sent
only between brokers' cores (a client's is refused: broker/ringlog/adapter.py):

- WRITE_TXN_MARKERS: a transaction coordinator asks another core to write the markers of one
  transaction to the partitions and groups it owns. The answer is NONE once every named marker
  is written or dropped (a deleted topic's, a fenced one's), an error when any must be sent again.
- FIND_HELD_TXNS: the hanging-transaction sweep of one core asks another core's coordinator (of
  its node, or in a cluster of any node) whether it holds each (producer id, partition) open
  (broker/core/txn_sweep.py): one flag per question, in order, then the state partitions it has
  loaded; an error when it cannot tell (its state still loading).
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


# ----------------------------------------------------------------------------------- a client's
# A transactional producer's requests (KIP-98's, in our frames). None names a partition in its
# frame header: the broker sends each to the core coordinating its transactional id (or, for
# TXN_OFFSET_COMMIT, its group), as it does the group APIs.


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest(Request):
    # txn_id str, timeout_ms i32, producer_id i64, producer_epoch i16 (-1, -1: a new producer;
    # its current ones: KIP-360's bump after an abortable error)
    API_KEY: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID
    txn_id: str = ""
    timeout_ms: int = 60_000
    producer_id: int = -1
    producer_epoch: int = -1

    def write(self, w: Writer) -> None:
        w.str(self.txn_id).pack("iqh", self.timeout_ms, self.producer_id, self.producer_epoch)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> InitProducerIdRequest:
        return cls(r.str(), *r.unpack("iqh"))


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse(Response):
    # producer_id i64, producer_epoch i16
    API_KEY: ClassVar[ApiKey] = ApiKey.INIT_PRODUCER_ID
    producer_id: int = -1
    producer_epoch: int = -1

    def write(self, w: Writer) -> None:
        w.pack("qh", self.producer_id, self.producer_epoch)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        pid, epoch = r.unpack("qh")
        return {"producer_id": pid, "producer_epoch": epoch}


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnRequest(Request):
    # txn_id str, producer_id i64, producer_epoch i16, [topic_id u32, partition u32]
    API_KEY: ClassVar[ApiKey] = ApiKey.ADD_PARTITIONS_TO_TXN
    txn_id: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    partitions: tuple[tuple[int, int], ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.txn_id).pack("qh", self.producer_id, self.producer_epoch).array(len(self.partitions))
        for topic_id, partition in self.partitions:
            w.pack("II", topic_id, partition)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> AddPartitionsToTxnRequest:
        txn_id = r.str()
        pid, epoch = r.unpack("qh")
        n = r.array(8, REQUEST_ARRAY_MAX)
        return cls(txn_id, pid, epoch, tuple((r.int("I"), r.int("I")) for _ in range(n)))


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnResponse(Response):
    # (error and message only: the partitions are added all or none)
    API_KEY: ClassVar[ApiKey] = ApiKey.ADD_PARTITIONS_TO_TXN


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnRequest(Request):
    # txn_id str, producer_id i64, producer_epoch i16, group str
    API_KEY: ClassVar[ApiKey] = ApiKey.ADD_OFFSETS_TO_TXN
    txn_id: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    group_id: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.txn_id).pack("qh", self.producer_id, self.producer_epoch).str(self.group_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> AddOffsetsToTxnRequest:
        txn_id = r.str()
        pid, epoch = r.unpack("qh")
        return cls(txn_id, pid, epoch, r.str())


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnResponse(Response):
    # (error and message only)
    API_KEY: ClassVar[ApiKey] = ApiKey.ADD_OFFSETS_TO_TXN


@dataclass(frozen=True, slots=True)
class EndTxnRequest(Request):
    # txn_id str, producer_id i64, producer_epoch i16, commit u8
    API_KEY: ClassVar[ApiKey] = ApiKey.END_TXN
    txn_id: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    commit: bool = False

    def write(self, w: Writer) -> None:
        w.str(self.txn_id).pack("qhB", self.producer_id, self.producer_epoch, int(self.commit))

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> EndTxnRequest:
        txn_id = r.str()
        pid, epoch, commit = r.unpack("qhB")
        return cls(txn_id, pid, epoch, bool(commit))


@dataclass(frozen=True, slots=True)
class EndTxnResponse(Response):
    # (error and message only)
    API_KEY: ClassVar[ApiKey] = ApiKey.END_TXN


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitRequest(Request):
    # txn_id str, group str, producer_id i64, producer_epoch i16, generation i32, member_id str,
    # [topic_id u32, partition u32, offset i64, metadata str]
    API_KEY: ClassVar[ApiKey] = ApiKey.TXN_OFFSET_COMMIT
    txn_id: str = ""
    group: str = ""  # named `group` as every group request's: the adapter routes by it
    producer_id: int = -1
    producer_epoch: int = -1
    generation: int = -1  # -1 and no member: stored whatever the group's members (KIP-447)
    member_id: str = ""
    offsets: tuple[tuple[int, int, int, str], ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.txn_id).str(self.group)
        w.pack("qhi", self.producer_id, self.producer_epoch, self.generation).str(self.member_id)
        w.array(len(self.offsets))
        for topic_id, partition, offset, metadata in self.offsets:
            w.pack("IIq", topic_id, partition, offset).str(metadata)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> TxnOffsetCommitRequest:
        txn_id, group = r.str(), r.str()
        pid, epoch, generation = r.unpack("qhi")
        member_id = r.str()
        n = r.array(18, REQUEST_ARRAY_MAX)
        offsets = tuple((*r.unpack("IIq"), r.str()) for _ in range(n))
        return cls(txn_id, group, pid, epoch, generation, member_id, offsets)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitResponse(Response):
    # (error and message only: the offsets are kept pending all or none)
    API_KEY: ClassVar[ApiKey] = ApiKey.TXN_OFFSET_COMMIT


@dataclass(frozen=True, slots=True)
class FindHeldTxnsRequest(Request):
    # [producer_id i64, topic_id u32, partition u32]
    API_KEY: ClassVar[ApiKey] = ApiKey.FIND_HELD_TXNS
    questions: tuple[tuple[int, int, int], ...] = ()

    def write(self, w: Writer) -> None:
        w.array(len(self.questions))
        for pid, topic_id, partition in self.questions:
            w.pack("qII", pid, topic_id, partition)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> FindHeldTxnsRequest:
        n = r.array(16, REQUEST_ARRAY_MAX)
        return cls(tuple((r.int("q"), r.int("I"), r.int("I")) for _ in range(n)))


@dataclass(frozen=True, slots=True)
class FindHeldTxnsResponse(Response):
    # [held u8], one per question, in order; [loaded u32]: the state partitions the answering
    # coordinator has loaded (a cluster's sweep aborts only when every one is loaded somewhere)
    API_KEY: ClassVar[ApiKey] = ApiKey.FIND_HELD_TXNS
    held: tuple[bool, ...] = ()
    loaded: tuple[int, ...] = ()

    def write(self, w: Writer) -> None:
        w.array(len(self.held))
        for h in self.held:
            w.pack("B", int(h))
        w.array(len(self.loaded))
        for i in self.loaded:
            w.pack("I", i)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        n = r.array(1, REQUEST_ARRAY_MAX)
        held = tuple(bool(r.int("B")) for _ in range(n))
        k = r.array(4, REQUEST_ARRAY_MAX)
        return {"held": held, "loaded": tuple(r.int("I") for _ in range(k))}
