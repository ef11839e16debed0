"""The read side's check of stored batches: `scan_stored` in C (native._records) and its Python
twin (`stored_damage` batch after batch) give the same result on intact, damaged and cut data,
and the C crc32c (hardware and table paths) agrees with the crc32c library on every length and
alignment, across the sizes where its three-stream steps begin and end."""

from __future__ import annotations

import os

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from test_byte_helpers import stored

from ringlog_proto import batch as b
from ringlog_proto import batch_checks
from ringlog_proto.batch import iter_batches, scan_stored_python

try:
    from native._records import lib
except ImportError:  # the extension is optional; the Python scan still gets tested
    lib = None

needs_c = pytest.mark.skipif(lib is None, reason="native._records is not built")
native_scan = batch_checks._native_scan() if lib is not None else None


def scans(data: bytes | bytearray | memoryview, pos: int, end: int, base: int) -> tuple[int, int, str | None]:
    """Both scans' result, which must be one."""
    py = scan_stored_python(data, pos, end, base)
    if native_scan is not None:
        assert native_scan(data, pos, end, base) == py
    return py


@needs_c
def test_the_broker_uses_the_c_scan_when_it_is_built() -> None:
    assert b.scan_implementation() == "native"


@needs_c
@pytest.mark.parametrize("which", ["rr_crc32c", "rr_crc32c_table"])
def test_the_c_crc_agrees_with_the_library(which: str) -> None:
    crc = getattr(lib, which)
    data = os.urandom(3 * 8192 * 2 + 3 * 256 * 3 + 64)
    lengths = [*range(300), 767, 768, 769, 24575, 24576, 24577, 3 * 8192 + 3 * 256 + 7, len(data) - 8]
    for n in lengths:
        for start in (0, 1, 5, 7):
            assert crc(data, len(data), start, start + n) == crc32c(data[start : start + n]), (n, start)
    assert crc(data, len(data), 10, 9) == -1
    assert crc(data, len(data), 0, len(data) + 1) == -1


def test_intact_batches_scan_to_the_end() -> None:
    data = stored(40, 3, 1, 7)
    assert scans(data, 0, len(data), 40) == (len(data), 51, None)
    assert scans(data, 0, 0, 40) == (0, 40, None)
    big = stored(0, 60, 60, value=os.urandom(1024))  # batches past the crc's three-stream steps
    assert scans(big, 0, len(big), 0) == (len(big), 120, None)
    assert scans(memoryview(big), 0, len(big), 0) == (len(big), 120, None)


def test_a_scan_stops_at_the_first_damaged_batch_and_says_why() -> None:
    first = stored(0, 2)
    data = bytearray(stored(0, 2, 3))
    assert scans(data, 0, len(data), 1) == (0, 1, "base offset 0, index expects 1")
    data[len(first) + 30] ^= 0x01  # in the second batch's crc range
    assert scans(data, 0, len(data), 0) == (len(first), 2, "crc32c mismatch")
    cut = bytes(data[: len(first) + 20])
    assert scans(cut, 0, len(cut), 0) == (len(first), 2, "truncated batch header")
    bad = bytearray(stored(0, 2))
    bad[16] = 1  # magic
    pos, offset, reason = scans(bad, 0, len(bad), 0)
    assert (pos, offset) == (0, 0) and reason is not None and reason.startswith("bad magic 1")


def test_every_flipped_byte_and_every_cut_is_found_by_both() -> None:
    data = stored(7, 2, 1)
    starts = [pos for pos, _ in iter_batches(data)]
    boundaries = {*starts, len(data)}
    # The partition leader epoch is neither under the crc nor known to the reader: no damage there.
    epochs = {s + i for s in starts for i in range(12, 16)}
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        assert (scans(damaged, 0, len(damaged), 7)[2] is None) == (i in epochs), i
    for n in range(len(data) + 1):
        assert (scans(data[:n], 0, n, 7)[2] is None) == (n in boundaries), n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_random_damage_gets_the_same_answer_from_both(counts: list[int], data: st.DataObject) -> None:
    raw = bytearray(stored(100, *counts))
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    end = data.draw(st.integers(0, len(raw)))
    pos, _, reason = scans(raw, 0, end, 100)
    assert 0 <= pos <= end
    assert reason is not None or pos == end


@needs_c
def test_the_c_scan_refuses_bounds_outside_its_buffer() -> None:
    assert native_scan is not None
    data = stored(0, 1)
    with pytest.raises(ValueError, match="outside a buffer"):
        native_scan(data, 0, len(data) + 1, 0)
    with pytest.raises(ValueError, match="outside a buffer"):
        native_scan(data, 5, 4, 0)
    with pytest.raises(ValueError, match="negative"):
        native_scan(data, -1, 4, 0)
