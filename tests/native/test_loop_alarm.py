"""The io_uring loop's timers (`broker/backends/uring_loop.py`) on a real ring: they wake the loop
through one standing timeout SQE, the alarm, armed for the earliest deadline and re-armed only when
an earlier one comes or it has rung; a pass's wait carries no timeout of its own."""

from __future__ import annotations

import time

import pytest

from broker.backends.uring_loop import Loop
from native import Ring, probe

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring unavailable: {probe()}")


def _nop_pass(loop: Loop, ring: Ring) -> None:
    """A pass woken by a completion, not by a timer."""
    seen: list[int] = []
    ring.prep_nop(loop.op(lambda res, flags: seen.append(res)))
    loop.run_once()
    assert seen == [0]


def test_a_timer_wakes_a_waiting_pass_on_time() -> None:
    with Ring(16) as ring:
        loop = Loop(ring)
        fired: list[float] = []
        t = time.monotonic()
        loop.call_later(0.05, lambda: fired.append(time.monotonic() - t))
        while not fired:
            loop.run_once()
            assert time.monotonic() - t < 2.0, "the timer never fired"
        assert 0.05 <= fired[0] < 1.0
        assert loop.pending_ops == 0  # the alarm is the loop's own, not an operation


def test_passes_reuse_one_alarm() -> None:
    """Many passes under a far timer arm one timeout SQE, not one each."""
    with Ring(16) as ring:
        loop = Loop(ring)
        loop.call_later(30.0, lambda: None)
        _nop_pass(loop, ring)
        assert ring.inflight == 1  # the alarm
        for _ in range(50):
            _nop_pass(loop, ring)
        assert ring.inflight == 1 and loop.pending_ops == 0


def test_an_earlier_timer_rearms_the_alarm() -> None:
    with Ring(16) as ring:
        loop = Loop(ring)
        late: list[bool] = []
        loop.call_later(30.0, lambda: late.append(True))
        _nop_pass(loop, ring)  # the alarm is set for 30 s
        fired: list[float] = []
        t = time.monotonic()
        loop.call_later(0.05, lambda: fired.append(time.monotonic() - t))
        while not fired:
            loop.run_once()
            assert time.monotonic() - t < 2.0, "the earlier timer waited for the later alarm"
        assert 0.05 <= fired[0] < 1.0 and not late
        _nop_pass(loop, ring)  # the 30 s alarm's cancel has completed; the 30 s timer has its own again
        assert ring.inflight == 1 and loop.pending_ops == 0


def test_cancelled_timers_ring_no_alarm() -> None:
    """Timers cancelled long before their deadline (a parked fetch's, woken by data) leave the
    alarm for the first one still wanted: the loop does not wake for each of them."""
    with Ring(16) as ring:
        loop = Loop(ring)
        fired: list[bool] = []
        loop.call_later(30.0, lambda: fired.append(True))
        cancelled = [loop.call_later(0.01 * (i + 1), lambda: fired.append(False)) for i in range(5)]
        for timer in cancelled:
            timer.cancel()
        _nop_pass(loop, ring)
        assert ring.inflight == 1  # one alarm, for the 30 s timer
        time.sleep(0.1)  # every cancelled deadline has passed
        t = time.monotonic()
        _nop_pass(loop, ring)  # woken by its nop, at once: no alarm rang meanwhile
        assert time.monotonic() - t < 1.0 and not fired
        assert ring.inflight == 1 and loop.pending_ops == 0


def test_a_busy_pass_does_not_wait_for_the_alarm() -> None:
    """A pass with callbacks due only reaps what is ready: it neither waits nor arms a timer."""
    with Ring(16) as ring:
        loop = Loop(ring)
        loop.call_later(30.0, lambda: None)
        ran: list[bool] = []
        loop.call_soon(lambda: ran.append(True))
        t = time.monotonic()
        loop.run_once()
        assert ran == [True] and time.monotonic() - t < 1.0
        assert ring.inflight == 0


def test_end_of_pass_callbacks_queued_by_one_run_in_the_same_pass_a_bounded_number_deep() -> None:
    """What an end-of-pass callback queues at the end of the pass (the replies of the writes it
    did) runs in the same pass, up to END_OF_PASS_ROUNDS_MAX rounds; deeper ones wait for the
    next pass, so that a callback that keeps queueing cannot hold the loop."""
    from native.constants import END_OF_PASS_ROUNDS_MAX

    with Ring(16) as ring:
        loop = Loop(ring)
        ran: list[int] = []

        def chain(depth: int) -> None:
            ran.append(depth)
            loop.at_end_of_pass(lambda: chain(depth + 1))

        ring.prep_nop(loop.op(lambda res, flags: loop.at_end_of_pass(lambda: chain(1))))
        loop.run_once()
        assert ran == list(range(1, END_OF_PASS_ROUNDS_MAX + 1))
        loop.run_once()  # due callbacks: the pass does not wait
        assert ran == list(range(1, 2 * END_OF_PASS_ROUNDS_MAX + 1))
