"""Where io_uring puts a flush's fdatasync (`--flush-syncs`, broker/backends/uring_options.py): on
the loop only when `Loop.quiet()` says nothing else waits for it, on a real ring, and back on the
ring after a slow flush (`SyncPlacement`)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

from broker.backends.uring_loop import Loop
from broker.backends.uring_options import FLUSH_SYNCS, SYNC_INLINE_NS_MAX, SyncPlacement, UringOptions
from native import Ring, probe

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring unavailable: {probe()}")


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def test_an_idle_loop_is_quiet() -> None:
    with Ring(16) as ring:
        loop = Loop(ring)
        assert loop.quiet()
        seen: list[bool] = []
        ring.prep_nop(loop.op(lambda res, flags: seen.append(loop.quiet())))
        loop.run_once()
        assert seen == [True]  # the only completion of its pass: nothing after it
        assert loop.quiet()


def test_a_completion_not_yet_run_is_not_quiet() -> None:
    with Ring(16) as ring:
        loop = Loop(ring)
        seen: list[bool] = []
        for _ in range(2):
            ring.prep_nop(loop.op(lambda res, flags: seen.append(loop.quiet())))
        ring.submit()
        time.sleep(0.01)  # both complete before the pass reaps them together
        loop.run_once()
        assert seen == [False, True]  # the first one's pass still had the second to run


def test_a_completion_in_the_ring_is_not_quiet() -> None:
    with Ring(16) as ring:
        loop = Loop(ring)
        ring.prep_nop(loop.op(lambda res, flags: None))
        ring.submit()
        time.sleep(0.01)
        assert not loop.quiet()
        loop.run_once()
        assert loop.quiet()


def test_socket_data_waiting_as_task_work_is_not_quiet() -> None:
    # COOP_TASKRUN: a recv's completion is task work until the next enter, not yet in the CQ
    a, b = socket.socketpair()
    with a, b, Ring(16) as ring:
        loop = Loop(ring)
        got: list[int] = []
        ring.prep_recv(a.fileno(), bytearray(16), loop.op(lambda res, flags: got.append(res)))
        ring.submit()
        time.sleep(0.01)
        assert loop.quiet()  # armed, nothing arrived
        b.send(b"x")
        time.sleep(0.01)
        assert not loop.quiet()
        loop.run_once()
        assert got == [1] and loop.quiet()


def test_queued_callbacks_and_disk_ops_in_flight_are_not_quiet(pipe: tuple[int, int]) -> None:
    r, w = pipe
    with Ring(16) as ring:
        loop = Loop(ring)
        loop.call_soon(lambda: None)
        assert not loop.quiet()
        loop.run_once()
        loop.at_end_of_pass(lambda: None)
        assert not loop.quiet()
        loop.run_once()
        assert loop.quiet()
        # a read standing in for a disk op: the io-wq thread running it must not be held up
        ring.prep_read(r, bytearray(8), 0, loop.worker_op(lambda res, flags: None))
        ring.submit()
        assert not loop.quiet()
        os.write(w, b"12345678")
        loop.run_once()
        assert loop.quiet()


def test_placement_auto_is_inline_when_quiet_and_the_last_flush_was_fast() -> None:
    p = SyncPlacement("auto")
    assert p.inline(quiet=True)
    assert not p.inline(quiet=False)
    p.took(SYNC_INLINE_NS_MAX + 1)  # a slow disk: the next flushes go to the ring
    assert not p.inline(quiet=True)
    p.took(SYNC_INLINE_NS_MAX // 10)  # a fast one on the ring: back inline when quiet
    assert p.inline(quiet=True)


def test_placement_ring_and_inline_do_as_they_say() -> None:
    ring, inline = SyncPlacement("ring"), SyncPlacement("inline")
    for quiet in (True, False):
        assert not ring.inline(quiet)
        assert inline.inline(quiet)
    inline.took(10 * SYNC_INLINE_NS_MAX)
    assert inline.inline(True)


def test_unknown_placements_are_refused() -> None:
    assert FLUSH_SYNCS == ("auto", "ring", "inline")
    with pytest.raises(ValueError, match="flush_syncs"):
        SyncPlacement("sometimes")
    with pytest.raises(ValueError, match="flush_syncs"):
        UringOptions(flush_syncs="sometimes")
