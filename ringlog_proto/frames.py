"""Frames: how requests and responses are delimited on a TCP stream. Sans-I/O.

Rules this module keeps:
- No sockets. `FrameDecoder.feed(bytes)` only buffers; `next_frame()` returns a `Frame` or
  `NEED_DATA`; `encode_frame(...)` returns bytes. Every I/O loop (uvloop, io_uring, the clients)
  drives this one codec (the h11 pattern); `FrameReader` is the same decoder for a reader that
  receives into the decoder's own buffer (the client's `BufferedProtocol`).
- Any byte string either yields frames or raises `ProtocolError`; never another exception. A
  `ProtocolError` means the stream cannot be resynchronised: the connection is closed.
- The partition identity (topic id, partition index) sits at a fixed offset of *every* frame, so a
  BPF program can read it from the first bytes of a connection without parsing anything (its C
  copy of the offsets, bpf/steer_rules.h, is checked against the constants here).
- No module outside ringlog_proto reads or writes frame bytes at an offset: re-stamping a frame
  (`set_correlation_id`, `set_identity`, `reframe`) and sizing one (`peek_frame_size`) are here,
  and reading a request's field before decoding it is in messages.py (`peek_*`).

Fileformat (frame version 1, integers big-endian, 24-byte header):

    offset size field
    0      4    length          u32  bytes after this field (20 + body length)
    4      1    magic           u8   0x52 ("R")
    5      1    frame_version   u8   1
    6      2    api_key         u16  which API (see messages.ApiKey)
    8      2    api_version     u16  version of that API's body layout
    10     2    flags           u16  bit 0: this is a response; other bits zero
    12     4    correlation_id  u32  chosen by the client, echoed in the response
    16     4    topic_id        u32  partition identity: broker-assigned topic id (0 if none)
    20     4    partition       u32  partition index within the topic (0 if none)
    24     ...  body            layout per API and version (messages.py)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

MAGIC: Final = 0x52
FRAME_VERSION: Final = 1
HEADER_SIZE: Final = 24
LENGTH_SIZE: Final = 4
FLAG_RESPONSE: Final = 0x0001
FLAGS_KNOWN: Final = FLAG_RESPONSE
MAGIC_OFFSET: Final = 4  # what tells our frames from another protocol's on a shared port
CORRELATION_ID_OFFSET: Final = 12
TOPIC_ID_OFFSET: Final = 16  # where BPF finds the partition identity in the first frame
PARTITION_OFFSET: Final = 20

# A produce request carries batches of up to max_batch_bytes (1 MiB by default) and a fetch
# response up to the client's max_bytes (1 MiB by default, plus one batch): 8 MiB leaves room for
# both with their headers while bounding what one connection can make the broker buffer.
FRAME_BYTES_MAX_DEFAULT: Final = 8 * 1024 * 1024
READ_MIN: Final = 64 * 1024  # free space a FrameReader's `buffer()` offers at least

_HEADER = struct.Struct(">IBBHHHIII")
_U32 = struct.Struct(">I")
assert _HEADER.size == HEADER_SIZE
assert struct.calcsize(">IBBHHH") == CORRELATION_ID_OFFSET
assert struct.calcsize(">IBBHHHI") == TOPIC_ID_OFFSET
assert struct.calcsize(">IBBHHHII") == PARTITION_OFFSET


# What a frame is written from: bytes, or record data passed on as it is (a view of a received
# body, a buffer read from a segment) rather than copied; writev takes any of them.
Buffer = bytes | bytearray | memoryview


class ProtocolError(Exception):
    """Bytes that cannot be framed. The stream is lost: close the connection."""


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


@dataclass(frozen=True, slots=True)
class Frame:
    api_key: int
    api_version: int
    flags: int
    correlation_id: int
    topic_id: int
    partition: int
    # bytes, or a read-only view of where a lending decoder received a large body (native/frames.c)
    body: bytes | memoryview

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)


def frame_struct(body_format: str) -> struct.Struct:
    """A frame header and a body of fixed `body_format` (struct codes, big-endian) in one Struct:
    a hot reply packed whole in one call. Its fields: `encode_header`'s order from the length on
    (the length is `size - LENGTH_SIZE`), then the body's."""
    return struct.Struct(_HEADER.format + body_format)


def encode_header(
    body_length: int,
    api_key: int,
    api_version: int,
    correlation_id: int,
    topic_id: int = 0,
    partition: int = 0,
    flags: int = 0,
) -> bytes:
    """The 24-byte header of a frame whose body is `body_length` bytes (send the body after it)."""
    return _HEADER.pack(
        HEADER_SIZE - LENGTH_SIZE + body_length,
        MAGIC,
        FRAME_VERSION,
        api_key,
        api_version,
        flags,
        correlation_id,
        topic_id,
        partition,
    )


def encode_frame(
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: bytes = b"",
    topic_id: int = 0,
    partition: int = 0,
    flags: int = 0,
) -> bytes:
    return encode_header(len(body), api_key, api_version, correlation_id, topic_id, partition, flags) + body


def reframe(frame: Frame, correlation_id: int) -> list[Buffer]:
    """`frame` as buffers to write (header, body) under another correlation id: how a frame is
    forwarded between cores and its answer relayed back, without copying the body."""
    header = encode_header(
        len(frame.body),
        frame.api_key,
        frame.api_version,
        correlation_id,
        frame.topic_id,
        frame.partition,
        frame.flags,
    )
    return [header, frame.body]


def set_correlation_id(buf: bytearray | memoryview, correlation_id: int, pos: int = 0) -> None:
    """Re-stamp the correlation id of the encoded frame at `pos` in place (a frame built once and
    sent many times, or built before its id was known)."""
    _U32.pack_into(buf, pos + CORRELATION_ID_OFFSET, correlation_id)


def set_identity(buf: bytearray | memoryview, topic_id: int, partition: int, pos: int = 0) -> None:
    """Stamp a partition identity into the encoded frame at `pos` in place: a request that is not
    about a partition (an ApiVersions hello) still names one for the steering program."""
    _U32.pack_into(buf, pos + TOPIC_ID_OFFSET, topic_id)
    _U32.pack_into(buf, pos + PARTITION_OFFSET, partition)


def peek_frame_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """Whole size of the frame at `pos` from its length field, or None if fewer than 4 bytes are
    there. Unchecked (magic, version, limits): for a reader that only wants to know how much to
    read before handing the bytes to `FrameDecoder`."""
    if len(buf) - pos < LENGTH_SIZE:
        return None
    return LENGTH_SIZE + _U32.unpack_from(buf, pos)[0]


def starts_like_frame(buf: bytes | bytearray | memoryview, pos: int = 0) -> bool | None:
    """Whether the bytes at `pos` begin one of our frames (the magic after the length), or None
    while fewer than `MAGIC_OFFSET + 1` bytes are there: how a listener serving two protocols on
    one port tells ours from the other by a connection's first bytes."""
    if len(buf) - pos <= MAGIC_OFFSET:
        return None
    return buf[pos + MAGIC_OFFSET] == MAGIC


class StreamDecoder:
    """What every incremental decoder of a byte stream keeps (ours here, Kafka's in
    broker/kafka/codec.py): feed bytes in any pieces, take whole frames out with `next_frame`.

    Holds at most one frame plus what arrived after it; a subclass refuses a declared length above
    `max_frame_bytes` as soon as it sees it, before any of the body is buffered. The buffer grows
    only as bytes arrive (never to a declared length), and the bytes of frames already taken are
    let go as soon as `next_frame` runs out of whole frames (`_need_data`): a connection that goes
    quiet after a large frame, or stalls in the middle of one, holds only what is unread.
    """

    __slots__ = ("_buf", "_pos", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]  # compact: amortised O(1) per byte
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames (a client vanishing mid-frame leaves some)."""
        return len(self._buf) - self._pos

    def _need_data(self) -> _NeedData:
        """Let go of the frames already taken (a memmove of at most the partial frame that followed
        them in the same read, once per read that completed a frame: amortised O(1) per byte)."""
        if self._pos:
            if self._pos == len(self._buf):
                self._buf = bytearray()
            else:
                del self._buf[: self._pos]
            self._pos = 0
        return NEED_DATA


class FrameDecoder(StreamDecoder):
    """Incremental decoder of our frames (the bounds and buffering of `StreamDecoder`)."""

    __slots__ = ()

    def __init__(self, max_frame_bytes: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        assert max_frame_bytes >= HEADER_SIZE
        super().__init__(max_frame_bytes)

    def next_frame(self) -> Frame | _NeedData:
        buf = self._buf
        frame = self._parse(buf, self._pos, len(buf))
        return self._need_data() if frame is None else frame

    def _parse(self, buf: bytearray, pos: int, end: int) -> Frame | None:
        """The whole frame at `pos` in `buf[:end]` (and `_pos` moved past it), or None."""
        if end - pos < HEADER_SIZE:
            if end - pos >= 6:
                self._check_prefix(buf, pos)
            return None
        length, _magic, _version, api_key, api_version, flags, corr, topic_id, partition = (
            _HEADER.unpack_from(buf, pos)
        )
        self._check_prefix(buf, pos)
        if length < HEADER_SIZE - LENGTH_SIZE:
            raise ProtocolError(f"frame length {length} is shorter than the {HEADER_SIZE}-byte header")
        if length + LENGTH_SIZE > self.max_frame_bytes:
            raise ProtocolError(
                f"frame of {length + LENGTH_SIZE} bytes exceeds the maximum {self.max_frame_bytes}"
            )
        if flags & ~FLAGS_KNOWN:
            raise ProtocolError(f"unknown frame flags {flags:#06x}")
        fend = pos + LENGTH_SIZE + length
        if end < fend:
            return None
        with memoryview(buf) as view:  # one copy of the body, not two (a bytearray slice copies)
            body = bytes(view[pos + HEADER_SIZE : fend])
        self._pos = fend
        return Frame(api_key, api_version, flags, corr, topic_id, partition, body)

    def _check_prefix(self, buf: bytearray, pos: int) -> None:
        """Reject a wrong magic or version as soon as those bytes are here, not after a whole header."""
        if buf[pos + MAGIC_OFFSET] != MAGIC:
            raise ProtocolError(
                f"bad frame magic {buf[pos + MAGIC_OFFSET]:#04x} (expected {MAGIC:#04x}): "
                "not a ringlog client?"
            )
        if buf[pos + 5] != FRAME_VERSION:
            raise ProtocolError(
                f"unsupported frame version {buf[pos + 5]} (this broker speaks {FRAME_VERSION})"
            )


def _native_frames() -> tuple[type, type] | None:
    """native/frames.c's `Decoder` and `Reader`, configured with this module's `Frame`, or None
    when it is not built. Its copies of the layout's constants must be these (a mismatch is a
    stale build)."""
    try:
        from native._frames import LAYOUT as built_layout  # noqa: PLC0415 - optional, compiled
        from native._frames import Decoder, Reader, configure  # noqa: PLC0415 - by `pip install -e .`
    except ImportError:
        return None
    ours = {
        "MAGIC": MAGIC,
        "FRAME_VERSION": FRAME_VERSION,
        "HEADER_SIZE": HEADER_SIZE,
        "LENGTH_SIZE": LENGTH_SIZE,
        "MAGIC_OFFSET": MAGIC_OFFSET,
        "FLAGS_KNOWN": FLAGS_KNOWN,
        "READ_MIN": READ_MIN,
    }
    if built_layout != ours:
        raise RuntimeError(f"native/frames.c has {built_layout}, ringlog_proto/frames.py {ours}: rebuild it")
    configure(Frame, NEED_DATA, ProtocolError)
    return Decoder, Reader


_NATIVE = _native_frames()
# The type of what `frame_decoder` makes when native/frames.c is built, else None. Only it lends
# its space to a receive (`buffer(n)`, `received(k)`: native/frames.c, "Lending"), which spares
# the copy from a receive buffer into the decoder's; FrameDecoder has neither. To a type checker
# it is a FrameReader: FrameDecoder's interface with those two (as `frame_decoder` says FrameDecoder).
LENDING_DECODER: Final[type[FrameReader] | None] = _NATIVE[0] if _NATIVE is not None else None


def frame_decoder(max_frame_bytes: int = FRAME_BYTES_MAX_DEFAULT) -> FrameDecoder:
    """A decoder of our frames: native/frames.c's twin of `FrameDecoder` when it is built (`feed`,
    `next_frame`, `buffered` and `max_frame_bytes`, the same frames and errors, a fraction of the
    cost per frame), else `FrameDecoder`."""
    if _NATIVE is not None:
        decoder: FrameDecoder = _NATIVE[0](max_frame_bytes)
        return decoder
    return FrameDecoder(max_frame_bytes)


def frame_reader(max_frame_bytes: int = FRAME_BYTES_MAX_DEFAULT) -> FrameReader:
    """A reader of our frames that is received into: native/frames.c's twin of `FrameReader` when
    it is built (`buffer`, `received`, `feed`, `next_frame`, `buffered`, `max_frame_bytes`; a view
    still held when the buffer must grow raises BufferError there), else `FrameReader`."""
    if _NATIVE is not None:
        reader: FrameReader = _NATIVE[1](max_frame_bytes)
        return reader
    return FrameReader(max_frame_bytes)


class FrameReader(FrameDecoder):
    """A `FrameDecoder` for a reader that receives straight into the decoder's buffer (asyncio's
    `BufferedProtocol`, as the client's connections do): `buffer()` is the writable space after
    the bytes held, `received(n)` counts `n` bytes written there, `next_frame()` as ever.

    Unlike `FrameDecoder`, the buffer is kept for the reader's life and reused, grown to hold the
    largest frame met (never past `max_frame_bytes`). A stream of large frames (fetch responses)
    then costs no allocation and no copy before a frame's body is copied into its `bytes`: with
    `feed`, every read was a `bytes` object, appended to a buffer that grew and was freed per
    frame, and glibc gave those megabytes back to the kernel and faulted them in again, frame
    after frame (most of a 1 MiB fetch's client cost on a VM). The price is that memory: an idle
    reader holds the buffer its largest frame needed.
    """

    __slots__ = ("_end",)

    READ_MIN: Final = READ_MIN

    def __init__(self, max_frame_bytes: int = FRAME_BYTES_MAX_DEFAULT, size: int = 64 * 1024) -> None:
        super().__init__(max_frame_bytes)
        self._buf = bytearray(size)
        self._end = 0  # bytes held: _buf[_pos:_end]

    @property
    def buffered(self) -> int:
        return self._end - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        view = self.buffer(n)
        view[:n] = data
        view.release()
        self.received(n)

    def buffer(self, least: int = 1) -> memoryview:
        """Writable space for at least `least` bytes (and at least READ_MIN) after the bytes held:
        room for the whole frame whose header is held, when it fits `max_frame_bytes`. Release
        the view (the receiving transport does) before the next call."""
        buf = self._buf
        pos = self._pos
        end = self._end
        want = max(least, self.READ_MIN)
        if len(buf) - end < want:
            held = end - pos
            size = peek_frame_size(buf, pos) if held >= LENGTH_SIZE else None
            need = held + want
            if size is not None and size <= self.max_frame_bytes:
                need = max(need, size)
            if need > len(buf):
                new = bytearray(max(need, min(2 * len(buf), self.max_frame_bytes + self.READ_MIN)))
                new[:held] = memoryview(buf)[pos:end]
                self._buf = buf = new
            elif held:
                with memoryview(buf) as view:
                    view[:held] = view[pos:end]
            self._pos = 0
            self._end = end = held
        return memoryview(buf)[end:]

    def received(self, n: int) -> None:
        """`n` bytes were written at the start of the last `buffer()`."""
        self._end += n

    def next_frame(self) -> Frame | _NeedData:
        frame = self._parse(self._buf, self._pos, self._end)
        if frame is not None:
            return frame
        if self._pos == self._end:  # nothing held: start over at the front, no copy
            self._pos = self._end = 0
        return NEED_DATA
