"""Settings of the io_uring backend only (`broker serve --busy-poll-us`, `--append-writes`).

Apart from broker/backends/uring.py so that the command line, the supervisor and the worker can
name them without importing the backend (which needs the native bindings).
"""

from __future__ import annotations

from dataclasses import dataclass

# After a pass that completed something, the loop can keep polling the ring without sleeping for
# this long (`--busy-poll-us`), trading CPU for the wake-up of an idle CPU. Off by default because
# on the machine it is measured on it loses more than it buys (bench/perf.py, issue 13): the
# spinning loop holds its CPU while the io-wq worker that runs the partition's fdatasync waits for
# that same CPU, so durable produce p50 went from 425 to 650-720 us with 200 us of polling; the
# vCPUs share host cores, so a spinning worker also slows the client on the other vCPU (acks=1
# p99 260-370 -> 430-550 us; with 150 us of client think time between requests, p50 86 -> 290 us);
# and back-to-back acks=1 p50 gained at most 10 us (148-150 vs 154-159 us through AsyncProducer).
# On dedicated cores with a busy client it may pay: measure with bench/perf.py --broker-args.
BUSY_POLL_US_DEFAULT = 0

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
    busy_poll_us: int = BUSY_POLL_US_DEFAULT
    append_writes: str = APPEND_WRITES_DEFAULT

    def __post_init__(self) -> None:
        if self.busy_poll_us < 0:
            raise ValueError(f"busy_poll_us must be >= 0, not {self.busy_poll_us}")
        if self.append_writes not in APPEND_WRITES:
            choices = ", ".join(APPEND_WRITES)
            raise ValueError(f"append_writes must be one of {choices}, not {self.append_writes!r}")
