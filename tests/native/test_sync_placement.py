"""Where io_uring puts a flush's fdatasync (`--flush-syncs`, broker/backends/uring_options.py): on
the loop only when `Loop.quiet()` says nothing else waits for it, on a real ring, and back on the
ring after a slow flush (`SyncPlacement`). On the loop, `native.fdatasync_polled` keeps the CPU
busy meanwhile: it syncs, reports errors, and its one poller thread stays on the caller's CPU,
blocks every signal and sleeps between calls."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.backends.uring_loop import Loop
from broker.backends.uring_options import (
    FLUSH_SYNCS,
    SYNC_INLINE_NS_MAX,
    SYNC_INLINE_RETRY_NS,
    SyncPlacement,
    UringOptions,
)
from native import Ring, fdatasync_polled, probe

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring unavailable: {probe()}")


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


def test_placement_auto_keeps_the_ring_for_a_while_after_a_slow_sync_on_the_loop() -> None:
    """A fast flush on the ring is no leave to sync on the loop again: alternating, a chain of
    flushes (a transaction's coordinator appends) paid the slow loop sync every other flush."""
    now = [0]
    p = SyncPlacement("auto", clock_ns=lambda: now[0])
    assert p.inline(quiet=True)
    p.took(SYNC_INLINE_NS_MAX + 1, inline=True)
    p.took(SYNC_INLINE_NS_MAX // 10)  # fast on the ring
    assert not p.inline(quiet=True)
    now[0] = SYNC_INLINE_RETRY_NS - 1
    assert not p.inline(quiet=True)
    now[0] = SYNC_INLINE_RETRY_NS
    assert p.inline(quiet=True)  # tried on the loop again
    p.took(SYNC_INLINE_NS_MAX // 10, inline=True)
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


def test_fdatasync_polled_syncs_and_reports_errors(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * 100)
        fdatasync_polled(fd)
        fdatasync_polled(fd)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as bad:
        fdatasync_polled(fd)  # closed
    assert bad.value.errno == errno.EBADF
    r, w = os.pipe()
    try:
        with pytest.raises(OSError) as pipe:
            fdatasync_polled(r)
        assert pipe.value.errno == errno.EINVAL
    finally:
        os.close(r)
        os.close(w)


POLLER_PROBE = """
import json, os, sys, time
from native import fdatasync_polled
cpu = max(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpu})
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
before = set(os.listdir("/proc/self/task"))
for _ in range(20):
    os.write(fd, b"x" * 1000)
    fdatasync_polled(fd)
threads = [t for t in os.listdir("/proc/self/task") if t not in before]
states = []
for t in threads:
    deadline = time.monotonic() + 5
    while True:  # asleep on its futex once it has seen the last call return
        state = open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()[0]
        if state == "S" or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    status = dict(line.split(":", 1) for line in open(f"/proc/self/task/{t}/status"))
    states.append({
        "name": status["Name"].strip(),
        "state": state,
        "blocked": status["SigBlk"].strip(),
        "cpus": sorted(os.sched_getaffinity(int(t))),
    })
print(json.dumps({"cpu": cpu, "threads": states}))
"""


def test_one_poller_on_the_callers_cpu_blocking_signals_asleep_between_calls(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", POLLER_PROBE, str(tmp_path / "f")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        check=True,
    )
    got = json.loads(out.stdout)
    (poller,) = got["threads"]  # one thread, however many calls
    assert poller["name"] == "rl-sync-poll"
    assert poller["cpus"] == [got["cpu"]]
    assert poller["state"] == "S", poller
    blocked = int(poller["blocked"], 16)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD, signal.SIGALRM):
        assert blocked & (1 << (sig - 1)), (sig, poller)  # delivered to the loop's thread, not here
