"""Requests and responses of every API, and the one table of wire error codes. Sans-I/O.

Rules this module keeps:
- One request type and one response type per API, frozen slotted dataclasses. `encode_*` returns
  buffers (a list, so that record bytes are never copied into a frame: send them with writev);
  `decode_*` takes a `Frame` from frames.py.
- A body that does not parse is a `MalformedBody`: the frame was delimited correctly, so the
  broker *answers* it (INVALID_REQUEST) and keeps the connection; see frames.ProtocolError for the
  case where it cannot.
- Every response body starts with `error_code i16, error_message str`. When the error code is not
  NONE the body ends there; clients read the rest only on success.

Body primitives (big-endian): i8 i16 i32 i64 u16 u32 as usual; `str` = u16 length + UTF-8;
`bytes` = u32 length + raw bytes; `array<T>` = u32 count + T repeated. The layouts per API are in
docs/PROTOCOL.md and in each class's `_FIELDS` comment.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, NamedTuple

from ringlog_proto.batch import encode_batch_framed
from ringlog_proto.frames import (
    FLAG_RESPONSE,
    FRAME_VERSION,
    LENGTH_SIZE,
    MAGIC,
    Frame,
    encode_header,
    frame_struct,
)
from ringlog_proto.record import Record

API_VERSION = 1  # the version of every API that has never changed its layout


class ApiKey(IntEnum):
    API_VERSIONS = 0
    METADATA = 1
    CREATE_TOPIC = 2
    DELETE_TOPIC = 3
    PRODUCE = 4
    FETCH = 5
    LIST_OFFSETS = 6
    OFFSET_COMMIT = 7
    OFFSET_FETCH = 8
    STATS = 9
    JOIN_GROUP = 10
    SYNC_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    REPLICA_FETCH = 14
    SASL_HANDSHAKE = 15
    SASL_AUTHENTICATE = 16


# The current layout version of each API (requests and responses of one API share it). A change of
# an API's body layout bumps its version here and in docs/PROTOCOL.md; the broker speaks only the
# current version (clients and broker ship together) and answers others UNSUPPORTED_VERSION, so a
# stale peer fails clearly instead of misreading bytes.
CURRENT_VERSIONS: dict[int, int] = {key: API_VERSION for key in ApiKey}
CURRENT_VERSIONS[ApiKey.METADATA] = (
    3  # v2: each core's direct port; v3: the cluster's nodes, leaders, replicas
)
CURRENT_VERSIONS[ApiKey.CREATE_TOPIC] = 2  # v2: replication factor
CURRENT_VERSIONS[ApiKey.OFFSET_COMMIT] = 2  # v2: generation and member id (group membership)


class ErrorCode(IntEnum):
    """Wire error codes. The broker maps every exception to one of these at one place."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = 1
    INVALID_REQUEST = 2  # the body did not parse, or a field is out of range
    UNSUPPORTED_VERSION = 3  # unknown api key or api version
    UNKNOWN_TOPIC_OR_PARTITION = 4
    TOPIC_ALREADY_EXISTS = 5
    INVALID_TOPIC = 6  # bad name or partition count
    INVALID_CONFIG = 7
    CORRUPT_MESSAGE = 8  # a produced batch failed validation (crc, lengths, counts)
    MESSAGE_TOO_LARGE = 9  # a produced batch exceeds max_batch_bytes
    OFFSET_OUT_OF_RANGE = 10
    STORAGE_ERROR = 11  # disk I/O failed, or stored data is damaged (corrupt on read)
    REQUEST_TIMED_OUT = 12
    OUT_OF_ORDER_SEQUENCE = 13  # idempotent producer: a gap in sequence numbers
    INVALID_GROUP = 14
    NOT_OWNER = 15  # the partition is owned by another core and could not be forwarded
    BROKER_SHUTTING_DOWN = 16
    INVALID_BATCH = 17  # crc checks out but the record framing inside does not (lengths, counts)
    LIMIT_EXCEEDED = 18  # the request would pass a documented broker limit (docs/LIMITS.md)
    OUT_OF_SPACE = 19  # the disk is full: writes are refused until space is freed, reads still work
    REBALANCE_IN_PROGRESS = 20  # the group is rebalancing: rejoin (JoinGroup) to get an assignment
    ILLEGAL_GENERATION = 21  # a generation the group has moved past: rejoin
    UNKNOWN_MEMBER_ID = 22  # the coordinator does not know this member (expired, left): rejoin as new
    INCONSISTENT_GROUP_PROTOCOL = 23  # no assignor, or not the group's protocol type, shared by all
    NOT_ENOUGH_REPLICAS = 24  # acks=all with fewer in-sync replicas than min_insync: nothing stored
    SASL_AUTHENTICATION_FAILED = 25  # wrong credentials (a generic message): the connection closes
    UNSUPPORTED_SASL_MECHANISM = 26  # a mechanism this listener does not offer (the message lists them)
    ILLEGAL_SASL_STATE = 27  # a SASL request out of order, or on a listener without SASL
    TOPIC_AUTHORIZATION_FAILED = 28  # the ACLs refuse this principal the operation on the topic
    GROUP_AUTHORIZATION_FAILED = 29  # ... on the consumer group
    CLUSTER_AUTHORIZATION_FAILED = 30  # ... on the cluster

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE


_RETRIABLE = frozenset(
    {
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NOT_OWNER,
        ErrorCode.BROKER_SHUTTING_DOWN,
        ErrorCode.STORAGE_ERROR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
    }
)


class Acks(IntEnum):
    """When a produce is acknowledged. What each promises is stated in docs/STORAGE.md."""

    NONE = 0  # no response at all
    WRITTEN = 1  # after the write reached the page cache: survives a broker crash
    DURABLE = 2  # after fdatasync (group commit): survives a power loss
    ALL = -1  # after every in-sync replica has it (the high watermark passed it); unreplicated: DURABLE


class OffsetSpec(IntEnum):
    LATEST = -1
    EARLIEST = -2


class MalformedBody(Exception):
    """A frame whose body does not parse; answerable with INVALID_REQUEST."""


# ------------------------------------------------------------------------------------ primitives


class Writer:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def pack(self, fmt: str, *values: int) -> Writer:
        self.parts.append(_struct(fmt).pack(*values))
        return self

    def str(self, s: str) -> Writer:
        b = s.encode()
        if len(b) > 0xFFFF:
            raise ValueError(f"string of {len(b)} bytes does not fit a u16 length")
        self.parts.append(struct.pack(">H", len(b)))
        self.parts.append(b)
        return self

    def bytes(self, b: bytes | bytearray | memoryview) -> Writer:
        self.parts.append(struct.pack(">I", len(b)))
        self.parts.append(b)  # type: ignore[arg-type]  # kept as is: no copy of record data
        return self

    def array(self, n: int) -> Writer:
        return self.pack("I", n)


@functools.cache
def _struct(fmt: str) -> struct.Struct:
    return struct.Struct(">" + fmt)


class Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> tuple[int, ...]:
        s = _struct(fmt)
        if len(self.buf) - self.pos < s.size:
            raise MalformedBody(
                f"body ends at byte {len(self.buf)}, field needs {s.size} more from {self.pos}"
            )
        values = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return values

    def int(self, fmt: str) -> int:
        return self.unpack(fmt)[0]

    def str(self) -> str:
        n = self.int("H")
        raw = self._take(n)
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise MalformedBody(f"string at byte {self.pos - n} is not UTF-8") from exc

    def bytes(self) -> bytes:
        return self._take(self.int("I"))

    def view(self, n: int) -> memoryview:
        """The next `n` bytes as a view of the body, not a copy: for record data, the bulk of a
        request, which a slice of `bytes` would copy once more (a 64 KiB memmove per produced
        batch). The caller has read the field's length (with the fields before it, in one unpack)."""
        if len(self.buf) - self.pos < n:
            raise MalformedBody(f"field of {n} bytes at byte {self.pos} runs past the body")
        start = self.pos
        self.pos = start + n
        return memoryview(self.buf)[start : start + n]

    def array(self, item_min_bytes: int = 1, max_items: int | None = None) -> int:
        n = self.int("I")
        if n * item_min_bytes > len(self.buf) - self.pos:
            raise MalformedBody(f"array of {n} items cannot fit in the {len(self.buf) - self.pos} bytes left")
        if max_items is not None and n > max_items:
            raise MalformedBody(f"array of {n} items: a request's arrays hold at most {max_items}")
        return n

    def _take(self, n: int) -> bytes:
        return bytes(self.view(n))

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise MalformedBody(f"{len(self.buf) - self.pos} unexpected bytes after the body")


# ------------------------------------------------------------------------------------ requests

# Items one array of a request may hold (topic names, protocols, assignments, partitions): what a
# client names exists (the broker's partitions are bounded, --max-partitions), and a request of
# 8 MiB of names held its core for seconds (docs/LIMITS.md). More: INVALID_REQUEST.
REQUEST_ARRAY_MAX = 16_384


@dataclass(frozen=True, slots=True)
class Request:
    API_KEY: ClassVar[ApiKey]
    PARTITIONED: ClassVar[bool] = False

    def write(self, w: Writer) -> None:
        raise NotImplementedError

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> Request:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class PartitionRequest(Request):
    """A request about one partition; its identity travels in the frame header, not the body."""

    PARTITIONED: ClassVar[bool] = True
    topic_id: int = 0
    partition: int = 0


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest(Request):
    # client_name str
    API_KEY: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    client_name: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.client_name)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> ApiVersionsRequest:
        return cls(r.str())


@dataclass(frozen=True, slots=True)
class MetadataRequest(Request):
    # topics array<str>: empty means all topics
    API_KEY: ClassVar[ApiKey] = ApiKey.METADATA
    topics: tuple[str, ...] = ()

    def write(self, w: Writer) -> None:
        w.array(len(self.topics))
        for t in self.topics:
            w.str(t)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> MetadataRequest:
        return cls(tuple(r.str() for _ in range(r.array(2, REQUEST_ARRAY_MAX))))


@dataclass(frozen=True, slots=True)
class CreateTopicRequest(Request):
    # name str, partitions u32, retention_ms i64, retention_bytes i64, segment_bytes i64,
    # replication i16 (-1 = the broker's default; retention -2 = keep forever)
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    name: str = ""
    partitions: int = 1
    retention_ms: int = -1
    retention_bytes: int = -1
    segment_bytes: int = -1
    replication: int = -1  # (v2) replicas per partition; -1 = the broker's default (one node: 1)

    def write(self, w: Writer) -> None:
        w.str(self.name).pack(
            "Iqqqh",
            self.partitions,
            self.retention_ms,
            self.retention_bytes,
            self.segment_bytes,
            self.replication,
        )

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> CreateTopicRequest:
        return cls(r.str(), *r.unpack("Iqqqh"))


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest(Request):
    # name str
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC
    name: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.name)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> DeleteTopicRequest:
        return cls(r.str())


@dataclass(frozen=True, slots=True)
class ProduceRequest(PartitionRequest):
    # acks i8, timeout_ms i32, records bytes (one or more whole batches)
    API_KEY: ClassVar[ApiKey] = ApiKey.PRODUCE
    FIXED: ClassVar[str] = "bi"  # the fixed fields before records (the peeks below read them)
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
    FIXED: ClassVar[str] = "qiii"  # the whole body (the peeks below read parts of it)
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
class OffsetCommitRequest(PartitionRequest):
    # group str, offset i64, metadata str, generation i32, member_id str
    # (generation -1 and member "": a commit outside group membership, refused while the group
    # has members; a member commits with the generation it joined)
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    group: str = ""
    offset: int = 0
    metadata: str = ""
    generation: int = -1
    member_id: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.group).pack("q", self.offset).str(self.metadata).pack("i", self.generation)
        w.str(self.member_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> OffsetCommitRequest:
        group, offset, metadata = r.str(), r.int("q"), r.str()
        return cls(frame.topic_id, frame.partition, group, offset, metadata, r.int("i"), r.str())


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest(PartitionRequest):
    # group str
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    group: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.group)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> OffsetFetchRequest:
        return cls(frame.topic_id, frame.partition, r.str())


@dataclass(frozen=True, slots=True)
class GroupProtocol:
    """One assignor a member can use (Kafka's "range", "roundrobin"...) and what it says about
    the member under it (Kafka's consumer protocol: its subscription)."""

    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupRequest(Request):
    # group str, member_id str ("" on a first join), session_timeout_ms i32, rebalance_timeout_ms i32,
    # protocol_type str, protocols array<name str, metadata bytes>
    API_KEY: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    group: str = ""
    member_id: str = ""
    session_timeout_ms: int = 45_000
    rebalance_timeout_ms: int = 300_000
    protocol_type: str = "consumer"
    protocols: tuple[GroupProtocol, ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.group).str(self.member_id).pack("ii", self.session_timeout_ms, self.rebalance_timeout_ms)
        w.str(self.protocol_type).array(len(self.protocols))
        for p in self.protocols:
            w.str(p.name).bytes(p.metadata)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> JoinGroupRequest:
        group, member = r.str(), r.str()
        session, rebalance = r.unpack("ii")
        kind = r.str()
        protocols = tuple(GroupProtocol(r.str(), r.bytes()) for _ in range(r.array(6, REQUEST_ARRAY_MAX)))
        return cls(group, member, session, rebalance, kind, protocols)


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class SyncGroupRequest(Request):
    # group str, generation i32, member_id str, assignments array<member_id str, assignment bytes>
    # (only the leader sends assignments; the others send none)
    API_KEY: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    group: str = ""
    generation: int = -1
    member_id: str = ""
    assignments: tuple[GroupAssignment, ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.group).pack("i", self.generation).str(self.member_id).array(len(self.assignments))
        for a in self.assignments:
            w.str(a.member_id).bytes(a.assignment)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> SyncGroupRequest:
        group, generation, member = r.str(), r.int("i"), r.str()
        assignments = tuple(GroupAssignment(r.str(), r.bytes()) for _ in range(r.array(6, REQUEST_ARRAY_MAX)))
        return cls(group, generation, member, assignments)


@dataclass(frozen=True, slots=True)
class HeartbeatRequest(Request):
    # group str, generation i32, member_id str
    API_KEY: ClassVar[ApiKey] = ApiKey.HEARTBEAT
    group: str = ""
    generation: int = -1
    member_id: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.group).pack("i", self.generation).str(self.member_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> HeartbeatRequest:
        return cls(r.str(), r.int("i"), r.str())


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest(Request):
    # group str, member_id str
    API_KEY: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    group: str = ""
    member_id: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.group).str(self.member_id)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> LeaveGroupRequest:
        return cls(r.str(), r.str())


@dataclass(frozen=True, slots=True)
class StatsRequest(Request):
    # (empty body)
    API_KEY: ClassVar[ApiKey] = ApiKey.STATS

    def write(self, w: Writer) -> None:
        pass

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> StatsRequest:
        return cls()


@dataclass(frozen=True, slots=True)
class SaslHandshakeRequest(Request):
    # mechanism str: "SCRAM-SHA-512", "SCRAM-SHA-256" or "PLAIN"
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_HANDSHAKE
    mechanism: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.mechanism)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> SaslHandshakeRequest:
        return cls(r.str())


@dataclass(frozen=True, slots=True)
class SaslAuthenticateRequest(Request):
    # auth_bytes bytes: the mechanism's next client message
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_AUTHENTICATE
    auth_bytes: bytes = b""

    def write(self, w: Writer) -> None:
        w.bytes(self.auth_bytes)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> SaslAuthenticateRequest:
        return cls(r.bytes())


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


# ------------------------------------------------------------------------------------ peeks
# What the broker must know of a request before it decodes it, or without decoding it (a frame
# forwarded to its owner is not decoded by the core that forwards it): one field each, read where
# the request's own layout puts it. Each is None when the frame is not that request or its body
# is too short to hold the field (decoding it then fails and is answered INVALID_REQUEST).


def _field(fmt: str, index: int) -> tuple[int, struct.Struct]:
    """Where field `index` of a body laid out as `fmt` starts, and its own struct."""
    return struct.calcsize(">" + fmt[:index]), _struct(fmt[index])


_PRODUCE_ACKS = _field(ProduceRequest.FIXED, 0)
_FETCH_MAX_BYTES = _field(FetchRequest.FIXED, 1)
_FETCH_MAX_WAIT_MS = _field(FetchRequest.FIXED, 2)


def _peek(frame: Frame, api_key: ApiKey, field: tuple[int, struct.Struct]) -> int | None:
    at, s = field
    if frame.api_key != api_key or len(frame.body) < at + s.size:
        return None
    return s.unpack_from(frame.body, at)[0]


def peek_produce_acks(frame: Frame) -> int | None:
    """A produce's acks (Acks.NONE: nobody waits for its answer)."""
    return _peek(frame, ApiKey.PRODUCE, _PRODUCE_ACKS)


def peek_fetch_max_bytes(frame: Frame) -> int | None:
    """A fetch's max_bytes: the most its reply may carry (before the broker's cap)."""
    return _peek(frame, ApiKey.FETCH, _FETCH_MAX_BYTES)


def peek_fetch_max_wait_ms(frame: Frame) -> int | None:
    """A fetch's max_wait_ms: > 0 is a long poll, which the owner may hold that long (capped)."""
    return _peek(frame, ApiKey.FETCH, _FETCH_MAX_WAIT_MS)


REQUEST_TYPES: dict[int, type[Request]] = {
    cls.API_KEY: cls
    for cls in (
        ApiVersionsRequest,
        MetadataRequest,
        CreateTopicRequest,
        DeleteTopicRequest,
        ProduceRequest,
        FetchRequest,
        ListOffsetsRequest,
        OffsetCommitRequest,
        OffsetFetchRequest,
        StatsRequest,
        JoinGroupRequest,
        SyncGroupRequest,
        HeartbeatRequest,
        LeaveGroupRequest,
        ReplicaFetchRequest,
        SaslHandshakeRequest,
        SaslAuthenticateRequest,
    )
}
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    key: (CURRENT_VERSIONS[key], CURRENT_VERSIONS[key]) for key in REQUEST_TYPES
}


# ------------------------------------------------------------------------------------ responses


@dataclass(frozen=True, slots=True)
class Response:
    API_KEY: ClassVar[ApiKey]
    error: ErrorCode = ErrorCode.NONE
    message: str = ""

    def write(self, w: Writer) -> None:
        """The fields after error and message (written only when error is NONE)."""

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {}


@dataclass(frozen=True, slots=True)
class ApiVersion:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse(Response):
    # broker_version str, node_id i32, cores u16, apis array<api_key u16, min u16, max u16>
    API_KEY: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    broker_version: str = ""
    node_id: int = 0
    cores: int = 1
    apis: tuple[ApiVersion, ...] = ()

    def write(self, w: Writer) -> None:
        w.str(self.broker_version).pack("iH", self.node_id, self.cores).array(len(self.apis))
        for a in self.apis:
            w.pack("HHH", a.api_key, a.min_version, a.max_version)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        version = r.str()
        node_id, cores = r.unpack("iH")
        apis = tuple(ApiVersion(*r.unpack("HHH")) for _ in range(r.array(6)))
        return {"broker_version": version, "node_id": node_id, "cores": cores, "apis": apis}


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    # index u32, owner_core i16, start_offset i64, end_offset i64, leader_node i32, leader_epoch i32,
    # replicas array<node i32, core i16>, isr array<node i32, core i16>
    index: int
    owner_core: int  # the core serving it on its leader node; -1: no leader (offline)
    start_offset: int
    end_offset: int
    leader_node: int = 0  # -1: offline
    leader_epoch: int = 0
    replicas: tuple[tuple[int, int], ...] = ()  # (node id, core), the preferred leader first
    isr: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeMetadata:
    # node_id i32, host str, port u16, cores u16, core_ports array<u16>, rack str, live u8
    node_id: int
    host: str
    port: int
    cores: int
    core_ports: tuple[int, ...] = ()
    rack: str = ""
    live: bool = True

    def core_port(self, core: int) -> int:
        """Where `core` of this node is reached: its direct port, else the node's public port."""
        if core < len(self.core_ports) and self.core_ports[core]:
            return self.core_ports[core]
        return self.port


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    # error i16, name str, topic_id u32, retention_ms i64, retention_bytes i64, segment_bytes i64,
    # partitions array<PartitionMetadata>
    error: ErrorCode
    name: str
    topic_id: int
    retention_ms: int = -1
    retention_bytes: int = -1
    segment_bytes: int = -1
    partitions: tuple[PartitionMetadata, ...] = ()


@dataclass(frozen=True, slots=True)
class MetadataResponse(Response):
    # (version 2) host str, port u16, cores u16, steering u8 (1 = eBPF steers connections to
    # owning cores), core_ports array<u16> (core k's direct port, 0 = not reachable directly),
    # topics array<TopicMetadata>, (version 3) node_id i32 (the node answering), clustered u8,
    # nodes array<NodeMetadata> (every node the cluster knows, live or not; one node: itself)
    API_KEY: ClassVar[ApiKey] = ApiKey.METADATA
    host: str = ""
    port: int = 0
    cores: int = 1
    steering: bool = False
    topics: tuple[TopicMetadata, ...] = ()
    core_ports: tuple[int, ...] = ()
    node_id: int = 0
    clustered: bool = False
    nodes: tuple[NodeMetadata, ...] = ()

    def node(self, node_id: int) -> NodeMetadata | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        return None

    def write(self, w: Writer) -> None:
        w.str(self.host).pack("HHB", self.port, self.cores, int(self.steering)).array(len(self.core_ports))
        for port in self.core_ports:
            w.pack("H", port)
        w.array(len(self.topics))
        for t in self.topics:
            w.pack("h", t.error).str(t.name).pack(
                "Iqqq", t.topic_id, t.retention_ms, t.retention_bytes, t.segment_bytes
            )
            w.array(len(t.partitions))
            for p in t.partitions:
                w.pack(
                    "Ihqqii",
                    p.index,
                    p.owner_core,
                    p.start_offset,
                    p.end_offset,
                    p.leader_node,
                    p.leader_epoch,
                )
                for replicas in (p.replicas, p.isr):
                    w.array(len(replicas))
                    for node, core in replicas:
                        w.pack("ih", node, core)
        w.pack("iB", self.node_id, int(self.clustered)).array(len(self.nodes))
        for n in self.nodes:
            w.pack("i", n.node_id).str(n.host).pack("HH", n.port, n.cores).array(len(n.core_ports))
            for port in n.core_ports:
                w.pack("H", port)
            w.str(n.rack).pack("B", int(n.live))

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        host = r.str()
        port, cores, steering = r.unpack("HHB")
        core_ports = tuple(r.int("H") for _ in range(r.array(2)))
        topics = []
        for _ in range(r.array(32)):
            error = _error(r.int("h"))
            name = r.str()
            topic_id, ret_ms, ret_bytes, seg_bytes = r.unpack("Iqqq")
            parts = []
            for _ in range(r.array(38)):
                fixed = r.unpack("Ihqqii")
                replicas = tuple(r.unpack("ih") for _ in range(r.array(6)))
                isr = tuple(r.unpack("ih") for _ in range(r.array(6)))
                parts.append(PartitionMetadata(*fixed, replicas, isr))  # type: ignore[arg-type]
            topics.append(TopicMetadata(error, name, topic_id, ret_ms, ret_bytes, seg_bytes, tuple(parts)))
        node_id, clustered = r.unpack("iB")
        nodes = []
        for _ in range(r.array(14)):
            nid = r.int("i")
            nhost = r.str()
            nport, ncores = r.unpack("HH")
            nports = tuple(r.int("H") for _ in range(r.array(2)))
            nodes.append(NodeMetadata(nid, nhost, nport, ncores, nports, r.str(), bool(r.int("B"))))
        return {
            "host": host,
            "port": port,
            "cores": cores,
            "steering": bool(steering),
            "topics": tuple(topics),
            "core_ports": core_ports,
            "node_id": node_id,
            "clustered": bool(clustered),
            "nodes": tuple(nodes),
        }


@dataclass(frozen=True, slots=True)
class CreateTopicResponse(Response):
    # topic_id u32
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    topic_id: int = 0

    def write(self, w: Writer) -> None:
        w.pack("I", self.topic_id)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"topic_id": r.int("I")}


@dataclass(frozen=True, slots=True)
class DeleteTopicResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC


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
    records: bytes = b""

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


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Response):
    # offset i64 (-1 when the group has committed nothing), metadata str
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    offset: int = -1
    metadata: str = ""

    def write(self, w: Writer) -> None:
        w.pack("q", self.offset).str(self.metadata)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"offset": r.int("q"), "metadata": r.str()}


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Response):
    # generation i32, protocol str (the assignor chosen), leader str, member_id str (yours),
    # members array<member_id str, metadata bytes> (every member's, to the leader only; else empty)
    API_KEY: ClassVar[ApiKey] = ApiKey.JOIN_GROUP
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    member_id: str = ""
    members: tuple[GroupMember, ...] = ()

    def write(self, w: Writer) -> None:
        w.pack("i", self.generation).str(self.protocol).str(self.leader).str(self.member_id)
        w.array(len(self.members))
        for m in self.members:
            w.str(m.member_id).bytes(m.metadata)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        generation, protocol, leader, member = r.int("i"), r.str(), r.str(), r.str()
        members = tuple(GroupMember(r.str(), r.bytes()) for _ in range(r.array(6)))
        return {
            "generation": generation,
            "protocol": protocol,
            "leader": leader,
            "member_id": member,
            "members": members,
        }


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Response):
    # assignment bytes (this member's, as the leader wrote it)
    API_KEY: ClassVar[ApiKey] = ApiKey.SYNC_GROUP
    assignment: bytes = b""

    def write(self, w: Writer) -> None:
        w.bytes(self.assignment)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"assignment": r.bytes()}


@dataclass(frozen=True, slots=True)
class HeartbeatResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.HEARTBEAT


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP


@dataclass(frozen=True, slots=True)
class StatsResponse(Response):
    # core u16 (the core that answered), stats bytes: UTF-8 JSON, one snapshot per core and the
    # supervisor's eBPF snapshot ("bpf"; new keys in the JSON keep the binary format unchanged)
    # (broker/core/metrics.py says what a snapshot holds)
    API_KEY: ClassVar[ApiKey] = ApiKey.STATS
    core: int = 0
    stats_json: str = "{}"

    def write(self, w: Writer) -> None:
        w.pack("H", self.core).bytes(self.stats_json.encode())

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        core = r.int("H")
        raw = r.bytes()
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            raise MalformedBody("stats are not UTF-8") from exc
        return {"core": core, "stats_json": text}


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
    records: bytes = b""


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
            tid, index, error, hw, start, epoch, end = r.unpack("IIhqqiq")
            parts.append(
                ReplicaFetchPartitionData(tid, index, _error(error), hw, start, epoch, end, r.bytes())
            )
        return {"partitions": tuple(parts)}


@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse(Response):
    # mechanisms array<str>: what this connection may use (on UNSUPPORTED_SASL_MECHANISM the
    # message names them, since an error body ends after the message)
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_HANDSHAKE
    mechanisms: tuple[str, ...] = ()

    def write(self, w: Writer) -> None:
        w.array(len(self.mechanisms))
        for name in self.mechanisms:
            w.str(name)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"mechanisms": tuple(r.str() for _ in range(r.array(2)))}


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse(Response):
    # auth_bytes bytes: the mechanism's next server message (empty when there is none)
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_AUTHENTICATE
    auth_bytes: bytes = b""

    def write(self, w: Writer) -> None:
        w.bytes(self.auth_bytes)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"auth_bytes": r.bytes()}


RESPONSE_TYPES: dict[int, type[Response]] = {
    cls.API_KEY: cls
    for cls in (
        ApiVersionsResponse,
        MetadataResponse,
        CreateTopicResponse,
        DeleteTopicResponse,
        ProduceResponse,
        FetchResponse,
        ListOffsetsResponse,
        OffsetCommitResponse,
        OffsetFetchResponse,
        StatsResponse,
        JoinGroupResponse,
        SyncGroupResponse,
        HeartbeatResponse,
        LeaveGroupResponse,
        ReplicaFetchResponse,
        SaslHandshakeResponse,
        SaslAuthenticateResponse,
    )
}


def _error(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


# ------------------------------------------------------------------------------------ framing


def _frame(
    w: Writer, api_key: int, correlation_id: int, topic_id: int, partition: int, flags: int
) -> list[bytes]:
    length = sum(map(len, w.parts))
    version = CURRENT_VERSIONS.get(api_key, API_VERSION)
    return [encode_header(length, api_key, version, correlation_id, topic_id, partition, flags), *w.parts]


def encode_request(req: Request, correlation_id: int) -> list[bytes]:
    """The frame of `req` as buffers (header first); join them or hand them to writev."""
    if type(req) is ProduceRequest:
        # Every produce a client sends: the header and the fixed fields in one pack, then the
        # records as they are (what the generic path below makes, with ~10 calls less).
        records = req.records
        head = _PRODUCE_HEAD.pack(
            _PRODUCE_HEAD.size - LENGTH_SIZE + len(records), MAGIC, FRAME_VERSION, ApiKey.PRODUCE,
            _PRODUCE_VERSION, 0, correlation_id, req.topic_id, req.partition, req.acks,
            req.timeout_ms, len(records),
        )  # fmt: skip
        return [head, records]  # type: ignore[list-item]  # records: bytes or a view, as writev takes
    w = Writer()
    req.write(w)
    topic_id = partition = 0
    if isinstance(req, PartitionRequest):
        topic_id, partition = req.topic_id, req.partition
    return _frame(w, req.API_KEY, correlation_id, topic_id, partition, 0)


def request_frame(req: Request, correlation_id: int = 0) -> Frame:
    """`req` as the `Frame` a decoder would hand over for its bytes: what a broker core sends
    another (forwarded notices, follower fetches) and what tests feed to handlers."""
    w = Writer()
    req.write(w)
    topic_id = partition = 0
    if isinstance(req, PartitionRequest):
        topic_id, partition = req.topic_id, req.partition
    version = CURRENT_VERSIONS.get(req.API_KEY, API_VERSION)
    return Frame(req.API_KEY, version, 0, correlation_id, topic_id, partition, b"".join(w.parts))


_PRODUCE_FIXED = struct.Struct(">" + ProduceRequest._READ)
_PRODUCE_HEAD = frame_struct(ProduceRequest._READ)  # a produce's frame up to its records
PRODUCE_HEAD_SIZE = _PRODUCE_HEAD.size
# The two u32 fields `encode_produce_values` has filled in: the frame's length (its first field,
# counting what follows it) and the records' length (the head's last field).
_PRODUCE_LENGTH_AT = 0
_PRODUCE_RECORDS_LENGTH_AT = PRODUCE_HEAD_SIZE - struct.calcsize(">I")


def encode_produce_values(
    correlation_id: int,
    topic_id: int,
    partition: int,
    acks: int,
    timeout_ms: int,
    values: Sequence[bytes | Record],
    timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytes:
    """The whole frame of the `ProduceRequest` of one batch (`encode_batch`'s bytes for
    `values`, at `frame[PRODUCE_HEAD_SIZE:]`), in one bytes object: what a one-record send
    writes, made in one C call for plain values (`encode_batch_framed`) instead of a batch, a
    request and its head."""
    head = _PRODUCE_HEAD.pack(
        0, MAGIC, FRAME_VERSION, ApiKey.PRODUCE, _PRODUCE_VERSION, 0, correlation_id, topic_id,
        partition, acks, timeout_ms, 0,
    )  # fmt: skip
    return encode_batch_framed(
        head, _PRODUCE_LENGTH_AT, _PRODUCE_RECORDS_LENGTH_AT, values, timestamp, producer_id,
        producer_epoch, base_sequence,
    )  # fmt: skip


def decode_request(frame: Frame) -> Request:
    """The request in `frame`. Raises MalformedBody (answer INVALID_REQUEST) or KeyError/ValueError
    for an unknown api or version (answer UNSUPPORTED_VERSION): see `unsupported()`."""
    if frame.api_key == ApiKey.PRODUCE:
        # Every produce: `ProduceRequest.read` in one unpack when the body is what it must be
        # (the generic path below reads any other, and raises its errors).
        body = frame.body
        if len(body) >= _PRODUCE_FIXED.size:
            acks, timeout_ms, size = _PRODUCE_FIXED.unpack_from(body)
            if len(body) == _PRODUCE_FIXED.size + size:
                records = memoryview(body)[_PRODUCE_FIXED.size :]
                return ProduceRequest(frame.topic_id, frame.partition, acks, timeout_ms, records)
    cls = REQUEST_TYPES[frame.api_key]
    body = frame.body
    # A large body received in place is a view (native/frames.c): the fields read as bytes.
    r = Reader(body if type(body) is bytes else bytes(body))
    req = cls.read(r, frame)
    r.done()
    return req


def unsupported(frame: Frame) -> str | None:
    """Why the broker cannot read this frame's api key and version, or None."""
    if frame.is_response:
        return "a response frame sent to the broker"
    versions = SUPPORTED_VERSIONS.get(frame.api_key)
    if versions is None:
        return f"unknown api key {frame.api_key}"
    if not versions[0] <= frame.api_version <= versions[1]:
        name = ApiKey(frame.api_key).name
        return f"api {name} version {frame.api_version} not in {versions[0]}..{versions[1]}"
    return None


_NO_ERROR = struct.pack(">hH", ErrorCode.NONE, 0)  # error NONE, empty message


def encode_response(
    resp: Response, correlation_id: int, api_key: int | None = None, topic_id: int = 0, partition: int = 0
) -> list[bytes]:
    """The frame of `resp`. `api_key` overrides the type's own (an error answer to an unknown api)."""
    w = Writer()
    if resp.error == ErrorCode.NONE and not resp.message:
        w.parts.append(_NO_ERROR)  # every reply that succeeds starts so: packed once, not per reply
    else:
        w.pack("h", resp.error).str(resp.message)
    if resp.error == ErrorCode.NONE:
        resp.write(w)
    key = resp.API_KEY if api_key is None else api_key
    return _frame(w, key, correlation_id, topic_id, partition, FLAG_RESPONSE)


_PRODUCED_FIELDS = "hHqqq"  # error NONE, an empty message, then ProduceResponse's own fields
_PRODUCED = frame_struct(_PRODUCED_FIELDS)
_PRODUCE_VERSION = CURRENT_VERSIONS[ApiKey.PRODUCE]


def encode_produced(
    correlation_id: int,
    topic_id: int,
    partition: int,
    base_offset: int,
    end_offset: int,
    log_start_offset: int,
) -> list[bytes]:
    """`encode_response` of a `ProduceResponse` that succeeds, in one pack: the reply to every
    produce, where the generic path makes ~10 calls."""
    frame = _PRODUCED.pack(
        _PRODUCED.size - LENGTH_SIZE, MAGIC, FRAME_VERSION, ApiKey.PRODUCE, _PRODUCE_VERSION, FLAG_RESPONSE,
        correlation_id, topic_id, partition, ErrorCode.NONE, 0, base_offset, end_offset, log_start_offset,
    )  # fmt: skip
    return [frame]


def error_response(api_key: int, error: ErrorCode, message: str) -> Response:
    """A response of the right type for `api_key` (a generic one for an unknown api) carrying an error."""
    cls = RESPONSE_TYPES.get(api_key, Response)
    if cls is Response:
        return _GenericErrorResponse(error, message)
    return cls(error, message)


@dataclass(frozen=True, slots=True)
class _GenericErrorResponse(Response):
    API_KEY: ClassVar[ApiKey] = ApiKey.API_VERSIONS  # overridden by encode_response(api_key=...)


_PRODUCED_BODY = struct.Struct(">" + _PRODUCED_FIELDS)  # the body `encode_produced` packs


def _produced(frame: Frame) -> tuple[int, int, int] | None:
    """(base_offset, end_offset, log_start_offset) of a produce that succeeded, in one unpack;
    None for any other frame (an error, whose message makes the body another size, included)."""
    body = frame.body
    if frame.api_key == ApiKey.PRODUCE and len(body) == _PRODUCED_BODY.size:
        error, message_length, base_offset, end_offset, log_start_offset = _PRODUCED_BODY.unpack(body)
        if error == ErrorCode.NONE and message_length == 0:
            return base_offset, end_offset, log_start_offset
    return None


def decode_response(frame: Frame) -> Response:
    produced = _produced(frame)  # every acknowledged produce a client reads
    if produced is not None:
        return ProduceResponse(ErrorCode.NONE, "", *produced)
    return decode_response_fields(frame)


def decode_produce_reply(frame: Frame) -> int | Response:
    """A produce response as a producer acts on it: the base offset (an int) when it succeeded,
    without building a `ProduceResponse`, else what `decode_response` makes of it. A
    one-at-a-time producer waits for every part of a microsecond here."""
    produced = _produced(frame)
    if produced is not None:
        return produced[0]
    return decode_response_fields(frame)


def decode_response_fields(frame: Frame) -> Response:
    """`decode_response` field by field, for every api: what it does for any response its
    produce case does not take (and what the tests compare that case with)."""
    cls = RESPONSE_TYPES.get(frame.api_key)
    r = Reader(frame.body)
    error = _error(r.int("h"))
    message = r.str()
    if cls is None:
        return _GenericErrorResponse(error, message)
    if error != ErrorCode.NONE:
        return cls(error, message)
    fields = cls.read(r)
    r.done()
    return cls(error, message, **fields)  # type: ignore[arg-type]


class FetchRecords(NamedTuple):
    """A FetchResponse read without copying its records: they stay in the frame's `body`, at
    `body[start:end]` (what a consumer decodes, slicing record values straight out of `body`)."""

    error: ErrorCode
    message: str
    high_watermark: int
    log_start_offset: int
    body: bytes
    start: int
    end: int


def read_fetch_response(frame: Frame) -> FetchRecords:
    """`decode_response` of a FetchResponse frame, as `FetchRecords` (same checks)."""
    if frame.api_key != ApiKey.FETCH:
        raise MalformedBody(f"not a FetchResponse: api {frame.api_key}")
    r = Reader(frame.body)
    error = _error(r.int("h"))
    message = r.str()
    if error != ErrorCode.NONE:
        return FetchRecords(error, message, -1, -1, b"", 0, 0)
    hw, log_start, n = r.unpack("qqI")
    start = r.pos
    if len(frame.body) - start != n:
        raise MalformedBody(f"records of {n} bytes at byte {start}, the body has {len(frame.body) - start}")
    return FetchRecords(error, message, hw, log_start, frame.body, start, start + n)


__all__ = [
    "API_VERSION",
    "CURRENT_VERSIONS",
    "Acks",
    "ApiKey",
    "ErrorCode",
    "FetchRecords",
    "MalformedBody",
    "OffsetSpec",
    "Request",
    "Response",
    "decode_produce_reply",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "error_response",
    "peek_fetch_max_bytes",
    "peek_fetch_max_wait_ms",
    "peek_produce_acks",
    "read_fetch_response",
    "unsupported",
]
