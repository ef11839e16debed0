"""The log cleaner's offset map: a fixed amount of memory, each key's latest offset, and a fill
limit at its load factor (broker/storage/offset_map.py), checked against a dict."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.storage.offset_map import ENTRY_BYTES, LOAD_FACTOR, OffsetMap


def test_latest_offset_of_each_key_and_minus_one_for_others() -> None:
    m = OffsetMap(64 * ENTRY_BYTES)
    m.put(b"a", 1)
    m.put(b"b", 2)
    m.put(b"a", 3)
    assert (m.get(b"a"), m.get(b"b"), m.get(b"c")) == (3, 2, -1)
    assert m.entries == 2 and m.latest_offset == 3
    m.put(b"", 4)  # an empty key is a key
    assert m.get(b"") == 4


def test_memory_is_what_it_was_given_whatever_the_keys() -> None:
    m = OffsetMap(1000 * ENTRY_BYTES + 7)
    assert m.memory_bytes == 1000 * ENTRY_BYTES and m.slots == 1000
    for i in range(m.capacity):
        m.put(b"key-%d" % i * 100, i)  # long keys: only their hashes are kept
    assert m.memory_bytes == 1000 * ENTRY_BYTES


def test_full_at_its_load_factor_new_keys_refused_known_ones_taken() -> None:
    m = OffsetMap(100 * ENTRY_BYTES)
    assert m.capacity == int(100 * LOAD_FACTOR)
    for i in range(m.capacity):
        assert not m.full
        m.put(b"%d" % i, i)
    assert m.full
    with pytest.raises(OverflowError):
        m.put(b"new", 1000)
    m.put(b"0", 1001)  # a key it holds still moves on
    assert m.get(b"0") == 1001 and m.get(b"new") == -1


def test_clear_forgets_everything() -> None:
    m = OffsetMap(32 * ENTRY_BYTES)
    m.put(b"a", 5)
    m.clear()
    assert (m.get(b"a"), m.entries, m.latest_offset) == (-1, 0, -1)


def test_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="fewer than"):
        OffsetMap(10 * ENTRY_BYTES)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=6), min_size=1, max_size=300), st.integers(16, 80))
def test_agrees_with_a_dict_until_full(keys: list[bytes], slots: int) -> None:
    m = OffsetMap(slots * ENTRY_BYTES)
    model: dict[bytes, int] = {}
    for offset, key in enumerate(keys):
        if key not in model and len(model) >= m.capacity:
            with pytest.raises(OverflowError):
                m.put(key, offset)
            assert m.full
            break
        m.put(key, offset)
        model[key] = offset
    assert all(m.get(k) == v for k, v in model.items())
    assert m.entries == len(model)
