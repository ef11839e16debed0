"""What both I/O backends do alike: dispatch an outcome, park a long poll, keep a reply's slot.

Rules this module keeps:
- The two backends (broker/backends/aio.py on uvloop, broker/backends/uring.py on io_uring) differ in how
  they move bytes and run file operations, not in what an outcome means. That meaning lives here
  once: `BackendCore.carry_out` sends each outcome to the backend's own `_append`, `_read` and
  `_after_flush`, or handles it without I/O of its own (replies, forwards, long polls).
- A connection answers in request order: every request gets a `Slot` when it arrives, and a
  connection sends the replies at the head of its slots that are done (`ReplyTarget.fill`).
- A parked fetch re-runs its handler when its partition grows, keeping its first deadline; at
  shutdown (`stopping()`) it answers with what there is instead of parking again.
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

import contextlib
import ctypes
import logging
import time
from collections.abc import Callable, Iterable, MutableSequence
from typing import Protocol

from broker.core.config import BrokerConfig
from broker.core.forwarding import Forwarder
from broker.core.handlers import Handlers
from broker.core.limits import FETCH_MAX_BYTES_MAX
from broker.core.outcomes import Append, Durable, Forward, Notify, Outcome, Read, Reply, Silent, Wait
from broker.core.partition import Partition
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import HEADER_SIZE, NEED_DATA, Frame, FrameDecoder
from ringlog_proto.messages import peek_fetch_max_bytes

log = logging.getLogger(__name__)

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
# (`tune_malloc` below keeps them off mmap for speed), where glibc returns only a free
# top of the heap past its trim threshold, never the free pages below a live block. Steady traffic
# does not trigger it (its memory in flight does not fall by half); the end of a burst does, at
# most once per TRIM_INTERVAL_S (a trim after a burst of 30k requests took 28 ms of the loop).
TRIM_AFTER_RELEASE_BYTES = 4 * 1024 * 1024
TRIM_INTERVAL_S = 5.0


def request_charge(frame: Frame) -> int:
    """Bytes a request is counted for until its reply is filled: its frame, its overhead and, for a
    fetch, the most its reply may carry (min(max_bytes, the broker's cap))."""
    charge = HEADER_SIZE + len(frame.body) + REQUEST_OVERHEAD_BYTES
    max_bytes = peek_fetch_max_bytes(frame)
    if max_bytes is not None and max_bytes > 0:
        charge += min(max_bytes, FETCH_MAX_BYTES_MAX)
    return charge


class RateLimitedLog:
    """Warnings about connections, at most one line per reason per interval.

    A flood of connections (thousands stalled, or beyond the cap) must not become a flood of log
    lines: the first event of a reason in an interval is logged, the others are counted, and the
    count is given with the next line of that reason (or by `flush`, from the sweep).
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 1.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, reason: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval_s:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last[reason] = now
        suppressed = self._suppressed.pop(reason, 0)
        if suppressed and last is not None:
            self.logger.warning(
                "%s: " + msg + " (and %d more suppressed in the last %.1fs)",
                reason,
                *args,
                suppressed,
                now - last,
            )
        else:
            self.logger.warning("%s: " + msg, reason, *args)

    def flush(self) -> None:
        """Report the counts of reasons that had no line for a whole interval."""
        now = time.monotonic()
        for reason, count in list(self._suppressed.items()):
            last = self._last.get(reason, now)
            if now - last >= self.interval_s:
                del self._suppressed[reason]
                self._last[reason] = now
                self.logger.warning("%s: %d more suppressed in the last %.1fs", reason, count, now - last)


class CoreMemory:
    """The bytes in flight over all client connections of one core, against its budget."""

    __slots__ = ("freed", "limit", "peak", "trimmed_at", "used", "waiting")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0  # the highest `used` since the last malloc_trim
        self.freed = 0  # other buffers let go since then (the io_uring backend's recv buffers)
        self.trimmed_at = 0.0  # time.monotonic() of the last malloc_trim
        self.waiting: dict[ReplyTarget, None] = {}  # connections not read for the core's sake, FIFO


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


# glibc malloc: request bodies of up to a frame (8 MiB) come and go with every produce. By default
# glibc serves blocks over 128 KiB with mmap and trims the heap top past 128 KiB, so each large
# request costs page faults and brk calls (measured: a fresh broker ingests 1 KiB records at about
# a third of the rate it reaches once glibc has raised its thresholds by itself). Fixing them from
# the start keeps those pages in the heap for reuse.
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MALLOC_MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024  # above the largest frame: frames stay on the heap
MALLOC_TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024  # free memory kept before returning it to the OS
MALLOC_TOP_PAD_BYTES = 16 * 1024 * 1024


def tune_malloc() -> bool:
    """Set glibc's malloc thresholds (see above). False where there is no glibc (musl, macOS)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = all(
            libc.mallopt(param, value) == 1
            for param, value in (
                (M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES),
                (M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES),
                (M_TOP_PAD, MALLOC_TOP_PAD_BYTES),
            )
        )
    except (OSError, AttributeError):
        return False
    return ok


class Slot:
    """A request's place in its connection's reply order."""

    __slots__ = ("buffers", "charge", "done", "started_ns")

    def __init__(self, started_ns: int, charge: int = 0) -> None:
        self.buffers: list[bytes] = []
        self.done = False
        self.started_ns = started_ns  # for the latency histogram (metrics.reply)
        self.charge = charge  # bytes counted in flight for this request (see `request_charge`)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class ReplyTarget(Protocol):
    """A backend's client connection, as far as requests and outcomes are concerned."""

    closed: bool
    from_peer: bool
    peer: str
    decoder: FrameDecoder  # the bytes received and not yet taken as frames
    slots: MutableSequence[Slot]  # the requests not yet answered, in arrival order
    budget: ConnectionBudget

    def fill(self, slot: Slot, outcome: Reply | Silent) -> None: ...
    def wait_for_forward_room(self, forwarder: Forwarder, core: int) -> None: ...
    def resume(self) -> None:
        """Take the frames buffered (`take_requests`) and read again if the budgets allow."""

    def drop(self) -> None:
        """Close at once (a limit was hit): nothing more is read or sent."""

    def waits_for_forward(self) -> bool: ...


class ConnectionBudget:
    """What the shared code keeps per connection: its bytes in flight and its activity times."""

    __slots__ = ("buffered", "counted", "frame_started", "gated", "held", "last_active", "queued")

    def __init__(self, now: float) -> None:
        self.held = 0  # charges of the requests taken and unanswered + `queued`
        self.queued = 0  # reply bytes handed to the transport and not yet sent
        self.buffered = 0  # decoder bytes counted (received, not yet taken as frames)
        self.counted = False  # a client connection admitted under the cap (uncounted at close)
        self.gated = False  # stopped taking or reading for a budget: resume when memory is released
        self.last_active = now  # last time bytes moved either way (time.monotonic())
        self.frame_started = 0.0  # when the partial frame in the decoder began, 0.0 if none


class BackendCore:
    """The outcome-handling half of a backend. Subclasses provide the I/O."""

    handlers: Handlers
    forwarder: Forwarder

    def __init__(self, config: BrokerConfig) -> None:
        self.parked_long_polls = 0
        limits = config.limits
        self.connection_budget = limits.connection_memory_bytes
        self.memory = CoreMemory(limits.core_memory_bytes)
        self.client_connections = 0
        self.max_client_connections = limits.max_connections_per_core
        self.idle_s = limits.connection_idle_ms / 1000
        self.frame_timeout_s = limits.frame_timeout_ms / 1000
        self.sweep_s = max(
            SWEEP_S_MIN, min([SWEEP_S, *(t / 4 for t in (self.idle_s, self.frame_timeout_s) if t > 0)])
        )
        self.limit_log = RateLimitedLog(log)
        self._kicks: dict[ReplyTarget, None] = {}  # connections to resume after a release
        self._kick_scheduled = False

    # ------------------------------------------------------------------------- the backend's part

    def _append(self, outcome: Append, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        raise NotImplementedError

    def _read(self, outcome: Read, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        raise NotImplementedError

    def _after_flush(
        self, partition: Partition, done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        raise NotImplementedError

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Cancellable:
        raise NotImplementedError

    def stopping(self) -> bool:
        raise NotImplementedError

    def call_soon(self, callback: Callable[[], None]) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------------- shared

    def take_requests(self, conn: ReplyTarget) -> None:
        """Handle the whole frames `conn`'s decoder holds, in order, each with its reply slot, as
        long as the memory budgets allow (see the module rules); the rest wait in the decoder.

        Raises `ProtocolError` when the bytes cannot be framed: the backend closes `conn`.
        """
        handlers = self.handlers
        handle = handlers.handle
        metrics = handlers.metrics
        from_peer = conn.from_peer
        decoder = conn.decoder
        slots = conn.slots
        budget = conn.budget
        took = False
        if not from_peer:
            self._count(conn, 0, decoder.buffered - budget.buffered)
        try:
            while not conn.closed:
                if not from_peer and not self._may_take(conn):
                    break
                frame = decoder.next_frame()
                if frame is NEED_DATA:
                    break
                assert isinstance(frame, Frame)
                took = True
                size = len(frame.body) + HEADER_SIZE
                if from_peer:
                    slot = Slot(metrics.request(frame.api_key, size))
                    metrics.forwarded_in()
                else:
                    slot = Slot(metrics.request(frame.api_key, size), request_charge(frame))
                    self._count(conn, slot.charge, -size)
                slots.append(slot)
                self.carry_out(handle(frame, from_peer), frame, conn, slot)
        finally:
            if not from_peer and not conn.closed:
                self._count(conn, 0, decoder.buffered - budget.buffered)
                if not decoder.buffered:
                    budget.frame_started = 0.0
                elif took or not budget.frame_started:
                    budget.frame_started = time.monotonic()

    def carry_out(self, outcome: Outcome, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        if isinstance(outcome, Reply | Silent):
            conn.fill(slot, outcome)
        elif isinstance(outcome, Append):
            self._append(outcome, frame, conn, slot)
        elif isinstance(outcome, Read):
            # The extent is at least one whole batch, which may be more than the fetch's max_bytes:
            # counted before the buffer for it is allocated.
            more = outcome.extent.length + REQUEST_OVERHEAD_BYTES - slot.charge
            if more > 0 and not conn.from_peer:
                slot.charge += more
                self._count(conn, more, 0)
            self._read(outcome, frame, conn, slot)
        elif isinstance(outcome, Durable):
            self._after_flush(
                outcome.partition,
                lambda: conn.fill(slot, outcome.reply),
                lambda exc: conn.fill(slot, outcome.fail(exc)),
            )
        elif isinstance(outcome, Forward):
            self.forwarder.forward(outcome, lambda reply: conn.fill(slot, reply))
            if self.forwarder.blocked(outcome.core):
                conn.wait_for_forward_room(self.forwarder, outcome.core)
        elif isinstance(outcome, Notify):
            self.forwarder.notify(outcome, lambda reply: conn.fill(slot, reply))
        else:
            self._park(outcome, conn, slot, outcome.deadline_ms)

    def _park(self, outcome: Wait, conn: ReplyTarget, slot: Slot, deadline_ms: int) -> None:
        """Park a fetch until its partition grows or its deadline passes."""
        partition = outcome.partition
        timer: Cancellable | None = None

        def wake() -> None:
            if timer is not None:
                timer.cancel()
            self.parked_long_polls -= 1
            if conn.closed:
                return
            again = self.handlers.handle(outcome.frame, conn.from_peer)
            if isinstance(again, Wait) and not self.stopping():
                self._park(again, conn, slot, deadline_ms)  # spurious: keep the first deadline
            elif isinstance(again, Wait):
                conn.fill(slot, again.on_timeout())
            else:
                self.carry_out(again, outcome.frame, conn, slot)

        def timeout() -> None:
            self.parked_long_polls -= 1
            with contextlib.suppress(ValueError):
                partition.waiters.remove(wake)
            if not conn.closed:
                conn.fill(slot, outcome.on_timeout())

        timer = self.call_later(max(0.0, (deadline_ms - now_ms()) / 1000), timeout)
        self.parked_long_polls += 1
        partition.waiters.append(wake)

    # ------------------------------------------------------------------------- memory in flight

    def _count(self, conn: ReplyTarget, held: int, buffered: int) -> None:
        """Add to (or, negative, release from) `conn`'s bytes in flight and its core's."""
        if conn.closed or conn.from_peer:
            return
        budget = conn.budget
        budget.held += held
        budget.buffered += buffered
        memory = self.memory
        memory.used += held + buffered
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

    def queued(self, conn: ReplyTarget, released: int, unsent: int, replied: int = 0) -> None:
        """Replies whose slots counted `released` bytes went to the transport, which now holds
        `unsent` bytes of this connection not yet sent (the backend knows; 0 once drained);
        `replied` is what `replied` returned for the reply that made them ready, if any."""
        budget = conn.budget
        self._count(conn, unsent - budget.queued - released + replied, 0)
        budget.queued = unsent

    def may_read(self, conn: ReplyTarget) -> bool:
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

    def _may_take(self, conn: ReplyTarget) -> bool:
        budget = conn.budget
        if budget.held and budget.held >= self.connection_budget:
            budget.gated = True
            return False
        return self._core_admits(conn, budget.held + budget.buffered)

    def _core_admits(self, conn: ReplyTarget, mine: int) -> bool:
        memory = self.memory
        if memory.used < memory.limit or memory.used <= mine:
            return True
        conn.budget.gated = True
        memory.waiting[conn] = None
        return False

    def _released(self, conn: ReplyTarget) -> None:
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

    def admit_connection(self, conn: ReplyTarget) -> bool:
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

    def forget(self, conn: ReplyTarget) -> None:
        """`conn` is closed: its memory in flight is released and it no longer counts."""
        budget = conn.budget
        if budget.counted:
            budget.counted = False
            self.client_connections -= 1
        memory = self.memory
        memory.waiting.pop(conn, None)
        self._kicks.pop(conn, None)
        released = budget.held + budget.buffered
        budget.held = budget.buffered = budget.queued = 0
        if released:
            memory.used -= released
            if memory.waiting and memory.used < memory.limit and not self._kick_scheduled:
                self._kick_scheduled = True
                self.call_soon(self._resume_gated)

    def sweep(self, connections: Iterable[ReplyTarget]) -> None:
        """Once a `sweep_s`: close idle and stalled client connections, log the suppressed
        counts, give freed memory back to the OS."""
        now = time.monotonic()
        idle_s = self.idle_s
        frame_s = self.frame_timeout_s
        waiting = self.memory.waiting
        for conn in list(connections):
            if conn.from_peer or conn.closed:
                continue
            budget = conn.budget
            if (conn in waiting and not budget.queued) or conn.waits_for_forward():
                # Not read for others' sake: neither idle nor stalled by its client. (One whose
                # replies wait for its client to read them is idle all the same: the core's memory
                # it holds is released when the idle timeout closes it.)
                budget.last_active = now
                if budget.frame_started:
                    budget.frame_started = now
            elif budget.gated and budget.frame_started:
                budget.frame_started = now  # not read while its own replies wait for its client
            if frame_s and budget.frame_started and now - budget.frame_started > frame_s:
                self.limit_log.warning(
                    "partial frame timeout",
                    "closing %s: a frame started %.1fs ago is still incomplete (%d bytes; "
                    "--frame-timeout-ms)",
                    conn.peer,
                    now - budget.frame_started,
                    conn.decoder.buffered,
                )
                conn.drop()
            elif idle_s and not conn.slots and now - budget.last_active > idle_s:
                self.limit_log.warning(
                    "idle timeout",
                    "closing %s: no traffic for %.1fs (--connection-idle-ms)",
                    conn.peer,
                    now - budget.last_active,
                )
                conn.drop()
        self.limit_log.flush()
        memory = self.memory
        fallen = memory.peak - memory.used
        if (
            (fallen >= TRIM_AFTER_RELEASE_BYTES and memory.used <= fallen)
            or memory.freed >= TRIM_AFTER_RELEASE_BYTES
        ) and now - memory.trimmed_at >= TRIM_INTERVAL_S:
            memory.peak = memory.used
            memory.freed = 0
            memory.trimmed_at = now
            malloc_trim()
