"""The io_uring backend: one ring per worker process carries out the handlers' outcomes as SQEs.

Rules this module keeps:
- The same `Handlers` as the uvloop backend (broker/backends/aio.py) decide everything; this module only
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
- Replies leave each connection in request order. A client connection over its budget of bytes in
  flight, or on a core over its budget (broker/backends/shared.py keeps the accounting; reply bytes
  queued for sendmsg count until sent), is not read until memory is released (single-shot recvs
  make this pause exact: we simply do not re-arm). Idle and stalled connections are closed by the
  sweep, which also gives an idle connection's grown recv buffer back.
- Ring and buffer lifetimes: `native.Ring` keeps every buffer an SQE references alive until its
  final completion; this module keeps each connection's fd open until none of its operations is
  in flight, then closes it through the ring.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import signal
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.backends.shared import BackendCore, ConnectionBudget, ReplyTarget, Slot, tune_malloc
from broker.backends.uring_options import UringOptions
from broker.core.config import BrokerConfig
from broker.core.forwarding import NO_DEADLINE, Done, Forwarder, PeerLink, PeerPool
from broker.core.handlers import Handlers
from broker.core.metrics import publish
from broker.core.outcomes import Append, Read, Reply, Silent
from broker.core.partition import Partition
from broker.storage.fileio import (
    Op,
    Sync,
    SyncDir,
    SyncFileIO,
    Write,
    WriteError,
    remaining_buffers,
    run_ops,
)
from ringlog_proto.frames import Frame, FrameDecoder, ProtocolError
from ringlog_proto.messages import Acks

if TYPE_CHECKING:  # the uvloop backend and tools must import without the native bindings
    from native.ring import Ring

log = logging.getLogger(__name__)

RING_ENTRIES = 4096  # SQEs per submit: enough for a pass over hundreds of busy connections
COMPLETIONS_PER_PASS_MAX = 4096  # continuations run per pass before we submit again
# Each connection owns its recv buffer (single-shot recvs; see the module rules). It starts small,
# so that thousands of idle connections cost little, and quadruples whenever a recv fills it, up to
# the size where a stream of 1 MiB produce batches needs only a few recvs per frame; a connection
# quiet for a sweep gets a small one back (the sweep cancels its recv and arms one with it).
RECV_BUFFER_BYTES_MIN = 4 * 1024
RECV_BUFFER_BYTES_MAX = 256 * 1024
SEND_IOVECS_MAX = 512  # below IOV_MAX (1024): buffers per sendmsg
WRITEV_IOVECS_MAX = 512  # below IOV_MAX (1024): buffers per gathered store writev (2 per batch)
ACCEPT_RETRY_S = 0.1  # after EMFILE/ENFILE: try again later instead of spinning
RETENTION_CHECK_S = 30.0
HOUSEKEEPING_S = 1.0  # metrics snapshot published, topics.json checked for other cores' changes
SHUTDOWN_GRACE_S = 10.0
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection

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

    def __init__(self, ring: Ring, busy_poll_us: int = 0) -> None:
        self.ring = ring
        self._ops: dict[int, Callback] = {}
        self._ids = itertools.count(1)
        self._timers: list[tuple[float, int, Timer]] = []
        self._soon: deque[Callable[[], None]] = deque()
        self.end_of_pass: list[Callable[[], None]] = []  # run after each pass's continuations
        self.busy_poll_s = busy_poll_us / 1e6
        self._busy_until = 0.0

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
        if self._soon or (self.busy_poll_s and time.monotonic() < self._busy_until):
            timeout = 0.0
        elif self._timers:
            timeout = max(0.0, self._timers[0][0] - time.monotonic())
        else:
            timeout = None
        ring.submit_and_wait(1, timeout)
        completions = ring.completions(COMPLETIONS_PER_PASS_MAX)
        if completions and self.busy_poll_s:
            self._busy_until = time.monotonic() + self.busy_poll_s
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


class _Stream:
    """A stream socket on the ring: one recv at a time, one sendmsg at a time, a close that waits
    for both. Subclasses say what received bytes mean (`received`) and when to stop reading."""

    def __init__(self, server: UringServer, fd: int, peer: str) -> None:
        self.server = server
        self.fd = fd
        self.peer = peer
        self.closed = False
        self.buf = bytearray(RECV_BUFFER_BYTES_MIN)  # what the next recv reads into
        self.recv_buf = self.buf  # what the recv in flight reads into
        self.receiving = False  # inside `received`: arm the next recv after it, not during
        self.recv_ud = 0  # user_data of the recv in flight, 0 if none
        self.sending = False
        self.send_queue: list[bytes | memoryview] = []
        self.unsent_bytes = 0
        self._fd_closed = False
        self._shrinking = False  # the recv in flight is being cancelled to re-arm with a small buffer

    def paused(self) -> bool:
        return False

    def received(self, data: memoryview) -> None:
        raise NotImplementedError

    def lost(self, res: int) -> None:
        """The peer closed (res 0) or the connection failed (-errno); `close()` follows."""

    # ------------------------------------------------------------------------- receive

    def arm_recv(self) -> None:
        if self.closed or self.recv_ud or self.receiving or self.paused():
            return
        self.recv_ud = ud = self.server.loop.op(self._recv_done)
        self.recv_buf = buf = self.buf
        self.server.ring.prep_recv(self.fd, buf, ud)

    def shrink_recv_buffer(self) -> None:
        """Quiet connection: arm its recv with a `RECV_BUFFER_BYTES_MIN` buffer instead of the
        grown one (cancel the recv in flight; `_recv_done` re-arms on its -ECANCELED)."""
        self.buf = bytearray(RECV_BUFFER_BYTES_MIN)
        if self.recv_ud and not self._shrinking and len(self.recv_buf) > RECV_BUFFER_BYTES_MIN:
            self._shrinking = True
            self.server.ring.prep_cancel(self.recv_ud, self.server.loop.op(_ignore))

    def _recv_done(self, res: int, flags: int) -> None:
        self.recv_ud = 0
        shrinking, self._shrinking = self._shrinking, False
        if res == -errno.ECANCELED and shrinking and not self.closed:
            self.recv_buf = self.buf
            self.arm_recv()
            return
        if res <= 0:
            if res < 0 and res not in (-errno.ECONNRESET, -errno.ECANCELED, -errno.EPIPE):
                log.info("recv from %s failed: %s", self.peer, os.strerror(-res))
            if not self.closed:
                self.lost(res)
            self.close()
            return
        if self.closed:
            self._maybe_release()
            return
        # The bytes are in the buffer this recv was armed with, whatever `self.buf` is now; and
        # no recv is armed while they are being read (replies queued meanwhile call arm_recv).
        buf = self.recv_buf
        if res == len(buf) < RECV_BUFFER_BYTES_MAX:
            self.buf = bytearray(min(4 * res, RECV_BUFFER_BYTES_MAX))
        self.receiving = True
        try:
            self.received(memoryview(buf)[:res])
        finally:
            self.receiving = False
        self.arm_recv()

    # ------------------------------------------------------------------------- send

    def write(self, buffers: Sequence[bytes | memoryview]) -> None:
        if self.closed or not buffers:
            return
        self.send_queue.extend(buffers)
        self.unsent_bytes += sum(map(len, buffers))
        if not self.sending:
            self._send()

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
            if not self.closed:
                self.lost(res)
            self.close()
            return
        self.server.bytes_out += res
        self.unsent_bytes -= res
        if res < length:  # a short send: the rest goes first next time
            self.send_queue[:0] = remaining_buffers(tuple(batch), res)
        self.sent_some()
        if self.closed:
            self._maybe_release()
            return
        if self.send_queue:
            self._send()
        else:
            self.arm_recv()  # a connection paused on unsent bytes reads again

    # ------------------------------------------------------------------------- close

    def close(self) -> None:
        """Stop serving this connection; its fd is closed once no operation on it is in flight."""
        if not self.closed:
            self.closed = True
            self.closing()
            if self.recv_ud:
                self.server.ring.prep_cancel(self.recv_ud, self.server.loop.op(_ignore))
        self._maybe_release()

    def closing(self) -> None:
        """Called once, when the connection is closed for whatever reason."""

    def sent_some(self) -> None:
        """A sendmsg completed (`unsent_bytes` is less)."""

    def _maybe_release(self) -> None:
        if self._fd_closed or self.recv_ud or self.sending:
            return
        self._fd_closed = True
        self.server.ring.prep_close(self.fd, self.server.loop.op(_ignore))


class Connection(_Stream):
    """A client connection (or, `from_peer`, one from another core): frames in, replies in order."""

    def __init__(self, server: UringServer, fd: int, peer: str, from_peer: bool = False) -> None:
        super().__init__(server, fd, peer)
        self.from_peer = from_peer
        self.decoder = FrameDecoder(server.config.limits.max_request_bytes)
        self.slots: deque[Slot] = deque()
        self.forward_blocked = 0  # peer cores whose forward limit this connection waits on
        self.budget = ConnectionBudget(time.monotonic())

    def paused(self) -> bool:
        return self.forward_blocked > 0 or not self.server.may_read(self)

    def waits_for_forward(self) -> bool:
        return self.forward_blocked > 0

    def received(self, data: memoryview) -> None:
        self.server.bytes_in += len(data)
        self.budget.last_active = time.monotonic()
        self.decoder.feed(data)
        self.resume()

    def resume(self) -> None:
        try:
            self.server.take_requests(self)
        except ProtocolError as exc:
            self.server.limit_log.warning("protocol error", "closing %s: %s", self.peer, exc)
            self.close()
            return
        self.arm_recv()  # no-op inside `received`: `_recv_done` arms after it

    def drop(self) -> None:
        """Close at once for a limit: reset the connection (no TIME_WAIT left for a flood of them)."""
        if not self.closed and not self.from_peer:
            sock = socket.socket(fileno=self.fd)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
            except OSError:
                pass
            finally:
                sock.detach()
        self.close()

    def lost(self, res: int) -> None:
        if self.decoder.buffered:
            log.info("client %s went away mid-frame (%d bytes unread)", self.peer, self.decoder.buffered)

    def closing(self) -> None:
        self.server.connections.discard(self)
        self.server.forget(self)

    def sent_some(self) -> None:
        self.budget.last_active = time.monotonic()
        self.server.queued(self, 0, self.unsent_bytes)

    def fill(self, slot: Slot, outcome: Reply | Silent) -> None:
        """A reply is ready: queue every reply at the head that is ready too, in request order."""
        slot.done = True
        server = self.server
        if isinstance(outcome, Reply):
            slot.buffers = outcome.buffers
            size = sum(map(len, outcome.buffers))
            server.handlers.metrics.reply(size, slot.started_ns)
            change = server.replied(slot, size)
        else:
            change = server.replied(slot, 0)
        if self.closed:
            return
        slots = self.slots
        out: list[bytes] = []
        released = 0
        while slots and slots[0].done:
            done = slots.popleft()
            out.extend(done.buffers)
            released += done.charge
        if out:
            self.write(out)
        server.queued(self, released, self.unsent_bytes, change)
        self.arm_recv()  # a connection paused on its budget may read again

    def wait_for_forward_room(self, forwarder: Forwarder, core: int) -> None:
        """Stop reading until forwards to `core` are below their limit again."""
        self.forward_blocked += 1

        def resume() -> None:
            self.forward_blocked -= 1
            self.arm_recv()

        forwarder.when_room(core, resume)


class PeerConnection(_Stream):
    """This core's end of one inter-core connection: moves bytes for a `PeerLink`."""

    def __init__(self, server: UringServer, fd: int, core: int, long_poll: bool) -> None:
        super().__init__(server, fd, f"core {core}")
        self.core = core
        self.long_poll = long_poll
        self.link = PeerLink(core)

    def send(self, frame: Frame, done: Done | None, deadline: float = NO_DEADLINE) -> None:
        self.write(self.link.request(frame, done, deadline))

    def received(self, data: memoryview) -> None:
        try:
            self.link.receive(data)  # type: ignore[arg-type]
        except ProtocolError as exc:
            log.error("core %d sent bytes that are not frames (%s): dropping the connection", self.core, exc)
            self.close()

    def closing(self) -> None:
        self.server.peer_gone(self)
        self.link.lost(None)


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


class UringServer(BackendCore):
    """One worker process on the io_uring backend."""

    def __init__(
        self,
        config: BrokerConfig,
        ring: Ring,
        listeners: Sequence[socket.socket],
        options: UringOptions | None = None,
    ) -> None:
        super().__init__(config)
        self.config = config
        self.options = options = options or UringOptions()
        self.ring = ring
        self.loop = Loop(ring, options.busy_poll_us)
        self.listeners = list(listeners)
        self.handlers = Handlers(config)
        self.connections: set[Connection] = set()
        self._partitions: dict[Partition, _PartitionIO] = {}
        self._flush_due: set[Partition] = set()
        self._store_writes: dict[Partition, list[tuple[Write, _AppendInFlight]]] = {}
        self._reads_in_flight = 0
        self.inline_appends = options.append_writes == "inline"
        self._sync_io = SyncFileIO()
        self._stopping = False
        self._accepting = True
        self._standing: dict[int, str] = {}  # user_data of multishot accepts and the signal read
        self.bytes_in = 0
        self.bytes_out = 0
        self.peers = PeerPool.for_config(config, self._open_peer, self.stopping, self.call_later)
        self.forwarder = Forwarder(self.handlers, self.peers.send_to_core, self.loop.call_later)
        self.handlers.metrics.backend = "io_uring"
        self.handlers.gauges = {
            "inflight_requests": lambda: sum(len(c.slots) for c in self.connections if not c.from_peer),
            "pending_forwards": lambda: self.forwarder.pending,
            "parked_long_polls": lambda: self.parked_long_polls,
            "commit_waiters": lambda: sum(len(p.flush_waiters) for p in self._partitions.values()),
            "client_connections": lambda: self.client_connections,
            "bytes_in_flight": lambda: self.memory.used,
        }
        self.loop.end_of_pass.append(self._submit_store_writes)
        self.loop.end_of_pass.append(self._group_commit)

    # ------------------------------------------------------------------------- outcomes

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        return self.loop.call_later(delay_s, callback)

    def stopping(self) -> bool:
        return self._stopping

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    # ------------------------------------------------------------------------- inter-core I/O

    def _open_peer(self, core: int, long_poll: bool) -> PeerConnection | None:
        """Connect to a peer core's unix listener without blocking the loop: the listener is the
        supervisor's and always exists, so a failure means its backlog is full, and the forward
        fails retriably rather than waiting."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        try:
            sock.connect(self.config.peer_addresses[core])
        except OSError as exc:
            sock.close()
            log.warning("cannot reach core %d: %s", core, exc)
            return None
        pc = PeerConnection(self, sock.detach(), core, long_poll)
        pc.arm_recv()
        return pc

    def peer_gone(self, pc: PeerConnection) -> None:
        self.peers.gone(pc)

    # appends ------------------------------------------------------------------------------------

    def _append(self, outcome: Append, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
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
        ops = outcome.pending.ops
        if self.inline_appends:
            try:
                run_ops(self._sync_io, ops)
            except OSError as exc:
                self._append_written(partition, pio, (entry,), exc)
                return
            self._append_written(partition, pio, (entry,), None)
        elif len(ops) == 1 and isinstance(ops[0], Write):
            # The common case, one store write: gathered with the others of this pass (below).
            self._store_writes.setdefault(partition, []).append((ops[0], entry))
        else:
            self._run_ops(list(ops), lambda exc: self._append_written(partition, pio, (entry,), exc))

    def _append_written(
        self,
        partition: Partition,
        pio: _PartitionIO,
        entries: Sequence[_AppendInFlight],
        exc: OSError | None,
    ) -> None:
        for entry in entries:
            pio.writes_in_flight -= 1
            entry.ops_left = 0
            entry.error = exc
        self._advance_appends(partition, pio)

    def _submit_store_writes(self) -> None:
        """End of a pass: the store writes of every append prepared in it, as few writevs as can be.

        A pipelining producer's batches arrive several per recv and land back to back in the
        store, so one writev (and, on a file system that punts buffered writes to io-wq, one
        kernel-thread hand-off instead of several) carries them all, up to `WRITEV_IOVECS_MAX`
        buffers. Each append still completes, and becomes visible, on its own terms.
        """
        if not self._store_writes:
            return
        batches, self._store_writes = self._store_writes, {}
        for partition, items in batches.items():
            pio = self._partitions[partition]
            run: list[tuple[Write, _AppendInFlight]] = []
            iovecs = 0
            for op, entry in items:
                if run:
                    last = run[-1][0]
                    contiguous = op.fd == last.fd and op.offset == last.offset + last.length
                    if not contiguous or iovecs + len(op.buffers) > WRITEV_IOVECS_MAX:
                        self._submit_write_run(partition, pio, run)
                        run, iovecs = [], 0
                run.append((op, entry))
                iovecs += len(op.buffers)
            self._submit_write_run(partition, pio, run)

    def _submit_write_run(
        self, partition: Partition, pio: _PartitionIO, run: list[tuple[Write, _AppendInFlight]]
    ) -> None:
        entries = tuple(entry for _, entry in run)
        if len(run) == 1:
            op = run[0][0]
        else:
            first = run[0][0]
            buffers = tuple(b for op, _ in run for b in op.buffers)
            op = Write(first.fd, buffers, first.offset, sum(op.length for op, _ in run))
        self._run_ops([op], lambda exc: self._append_written(partition, pio, entries, exc))

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
                    done(WriteError(-res, f"pwritev at offset {op.offset}: {os.strerror(-res)}"))
                elif res == 0:
                    done(WriteError(errno.EIO, f"pwritev wrote 0 bytes at offset {op.offset}"))
                elif res < op.length:
                    ops[0] = Write(
                        op.fd, remaining_buffers(op.buffers, res), op.offset + res, op.length - res
                    )
                    self._run_ops(ops, done)
                else:
                    self._run_ops(ops[1:], done)

            ring.prep_writev(op.fd, op.buffers, op.offset, self.loop.op(written))
        elif isinstance(op, Sync):

            def synced(res: int, flags: int) -> None:
                if res < 0:
                    done(OSError(-res, f"fdatasync: {os.strerror(-res)}"))
                else:
                    self._run_ops(ops[1:], done)

            ring.prep_fsync(op.fd, self.loop.op(synced), datasync=True)
        else:  # SyncFile (a closed segment's file) or SyncDir: a descriptor of its own for the sync
            is_dir = isinstance(op, SyncDir)
            try:  # open(2) is not worth a ring round trip; the fsync is
                path_fd = os.open(op.path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else 0))
            except OSError as exc:
                if not is_dir and exc.errno == errno.ENOENT:  # deleted meanwhile (retention): no sync
                    self._run_ops(ops[1:], done)
                else:
                    done(exc)
                return
            what = "fsync of directory" if is_dir else "fdatasync of"

            def path_synced(res: int, flags: int) -> None:
                os.close(path_fd)
                if res < 0:
                    done(OSError(-res, f"{what} {op.path}: {os.strerror(-res)}"))
                else:
                    self._run_ops(ops[1:], done)

            ring.prep_fsync(path_fd, self.loop.op(path_synced), datasync=not is_dir)

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
                log_.fail_flush(exc, plan)
                log.error("flush of %s failed: %s", log_.directory, exc)
                for _, failed in waiters:
                    failed(exc)
            else:
                log_.complete_flush(plan)
                self.handlers.metrics.flushed(len(waiters))
                for done, _ in waiters:
                    done()
            if pio.flush_waiters:  # arrived while this flush ran: the next one covers them
                self._flush(partition, pio)

        self._run_ops(list(plan.ops), flushed)

    # reads and long polls -----------------------------------------------------------------------

    def _read(self, outcome: Read, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        extent = outcome.extent
        segment = extent.segment
        try:
            # Pinned while the SQE is in flight: the descriptor cache must not close (and the
            # kernel hand out again) the number the read names. Retention and DeleteTopic may
            # delete the segment meanwhile; its files then close when the read completes.
            fd = segment.borrow_store_fd()
        except Exception as exc:  # cannot open a closed segment's file: an error reply
            conn.fill(slot, self.handlers.error_reply(frame, exc))
            return
        buf = bytearray(extent.length)
        self._reads_in_flight += 1

        def read(res: int, flags: int) -> None:
            self._reads_in_flight -= 1
            segment.unpin()
            try:
                if res < 0:
                    raise OSError(-res, f"read of {extent.segment.store_path}: {os.strerror(-res)}")
                reply = outcome.finish(bytes(buf) if res == len(buf) else bytes(buf[:res]))
            except Exception as exc:  # becomes an error reply
                reply = self.handlers.error_reply(frame, exc)
            conn.fill(slot, reply)

        self.ring.prep_read(fd, buf, extent.position, self.loop.op(read))

    # ------------------------------------------------------------------------- accept

    def _accept(self, listener: socket.socket) -> None:
        fd = listener.fileno()
        from_peer = listener.family == socket.AF_UNIX  # frames from another core (forwards, notices)

        def accepted(res: int, flags: int) -> None:
            if not flags & CQE_F_MORE:
                self._standing.pop(ud, None)
            if res >= 0:
                self._new_connection(res, from_peer)
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
        self.ring.prep_accept(fd, ud, multishot=True)

    def _new_connection(self, fd: int, from_peer: bool) -> None:
        if not self._accepting:
            os.close(fd)
            return
        peer = "core peer"
        if not from_peer:
            sock = socket.socket(fileno=fd)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peer = str(sock.getpeername())
            except OSError:
                peer = "?"
            finally:
                sock.detach()
        conn = Connection(self, fd, peer, from_peer)
        if not self.admit_connection(conn):
            conn.drop()
            return
        self.connections.add(conn)
        conn.arm_recv()

    # ------------------------------------------------------------------------- lifecycle

    def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGINT/SIGTERM; then stop accepting, answer in-flight requests, flush, close."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        wake_buf = bytearray(64)

        def on_signal(signum: int, frame: object) -> None:
            self._stopping = True

        def arm_signal_read() -> None:
            ud = self.loop.op(signalled)
            self._standing[ud] = "signal"
            self.ring.prep_read(wake_r, wake_buf, 0, ud)

        def signalled(res: int, flags: int) -> None:
            self._standing = {k: v for k, v in self._standing.items() if v != "signal"}
            if not self._stopping:
                arm_signal_read()

        old_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for listener in self.listeners:
                self._accept(listener)
            arm_signal_read()
            log.info(
                "core %d serving %d listener(s) (data dir %s, backend io_uring)",
                self.config.core_id,
                len(self.listeners),
                os.path.abspath(self.config.data_dir),
            )
            self._publish_metrics()
            if ready is not None:
                ready()
            self._schedule_retention()
            self._schedule_housekeeping()
            self._schedule_sweep()
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
            self.ring.prep_cancel(ud, self.loop.op(_ignore))
        for p in self.handlers.partitions.values():
            p.wake_waiters()  # parked fetches answer now (their re-handle sees _stopping)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while time.monotonic() < deadline and (
            any(c.slots or c.sending for c in self.connections)
            or any(pio.appends or pio.flushing or pio.flush_waiters for pio in self._partitions.values())
            or self._reads_in_flight
        ):
            self._pass(0.05)
        self.forwarder.fail_all()
        for conn in list(self.connections):
            conn.close()
        self.peers.close_all()
        for _ in range(100):  # let the cancels and closes complete
            if self.loop.pending_ops <= 0:
                break
            self._pass(0.01)
        self.handlers.close()
        self._publish_metrics()
        log.info("stopped cleanly")

    def _pass(self, wait_s: float) -> None:
        """One loop pass that waits at most `wait_s` (shutdown must not block on a quiet ring)."""
        self.loop.call_later(wait_s, _nothing)
        self.loop.run_once()

    def _publish_metrics(self) -> None:
        snap = self.handlers.metrics.snapshot(self.handlers.gauges)
        try:
            publish(self.config.data_dir, snap)
        except OSError as exc:
            log.warning("cannot publish metrics: %s", exc)

    def _schedule_housekeeping(self) -> None:
        """About once a second: publish this core's metrics, notice other cores' topic changes."""

        def tick() -> None:
            self._publish_metrics()
            try:
                self.handlers.refresh_topics()
            except (OSError, ValueError) as exc:
                log.error("cannot read the topic registry: %s", exc)
            if not self._stopping:
                self.loop.call_later(HOUSEKEEPING_S, tick)

        self.loop.call_later(HOUSEKEEPING_S, tick)

    def _schedule_sweep(self) -> None:
        """Every `sweep_s`: the shared sweep (idle and stalled connections), then a small recv
        buffer for each connection that grew one and has been quiet since the last sweep."""

        def tick() -> None:
            if self._stopping:
                return
            self.sweep(self.connections)
            quiet = time.monotonic() - self.sweep_s
            for conn in self.connections:
                if len(conn.recv_buf) > RECV_BUFFER_BYTES_MIN and conn.budget.last_active < quiet:
                    self.memory.freed += len(conn.recv_buf)  # malloc_trim when enough is given back
                    conn.shrink_recv_buffer()
            self.loop.call_later(self.sweep_s, tick)

        self.loop.call_later(self.sweep_s, tick)

    def _schedule_retention(self) -> None:
        def check() -> None:
            # A read in flight pins its segment (Segment.borrow_store_fd): deleting it is safe.
            deleted = self.handlers.apply_retention()
            if deleted:
                log.info("retention deleted %d segment(s)", deleted)
            self.loop.call_later(RETENTION_CHECK_S, check)

        self.loop.call_later(RETENTION_CHECK_S, check)


def _nothing() -> None:
    pass


def run(
    config: BrokerConfig,
    listeners: Sequence[socket.socket],
    ready: Callable[[], None] | None = None,
    options: UringOptions | None = None,
) -> None:
    """Run one worker on io_uring until a signal stops it. Raises `native.RingUnavailable` when
    the kernel refuses a ring; the caller then falls back to the uvloop backend."""
    global CQE_F_MORE  # noqa: PLW0603 - one value, known only once native is importable
    from native import ring as native_ring  # noqa: PLC0415 - the uvloop backend must not need it

    CQE_F_MORE = native_ring.CQE_F_MORE
    tune_malloc()
    ring = native_ring.Ring(RING_ENTRIES)
    try:
        UringServer(config, ring, listeners, options).serve(ready)
    finally:
        ring.close()
