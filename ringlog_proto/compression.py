"""The compression of a batch's record section: gzip both ways for clients (the stdlib's zlib),
and, for the broker, every codec Kafka has in cramjam: the bounded inflation with which it checks
compressed batches (`decompress_bounded`), and the inflation and compression of the batches it
rewrites (`decompress_stored`, `compress_stored`: the log cleaner's, and a topic's
compression.type). The codec numbers are the header's attribute bits (batch_header.py).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from ringlog_proto.batch_header import (
    CODEC_NAMES,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
)
from ringlog_proto.record import BatchError


def compress(section: bytes, codec: int) -> bytes:
    """The record section compressed with `codec` (gzip only here: the stdlib has it)."""
    if codec == COMPRESSION_GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip stream, mtime 0
        return c.compress(section) + c.flush()
    raise BatchError(
        f"cannot compress with {CODEC_NAMES.get(codec, f'codec {codec}')}: only gzip is built in"
    )


def decompress(data: bytes | bytearray | memoryview, codec: int) -> bytes:
    """The record section of a compressed batch, uncompressed, for clients' decode: gzip always
    (stdlib zlib); the others raise a BatchError naming the codec (clients need no codec
    library; the broker checks every codec with `decompress_bounded`)."""
    if codec == COMPRESSION_GZIP:
        try:
            d = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, as producers write
            out = d.decompress(data)
            while d.eof and d.unused_data:  # a multi-member gzip stream
                rest = d.unused_data
                d = zlib.decompressobj(47)
                out += d.decompress(rest)
            if not d.eof:
                raise BatchError("gzip record section is truncated")
            return out
        except zlib.error as exc:
            raise BatchError(f"gzip record section does not decompress: {exc}") from None
    name = CODEC_NAMES.get(codec)
    if name is None:
        raise BatchError(f"unknown compression codec {codec}")
    raise BatchError(
        f"the batch is {name}-compressed, and this client decodes only uncompressed and gzip batches "
        f"(no {name} library)"
    )


def decompress_stored(data: bytes | bytearray | memoryview, codec: int) -> bytes:
    """The record section of a stored batch, inflated, for the broker's log cleaner: every codec
    (cramjam), into a buffer of its own, so that a thread other than the core's loop may call it
    while the loop checks produced batches with `decompress_bounded` (whose buffer is shared). A
    stored batch was inflated within its bound when it was produced, so none is asked here."""
    if codec == COMPRESSION_SNAPPY:
        return _unsnappy_bounded(data, 1 << 62)
    name = CODEC_NAMES.get(codec)
    if name is None or codec == COMPRESSION_NONE:
        raise BatchError(f"unknown compression codec {codec}")
    try:
        return bytes(getattr(_cramjam(codec), name).decompress(bytes(data)))
    except BatchError:
        raise
    except Exception as exc:  # cramjam.DecompressionError
        raise BatchError(f"{name} record section does not decompress: {exc}") from None


_XERIAL_BLOCK = 32 * 1024  # uncompressed bytes per block, as Java's SnappyOutputStream writes them
# Kafka's compression.<codec>.level defaults (its GzipCompression, Lz4Compression, ZstdCompression):
# gzip -1 is zlib's own default, 6.
GZIP_LEVEL_DEFAULT = -1
LZ4_LEVEL_DEFAULT = 9
ZSTD_LEVEL_DEFAULT = 3
_ZLIB_DEFAULT = 6
_LZ4_FAST = 1  # liblz4's frame levels below 3 are its fast compressor


def compress_stored(section: bytes | bytearray | memoryview, codec: int, level: int | None = None) -> bytes:
    """A record section compressed with `codec`, any of Kafka's, by the broker: the log cleaner,
    which rewrites a compressed batch with the codec it came with (as Kafka's cleaner does), and
    an append to a topic whose compression.type names another codec than the producer's.
    `level` is Kafka's compression.<codec>.level (None: Kafka's default; snappy has none).
    Framed as Kafka's own writers frame them, which every client reads: gzip and zstd frames,
    snappy in Java's xerial framing, lz4 frames of independent 64 KiB blocks (the Java client
    refuses linked blocks, liblz4's default). lz4's level 9, Kafka's default, is the fast
    compressor, as Kafka's Lz4BlockOutputStream makes it; other levels are liblz4's HC levels."""
    name = CODEC_NAMES.get(codec)
    if name is None or codec == COMPRESSION_NONE:
        raise BatchError(f"unknown compression codec {codec}")
    lib = _cramjam(codec)
    if codec == COMPRESSION_SNAPPY:
        parts = [_XERIAL_MAGIC, struct.pack(">ii", 1, 1)]
        for i in range(0, len(section), _XERIAL_BLOCK):
            block = bytes(lib.snappy.compress_raw(section[i : i + _XERIAL_BLOCK]))
            parts += (struct.pack(">i", len(block)), block)
        return b"".join(parts)
    if codec == COMPRESSION_LZ4:
        lz4_level = LZ4_LEVEL_DEFAULT if level is None else level
        c = lib.lz4.Compressor(
            level=_LZ4_FAST if lz4_level == LZ4_LEVEL_DEFAULT else lz4_level,
            content_checksum=False,
            block_linked=False,
        )
        c.compress(bytes(section))  # its streaming API takes bytes only
        return bytes(c.finish())
    if codec == COMPRESSION_GZIP:
        gzip_level = _ZLIB_DEFAULT if level is None or level == GZIP_LEVEL_DEFAULT else level
        return bytes(lib.gzip.compress(section, level=gzip_level))
    return bytes(lib.zstd.compress(section, level=ZSTD_LEVEL_DEFAULT if level is None else level))


class DecompressedTooLarge(BatchError):
    """A compressed record section that inflates past the bound it was checked against: a
    decompression bomb, or simply too much for one batch (MESSAGE_TOO_LARGE, not corruption)."""


_XERIAL_MAGIC = b"\x82SNAPPY\x00"  # Java's snappy framing: magic, i32 version, i32 compatible
_XERIAL_HEADER = 16
_OVERFLOW = "failed to write whole buffer"  # what cramjam says when its output buffer is full
_scratch = bytearray()  # the output of a bounded decompression, reused: one per process (core)


def _cramjam(codec: int) -> Any:
    try:
        import cramjam  # noqa: PLC0415 - the broker's codec library, loaded on the first such batch
    except ImportError:
        name = CODEC_NAMES[codec]
        raise BatchError(f"{name} batches cannot be checked here: cramjam is not installed") from None
    return cramjam


def decompress_bounded(data: bytes | bytearray | memoryview, codec: int, limit: int) -> bytes | memoryview:
    """The record section of a compressed batch, inflated, if it holds at most `limit` bytes:
    never more than `limit` + 1 bytes are produced, whatever the input claims (a decompression
    bomb costs its first `limit` bytes, not its size). The broker's check of produced batches,
    for every codec Kafka has (gzip streams of one or more members, snappy raw or in Java's
    xerial framing, lz4 frames, zstd frames), all in cramjam's Rust (its gzip inflates in 2/3 of
    the stdlib zlib's time: bench/compressed_validation.py). Raises
    `DecompressedTooLarge` past `limit`, `BatchError` for a stream that does not decompress
    (truncated, garbage, trailing bytes). The result may be a view of a buffer reused by the
    next call."""
    if codec == COMPRESSION_SNAPPY:
        return _unsnappy_bounded(data, limit)
    name = CODEC_NAMES.get(codec)
    if name is None or codec == COMPRESSION_NONE:
        raise BatchError(f"unknown compression codec {codec}")
    lib = getattr(_cramjam(codec), name)  # cramjam.gzip, .lz4 (frames), .zstd
    global _scratch  # noqa: PLW0603 - grown once to the largest bound asked for, then reused
    if len(_scratch) < limit + 1:
        _scratch = bytearray(limit + 1)
    out = memoryview(_scratch)[: limit + 1]
    try:
        n = lib.decompress_into(data, out)
    except Exception as exc:  # cramjam.DecompressionError: its text tells an overflow apart
        out.release()
        if _OVERFLOW in str(exc):
            raise DecompressedTooLarge(f"{name} record section inflates past {limit} bytes") from None
        raise BatchError(f"{name} record section does not decompress: {exc}") from None
    if n > limit:
        out.release()
        raise DecompressedTooLarge(f"{name} record section inflates past {limit} bytes")
    return out[:n]


def _unsnappy_bounded(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    snappy = _cramjam(COMPRESSION_SNAPPY).snappy
    blocks: list[bytes | bytearray | memoryview] = []
    view = memoryview(data)
    if bytes(view[: len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:  # Java's framing; librdkafka writes raw
        p = _XERIAL_HEADER
        while p < len(view):
            if len(view) - p < 4:
                raise BatchError("snappy (xerial) record section: a block length is cut")
            (n,) = struct.unpack_from(">i", view, p)
            if n < 0 or n > len(view) - p - 4:
                raise BatchError(f"snappy (xerial) record section: a block of {n} bytes runs past it")
            blocks.append(view[p + 4 : p + 4 + n])
            p += 4 + n
    else:
        blocks.append(view)
    parts = []
    total = 0
    try:
        for block in blocks:
            total += snappy.decompress_raw_len(block)  # the block's own header: nothing inflated
            if total > limit:
                raise DecompressedTooLarge(f"snappy record section inflates past {limit} bytes")
            parts.append(bytes(snappy.decompress_raw(block)))
    except DecompressedTooLarge:
        raise
    except Exception as exc:  # cramjam.DecompressionError
        raise BatchError(f"snappy record section does not decompress: {exc}") from None
    out = b"".join(parts)
    if len(out) != total:
        raise BatchError("snappy record section: a block inflates to other than its stated length")
    return out
