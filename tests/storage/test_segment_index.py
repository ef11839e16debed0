"""The segment index's searches against a linear scan of the same entries, built entry by entry
and from bytes (as recovery loads it), and after truncation: the columns the searches use must
always say what the packed entries say."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.storage.index import ENTRY_SIZE, SegmentIndex


def _reference_last_at_most(values: list[int], x: int, lo: int = 0, hi: int | None = None) -> int:
    """The last i in [lo, hi) with values[i] <= x, or lo - 1: what the searches must return."""
    hi = len(values) if hi is None else hi
    found = lo - 1
    for i in range(lo, hi):
        if values[i] <= x:
            found = i
    return found


@st.composite
def _indexes(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    """Entries as the log writes them: relative offsets and positions strictly increasing, the
    first at position 0, timestamps anywhere (the index keeps their running maximum)."""
    n = draw(st.integers(0, 60))
    rels = sorted(draw(st.sets(st.integers(0, 2**32 - 1), min_size=n, max_size=n)))
    positions = [0, *sorted(draw(st.sets(st.integers(1, 2**32 - 1), min_size=n, max_size=n)))][:n]
    stamps = draw(st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n))
    return list(zip(rels, positions, stamps, strict=True))


def _check(index: SegmentIndex, entries: list[tuple[int, int, int]], probes: list[int]) -> None:
    rels = [r for r, _, _ in entries]
    positions = [p for _, p, _ in entries]
    assert len(index) == len(entries)
    for i, (rel, pos, _ts) in enumerate(entries):
        assert index.relative_offset(i) == rel == index.entry(i).relative_offset
        assert index.position(i) == pos == index.entry(i).position
    for x in probes + rels + [r + 1 for r in rels] + [r - 1 for r in rels]:
        assert index.find_offset(x) == _reference_last_at_most(rels, x)
    n = len(entries)
    for lo in range(n + 1):
        for hi in range(lo, n + 1, max(1, n // 7)):
            for limit in [*probes, *positions[lo:hi]]:
                assert index.last_position_within(lo, hi, limit) == _reference_last_at_most(
                    positions, limit, lo, hi
                )


@settings(max_examples=150, deadline=None)
@given(_indexes(), st.lists(st.integers(-5, 2**32 + 5), max_size=8), st.data())
def test_searches_match_a_linear_scan(
    entries: list[tuple[int, int, int]], probes: list[int], data: st.DataObject
) -> None:
    built = SegmentIndex()
    for rel, pos, ts in entries:
        built.append(rel, pos, ts, 0)
    _check(built, entries, probes)

    loaded = SegmentIndex(built.encode_file(0)[16:], len(entries))  # as `Segment.open` loads it
    _check(loaded, entries, probes)

    keep = data.draw(st.integers(0, len(entries)))
    for index in (built, loaded):
        index.truncate(keep)
        assert len(index.encode_file(0)) == 16 + keep * ENTRY_SIZE
        _check(index, entries[:keep], probes)
    # appending after a truncation continues both the entries and the columns
    last_rel, last_pos = (entries[keep - 1][0], entries[keep - 1][1]) if keep else (-1, -1)
    more = [(last_rel + k, last_pos + k, 0) for k in (1, 2, 3) if max(last_rel, last_pos) + k < 2**32]
    for rel, pos, ts in more:
        built.append(rel, pos, ts, 0)
    _check(built, entries[:keep] + more, probes)
