"""The data-dir layout: its names round-trip, and the copies bpf/ keeps (it may not import broker/)
agree with it."""

from __future__ import annotations

import os

import pytest

from bpf import state, tfo
from broker.storage import layout


def test_bpf_snapshot_path_agrees() -> None:
    assert state.RUN_DIR == layout.RUN_DIR
    assert state.FILE_NAME == layout.BPF_SNAPSHOT_FILE
    assert state.path("/d") == layout.bpf_snapshot_path("/d")


def test_tfo_restore_record_lives_in_the_layouts_restore_dir() -> None:
    assert os.path.dirname(tfo.record_path("/d")) == layout.restore_dir("/d")
    assert os.path.dirname(layout.restore_dir("/d")) == layout.run_dir("/d")


def test_everything_of_a_running_broker_is_under_run() -> None:
    for path in (layout.bpf_snapshot_path("/d"), layout.metrics_snapshot_path("/d", 3)):
        assert os.path.dirname(path) == layout.run_dir("/d")


@pytest.mark.parametrize("base", [0, 1, 42, 10**19, 2**63 - 1])
def test_segment_names_round_trip(base: int) -> None:
    store, index = layout.store_file_name(base), layout.index_file_name(base)
    assert layout.parse_segment_name(store) == (base, layout.STORE_SUFFIX)
    assert layout.parse_segment_name(index) == (base, layout.INDEX_SUFFIX)
    assert store.startswith(layout.segment_name(base)) and index.startswith(layout.segment_name(base))


def test_segment_names_sort_in_offset_order() -> None:
    bases = [0, 9, 10, 99, 100, 12345678901234567890 // 10]
    assert sorted(layout.store_file_name(b) for b in bases) == [
        layout.store_file_name(b) for b in sorted(bases)
    ]


@pytest.mark.parametrize(
    "name",
    [
        "42.log",
        "0000000000000000004a.log",
        "00000000000000000042.txt",
        "00000000000000000042",
        layout.GROUP_OFFSETS_FILE,
    ],
)
def test_other_files_are_not_segments(name: str) -> None:
    assert layout.parse_segment_name(name) is None


def test_partition_dirs_parse_back() -> None:
    pdir = layout.partition_dir("/d", 7, 12)
    assert os.path.dirname(pdir) == layout.topic_dir("/d", 7)
    assert os.path.dirname(os.path.dirname(pdir)) == layout.topics_dir("/d")
    assert layout.parse_number_name(os.path.basename(pdir)) == 12
    assert layout.parse_number_name(os.path.basename(layout.topic_dir("/d", 7))) == 7
    for other in ("x", "", "1a", "-1", "²"):
        assert layout.parse_number_name(other) is None
    assert os.path.dirname(layout.group_offsets_path(pdir)) == pdir


def test_a_partition_dir_set_aside_is_no_partitions_and_names_its_index() -> None:
    aside = os.path.basename(layout.partition_dir("/d", 7, 12)) + layout.SET_ASIDE + "1764770000000000000"
    assert layout.parse_number_name(aside) is None  # never opened as partition 12 again
    assert layout.set_aside_index(aside) == 12
    for other in ("12", "x" + layout.SET_ASIDE + "1", "12.removing", ""):
        assert layout.set_aside_index(other) is None


@pytest.mark.parametrize("suffix", [layout.CLEANED_SUFFIX, layout.SWAP_SUFFIX])
def test_a_cleaners_file_names_parse_back_and_are_not_segments(suffix: str) -> None:
    for name, kind in (
        (layout.store_file_name(42), layout.STORE_SUFFIX),
        (layout.index_file_name(42), layout.INDEX_SUFFIX),
    ):
        cleaning = layout.cleaning_name(name, suffix)
        assert layout.parse_cleaning_name(cleaning) == (42, kind, suffix)
        assert layout.parse_segment_name(cleaning) is None
    assert layout.parse_cleaning_name(layout.store_file_name(42)) is None
    assert layout.parse_cleaning_name("x.log.swap") is None
