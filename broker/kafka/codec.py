"""Kafka's wire: size-prefixed frames, request and response headers, bodies through `kio`. Sans-I/O.

Rules this module keeps:
- No sockets, like ringlog_proto: `KafkaFrameDecoder.feed(bytes)` buffers, `next_frame()` returns
  a `KafkaRequest` (after a SaslHandshake v0, a `RawSaslToken`) or `NEED_DATA`,
  `encode_response(...)` returns buffers. The backends drive it exactly as they drive our
  `FrameDecoder`, through the Kafka adapter (broker/kafka/adapter.py `decoder`). Its twin in C
  (native/frames.c's `KafkaDecoder`, `kafka_decoder` below) is what connections use when it is
  built: the same requests and errors, and it lends its space to a receive as our frames'
  decoder does, so a large request's `data` is a read-only view of where it arrived (a
  librdkafka produce of ~280 KB was copied twice in Python before kio read its records).
- Any byte string either yields requests or raises `ProtocolError` (a stream that cannot be
  resynchronised: the connection is closed). A request whose frame is sound but whose body is
  not is a `KafkaDecodeError`, for the adapter to answer or to close on.
- A Produce v3-8 of 16 KiB or more is read by hand instead (broker/kafka/fast_decode.py, checked
  against kio), its records left as views of the request; `decode_request` still reads any
  Produce kio knows, and the adapter gives it the smaller ones.
- Kafka's byte facts live here and in `kio` (Aiven's schemas generated from Kafka's JSON message
  definitions, every version): every request starts with i32 size, i16 api_key, i16 api_version,
  i32 correlation_id; then the header's client_id and, for flexible versions, tagged fields. The
  header version of a request and of a response is the one its `kio` schema names (ApiVersions
  answers with header v0 even at v3, as Kafka does; the schemas know it).
- Tagged fields are written only when not default (kio's writer skips defaults): librdkafka before
  2.2, Debian's kcat among them, misreads some.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Final, ParamSpec, TypeVar, cast

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from ringlog_proto.frames import ProtocolError, StreamDecoder, _NeedData

if TYPE_CHECKING:
    from broker.security.session import ConnectionAuth

SIZE_BYTES: Final = 4
SASL_AUTHENTICATE: Final = 36  # the api key a bare token after a SaslHandshake v0 stands for
RAW_TOKEN_MAX_BYTES: Final = 64 * 1024  # a SCRAM or PLAIN token is well under 1 KiB
# size, api_key, api_version, correlation_id: the part every request header version shares
_FIXED = struct.Struct(">ihhi")
REQUEST_MIN_BYTES: Final = _FIXED.size - SIZE_BYTES  # after the size field
API_KEY_HIGH_OFFSET: Final = 4  # a Kafka api key is below 0x100: this byte is 0
_SIZE = struct.Struct(">i")


class KafkaDecodeError(Exception):
    """A request body (or header) that does not parse as its api and version say."""


@dataclass(frozen=True, slots=True)
class KafkaRequest:
    """One request as framed: the fixed header fields and the bytes after the size field
    (header included), decoded further only by the adapter that answers it."""

    api_key: int
    api_version: int
    correlation_id: int
    # bytes, or a read-only view of where a lending decoder received a large request: kio copies
    # what it reads out of it, a Produce's records stay views of it (broker/kafka/fast_decode.py),
    # and either way the view pins that memory while the request is held (a produce waiting on
    # acks=all keeps it until its answer), as our frames' bodies do (docs/LIMITS.md)
    data: bytes | memoryview


def starts_like_kafka(buf: bytes | bytearray | memoryview, pos: int = 0) -> bool | None:
    """Whether the bytes at `pos` may begin a Kafka request (its api key's high byte is zero),
    or None while too few bytes are there. Our own frames have 0x52 at that byte."""
    if len(buf) - pos <= API_KEY_HIGH_OFFSET:
        return None
    return buf[pos + API_KEY_HIGH_OFFSET] == 0


@dataclass(frozen=True, slots=True)
class RawSaslToken:
    """A bare SASL token, as a client sends them after a SaslHandshake v0 (KIP-43): a size and the
    token, no request header. It stands for a SaslAuthenticate, and is counted as one."""

    api_key: ClassVar[int] = SASL_AUTHENTICATE
    token: bytes


class KafkaFrameDecoder(StreamDecoder):
    """Incremental Kafka request decoder, with our `FrameDecoder`'s bounds and buffering
    (`StreamDecoder`): a declared size above `max_frame_bytes` is refused as soon as the size is
    seen. A client connection's decoder reads its `auth`: after a SaslHandshake v0 has set
    `auth.raw_tokens`, what comes next is bare tokens (`RawSaslToken`), not requests."""

    __slots__ = ("auth",)

    def __init__(self, max_frame_bytes: int, auth: ConnectionAuth | None = None) -> None:
        super().__init__(max_frame_bytes)
        self.auth = auth

    def next_frame(self) -> KafkaRequest | RawSaslToken | _NeedData:
        auth = self.auth
        if auth is not None and auth.raw_tokens:
            token = self.next_raw(RAW_TOKEN_MAX_BYTES)
            return RawSaslToken(token) if isinstance(token, bytes) else token
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < SIZE_BYTES:
            return self._need_data()
        (size,) = _SIZE.unpack_from(buf, pos)
        if size < REQUEST_MIN_BYTES:
            raise ProtocolError(f"kafka request size {size} is shorter than a request header")
        if size + SIZE_BYTES > self.max_frame_bytes:
            raise ProtocolError(
                f"kafka request of {size + SIZE_BYTES} bytes exceeds the maximum {self.max_frame_bytes}"
            )
        end = pos + SIZE_BYTES + size
        if len(buf) < end:
            return self._need_data()
        _, api_key, api_version, correlation_id = _FIXED.unpack_from(buf, pos)
        if api_key < 0 or api_version < 0:
            raise ProtocolError(f"kafka request with api key {api_key} version {api_version}")
        with memoryview(buf) as view:
            data = bytes(view[pos + SIZE_BYTES : end])
        self._pos = end
        return KafkaRequest(api_key, api_version, correlation_id, data)

    def next_raw(self, max_bytes: int) -> bytes | _NeedData:
        """A bare size-prefixed token (SASL after a SaslHandshake v0: no Kafka header)."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < SIZE_BYTES:
            return self._need_data()
        (size,) = _SIZE.unpack_from(buf, pos)
        if not 0 <= size <= max_bytes:
            raise ProtocolError(f"SASL token of {size} bytes (at most {max_bytes})")
        end = pos + SIZE_BYTES + size
        if len(buf) < end:
            return self._need_data()
        data = bytes(buf[pos + SIZE_BYTES : end])
        self._pos = end
        return data


def _native_kafka() -> type[KafkaFrameDecoder] | None:
    """native/frames.c's `KafkaDecoder`, configured with this module's types, or None when it is
    not built (ringlog_proto.frames configured its NEED_DATA and ProtocolError on import)."""
    try:
        from native._frames import KafkaDecoder, configure_kafka  # noqa: PLC0415 - optional, compiled
    except ImportError:
        return None
    configure_kafka(KafkaRequest, RawSaslToken, RAW_TOKEN_MAX_BYTES)
    native: type[KafkaFrameDecoder] = KafkaDecoder
    return native


# What `kafka_decoder` makes when native/frames.c is built (a `LENDING_DECODER` subtype: it lends
# its space to a receive, `buffer(n)` / `received(k)`), else None.
NATIVE_KAFKA_DECODER: Final = _native_kafka()


def kafka_decoder(max_frame_bytes: int, auth: ConnectionAuth | None = None) -> KafkaFrameDecoder:
    """A connection's Kafka decoder: native/frames.c's twin of `KafkaFrameDecoder` when it is
    built (the same requests, tokens and errors, at a fraction of the cost per request, and
    lending its space to a receive), else `KafkaFrameDecoder`."""
    if NATIVE_KAFKA_DECODER is not None:
        return NATIVE_KAFKA_DECODER(max_frame_bytes, auth)
    return KafkaFrameDecoder(max_frame_bytes, auth)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def schema_cache(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`functools.cache` for the functions of a kio schema class, typed as the function it wraps:
    typeshed takes a cached function's arguments as Hashable, which mypy does not find a
    `type[Any]` to be (python/mypy#11470)."""
    return cast("Callable[_P, _R]", functools.cache(fn))


@functools.lru_cache(maxsize=1024)  # kio looks its module up on every call: a few us per request
def request_schema(api_key: int, api_version: int) -> type[Any] | None:
    """kio's request class for this api and version, or None if kio knows neither."""
    try:
        return load_request_schema(api_key, api_version)
    except KioIndexError:
        return None


@functools.lru_cache(maxsize=1024)  # bounded: a client may name any api and version
def response_schema(api_key: int, api_version: int) -> type[Any] | None:
    """kio's response class for this api and version, or None if kio knows neither."""
    try:
        return load_response_schema(api_key, api_version)
    except KioIndexError:
        return None


# Array entries one request may hold, all arrays and levels together (topics, partitions,
# groups, members, protocols, configs...). Kafka clients name what exists: at most every partition
# of the broker (--max-partitions: ~4800 at a 20 000 open-file limit, more where it allows) and
# its topics. A request filling 8 MiB with entries (2M partition indexes) held its core 20-65 s
# in the handlers: past this it is
# refused like a request that does not parse, before any handler runs, and a large one before
# kio builds its entries (`too_many_entries`; docs/LIMITS.md, "Request costs").
ENTRIES_MAX: Final = 16_384


def _entries_over(entity: Any, budget: int) -> int:
    """`budget` less the array entries of `entity` (a decoded kio entity), depth first; stops
    as soon as it is negative, so the count costs at most `budget` steps whatever the request."""
    for name in _field_order(type(entity)):
        value = getattr(entity, name)
        if type(value) is not tuple:
            if hasattr(type(value), "__dataclass_fields__"):
                budget = _entries_over(value, budget)
                if budget < 0:
                    return budget
            continue
        budget -= len(value)
        if budget < 0:
            return budget
        if value and hasattr(type(value[0]), "__dataclass_fields__"):
            for item in value:
                budget = _entries_over(item, budget)
                if budget < 0:
                    return budget
    return budget


@schema_cache
def _field_order(cls: type[Any]) -> tuple[str, ...]:
    """A kio entity class's field names, in order: `dataclasses.fields` builds a tuple on each
    call, and `_entries_over` runs on every request past ENTRIES_MAX bytes (a one-partition
    Produce of 120 KiB: 7-8 us with it, 4-5 with this)."""
    return tuple(f.name for f in fields(cls))


PRESCAN_FROM_BYTES: Final = 64 * 1024  # smaller requests hold too few entries to cost kio much


class _Unscannable(Exception):
    """The pre-scan met bytes or a schema shape it does not follow: kio decides."""


_FIXED_SIZES: Final = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "int64": 8,
    "float64": 8,
    "uuid": 16,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "datetime_i64": 8,
}


@schema_cache
def _scan_plan(cls: type[Any], flexible: bool) -> tuple[tuple[str, Any], ...]:
    """How to skip an entity of `cls` field by field: (what, detail) steps."""
    steps: list[tuple[str, Any]] = []
    for f, hint in schema_fields(cls):
        if "tag" in f.metadata:
            continue  # in the tagged section, skipped whole
        kind = f.metadata.get("kafka_type")
        inner = entity_type(hint)
        if is_array(hint):
            if inner is not None:
                steps.append(("array_entity", inner))
            elif kind in _FIXED_SIZES:
                steps.append(("array_fixed", _FIXED_SIZES[kind]))
            elif kind == "string":
                steps.append(("array_str", None))
            else:
                raise _Unscannable(f"array of {kind}")
        elif inner is not None:
            if is_nullable(hint):
                raise _Unscannable("nullable struct")
            steps.append(("entity", inner))
        elif kind in _FIXED_SIZES:
            steps.append(("fixed", _FIXED_SIZES[kind]))
        elif kind == "string":
            steps.append(("str", None))
        elif kind in ("bytes", "records"):
            steps.append(("bytes", None))
        else:
            raise _Unscannable(f"field of {kind}")
    if flexible:
        steps.append(("tags", None))
    return tuple(steps)


def _uvarint(data: bytes | memoryview, p: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if p >= len(data) or shift > 28:
            raise _Unscannable("varint")
        b = data[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        shift += 7


def _skip_sized(data: bytes | memoryview, p: int, flexible: bool, legacy_width: str) -> int:
    """Past a string or bytes field (null included) at `p`."""
    if flexible:
        n, p = _uvarint(data, p)
        n -= 1
    else:
        (n,) = struct.unpack_from(legacy_width, data, p)
        p += struct.calcsize(legacy_width)
    if n > 0:
        p += n
    if p > len(data):
        raise _Unscannable("length past the request")
    return p


def _count(data: bytes | memoryview, p: int, flexible: bool) -> tuple[int, int]:
    """(array count, position after it); a null array counts 0."""
    if flexible:
        n, p = _uvarint(data, p)
        return max(n - 1, 0), p
    if p + 4 > len(data):
        raise _Unscannable("array count past the request")
    (n,) = struct.unpack_from(">i", data, p)
    return max(n, 0), p + 4


def _scan(data: bytes | memoryview, p: int, cls: type[Any], flexible: bool, budget: list[int]) -> int:
    """Past the entity of `cls` at `p`, taking its array entries off `budget[0]`; stops (the
    budget negative) as soon as it runs out."""
    for what, detail in _scan_plan(cls, flexible):
        if what == "fixed":
            p += detail
        elif what == "str":
            p = _skip_sized(data, p, flexible, ">h")
        elif what == "bytes":
            p = _skip_sized(data, p, flexible, ">i")
        elif what == "entity":
            p = _scan(data, p, detail, flexible, budget)
            if budget[0] < 0:
                return p
        elif what == "tags":
            n, p = _uvarint(data, p)
            for _ in range(n):
                _, p = _uvarint(data, p)
                size, p = _uvarint(data, p)
                p += size
        else:
            n, p = _count(data, p, flexible)
            budget[0] -= n
            if budget[0] < 0:
                return p
            if what == "array_fixed":
                p += n * detail
            elif what == "array_str":
                for _ in range(n):
                    p = _skip_sized(data, p, flexible, ">h")
            else:
                for _ in range(n):
                    p = _scan(data, p, detail, flexible, budget)
                    if budget[0] < 0:
                        return p
        if p > len(data):
            raise _Unscannable("past the request")
    return p


def too_many_entries(data: bytes | memoryview, start: int, schema: type[Any], max_entries: int) -> bool:
    """Whether the body at `data[start:]` holds more than `max_entries` array entries, found
    without decoding it: its arrays' counts are read and their entries skipped, and the walk
    stops at the bound, so it costs at most `max_entries` entries whatever the request holds
    (kio would build every entry: ~1 us each, seconds for 8 MiB). False when it cannot tell."""
    return bool(_prescan(data, start, schema, max_entries))


def _prescan(data: bytes | memoryview, start: int, schema: type[Any], max_entries: int) -> bool | None:
    """`too_many_entries`, or None when the walk cannot tell (bytes or a shape it does not follow)."""
    budget = [max_entries]
    try:
        _scan(data, start, schema, bool(schema.__flexible__), budget)
    except (_Unscannable, struct.error):
        return None
    return budget[0] < 0


@schema_cache
def _prescan_counts_all(cls: type[Any]) -> bool:
    """Whether the pre-scan of `cls` counts every entry kio would decode: it skips tagged fields
    whole, so an array in one (or in an entity in one) is counted only after decoding. Where it
    counts all, its "not over" is the answer and the count after decoding is not made again (a
    Produce over 100 partitions spent as long counting twice as kio spent decoding it)."""
    for f, hint in schema_fields(cls):
        inner = entity_type(hint)
        if "tag" in f.metadata:
            if is_array(hint) or inner is not None:
                return False
        elif inner is not None and not _prescan_counts_all(inner):
            return False
    return True


def decode_request(
    request: KafkaRequest, schema: type[Any], max_entries: int = ENTRIES_MAX
) -> tuple[Any, str | None]:
    """The body of `request` as `schema` (a kio request class) and its header's client_id.
    Raises `KafkaDecodeError` if the bytes do not parse, or if its arrays hold more than
    `max_entries` entries together. Bytes after the body are not read, as Kafka's own parser
    (AbstractRequest.parseRequest) never reads them: librdkafka 2.x sends a flexible Metadata's
    null topic array (every topic) as four zero bytes where a varint takes one, three of them
    left after the body."""
    counted = False  # whether the pre-scan's count is the answer
    try:
        header, used = entity_reader(schema.__header_schema__)(request.data, 0)
        if len(request.data) > PRESCAN_FROM_BYTES:
            over = _prescan(request.data, used, schema, max_entries)
            if over:
                raise KafkaDecodeError(
                    f"{schema.__name__} v{request.api_version}: more than {max_entries} array entries"
                )
            counted = over is not None and _prescan_counts_all(schema)
        body, _read = entity_reader(schema)(request.data, used)
    except KafkaDecodeError:
        raise
    except Exception as exc:  # kio raises its own errors and plain ones on short input
        raise KafkaDecodeError(f"{schema.__name__} v{request.api_version}: {exc}") from exc
    if (
        not counted and len(request.data) > max_entries and _entries_over(body, max_entries) < 0
    ):  # (fewer bytes: fewer entries)
        raise KafkaDecodeError(
            f"{schema.__name__} v{request.api_version}: more than {max_entries} array entries"
        )
    return body, getattr(header, "client_id", None)


def encode_response(correlation_id: int, response: Any) -> list[bytes]:
    """`response` (a kio response entity) framed for the wire: size, its header (v0 or v1, as
    its schema says), its body."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header_schema = response.__header_schema__
    entity_writer(header_schema)(out, header_schema(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(out, response)
    data = out.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - SIZE_BYTES)
    del data
    return [out.getvalue()]


def make(schema: type[Any], **values: Any) -> Any:
    """An entity of `schema` from `values`, leaving out those its version does not have: one
    place builds the answer of every version, each schema keeps its own fields."""
    names = _field_names(schema)
    return schema(**{k: v for k, v in values.items() if k in names})


@schema_cache
def _field_names(schema: type[Any]) -> frozenset[str]:
    return frozenset(f.name for f in fields(schema))


def required_fields(schema: type[Any]) -> list[str]:
    """The fields of `schema` without a default (what `make` must be given)."""
    return [f.name for f in fields(schema) if f.default is MISSING and f.default_factory is MISSING]


# ----------------------------------------------------------------------------- walking kio schemas
# (what broker/kafka/unsupported.py builds error answers with, and the tests build requests with)


@schema_cache
def schema_fields(cls: type[Any]) -> tuple[tuple[Any, Any], ...]:
    """(dataclass field, resolved type hint) of each field of a kio entity, in wire order."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in fields(cls))


def is_nullable(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def is_array(hint: Any) -> bool:
    return any(typing.get_origin(h) is tuple for h in (hint, *typing.get_args(hint)))


def entity_type(hint: Any) -> type[Any] | None:
    """The entity class of a field (itself, in an array, or nullable), or None for a primitive."""
    todo = [hint]
    while todo:
        h = todo.pop()
        if isinstance(h, type) and dataclasses.is_dataclass(h):
            return h
        todo.extend(typing.get_args(h))
    return None


def produce_v0_topics(data: bytes | memoryview) -> list[tuple[str, list[int]]] | None:
    """The topics and partitions of a Produce v0-2 request (header v1), None when acks=0."""
    pos = 8  # api key, version, correlation id
    (n,) = struct.unpack_from(">h", data, pos)
    pos += 2 + max(n, 0)
    acks, _timeout, count = struct.unpack_from(">hii", data, pos)
    pos += 10
    topics = []
    for _ in range(count):
        (n,) = struct.unpack_from(">h", data, pos)
        name = str(data[pos + 2 : pos + 2 + n], "utf-8")  # a large request's data is a view
        pos += 2 + n
        (parts,) = struct.unpack_from(">i", data, pos)
        pos += 4
        indexes = []
        for _ in range(parts):
            index, size = struct.unpack_from(">ii", data, pos)
            pos += 8 + max(size, 0)
            indexes.append(index)
        topics.append((name, indexes))
    return None if acks == 0 else topics


def produce_v0_refusal(request: KafkaRequest, topics: list[tuple[str, list[int]]], code: int) -> bytes:
    """A Produce v0-2 response (kio has no schemas for them) answering every partition of
    `topics` with `code`: v1+ add the throttle time, v2+ each partition's log append time."""
    out = [struct.pack(">ii", request.correlation_id, len(topics))]
    for name, indexes in topics:
        raw = name.encode()
        out.append(struct.pack(">h", len(raw)) + raw + struct.pack(">i", len(indexes)))
        for i in indexes:
            out.append(struct.pack(">ihq", i, code, -1))
            if request.api_version >= 2:
                out.append(struct.pack(">q", -1))
    if request.api_version >= 1:
        out.append(struct.pack(">i", 0))
    body = b"".join(out)
    return struct.pack(">i", len(body)) + body
