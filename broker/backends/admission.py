"""Memory admission and the sweep: what a core's client connections may hold in flight, and
which of them it closes.

Rules this module keeps:
- Memory in flight is bounded per client connection and per core (docs/LIMITS.md, "Memory"). A
  connection's bytes in flight are what it sent that is not yet taken as a frame, plus for each
  request taken and unanswered its frame, `REQUEST_OVERHEAD_BYTES` and what its reply may be
  (its adapter's `reply_reserve`, our fetch's max_bytes; or the extent it reads if larger), plus
  its replies not yet sent. A request is taken (executed)
  only while its connection is below its budget and the core below its own; otherwise the
  connection is not read (TCP pushes back on the client) until memory is released. As in Kafka's
  memory pool, "below" is checked before a request is admitted, not with its size, so a budget
  is exceeded by at most one request and a request larger than a budget still runs; a
  connection that alone holds the core's memory is always served, so nothing waits forever.
  Connections from peer cores are not budgeted: what they carry was admitted on the core that
  forwarded it.
- Connection hygiene: one sweep a second, not a timer per connection, closes client connections
  idle longer than --connection-idle-ms and those that started a frame more than
  --frame-timeout-ms ago; a core serves at most --max-connections-per-core clients.
  Every rejection and close is logged through `RateLimitedLog` (one line per reason per second,
  with the count of those suppressed).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from broker.backends.connection import closed_by_peer
from broker.core.limits import Limits

if TYPE_CHECKING:
    from broker.backends.connection import ServedConnection, Slot
    from broker.backends.rate_limited_log import RateLimitedLog

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


class Admission:
    """One core's memory admission and connection hygiene: what its client connections hold in
    flight against their budgets and the core's, how many it serves, and the sweep that closes
    idle and stalled ones. The core's `BackendCore` holds it; its loop thread alone uses it."""

    def __init__(
        self, limits: Limits, call_soon: Callable[[Callable[[], None]], None], limit_log: RateLimitedLog
    ) -> None:
        self.call_soon = call_soon  # the core's: a resume runs after this turn's callbacks
        self.limit_log = limit_log
        self.connection_budget = limits.connection_memory_bytes
        self.memory = CoreMemory(limits.core_memory_bytes)
        self.client_connections = 0
        self.max_client_connections = limits.max_connections_per_core
        self.idle_s = limits.connection_idle_ms / 1000
        self.frame_timeout_s = limits.frame_timeout_ms / 1000
        self.sweep_s = max(
            SWEEP_S_MIN, min([SWEEP_S, *(t / 4 for t in (self.idle_s, self.frame_timeout_s) if t > 0)])
        )
        self._kicks: dict[ServedConnection, None] = {}  # connections to resume after a release
        self._kick_scheduled = False

    # ------------------------------------------------------------------------- memory in flight

    def count(self, conn: ServedConnection, held: int, buffered: int) -> None:
        """Add to (or, negative, release from) `conn`'s bytes in flight and its core's."""
        if conn.closed or conn.from_peer:
            return
        budget = conn.budget
        budget.held += held
        budget.buffered += buffered
        memory = self.memory
        memory.used += held + buffered
        memory.buffered += buffered
        if memory.used > memory.peak:
            memory.peak = memory.used
        elif held + buffered < 0:
            self._released(conn)

    @staticmethod
    def replied(slot: Slot, reply_bytes: int) -> int:
        """`slot`'s reply is made: it is counted by its size from now on, not by its estimate.
        Returns the change, for the backend to pass to `queued` (one count per reply, not two)."""
        charge = REQUEST_OVERHEAD_BYTES + reply_bytes
        change = charge - slot.charge
        slot.charge = charge
        return change

    def queued(self, conn: ServedConnection, released: int, unsent: int, replied: int = 0) -> None:
        """Replies whose slots counted `released` bytes went to the transport, which now holds
        `unsent` bytes of this connection not yet sent (the backend knows; 0 once drained);
        `replied` is what `replied` returned for the reply that made them ready, if any."""
        budget = conn.budget
        self.count(conn, unsent - budget.queued - released + replied, 0)
        budget.queued = unsent

    def may_read(self, conn: ServedConnection) -> bool:
        """Whether `conn` may be read now. A connection with nothing in flight of its own reads
        on (a frame larger than its budget must arrive whole); one that alone holds the core's
        memory too. False for a budget marks it to be resumed when memory is released (at
        `REQUESTS_IN_FLIGHT_MAX` it reads again when its next reply goes out, as it does)."""
        if conn.from_peer:
            return True
        if len(conn.slots) >= REQUESTS_IN_FLIGHT_MAX:
            return False
        budget = conn.budget
        mine = budget.held + budget.buffered
        if budget.held and mine >= self.connection_budget:
            budget.gated = True
            return False
        return self._core_admits(conn, mine)

    def may_take(self, conn: ServedConnection) -> bool:
        budget = conn.budget
        if budget.held and budget.held >= self.connection_budget:
            budget.gated = True
            return False
        if self.memory.used < self.memory.limit:  # `_core_admits`' first case, without the call
            return True
        return self._core_admits(conn, budget.held + budget.buffered)

    def _core_admits(self, conn: ServedConnection, mine: int) -> bool:
        memory = self.memory
        if memory.used < memory.limit or memory.used <= mine:
            return True
        conn.budget.gated = True
        memory.waiting[conn] = None
        return False

    def _released(self, conn: ServedConnection) -> None:
        """Memory went back: resume `conn` if a budget stopped it, and the connections waiting for
        the core's budget if it is below again (after this turn's callbacks: never re-entrant)."""
        kick = conn.budget.gated
        if kick:
            self._kicks[conn] = None
        memory = self.memory
        if memory.waiting and memory.used < memory.limit:
            kick = True
        if kick and not self._kick_scheduled:
            self._kick_scheduled = True
            self.call_soon(self._resume_gated)

    def _resume_gated(self) -> None:
        self._kick_scheduled = False
        kicks, self._kicks = self._kicks, {}
        memory = self.memory
        waiting = memory.waiting
        while waiting and memory.used < memory.limit:
            conn = next(iter(waiting))
            del waiting[conn]
            kicks[conn] = None
        for conn in kicks:
            if conn.closed or conn in waiting:
                continue
            conn.budget.gated = False
            conn.resume()

    # ------------------------------------------------------------------------- connections

    def admit_connection(self, conn: ServedConnection) -> bool:
        """Count a new connection against the per-core cap; False: close it at once (logged)."""
        if conn.from_peer:
            return True
        cap = self.max_client_connections
        if cap and self.client_connections >= cap:
            self.limit_log.warning(
                "connection refused",
                "%s: this core serves %d client connections already (--max-connections-per-core)",
                conn.peer,
                cap,
            )
            return False
        self.client_connections += 1
        conn.budget.counted = True
        return True

    def forget(self, conn: ServedConnection) -> None:
        """`conn` is closed: its memory in flight is released and it no longer counts."""
        budget = conn.budget
        if budget.counted:
            budget.counted = False
            self.client_connections -= 1
        memory = self.memory
        memory.waiting.pop(conn, None)
        self._kicks.pop(conn, None)
        released = budget.held + budget.buffered
        memory.buffered -= budget.buffered
        budget.held = budget.buffered = budget.queued = 0
        if released:
            memory.used -= released
            if memory.waiting and memory.used < memory.limit and not self._kick_scheduled:
                self._kick_scheduled = True
                self.call_soon(self._resume_gated)

    def _frame_timed_out(self, conn: ServedConnection, now: float) -> None:
        self.limit_log.warning(
            "partial frame timeout",
            "closing %s: a frame started %.1fs ago is still incomplete (%d bytes; --frame-timeout-ms)",
            conn.peer,
            now - conn.budget.frame_started,
            conn.decoder.buffered,
        )
        conn.drop()

    def sweep(self, connections: Iterable[ServedConnection]) -> None:
        """Once a `sweep_s`: close idle and stalled client connections and those not read whose
        client went away, log the suppressed counts, give freed memory back to the OS."""
        now = time.monotonic()
        idle_s = self.idle_s
        frame_s = self.frame_timeout_s
        memory = self.memory
        waiting = memory.waiting
        # Bytes received and not taken that alone reach the core's budget: no request can be
        # taken, and no frame completed, until some of them go, and only a close lets them go
        # (33 connections stalled in 8 MiB frames wedged a core for good). The frame
        # clock of a connection waiting for the core then runs on, as it does for one read, and
        # those past the frame timeout are closed oldest first (an attacker's, who started
        # first), only until the rest fit the budget: a client whose request arrived whole
        # after them, and waits to be taken, is then served, not closed with them.
        frames_hold_core = memory.buffered >= memory.limit
        holding: list[ServedConnection] = []
        for conn in list(connections):
            if conn.from_peer or conn.closed:
                continue
            budget = conn.budget
            if (conn in waiting or budget.gated) and closed_by_peer(conn.fileno()):
                # Not read, so its EOF or reset would never be seen: what it holds would stay
                # until a timeout, with the core out of budget meanwhile. Its requests not yet
                # read have no one to answer to (a connection read would close at that EOF too).
                self.limit_log.warning(
                    "closed while not read", "closing %s: its client closed the connection", conn.peer
                )
                conn.drop()
                continue
            if (conn in waiting and not budget.queued) or conn.waits_for_forward():
                # Not read for others' sake: neither idle nor stalled by its client. (One whose
                # replies wait for its client to read them is idle all the same: the core's memory
                # it holds is released when the idle timeout closes it.)
                budget.last_active = now
                if budget.frame_started:
                    if frames_hold_core and conn in waiting:
                        holding.append(conn)  # decided below, oldest first
                        continue
                    budget.frame_started = now
            elif budget.gated and budget.frame_started:
                budget.frame_started = now  # not read while its own replies wait for its client
            if frame_s and budget.frame_started and now - budget.frame_started > frame_s:
                self._frame_timed_out(conn, now)
            elif idle_s and not conn.slots and now - budget.last_active > idle_s:
                self.limit_log.warning(
                    "idle timeout",
                    "closing %s: no traffic for %.1fs (--connection-idle-ms)",
                    conn.peer,
                    now - budget.last_active,
                )
                conn.drop()
        if frame_s and holding:
            holding.sort(key=lambda c: c.budget.frame_started)
            buffered = memory.buffered
            for conn in holding:
                if buffered < memory.limit or now - conn.budget.frame_started <= frame_s:
                    break
                buffered -= conn.budget.buffered
                self._frame_timed_out(conn, now)
        self.limit_log.flush()
        fallen = memory.peak - memory.used
        if (
            (fallen >= TRIM_AFTER_RELEASE_BYTES and memory.used <= fallen)
            or memory.freed >= TRIM_AFTER_RELEASE_BYTES
        ) and now - memory.trimmed_at >= TRIM_INTERVAL_S:
            memory.peak = memory.used
            memory.freed = 0
            memory.trimmed_at = now
            malloc_trim()
