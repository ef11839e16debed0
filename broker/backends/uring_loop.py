"""The io_uring backend's small loop: completions, timers and callbacks over one `native.Ring`.

Rules this module keeps:
- One pass: submit everything prepared and wait for at least one completion (or the next timer,
  or not at all when callbacks are due or the busy poll is on: then a pass that found nothing
  yields the CPU to whatever else is runnable on it, and a poll that keeps losing the CPU to a
  task that runs whole slices pauses), reap up to
  `COMPLETIONS_PER_PASS_MAX` completions in one batch, *then* run their continuations (never while
  reaping; both in one C call, `Ring.run_completions`), then the timers that are due, then the
  `call_soon` callbacks queued before this phase, then the end-of-pass callbacks (the group
  commit, the gathered store writes). Every queue has a bound: what a callback queues runs in the
  next pass, but for end-of-pass callbacks that queue more (the replies of the writes they did),
  run in the same pass up to `END_OF_PASS_ROUNDS_MAX` rounds deep.
- The timers wake the loop through one standing timeout SQE (the alarm) set for the earliest
  deadline of a timer not cancelled (cancelled ones are dropped off the top of the heap before a
  wait), re-armed only when that deadline moves earlier or the alarm has rung: the wait itself
  never carries a timeout, which on this VM armed and cancelled a kernel timer in every pass (a
  timer reprogramming is a VM exit; 9% of the worker's CPU in a one-record produce loop).
- A continuation is registered under a fresh user_data (`op`) and runs on each completion of it;
  it is forgotten with the final one (no `CQE_F_MORE`), and the ring releases the buffers then.
- It knows nothing of connections, storage or the broker: broker/backends/uring.py and its
  streams (uring_stream.py) drive it.
  Importable without the compiled bindings (it only names `Ring` for type checkers).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from native.constants import COMPLETIONS_PER_PASS_MAX, END_OF_PASS_ROUNDS_MAX

if TYPE_CHECKING:
    from native.ring import Ring

Callback = Callable[[int, int], None]  # (res, flags) of a completion

# The busy poll shares its CPU: a polling pass that found nothing yields it (`Loop.run_once`). A
# yield that comes back after YIELD_LOST_S gave the CPU to a task that took it for a while: a
# peer's turn now and then (another node's request, a client's), but again and again a task that
# runs whole slices (a CPU-bound process: a spinning client, a build, a benchmark). A yielded
# task runs again only when that slice ends, whatever completes meanwhile, where a sleeping one
# is woken by its completion; so after YIELD_LOSSES_TO_PAUSE such yields within
# YIELD_LOSS_WINDOW_S the poll pauses, the loop sleeping between passes as with `--busy-poll-us
# 0`, then tries again (`Loop._pause_poll`: 0.1 s, doubling while the losses come back, up to 5 s).
# 3 one-core nodes, our client one acks=all record at a time, two CPU-bound processes on the
# 2-vCPU VM: p50 4.2-4.5 -> 1.7-1.8 ms in runs of a few seconds (a fixed 1 s pause read 1.2-1.3,
# the poll off 1.0-2.6); without them the p50 unchanged and no pause in most runs (a node's peers
# lost its yields at most 6 times in 100 ms; docs/PERFORMANCE.md).
YIELD_LOST_S = 0.0005
YIELD_LOSSES_TO_PAUSE = 8
YIELD_LOSS_WINDOW_S = 0.1
POLL_PAUSE_MIN_S = 0.1
POLL_PAUSE_MAX_S = 5.0
POLL_PAUSE_RESET_S = 1.0


def _cancelled() -> None:
    pass


class Timer:
    """A callback due at `deadline` (time.monotonic()); `cancel()` makes it a no-op and lets go
    of the callback, and of what it holds, at once rather than when the deadline pops it (a
    parked fetch's timer held its request, and the view of its body, until its deadline)."""

    __slots__ = ("callback", "cancelled", "deadline")

    def __init__(self, deadline: float, callback: Callable[[], None]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.callback = _cancelled


class Loop:
    """A completion-driven loop over one `native.Ring`. Owned by its worker's only thread."""

    def __init__(
        self, ring: Ring, busy_poll_us: int = 0, on_poll_pause: Callable[[], None] | None = None
    ) -> None:
        self.ring = ring
        self._ops: dict[int, Callback] = {}
        self._ids = itertools.count(1)
        self._timers: list[tuple[float, int, Timer]] = []
        self._soon: deque[Callable[[], None]] = deque()
        self._end_of_pass: list[Callable[[], None]] = []
        self.busy_poll_s = busy_poll_us / 1e6
        self._busy_until = 0.0
        self._poll_again_at = 0.0  # the poll's pause (YIELD_LOST_S) ends then
        self._losses = 0  # yields that lost the CPU (YIELD_LOST_S) since _losses_since
        self._losses_since = -math.inf
        self._pause_s = 0.0  # the last pause's length
        self._on_poll_pause = on_poll_pause
        self._reaped = 0  # completions the last pass ran
        self._offloaded = 0  # ops in flight that a kernel worker thread may run (see worker_op)
        self._alarm_at = math.inf  # when the alarm armed last rings (inf: none armed)
        self._alarm_ud = 0  # its user_data
        self._alarms = 0  # alarms in flight: that one and those being cancelled

    def op(self, callback: Callback) -> int:
        """A user_data for one operation; `callback(res, flags)` runs on each of its completions."""
        ud = next(self._ids)
        self._ops[ud] = callback
        return ud

    def worker_op(self, callback: Callback) -> int:
        """`op` for a disk operation (write, fsync, read), which the kernel may hand to an io-wq
        thread of this worker's CPU: the busy poll pauses until it completes, since spinning would
        hold the CPU that thread needs (an fdatasync waited behind 200 us of polling: durable
        produce p50 487 -> 700 us)."""
        self._offloaded += 1

        def done(res: int, flags: int) -> None:
            self._offloaded -= 1
            callback(res, flags)

        return self.op(done)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self._soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + max(0.0, delay), callback)
        heapq.heappush(self._timers, (timer.deadline, next(self._ids), timer))
        return timer

    def at_end_of_pass(self, callback: Callable[[], None]) -> None:
        """Run `callback` once, after this pass's continuations, timers and soon-callbacks."""
        self._end_of_pass.append(callback)

    @property
    def pending_ops(self) -> int:
        """Operations in flight, the loop's own alarms aside."""
        return len(self._ops) - self._alarms

    def quiet(self) -> bool:
        """Whether nothing but the caller has work for the loop now: no completion of this pass
        left to run nor any waiting in the ring, no callback queued for this pass or its end, and
        no disk operation in flight. What the loop does next delays nobody else (a blocking call,
        `flush_syncs`); what arrives meanwhile waits for it."""
        return (
            not self.ring.unrun
            and not self._soon
            and not self._end_of_pass
            and not self._offloaded
            and self.ring.cq_quiet
        )

    def run_once(self) -> None:
        """One pass: submit and wait, reap a batch, run continuations, timers, soon-callbacks,
        end-of-pass callbacks."""
        ring = self.ring
        if (
            self._soon
            or self._end_of_pass
            or (self.busy_poll_s and not self._offloaded and time.monotonic() < self._busy_until)
        ):
            ring.submit()  # no wait: what is ready is reaped below (the reap flushes task work)
            if not self._reaped:
                # A poll that found nothing lets whatever else waits for this CPU run first:
                # three nodes of a cluster and a client on two CPUs each spun through the others'
                # wake-ups until the scheduler preempted them (acks=all one at a time, 3 replicas:
                # p50 1556-1696 -> 780-819 us; one node acks=1 unchanged, 114-116 / 115-119 us,
                # the yield returning at once when nothing else is runnable).
                before = time.monotonic()
                os.sched_yield()
                if time.monotonic() - before > YIELD_LOST_S:
                    if before - self._losses_since > YIELD_LOSS_WINDOW_S:
                        self._losses, self._losses_since = 0, before
                    self._losses += 1
                    if self._losses >= YIELD_LOSSES_TO_PAUSE:
                        self._pause_poll(before)
        else:
            timers = self._timers
            # A cancelled timer needs no alarm: off the top of the heap now, not at its deadline.
            # A parked fetch's (500 ms out) is cancelled when the fetch wakes, a millisecond or so
            # later; a leader answering its followers' fetches at each record had one coming due
            # every fraction of a millisecond and armed the alarm for each (3 nodes, one acks=all
            # record at a time, `--busy-poll-us 0`: 1.43 alarms and 3.8 passes per record on the
            # leader, now 0.12 and 3.2; its CPU per record 451-478 us against 481-588, p50
            # 730-784 against 750-886 us, alternated).
            while timers and timers[0][2].cancelled:
                heapq.heappop(timers)
            if timers and timers[0][0] < self._alarm_at:
                self._arm_alarm(timers[0][0])
            ring.submit_and_wait(1)
        # The completions' continuations, in C (native/loop.c): one call for the whole batch.
        self._reaped = ring.run_completions(self._ops, COMPLETIONS_PER_PASS_MAX)
        if self._reaped and self.busy_poll_s:
            now = time.monotonic()
            if now >= self._poll_again_at:
                self._busy_until = now + self.busy_poll_s
        if self._timers:
            now = time.monotonic()
            timers = self._timers
            while timers and timers[0][0] <= now:
                _, _, timer = heapq.heappop(timers)
                if not timer.cancelled:
                    timer.callback()
        soon = self._soon
        for _ in range(len(soon)):
            soon.popleft()()
        # What an end-of-pass callback asks for at the end of the pass runs in this pass too (the
        # replies of the appends its writes completed, their group commit), not after the next
        # pass's wait: up to END_OF_PASS_ROUNDS_MAX rounds, so that nothing can hold the loop.
        for _ in range(END_OF_PASS_ROUNDS_MAX):
            if not self._end_of_pass:
                break
            end, self._end_of_pass = self._end_of_pass, []
            for callback in end:
                callback()

    def _pause_poll(self, now: float) -> None:
        """Pause the busy poll: for POLL_PAUSE_MIN_S, or twice the last pause when this one comes
        within POLL_PAUSE_RESET_S of its end (the CPU-bound task is still there), up to
        POLL_PAUSE_MAX_S. A peer's burst of long turns pauses it briefly, a CPU-bound task for
        long."""
        recent = now - self._poll_again_at < POLL_PAUSE_RESET_S
        self._pause_s = min(self._pause_s * 2, POLL_PAUSE_MAX_S) if recent else POLL_PAUSE_MIN_S
        self._losses, self._losses_since = 0, -math.inf  # the next loss starts a new window
        self._busy_until = 0.0
        self._poll_again_at = now + self._pause_s
        if self._on_poll_pause is not None:
            self._on_poll_pause()

    def _arm_alarm(self, deadline: float) -> None:
        """Arm the alarm for `deadline`, cancelling the one armed for later (its CQE still comes)."""
        ring = self.ring
        if self._alarm_ud:
            ring.prep_cancel(self._alarm_ud, self.op(ignore))
        ud = next(self._ids)

        def rang(res: int, flags: int) -> None:
            # It rang (-ETIME) or was cancelled; the timers due run later in this pass.
            self._alarms -= 1
            if self._alarm_ud == ud:
                self._alarm_ud = 0
                self._alarm_at = math.inf

        self._ops[ud] = rang
        ring.prep_timeout(max(0.0, deadline - time.monotonic()), ud)
        self._alarm_ud = ud
        self._alarm_at = deadline
        self._alarms += 1


def ignore(res: int, flags: int) -> None:
    """The continuation of an operation whose outcome nobody needs (a cancel, a close)."""
