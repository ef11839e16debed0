"""The io_uring loop's busy poll (`broker/backends/uring_loop.py`) on a real ring: it keeps a
pass from sleeping after activity, except while a disk operation (`worker_op`) is in flight, whose
io-wq thread needs the CPU the poll would hold, and for a while after its yields keep losing the
CPU to a task that runs whole slices; and the broker's default (`busy_poll_for`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from broker.backends.uring_loop import Loop
from broker.backends.uring_options import BUSY_POLL_US_DEFAULT, busy_poll_for
from native import Ring, probe

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring unavailable: {probe()}")

POLL_US = 10_000_000  # 10 s: longer than any pass below may take, so a pass that waits was paused


def _activity(loop: Loop, ring: Ring) -> None:
    """A completion, which starts the poll window."""
    seen: list[int] = []
    ring.prep_nop(loop.op(lambda res, flags: seen.append(res)))
    loop.run_once()
    assert seen == [0]


def _timed_pass(loop: Loop) -> float:
    t = time.monotonic()
    loop.run_once()
    return time.monotonic() - t


def test_poll_keeps_passes_from_sleeping(pipe: tuple[int, int]) -> None:
    r, _ = pipe
    with Ring(16) as ring:
        loop = Loop(ring, busy_poll_us=POLL_US)
        _activity(loop, ring)
        ring.prep_read(r, bytearray(8), 0, loop.op(lambda res, flags: None))  # never completes
        fired: list[bool] = []
        loop.call_later(2.0, lambda: fired.append(True))
        assert _timed_pass(loop) < 1.0 and not fired  # polled: did not wait for the read or the timer


def test_poll_pauses_while_a_disk_op_is_in_flight(pipe: tuple[int, int]) -> None:
    r, w = pipe
    with Ring(16) as ring:
        loop = Loop(ring, busy_poll_us=POLL_US)
        _activity(loop, ring)
        got: list[int] = []
        ring.prep_read(r, bytearray(8), 0, loop.worker_op(lambda res, flags: got.append(res)))
        fired: list[bool] = []
        loop.call_later(0.05, lambda: fired.append(True))
        elapsed = _timed_pass(loop)  # one pass, asleep until the timer: the poll paused for the op
        assert fired == [True] and not got and 0.04 <= elapsed < 1.0
        os.write(w, b"x")
        while not got:
            loop.run_once()
        assert got == [1]
        # the op is done: the poll is back (it completed something, so its window is open)
        ring.prep_read(r, bytearray(8), 0, loop.op(lambda res, flags: None))
        loop.call_later(2.0, lambda: fired.append(True))
        assert _timed_pass(loop) < 1.0 and fired == [True]


def test_slept_pass_waits_without_poll(pipe: tuple[int, int]) -> None:
    r, _ = pipe
    with Ring(16) as ring:
        loop = Loop(ring, busy_poll_us=0)
        _activity(loop, ring)
        ring.prep_read(r, bytearray(8), 0, loop.op(lambda res, flags: None))
        fired: list[bool] = []
        loop.call_later(0.05, lambda: fired.append(True))
        elapsed = _timed_pass(loop)
        assert fired == [True] and elapsed >= 0.04


def test_default_poll_only_when_every_core_has_a_cpu() -> None:
    assert busy_poll_for(None, cores=2, cpus=2) == BUSY_POLL_US_DEFAULT > 0
    assert busy_poll_for(None, cores=3, cpus=2) == 0  # oversubscribed: workers would spin on each other
    assert busy_poll_for(50, cores=3, cpus=2) == 50  # what the operator asked for wins
    assert busy_poll_for(0, cores=1, cpus=2) == 0


def test_an_empty_polling_pass_yields_the_cpu(pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.backends.uring_loop as uring_loop

    yields: list[None] = []
    monkeypatch.setattr(uring_loop.os, "sched_yield", lambda: yields.append(None))
    r, _ = pipe
    with Ring(16) as ring:
        loop = Loop(ring, busy_poll_us=POLL_US)
        _activity(loop, ring)
        assert not yields, "a pass after none (it waits) does not yield"
        ring.prep_nop(loop.op(lambda res, flags: None))
        loop.run_once()  # polls and finds the nop: busy, no yield
        assert not yields
        ring.prep_read(r, bytearray(8), 0, loop.op(lambda res, flags: None))  # never completes
        loop.run_once()  # the last pass ran a completion: this one polls without yielding
        loop.run_once()  # the last found nothing: this one yields before it polls
        assert len(yields) == 1


# The rule's times scaled up for the tests below, so that the machine's own preemptions (a few ms
# under load) neither count as a lost yield nor stretch a burst of them past its window.
LOST_S = 0.03


def _lost_slice() -> None:
    """A yield that gave the CPU away for a slice, as a CPU-bound task on it takes it."""
    time.sleep(LOST_S + 0.01)


def _scale_the_rule(monkeypatch: pytest.MonkeyPatch, window_s: float) -> None:
    import broker.backends.uring_loop as uring_loop

    monkeypatch.setattr(uring_loop, "YIELD_LOST_S", LOST_S)
    monkeypatch.setattr(uring_loop, "YIELD_LOSS_WINDOW_S", window_s)


def _idle_polling_loop(ring: Ring, r: int, pauses: list[None]) -> Loop:
    """A polling loop that records its pauses in `pauses`, its window just opened by a
    completion, with a read of `r` in flight that never completes: its passes find nothing."""
    loop = Loop(ring, busy_poll_us=POLL_US, on_poll_pause=lambda: pauses.append(None))
    _activity(loop, ring)
    ring.prep_read(r, bytearray(8), 0, loop.op(lambda res, flags: None))
    return loop


def _bounded_pass(loop: Loop) -> None:
    """One pass that cannot wait forever: a paused poll sleeps until a completion or a timer."""
    timer = loop.call_later(1.0, lambda: None)
    loop.run_once()
    timer.cancel()


def _passes_within(loop: Loop, seconds: float = 0.1) -> int:
    """The passes the loop makes until a timer `seconds` away fires: a polling loop makes one
    after another, a sleeping one wakes for the timer (and the odd stray completion) only."""
    fired: list[bool] = []
    loop.call_later(seconds, lambda: fired.append(True))
    passes = 0
    while not fired:
        loop.run_once()
        passes += 1
    return passes


def _lose_until_paused(loop: Loop, ring: Ring, pauses: list[None], monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling passes whose yields all lose the CPU (`_lost_slice`) until the poll pauses, which
    must come at the YIELD_LOSSES_TO_PAUSE-th loss (a pass that reaps a stray completion, such as
    an old alarm's, does not yield); the CPU is free again after."""
    import broker.backends.uring_loop as uring_loop

    before = len(pauses)
    seen: list[int] = []  # the pauses so far, at each lost yield

    def lose() -> None:
        seen.append(len(pauses))
        _lost_slice()

    _activity(loop, ring)
    monkeypatch.setattr(uring_loop.os, "sched_yield", lose)
    for _ in range(3 * uring_loop.YIELD_LOSSES_TO_PAUSE):
        _bounded_pass(loop)
        if len(pauses) > before:
            break
    monkeypatch.setattr(uring_loop.os, "sched_yield", lambda: None)
    assert len(pauses) == before + 1
    assert seen == [before] * uring_loop.YIELD_LOSSES_TO_PAUSE  # none sooner, and no more


def test_a_poll_that_keeps_losing_the_cpu_pauses(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import broker.backends.uring_loop as uring_loop

    _scale_the_rule(monkeypatch, window_s=1.0)
    monkeypatch.setattr(uring_loop, "POLL_PAUSE_MIN_S", 0.5)
    monkeypatch.setattr(uring_loop, "POLL_PAUSE_RESET_S", 2.0)
    r, _ = pipe
    pauses: list[None] = []
    with Ring(16) as ring:
        loop = _idle_polling_loop(ring, r, pauses)
        _lose_until_paused(loop, ring, pauses, monkeypatch)
        paused_at = time.monotonic()
        assert _passes_within(loop) <= 5, "the poll paused: the loop sleeps between passes"
        _activity(loop, ring)
        assert _passes_within(loop) <= 5, "activity does not end the pause"
        time.sleep(max(0.0, paused_at + 0.5 - time.monotonic()))
        _activity(loop, ring)  # the pause is over: activity opens a window again
        assert _passes_within(loop) >= 50

        # The task is still there: the next pause, soon after, is twice as long.
        _lose_until_paused(loop, ring, pauses, monkeypatch)
        paused_at = time.monotonic()
        time.sleep(0.6)
        _activity(loop, ring)
        assert _passes_within(loop) <= 5, "paused for 1 s, not 0.5"
        time.sleep(max(0.0, paused_at + 1.0 - time.monotonic()))
        _activity(loop, ring)
        assert _passes_within(loop) >= 50

        # Long after: a burst of losses (a peer's) pauses it for the shortest time again.
        time.sleep(uring_loop.POLL_PAUSE_RESET_S)
        _lose_until_paused(loop, ring, pauses, monkeypatch)
        paused_at = time.monotonic()
        time.sleep(max(0.0, paused_at + 0.5 - time.monotonic()))
        _activity(loop, ring)
        assert _passes_within(loop) >= 50
        assert len(pauses) == 3


def test_lost_yields_now_and_then_keep_the_poll(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import broker.backends.uring_loop as uring_loop

    _scale_the_rule(monkeypatch, window_s=0.5)
    monkeypatch.setattr(uring_loop.os, "sched_yield", _lost_slice)
    r, _ = pipe
    pauses: list[None] = []
    with Ring(16) as ring:
        loop = _idle_polling_loop(ring, r, pauses)
        _bounded_pass(loop)  # polls without yielding: the last pass ran a completion
        for _ in range(2):
            for _ in range(uring_loop.YIELD_LOSSES_TO_PAUSE - 1):
                _bounded_pass(loop)  # yields, and loses the CPU for a slice
            time.sleep(uring_loop.YIELD_LOSS_WINDOW_S * 1.5)  # the next losses come well after
        monkeypatch.setattr(uring_loop.os, "sched_yield", lambda: None)
        assert _passes_within(loop) >= 50, "still polling"
        assert not pauses


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")
def test_a_cpu_bound_process_on_the_cpu_pauses_the_poll(pipe: tuple[int, int]) -> None:
    """The real scheduler: a process spinning on the loop's CPU takes whole slices at its yields."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    r, _ = pipe
    pauses: list[None] = []
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.2)  # the hog is running on it
        with Ring(16) as ring:
            loop = _idle_polling_loop(ring, r, pauses)
            deadline = time.monotonic() + 5.0
            while not pauses and time.monotonic() < deadline:
                _bounded_pass(loop)
            assert pauses, "5 s of empty polling passes beside a spinning process never paused"
            assert _passes_within(loop) <= 5
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
