"""The io_uring backend: one ring per worker process carries out the handlers' outcomes as SQEs.

Rules this module keeps:
- The same `Handlers` as the uvloop backend (broker/server.py) decide everything; this module only
  turns outcomes into ring operations: accept (multishot), recv, sendmsg (vectored), writev at an
  offset, fdatasync, read at an offset, close. No blocking system call runs on the loop's hot path:
  cold paths (opening a partition, recovery, creating a topic, retention) stay synchronous, as in
  the uvloop backend, because they are rare and must finish before the request they serve.
- One pass of the loop: submit everything prepared and wait for at least one completion (or the
  next timer), reap up to `COMPLETIONS_PER_PASS_MAX` completions in one batch, *then* run their
  continuations (never while reaping), then run what they scheduled, then start the group commit
  of that pass. Every queue has a bound.
- Group commit: every acks=durable produce whose append completed in a pass waits for one flush
  per partition started at the end of that pass; a flush already in flight for that partition is
  followed by exactly one more, which covers everything that arrived meanwhile.
- Appends of one partition may be in flight together (their writes go to disjoint byte ranges),
  but they become visible strictly in the order they were prepared, as the log requires. A failed
  write undoes that append and every later one (`Log.abort_append`), once none of them is in flight.
- Replies leave each connection in request order. A connection with `CONNECTION_INFLIGHT_MAX`
  requests unanswered, or more than `CONNECTION_UNSENT_BYTES_MAX` reply bytes unsent, is not read
  until it drains (single-shot recvs make this pause exact: we simply do not re-arm).
- Ring and buffer lifetimes: `native.Ring` keeps every buffer an SQE references alive until its
  final completion; this module keeps each connection's fd open until none of its operations is
  in flight, then closes it through the ring.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.handlers import Append, BrokerConfig, Durable, Handlers, Outcome, Read, Reply, Silent, Wait
from broker.partition import Partition
from broker.storage.fileio import Op, Sync, Write, _advance
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import NEED_DATA, Frame, FrameDecoder, ProtocolError
from ringlog_proto.messages import Acks

log = logging.getLogger(__name__)

RING_ENTRIES = 4096  # SQEs per submit: enough for a pass over hundreds of busy connections
COMPLETIONS_PER_PASS_MAX = 4096  # continuations run per pass before we submit again
RECV_BUFFER_BYTES = 256 * 1024  # per connection; a produce frame larger than this takes several recvs
SEND_IOVECS_MAX = 512  # below IOV_MAX (1024): buffers per sendmsg
CONNECTION_INFLIGHT_MAX = 1024  # unanswered requests per connection before we stop reading it
CONNECTION_UNSENT_BYTES_MAX = 16 * 1024 * 1024  # reply bytes queued per connection before pausing
ACCEPT_RETRY_S = 0.1  # after EMFILE/ENFILE: try again later instead of spinning
RETENTION_CHECK_S = 30.0
SHUTDOWN_GRACE_S = 10.0

Callback = Callable[[int, int], None]  # (res, flags) of a completion


class Timer:
    """A callback due at `deadline` (time.monotonic()); `cancel()` makes it a no-op."""

    __slots__ = ("callback", "cancelled", "deadline")

    def __init__(self, deadline: float, callback: Callable[[], None]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """A completion-driven loop over one `native.Ring`. Owned by its worker's only thread.

    Operations are registered with a continuation under a fresh user_data; the continuation runs
    in the pass after its completion is reaped. Timers and `call_soon` callbacks cover the rest.
    """

    def __init__(self, ring: object) -> None:
        self.ring = ring
        self._ops: dict[int, Callback] = {}
        self._ids = itertools.count(1)
        self._timers: list[tuple[float, int, Timer]] = []
        self._soon: deque[Callable[[], None]] = deque()
        self.end_of_pass: list[Callable[[], None]] = []  # run after each pass's continuations

    def op(self, callback: Callback) -> int:
        """A user_data for one operation; `callback(res, flags)` runs on each of its completions."""
        ud = next(self._ids)
        self._ops[ud] = callback
        return ud

    def call_soon(self, callback: Callable[[], None]) -> None:
        self._soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + max(0.0, delay), callback)
        heapq.heappush(self._timers, (timer.deadline, next(self._ids), timer))
        return timer

    @property
    def pending_ops(self) -> int:
        return len(self._ops)

    def run_once(self) -> None:
        """One pass: submit and wait, reap a batch, run continuations, timers, soon-callbacks."""
        ring = self.ring
        timeout: float | None
        if self._soon:
            timeout = 0.0
        elif self._timers:
            timeout = max(0.0, self._timers[0][0] - time.monotonic())
        else:
            timeout = None
        ring.submit_and_wait(1, timeout)  # type: ignore[attr-defined]
        completions = ring.completions(COMPLETIONS_PER_PASS_MAX)  # type: ignore[attr-defined]
        ops = self._ops
        more = CQE_F_MORE
        for ud, res, flags in completions:
            cb = ops.get(ud) if flags & more else ops.pop(ud, None)
            if cb is not None:
                cb(res, flags)
        if self._timers:
            now = time.monotonic()
            timers = self._timers
            while timers and timers[0][0] <= now:
                _, _, timer = heapq.heappop(timers)
                if not timer.cancelled:
                    timer.callback()
        soon = self._soon
        for _ in range(len(soon)):
            soon.popleft()()
        for hook in self.end_of_pass:
            hook()


CQE_F_MORE = 1 << 1  # replaced by native's constant at import time in `run` (same value in the UAPI)


class _Slot:
    __slots__ = ("buffers", "done")

    def __init__(self) -> None:
        self.buffers: list[bytes] = []
        self.done = False


class Connection:
    """One client connection on the ring: a recv at a time, a sendmsg at a time, replies in order."""

    def __init__(self, server: UringServer, fd: int, peer: str) -> None:
        self.server = server
        self.fd = fd
        self.peer = peer
        self.decoder = FrameDecoder()
        self.slots: deque[_Slot] = deque()
        self.closed = False
        self.buf = bytearray(RECV_BUFFER_BYTES)
        self.recv_ud = 0  # user_data of the recv in flight, 0 if none
        self.sending = False
        self.send_queue: list[bytes | memoryview] = []
        self.unsent_bytes = 0
        self._fd_closed = False

    # ------------------------------------------------------------------------- receive

    def arm_recv(self) -> None:
        if self.closed or self.recv_ud or self._paused():
            return
        self.recv_ud = ud = self.server.loop.op(self._received)
        self.server.ring.prep_recv(self.fd, self.buf, ud)

    def _paused(self) -> bool:
        return len(self.slots) >= CONNECTION_INFLIGHT_MAX or self.unsent_bytes > CONNECTION_UNSENT_BYTES_MAX

    def _received(self, res: int, flags: int) -> None:
        self.recv_ud = 0
        if res <= 0:
            if res < 0 and res not in (-errno.ECONNRESET, -errno.ECANCELED, -errno.EPIPE):
                log.info("recv from %s failed: %s", self.peer, os.strerror(-res))
            if self.decoder.buffered and not self.closed:
                log.info("client %s went away mid-frame (%d bytes unread)", self.peer, self.decoder.buffered)
            self.close()
            return
        if self.closed:
            self._maybe_release()
            return
        self.server.bytes_in += res
        self.decoder.feed(memoryview(self.buf)[:res])
        server = self.server
        handle = server.handlers.handle
        try:
            while not self.closed:
                frame = self.decoder.next_frame()
                if frame is NEED_DATA:
                    break
                assert isinstance(frame, Frame)
                slot = _Slot()
                self.slots.append(slot)
                server.requests += 1
                server.carry_out(handle(frame), frame, self, slot)
        except ProtocolError as exc:
            log.warning("closing %s: %s", self.peer, exc)
            self.close()
            return
        self.arm_recv()

    # ------------------------------------------------------------------------- send

    def fill(self, slot: _Slot, outcome: Reply | Silent) -> None:
        """A reply is ready: queue every reply at the head that is ready too, in request order."""
        slot.done = True
        if isinstance(outcome, Reply):
            slot.buffers = outcome.buffers
        if self.closed:
            return
        slots = self.slots
        queued = False
        while slots and slots[0].done:
            buffers = slots.popleft().buffers
            if buffers:
                self.send_queue.extend(buffers)
                self.unsent_bytes += sum(map(len, buffers))
                queued = True
        if queued and not self.sending:
            self._send()
        self.arm_recv()  # a paused connection resumes once it has drained

    def _send(self) -> None:
        queue = self.send_queue
        if len(queue) > SEND_IOVECS_MAX:
            batch, self.send_queue = queue[:SEND_IOVECS_MAX], queue[SEND_IOVECS_MAX:]
        else:
            batch, self.send_queue = queue, []
        self.sending = True
        length = sum(map(len, batch))
        ud = self.server.loop.op(lambda res, flags: self._sent(res, batch, length))
        self.server.ring.prep_sendmsg(self.fd, batch, ud)

    def _sent(self, res: int, batch: list[bytes | memoryview], length: int) -> None:
        self.sending = False
        if res < 0:
            if res not in (-errno.ECONNRESET, -errno.EPIPE, -errno.ECANCELED):
                log.info("send to %s failed: %s", self.peer, os.strerror(-res))
            self.close()
            return
        self.server.bytes_out += res
        self.unsent_bytes -= res
        if res < length:  # a short send: the rest goes first next time
            self.send_queue[:0] = _advance(tuple(batch), res)
        if self.closed:
            self._maybe_release()
            return
        if self.send_queue:
            self._send()
        else:
            self.arm_recv()

    # ------------------------------------------------------------------------- close

    def close(self) -> None:
        """Stop serving this connection; its fd is closed once no operation on it is in flight."""
        if not self.closed:
            self.closed = True
            self.server.connections.discard(self)
            if self.recv_ud:
                self.server.ring.prep_cancel(self.recv_ud, self.server.loop.op(_ignore))
        self._maybe_release()

    def _maybe_release(self) -> None:
        if self._fd_closed or self.recv_ud or self.sending:
            return
        self._fd_closed = True
        self.server.ring.prep_close(self.fd, self.server.loop.op(_ignore))

    def close_when_sent(self) -> None:
        """Shutdown: close once every queued reply has left."""
        if not self.sending and not self.send_queue:
            self.close()


def _ignore(res: int, flags: int) -> None:
    pass


@dataclass(slots=True)
class _AppendInFlight:
    outcome: Append
    done: Callable[[Reply | Silent | None, BaseException | None], None]
    ops_left: int
    error: OSError | None = None


@dataclass(slots=True)
class _PartitionIO:
    """What the loop tracks per partition: appends in flight (in prepare order) and the flush."""

    appends: deque[_AppendInFlight] = field(default_factory=deque)
    writes_in_flight: int = 0
    flushing: bool = False
    flush_waiters: list[tuple[Callable[[], None], Callable[[BaseException], None]]] = field(
        default_factory=list
    )


class UringServer:
    """One worker process on the io_uring backend."""

    def __init__(self, config: BrokerConfig, ring: object, listeners: Sequence[socket.socket]) -> None:
        self.config = config
        self.ring = ring
        self.loop = Loop(ring)
        self.listeners = list(listeners)
        self.handlers = Handlers(config)
        self.connections: set[Connection] = set()
        self._partitions: dict[Partition, _PartitionIO] = {}
        self._flush_due: set[Partition] = set()
        self._reads_in_flight = 0
        self._stopping = False
        self._accepting = True
        self._standing: dict[int, str] = {}  # user_data of multishot accepts and the signal read
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.loop.end_of_pass.append(self._group_commit)

    # ------------------------------------------------------------------------- outcomes

    def carry_out(self, outcome: Outcome, frame: Frame, conn: Connection, slot: _Slot) -> None:
        if isinstance(outcome, Reply | Silent):
            conn.fill(slot, outcome)
        elif isinstance(outcome, Append):
            self._append(outcome, conn, slot)
        elif isinstance(outcome, Durable):
            self._after_flush(
                outcome.partition,
                lambda: conn.fill(slot, outcome.reply),
                lambda exc: conn.fill(slot, outcome.fail(exc)),
            )
        elif isinstance(outcome, Read):
            self._read(outcome, frame, conn, slot)
        else:
            self._wait(outcome, conn, slot, outcome.deadline_ms)

    # appends ------------------------------------------------------------------------------------

    def _append(self, outcome: Append, conn: Connection, slot: _Slot) -> None:
        partition = outcome.partition
        pio = self._partitions.get(partition)
        if pio is None:
            pio = self._partitions[partition] = _PartitionIO()

        def done(reply: Reply | Silent | None, exc: BaseException | None) -> None:
            if exc is not None:
                conn.fill(slot, outcome.fail(exc))
            elif outcome.acks != Acks.DURABLE:
                assert reply is not None
                conn.fill(slot, reply)
            else:
                self._after_flush(
                    partition, lambda: conn.fill(slot, reply), lambda e: conn.fill(slot, outcome.fail(e))
                )

        entry = _AppendInFlight(outcome, done, 1)
        pio.appends.append(entry)
        pio.writes_in_flight += 1

        def ops_done(exc: OSError | None) -> None:
            pio.writes_in_flight -= 1
            entry.ops_left = 0
            entry.error = exc
            self._advance_appends(partition, pio)

        self._run_ops(list(outcome.pending.ops), ops_done)

    def _advance_appends(self, partition: Partition, pio: _PartitionIO) -> None:
        """Make finished appends visible in prepare order; undo from the first failed one."""
        appends = pio.appends
        while appends and appends[0].ops_left == 0 and appends[0].error is None:
            entry = appends.popleft()
            try:
                reply = entry.outcome.complete()
            except Exception as exc:  # the log refused to complete: an error reply
                entry.done(None, exc)
                continue
            entry.done(reply, None)
        if not appends or appends[0].error is None or pio.writes_in_flight:
            return
        failed = appends[0]
        exc = failed.error
        assert exc is not None
        log.error("append to %s failed: %s", failed.outcome.pending.segment.store_path, exc)
        partition.log.abort_append(failed.outcome.pending)
        aborted, pio.appends = list(appends), deque()
        for entry in aborted:
            entry.done(None, entry.error or exc)

    def _run_ops(self, ops: list[Op], done: Callable[[OSError | None], None]) -> None:
        """Execute storage operations in order on the ring; `done(None)` or `done(error)` at the end.

        Sequential on purpose: an index write must land before the fsync that covers it, and the
        common case is one operation. A short write continues where it stopped.
        """
        if not ops:
            done(None)
            return
        op = ops[0]
        ring = self.ring
        if isinstance(op, Write):

            def written(res: int, flags: int) -> None:
                if res < 0:
                    done(OSError(-res, f"pwritev at offset {op.offset}: {os.strerror(-res)}"))
                elif res == 0:
                    done(OSError(errno.EIO, f"pwritev wrote 0 bytes at offset {op.offset}"))
                elif res < op.length:
                    ops[0] = Write(op.fd, _advance(op.buffers, res), op.offset + res, op.length - res)
                    self._run_ops(ops, done)
                else:
                    self._run_ops(ops[1:], done)

            ring.prep_writev(op.fd, op.buffers, op.offset, self.loop.op(written))  # type: ignore[attr-defined]
        elif isinstance(op, Sync):

            def synced(res: int, flags: int) -> None:
                if res < 0:
                    done(OSError(-res, f"fdatasync: {os.strerror(-res)}"))
                else:
                    self._run_ops(ops[1:], done)

            ring.prep_fsync(op.fd, self.loop.op(synced), datasync=True)  # type: ignore[attr-defined]
        else:
            try:  # open(2) of a directory is not worth a ring round trip; its fsync is
                dir_fd = os.open(op.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                done(exc)
                return

            def dir_synced(res: int, flags: int) -> None:
                os.close(dir_fd)
                if res < 0:
                    done(OSError(-res, f"fsync of directory {op.path}: {os.strerror(-res)}"))
                else:
                    self._run_ops(ops[1:], done)

            ring.prep_fsync(dir_fd, self.loop.op(dir_synced), datasync=False)  # type: ignore[attr-defined]

    # group commit -------------------------------------------------------------------------------

    def _after_flush(
        self, partition: Partition, done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        pio = self._partitions.get(partition)
        if pio is None:
            pio = self._partitions[partition] = _PartitionIO()
        pio.flush_waiters.append((done, failed))
        self._flush_due.add(partition)

    def _group_commit(self) -> None:
        """End of a pass: one flush per partition for every durable produce that pass completed."""
        if not self._flush_due:
            return
        due, self._flush_due = self._flush_due, set()
        for partition in due:
            pio = self._partitions[partition]
            if not pio.flushing and pio.flush_waiters:
                self._flush(partition, pio)

    def _flush(self, partition: Partition, pio: _PartitionIO) -> None:
        waiters, pio.flush_waiters = pio.flush_waiters, []
        log_ = partition.log
        try:
            plan = log_.prepare_flush()
        except Exception as exc:  # a broken or closed log: every waiter learns of it
            for _, failed in waiters:
                failed(exc)
            return
        pio.flushing = True

        def flushed(exc: OSError | None) -> None:
            pio.flushing = False
            if exc is not None:
                log_.fail_flush(exc)
                log.error("flush of %s failed: %s", log_.directory, exc)
                for _, failed in waiters:
                    failed(exc)
            else:
                log_.complete_flush(plan)
                for done, _ in waiters:
                    done()
            if pio.flush_waiters:  # arrived while this flush ran: the next one covers them
                self._flush(partition, pio)

        self._run_ops(list(plan.ops), flushed)

    # reads and long polls -----------------------------------------------------------------------

    def _read(self, outcome: Read, frame: Frame, conn: Connection, slot: _Slot) -> None:
        extent = outcome.extent
        buf = bytearray(extent.length)
        self._reads_in_flight += 1

        def read(res: int, flags: int) -> None:
            self._reads_in_flight -= 1
            try:
                if res < 0:
                    raise OSError(-res, f"read of {extent.segment.store_path}: {os.strerror(-res)}")
                reply = outcome.finish(bytes(buf) if res == len(buf) else bytes(buf[:res]))
            except Exception as exc:  # becomes an error reply
                reply = self.handlers.error_reply(frame, exc)
            conn.fill(slot, reply)

        self.ring.prep_read(extent.segment.store_fd, buf, extent.position, self.loop.op(read))  # type: ignore[attr-defined]

    def _wait(self, outcome: Wait, conn: Connection, slot: _Slot, deadline_ms: int) -> None:
        """Park a fetch until its partition grows or its deadline passes."""
        partition = outcome.partition
        timer: Timer | None = None

        def wake() -> None:
            if timer is not None:
                timer.cancel()
            if conn.closed:
                return
            again = self.handlers.handle(outcome.frame)
            if isinstance(again, Wait) and not self._stopping:
                self._wait(again, conn, slot, deadline_ms)  # spurious: keep the first deadline
            elif isinstance(again, Wait):
                conn.fill(slot, again.on_timeout())
            else:
                self.carry_out(again, outcome.frame, conn, slot)

        def timeout() -> None:
            with contextlib.suppress(ValueError):
                partition.waiters.remove(wake)
            if not conn.closed:
                conn.fill(slot, outcome.on_timeout())

        timer = self.loop.call_later((deadline_ms - now_ms()) / 1000, timeout)
        partition.waiters.append(wake)

    # ------------------------------------------------------------------------- accept

    def _accept(self, listener: socket.socket) -> None:
        fd = listener.fileno()

        def accepted(res: int, flags: int) -> None:
            if not flags & CQE_F_MORE:
                self._standing.pop(ud, None)
            if res >= 0:
                self._new_connection(res)
            elif res in (-errno.EMFILE, -errno.ENFILE, -errno.ENOBUFS, -errno.ENOMEM):
                log.error("accept failed: %s; retrying in %.1fs", os.strerror(-res), ACCEPT_RETRY_S)
                self.loop.call_later(ACCEPT_RETRY_S, lambda: self._accept(listener))
                return
            elif res not in (-errno.ECANCELED, -errno.ECONNABORTED):
                log.warning("accept failed: %s", os.strerror(-res))
            if not flags & CQE_F_MORE and self._accepting and res != -errno.ECANCELED:
                self._accept(listener)  # the kernel ended the multishot: arm it again

        ud = self.loop.op(accepted)
        self._standing[ud] = "accept"
        self.ring.prep_accept(fd, ud, multishot=True)  # type: ignore[attr-defined]

    def _new_connection(self, fd: int) -> None:
        if not self._accepting:
            os.close(fd)
            return
        sock = socket.socket(fileno=fd)
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = str(sock.getpeername())
        except OSError:
            peer = "?"
        finally:
            sock.detach()
        conn = Connection(self, fd, peer)
        self.connections.add(conn)
        conn.arm_recv()

    # ------------------------------------------------------------------------- lifecycle

    def serve(self, ready: Callable[[int], None] | None = None) -> None:
        """Serve until SIGINT/SIGTERM; then stop accepting, answer in-flight requests, flush, close."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        wake_buf = bytearray(64)

        def on_signal(signum: int, frame: object) -> None:
            self._stopping = True

        def arm_signal_read() -> None:
            ud = self.loop.op(signalled)
            self._standing[ud] = "signal"
            self.ring.prep_read(wake_r, wake_buf, 0, ud)  # type: ignore[attr-defined]

        def signalled(res: int, flags: int) -> None:
            self._standing = {k: v for k, v in self._standing.items() if v != "signal"}
            if not self._stopping:
                arm_signal_read()

        old_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for listener in self.listeners:
                self._accept(listener)
            arm_signal_read()
            port = self.listeners[0].getsockname()[1] if self.listeners else 0
            log.info(
                "serving on %s:%d (data dir %s, backend io_uring)",
                self.config.host,
                port,
                os.path.abspath(self.config.data_dir),
            )
            if ready is not None:
                ready(port)
            self._schedule_retention()
            loop = self.loop
            while not self._stopping:
                loop.run_once()
            self._shutdown()
        finally:
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_wakeup)
            os.close(wake_r)
            os.close(wake_w)

    def _shutdown(self) -> None:
        log.info("shutting down: no new connections, answering in-flight requests")
        self._accepting = False
        for ud in list(self._standing):  # closing a listener would not end an accept in flight
            self.ring.prep_cancel(ud, self.loop.op(_ignore))  # type: ignore[attr-defined]
        for p in self.handlers.partitions.values():
            p.wake_waiters()  # parked fetches answer now (their re-handle sees _stopping)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while time.monotonic() < deadline and (
            any(c.slots or c.sending for c in self.connections)
            or any(pio.appends or pio.flushing or pio.flush_waiters for pio in self._partitions.values())
            or self._reads_in_flight
        ):
            self._pass(0.05)
        for conn in list(self.connections):
            conn.close()
        for _ in range(100):  # let the cancels and closes complete
            if self.loop.pending_ops <= 0:
                break
            self._pass(0.01)
        self.handlers.close()
        log.info("stopped cleanly")

    def _pass(self, wait_s: float) -> None:
        """One loop pass that waits at most `wait_s` (shutdown must not block on a quiet ring)."""
        self.loop.call_later(wait_s, _nothing)
        self.loop.run_once()

    def _schedule_retention(self) -> None:
        def check() -> None:
            if self._reads_in_flight:  # a read may hold a segment's fd: try again soon
                self.loop.call_later(1.0, check)
                return
            deleted = self.handlers.apply_retention()
            if deleted:
                log.info("retention deleted %d segment(s)", deleted)
            self.loop.call_later(RETENTION_CHECK_S, check)

        self.loop.call_later(RETENTION_CHECK_S, check)


def _nothing() -> None:
    pass


def run(
    config: BrokerConfig, listeners: Sequence[socket.socket], ready: Callable[[int], None] | None = None
) -> None:
    """Run one worker on io_uring until a signal stops it. Raises `native.RingUnavailable` when
    the kernel refuses a ring; the caller then falls back to the uvloop backend."""
    global CQE_F_MORE  # noqa: PLW0603 - one value, known only once native is importable
    from broker.server import tune_malloc  # noqa: PLC0415
    from native import ring as native_ring  # noqa: PLC0415 - the uvloop backend must not need it

    CQE_F_MORE = native_ring.CQE_F_MORE
    tune_malloc()
    ring = native_ring.Ring(RING_ENTRIES)
    try:
        UringServer(config, ring, listeners).serve(ready)
    finally:
        ring.close()
