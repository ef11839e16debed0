"""The shared backend core without a backend: the exhaustive dispatch of outcomes, and the group
commit's bookkeeping (one flush per partition per turn, exactly one more after a flush in flight)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from broker.backends import appends
from broker.backends.backend_core import BackendCore
from broker.backends.connection import Slot
from broker.core.acks import Waits
from broker.core.config import BrokerConfig
from broker.core.outcomes import Append, Reply
from broker.core.partition import Partition
from broker.core.replica_fetcher import append_outcomes
from broker.storage.diskspace import DiskSpace
from broker.storage.fileio import SYNCFS_MIN, SyncFileIO, run_ops
from broker.storage.log import LogConfig
from ringlog_proto.batch import encode_batch
from ringlog_proto.frames import Frame
from ringlog_proto.messages import Acks


class FakeLog:
    directory = "fake"

    def __init__(self) -> None:
        self.prepared = 0
        self.completed = 0
        self.failed: list[OSError] = []

    def prepare_flush(self) -> object:
        self.prepared += 1
        self.plan = SimpleNamespace(ops=[f"sync {self.prepared}"])
        return self.plan

    def complete_flush(self, plan: object) -> None:
        self.completed += 1

    def fail_flush(self, exc: OSError, plan: object = None) -> None:
        self.failed.append(exc)


class FakePartition:
    def __init__(self) -> None:
        self.log = FakeLog()


class FakeCore(BackendCore):
    """A backend whose storage operations complete when the test says, and whose turn ends when
    the test says."""

    def __init__(self) -> None:
        super().__init__(BrokerConfig())
        self.running: list[tuple[Sequence[Any], Callable[[OSError | None], None]]] = []
        self.together: list[tuple[Sequence[Any], Callable[[Sequence[OSError | None]], None]]] = []
        self.together_counts: list[int] = []
        self.turn_end: list[Callable[[], None]] = []
        self.flushed_counts: list[int] = []
        self.acked_at: list[int] = []
        self.core = SimpleNamespace(  # type: ignore[assignment]
            metrics=SimpleNamespace(
                flushed=self.flushed_counts.append,
                replica_acked=self.acked_at.append,
                flushed_together=self.together_counts.append,
            )
        )

    def end_of_turn(self, callback: Callable[[], None]) -> None:
        self.turn_end.append(callback)

    def run_ops(self, ops: Sequence[Any], done: Callable[[OSError | None], None]) -> None:
        self.running.append((ops, done))

    def run_flush_together(
        self, flushes: Sequence[Any], done: Callable[[Sequence[OSError | None]], None]
    ) -> None:
        self.together.append((flushes, done))

    def end_turn(self) -> None:
        callbacks, self.turn_end = self.turn_end, []
        for callback in callbacks:
            callback()


def test_an_unknown_outcome_is_a_bug_not_a_parked_fetch() -> None:
    core = BackendCore(BrokerConfig())
    frame = Frame(api_key=0, api_version=0, flags=0, correlation_id=1, topic_id=0, partition=0, body=b"")
    with pytest.raises(AssertionError, match="unreachable"):
        core.carry_out(object(), frame, None, Slot(0))  # type: ignore[arg-type]


def test_durable_waiters_of_one_turn_share_one_flush_and_later_ones_get_exactly_one_more() -> None:
    core = FakeCore()
    partition = FakePartition()
    answered: list[str] = []
    for name in ("a", "b"):
        core.after_flush(partition, lambda n=name: answered.append(n), lambda exc: answered.append("fail"))  # type: ignore[arg-type,misc]
    assert len(core.turn_end) == 1  # one group commit scheduled for the turn, not one per waiter
    core.end_turn()
    assert len(core.running) == 1 and partition.log.prepared == 1
    # While that flush runs, two turns add waiters: one more flush covers both, after the first.
    for name in ("c", "d"):
        core.after_flush(partition, lambda n=name: answered.append(n), lambda exc: answered.append("fail"))  # type: ignore[arg-type,misc]
        core.end_turn()
    assert len(core.running) == 1
    core.running.pop()[1](None)
    assert answered == ["a", "b"] and core.flushed_counts == [2]
    assert len(core.running) == 1 and partition.log.prepared == 2
    core.running.pop()[1](OSError(5, "EIO"))
    assert answered == ["a", "b", "fail", "fail"] and len(partition.log.failed) == 1
    assert not core.running and core.busy() is False  # nothing left for shutdown to wait on


class FakeConn:
    def __init__(self) -> None:
        self.filled: list[object] = []

    def fill(self, slot: Slot, reply: object) -> None:
        self.filled.append(reply)


def test_the_appends_one_write_finished_wake_the_long_polls_once_after_the_last(tmp_path: Any) -> None:
    """Appends finished together (a producer's pipelined batches in one write) are all visible
    before a parked fetch is woken, once: its answer carries them all, not the first batch alone
    and a fetch round more for the rest. A lone append wakes at its completion, not later."""
    core = FakeCore()
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    p.become_leader(1, (1, 2), (1, 2), node_id=1, now=0)
    conn = FakeConn()
    woken: list[tuple[str, int]] = []
    p.replica_waiters.append(lambda: woken.append(("follower", p.log.end_offset)))
    p.waiters.append(lambda: woken.append(("consumer", p.log.end_offset)))

    def append(value: bytes) -> Callable[[OSError | None], None]:
        produced = p.produce(encode_batch([value]), DiskSpace(str(tmp_path), 0), Acks.WRITTEN)
        outcome = Append(
            p,
            produced.pending,
            produced.waits,
            produced.complete,  # type: ignore[union-attr]
            lambda: Reply([value]),
            lambda exc: Reply([b"fail"]),
        )  # type: ignore[union-attr,misc]
        core.carry_out(outcome, Frame(4, 1, 0, 1, 1, 0, b""), conn, Slot(0))  # type: ignore[arg-type]
        ops, written = core.running.pop()
        run_ops(SyncFileIO(), ops)
        return written

    writes = [append(v) for v in (b"x", b"y", b"z")]
    writes[2](None)
    writes[1](None)
    assert woken == [] and p.log.end_offset == 0, "the first is still writing: nothing visible"
    writes[0](None)  # all three finish in this one step, as one write's appends do
    assert sorted(woken) == [("consumer", 3), ("follower", 3)], "woken once, all three visible"
    assert [r.buffers for r in conn.filled] == [[b"x"], [b"y"], [b"z"]]  # type: ignore[attr-defined]
    woken.clear()
    p.replica_waiters.append(lambda: woken.append(("follower", p.log.end_offset)))
    append(b"alone")(None)
    assert woken == [("follower", 4)], "a lone append's wake is not held"
    p.close()


def test_a_replicated_acks_all_append_is_answered_when_the_high_watermark_passes_it(tmp_path: Any) -> None:
    core = FakeCore()
    p = Partition(1, 0, str(tmp_path / "p"), LogConfig())
    p.become_leader(1, (1, 2), (1, 2), node_id=1, now=0)
    conn = FakeConn()
    woken_ns: list[int] = []  # a follower's parked fetch, woken when the append becomes visible
    p.replica_waiters.append(lambda: woken_ns.append(time.monotonic_ns()))
    for acks in (Acks.ALL, Acks.WRITTEN):
        produced = p.produce(encode_batch([b"x"]), DiskSpace(str(tmp_path), 0), acks)
        reply = Reply([b"%d" % acks])
        append = Append(
            p,
            produced.pending,
            produced.waits,
            produced.complete,  # type: ignore[union-attr]
            lambda r=reply: r,
            lambda exc: Reply([b"fail"]),
        )  # type: ignore[union-attr,misc]
        core.carry_out(append, Frame(4, 1, 0, 1, 1, 0, b""), conn, Slot(0))  # type: ignore[arg-type]
        ops, done = core.running.pop()
        run_ops(SyncFileIO(), ops)
        done(None)
    assert [r.buffers for r in conn.filled] == [[b"1"]], "acks=1 at once, acks=all waits for the follower"  # type: ignore[attr-defined]
    assert not core.acked_at
    p.replica_fetched(2, 1, now=0)
    assert [r.buffers for r in conn.filled] == [[b"1"], [b"-1"]]  # type: ignore[attr-defined]
    assert len(core.acked_at) == 1, "the wait for the high watermark is measured"
    assert core.acked_at[0] <= woken_ns[0], "from before the followers' fetches were woken"
    p.become_follower(2, leader=2)  # no flush was asked for either
    assert not core.turn_end
    p.close()


def test_a_followers_append_runs_in_order_and_says_when_it_is_done(tmp_path: Any) -> None:
    core = FakeCore()
    leader = Partition(1, 0, str(tmp_path / "a"), LogConfig())
    follower = Partition(1, 0, str(tmp_path / "b"), LogConfig())
    leader.become_leader(1, (1, 2), (1, 2), node_id=1, now=0)
    follower.become_follower(1, leader=1)
    for value in (b"x", b"y"):
        produced = leader.produce(encode_batch([value]), DiskSpace(str(tmp_path), 0))
        run_ops(SyncFileIO(), produced.pending.ops)  # type: ignore[union-attr]
        produced.complete()  # type: ignore[union-attr]
    data = leader.log.read(0, 1 << 20).data
    done: list[int] = []
    (append,) = append_outcomes(follower, data, leader_hw=2)
    core.run_replica_append(append, lambda: done.append(follower.log.end_offset))
    assert follower.log.end_offset == 0 and done == []
    ops, written = core.running.pop()
    run_ops(SyncFileIO(), ops)
    written(None)
    assert done == [2] and follower.high_watermark == 2
    assert follower.log.read(0, 1 << 20).data == data
    leader.close()
    follower.close()


def test_a_flush_asked_for_now_starts_at_once_and_waiters_after_it_share_the_next() -> None:
    core = FakeCore()
    partition = FakePartition()
    answered: list[str] = []
    core.after_flush(partition, lambda: answered.append("a"), lambda exc: answered.append("fail"), now=True)  # type: ignore[arg-type]
    assert len(core.running) == 1 and not core.turn_end  # started, not left for the turn's end
    # Later in the same turn: one at the end of the turn, one asking for now; neither starts a
    # second flush beside the one running, and both share the next.
    core.after_flush(partition, lambda: answered.append("b"), lambda exc: answered.append("fail"))  # type: ignore[arg-type]
    core.after_flush(partition, lambda: answered.append("c"), lambda exc: answered.append("fail"), now=True)  # type: ignore[arg-type]
    core.end_turn()
    assert len(core.running) == 1 and partition.log.prepared == 1
    core.running.pop()[1](None)
    assert answered == ["a"] and partition.log.prepared == 2 and len(core.running) == 1
    core.running.pop()[1](None)
    assert answered == ["a", "b", "c"] and core.flushed_counts == [1, 2]


def test_a_turn_over_many_partitions_flushes_them_together_and_answers_each_by_its_result() -> None:
    """`SYNCFS_MIN` partitions or more in one turn: one job for all their flushes; each
    completes or fails on its own result; waiters that came meanwhile wait for the next group
    commit (together again if there are enough), not for a flush of their own each."""
    core = FakeCore()
    parts = [FakePartition() for _ in range(SYNCFS_MIN)]
    answered: list[tuple[int, str]] = []

    def wait(i: int) -> None:
        core.after_flush(
            parts[i], lambda: answered.append((i, "ok")), lambda exc: answered.append((i, "fail"))
        )  # type: ignore[arg-type]

    for i in range(len(parts)):
        wait(i)
    core.end_turn()
    assert not core.running and len(core.together) == 1 and core.together_counts == [len(parts)]
    flushes, done = core.together.pop()
    assert [d for _, d in flushes] == ["fake"] * len(parts)
    for i in range(len(parts)):  # the next turn: every partition waits again, its flush in flight
        wait(i)
    core.end_turn()
    assert not core.together and not core.running
    failing = parts[3].log.plan.ops  # the group's order is the turn's, not the partitions'
    done([OSError(5, "EIO") if ops is failing else None for ops, _ in flushes])
    assert sorted(answered) == sorted([(i, "fail" if i == 3 else "ok") for i in range(len(parts))])
    assert len(parts[3].log.failed) == 1 and parts[0].log.completed == 1
    assert not core.running and len(core.turn_end) == 1  # the waiters that came meanwhile: next turn
    core.end_turn()
    assert len(core.together) == 1 and core.together_counts == [len(parts), len(parts)]
    core.together.pop()[1]([None] * len(parts))
    assert core.flushed_counts == [1] * (2 * len(parts) - 1) and core.busy() is False


def test_a_turn_over_few_partitions_flushes_each_on_its_own() -> None:
    core = FakeCore()
    parts = [FakePartition() for _ in range(SYNCFS_MIN - 1)]
    for p in parts:
        core.after_flush(p, lambda: None, lambda exc: None)  # type: ignore[arg-type]
    core.end_turn()
    assert not core.together and len(core.running) == len(parts)


def test_flushes_in_flight_count_towards_running_together() -> None:
    """A steady spread of a few partitions a turn: each turn's own flushes pile up in flight
    (they queue on the journal), and once they and the turn's due ones reach `SYNCFS_MIN`, the
    due ones go together; those flushing alone finish on their own syncs."""
    core = FakeCore()
    parts = [FakePartition() for _ in range(SYNCFS_MIN + 1)]
    for p in parts[: SYNCFS_MIN - 2]:  # one turn each, so none of these turns is busy alone
        core.after_flush(p, lambda: None, lambda exc: None)  # type: ignore[arg-type]
        core.end_turn()
    assert len(core.running) == SYNCFS_MIN - 2 and not core.together
    for p in parts[SYNCFS_MIN - 2 :]:
        core.after_flush(p, lambda: None, lambda exc: None)  # type: ignore[arg-type]
    core.end_turn()
    assert core.together_counts == [3] and len(core.running) == SYNCFS_MIN - 2
    for _, done in core.running:
        done(None)
    core.together.pop()[1]([None] * 3)
    assert core.flushed_counts == [1] * (SYNCFS_MIN + 1) and core.busy() is False


def test_while_a_group_runs_the_partitions_due_wait_for_it_then_run_together_again() -> None:
    """The partitions due while a group's syncfs runs start no fdatasync of their own, not even
    one whose own flush ends meanwhile; after the group they start together if two or more are
    due, each on its own if one is."""
    core = FakeCore()
    group = [FakePartition() for _ in range(SYNCFS_MIN)]
    alone, later, last = FakePartition(), [FakePartition(), FakePartition()], FakePartition()
    answered: list[str] = []
    core.after_flush(alone, lambda: answered.append("alone 1"), lambda exc: None)  # type: ignore[arg-type]
    core.end_turn()
    assert len(core.running) == 1
    for p in group:
        core.after_flush(p, lambda: answered.append("group"), lambda exc: None)  # type: ignore[arg-type]
    core.end_turn()
    assert core.together_counts == [SYNCFS_MIN] and len(core.running) == 1
    # Meanwhile: two other partitions are due, and `alone` is again, asking to flush now.
    for p in later:
        core.after_flush(p, lambda: answered.append("later"), lambda exc: None)  # type: ignore[arg-type]
    core.after_flush(alone, lambda: answered.append("alone 2"), lambda exc: None, now=True)  # type: ignore[arg-type]
    core.end_turn()
    assert len(core.running) == 1 and len(core.together) == 1, "nothing starts beside the group"
    core.running.pop()[1](None)  # `alone`'s first flush ends: its next waits for the group too
    assert answered == ["alone 1"] and not core.running
    core.end_turn()
    assert not core.running and len(core.together) == 1
    core.together.pop()[1]([None] * SYNCFS_MIN)
    assert answered.count("group") == SYNCFS_MIN
    core.end_turn()  # the group commit after the group: `alone` and the two later ones
    assert core.together_counts == [SYNCFS_MIN, 3] and not core.running
    flushes, done = core.together.pop()
    done([None] * len(flushes))
    assert sorted(answered[-3:]) == ["alone 2", "later", "later"]
    # A group commit of one partition after a group: its own fdatasync.
    core.after_flush(last, lambda: answered.append("last"), lambda exc: None)  # type: ignore[arg-type]
    core.end_turn()
    assert core.together_counts == [SYNCFS_MIN, 3] and len(core.running) == 1
    core.running.pop()[1](None)
    assert answered[-1] == "last" and core.busy() is False


def test_soon_after_a_group_two_due_run_together_and_a_quiet_turn_later_each_on_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A steady load's next requests come a few turns after the answers a group sends, and the
    turn of its end may have none due: for `GROUPING_AFTER` times the group's duration after its
    end, two partitions due run together; later, each keeps its own syncs."""
    clock = [100.0]
    monkeypatch.setattr(appends.time, "monotonic", lambda: clock[0])
    core = FakeCore()
    group = [FakePartition() for _ in range(SYNCFS_MIN)]
    for p in group:
        core.after_flush(p, lambda: None, lambda exc: None)  # type: ignore[arg-type]
    core.end_turn()
    clock[0] += 0.002  # the group's syncfs took 2 ms
    core.together.pop()[1]([None] * SYNCFS_MIN)
    assert not core.turn_end, "nothing was due at the group's end"

    def pair_due() -> None:
        for p in (FakePartition(), FakePartition()):
            core.after_flush(p, lambda: None, lambda exc: None)  # type: ignore[arg-type]
        core.end_turn()

    clock[0] += 0.002 * appends.GROUPING_AFTER - 0.001
    pair_due()
    assert core.together_counts == [SYNCFS_MIN, 2] and not core.running
    clock[0] += 0.001  # this small group took 1 ms
    core.together.pop()[1]([None, None])
    clock[0] += 0.001 * appends.GROUPING_AFTER + 0.001  # a quiet turn later
    pair_due()
    assert core.together_counts == [SYNCFS_MIN, 2] and len(core.running) == 2
    for _, done in core.running:
        done(None)
    assert core.busy() is False


def test_an_append_answered_before_it_is_published_is_published_whatever_its_answer() -> None:
    core = FakeCore()
    published: list[int] = []

    def broken_answer() -> Reply:
        raise RuntimeError("no reply")

    def fail(exc: BaseException) -> Reply:
        return Reply([f"failed: {exc}".encode()])

    conn = FakeConn()
    append = Append(None, None, Waits.WRITE, lambda: published.append(1), broken_answer, fail)  # type: ignore[arg-type]
    core._answer_then_publish(append, lambda reply: conn.fill(Slot(0), reply))
    assert published == [1], "the written batches are published though the reply could not be built"
    assert [r.buffers for r in conn.filled] == [[b"failed: no reply"]]  # type: ignore[attr-defined]

    def refused_publish() -> None:
        raise AssertionError("appends complete in the order prepared")

    conn = FakeConn()
    pending = SimpleNamespace(segment=SimpleNamespace(store_path="p/00.log"))
    append = Append(None, pending, Waits.WRITE, refused_publish, lambda: Reply([b"ok"]), fail)  # type: ignore[arg-type]
    core._answer_then_publish(append, lambda reply: conn.fill(Slot(0), reply))
    assert [r.buffers for r in conn.filled] == [[b"ok"]]  # answered; the refusal is logged
