"""Requests and responses of the data path: Produce, Fetch and ListOffsets, the three APIs
about one partition's records (their topic and partition travel in the frame header).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ringlog_proto.apis.body import (
    MalformedBody,
    PartitionRequest,
    Reader,
    Response,
    Writer,
)
from ringlog_proto.apis.codes import PRODUCE_TRANSACTIONAL_VERSION, Acks, ApiKey, Isolation, OffsetSpec
from ringlog_proto.frames import Buffer, Frame


@dataclass(frozen=True, slots=True)
class ProduceRequest(PartitionRequest):
    # acks i8, timeout_ms i32, records bytes (one or more whole batches)
    API_KEY: ClassVar[ApiKey] = ApiKey.PRODUCE
    FIXED: ClassVar[str] = "bi"  # the fixed fields before records (the peeks in messages.py read them)
    _READ: ClassVar[str] = FIXED + "I"  # and the records' length: one unpack for all three
    acks: int = Acks.WRITTEN
    timeout_ms: int = 30_000
    # Decoded, a read-only view of the frame's body (`Reader.view`): the records are not copied
    # between the socket's bytes and the segment file's write.
    records: bytes | memoryview = b""
    # v2 (after the records: transactional_id str): the transaction the batches belong to, which
    # lets them be transactional (Kafka's Produce v3+); None: v1, no such field
    transactional_id: str | None = None

    def version(self) -> int | None:
        return None if self.transactional_id is None else PRODUCE_TRANSACTIONAL_VERSION

    def write(self, w: Writer) -> None:
        w.pack(self.FIXED, self.acks, self.timeout_ms).bytes(self.records)
        if self.transactional_id is not None:
            w.str(self.transactional_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> ProduceRequest:
        acks, timeout_ms, size = r.unpack(cls._READ)
        records = r.view(size)
        txn_id = r.str() if frame.api_version >= PRODUCE_TRANSACTIONAL_VERSION else None
        return cls(frame.topic_id, frame.partition, acks, timeout_ms, records, txn_id)


@dataclass(frozen=True, slots=True)
class FetchRequest(PartitionRequest):
    # offset i64, max_bytes i32, max_wait_ms i32, min_bytes i32; v2: isolation i8
    API_KEY: ClassVar[ApiKey] = ApiKey.FETCH
    FIXED: ClassVar[str] = "qiii"  # v1's whole body (the peeks in messages.py read parts of it)
    offset: int = 0
    max_bytes: int = 1024 * 1024
    max_wait_ms: int = 0
    min_bytes: int = 1
    isolation: int = Isolation.READ_UNCOMMITTED

    def write(self, w: Writer) -> None:
        w.pack(
            self.FIXED + "b", self.offset, self.max_bytes, self.max_wait_ms, self.min_bytes, self.isolation
        )

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> FetchRequest:
        offset, max_bytes, max_wait_ms, min_bytes = r.unpack(cls.FIXED)
        isolation = _isolation(r.int("b")) if frame.api_version >= 2 else Isolation.READ_UNCOMMITTED
        return cls(frame.topic_id, frame.partition, offset, max_bytes, max_wait_ms, min_bytes, isolation)


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest(PartitionRequest):
    # spec i64: -1 latest, -2 earliest, >= 0 a timestamp in ms; v2: isolation i8
    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    spec: int = OffsetSpec.LATEST
    isolation: int = Isolation.READ_UNCOMMITTED

    def write(self, w: Writer) -> None:
        w.pack("qb", self.spec, self.isolation)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> ListOffsetsRequest:
        spec = r.int("q")
        isolation = _isolation(r.int("b")) if frame.api_version >= 2 else Isolation.READ_UNCOMMITTED
        return cls(frame.topic_id, frame.partition, spec, isolation)


def _isolation(value: int) -> Isolation:
    try:
        return Isolation(value)
    except ValueError:
        raise MalformedBody(f"isolation {value}: 0 (read_uncommitted) or 1 (read_committed)") from None


@dataclass(frozen=True, slots=True)
class ProduceResponse(Response):
    # base_offset i64 (of the first batch), end_offset i64 (after the last), log_start i64
    API_KEY: ClassVar[ApiKey] = ApiKey.PRODUCE
    base_offset: int = -1
    end_offset: int = -1
    log_start_offset: int = -1

    def write(self, w: Writer) -> None:
        w.pack("qqq", self.base_offset, self.end_offset, self.log_start_offset)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        base, end, start = r.unpack("qqq")
        return {"base_offset": base, "end_offset": end, "log_start_offset": start}


@dataclass(frozen=True, slots=True)
class FetchResponse(Response):
    # high_watermark i64 (end of the log), log_start i64, v2: last_stable i64,
    # v2: aborted [producer_id i64, first_offset i64] (read_committed only), records bytes
    API_KEY: ClassVar[ApiKey] = ApiKey.FETCH
    high_watermark: int = -1
    log_start_offset: int = -1
    records: Buffer = b""  # as the server read it (a segment's pages, a read's buffer); bytes decoded
    last_stable_offset: int = -1
    aborted: tuple[tuple[int, int], ...] = ()
    # the layout written: the request's version (v1 has neither the last stable offset nor the list)
    layout: int = 2

    def write(self, w: Writer) -> None:
        w.pack("qq", self.high_watermark, self.log_start_offset)
        if self.layout >= 2:
            w.pack("q", self.last_stable_offset).array(len(self.aborted))
            for producer_id, first_offset in self.aborted:
                w.pack("qq", producer_id, first_offset)
        w.bytes(self.records)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        hw, start, lso = r.unpack("qqq")
        aborted = tuple((r.int("q"), r.int("q")) for _ in range(r.array(16)))
        return {
            "high_watermark": hw,
            "log_start_offset": start,
            "last_stable_offset": lso,
            "aborted": aborted,
            "records": r.bytes(),
        }


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse(Response):
    # offset i64 (-1 when no record is at or after the timestamp)
    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    offset: int = -1

    def write(self, w: Writer) -> None:
        w.pack("q", self.offset)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"offset": r.int("q")}
