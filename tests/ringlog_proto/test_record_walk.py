"""The record-framing walk: the C extension (native._records) and its Python twin agree on every
input, accept every batch `encode_batch` makes, refuse every poison batch, and say "valid"
exactly when a client's `decode_records` succeeds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.poison_batches import POISON, frame_batch, poison_batch, record
from ringlog_proto import batch as b
from ringlog_proto.batch import (
    HEADER_SIZE,
    BatchError,
    Record,
    decode_records,
    encode_batch,
    invalid_batch,
    invalid_records,
    read_header,
    walk_records_python,
    zigzag_varint,
)

try:
    from native._records import ffi, lib

    def walk_c(buf: bytes, start: int, end: int, count: int) -> int:
        return lib.rr_walk_records(ffi.from_buffer(buf), len(buf), start, end, count)

except ImportError:  # the extension is optional; the Python walk still gets tested
    walk_c = None

needs_c = pytest.mark.skipif(walk_c is None, reason="native._records is not built")

maybe_bytes = st.one_of(st.none(), st.binary(max_size=40))
headers = st.lists(st.tuples(st.text(max_size=6), maybe_bytes), max_size=3)
records = st.builds(Record, value=maybe_bytes, key=maybe_bytes, headers=headers, timestamp=st.just(7))


def decodes(batch: bytes) -> bool:
    try:
        decode_records(batch)
    except BatchError:
        return False
    return True


def walks(batch: bytes) -> list[int]:
    h = read_header(batch)
    args = (batch, HEADER_SIZE, h.size, h.record_count)
    out = [walk_records_python(*args)]
    if walk_c is not None:
        out.append(walk_c(*args))
    return out


@needs_c
def test_the_broker_uses_the_c_walk_when_it_is_built() -> None:
    assert b.walk_implementation() == "native"


@pytest.mark.parametrize("name", sorted(POISON))
def test_every_poison_batch_is_refused_by_both_walks_and_fails_decode(name: str) -> None:
    batch = poison_batch(name)
    assert invalid_batch(batch) is None, "header and crc are valid: only the walk can tell"
    results = walks(batch)
    assert results[0] != 0
    assert len(set(results)) == 1, results
    assert invalid_records(batch) is not None
    assert not decodes(batch)


@settings(max_examples=150, deadline=None)
@given(st.lists(records, min_size=1, max_size=12), st.integers(0, 2**40))
def test_every_encoded_batch_walks_clean(recs: list[Record], base: int) -> None:
    batch = encode_batch(recs, base_offset=base)
    assert walks(batch) == [0] * len(walks(batch))
    assert invalid_records(batch) is None


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 12))
def test_random_sections_walks_agree_with_each_other_and_with_decode(section: bytes, count: int) -> None:
    batch = frame_batch(section, count)
    if invalid_batch(batch) is not None:  # e.g. too short for the count: the header check refuses it
        return
    results = walks(batch)
    assert len(set(results)) == 1, results
    assert (results[0] == 0) == decodes(batch)


@st.composite
def mutated_batches(draw: st.DrawFn) -> bytes:
    """A valid record section with a few bytes overwritten (lengths are what gets hit most)."""
    recs = draw(st.lists(records, min_size=1, max_size=6))
    section = bytearray(encode_batch(recs)[HEADER_SIZE:])
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(section) - 1))
        section[i] = draw(st.sampled_from([0x00, 0xFF, 0x80, 0x7F, 0x01, 0xC3, 0xED]))
    count = len(recs) + draw(st.sampled_from([0, 0, 0, -1, 1]))
    return frame_batch(bytes(section), max(count, 1))


@settings(max_examples=400, deadline=None)
@given(mutated_batches())
def test_mutated_batches_walks_agree_with_each_other_and_with_decode(batch: bytes) -> None:
    if invalid_batch(batch) is not None:
        return
    results = walks(batch)
    assert len(set(results)) == 1, results
    assert (results[0] == 0) == decodes(batch)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=10).map(str.encode) | st.binary(max_size=10))
def test_header_key_utf8_check_matches_python(key: bytes) -> None:
    hdr = zigzag_varint(len(key)) + key + zigzag_varint(-1)
    batch = frame_batch(record(b"v", headers=hdr, hcount=1), 1)
    try:
        key.decode()
        utf8 = True
    except UnicodeDecodeError:
        utf8 = False
    assert [r == 0 for r in walks(batch)] == [utf8] * len(walks(batch))


def test_bounds_are_checked_before_reading() -> None:
    batch = encode_batch([b"x"])
    h = read_header(batch)
    for start, end in ((HEADER_SIZE, h.size + 1), (h.size, HEADER_SIZE), (-1, 4)):
        assert walk_records_python(batch, start, end, 1) == 16
        if walk_c is not None and start >= 0:
            assert walk_c(batch, start, end, 1) == 16


def test_a_walk_at_an_offset_inside_a_larger_buffer() -> None:
    """The broker walks batches inside one request buffer: positions are relative to `start`."""
    good = encode_batch([b"a", b"b"])
    bad = poison_batch("trailing_bytes")
    buf = good + bad
    assert invalid_records(buf, 0) is None
    reason = invalid_records(buf, len(good))
    assert reason is not None and "bytes left after record_count" in reason
