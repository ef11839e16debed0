"""The record section's codecs (ringlog_proto/compression.py), for clients and broker alike, against
other implementations: what kafka-python and librdkafka's framings write, `decompress` reads
(gzip of one member or several, snappy raw and in Java's xerial blocks, lz4 frames, zstd frames
with and without a content size); what `compress` writes, kafka-python's and aiokafka's decoders
read; and `decompress` inflates exactly what the broker's bounded check does."""

from __future__ import annotations

import gzip
import random

import pytest

from ringlog_proto.batch import CODEC_NAMES, BatchError
from ringlog_proto.compression import compress, decompress, decompress_bounded

kafka_codec = pytest.importorskip("kafka.codec", reason="kafka-python is not installed")
aiokafka_codec = pytest.importorskip("aiokafka.codec", reason="aiokafka is not installed")
cramjam = pytest.importorskip("cramjam")
zstandard = pytest.importorskip("zstandard")

CODECS = {name: number for number, name in CODEC_NAMES.items() if number}


def section(size: int) -> bytes:
    """Record-section-like bytes: text that compresses, with some noise that does not."""
    rng = random.Random(size)
    words = [b"click", b"view", b"user-%d" % rng.randrange(1000), b'{"amount": 12.5}']
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
    return bytes(out[:size])


SIZES = [1, 1000, 100_000]  # 100 kB: several of xerial's 32 KiB blocks, lz4's 64 KiB blocks


@pytest.mark.parametrize("size", SIZES)
def test_what_other_writers_write_is_inflated(size: int) -> None:
    data = section(size)
    written = {
        "gzip (kafka-python)": (CODECS["gzip"], kafka_codec.gzip_encode(data)),
        "gzip, two members": (
            CODECS["gzip"],
            gzip.compress(data[: size // 2], mtime=0) + gzip.compress(data[size // 2 :], mtime=0),
        ),
        "snappy xerial (Java, kafka-python)": (CODECS["snappy"], kafka_codec.snappy_encode(data)),
        "snappy raw (librdkafka)": (CODECS["snappy"], bytes(cramjam.snappy.compress_raw(data))),
        "lz4 frame (kafka-python)": (CODECS["lz4"], kafka_codec.lz4_encode(data)),
        "lz4 frame (aiokafka)": (CODECS["lz4"], aiokafka_codec.lz4_encode(data)),
        "zstd (kafka-python)": (CODECS["zstd"], kafka_codec.zstd_encode(data)),
        "zstd, streamed: no content size": (
            CODECS["zstd"],
            (lambda c: c.compress(data) + c.flush())(zstandard.ZstdCompressor().compressobj()),
        ),
    }
    for what, (codec, packed) in written.items():
        assert decompress(packed, codec) == data, what
        assert decompress(memoryview(packed), codec) == data, f"{what}, from a view"
        assert bytes(decompress_bounded(packed, codec, size)) == data, f"{what}: the broker's check"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", list(CODECS))
def test_what_we_write_other_readers_inflate(name: str, size: int) -> None:
    data = section(size)
    packed = compress(data, CODECS[name])
    readers = {
        "gzip": (kafka_codec.gzip_decode, aiokafka_codec.gzip_decode),
        "snappy": (kafka_codec.snappy_decode, aiokafka_codec.snappy_decode),
        "lz4": (kafka_codec.lz4_decode, aiokafka_codec.lz4_decode),
        "zstd": (kafka_codec.zstd_decode, aiokafka_codec.zstd_decode),
    }[name]
    for read in readers:
        assert read(packed) == data, read.__module__
    assert decompress(packed, CODECS[name]) == data


@pytest.mark.parametrize("name", list(CODECS))
def test_a_damaged_section_is_a_batch_error_naming_its_codec(name: str) -> None:
    packed = compress(section(5000), CODECS[name])
    for damaged in (packed[: len(packed) // 2], b"\x00garbage" + packed[8:]):
        with pytest.raises(BatchError, match=name):
            decompress(damaged, CODECS[name])
    with pytest.raises(BatchError, match="unknown compression codec"):
        decompress(packed, 0)
