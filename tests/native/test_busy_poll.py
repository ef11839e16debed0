"""The io_uring loop's busy poll (`broker/backends/uring_loop.py`) on a real ring: it keeps a
pass from sleeping after activity, except while a disk operation (`worker_op`) is in flight, whose
io-wq thread needs the CPU the poll would hold; and the broker's default (`busy_poll_for`)."""

from __future__ import annotations

import os
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
