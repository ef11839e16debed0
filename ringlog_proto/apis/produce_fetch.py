"""Requests and responses of the data path: Produce, Fetch and ListOffsets, the three APIs
about one partition's records (their topic and partition travel in the frame header).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ringlog_proto.apis.body import (
    PartitionRequest,
    Reader,
    Response,
    Writer,
)
from ringlog_proto.apis.codes import Acks, ApiKey, OffsetSpec
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

    def write(self, w: Writer) -> None:
        w.pack(self.FIXED, self.acks, self.timeout_ms).bytes(self.records)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> ProduceRequest:
        acks, timeout_ms, size = r.unpack(cls._READ)
        return cls(frame.topic_id, frame.partition, acks, timeout_ms, r.view(size))


@dataclass(frozen=True, slots=True)
class FetchRequest(PartitionRequest):
    # offset i64, max_bytes i32, max_wait_ms i32, min_bytes i32
    API_KEY: ClassVar[ApiKey] = ApiKey.FETCH
    FIXED: ClassVar[str] = "qiii"  # the whole body (the peeks in messages.py read parts of it)
    offset: int = 0
    max_bytes: int = 1024 * 1024
    max_wait_ms: int = 0
    min_bytes: int = 1

    def write(self, w: Writer) -> None:
        w.pack(self.FIXED, self.offset, self.max_bytes, self.max_wait_ms, self.min_bytes)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> FetchRequest:
        return cls(frame.topic_id, frame.partition, *r.unpack(cls.FIXED))


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest(PartitionRequest):
    # spec i64: -1 latest, -2 earliest, >= 0 a timestamp in ms
    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    spec: int = OffsetSpec.LATEST

    def write(self, w: Writer) -> None:
        w.pack("q", self.spec)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> ListOffsetsRequest:
        return cls(frame.topic_id, frame.partition, r.int("q"))


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
    # high_watermark i64 (end of the log), log_start i64, records bytes (whole batches)
    API_KEY: ClassVar[ApiKey] = ApiKey.FETCH
    high_watermark: int = -1
    log_start_offset: int = -1
    records: Buffer = b""  # as the server read it (a segment's pages, a read's buffer); bytes decoded

    def write(self, w: Writer) -> None:
        w.pack("qq", self.high_watermark, self.log_start_offset).bytes(self.records)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        hw, start = r.unpack("qq")
        return {"high_watermark": hw, "log_start_offset": start, "records": r.bytes()}


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
