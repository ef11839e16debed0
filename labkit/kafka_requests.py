"""Kafka requests of any api and version built from kio's request schemas, for tests: empty (every
field its default or empty) or filled (two items in every array, distinct keys), and the frames a
client sends for them (tests/kafka, tests/security, and labkit/securitylab.py's SCRAM probe)."""

from __future__ import annotations

import dataclasses
import datetime
import io
import socket
import struct
import sys
import typing
import uuid
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from broker.kafka.codec import (
    KafkaFrameDecoder,
    KafkaRequest,
    entity_type,
    is_array,
    is_nullable,
    make,
    request_schema,
    response_schema,
)


def _scalar(kind: str | None, name: str, n: int, filled: bool) -> Any:
    match kind:
        case "int8" | "int16" | "int32" | "int64" | "uint16":
            return n % 100 if filled else 0
        case "float64":
            return 0.0
        case "bool":
            return False
        case "string":
            return f"{name}-{n}" if filled else ""
        case "bytes":
            return b""
        case "records":
            return None
        case "uuid":
            return uuid.UUID(int=n) if filled else None
        case "timedelta_i32" | "timedelta_i64":
            return datetime.timedelta(0)
        case "datetime_i64":
            return datetime.datetime.fromtimestamp(0, datetime.UTC)
        case "error_code":
            return ErrorCode.none
    raise TypeError(kind)


def build(cls: type[Any], filled: bool = False, n: int = 1, **given: Any) -> Any:
    """An entity of `cls`: empty, or `filled` with two items per array (keys numbered from `n`)."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
            continue
        hint = hints[f.name]
        kind = f.metadata.get("kafka_type")
        inner = entity_type(hint)
        if is_array(hint):
            if not filled:
                values[f.name] = ()
            elif inner is not None:
                values[f.name] = tuple(build(inner, True, n * 10 + i) for i in (1, 2))
            else:
                values[f.name] = tuple(_scalar(kind, f.name, n * 10 + i, True) for i in (1, 2))
        elif inner is not None:
            values[f.name] = None if is_nullable(hint) else build(inner, filled, n)
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        else:
            values[f.name] = _scalar(kind, f.name, n, filled)
    return cls(**values)


def frame(api_key: int, version: int, correlation_id: int, body: Any, client_id: str | None = "t") -> bytes:
    """`body` as a client sends it: size, header (the version its kio schema names), body (None:
    a header alone, e.g. an ApiVersions v0)."""
    schema = request_schema(api_key, version)
    assert schema is not None
    out = io.BytesIO()
    header_schema = schema.__header_schema__
    entity_writer(header_schema)(
        out,
        make(
            header_schema,
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    if body is not None:
        entity_writer(schema)(out, body)
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def read_exactly(s: socket.socket, n: int) -> bytes:
    """`n` bytes from a blocking socket (a raw test connection), or ConnectionError at its end."""
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def read_sized(s: socket.socket) -> bytes:
    """One size-prefixed item (a Kafka frame, or a bare SASL token of KIP-43), without its size."""
    return read_exactly(s, struct.unpack(">i", read_exactly(s, 4))[0])


def read_response(api_key: int, version: int, data: bytes) -> tuple[int, Any]:
    """(correlation id, body) of a response frame (size included), every byte used."""
    (size,) = struct.unpack_from(">i", data)
    assert size == len(data) - 4
    schema = response_schema(api_key, version)
    assert schema is not None
    header, used = entity_reader(schema.__header_schema__)(data, 4)
    body, more = entity_reader(schema)(data, 4 + used)
    assert 4 + used + more == len(data), f"{len(data) - 4 - used - more} bytes left over"
    return int(header.correlation_id), body


def rpc(
    port: int, api_key: int, version: int, body: Any, host: str = "127.0.0.1", timeout: float = 10
) -> Any:
    """The body of the answer to one request sent on a connection of its own to `port` (a
    core's direct port: a request a client would send to whichever broker it picks)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(frame(api_key, version, 1, body))
        data = read_sized(s)
    return read_response(api_key, version, struct.pack(">i", len(data)) + data)[1]


def describe_configs(port: int, resources: list[tuple[int, str]], keys: tuple[str, ...] | None = None) -> Any:
    """DescribeConfigs v4 of `resources` ((Kafka resource type, name): 2 a topic, 4 a broker)
    asked of the core at `port`: its results."""
    schema = request_schema(32, 4)
    assert schema is not None
    module = sys.modules[schema.__module__]
    body = make(
        schema,
        resources=tuple(
            make(module.DescribeConfigsResource, resource_type=t, resource_name=n, configuration_keys=keys)
            for t, n in resources
        ),
        include_synonyms=False,
        include_documentation=True,
    )
    return rpc(port, 32, 4, body).results


def error_codes(entity: Any) -> list[tuple[str, ErrorCode]]:
    """Every (field name, error code) in `entity`, depth first."""
    out: list[tuple[str, ErrorCode]] = []
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if f.metadata.get("kafka_type") == "error_code":
            out.append((f.name, value))
        for item in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(item):
                out.extend(error_codes(item))
    return out


def request_of(raw: bytes) -> KafkaRequest:
    """`raw` (one whole request frame) as the broker's decoder takes it."""
    decoder = KafkaFrameDecoder(1 << 20)
    decoder.feed(raw)
    req = decoder.next_frame()
    assert isinstance(req, KafkaRequest)
    return req
