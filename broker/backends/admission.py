"""Memory admission and the sweep: what a core's client connections may hold in flight, and
which of them it closes.

Rules this module keeps:
- Memory in flight is bounded per client connection and per core (docs/LIMITS.md, "Memory"). A
  connection's bytes in flight are what it sent that is not yet taken as a frame, plus for each
  request taken and unanswered its frame and what its reply may be (a fetch: its max_bytes, or
  the extent it reads if larger), plus its replies not yet sent. A request is taken (executed)
  only while its connection is below its budget and the core below its own; otherwise the
  connection is not read (TCP pushes back on the client) until memory is released. As in Kafka's
  memory pool, "below" is checked before a request is admitted, not with its size, so a budget
  is exceeded by at most one request and a request larger than a budget still runs; a
  connection that alone holds the core's memory is always served, so nothing waits forever.
  Connections from peer cores are not budgeted: what they carry was admitted on the core that
  forwarded it.
- Connection hygiene (defect 5 of issue 10): one sweep a second, not a timer per connection,
  closes client connections idle longer than --connection-idle-ms and those that started a frame
  more than --frame-timeout-ms ago; a core serves at most --max-connections-per-core clients.
  Every rejection and close is logged through `RateLimitedLog` (one line per reason per second,
  with the count of those suppressed).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from broker.core.limits import FETCH_MAX_BYTES_MAX
from ringlog_proto.frames import HEADER_SIZE, Frame
from ringlog_proto.messages import ApiKey, peek_fetch_max_bytes

if TYPE_CHECKING:
    from broker.backends.connection import ServedConnection

# What a request costs beyond its bytes: the Frame, Slot, outcome and closure objects (about 1 KiB
# in CPython). It is what bounds the number of small requests a connection may have unanswered.
REQUEST_OVERHEAD_BYTES = 1024
# Besides bytes, a connection with this many requests unanswered is not read (those it sent are
# still taken): not a memory bound (the budget is) but a CPU one. A deeper pipeline of small requests spreads
# their objects over more memory than the caches hold: 30k pipelined 100-byte produces cost the
# io_uring backend ~50% more CPU per request with no cap than with this one (measured).
REQUESTS_IN_FLIGHT_MAX = 1024
SWEEP_S = 1.0  # how often idle and stalled connections are looked for (shorter for short timeouts)
SWEEP_S_MIN = 0.05
# Once the core's memory in flight has fallen this far, and to half or less, from its peak since the
# last time (or buffers this large were let go otherwise), the sweep asks glibc to give free heap
# pages back (malloc_trim): requests and replies of up to several MiB are allocated on the heap
# (`tune_malloc`, broker/node/worker.py, keeps them off mmap for speed), where glibc returns only a free
# top of the heap past its trim threshold, never the free pages below a live block. Steady traffic
# does not trigger it (its memory in flight does not fall by half); the end of a burst does, at
# most once per TRIM_INTERVAL_S (a trim after a burst of 30k requests took 28 ms of the loop).
TRIM_AFTER_RELEASE_BYTES = 4 * 1024 * 1024
TRIM_INTERVAL_S = 5.0


def request_charge(frame: Frame) -> int:
    """Bytes a request is counted for until its reply is filled: its frame, its overhead and, for a
    fetch, the most its reply may carry (min(max_bytes, the broker's cap))."""
    charge = HEADER_SIZE + len(frame.body) + REQUEST_OVERHEAD_BYTES
    if frame.api_key == ApiKey.FETCH:
        max_bytes = peek_fetch_max_bytes(frame)
        if max_bytes is not None and max_bytes > 0:
            charge += min(max_bytes, FETCH_MAX_BYTES_MAX)
    return charge


class CoreMemory:
    """The bytes in flight over all client connections of one core, against its budget."""

    __slots__ = ("buffered", "freed", "limit", "peak", "trimmed_at", "used", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.buffered = 0  # the part of `used` received and not yet taken as requests (frames)
        self.peak = 0  # the highest `used` since the last malloc_trim
        self.freed = 0  # other buffers let go since then (the io_uring backend's recv buffers)
        self.trimmed_at = 0.0  # time.monotonic() of the last malloc_trim
        self.waiting: dict[ServedConnection, None] = {}  # connections not read for the core's sake, FIFO


_libc: ctypes.CDLL | None = None


def malloc_trim() -> None:
    """Give free heap memory back to the OS (glibc); a no-op elsewhere."""
    global _libc  # noqa: PLW0603 - loaded once
    try:
        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
