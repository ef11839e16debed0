"""Kafka's consumer protocol: what a group member says under an assignor, and what it is given.

Rules this module keeps:
- The bytes are Kafka's own (ConsumerProtocolSubscription and ConsumerProtocolAssignment, in
  Kafka's primitives: i16 version, i16-length strings, i32 counts, i32-length nullable bytes), so a
  group may mix our Consumer with Kafka consumers: the broker passes these bytes through untouched
  (JoinGroup metadata, SyncGroup assignments) and only members read them.
- We write version 0 and read any version: later versions only append fields (owned partitions,
  generation, rack), which a range assignment does not need, so they are skipped.
- Sans-I/O, like the rest of ringlog_proto. A member's bytes that do not parse are a
  `ValueError`: the leader then gives that member nothing rather than guess.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

CONSUMER_PROTOCOL_TYPE = "consumer"  # JoinGroup's protocol_type for consumers (Kafka's name)
VERSION = 0

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None


def _str(s: str) -> bytes:
    raw = s.encode()
    if len(raw) > 0x7FFF:
        raise ValueError(f"a name of {len(raw)} bytes does not fit Kafka's i16 string length")
    return _I16.pack(len(raw)) + raw


def _nullable_bytes(b: bytes | None) -> bytes:
    return _I32.pack(-1) if b is None else _I32.pack(len(b)) + b


def encode_subscription(topics: Iterable[str], user_data: bytes | None = None) -> bytes:
    names = sorted(set(topics))
    parts = [_I16.pack(VERSION), _I32.pack(len(names)), *map(_str, names), _nullable_bytes(user_data)]
    return b"".join(parts)


def encode_assignment(partitions: Mapping[str, Iterable[int]], user_data: bytes | None = None) -> bytes:
    out = [_I16.pack(VERSION), _I32.pack(len(partitions))]
    for topic in sorted(partitions):
        indexes = sorted(partitions[topic])
        out.append(_str(topic))
        out.append(_I32.pack(len(indexes)))
        out.append(struct.pack(f">{len(indexes)}i", *indexes))
    out.append(_nullable_bytes(user_data))
    return b"".join(out)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"consumer protocol bytes end before a field of {n} bytes at {self.pos}")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def i16(self) -> int:
        return int(_I16.unpack(self.take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def str(self) -> str:
        try:
            return self.take(self.i16()).decode()
        except UnicodeDecodeError as exc:
            raise ValueError("a consumer protocol string is not UTF-8") from exc

    def count(self) -> int:
        n = self.i32()
        if n < 0 or n > len(self.buf) - self.pos:
            raise ValueError(f"an array of {n} items cannot fit in {len(self.buf) - self.pos} bytes")
        return n

    def nullable_bytes(self) -> bytes | None:
        n = self.i32()
        return None if n < 0 else self.take(n)


def decode_subscription(data: bytes) -> Subscription:
    """The topics a member subscribes to (any version; fields after user_data are skipped)."""
    r = _Reader(data)
    if r.i16() < 0:
        raise ValueError("a negative consumer protocol version")
    topics = tuple(r.str() for _ in range(r.count()))
    user_data = r.nullable_bytes() if r.pos < len(data) else None
    return Subscription(topics, user_data)


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """topic -> partitions assigned (any version; an empty assignment is Kafka's "nothing")."""
    if not data:
        return {}
    r = _Reader(data)
    if r.i16() < 0:
        raise ValueError("a negative consumer protocol version")
    out: dict[str, list[int]] = {}
    for _ in range(r.count()):
        topic = r.str()
        out[topic] = [r.i32() for _ in range(r.count())]
    return out
