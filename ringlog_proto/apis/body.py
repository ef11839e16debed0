"""A message body's primitives (`Writer`, `Reader`) and the base types every API's request and
response derive from. Sans-I/O.

Body primitives (big-endian): i8 i16 i32 i64 u16 u32 as usual; `str` = u16 length + UTF-8;
`bytes` = u32 length + raw bytes; `array<T>` = u32 count + T repeated. A body that does not parse
is a `MalformedBody`: the frame was delimited correctly, so the broker *answers* it
(INVALID_REQUEST) and keeps the connection; see frames.ProtocolError for the case where it cannot.
"""

from __future__ import annotations

import builtins
import functools
import struct
from dataclasses import dataclass
from typing import ClassVar

from ringlog_proto.apis.codes import ApiKey, ErrorCode
from ringlog_proto.frames import Buffer, Frame


class MalformedBody(Exception):
    """A frame whose body does not parse; answerable with INVALID_REQUEST."""


class Writer:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[Buffer] = []

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
        self.parts.append(b)  # kept as is: no copy of record data
        return self

    def array(self, n: int) -> Writer:
        return self.pack("I", n)


@functools.cache
def _struct(fmt: str) -> struct.Struct:
    return struct.Struct(">" + fmt)


class Reader:
    """Fields read in order from a body. Its methods `int`, `str` and `bytes` hide the builtins in
    the class body: annotations after them name those as `builtins.int` and `builtins.bytes`."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview) -> None:
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

    def bytes(self) -> builtins.bytes:
        return self._take(self.int("I"))

    def view(self, n: builtins.int) -> memoryview:
        """The next `n` bytes as a view of the body, not a copy: for record data, the bulk of a
        request, which a slice of `bytes` would copy once more (a 64 KiB memmove per produced
        batch). The caller has read the field's length (with the fields before it, in one unpack)."""
        if len(self.buf) - self.pos < n:
            raise MalformedBody(f"field of {n} bytes at byte {self.pos} runs past the body")
        start = self.pos
        self.pos = start + n
        return memoryview(self.buf)[start : start + n]

    def array(self, item_min_bytes: builtins.int = 1, max_items: builtins.int | None = None) -> builtins.int:
        n = self.int("I")
        if n * item_min_bytes > len(self.buf) - self.pos:
            raise MalformedBody(f"array of {n} items cannot fit in the {len(self.buf) - self.pos} bytes left")
        if max_items is not None and n > max_items:
            raise MalformedBody(f"array of {n} items: a request's arrays hold at most {max_items}")
        return n

    def _take(self, n: builtins.int) -> builtins.bytes:
        return builtins.bytes(self.view(n))

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise MalformedBody(f"{len(self.buf) - self.pos} unexpected bytes after the body")


# Items one array of a request may hold (topic names, protocols, assignments, partitions): what a
# client names exists (the broker's partitions are bounded, --max-partitions), and a request of
# 8 MiB of names held its core for seconds (docs/LIMITS.md). More: INVALID_REQUEST.
REQUEST_ARRAY_MAX = 16_384


@dataclass(frozen=True, slots=True)
class Request:
    API_KEY: ClassVar[ApiKey]
    PARTITIONED: ClassVar[bool] = False

    def version(self) -> int | None:
        """The version this request is sent at when it is not its api's current one (None):
        a request whose older layout still says all it has to say."""
        return None

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
class Response:
    API_KEY: ClassVar[ApiKey]
    error: ErrorCode = ErrorCode.NONE
    message: str = ""

    def write(self, w: Writer) -> None:
        """The fields after error and message (written only when error is NONE)."""

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {}


def _error(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR
