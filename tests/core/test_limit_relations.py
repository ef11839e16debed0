"""The relations between the broker's fixed bounds (broker/core/limits.py `relation_errors`): each
bad combination is named with both values, and a module whose constants break one refuses to
import, so the broker does not start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from broker.core import forwarding
from broker.core.limits import FETCH_MAX_BYTES_MAX, Limits, relation_errors
from ringlog_proto.frames import FRAME_BYTES_MAX_DEFAULT

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_bounds_keep_their_relations() -> None:
    assert relation_errors() == []


def test_a_fetch_answer_larger_than_the_frame_limit_is_refused() -> None:
    assert relation_errors(fetch_max_bytes_max=FRAME_BYTES_MAX_DEFAULT) == [
        f"FETCH_MAX_BYTES_MAX ({FRAME_BYTES_MAX_DEFAULT}) must be below FRAME_BYTES_MAX_DEFAULT "
        f"({FRAME_BYTES_MAX_DEFAULT}): a fetch answer must fit the frame limit its reader has"
    ]
    assert relation_errors(frame_bytes_max=2 * MiB) == [
        f"FETCH_MAX_BYTES_MAX ({FETCH_MAX_BYTES_MAX}) must be below FRAME_BYTES_MAX_DEFAULT ({2 * MiB}): "
        "a fetch answer must fit the frame limit its reader has"
    ]


def test_a_default_batch_larger_than_a_frame_is_refused() -> None:
    [error] = relation_errors(batch_bytes_default=16 * MiB)
    assert error.startswith(
        f"LogConfig's default max_batch_bytes ({16 * MiB}) must be below FRAME_BYTES_MAX_DEFAULT "
        f"({FRAME_BYTES_MAX_DEFAULT})"
    )


def test_a_broken_relation_stops_the_import() -> None:
    """The frame limit lowered under the fetch cap: broker.core.limits (and so the broker) refuses
    to load, naming both values."""
    code = (
        "import ringlog_proto.frames as f\n"
        f"f.FRAME_BYTES_MAX_DEFAULT = {2 * MiB}\n"
        "import broker.core.limits\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert (
        f"AssertionError: broker/core/limits.py: FETCH_MAX_BYTES_MAX ({FETCH_MAX_BYTES_MAX}) must be below "
        f"FRAME_BYTES_MAX_DEFAULT ({2 * MiB})" in done.stderr
    ), done.stderr


def test_each_default_has_one_owner() -> None:
    assert Limits().max_request_bytes == FRAME_BYTES_MAX_DEFAULT
    assert Limits().forward_timeout_ms / 1000 == forwarding.FORWARD_TIMEOUT_S_DEFAULT
