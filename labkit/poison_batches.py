"""Poison batches for tests: a valid header and crc32c over record framing that does not parse.

`frame_batch(section, count)` wraps any record-section bytes in a batch header whose lengths and
crc are right, so only the record walk (or a client's decode) can tell it is bad. `POISON` names
one batch per way the framing can be wrong (Kafka's RecordBatch v2 records: zigzag varints).
`compress(section, codec)` compresses as producers do (bench/compressed_validation.py uses it too).
"""

from __future__ import annotations

from ringlog_proto.batch import seal_batch, zigzag_varint

zz = zigzag_varint


def frame_batch(
    section: bytes,
    count: int,
    *,
    base_offset: int = 0,
    timestamp: int = 1_700_000_000_000,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A batch holding `section` as its records, with `count` as record_count and a valid crc."""
    return seal_batch(
        section,
        count,
        timestamp,
        timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
    )


def _field(data: bytes | None) -> bytes:
    return zz(-1) if data is None else zz(len(data)) + data


def fields(
    value: bytes | None, key: bytes | None = None, headers: bytes = b"", hcount: int = 0, index: int = 0
) -> bytes:
    """A record's fields after its length varint (headers given already encoded)."""
    return b"\x00" + zz(0) + zz(index) + _field(key) + _field(value) + zz(hcount) + headers


def record(
    value: bytes | None, key: bytes | None = None, headers: bytes = b"", hcount: int = 0, index: int = 0
) -> bytes:
    """One well-formed record at `index` in its batch (headers given already encoded)."""
    body = fields(value, key, headers, hcount, index)
    return zz(len(body)) + body


def _framed(body: bytes, length: int | None = None) -> bytes:
    return zz(len(body) if length is None else length) + body


def _header(key: bytes, value: bytes | None) -> bytes:
    return zz(len(key)) + key + _field(value)


GOOD = record(b"g" * 20)
G1 = record(b"g" * 20, index=1)
G2 = record(b"g" * 20, index=2)
_PREFIX_1 = b"\x00" + zz(0) + zz(1)  # attributes, timestamp delta, offset delta of record 1

# name -> (record section, record_count): each passes the header and crc checks, none decodes.
POISON: dict[str, tuple[bytes, int]] = {
    "record_length_past_end": (GOOD + _framed(fields(b"x" * 20, index=1), 10_000), 2),
    "count_above_records": (GOOD + G1, 3),
    "count_below_records": (GOOD + G1 + G2, 2),
    "trailing_bytes": (GOOD + G1 + b"\0" * 7, 2),
    "record_length_short": (GOOD + zz(4) + b"\0" * 20, 2),
    "record_length_negative": (GOOD + zz(-3) + b"\0" * 20, 2),
    "record_length_varint_too_long": (GOOD + b"\xff" * 5 + b"\x01" + b"\0" * 20, 2),
    "fields_short_of_length": (GOOD + _framed(fields(b"v" * 20, index=1) + b"\0" * 10), 2),
    "offset_delta_not_index": (GOOD + record(b"v", index=5), 2),
    "timestamp_varlong_too_long": (
        GOOD + _framed(b"\x00" + b"\x80" * 10 + b"\x00" + zz(1) + zz(-1) * 2 + zz(0)),
        2,
    ),
    "key_length_minus_2": (GOOD + _framed(_PREFIX_1 + zz(-2) + zz(20) + b"v" * 20 + zz(0)), 2),
    "key_past_record": (GOOD + _framed(_PREFIX_1 + zz(40) + b"k" * 4 + zz(-1) + zz(0)) + G2, 3),
    "value_length_minus_5": (GOOD + _framed(_PREFIX_1 + zz(-1) + zz(-5) + zz(0)), 2),
    "value_past_record": (GOOD + _framed(_PREFIX_1 + zz(-1) + zz(40) + b"v" * 4 + zz(0)) + G2, 3),
    "header_count_negative": (GOOD + record(b"v", hcount=-1, index=1), 2),
    "header_count_past_record": (GOOD + record(b"v", headers=_header(b"k", b"z"), hcount=2, index=1), 2),
    "header_key_past_record": (GOOD + record(b"v", headers=zz(0x20) + b"k" + zz(-1), hcount=1, index=1), 2),
    "header_key_length_negative": (GOOD + record(b"v", headers=zz(-1) + zz(-1), hcount=1, index=1), 2),
    "header_value_length_minus_3": (GOOD + record(b"v", headers=zz(1) + b"k" + zz(-3), hcount=1, index=1), 2),
    "header_value_past_record": (
        GOOD + record(b"v", headers=zz(1) + b"k" + zz(0x20) + b"z", hcount=1, index=1),
        2,
    ),
    "header_key_not_utf8": (GOOD + record(b"v", headers=_header(b"\xc3\x28", None), hcount=1, index=1), 2),
}


def poison_batch(name: str, **kw: int) -> bytes:
    section, count = POISON[name]
    return frame_batch(section, count, **kw)


# ----------------------------------------------------------------------------- compressed batches


def compress(section: bytes, codec: int) -> bytes:
    """`section` compressed as Kafka producers write each codec: gzip, snappy raw (librdkafka's;
    Java's xerial framing is `xerial_snappy`), lz4 frame, zstd frame."""
    import zlib

    import cramjam

    if codec == 1:
        c = zlib.compressobj(6, zlib.DEFLATED, 31)
        return c.compress(section) + c.flush()
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(section))
    if codec == 3:
        return bytes(cramjam.lz4.compress(section))
    if codec == 4:
        return bytes(cramjam.zstd.compress(section))
    raise ValueError(codec)


def xerial_snappy(section: bytes, block: int = 32 * 1024) -> bytes:
    """`section` in Java's snappy framing (xerial): magic, version 1, compatible 1, then
    length-prefixed raw snappy blocks."""
    import struct

    import cramjam

    out = [b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)]
    for i in range(0, len(section), block):
        raw = bytes(cramjam.snappy.compress_raw(section[i : i + block]))
        out.append(struct.pack(">i", len(raw)) + raw)
    return b"".join(out)


def compressed_batch(payload: bytes, count: int, codec: int, **kw: int) -> bytes:
    """A batch whose record section is `payload` (already compressed, or not compressed at all),
    with codec `codec` in its attributes, `count` records claimed and a valid crc."""
    timestamp = 1_700_000_000_000
    from ringlog_proto.batch import seal_batch as seal

    return seal(payload, count, timestamp, timestamp, attributes=codec, **kw)


CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
BOMB_BYTES = 17 * 1024 * 1024  # inflated: past the broker's bound at the default 1 MiB batch limit


def compressed_poison() -> dict[str, tuple[bytes, str]]:
    """name -> (batch, what the broker answers on our protocol: "corrupt", "framing" or
    "too_large"). Each has a valid header and crc; none is a batch a consumer could read."""
    out: dict[str, tuple[bytes, str]] = {}
    good3 = GOOD + G1 + G2
    for name, codec in CODECS.items():
        out[f"{name}_garbage"] = (compressed_batch(bytes(range(7, 207)) * 3, 3, codec), "corrupt")
        out[f"{name}_fewer_records_than_count"] = (
            compressed_batch(compress(GOOD + G1, codec), 3, codec),
            "framing",
        )
        out[f"{name}_more_records_than_count"] = (
            compressed_batch(compress(good3, codec), 2, codec),
            "framing",
        )
        section, count = POISON["record_length_past_end"]
        out[f"{name}_records_do_not_frame"] = (
            compressed_batch(compress(section, codec), count, codec),
            "framing",
        )
        out[f"{name}_bomb"] = (compressed_batch(compress(b"\0" * BOMB_BYTES, codec), 1, codec), "too_large")
        whole = compress(good3, codec)
        out[f"{name}_truncated"] = (compressed_batch(whole[: len(whole) - 3], 3, codec), "corrupt")
    out["gzip_trailing_garbage"] = (compressed_batch(compress(good3, 1) + b"junk" * 4, 3, 1), "corrupt")
    xerial = xerial_snappy(good3)
    out["snappy_xerial_block_past_end"] = (compressed_batch(xerial[:-2] + b"\0" * 1, 3, 2), "corrupt")
    out["snappy_xerial_fewer_records"] = (compressed_batch(xerial_snappy(GOOD), 3, 2), "framing")
    return out


def compressed_good() -> dict[str, bytes]:
    """name -> a well-formed compressed batch of three records, each codec and snappy's two framings."""
    good3 = GOOD + G1 + G2
    out = {name: compressed_batch(compress(good3, codec), 3, codec) for name, codec in CODECS.items()}
    out["snappy_xerial"] = compressed_batch(xerial_snappy(good3, block=20), 3, 2)
    return out
