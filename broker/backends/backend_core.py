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

from broker.backends.admission import REQUEST_OVERHEAD_BYTES, Admission, request_charge
from broker.backends.appends import PartitionAppends
from broker.backends.blocking import BlockingPool
from broker.backends.connection import FirstBytes, GatherPart, ServedConnection, Slot, peer_uid
from broker.backends.primitives import Cancellable
from broker.backends.rate_limited_log import RateLimitedLog
from broker.core.adapter import Adapter
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
    Outcome,
    Read,
    Reply,
    Silent,
    Wait,
)
from broker.core.remote import RemoteLinks
from broker.core.replica_manager import ReplicaManager
from broker.kafka import sasl as kafka_sasl
from broker.kafka.adapter import KafkaAdapter
from broker.kafka.codec import KafkaFrameDecoder, KafkaRequest
from broker.ringlog.adapter import RinglogAdapter
from broker.security.tls import peer_context, server_context
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import HEADER_SIZE, NEED_DATA, Buffer, Frame
from ringlog_proto.sasl import SaslLogin

log = logging.getLogger(__name__)

T = TypeVar("T")

RETENTION_CHECK_S = 30.0  # how often segments past their topic's retention are looked for
HOUSEKEEPING_S = 1.0  # metrics snapshot published, topics.json checked for other cores' changes
SHUTDOWN_GRACE_S = 10.0  # longest wait for in-flight requests and operations at shutdown
SHUTDOWN_POLL_S = 0.01  # the loop runs at most this long between looks at what is still in flight
SHUTDOWN_SETTLE_POLLS = 100  # after closing: waits for the backend's last operations (cancels, closes)


class BackendCore(PartitionAppends):
    """One core's serving, whatever moves its bytes. A backend subclasses it, calls `open_core`
    once its loop primitives work, and provides the primitives (`BackendPrimitives`)."""

    core: Core
    ringlog: RinglogAdapter  # our protocol, which is also the inter-core one (forwards, notices)
    kafka: Adapter[KafkaRequest]
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
        """Open this core (`Core`), its two protocols' adapters and its forwarding; publish
        its gauges."""
        config = self.config
        self.core = Core(config, call_later=self.call_later, run_blocking=self.run_blocking)
        self.ringlog = RinglogAdapter(self.core)
        self.kafka = KafkaAdapter(self.core, config)
        self.peers = PeerPool.for_config(config, self.open_peer, self.stopping, self.call_later)
        self.forwarder = Forwarder(self.ringlog, self.peers.send_to_core, self.call_later)
        self.remote_links = RemoteLinks(
            self.open_remote, self.call_later, self.stopping, login=self._peer_login()
        )
        self.core.remote_links = self.remote_links
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
        """Handle the whole frames `conn`'s decoder holds, in order, each with its reply slot, as
        long as the memory budgets allow (admission.py's rules); the rest wait in the decoder.

        Raises `ProtocolError` when the bytes cannot be framed: the backend closes `conn`.
        """
        ringlog = self.ringlog
        admission = self.admission
        handle = ringlog.handle
        metrics = self.core.metrics
        from_peer = conn.from_peer
        decoder = conn.decoder
        if isinstance(decoder, FirstBytes):
            decoder = conn.decoder = decoder.decide()
        slots = conn.slots
        budget = conn.budget
        auth = None if from_peer else conn.auth  # a frame from another core is trusted
        took = False
        if not from_peer:
            admission.count(conn, 0, decoder.buffered - budget.buffered)
        try:
            while not conn.closed and not conn.refusing:
                if not from_peer and not admission.may_take(conn):
                    break
                if conn.auth.raw_tokens and isinstance(decoder, KafkaFrameDecoder):
                    token = decoder.next_raw(kafka_sasl.RAW_TOKEN_MAX_BYTES)
                    if token is NEED_DATA:
                        break
                    assert isinstance(token, bytes)  # mypy does not narrow `is NEED_DATA`
                    took = True
                    slot = Slot(metrics.kafka_request(kafka_sasl.SASL_AUTHENTICATE, len(token) + 4))
                    slots.append(slot)
                    self.carry_out(kafka_sasl.raw_token(token, conn.auth), None, conn, slot)  # type: ignore[arg-type]
                    continue
                frame = decoder.next_frame()
                if frame is NEED_DATA:
                    break
                took = True
                if isinstance(frame, KafkaRequest):
                    self._take_kafka(frame, conn)
                    continue
                assert isinstance(frame, Frame)
                size = len(frame.body) + HEADER_SIZE
                if from_peer:
                    slot = Slot(metrics.request(frame.api_key, size))
                    metrics.forwarded_in()
                else:
                    slot = Slot(metrics.request(frame.api_key, size), request_charge(frame))
                    admission.count(conn, slot.charge, -size)
                slots.append(slot)
                # the adapter gates a client's frame (SASL and ACLs: broker/ringlog/access.py)
                self.carry_out(handle(frame, auth, from_peer), frame, conn, slot)
        finally:
            if not from_peer and not conn.closed:
                admission.count(conn, 0, decoder.buffered - budget.buffered)
                if not decoder.buffered:
                    budget.frame_started = 0.0
                elif took or not budget.frame_started:
                    budget.frame_started = time.monotonic()

    def _take_kafka(self, request: KafkaRequest, conn: ServedConnection) -> None:
        """A Kafka request: the adapter's outcome, carried out in the connection's next slot.
        (The adapter raises `ProtocolError` for a request it closes the connection on.)"""
        size = request.size
        started_ns = self.core.metrics.kafka_request(request.api_key, size)
        outcome = self.kafka.handle(request, conn.auth)
        slot = Slot(started_ns, size + REQUEST_OVERHEAD_BYTES)
        self.admission.count(conn, slot.charge, -size)
        conn.slots.append(slot)
        self.carry_out(outcome, request, conn, slot)

    def carry_out(
        self, outcome: Outcome, frame: Frame | KafkaRequest, conn: ServedConnection, slot: Slot
    ) -> None:
        """Do what `outcome` says for the request in `slot`. Every member of `Outcome` has its case;
        anything else is a bug and raises."""
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
                self._read(outcome, frame, conn, slot)
            case Durable():
                self.after_flush(
                    outcome.partition,
                    lambda: conn.fill(slot, outcome.reply),
                    lambda exc: conn.fill(slot, outcome.fail(exc)),
                )
            case Wait():
                self._park(outcome, conn, slot, outcome.deadline_ms, frame)
            case Forward():
                self.forwarder.forward(outcome, lambda reply: conn.fill(slot, reply))
                if self.forwarder.blocked(outcome.core):
                    conn.wait_for_forward_room(self.forwarder, outcome.core)
            case Notify():
                self.forwarder.notify(outcome, lambda reply: conn.fill(slot, reply))
            case Gather():
                self._gather(outcome, frame, conn, slot)
            case Later():
                self._later(outcome, conn, slot)
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

    def _park(
        self,
        outcome: Wait,
        conn: ServedConnection | GatherPart,
        slot: Slot,
        deadline_ms: int,
        frame: Frame | KafkaRequest | None = None,
    ) -> None:
        """Park a fetch on each of its partitions until one grows or its deadline passes; once
        woken or timed out it is taken off all of them (it runs once). `frame` is the request
        the answer is for (a Kafka Fetch's wait has no frame of ours: it re-handles through
        `again`), kept across the spurious wakes that park it again.

        A wake runs inside whatever grew the partition (an append's completion, a high watermark
        moved by a follower's fetch): nothing that goes wrong in it may escape into that request
        (a stored produce answered UNKNOWN_SERVER_ERROR). It is logged, and the
        parked request gets an error answer (ours) or its connection is dropped (Kafka's, as the
        adapter does for a failure it has no answer shape for)."""
        partitions = outcome.partitions
        if frame is None:
            frame = outcome.frame
        timer: Cancellable | None = None
        fired = False

        def unpark() -> bool:
            """Off every partition; False if it was already (a partition named twice)."""
            nonlocal fired
            if fired:
                return False
            fired = True
            self.parked_long_polls -= 1
            for p in partitions:
                with contextlib.suppress(ValueError):
                    p.waiters.remove(wake)
            return True

        def wake() -> None:
            if not unpark():
                return
            if timer is not None:
                timer.cancel()
            if conn.closed:
                return
            try:
                if outcome.again is not None:
                    again = outcome.again()
                elif outcome.frame is not None:
                    again = self.ringlog.handle(outcome.frame, from_peer=conn.from_peer)
                else:
                    raise RuntimeError("a parked wait with neither a frame nor `again`")
                if isinstance(again, Wait) and not self.stopping():
                    self._park(again, conn, slot, deadline_ms, frame)  # spurious: the first deadline
                elif isinstance(again, Wait):
                    self.carry_out(again.on_timeout(), frame, conn, slot)  # type: ignore[arg-type]
                else:
                    self.carry_out(again, frame, conn, slot)  # type: ignore[arg-type]
            except Exception as exc:
                self._parked_failed(exc, frame, conn, slot)

        def timeout() -> None:
            if unpark() and not conn.closed:
                try:
                    self.carry_out(outcome.on_timeout(), frame, conn, slot)  # type: ignore[arg-type]
                except Exception as exc:
                    self._parked_failed(exc, frame, conn, slot)

        timer = self.call_later(max(0.0, (deadline_ms - now_ms()) / 1000), timeout)
        self.parked_long_polls += 1
        for p in partitions:
            p.waiters.append(wake)

    def _parked_failed(
        self,
        exc: Exception,
        frame: Frame | KafkaRequest | None,
        conn: ServedConnection | GatherPart,
        slot: Slot,
    ) -> None:
        """A parked request's re-handle failed (a bug): logged; see `_park`."""
        log.exception("a parked request failed when woken: %r", exc)
        if isinstance(frame, Frame):
            conn.fill(slot, self.ringlog.error_reply(frame, exc))
        else:
            served = conn.served if isinstance(conn, GatherPart) else conn
            served.abort()

    def _gather(
        self, outcome: Gather, frame: Frame | KafkaRequest, conn: ServedConnection, slot: Slot
    ) -> None:
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
            self.carry_out(part, frame, GatherPart(conn, part_done), part_slot)  # type: ignore[arg-type]

    def _read(self, outcome: Read, frame: Frame | KafkaRequest, conn: ServedConnection, slot: Slot) -> None:
        self.reads_in_flight += 1

        def finished(data: Buffer | BaseException) -> None:
            self.reads_in_flight -= 1
            try:
                if isinstance(data, BaseException):
                    raise data
                reply = outcome.finish(data)
            except Exception as exc:  # becomes an error reply
                if outcome.fail is not None:
                    reply = outcome.fail(exc)
                else:
                    assert isinstance(frame, Frame)
                    reply = self.ringlog.error_reply(frame, exc)
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
        self._every(RETENTION_CHECK_S, self._retention)
        self._every(self.config.cleaner.backoff_ms / 1000, self._clean_logs)
        self._every(HOUSEKEEPING_S, self._housekeeping)
        self._every(self.admission.sweep_s, self._sweep)
        if self.replicas is not None:
            self.replicas.start()

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
        deleted = self.core.apply_retention()
        if deleted:
            log.info("retention deleted %d segment(s)", deleted)

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
