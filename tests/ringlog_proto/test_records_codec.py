"""The Kafka v2 records-section codec: the C codec (native._codec) and its Python twin agree byte for
byte and error for error; both agree with an independent Kafka implementation (kafka-python 3's
DefaultRecordBatchBuilder / DefaultRecordBatch); and the Python twin is what runs, and works, when
the extension cannot be imported."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable
from typing import NamedTuple

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from ringlog_proto import records_codec as rc
from ringlog_proto.batch import Record, walk_records, walk_records_python
from ringlog_proto.records_codec import DECODE_ERRORS, PYTHON, Gathered, SectionError

NATIVE = rc.native_codec()
needs_c = pytest.mark.skipif(NATIVE is None, reason="native._codec is not built")
CODECS = [PYTHON] if NATIVE is None else [PYTHON, NATIVE]
V2_HEADER = struct.Struct(">qiiBIhiqqqhii")
TS = 1_700_000_000_000
I64 = st.integers(-(1 << 63), (1 << 63) - 1)

maybe_bytes = st.one_of(st.none(), st.binary(max_size=300))
header_lists = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3
)
timestamps = st.one_of(st.none(), st.integers(TS - 10**6, TS + 10**6))
records = st.builds(Record, value=maybe_bytes, key=maybe_bytes, headers=header_lists, timestamp=timestamps)
items = st.lists(st.one_of(records, st.binary(max_size=300)), max_size=40)


def zz(v: int) -> bytes:
    """Zigzag varint, written here independently of the module under test."""
    u = (v << 1) ^ (v >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append(u & 0x7F | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def expected(recs: list, base_ts: int, base_offset: int = 0) -> list[Record]:
    out = []
    for i, item in enumerate(recs):
        r = item if isinstance(item, Record) else Record(item)
        ts = base_ts if r.timestamp is None else r.timestamp
        out.append(Record(r.value, r.key, list(r.headers), ts, base_offset + i))
    return out


def each_codec(fn: Callable[[rc.Codec], object]) -> list[object]:
    """A test's results per codec, for comparing them."""
    return [fn(c) for c in CODECS]


def outcome(fn: Callable[[], object]) -> tuple[object, ...]:
    """A result, or the error's identity: what twins must agree on."""
    try:
        return ("ok", fn())
    except SectionError as exc:
        return ("error", exc.encoding, exc.code, exc.index, exc.at)


# ---- the two codecs are twins ----


@needs_c
def test_the_c_codec_runs_when_it_is_built() -> None:
    assert rc.implementation() == "native"


@settings(max_examples=300, deadline=None)
@given(items, st.integers(TS - 10**6, TS + 10**6), st.integers(0, 1 << 40))
def test_twins_encode_the_same_bytes_and_decode_them_back(recs: list, base_ts: int, base_offset: int) -> None:
    encoded = each_codec(lambda c: rc.encode_section(recs, base_ts, codec=c))
    section, count, max_ts = encoded[0]
    assert all(e == encoded[0] for e in encoded)
    assert type(section) is bytearray
    assert count == len(recs)
    exp = expected(recs, base_ts, base_offset)
    assert max_ts == max((r.timestamp for r in exp), default=base_ts)
    data = bytes(section)
    for c in CODECS:
        assert rc.decode_section(data, 0, len(data), count, base_offset, base_ts, codec=c) == exp
    fields = each_codec(lambda c: c.decode(data, 0, len(data), count))
    assert all(f == fields[0] for f in fields)


@settings(max_examples=100, deadline=None)
@given(items, st.integers(0, 100))
def test_prefix_leaves_room_and_decode_reads_any_buffer_at_any_start(recs: list, prefix: int) -> None:
    for c in CODECS:
        section, count, _ = rc.encode_section(recs, TS, prefix=prefix, codec=c)
        assert section[:prefix] == bytes(prefix)
        want = expected(recs, TS)
        for buf in (bytes(section), section, memoryview(section)):
            assert rc.decode_section(buf, prefix, len(section), count, 0, TS, codec=c) == want
            # the consumer's rows: the same fields, prefixed, as tuples of the class asked for
            rows = rc.decode_rows(buf, prefix, len(section), count, 0, TS, ("t", 1), Row, codec=c)
            assert all(type(r) is Row for r in rows)
            assert [(*r[:6], list(r[6])) for r in rows] == [
                ("t", 1, w.offset, w.timestamp, w.key, w.value, list(w.headers)) for w in want
            ]


class Row(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: object


def damaged(data: bytes, how: int, at: int, byte: int) -> bytes:
    if not data:
        return bytes([byte])
    at %= len(data)
    if how == 0:
        return data[:at]
    if how == 1:
        return data[:at] + bytes([byte]) + data[at + 1 :]
    if how == 2:
        return data[:at] + bytes([byte]) + data[at:]
    return data[:at] + data[at + 1 :]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items, st.integers(0, 3), st.integers(0, 1 << 20), st.integers(0, 255), st.integers(-2, 2))
def test_twins_agree_on_damaged_input(recs: list, how: int, at: int, byte: int, extra: int) -> None:
    section, count, _ = rc.encode_section(recs, TS, codec=PYTHON)
    data = damaged(bytes(section), how, at, byte)
    n = max(0, count + extra)
    results = each_codec(lambda c: c.decode(data, 0, len(data), n))
    assert all(r == results[0] for r in results)
    decoded = each_codec(lambda c: outcome(lambda: rc.decode_section(data, 0, len(data), n, 0, TS, codec=c)))
    assert all(d == decoded[0] for d in decoded)
    assert (decoded[0][0] == "ok") == (results[0][0] == 0)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64), st.integers(-1, 6), st.integers(-2, 70), st.integers(-2, 70))
def test_twins_agree_on_arbitrary_bytes_and_bounds(data: bytes, count: int, start: int, end: int) -> None:
    results = each_codec(lambda c: c.decode(data, start, end, count))
    assert all(r == results[0] for r in results)


def rec(body: bytes) -> bytes:
    return zz(len(body)) + body


MINIMAL = b"\x00\x00\x00\x01\x01\x00"  # attributes, ts 0, offset delta 0, null key, null value, no headers

# (section, count, expected code, expected offset of the error in the section)
ERROR_CASES = {
    "too few records": (b"", 1, 1, 0),
    "length truncated": (b"\x80", 1, 2, 0),
    "length varint too long": (b"\x80\x80\x80\x80\x80\x00", 1, 3, 0),
    "length beyond 32 bits, read as Kafka does": (b"\xff\xff\xff\xff\x1f", 1, 4, 0),  # -2**31
    "negative length": (b"\x01", 1, 4, 0),
    "record past end": (zz(8) + b"\x00\x00", 1, 5, 0),
    "no attributes": (rec(b""), 1, 6, 1),
    "timestamp truncated": (rec(b"\x00\x80"), 1, 6, 2),
    "timestamp varlong of 11 bytes": (rec(b"\x00" + b"\xff" * 10 + b"\x00" + MINIMAL[2:]), 1, 3, 2),
    "key length invalid": (rec(b"\x00\x00\x00" + zz(-2) + b"\x01\x00"), 1, 7, 4),
    "key past record": (rec(b"\x00\x00\x00" + zz(5) + b"ab"), 1, 8, 4),
    "value length invalid": (rec(b"\x00\x00\x00\x01" + zz(-2) + b"\x00"), 1, 9, 5),
    "value past record": (rec(b"\x00\x00\x00\x01" + zz(5) + b"ab"), 1, 10, 5),
    "header count negative": (rec(MINIMAL[:-1] + zz(-1)), 1, 11, 6),
    "header key length negative": (rec(MINIMAL[:-1] + zz(1) + zz(-1)), 1, 12, 7),
    "header key past record": (rec(MINIMAL[:-1] + zz(1) + zz(5) + b"a"), 1, 13, 7),
    "header key not UTF-8": (rec(MINIMAL[:-1] + zz(1) + zz(1) + b"\xff" + zz(-1)), 1, 14, 7),
    "header value length invalid": (rec(MINIMAL[:-1] + zz(1) + zz(1) + b"a" + zz(-2)), 1, 15, 9),
    "header value past record": (rec(MINIMAL[:-1] + zz(1) + zz(1) + b"a" + zz(5) + b"b"), 1, 16, 9),
    "header field truncated": (rec(MINIMAL[:-1] + zz(1) + zz(1) + b"a"), 1, 6, 9),
    "fields end before length": (rec(MINIMAL + b"x"), 1, 17, 0),
    "trailing bytes": (rec(MINIMAL) + b"x", 1, 18, 7),
    "second record too few": (rec(MINIMAL), 2, 1, 7),
}


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_each_damage_is_named_by_both_codecs(case: str, codec: rc.Codec) -> None:
    section, count, code, at = ERROR_CASES[case]
    result, fields = codec.decode(section, 0, len(section), count)
    assert (result & 0xFF, result >> 32) == (code, at), DECODE_ERRORS.get(result & 0xFF)
    assert len(fields) == 0
    with pytest.raises(SectionError) as err:
        rc.decode_section(section, 0, len(section), count, 0, TS, codec=codec)
    assert (err.value.code, err.value.at) == (code, at)
    assert DECODE_ERRORS[code] in str(err.value)


def kafka_varint(raw: bytes, long: bool) -> int:
    """Kafka's ByteUtils.readVarint / readVarlong, transcribed: bits past the type are dropped."""
    bits = 64 if long else 32
    value = 0
    for i, b in enumerate(raw):
        value |= (b & 0x7F) << (7 * i)
    value &= (1 << bits) - 1
    return (value >> 1) ^ -(value & 1)


def wide(v: int, extra: int, nbytes: int) -> bytes:
    """`v`'s zigzag varint padded to `nbytes` bytes, with `extra` set in the last byte's bits past
    the type (what Kafka's reader ignores)."""
    u = ((v << 1) ^ (v >> 63)) & ((1 << 64) - 1)
    out = bytearray((u >> (7 * i)) & 0x7F | 0x80 for i in range(nbytes))
    out[-1] = (out[-1] & 0x7F) | extra
    out[-1] &= 0x7F
    return bytes(out)


@pytest.mark.parametrize("extra", [0x10, 0x40, 0x70])
def test_varints_with_bits_beyond_their_type_read_as_kafka_and_the_walk_read_them(extra: int) -> None:
    """A 5-byte varint's bits 32-34 and a 10-byte varlong's bits 64-69 are dropped, by both codecs
    as by the broker's walk (native/_records_build.py) and Kafka: what the broker stored decodes."""
    ts_delta = wide(-5, extra & 0x7E, 10)  # bit 0 of a 10th byte is bit 63: keep it zero
    delta = wide(0, extra, 5)
    key = wide(3, extra, 5)
    assert (
        kafka_varint(ts_delta, True) == -5
        and kafka_varint(delta, False) == 0
        and kafka_varint(key, False) == 3
    )
    section = rec(b"\x00" + ts_delta + delta + key + b"abc" + zz(-1) + zz(0))
    for codec in CODECS:
        got = rc.decode_section(section, 0, len(section), 1, 100, TS, codec=codec)
        assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == [(100, TS - 5, b"abc", None)]
    assert walk_records_python(section, 0, len(section), 1) == 0
    assert walk_records(section, 0, len(section), 1) == 0


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_bounds_and_absurd_counts_are_errors_not_crashes(codec: rc.Codec) -> None:
    data = rec(MINIMAL)
    for start, end, count in ((-1, 7, 1), (0, 8, 1), (5, 4, 1), (0, 7, -1), (0, 7, 1 << 32)):
        assert codec.decode(data, start, end, count)[0] == 19
    # a damaged header's count: found wanting without allocating for it
    assert codec.decode(data, 0, len(data), 0x7FFFFFFF)[0] & 0xFF == 1
    assert codec.decode(b"", 0, 0, 0) == (0, array("q"))


def test_offset_deltas_with_gaps_are_kept_as_compaction_leaves_them() -> None:
    section = rec(b"\x00\x00" + zz(0) + MINIMAL[3:]) + rec(b"\x00\x00" + zz(5) + MINIMAL[3:])
    for c in CODECS:
        out = rc.decode_section(section, 0, len(section), 2, 100, TS, codec=c)
        assert [r.offset for r in out] == [100, 105]


# ---- encode errors: the same in both ----


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_timestamps_that_do_not_fit_are_refused(codec: rc.Codec) -> None:
    big = (1 << 63) - 1
    with pytest.raises(SectionError) as err:
        rc.encode_section([Record(b"a"), Record(b"b", timestamp=big)], -(1 << 63), codec=codec)
    assert (err.value.code, err.value.index) == (4, 1)
    with pytest.raises(SectionError) as err:
        rc.encode_section([Record(b"a"), Record(b"b", timestamp=1 << 64)], 0, codec=codec)
    assert (err.value.code, err.value.index) == (4, 1)
    with pytest.raises(SectionError):
        rc.encode_section([b"a"], 1 << 63, codec=codec)


small_lens = st.lists(st.integers(-3, 6), min_size=0, max_size=6)


@settings(max_examples=400, deadline=None)
@given(small_lens, small_lens, st.lists(st.integers(-1, 3), max_size=6), small_lens, st.integers(0, 12))
def test_twins_check_inconsistent_arrays_in_the_same_order(
    klens: list[int], vlens: list[int], hcounts: list[int], hlens: list[int], blob: int
) -> None:
    n = min(len(klens), len(vlens))
    hc = (hcounts + [0] * n)[:n]
    g = Gathered(
        n,
        b"k" * blob,
        array("q", klens[:n]),
        b"v" * blob,
        array("q", vlens[:n]),
        array("q", [TS + i for i in range(n)]),
        TS,
        array("q", hc),
        b"h" * blob,
        array("q", hlens[: len(hlens) // 2 * 2]),
        TS,
    )
    results = each_codec(lambda c: outcome(lambda: bytes(c.encode(g, 0))))
    assert all(r == results[0] for r in results)


# ---- an independent implementation: kafka-python 3 ----

kafka_records = st.lists(
    st.tuples(
        maybe_bytes,
        maybe_bytes,
        st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3),
        st.integers(0, 1 << 45),
    ),
    min_size=1,
    max_size=30,
)


def kafka_python_batch(recs: list[tuple]) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
    for i, (key, value, headers, ts) in enumerate(recs):
        assert builder.append(i, ts, key, value, headers) is not None
    return bytes(builder.build())


@settings(max_examples=200, deadline=None)
@given(kafka_records)
def test_our_section_is_kafka_pythons_byte_for_byte(recs: list[tuple]) -> None:
    theirs = kafka_python_batch(recs)
    ours = [Record(value, key, headers, ts) for key, value, headers, ts in recs]
    for c in CODECS:
        section, count, max_ts = rc.encode_section(ours, recs[0][3], codec=c)
        assert bytes(section) == theirs[61:]
        assert count == len(recs)
        assert max_ts == DefaultRecordBatch(theirs).max_timestamp


@settings(max_examples=200, deadline=None)
@given(kafka_records, st.integers(0, 1 << 40))
def test_we_decode_kafka_pythons_batches(recs: list[tuple], base_offset: int) -> None:
    theirs = bytearray(kafka_python_batch(recs))
    struct.pack_into(">q", theirs, 0, base_offset)  # as a broker stores it (outside the crc)
    header = V2_HEADER.unpack_from(theirs)
    batch = DefaultRecordBatch(bytes(theirs))
    want = [Record(r.value, r.key, r.headers, r.timestamp, r.offset) for r in batch]
    for c in CODECS:
        got = rc.decode_section(bytes(theirs), 61, len(theirs), header[12], header[0], header[7], codec=c)
        assert got == want


@settings(max_examples=100, deadline=None)
@given(kafka_records)
def test_kafka_python_reads_our_batches(recs: list[tuple]) -> None:
    ours = [Record(value, key, headers, ts) for key, value, headers, ts in recs]
    first = recs[0][3]
    for c in CODECS:
        out, count, max_ts = rc.encode_section(ours, first, prefix=61, codec=c)
        V2_HEADER.pack_into(out, 0, 7, len(out) - 12, 0, 2, 0, 0, count - 1, first, max_ts, -1, -1, -1, count)
        struct.pack_into(">I", out, 17, crc32c(memoryview(out)[21:]))
        batch = DefaultRecordBatch(bytes(out))
        assert batch.validate_crc()
        batch = DefaultRecordBatch(bytes(out))
        got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch]
        assert got == [(7 + i, ts, key, value, headers) for i, (key, value, headers, ts) in enumerate(recs)]


# ---- the fallback ----


def test_the_python_codec_runs_and_works_when_native_codec_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "native._codec", None)  # `import native._codec` now fails
    monkeypatch.setattr(rc, "_codec", None)
    assert rc.native_codec() is None
    assert rc.implementation() == "python"
    assert rc.current_codec() is PYTHON
    recs = [Record(b"v" * 100, b"k", [("h", b"x")], TS + 1), b"plain", Record(None)]
    section, count, max_ts = rc.encode_section(recs, TS)
    assert (count, max_ts) == (3, TS + 1)
    if NATIVE is not None:  # what the fallback wrote is what C writes
        assert section == rc.encode_section(recs, TS, codec=NATIVE)[0]
    data = bytes(section)
    assert rc.decode_section(data, 0, len(data), 3, 10, TS) == expected(recs, TS, 10)
    with pytest.raises(SectionError):
        rc.decode_section(data[:-1], 0, len(data) - 1, 3, 10, TS)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_the_first_timestamp_out_of_range_is_named_whatever_precedes_it(codec: rc.Codec) -> None:
    recs = [Record(b"a", timestamp=1 << 70), Record(b"b"), Record(b"c", timestamp=-(1 << 70))]
    with pytest.raises(SectionError) as err:
        rc.encode_section(recs, 0, codec=codec)
    assert (err.value.code, err.value.index) == (4, 0)
    with pytest.raises(SectionError) as err:
        rc.encode_section(recs[1:], 0, codec=codec)
    assert (err.value.code, err.value.index) == (4, 1)
