"""Passes in turns of the loop (broker/core/sweeps.py): a turn never holds the loop past its
budget (a fake clock: each visit costs a known time), every item of the snapshot is visited once
per pass, items that leave during a pass are skipped and those that arrive wait for the next; and
the core's passes (retention with producer expiry, the hanging-transaction look) run on it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.sweeps import SWEEP_BUDGET_S, Sweep

VISIT_S = 7e-6  # what one visit costs on the fake clock (a partition's retention: ~3-10 us)


class Loop:
    """A loop's `call_soon`: each scheduled callback is one later turn."""

    def __init__(self) -> None:
        self.soon: deque[Callable[[], None]] = deque()

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def run(self, between: Callable[[], None] = lambda: None) -> int:
        turns = 0
        while self.soon:
            between()
            self.soon.popleft()()
            turns += 1
        return turns


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_turn_over_20000_items_holds_the_loop_past_its_budget() -> None:
    clock, loop = Clock(), Loop()
    sweep: Sweep[int] = Sweep("test", loop.call_soon, clock=clock)
    visited: list[int] = []
    turn_costs: list[float] = []
    turn_start = [0.0]

    def visit(item: int) -> None:
        clock.now += VISIT_S
        visited.append(item)

    def between() -> None:  # a turn ended: what it held the loop for
        turn_costs.append(clock.now - turn_start[0])
        turn_start[0] = clock.now

    done: list[bool] = []
    assert sweep.start(range(20_000), visit, lambda: done.append(True))
    loop.run(between)
    between()
    assert done == [True]
    assert sorted(visited) == list(range(20_000)) and len(visited) == 20_000
    assert max(turn_costs) <= SWEEP_BUDGET_S + VISIT_S  # at most one visit over the budget
    assert sweep.turns == len(turn_costs) >= 20_000 * VISIT_S / (SWEEP_BUDGET_S + VISIT_S)


def test_a_coarse_clock_still_bounds_a_turn_by_its_item_count() -> None:
    loop = Loop()
    sweep: Sweep[int] = Sweep("test", loop.call_soon, items_max=100, clock=lambda: 0.0)
    per_turn: list[int] = [0]

    def visit(item: int) -> None:
        per_turn[-1] += 1

    sweep.start(range(20_000), visit)
    loop.run(lambda: per_turn.append(0))
    assert sum(per_turn) == 20_000 and max(per_turn) == 100


def test_items_leaving_during_a_pass_are_skipped_and_new_ones_wait_for_the_next() -> None:
    loop = Loop()
    live = set(range(1000))
    sweep: Sweep[int] = Sweep("test", loop.call_soon, items_max=10, clock=lambda: 0.0)
    visited: list[int] = []
    removed: list[int] = []

    def churn() -> None:  # between turns: the core closes one not visited yet and opens another
        waiting = [i for i in live if i < 1000 and i not in visited]
        if waiting:
            removed.append(max(waiting))
            live.discard(removed[-1])
        live.add(10_000 + len(removed))

    sweep.start(sorted(live), visited.append, alive=live.__contains__)
    loop.run(churn)
    assert removed and not set(removed) & set(visited), "none closed before its turn is visited"
    assert sorted(visited) == sorted(set(range(1000)) - set(removed)), "the rest once each"
    visited.clear()
    sweep.start(sorted(live), visited.append, alive=live.__contains__)
    loop.run()
    assert sorted(visited) == sorted(live), "the next pass sees those opened during the last"


def test_one_pass_at_a_time_and_cancel_drops_the_rest() -> None:
    loop = Loop()
    sweep: Sweep[int] = Sweep("test", loop.call_soon, items_max=10)
    visited: list[int] = []
    done: list[bool] = []
    assert sweep.start(range(100), visited.append, lambda: done.append(True))
    assert not sweep.start(range(100), visited.append), "a pass is running"
    assert sweep.running and len(visited) == 10
    sweep.cancel()
    loop.run()
    assert len(visited) == 10 and not done and not sweep.running
    assert sweep.start(range(5), visited.append, lambda: done.append(True))
    loop.run()
    assert done == [True] and visited[10:] == list(range(5))


def test_a_failing_visit_does_not_stop_the_pass(caplog: pytest.LogCaptureFixture) -> None:
    sweep: Sweep[int] = Sweep("test", None)
    visited: list[int] = []

    def visit(item: int) -> None:
        if item == 3:
            raise RuntimeError("boom")
        visited.append(item)

    assert sweep.start(range(6), visit)  # no loop: the whole pass at once
    assert visited == [0, 1, 2, 4, 5] and not sweep.running
    assert "boom" in caplog.text


def test_the_cores_retention_pass_runs_in_turns_and_visits_each_partition_once(tmp_path: Path) -> None:
    loop = Loop()
    core = Core(BrokerConfig(data_dir=str(tmp_path), cores=1, core_id=0), call_soon=loop.call_soon)
    try:
        tid = core.create_topic("t", 40).topic_id
        parts = [core.partition(tid, i) for i in range(40)]
        core._retention.items_max = 8  # a budget that 40 partitions overrun
        core._retention.budget_s = 60.0  # items, not time, end each turn (a loaded machine is slow)
        seen: list[int] = []
        for p in parts:
            p.expire_producers = lambda now, ms, p=p: seen.append(p.index) or 0  # type: ignore[method-assign]
        deleted: list[int] = []
        assert core.apply_retention(deleted.append)
        assert not core.apply_retention(deleted.append), "the next is skipped while one runs"
        assert len(seen) == 8 and not deleted
        turns = loop.run()
        assert turns == 4 and sorted(seen) == list(range(40)) and deleted == [0]
    finally:
        core.close()


def test_the_hanging_transaction_look_runs_in_turns_and_still_aborts(tmp_path: Path) -> None:
    from test_txn_sweep import LATER_MS, PID, own_append, produce, txn_batch  # tests/core's helpers

    from broker.core.txn_sweep import HangSweep

    loop = Loop()
    core = Core(BrokerConfig(data_dir=str(tmp_path), cores=1, core_id=0), call_soon=loop.call_soon)
    core.transactions.own_append = own_append
    try:
        tid = core.create_topic("data", 30).topic_id
        parts = [core.partition(tid, i) for i in range(30)]
        produce(core, parts[17], txn_batch(PID, 0))
        s = HangSweep(core, own_append, None, clock_ms=lambda: LATER_MS)
        s._sweep.items_max = 4
        finished: list[bool] = []
        s.run(lambda: finished.append(True))
        s.run(lambda: finished.append(False))  # a round is under way: this one skips at once
        assert finished == [False] and s.aborted == 0
        assert loop.run() >= 7
        assert finished == [False, True] and s.aborted == 1
        assert parts[17].last_stable_offset == parts[17].high_watermark == 2
    finally:
        core.close()
