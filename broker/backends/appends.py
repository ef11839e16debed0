"""A core's appends and group commit: each partition's writes made visible in prepare order, and
one flush per partition for the durable replies of a loop turn.

Rules this module keeps:
- Appends of one partition may run together (their writes go to disjoint byte ranges), but they
  become visible strictly in the order they were prepared, as the log requires. A failed write
  undoes that append and every later one (`Log.abort_append`), once none of them is still writing.
- Group commit: every acks=durable reply of one loop turn waits for one flush per partition,
  started at the end of the turn (`end_of_turn`); a flush already in flight for that partition is
  followed by exactly one more, which covers everything that arrived meanwhile.
- A group commit with `SYNCFS_MIN` partitions or more flushing or due at once (the flushes in
  flight count) runs its due ones together: their writes, then one syncfs per file system their
  files are on, instead of each one's fdatasyncs and directory fsyncs (broker/storage/fileio.py's
  `run_together`: what it promises, how a failed syncfs still fails only the partition whose file
  failed; after a failed syncfs the core never uses it again). While such a group runs, no flush
  starts beside it: what falls due waits for it, and a group commit soon after it (four times
  its duration) runs together again if two or more partitions are due, so that a steady load
  keeps flushing together.
- `PartitionAppends` runs on the backend's primitives (broker/backends/primitives.py) and is
  what `BackendCore` (broker/backends/backend_core.py) extends; the core's dispatch hands it each
  `Append` (`_append`) and `Durable` (`after_flush`), the replica manager a follower's appends
  (`run_replica_append`), the core its own (`run_own_append`: the transaction coordinator's).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import assert_never

from broker.backends.connection import GatherPart, ServedConnection
from broker.backends.primitives import BackendPrimitives
from broker.core.acks import Waits
from broker.core.core import Core
from broker.core.outcomes import Append, FollowerAppend, Reply, Silent
from broker.core.partition import Partition
from broker.storage.fileio import SYNCFS_MIN, FileSystems, Op, run_together
from broker.storage.log_flush import FlushPlan

log = logging.getLogger(__name__)

GROUPING_AFTER = 4  # a group's durations after its end during which two or more due still group


Flushed = tuple[Callable[[], None], Callable[[BaseException], None]]  # (done, failed) of a waiter


class AppendInFlight:
    """One append whose operations run: it completes (becomes visible) in prepare order."""

    __slots__ = ("done", "error", "outcome", "running")

    def __init__(
        self,
        outcome: Append | FollowerAppend,
        done: Callable[[Reply | Silent | None, BaseException | None, int], None],
    ) -> None:
        self.outcome = outcome
        self.done = done
        self.running = True  # its operations have not finished
        self.error: OSError | None = None


class PartitionWork:
    """What the core tracks per partition with storage work: appends in flight (in prepare
    order), the flush in flight and who waits for the next one."""

    __slots__ = ("appends", "flush_waiters", "flushing", "writes_in_flight")

    def __init__(self) -> None:
        self.appends: deque[AppendInFlight] = deque()
        self.writes_in_flight = 0
        self.flushing = False
        self.flush_waiters: list[Flushed] = []  # for the next flush (not the one in flight)

    def idle(self) -> bool:
        return not (self.appends or self.writes_in_flight or self.flushing or self.flush_waiters)


class PartitionAppends(BackendPrimitives):
    """The storage work of one core's partitions: appends in flight, flushes and who waits for
    them (`PartitionWork`, per partition with any)."""

    core: Core

    def __init__(self) -> None:
        self._work: dict[Partition, PartitionWork] = {}
        self._flush_due: set[Partition] = set()  # partitions with waiters for a flush this turn
        self._commit_scheduled = False
        self._flushes_alone = 0  # partitions' own flushes in flight (fdatasyncs, not a group's)
        self._group_running = False  # a flush together (`_flush_together`) is in flight
        self._grouping_until = 0.0  # monotonic: a group commit before this still groups (below)
        self.filesystems = FileSystems()  # what `run_flush_together` calls syncfs on

    # ------------------------------------------------------------------------- appends

    def _work_of(self, partition: Partition) -> PartitionWork:
        work = self._work.get(partition)
        if work is None:
            work = self._work[partition] = PartitionWork()
        return work

    def _settle(self, partition: Partition, work: PartitionWork) -> None:
        if work.idle() and self._work.get(partition) is work:
            del self._work[partition]

    def _append(
        self,
        outcome: Append | FollowerAppend,
        deliver: Callable[[Reply | Silent], None],
        conn: ServedConnection | GatherPart | None,
    ) -> None:
        """Run the append's operations; once it is visible, `deliver` the reply when what it
        waits for (`outcome.waits`, decided by the partition) has happened: the write, a flush,
        or the high watermark passing it. `conn`: the client connection it answers (None: the
        broker's own append, a follower's copy)."""
        partition = outcome.partition
        pending = outcome.pending
        work = self._work.get(partition)
        if (work is None or not work.appends) and self.appends_now(pending.ops, conn):
            # Nothing of this partition's is in flight, and the backend writes this on the loop:
            # write, make visible and answer in one go. The same steps as below, without the
            # bookkeeping of an append that waits (a fifth of a one-record produce's Python).
            exc = self.run_ops_now(pending.ops)
            if exc is not None:
                log.error("append to %s failed: %s", pending.segment.store_path, exc)
                partition.log.abort_append(pending)
                self._answer_append(outcome, deliver, None, exc)
                return
            if outcome.waits is Waits.WRITE and conn is not None and not conn.from_peer:
                # A client's acks=0/1 append waits for nothing more: answer first, then publish
                # (`Append`), in this pass. The client's wait is shorter by the publishing, and
                # its next request often finds the worker still awake (one-record produce on
                # io_uring, 5 alternated rounds: p50 124-152 -> 90-150 us). A follower's append
                # (conn None) keeps the order: what it does next reads the log end publishing moves.
                self._answer_then_publish(outcome, deliver)
                return
            written_ns = time.monotonic_ns()
            try:
                reply = outcome.complete()
            except Exception as exc:  # the log refused to complete: an error reply
                self._answer_append(outcome, deliver, None, exc)
                return
            # the last request of what was received: its flush (acks=durable) starts now
            last = isinstance(conn, ServedConnection) and conn.taken_all()
            self._answer_append(outcome, deliver, reply, None, written_ns, flush_now=last)
            return

        def done(reply: Reply | Silent | None, exc: BaseException | None, written_ns: int) -> None:
            self._answer_append(outcome, deliver, reply, exc, written_ns)

        work = self._work_of(partition)
        entry = AppendInFlight(outcome, done)
        work.appends.append(entry)
        work.writes_in_flight += 1

        def written(exc: OSError | None) -> None:
            work.writes_in_flight -= 1
            entry.running = False
            entry.error = exc
            # Nothing to advance while an earlier append still writes: the io_uring backend tells
            # a gathered run's appends last first, and the first of them completes them all.
            if not work.appends[0].running:
                self._advance_appends(partition, work)

        self.run_append(partition, outcome.pending.ops, written)

    def _answer_then_publish(
        self, outcome: Append | FollowerAppend, deliver: Callable[[Reply | Silent], None]
    ) -> None:
        """Answer a written acks=0/1 append, then publish it: whatever becomes of the answer (a
        reply that cannot be built is a bug, answered as an error), the written batches are
        published, as the order of the log's appends requires."""
        try:
            reply: Reply | Silent | None = outcome.answer()
            failure: BaseException | None = None
        except Exception as exc:
            reply, failure = None, exc
        try:
            if failure is None:  # acks=0/1: what `_answer_append` does, without its call
                deliver(reply)  # type: ignore[arg-type]
            else:
                self._answer_append(outcome, deliver, None, failure)
        finally:
            try:
                outcome.publish()
            except Exception:  # the log refused: its invariants are broken, and it says how
                path = outcome.pending.segment.store_path
                log.exception("a written append to %s could not be published", path)

    def _answer_append(
        self,
        outcome: Append | FollowerAppend,
        deliver: Callable[[Reply | Silent], None],
        reply: Reply | Silent | None,
        exc: BaseException | None,
        written_ns: int = 0,
        flush_now: bool = False,
    ) -> None:
        """An append is visible (`reply`) or failed (`exc`): deliver the answer once what it
        waits for has happened (`flush_now`: see `after_flush`). Nothing here decides what that
        is: the partition did (`Partition.waits_for`). `written_ns`: when its writes had finished,
        before it was made visible (0: now), where the wait for the high watermark is measured
        from: making it visible wakes the followers' parked fetches, whose answers are part of
        that wait (taken after them, the metric left out the leader's ~100 us of answers)."""
        if exc is not None:
            deliver(outcome.fail(exc))
            return
        assert reply is not None
        match outcome.waits:
            case Waits.WRITE:
                deliver(reply)
            case Waits.HIGH_WATERMARK:
                metrics = self.core.metrics
                written_ns = written_ns or time.monotonic_ns()

                def replicated() -> None:
                    metrics.replica_acked(written_ns)
                    deliver(reply)

                outcome.partition.after_replicated(
                    outcome.pending.next_offset, replicated, lambda e: deliver(outcome.fail(e))
                )
            case Waits.FLUSH:
                self.after_flush(
                    outcome.partition,
                    lambda: deliver(reply),
                    lambda e: deliver(outcome.fail(e)),
                    flush_now,
                )
            case _:
                assert_never(outcome.waits)

    def run_replica_append(self, outcome: FollowerAppend, done: Callable[[], None]) -> None:
        """Carry out a follower's copy of its leader's batches (broker/core/replica_fetcher.py),
        in order with the partition's other appends; `done()` once it completed or failed (its
        own callbacks said which). No client waits for it, so nothing is answered."""
        self._append(outcome, lambda _answer: done(), None)

    def run_own_append(self, outcome: Append, done: Callable[[Reply | Silent], None]) -> None:
        """Carry out an append the core itself makes (a transaction coordinator's state record,
        a transaction marker), in order with the partition's other appends; `done(answer)` once
        what `outcome.waits` names has happened (`outcome.answer()`'s reply) or it failed
        (`outcome.fail(exc)`'s). No connection: nothing else is answered."""
        self._append(outcome, done, None)

    def _advance_appends(self, partition: Partition, work: PartitionWork) -> None:
        """Make finished appends visible in prepare order; undo from the first failed one, once
        none of the appends after it is still writing (`Log.abort_append`)."""
        appends = work.appends
        # several finished together (one write): their long polls are woken once, after the last
        many = len(appends) > 1 and not appends[1].running and appends[1].error is None
        if many:
            partition.hold_wakes()
        try:
            while appends and not appends[0].running and appends[0].error is None:
                entry = appends.popleft()
                written_ns = time.monotonic_ns()
                try:
                    reply = entry.outcome.complete()
                except Exception as exc:  # the log refused to complete: an error reply
                    entry.done(None, exc, written_ns)
                    continue
                entry.done(reply, None, written_ns)
        finally:
            if many:
                partition.release_wakes()
        if appends and appends[0].error is not None and not work.writes_in_flight:
            failed = appends[0]
            error = failed.error
            assert error is not None
            log.error("append to %s failed: %s", failed.outcome.pending.segment.store_path, error)
            partition.log.abort_append(failed.outcome.pending)
            aborted, work.appends = list(appends), deque()
            for entry in aborted:
                entry.done(None, entry.error or error, 0)
        self._settle(partition, work)

    # ------------------------------------------------------------------------- group commit

    def stopping(self) -> bool:
        """Whether the core is shutting down (the backend core says)."""
        return False

    def after_flush(
        self,
        partition: Partition,
        done: Callable[[], None],
        failed: Callable[[BaseException], None],
        now: bool = False,
    ) -> None:
        """`done()` once `partition`'s next flush has completed, `failed(exc)` if it fails. Every
        waiter of a loop turn shares one flush per partition, started at the end of the turn.

        `now`: the caller knows no other request of the turn will wait for this partition (the
        last one a client's bytes held, whose append was written on the loop): the flush starts
        at once, and the disk works while the turn finishes, not after it (for a one-record
        acks=durable produce the gain, ~5%, is within this VM's noise). A request that comes after
        it in the turn waits for the next flush, as one does while any flush is running."""
        work = self._work_of(partition)
        work.flush_waiters.append((done, failed))
        if now and not work.flushing and not self._group_running:
            self._flush(partition, work)
            return
        self._commit_due(partition)

    def _commit_due(self, partition: Partition) -> None:
        """`partition` flushes with this turn's group commit (scheduled once a turn)."""
        self._flush_due.add(partition)
        self._schedule_commit()

    def _schedule_commit(self) -> None:
        if not self._commit_scheduled:
            self._commit_scheduled = True
            self.end_of_turn(self.group_commit)

    def group_commit(self) -> None:
        """One flush per partition for every waiter of this turn; a partition whose flush is in
        flight gets exactly one more after it, which covers everything that arrived meanwhile.

        They start together, with one syncfs per file system (`_flush_together`), when the disk
        is busy with many partitions: `SYNCFS_MIN` or more flushing or due at once (the flushes
        in flight count, so a steady spread of a few partitions a turn gets there too). Once a
        group runs, the partitions due meanwhile stay due until it ends, and a group commit soon
        after it (`GROUPING_AFTER` times its duration) runs together again if it has two or
        more: a syncfs over a few partitions costs less than their fdatasyncs (fileio.py's
        `SYNCFS_MIN` has the figures), and many fdatasyncs in flight at once queue on the
        journal, each as long as the lot. Never while the core is stopping (its last flushes
        keep their own syncs) or once a syncfs of this core failed (fileio.py's `FileSystems`
        says why)."""
        self._commit_scheduled = False
        due, self._flush_due = self._flush_due, set()
        starting = []
        for partition in due:
            work = self._work.get(partition)
            if work is not None and not work.flushing and work.flush_waiters:
                starting.append((partition, work))
        if not starting:
            return
        if self.filesystems.failed is None and not self.stopping():
            if self._group_running:  # they stay due: the group's end commits them
                self._flush_due.update(partition for partition, _ in starting)
                return
            busy = len(starting) + self._flushes_alone >= SYNCFS_MIN
            after_group = len(starting) >= 2 and time.monotonic() < self._grouping_until
            if busy or after_group:
                self._flush_together(starting)
                return
        for partition, work in starting:
            self._flush(partition, work, alone=len(starting) == 1)

    def _flush(self, partition: Partition, work: PartitionWork, alone: bool = True) -> None:
        started = self._start_flush(partition, work)
        if started is None:
            return
        plan, waiters = started
        self._flushes_alone += 1
        self.run_flush(plan.ops, lambda exc: self._flushed(partition, work, plan, waiters, exc, False), alone)

    def _start_flush(
        self, partition: Partition, work: PartitionWork
    ) -> tuple[FlushPlan, list[Flushed]] | None:
        """The plan of `partition`'s next flush, which its waiters now wait for; None if the log
        cannot make one (every waiter has been told)."""
        waiters, work.flush_waiters = work.flush_waiters, []
        log_ = partition.log
        try:
            plan = log_.prepare_flush()
        except Exception as exc:  # a broken or closed log: every waiter learns of it
            log.error("flush of %s failed: %s", log_.directory, exc)
            for _, failed in waiters:
                failed(exc)
            self._settle(partition, work)
            return None
        work.flushing = True
        return plan, waiters

    def _flush_together(self, starting: list[tuple[Partition, PartitionWork]]) -> None:
        """Many partitions' flushes with one syncfs per file system instead of each one's syncs
        (`run_flush_together`; fileio.py's `run_together` says what that promises and how a
        failure still lands on the partition it belongs to). Waiters that arrive meanwhile wait
        for the next group commit, which may run together again."""
        flushes = []
        for partition, work in starting:
            started = self._start_flush(partition, work)
            if started is not None:
                flushes.append((partition, work, *started))
        if not flushes:
            return

        def flushed(errors: Sequence[OSError | None]) -> None:
            self._group_running = False
            for (partition, work, plan, waiters), exc in zip(flushes, errors, strict=True):
                self._flushed(partition, work, plan, waiters, exc, True)
            # The disk counts as busy for four times as long as this group took: its answers go
            # out, and a steady load's next requests come back a few turns later (the turn of its
            # end may have none due). A quiet turn after that keeps each partition's own syncs.
            # Our client's acks=all over 1000 partitions on io_uring: with once the group's time,
            # 167k rec/s and 30-45% of the flushes together; four times, 180-183k and 76-81%.
            ended = time.monotonic()
            self._grouping_until = ended + GROUPING_AFTER * (ended - began)
            if self._flush_due:  # what fell due meanwhile
                self._schedule_commit()

        self._group_running = True
        began = time.monotonic()
        self.core.metrics.flushed_together(len(flushes))
        self.run_flush_together([(plan.ops, p.log.directory) for p, _, plan, _ in flushes], flushed)

    def _flushed(
        self,
        partition: Partition,
        work: PartitionWork,
        plan: FlushPlan,
        waiters: list[Flushed],
        exc: OSError | None,
        together: bool,
    ) -> None:
        """A flush ended (`exc`: how it failed): complete or fail its plan, answer its waiters,
        then start the next flush if waiters arrived meanwhile: at once after a flush of its own,
        with the turn's group commit after one together with others (which may again be many)."""
        log_ = partition.log
        work.flushing = False
        if not together:
            self._flushes_alone -= 1
        error: BaseException | None = exc
        if exc is not None:
            log_.fail_flush(exc, plan)
        else:
            try:
                log_.complete_flush(plan)
            except Exception as complete_exc:  # every waiter learns of it
                error = complete_exc
        if error is not None:
            log.error("flush of %s failed: %s", log_.directory, error)
            for _, failed in waiters:
                failed(error)
        else:
            self.core.metrics.flushed(len(waiters))
            for done, _ in waiters:
                done()
        if not work.flush_waiters:
            self._settle(partition, work)
        elif not together and not self._group_running:  # arrived while it ran: the next covers them
            self._flush(partition, work)
        else:  # with the group commit, which a running group holds until it ends
            self._commit_due(partition)

    def run_flush_together(
        self,
        flushes: Sequence[tuple[Sequence[Op], str]],
        done: Callable[[Sequence[OSError | None]], None],
    ) -> None:
        """Many flushes' operations (each with its log's directory), with one syncfs per file
        system (fileio.py's `run_together`); `done(errors)`, one per flush. Here on the loop; the
        backends run it beside their loop, as their `run_flush`."""
        done(run_together(self.loop_io, flushes, self.filesystems)[0])
