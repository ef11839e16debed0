"""Settings of the io_uring backend only (`broker serve --busy-poll-us`, `--append-writes`,
`--flush-syncs`, `--fetch-sends`), and the rule that places a flush's fdatasync (`SyncPlacement`).

Apart from broker/backends/uring.py so that the command line, the supervisor and the worker can
name them without importing the backend (which needs the native bindings).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# After a pass that completed something, the loop keeps polling the ring without sleeping for
# this long (`--busy-poll-us`), trading CPU for the wake-up of an idle CPU. On the 2-vCPU VM it is
# measured on (bench/perf.py; broker on CPU 0, client on CPU 1), waking a halted vCPU
# costs ~40 us each way: a blocking Python echo across the CPUs has p50 81 us, against 21 us when
# the server spins. With 200 us of polling, one-at-a-time acks=1 produce p50 went 164 -> 124 us
# (raw frame) and 211 -> 179 us (AsyncProducer); a client on the worker's own CPU is not slowed
# (its wake-up preempts the poll: 68 vs 71 us). The poll pauses while a disk operation is in
# flight (`Loop.worker_op`): it held the CPU that the io-wq thread running the partition's
# fdatasync needed (durable p50 487 -> 700 us); with the pause, 441 us. It costs a CPU's worth of
# spinning only while requests keep coming less than this far apart, nothing when idle. A polling
# pass stays in user space (it reads the CQ ring and its task-work flag, and enters the kernel
# only when there is something to reap); before, each made an io_uring_enter with a zero timeout,
# whose kernel timer cost a VM exit: in lockstep with that, p50 0.92x at 0.91x the CPU per request.
# The default applies when every core has a CPU of its own; oversubscribed workers (more cores
# than CPUs) would spin on each other's CPU, so there it is 0 (`busy_poll_for`). What a worker
# cannot see, other processes on its CPUs (the other nodes of a cluster on one machine), it meets
# by yielding the CPU in each polling pass that found nothing (`Loop.run_once`), and a process
# that keeps the CPU for whole slices at those yields (a CPU-bound client or job) by pausing the
# poll (`uring_loop.YIELD_LOST_S`).
BUSY_POLL_US_DEFAULT = 200

# "ring": appends are writev SQEs, like every other disk operation. "inline": appends are a
# pwritev on the loop itself; fsyncs and reads stay on the ring. ext4 (up to 6.18 at least) cannot
# do a buffered write without blocking, so the ring hands every append to an io-wq kernel thread:
# a context switch and a wake-up per write (bench/cores.py measures what each costs). "auto": the
# store writes gathered in a pass (as with "ring") go inline up to APPEND_INLINE_BYTES_MAX
# (native/constants.py, 1 MiB), on the ring above it: a write's hand-off costs more than its copy
# (one-record Kafka produce p50 through librdkafka, 2 CPUs: ring 160-200 us, inline 93 us; 64 KiB
# batch ingest: 8% more records/s at 8% less CPU per GB inline), while a very large one would hold
# the loop for the length of its copy.
APPEND_WRITES_DEFAULT = "auto"
APPEND_WRITES = ("auto", "ring", "inline")

# Where a group commit's fdatasync of a partition's active segment runs. "ring": an fsync SQE,
# which the kernel always hands to an io-wq thread of the worker's CPU (two context switches, and
# the loop reaps its completion in a later pass). "inline": the loop calls fdatasync itself and
# holds everything else meanwhile, as Redis's `appendfsync always` does. "auto": inline when the
# loop is otherwise idle (`Loop.quiet`: nothing reaped or ready, queued or on a kernel thread) and
# the last flush took no longer than SYNC_INLINE_NS_MAX, else on the ring. The cost is bounded by
# that: a request arriving during an inline sync waits for it, as one does behind any turn.
# While the loop busy-polls (`--busy-poll-us`), its fdatasync keeps the CPU busy too
# (`native.fdatasync_polled`): on a VM an idle vCPU halts, and the disk's completion then wakes
# it through the host, ~100 us here (worker timestamps: the sync 239-273 -> 166-182 us).
# Measured on the 2-vCPU VM, one-at-a-time acks=2 produce, alternated with Redis
# `always` in the same run: p50 ring 513-574 us, inline 478-520, Redis 455-487; broker CPU per
# request 360-401 -> 308-338 us. With the polled sync, another run: ring 450-545, inline 347-411,
# Redis 403-477, at about the ring's CPU per request (the poll instead of the halt). A bare
# pwrite + fdatasync: inline 183-213 us, ring 210-237. Syncs of other files (a rolled segment,
# a directory) always go to the ring.
FLUSH_SYNCS_DEFAULT = "auto"
FLUSH_SYNCS = ("auto", "ring", "inline")
# A flush this slow says the disk is busy or slow (this VM's fdatasync: p50 ~200 us, p99 under
# 800): holding the loop for the next would stall the core's other clients, so it goes to the
# ring until a flush is fast again.
SYNC_INLINE_NS_MAX = 1_000_000
# A slow flush whose sync ran on the loop keeps "auto" on the ring this long, however fast the
# ring's flushes are meanwhile: a fast flush on the ring says nothing of the next one on the loop.
# A transaction's chain of coordinator appends (a state record, markers, another state record:
# one flush each, back to back) met syncs on the loop of 4-5 ms (the loop's thread runnable, not
# running, for that long after the disk's flush, on the shared 2-vCPU VM) against 0.3 ms on the
# ring; taking the ring's fast flush as leave to return, every other flush paid it. A one-record
# transaction every 10 ms (bench/transactions.py, 2 runs alternated): commit_transaction() p50
# 13.4-13.7 -> 4.2-4.7 ms (uvloop 3.8), read_committed receipt 13.4-13.7 -> 4.3-4.8; plain
# produce unchanged (0.8-0.9).
SYNC_INLINE_RETRY_NS = 1_000_000_000

# How a fetch reply's records from the page cache (a mapped segment) reach the socket. "copy":
# sendmsg copies them from the mapping, as any buffer (on the loop without waiting, the rest
# through a sendmsg SQE). "splice": records of SPLICE_MIN_BYTES or more go by reference, vmsplice
# into a pooled pipe and splice to the socket, both on the loop without waiting; what finds no
# room waits in the pipe for a poll SQE. On the loopback of the 2-vCPU VM (1 MiB fetches of a warm
# partition, 6 rounds alternated) copy served 2.16-2.41 GB/s at 0.38-0.41 worker CPU-s per GB,
# splice 1.53-1.98 GB/s at 0.36-0.54 (docs/PERFORMANCE.md): the copy costs less than the splice's
# page references, pipe round trips and extra loop passes save, and the client copies either way.
# A NIC that takes the pages as they are is where splice should pay; not measured here.
FETCH_SENDS_DEFAULT = "copy"
FETCH_SENDS = ("copy", "splice")


@dataclass(frozen=True, slots=True)
class UringOptions:
    # 0 for a backend made in-process (tests, embedding: a poll would hold its thread's GIL);
    # `broker serve` passes `busy_poll_for`'s choice.
    busy_poll_us: int = 0
    append_writes: str = APPEND_WRITES_DEFAULT
    flush_syncs: str = FLUSH_SYNCS_DEFAULT
    fetch_sends: str = FETCH_SENDS_DEFAULT

    def __post_init__(self) -> None:
        if self.busy_poll_us < 0:
            raise ValueError(f"busy_poll_us must be >= 0, not {self.busy_poll_us}")
        _check_choice("append_writes", self.append_writes, APPEND_WRITES)
        _check_choice("flush_syncs", self.flush_syncs, FLUSH_SYNCS)
        _check_choice("fetch_sends", self.fetch_sends, FETCH_SENDS)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")


def busy_poll_for(requested: int | None, cores: int, cpus: int) -> int:
    """`--busy-poll-us` as given, or the default for `cores` workers on `cpus` CPUs."""
    if requested is not None:
        return requested
    return BUSY_POLL_US_DEFAULT if cores <= cpus else 0


class SyncPlacement:
    """Where the next flush's fdatasync runs (`--flush-syncs`, above): `inline(quiet)` decides,
    `took(ns, inline)` hears how long each flush took and where its sync ran, so that a slow disk
    sends "auto" back to the ring and a fast flush on the ring lets it come back, unless the slow
    one synced on the loop: then the ring keeps it for `SYNC_INLINE_RETRY_NS`."""

    __slots__ = ("clock_ns", "last_ns", "mode", "ring_until_ns")

    def __init__(
        self, mode: str = FLUSH_SYNCS_DEFAULT, clock_ns: Callable[[], int] = time.monotonic_ns
    ) -> None:
        _check_choice("flush_syncs", mode, FLUSH_SYNCS)
        self.mode = mode
        self.clock_ns = clock_ns
        self.last_ns = 0  # the last flush's duration, from its start to its completion
        self.ring_until_ns = 0  # no sync on the loop before this (`clock_ns`), after a slow one

    def inline(self, quiet: bool) -> bool:
        """Whether this flush's sync runs on the loop; `quiet`: nothing else waits for the loop."""
        if self.mode == "auto":
            return (
                quiet
                and self.last_ns <= SYNC_INLINE_NS_MAX
                and (not self.ring_until_ns or self.clock_ns() >= self.ring_until_ns)
            )
        return self.mode == "inline"

    def took(self, ns: int, inline: bool = False) -> None:
        """A flush took `ns`; `inline`: its sync ran on the loop."""
        self.last_ns = ns
        if inline and ns > SYNC_INLINE_NS_MAX:
            self.ring_until_ns = self.clock_ns() + SYNC_INLINE_RETRY_NS
