"""Every API's frames: requests and responses encoded and decoded, the tables from api key to
type, and the peeks the broker reads before decoding. Sans-I/O. The protocol's one vocabulary:
code reaches every protocol name through this module (`from ringlog_proto import messages as m`,
then `m.ErrorCode`, `m.ProduceRequest`...), so it re-exports the request and response types of
ringlog_proto/apis/ (one module per API group; `apis.codes` holds the api keys, versions and
error codes, `apis.body` a body's primitives and base types).

Rules this module keeps:
- One request type and one response type per API, frozen slotted dataclasses. `encode_*` returns
  buffers (a list, so that record bytes are never copied into a frame: send them with writev);
  `decode_*` takes a `Frame` from frames.py.
- A body that does not parse is a `MalformedBody`: the frame was delimited correctly, so the
  broker *answers* it (INVALID_REQUEST) and keeps the connection; see frames.ProtocolError for the
  case where it cannot.
- Every response body starts with `error_code i16, error_message str`. When the error code is not
  NONE the body ends there; clients read the rest only on success.

The body primitives are in apis/body.py. The layouts per API are in docs/PROTOCOL.md and in each
class's `_FIELDS` comment.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from ringlog_proto.apis.admin import (
    PARTITION_OFFSETS_AT,
    AlterConfigsRequest,
    AlterConfigsResponse,
    ApiVersion,
    ApiVersionsRequest,
    ApiVersionsResponse,
    ConfigChange,
    ConfigDescription,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    MetadataRequest,
    MetadataResponse,
    NodeMetadata,
    PartitionMetadata,
    StatsRequest,
    StatsResponse,
    TopicMetadata,
)
from ringlog_proto.apis.body import (
    REQUEST_ARRAY_MAX,
    MalformedBody,
    PartitionRequest,
    Reader,
    Request,
    Response,
    Writer,
    _error,
    _struct,
)
from ringlog_proto.apis.codes import (
    API_VERSION,
    CURRENT_VERSIONS,
    PRODUCE_TRANSACTIONAL_VERSION,
    Acks,
    ApiKey,
    ConfigOp,
    ConfigSource,
    ErrorCode,
    Isolation,
    OffsetSpec,
)
from ringlog_proto.apis.groups import (
    GroupAssignment,
    GroupMember,
    GroupProtocol,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from ringlog_proto.apis.produce_fetch import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    ProduceResponse,
)
from ringlog_proto.apis.replication import (
    NO_DIVERGENCE,
    ReplicaFetchPartition,
    ReplicaFetchPartitionData,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    read_answer,
)
from ringlog_proto.apis.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from ringlog_proto.apis.transactions import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    FindHeldTxnsRequest,
    FindHeldTxnsResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from ringlog_proto.batch import encode_batch_framed
from ringlog_proto.frames import (
    FLAG_RESPONSE,
    FRAME_VERSION,
    LENGTH_SIZE,
    MAGIC,
    Buffer,
    Frame,
    encode_header,
    frame_struct,
)
from ringlog_proto.record import Record

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
        DescribeConfigsRequest,
        AlterConfigsRequest,
        WriteTxnMarkersRequest,
        InitProducerIdRequest,
        AddPartitionsToTxnRequest,
        AddOffsetsToTxnRequest,
        EndTxnRequest,
        TxnOffsetCommitRequest,
        FindHeldTxnsRequest,
    )
}
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    key: (CURRENT_VERSIONS[key], CURRENT_VERSIONS[key]) for key in REQUEST_TYPES
}
# A CreateTopic of v2 or v3 (before configs, before assignments) still reads: each is a prefix
# of the current body.
SUPPORTED_VERSIONS[ApiKey.CREATE_TOPIC] = (2, CURRENT_VERSIONS[ApiKey.CREATE_TOPIC])
# A Metadata of v3 (before allow_auto_create) still reads, and never creates a topic.
SUPPORTED_VERSIONS[ApiKey.METADATA] = (3, CURRENT_VERSIONS[ApiKey.METADATA])
# Fetch and ListOffsets v1 (before isolation) still read, and are answered in v1's layout;
# Produce v2 carries a transactional id (a plain produce is still sent as v1).
SUPPORTED_VERSIONS[ApiKey.FETCH] = (1, CURRENT_VERSIONS[ApiKey.FETCH])
SUPPORTED_VERSIONS[ApiKey.LIST_OFFSETS] = (1, CURRENT_VERSIONS[ApiKey.LIST_OFFSETS])
SUPPORTED_VERSIONS[ApiKey.PRODUCE] = (1, PRODUCE_TRANSACTIONAL_VERSION)


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
        DescribeConfigsResponse,
        AlterConfigsResponse,
        WriteTxnMarkersResponse,
        InitProducerIdResponse,
        AddPartitionsToTxnResponse,
        AddOffsetsToTxnResponse,
        EndTxnResponse,
        TxnOffsetCommitResponse,
        FindHeldTxnsResponse,
    )
}


# ------------------------------------------------------------------------------------ framing


def _frame(
    w: Writer,
    api_key: int,
    correlation_id: int,
    topic_id: int,
    partition: int,
    flags: int,
    version: int | None = None,
) -> list[Buffer]:
    length = sum(map(len, w.parts))
    if version is None:
        version = CURRENT_VERSIONS.get(api_key, API_VERSION)
    return [encode_header(length, api_key, version, correlation_id, topic_id, partition, flags), *w.parts]


def encode_request(req: Request, correlation_id: int) -> list[Buffer]:
    """The frame of `req` as buffers (header first); join them or hand them to writev."""
    if type(req) is ProduceRequest and req.transactional_id is None:
        # Every produce a client sends: the header and the fixed fields in one pack, then the
        # records as they are (what the generic path below makes, with ~10 calls less).
        records = req.records
        head = _PRODUCE_HEAD.pack(
            _PRODUCE_HEAD.size - LENGTH_SIZE + len(records), MAGIC, FRAME_VERSION, ApiKey.PRODUCE,
            _PRODUCE_VERSION, 0, correlation_id, req.topic_id, req.partition, req.acks,
            req.timeout_ms, len(records),
        )  # fmt: skip
        return [head, records]
    w = Writer()
    req.write(w)
    topic_id = partition = 0
    if isinstance(req, PartitionRequest):
        topic_id, partition = req.topic_id, req.partition
    return _frame(w, req.API_KEY, correlation_id, topic_id, partition, 0, req.version())


def request_frame(req: Request, correlation_id: int = 0) -> Frame:
    """`req` as the `Frame` a decoder would hand over for its bytes: what a broker core sends
    another (forwarded notices, follower fetches) and what tests feed to handlers."""
    w = Writer()
    req.write(w)
    topic_id = partition = 0
    if isinstance(req, PartitionRequest):
        topic_id, partition = req.topic_id, req.partition
    version = req.version()
    if version is None:
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
    resp: Response,
    correlation_id: int,
    api_key: int | None = None,
    topic_id: int = 0,
    partition: int = 0,
    version: int | None = None,
) -> list[Buffer]:
    """The frame of `resp`. `api_key` overrides the type's own (an error answer to an unknown
    api); `version` the api's current one (an answer in an older request's layout)."""
    w = Writer()
    if resp.error == ErrorCode.NONE and not resp.message:
        w.parts.append(_NO_ERROR)  # every reply that succeeds starts so: packed once, not per reply
    else:
        w.pack("h", resp.error).str(resp.message)
    if resp.error == ErrorCode.NONE:
        resp.write(w)
    key = resp.API_KEY if api_key is None else api_key
    return _frame(w, key, correlation_id, topic_id, partition, FLAG_RESPONSE, version)


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
    if frame.api_key == ApiKey.REPLICA_FETCH:  # every answer a follower reads
        answer = read_answer(frame.body)
        if answer is not None:
            return answer
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
    return cls(error, message, **fields)


class FetchRecords(NamedTuple):
    """A FetchResponse read without copying its records: they stay in the frame's `body`, at
    `body[start:end]` (what a consumer decodes, slicing record values straight out of `body`)."""

    error: ErrorCode
    message: str
    high_watermark: int
    log_start_offset: int
    body: bytes | memoryview
    start: int
    end: int
    last_stable_offset: int = -1
    # read_committed: (producer_id, first_offset) of the aborted transactions the records overlap
    aborted: tuple[tuple[int, int], ...] = ()


def read_fetch_response(frame: Frame) -> FetchRecords:
    """`decode_response` of a FetchResponse frame, as `FetchRecords` (same checks)."""
    if frame.api_key != ApiKey.FETCH:
        raise MalformedBody(f"not a FetchResponse: api {frame.api_key}")
    r = Reader(frame.body)
    error = _error(r.int("h"))
    message = r.str()
    if error != ErrorCode.NONE:
        return FetchRecords(error, message, -1, -1, b"", 0, 0)
    hw, log_start, lso, count = r.unpack("qqqI")
    aborted: tuple[tuple[int, int], ...] = ()
    if count:
        if count * 16 > len(frame.body) - r.pos:
            raise MalformedBody(f"aborted list of {count} items runs past the body")
        aborted = tuple((r.int("q"), r.int("q")) for _ in range(count))
    n = r.int("I")
    start = r.pos
    if len(frame.body) - start != n:
        raise MalformedBody(f"records of {n} bytes at byte {start}, the body has {len(frame.body) - start}")
    return FetchRecords(error, message, hw, log_start, frame.body, start, start + n, lso, aborted)


__all__ = [
    "API_VERSION",
    "CURRENT_VERSIONS",
    "NO_DIVERGENCE",
    "PARTITION_OFFSETS_AT",
    "PRODUCE_HEAD_SIZE",
    "REQUEST_ARRAY_MAX",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "SUPPORTED_VERSIONS",
    "Acks",
    "AddOffsetsToTxnRequest",
    "AddOffsetsToTxnResponse",
    "AddPartitionsToTxnRequest",
    "AddPartitionsToTxnResponse",
    "AlterConfigsRequest",
    "AlterConfigsResponse",
    "ApiKey",
    "ApiVersion",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "ConfigChange",
    "ConfigDescription",
    "ConfigOp",
    "ConfigSource",
    "CreateTopicRequest",
    "CreateTopicResponse",
    "DeleteTopicRequest",
    "DeleteTopicResponse",
    "DescribeConfigsRequest",
    "DescribeConfigsResponse",
    "EndTxnRequest",
    "EndTxnResponse",
    "ErrorCode",
    "FetchRecords",
    "FetchRequest",
    "FetchResponse",
    "GroupAssignment",
    "GroupMember",
    "GroupProtocol",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "Isolation",
    "JoinGroupRequest",
    "JoinGroupResponse",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "MalformedBody",
    "MetadataRequest",
    "MetadataResponse",
    "NodeMetadata",
    "OffsetCommitRequest",
    "OffsetCommitResponse",
    "OffsetFetchRequest",
    "OffsetFetchResponse",
    "OffsetSpec",
    "PartitionMetadata",
    "PartitionRequest",
    "ProduceRequest",
    "ProduceResponse",
    "Reader",
    "ReplicaFetchPartition",
    "ReplicaFetchPartitionData",
    "ReplicaFetchRequest",
    "ReplicaFetchResponse",
    "Request",
    "Response",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "StatsRequest",
    "StatsResponse",
    "SyncGroupRequest",
    "SyncGroupResponse",
    "TopicMetadata",
    "TxnOffsetCommitRequest",
    "TxnOffsetCommitResponse",
    "WriteTxnMarkersRequest",
    "WriteTxnMarkersResponse",
    "Writer",
    "decode_produce_reply",
    "decode_request",
    "decode_response",
    "decode_response_fields",
    "encode_produce_values",
    "encode_produced",
    "encode_request",
    "encode_response",
    "error_response",
    "peek_fetch_max_bytes",
    "peek_fetch_max_wait_ms",
    "peek_produce_acks",
    "read_fetch_response",
    "request_frame",
    "unsupported",
]
