"""The compression of a batch's record section, every codec Kafka has, in one place for the
clients and the broker alike (cramjam's Rust, a dependency of the package): `compress`, the
batches our producers send and those the broker rewrites (the log cleaner's, and a topic's
compression.type); `decompress`, what consumers and the Spark source decode and what the
cleaner inflates; `decompress_bounded`, the broker's check of produced batches, which never
inflates past a bound. Consumers inflate with the library the broker checked the batch with, so
what one accepts the other decodes. The codec numbers are the header's attribute bits
(batch_header.py).
"""

from __future__ import annotations

import struct
from typing import Any

from ringlog_proto.batch_header import (
    CODEC_NAMES,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
)
from ringlog_proto.record import BatchError


def decompress(data: bytes | bytearray | memoryview, codec: int) -> bytes:
    """The record section of a compressed batch, inflated into bytes of its own, for every codec
    Kafka has (gzip streams of one or more members, snappy raw or in Java's xerial framing, lz4
    frames, zstd frames): what a consumer decodes, and what the log cleaner rewrites (on a thread
    other than the core's loop, which checks produced batches with `decompress_bounded`, whose
    buffer is shared). No bound: a consumer holds what its broker checked, and a stored batch was
    inflated within its bound when it was produced. A `BatchError` names the codec of a section
    that does not inflate."""
    if codec == COMPRESSION_SNAPPY:
        return _unsnappy_bounded(data, 1 << 62)
    name = CODEC_NAMES.get(codec)
    if name is None or codec == COMPRESSION_NONE:
        raise BatchError(f"unknown compression codec {codec}")
    try:
        return bytes(getattr(_cramjam(codec), name).decompress(data))
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


def compress(section: bytes | bytearray | memoryview, codec: int, level: int | None = None) -> bytes:
    """A record section compressed with `codec`, any of Kafka's: by our producers, and by the
    broker where it writes a batch anew (the log cleaner, which rewrites a compressed batch with
    the codec it came with, as Kafka's cleaner does; an append to a topic whose compression.type
    names another codec than the producer's). `level` is Kafka's compression.<codec>.level
    (None: Kafka's default; snappy has none). Framed as Kafka's own writers frame them, which
    every client reads: gzip and zstd frames, snappy in Java's xerial framing, lz4 frames of
    independent 64 KiB blocks (the Java client refuses linked blocks, liblz4's default). lz4's
    level 9, Kafka's default, is the fast compressor, as Kafka's Lz4BlockOutputStream makes it;
    other levels are liblz4's HC levels."""
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
        import cramjam  # noqa: PLC0415 - the codec library, loaded on the first compressed batch
    except ImportError:
        name = CODEC_NAMES[codec]
        raise BatchError(
            f"{name} batches cannot be compressed or inflated here: cramjam (a dependency of ringlog) "
            "is not installed"
        ) from None
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
