"""The relations between the storage engine's bounds (broker/storage/log_config.py `relation_errors`):
each bad combination is named with both values, and a module whose constants break one refuses
to import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from broker.storage.index import POSITION_MAX
from broker.storage.log_config import (
    DECOMPRESSED_BYTES_MAX,
    DECOMPRESSION_RATIO_MAX,
    PREALLOCATE_BYTES_MAX,
    SEGMENT_BYTES_MAX,
    relation_errors,
)

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_bounds_keep_their_relations() -> None:
    assert relation_errors() == []


def test_a_segment_larger_than_index_positions_reach_is_refused() -> None:
    assert relation_errors(segment_bytes_max=POSITION_MAX + 2) == [
        f"SEGMENT_BYTES_MAX ({POSITION_MAX + 2}) must be at most the index's POSITION_MAX + 1 "
        f"({POSITION_MAX + 1}): every byte of a segment has a u32 position"
    ]
    assert relation_errors(segment_bytes_max=POSITION_MAX + 1) == []


def test_a_default_batch_whose_inflation_the_cap_cuts_is_refused() -> None:
    [error] = relation_errors(batch_bytes_default=4 * MiB)
    assert error.startswith(
        f"LogConfig's default max_batch_bytes ({4 * MiB}) times DECOMPRESSION_RATIO_MAX "
        f"({DECOMPRESSION_RATIO_MAX}) must be at most DECOMPRESSED_BYTES_MAX ({DECOMPRESSED_BYTES_MAX})"
    )


def test_a_first_preallocation_step_above_the_largest_is_refused() -> None:
    assert relation_errors(preallocate_bytes=2 * PREALLOCATE_BYTES_MAX) == [
        f"PREALLOCATE_BYTES ({2 * PREALLOCATE_BYTES_MAX}) must be at most PREALLOCATE_BYTES_MAX "
        f"({PREALLOCATE_BYTES_MAX}): the first preallocation step is the smallest"
    ]


def test_a_broken_relation_stops_the_import() -> None:
    code = "import broker.storage.index as i\ni.POSITION_MAX = (1 << 16) - 1\nimport broker.storage.log\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert (
        f"AssertionError: broker/storage/log_config.py: SEGMENT_BYTES_MAX ({SEGMENT_BYTES_MAX}) must be at "
        f"most the index's POSITION_MAX + 1 ({1 << 16})" in done.stderr
    ), done.stderr
