"""The backend core: everything about serving but how bytes move.

Rules this module keeps:
- The two backends (broker/backends/aio.py on uvloop, broker/backends/uring.py on io_uring) differ
  in how they move bytes and run storage operations, not in what anything means. The meaning
  lives here once, in `BackendCore`: the gauges, the dispatch of outcomes, parked long polls,
  appends completed in prepare order and group commit (appends.py), the periodic work
  (retention, housekeeping, the sweep) and the shutdown sequence. `ServedConnection` is the
  request side of a connection (ordered replies), `PeerStream` this core's end of an inter-core
  link (both broker/backends/connection.py); a backend subclasses them and supplies only
  primitives. The limits and budgets (what a connection may hold in flight, back-pressure, and
  which connections the sweep closes) are the `Admission` the core holds (admission.py).
- The protocols come in as adapters (broker/core/adapter.py), made over the core by the worker
  (`BrokerConfig.make_adapters`): a client connection's first bytes pick one (connection.py's
  `FirstBytes`), which decodes, counts and handles its requests; another core's requests are ours,
  handled by `internal`. Nothing here names a protocol: the backends import neither.
- The backend contract: what a backend provides is broker/backends/primitives.py's
  (`BackendPrimitives`, which `BackendCore` extends), with what it calls on the core and when.
- Dispatch is an exhaustive `match` over `Outcome` (broker/core/outcomes.py): an outcome without a
  case is a bug and raises, it is never taken for a parked fetch.
- A parked fetch re-runs its handler when one of its partitions grows (it is parked on each and
  taken off all once woken or timed out), keeping its first deadline; at shutdown (`stopping()`)
  it answers with what there is instead of parking again.
- Appends and group commit are broker/backends/appends.py's (`PartitionAppends`, which
  `BackendCore` extends): `carry_out` hands them each `Append` and `Durable`.
- A `Later` outcome hands the core a callback that fills the request's slot once (a JoinGroup
  answered when its group's join phase ends); an answer for a closed connection only frees it.
- Blocking calls: `run_blocking(fn, done)`, handed to the core as `Core.run_blocking`, runs
  `fn` on the worker's pool of daemon threads (broker/backends/blocking.py, made on first use) and
  `done(result or exception)` on the loop thread in a later turn, through the backend's
  `threadsafe_post`, in the order the calls finished. Shutdown does not wait for them: each still
  in flight gets `done(BlockingCallAbandoned())` at its start (broker/core/blocking.py).
- Shutdown, the same for both backends: stop accepting; answer parked fetches and waiting group
  joins and syncs at once, abandon blocking calls in flight; wait (at
  most `SHUTDOWN_GRACE_S`) until no request is unanswered, no reply unsent and no append, flush or
  read in flight; flush what is due; fail pending forwards; close connections and peer links; let
  the backend's last operations complete; close the partitions; publish the final metrics.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, assert_never

from broker.backends.admission import REQUEST_OVERHEAD_BYTES, Admission
from broker.backends.appends import PartitionAppends
from broker.backends.blocking import BlockingPool
from broker.backends.connection import FirstBytes, GatherPart, ServedConnection, Slot, peer_uid
from broker.backends.primitives import Cancellable
from broker.backends.rate_limited_log import RateLimitedLog
from broker.core.adapter import Adapters, InternalAdapter, MakeAdapters
from broker.core.blocking import BlockingCallAbandoned
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.forwarding import Forwarder, PeerPool
from broker.core.metrics import publish
from broker.core.outcomes import (
    Append,
    Durable,
    Forward,
    Gather,
    Later,
    Notify,
    Opening,
    Outcome,
    Read,
    Reply,
    Silent,
    Wait,
)
from broker.core.remote import RemoteLinks
from broker.core.replica_manager import ReplicaManager
from broker.core.txn_markers import PeerMarkerLinks
from broker.core.txn_sweep import HangSweep, PeerHoldLinks
from broker.security.tls import peer_context, server_context
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import NEED_DATA, Buffer, ProtocolError
from ringlog_proto.sasl import SaslLogin

log = logging.getLogger(__name__)

T = TypeVar("T")

# how often segments past their topic's retention, and producers idle past their expiration, are
# looked for (more often when the expiration is shorter: `retention_check_s`)
RETENTION_CHECK_S = 30.0
HOUSEKEEPING_S = 1.0  # metrics snapshot published, topics.json checked for other cores' changes
SHUTDOWN_GRACE_S = 10.0  # longest wait for in-flight requests and operations at shutdown
SHUTDOWN_POLL_S = 0.01  # the loop runs at most this long between looks at what is still in flight
SHUTDOWN_SETTLE_POLLS = 100  # after closing: waits for the backend's last operations (cancels, closes)


def retention_check_s(producer_id_expiration_ms: int) -> float:
    """The retention pass's period: `RETENTION_CHECK_S`, or the producer id expiration where that
    is shorter (a second at least), so an idle producer is forgotten within about twice it."""
    return max(1.0, min(RETENTION_CHECK_S, producer_id_expiration_ms / 1000))


def _retention_done(deleted: int) -> None:
    if deleted:
        log.info("retention deleted %d segment(s)", deleted)


class BackendCore(PartitionAppends):
    """One core's serving, whatever moves its bytes. A backend subclasses it, calls `open_core`
    once its loop primitives work, and provides the primitives (`BackendPrimitives`)."""

    core: Core
    adapters: Adapters  # the protocols served, made by the worker (`BrokerConfig.make_adapters`)
    internal: InternalAdapter  # ours, which is also the inter-core one (forwards, notices)
    forwarder: Forwarder
    peers: PeerPool
    remote_links: RemoteLinks

    def __init__(self, config: BrokerConfig) -> None:
        super().__init__()
        self.config = config
        # TLS on the client listeners (broker/security/tls.py): asyncio's for uvloop, a
        # `TlsSession` per connection for io_uring
        self.tls_context = server_context(config.tls) if config.tls.enabled else None
        # ... and the client side of this node's links to its peers, which share its settings
        clustered_tls = config.tls.enabled and config.cluster is not None
        self.peer_tls_context = peer_context(config.tls) if clustered_tls else None
        self.parked_long_polls = 0
        self.limit_log = RateLimitedLog(log)
        self.admission = Admission(config.limits, self.call_soon, self.limit_log)
        self.connections: set[ServedConnection] = set()
        self.reads_in_flight = 0
        self._stop_requested = False
        self._blocking: BlockingPool | None = None  # made by the first `run_blocking`
        self._blocking_calls: dict[int, Callable[[Any], None]] = {}  # in flight: their `done`
        self._blocking_ids = itertools.count()

    def _peer_login(self) -> Callable[[], SaslLogin] | None:
        """How this node's links log in to its peers' cores: as the inter-broker user, where
        SASL is on (the peers share this node's settings)."""
        sasl = self.config.sasl
        login = sasl.inter_broker
        mechanism = sasl.peer_mechanism(tls=self.peer_tls_context is not None)
        if login is None or mechanism is None:
            return None
        return lambda: SaslLogin(mechanism, login.user, login.password)

    def open_core(self) -> None:
        """Open this core (`Core`), the adapters of the protocols it serves (the worker's
        `make_adapters`) and its forwarding; publish its gauges."""
        config = self.config
        make_adapters: MakeAdapters | None = config.make_adapters
        if make_adapters is None:
            raise ValueError("no protocols to serve: BrokerConfig.make_adapters is not set")
        self.core = Core(
            config, call_later=self.call_later, run_blocking=self.run_blocking, call_soon=self.call_soon
        )
        self.adapters = make_adapters(self.core)
        self.internal = self.adapters.internal
        self.peers = PeerPool.for_config(config, self.open_peer, self.stopping, self.call_later)
        self.forwarder = Forwarder(self.internal, self.peers.send_to_core, self.call_later)
        self.remote_links = RemoteLinks(
            self.open_remote, self.call_later, self.stopping, login=self._peer_login()
        )
        self.core.remote_links = self.remote_links
        self.core.transactions.own_append = self.run_own_append
        self.core.transactions.markers.links = PeerMarkerLinks(self.peers.send_to_core)
        self.hang_sweep = HangSweep(self.core, self.run_own_append, PeerHoldLinks(self.peers.send_to_core))
        self.replicas: ReplicaManager | None = None
        if config.cluster is not None:  # a node of a cluster: roles, follower fetches, ISR changes
            c = config.cluster
            self.replicas = ReplicaManager(
                self.core,
                self,
                c.calls.alter_isr,
                c.min_insync,
                c.replica_lag_max_ms,
                c.replica_fetch_wait_ms,
            )  # started with the periodic work, once the loop runs (`started`)
        self.core.gauges = {
            "inflight_requests": lambda: sum(len(c.slots) for c in self.connections if not c.from_peer),
            "pending_forwards": lambda: self.forwarder.pending,
            "parked_long_polls": lambda: self.parked_long_polls,
            "commit_waiters": lambda: sum(len(w.flush_waiters) for w in self._work.values()),
            "client_connections": lambda: self.admission.client_connections,
            "bytes_in_flight": lambda: self.admission.memory.used,
        }

    # ------------------------------------------------------------------------- requests and outcomes

    def take_requests(self, conn: ServedConnection) -> None:
        """Handle the whole requests `conn`'s decoder holds, in order, each with its reply slot, as
        long as the memory budgets allow (admission.py's rules); the rest wait in the decoder. A
        client's first bytes pick the adapter that serves it (`FirstBytes`); another core's
        requests are ours (`internal`), trusted and counted as forwarded in.

        Raises `ProtocolError` when the bytes cannot be framed, or the adapter refuses a request
        it cannot answer: the backend closes `conn`.
        """
        admission = self.admission
        metrics = self.core.metrics
        from_peer = conn.from_peer
        adapter = conn.adapter
        decoder = conn.decoder
        if adapter is None and isinstance(decoder, FirstBytes):
            adapter = decoder.decide()
            if adapter is not None:
                conn.adapter = adapter
                decoder = conn.decoder = decoder.hand_over(adapter, conn.auth)
        internal = self.internal
        slots = conn.slots
        budget = conn.budget
        auth = conn.auth
        took = False
        buffered = decoder.buffered
        if not from_peer:
            admission.count(conn, 0, buffered - budget.buffered)
        try:
            while not conn.closed and not conn.refusing and not conn.opening:
                if not from_peer and not admission.may_take(conn):
                    break
                request: Any = decoder.next_frame()  # the adapter's to read; here only its api key
                if request is NEED_DATA:
                    break
                assert adapter is not None  # the first bytes' stand-in has no requests
                took = True
                # its bytes on the wire: what the decoder let go of (nothing feeds it meanwhile)
                size = buffered
                buffered = decoder.buffered
                size -= buffered
                if from_peer:
                    slot = Slot(adapter.count_request(request.api_key, size))
                    metrics.forwarded_in()
                    slots.append(slot)
                    self.carry_out(internal.handle(request, None, True), request, conn, slot)
                    continue
                # counted first (the latency runs from here), then handled: a request the adapter
                # refuses by raising has no slot
                started_ns = adapter.count_request(request.api_key, size)
                outcome = adapter.handle(request, auth)
                slot = Slot(started_ns, size + REQUEST_OVERHEAD_BYTES + adapter.reply_reserve(request))
                admission.count(conn, slot.charge, -size)
                slots.append(slot)
                self.carry_out(outcome, request, conn, slot)
        finally:
            if not from_peer and not conn.closed:
                admission.count(conn, 0, decoder.buffered - budget.buffered)
                if not decoder.buffered:
                    budget.frame_started = 0.0
                elif took or not budget.frame_started:
                    budget.frame_started = time.monotonic()

    def carry_out(self, outcome: Outcome, request: object, conn: ServedConnection, slot: Slot) -> None:
        """Do what `outcome` says for `request`, whose place is `slot`. Every member of `Outcome`
        has its case; anything else is a bug and raises."""
        match outcome:
            case Reply() | Silent():
                conn.fill(slot, outcome)
            case Append():
                self._append(outcome, lambda reply: conn.fill(slot, reply), conn)
            case Read():
                # The extent is at least one whole batch, which may be more than the fetch's
                # max_bytes: counted before the buffer for it is allocated.
                more = outcome.extent.length + REQUEST_OVERHEAD_BYTES - slot.charge
                if more > 0 and not conn.from_peer:
                    slot.charge += more
                    self.admission.count(conn, more, 0)
                self._read(outcome, request, conn, slot)
            case Durable():
                self.after_flush(
                    outcome.partition,
                    lambda: conn.fill(slot, outcome.reply),
                    lambda exc: conn.fill(slot, outcome.fail(exc)),
                )
            case Wait():
                self._park(outcome, conn, slot, outcome.deadline_ms, request)
            case Forward():
                self.forwarder.forward(outcome, lambda reply: conn.fill(slot, reply))
                if self.forwarder.blocked(outcome.core):
                    conn.wait_for_forward_room(self.forwarder, outcome.core)
            case Notify():
                self.forwarder.notify(outcome, lambda reply: conn.fill(slot, reply))
            case Gather():
                self._gather(outcome, request, conn, slot)
            case Later():
                self._later(outcome, conn, slot)
            case Opening():
                self._opening(outcome, request, conn, slot)
            case _:
                assert_never(outcome)

    @staticmethod
    def _later(outcome: Later, conn: ServedConnection, slot: Slot) -> None:
        """Hand the deciding code its one answer callback (a second call is ignored; a closed
        connection's answer only releases its slot)."""
        answered = False

        def answer(reply: Reply | Silent) -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            conn.fill(slot, reply)

        outcome.start(answer)

    def _opening(self, outcome: Opening, request: object, conn: ServedConnection, slot: Slot) -> None:
        """Open the request's partitions in turns (`Core.open_in_turns`), then carry out what
        it says; meanwhile `conn` takes no request, and after, takes those it holds."""
        conn.opening = True
        turns = False  # whether the opening took more than this call: `conn` must be resumed

        def opened() -> None:
            conn.opening = False
            if conn.closed:
                conn.fill(slot, Silent())  # frees the slot
                return
            try:
                then = outcome.then()
            except ProtocolError as exc:
                self.limit_log.warning("protocol error", "closing %s: %s", conn.peer, exc)
                conn.abort()
                return
            except Exception as exc:  # the adapter's bug: answered as any request's
                self._answer_failure(exc, request, conn, slot)
            else:
                self.carry_out(then, request, conn, slot)
            if turns:
                conn.resume()

        self.core.open_in_turns(outcome.keys, opened)
        turns = conn.opening

    def _park(
        self,
        outcome: Wait,
        conn: ServedConnection | GatherPart,
        slot: Slot,
        deadline_ms: int,
        request: object = None,
    ) -> None:
        """Park a fetch on each of its partitions until one grows or its deadline passes (see
        `_Parked`). `request` is the one the answer is for, kept across the spurious wakes that
        park it again."""
        parked = _Parked(
            self, outcome, conn, slot, deadline_ms, outcome.frame if request is None else request
        )
        parked.timer = self.call_later(max(0.0, (deadline_ms - now_ms()) / 1000), parked.timeout)
        self.parked_long_polls += 1
        wake = parked.wake
        for p in outcome.partitions:
            (p.replica_waiters if outcome.log_end else p.waiters).append(wake)

    def _parked_failed(
        self, exc: Exception, request: object, conn: ServedConnection | GatherPart, slot: Slot
    ) -> None:
        """A parked request's re-handle failed (a bug): logged; see `_park`."""
        log.exception("a parked request failed when woken: %r", exc)
        self._answer_failure(exc, request, conn, slot)

    @staticmethod
    def _answer_failure(
        exc: Exception, request: object, conn: ServedConnection | GatherPart, slot: Slot
    ) -> None:
        """Fill `slot` with the error answer of the adapter that took `request`, or drop the
        connection where its protocol has none for the failure."""
        served = conn.served if isinstance(conn, GatherPart) else conn
        adapter = served.adapter
        reply = None if adapter is None else adapter.error_reply(request, exc)
        if reply is None:
            served.abort()
        else:
            conn.fill(slot, reply)

    def _gather(self, outcome: Gather, request: object, conn: ServedConnection, slot: Slot) -> None:
        """Carry out each part in a slot of its own; once every part is done, fill the request's
        slot with `finish()`. What the parts counted against the connection is released with it."""
        left = len(outcome.parts)
        if not left:
            conn.fill(slot, outcome.finish())
            return

        def part_done(part_slot: Slot) -> None:
            nonlocal left
            left -= 1
            slot.charge += part_slot.charge
            if not left and not conn.closed:
                conn.fill(slot, outcome.finish())

        for part in outcome.parts:
            part_slot = Slot(slot.started_ns)
            self.carry_out(part, request, GatherPart(conn, part_done), part_slot)  # type: ignore[arg-type]

    def _read(self, outcome: Read, request: object, conn: ServedConnection, slot: Slot) -> None:
        self.reads_in_flight += 1

        def finished(data: Buffer | BaseException) -> None:
            self.reads_in_flight -= 1
            try:
                if isinstance(data, BaseException):
                    raise data
                reply = outcome.finish(data)
            except Exception as exc:  # becomes an error reply: the outcome's own, else the adapter's
                if outcome.fail is None:
                    self._answer_failure(exc, request, conn, slot)
                    return
                reply = outcome.fail(exc)
            conn.fill(slot, reply)

        self.read(outcome.extent, finished)

    # ------------------------------------------------------------------------- blocking calls

    def run_blocking(self, fn: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
        """`fn()` on the worker's pool of threads, then `done(result)` or `done(exception)` on the
        loop thread in a later turn, exactly once (broker/core/blocking.py: the rules, shutdown)."""
        if self._stop_requested:
            self.call_soon(lambda: done(BlockingCallAbandoned("the core is stopping")))
            return
        pool = self._blocking
        if pool is None:
            pool = self._blocking = BlockingPool(
                self.threadsafe_post(), name=f"blocking-core{self.config.core_id}"
            )
        call = next(self._blocking_ids)
        self._blocking_calls[call] = done
        calls = self._blocking_calls

        def finished(result: T | BaseException) -> None:
            waiting = calls.pop(call, None)  # None: abandoned at shutdown
            if waiting is not None:
                waiting(result)

        pool.submit(fn, finished)

    @property
    def blocking_in_flight(self) -> int:
        return len(self._blocking_calls)

    def _abandon_blocking(self) -> None:
        """Shutdown: every call still in flight gets `done(BlockingCallAbandoned())` now."""
        calls, self._blocking_calls = self._blocking_calls, {}
        if calls:
            log.info("abandoning %d blocking call(s) still running", len(calls))
        for done in calls.values():
            done(BlockingCallAbandoned("the core stopped before the call finished"))

    def close_blocking(self) -> None:
        """The loop has ended: results of calls still running are dropped (their daemon threads
        die with the process); a `done` the shutdown sequence did not call (a loop that ended on
        an error) is dropped, no longer on a loop. The backend calls it before it releases what its
        `post` uses."""
        self._blocking_calls.clear()
        if self._blocking is not None:
            self._blocking.close()

    # ------------------------------------------------------------------------- lifecycle

    def stopping(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        """SIGTERM or SIGINT: the backend's serve loop ends and runs `shutdown`."""
        self._stop_requested = True

    def started(self, ready: Callable[[], None] | None, listeners: int, backend: str) -> None:
        """The listeners are served: say so, publish the first metrics, start the periodic work."""
        self.core.metrics.backend = backend.split(maxsplit=1)[0]
        log.info(
            "core %d serving %d listener(s) (data dir %s, backend %s)",
            self.config.core_id,
            listeners,
            os.path.abspath(self.config.data_dir),
            backend,
        )
        self.publish_metrics()
        if ready is not None:
            ready()
        self._every(retention_check_s(self.config.producer_id_expiration_ms), self._retention)
        self._every(self.config.cleaner.backoff_ms / 1000, self._clean_logs)
        self._every(HOUSEKEEPING_S, self._housekeeping)
        self._every(self.admission.sweep_s, self._sweep)
        if self.replicas is not None:
            self.replicas.start()
        self.core.transactions.start()
        self._every(self.config.transaction_hang_check_interval_ms / 1000, self.hang_sweep.run)

    def _every(self, interval_s: float, work: Callable[[], None]) -> None:
        """Run `work` every `interval_s` until the core stops."""

        def tick() -> None:
            if self._stop_requested:
                return
            work()
            self.call_later(interval_s, tick)

        self.call_later(interval_s, tick)

    def publish_metrics(self) -> None:
        try:
            publish(self.config.data_dir, self.core.metrics.snapshot(self.core.gauges))
        except OSError as exc:
            log.warning("cannot publish metrics: %s", exc)

    def _housekeeping(self) -> None:
        """About once a second: publish this core's metrics, notice other cores' topic changes."""
        self.publish_metrics()
        try:
            self.core.refresh_topics()
        except (OSError, ValueError) as exc:
            log.error("cannot read the topic registry: %s", exc)

    def _retention(self) -> None:
        # A read in flight pins its segment (Segment.borrow_store_fd): deleting it is safe.
        # A pass still running when the next is due (thousands of partitions) makes that one skip.
        self.core.apply_retention(_retention_done)

    def _clean_logs(self) -> None:
        try:
            self.core.cleaning.tick()  # a clean runs on a blocking thread; this only starts one
        except Exception:
            log.exception("the log cleaner failed to start a clean")

    def _sweep(self) -> None:
        self.admission.sweep(self.connections)
        self.after_sweep()

    def busy(self) -> bool:
        """Whether requests are unanswered, replies unsent or storage operations in flight."""
        return (
            any(c.slots or c.unsent() for c in self.connections)
            or any(not w.idle() for w in self._work.values())
            or self.reads_in_flight > 0
        )

    def shutdown(self) -> Iterator[float]:
        """The one shutdown sequence of every backend: stop accepting, answer what is in flight
        (parked fetches at once, with what there is), flush, close. A generator: each value is how
        long the backend runs its loop (at most) before the sequence goes on."""
        log.info("shutting down: no new connections, answering in-flight requests")
        self.stop_accepting()
        for p in self.core.partitions.values():
            p.wake_waiters()  # parked fetches answer now (their re-handle sees `stopping()`)
        self.core.coordinator.close()  # waiting JoinGroups and SyncGroups answer now
        self.core.transactions.close()  # no more timeouts or markers; waiting answers: NOT_COORDINATOR
        self._abandon_blocking()  # requests waiting on a blocking call answer now
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while self.busy() and time.monotonic() < deadline:
            yield SHUTDOWN_POLL_S
        if self._flush_due:
            self.group_commit()
        self.forwarder.fail_all()
        for conn in list(self.connections):
            conn.close()
        self.peers.close_all()
        self.remote_links.close_all()
        for _ in range(SHUTDOWN_SETTLE_POLLS):  # let the cancels and closes complete
            if self.io_pending() <= 0:
                break
            yield SHUTDOWN_POLL_S
        self.core.close()
        self.publish_metrics()
        log.info("stopped cleanly")

    # ------------------------------------------------------------------------- connections

    def accepted(self, conn: ServedConnection) -> bool:
        """A new connection: served from now on if the cap admits it, else dropped (False). A
        connection on the inter-core listener must come from a process of this broker's user:
        the listener is an abstract unix socket, which any local process may reach, and what
        arrives on it is trusted as another core's (no authentication, no ACLs)."""
        if conn.from_peer:
            uid = peer_uid(conn.fileno())
            if uid != os.getuid():
                self.limit_log.warning(
                    "foreign peer", "closing an inter-core connection from uid %s (not ours)", uid
                )
                conn.abort()
                return False
        if not self.admission.admit_connection(conn):
            conn.drop()
            return False
        self.connections.add(conn)
        return True


class _Parked:
    """A fetch parked on its partitions: taken off all of them once woken or timed out (it runs
    once). A wake re-handles the wait's frame (ours, with the internal adapter) or calls its
    `again` (another protocol's).

    A wake runs inside whatever grew the partition (an append's completion, a high watermark
    moved by a follower's fetch): nothing that goes wrong in it may escape into that request (a
    stored produce answered UNKNOWN_SERVER_ERROR). It is logged, and the parked request gets its
    adapter's error answer, or its connection is dropped where the protocol has no answer shape
    for the failure (Kafka's).

    An object, not closures that name each other: those made a reference cycle for every parked
    fetch (the wake, its unpark and its timer, holding the request and the view of its body), which
    only the cyclic garbage collector freed; with RF 3 that was two a replicated produce on the
    leader, ~40 objects each, promoted to the oldest generation before they died. Unparked, it
    lets go of its timer, and nothing it holds refers back to it."""

    __slots__ = ("conn", "core", "deadline_ms", "fired", "outcome", "request", "slot", "timer")

    def __init__(
        self,
        core: BackendCore,
        outcome: Wait,
        conn: ServedConnection | GatherPart,
        slot: Slot,
        deadline_ms: int,
        request: object,
    ) -> None:
        self.core = core
        self.outcome = outcome
        self.conn = conn
        self.slot = slot
        self.deadline_ms = deadline_ms
        self.request = request
        self.timer: Cancellable | None = None
        self.fired = False

    def _unpark(self) -> bool:
        """Off every partition, the timer cancelled; False if it was already (a partition named
        twice)."""
        if self.fired:
            return False
        self.fired = True
        self.core.parked_long_polls -= 1
        outcome = self.outcome
        wake = self.wake
        for p in outcome.partitions:
            with contextlib.suppress(ValueError):
                (p.replica_waiters if outcome.log_end else p.waiters).remove(wake)
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()
        return True

    def wake(self) -> None:
        if not self._unpark():
            return
        core, outcome, conn, slot, request = self.core, self.outcome, self.conn, self.slot, self.request
        if conn.closed:
            return
        try:
            if outcome.again is not None:
                again = outcome.again()
            elif outcome.frame is not None:
                again = core.internal.handle(outcome.frame, None, conn.from_peer)
            else:
                raise RuntimeError("a parked wait with neither a frame nor `again`")
            core.core.metrics.woken(outcome.log_end, isinstance(again, Wait))
            if isinstance(again, Wait) and not core.stopping():
                core._park(again, conn, slot, self.deadline_ms, request)  # spurious: the first deadline
            elif isinstance(again, Wait):
                core.carry_out(again.on_timeout(), request, conn, slot)  # type: ignore[arg-type]
            else:
                core.carry_out(again, request, conn, slot)  # type: ignore[arg-type]
        except Exception as exc:
            core._parked_failed(exc, request, conn, slot)

    def timeout(self) -> None:
        if self._unpark() and not self.conn.closed:
            try:
                self.core.carry_out(self.outcome.on_timeout(), self.request, self.conn, self.slot)  # type: ignore[arg-type]
            except Exception as exc:
                self.core._parked_failed(exc, self.request, self.conn, self.slot)
