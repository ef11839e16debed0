"""Settings of the io_uring backend only (`broker serve --busy-poll-us`, `--append-writes`).

Apart from broker/backends/uring.py so that the command line, the supervisor and the worker can
name them without importing the backend (which needs the native bindings).
"""

from __future__ import annotations

from dataclasses import dataclass

# After a pass that completed something, the loop keeps polling the ring without sleeping for
# this long (`--busy-poll-us`), trading CPU for the wake-up of an idle CPU. On the 2-vCPU VM it is
# measured on (bench/perf.py, issue 13; broker on CPU 0, client on CPU 1), waking a halted vCPU
# costs ~40 us each way: a blocking Python echo across the CPUs has p50 81 us, against 21 us when
# the server spins. With 200 us of polling, one-at-a-time acks=1 produce p50 went 164 -> 124 us
# (raw frame) and 211 -> 179 us (AsyncProducer); a client on the worker's own CPU is not slowed
# (its wake-up preempts the poll: 68 vs 71 us). The poll pauses while a disk operation is in
# flight (`Loop.worker_op`): it held the CPU that the io-wq thread running the partition's
# fdatasync needed (durable p50 487 -> 700 us); with the pause, 441 us. It costs a CPU's worth of
# spinning only while requests keep coming less than this far apart, nothing when idle.
# The default applies when every core has a CPU of its own; oversubscribed workers (more cores
# than CPUs) would spin on each other's CPU, so there it is 0 (`busy_poll_for`).
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


@dataclass(frozen=True, slots=True)
class UringOptions:
    # 0 for a backend made in-process (tests, embedding: a poll would hold its thread's GIL);
    # `broker serve` passes `busy_poll_for`'s choice.
    busy_poll_us: int = 0
    append_writes: str = APPEND_WRITES_DEFAULT

    def __post_init__(self) -> None:
        if self.busy_poll_us < 0:
            raise ValueError(f"busy_poll_us must be >= 0, not {self.busy_poll_us}")
        if self.append_writes not in APPEND_WRITES:
            choices = ", ".join(APPEND_WRITES)
            raise ValueError(f"append_writes must be one of {choices}, not {self.append_writes!r}")


def busy_poll_for(requested: int | None, cores: int, cpus: int) -> int:
    """`--busy-poll-us` as given, or the default for `cores` workers on `cpus` CPUs."""
    if requested is not None:
        return requested
    return BUSY_POLL_US_DEFAULT if cores <= cpus else 0
