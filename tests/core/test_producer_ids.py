"""Broker-assigned producer ids: unique across cores (separate processes) and restarts, durable
before they are handed out, below the ids clients pick themselves."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from broker.core.producer_ids import (
    BLOCK_SIZE,
    EPOCH_LAST,
    FileBlockSource,
    ProducerIds,
    ProducerIdsExhaustedError,
)
from broker.storage import layout
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT


def test_ids_come_in_blocks_and_the_counter_is_written_first(tmp_path: Path) -> None:
    ids = ProducerIds(FileBlockSource(str(tmp_path)))
    assert not Path(layout.producer_ids_path(str(tmp_path))).exists(), "nothing claimed before the first id"
    assert [ids.new() for _ in range(3)] == [0, 1, 2]
    doc = json.loads(Path(layout.producer_ids_path(str(tmp_path))).read_text())
    assert doc["next_producer_id"] == BLOCK_SIZE  # the whole block is on disk before id 0 is given
    other = ProducerIds(FileBlockSource(str(tmp_path)))  # another core
    assert other.new() == BLOCK_SIZE
    rest = [ids.new() for _ in range(BLOCK_SIZE - 3)]
    assert rest[-1] == BLOCK_SIZE - 1
    assert ids.new() == 2 * BLOCK_SIZE, "the next block, past the other core's"


def test_a_restart_never_repeats_an_id(tmp_path: Path) -> None:
    before = ProducerIds(FileBlockSource(str(tmp_path)))
    given = {before.new() for _ in range(5)}
    after = ProducerIds(FileBlockSource(str(tmp_path)))  # the rest of the first block is skipped
    assert after.new() == BLOCK_SIZE and not given & {BLOCK_SIZE}


def _claim(data_dir: str, n: int, out: multiprocessing.Queue) -> None:
    ids = ProducerIds(FileBlockSource(data_dir), block_size=3)
    out.put([ids.new() for _ in range(n)])


def test_cores_in_separate_processes_never_share_an_id(tmp_path: Path) -> None:
    # Spawned, not forked: a child forked from a test worker inherits what earlier tests left
    # (a librdkafka handle, its threads gone in the child), whose collection crashed the child.
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path), 200, out)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    every = [i for ids in got for i in ids]
    assert len(every) == len(set(every)) == 800


def test_epoch_bumps_keep_the_id_until_the_epoch_is_spent(tmp_path: Path) -> None:
    ids = ProducerIds(FileBlockSource(str(tmp_path)))
    pid, epoch = ids.init()
    assert epoch == 0
    assert ids.init(pid, 0) == (pid, 1)
    assert ids.init(pid, EPOCH_LAST - 1) == (pid, EPOCH_LAST)
    fresh, epoch = ids.init(pid, EPOCH_LAST)
    assert fresh != pid and epoch == 0
    for bad in ((BROKER_PRODUCER_ID_LIMIT, 0), (pid, -1), (-1, 4)):
        other, epoch = ids.init(*bad)
        assert other < BROKER_PRODUCER_ID_LIMIT and other != pid and epoch == 0


def test_running_out_is_an_error_not_a_wrap(tmp_path: Path) -> None:
    path = Path(layout.producer_ids_path(str(tmp_path)))
    path.write_text(json.dumps({"version": 1, "next_producer_id": BROKER_PRODUCER_ID_LIMIT - 10}))
    with pytest.raises(ProducerIdsExhaustedError):
        ProducerIds(FileBlockSource(str(tmp_path))).new()
