"""The io_uring backend: one ring per worker process moves the bytes and runs the storage operations.

Rules this module keeps:
- Byte moving only. What requests, outcomes, budgets, group commit and shutdown mean is
  broker/backends/backend_core.py's `BackendCore`; this module supplies its primitives as ring
  operations: accept (multishot), connect (links to other brokers' cores), recv, sendmsg
  (vectored), close on the sockets, and the storage operations through broker/storage/ring_ops.py
  (writev at an offset, fdatasync, read at an offset). No blocking system call runs on the loop's
  hot path but small appends, idle syncs (below) and non-blocking sends: cold paths (opening a
  partition, recovery, creating a topic, retention) stay synchronous, as in the uvloop backend,
  because they are rare and must finish before the request they serve.
- The loop (broker/backends/uring_loop.py) runs continuations only after reaping a batch, then
  timers, then callbacks; the end of a pass submits the store writes gathered in it (one writev
  for the back-to-back appends of a partition) and starts the shared group commit. With
  `--append-writes auto` (the default) a gathered write up to `APPEND_INLINE_BYTES_MAX` is a
  pwritev on the loop instead: a blocking call on the hot path, a page-cache copy, where the
  ring would hand it to an io-wq thread on the same CPU (ext4 cannot write buffered without
  blocking) at the price of a context switch and a slower copy (uring_options.py, constants.py).
  An append of that size to a partition with none in flight, the last request of what its
  connection sent, is not even gathered: it is written at once, made visible and answered in
  one go (`appends_now`, the shared core's `_append`).
  The other blocking call: with `--flush-syncs auto` (the default) a flush's fdatasync runs on
  the loop when nothing else waits for it (`Loop.quiet`) and the last flush was fast; the ring's
  io-wq hand-off costs a durable produce ~40-60 us (uring_options.py). A group commit over many
  partitions syncs each file system once with syncfs instead (`run_flush_together`), which the
  ring has no operation for: on a thread, never on the loop.
- The connections are broker/backends/uring_connections.py's (a client's, with or without TLS;
  links to other cores and to other brokers' cores), each on broker/backends/uring_stream.py's
  `RingStream`: one recv and one sendmsg in flight at most, sends on the loop first, fds closed
  through the ring once nothing on them is in flight (the rules are there). This module accepts
  and opens them, and the sweep gives a quiet one's grown recv buffer back.
- Threads hand work to the loop (`threadsafe_post`, for `run_blocking`'s results) through a deque
  and an eventfd with one standing read on the ring: made by the first blocking call, so a core
  that makes none has neither and its passes cost nothing more; the read's completion drains the
  deque, in the order threads appended to it, and is armed again.
- Every ring, loop and buffer limit is in native/constants.py. Importable without the compiled
  bindings (the ring itself is made in `run`), though only the worker that chose io_uring does.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker.backends.backend_core import BackendCore
from broker.backends.blocking import BlockingPool, Post
from broker.backends.connection import GatherPart, ServedConnection
from broker.backends.uring_connections import Connection, PeerConnection, RemoteConnection, TlsConnection
from broker.backends.uring_loop import Loop, Timer, ignore
from broker.backends.uring_options import SyncPlacement, UringOptions
from broker.backends.uring_stream import PassSends, SplicePipes
from broker.core.config import BrokerConfig
from broker.core.partition import Partition
from broker.storage.fileio import Buffer, Op, Sync, SyncFileIO, Write, run_ops, run_together
from broker.storage.ring_ops import RingOps
from broker.storage.segment import Extent
from native.constants import (
    ACCEPT_RETRY_S,
    APPEND_INLINE_BYTES_MAX,
    CQE_F_MORE,
    RECV_BUFFER_BYTES_MIN,
    RING_ENTRIES,
    WRITEV_IOVECS_MAX,
)

if TYPE_CHECKING:
    from native.ring import Ring

log = logging.getLogger(__name__)

Written = Callable[[OSError | None], None]

SYNCFS_THREADS = 2  # group commits with syncfs at once (each one system call, mostly waiting)


def _nothing() -> None:
    pass


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
        self.options = options = options or UringOptions()
        self.ring = ring
        self.loop = Loop(ring, options.busy_poll_us, self._poll_paused)
        self.ring_ops = RingOps(ring, self.loop.worker_op)
        self.listeners = list(listeners)
        self.inline_appends = options.append_writes == "inline"
        # "auto": a gathered store write up to this many bytes is a pwritev on the loop
        self.inline_write_max = APPEND_INLINE_BYTES_MAX if options.append_writes == "auto" else -1
        self.sync_placement = SyncPlacement(options.flush_syncs)
        self.loop_io = SyncFileIO()
        from native.ring import (  # noqa: PLC0415 - the bindings, as `run` loads them
            fdatasync_polled,
            is_mapped,
            map_file,
            resident,
            splice_to_socket,
            vmsplice,
        )

        # An fdatasync on the loop (`--flush-syncs`) keeps the CPU busy while the loop busy-polls
        # anyway: a halted vCPU is slow to wake for the disk (native/_build.py, uring_options.py).
        self._sync_inline = fdatasync_polled if options.busy_poll_us else self.loop_io.fdatasync
        self._map_file = map_file
        self._resident = resident
        self.pipes = SplicePipes(is_mapped, vmsplice, splice_to_socket, on=options.fetch_sends == "splice")
        self.pass_sends = PassSends(self.loop)
        self._store_writes: dict[Partition, list[tuple[Write, Written]]] = {}
        self._accepting = True
        self._standing: dict[int, str] = {}  # user_data of multishot accepts, the signal and wake reads
        self._wake_fd = -1  # the eventfd threads write to wake the loop (made on first use)
        self._wake_buf = bytearray(8)
        self._from_threads: deque[Callable[[], None]] = deque()
        self._syncfs_pool: BlockingPool | None = None  # `run_flush_together`'s threads
        self._syncfs_jobs = 0  # group commits running there
        self.open_core()

    # ------------------------------------------------------------------------- the core's primitives

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        return self.loop.call_later(delay_s, callback)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def end_of_turn(self, callback: Callable[[], None]) -> None:
        self.loop.at_end_of_pass(callback)

    def run_ops(self, ops: Sequence[Op], done: Written) -> None:
        self.ring_ops.run(ops, done)

    def run_flush(self, ops: Sequence[Op], done: Written, alone: bool = True) -> None:
        """A group commit's operations, in order. The sync of the active segment's store runs on
        the loop or on the ring, as `--flush-syncs` places it (uring_options.py: on the loop when
        nothing else waits for it, `alone` included, and none of the flush's operations went to
        the ring before it); other syncs on the ring. A small write (the active segment's index
        entries, written after its store's sync and never synced themselves) is a page-cache copy
        on the loop once what precedes it completed, as appends are: on the ring, it went to an
        io-wq thread after the fdatasync, a second hand-off in every durable produce's wait
        (strace: ~65 us of the ~450)."""
        _FlushRun(self, list(ops), done, self.sync_placement.inline(alone and self.loop.quiet())).step(0)
        # Started before the end of the pass (`after_flush(now=True)`): the device works while
        # the pass finishes, not after its submit. At the end of a pass this costs one syscall
        # more, per flush. Only sooner: what this submit cannot take, the pass's own submit does.
        if self.ring.sq_ready:
            with contextlib.suppress(OSError):
                self.ring.submit()

    def run_flush_together(
        self,
        flushes: Sequence[tuple[Sequence[Op], str]],
        done: Callable[[Sequence[OSError | None]], None],
    ) -> None:
        """A group commit over many partitions, with one syncfs per file system instead of the
        flushes' own syncs (fileio.py's `run_together`): the ring has no syncfs, so it runs on a
        thread of the core's (`SYNCFS_THREADS`), one job per group, and its result comes back
        through `threadsafe_post`. The loop never waits for it; the shutdown sequence does
        (`io_pending`), draining what threads post (`_drain_posted`)."""
        pool = self._syncfs_pool
        if pool is None:
            name = f"syncfs-core{self.config.core_id}"
            pool = self._syncfs_pool = BlockingPool(self.threadsafe_post(), SYNCFS_THREADS, name)
        self._syncfs_jobs += 1
        io, filesystems = self.loop_io, self.filesystems

        def finished(result: tuple[list[OSError | None], int] | BaseException) -> None:
            self._syncfs_jobs -= 1
            if isinstance(result, BaseException):  # a bug: every flush of the group failed
                log.error("flush failed: %r", result)
                done([OSError(f"flush failed: {result!r}")] * len(flushes))
                return
            done(result[0])

        pool.submit(lambda: run_together(io, flushes, filesystems), finished)

    def _poll_paused(self) -> None:
        """The loop's busy poll paused beside a CPU-bound task (`uring_loop.YIELD_LOST_S`)."""
        self.core.metrics.poll_paused()  # the core is made after the loop (`open_core`)

    def _inline_write(self, op: Op) -> bool:
        return isinstance(op, Write) and op.length <= self.inline_write_max

    def read(self, extent: Extent, done: Callable[[Buffer | BaseException], None]) -> None:
        """From the page cache's own pages when they are all there (`Segment.mapped`, asked with
        mincore): no copy, no buffer, no SQE, and no wait for the disk. Otherwise, or if the file
        cannot be mapped, a read on the ring, which may wait for the disk without holding the loop."""
        try:
            view = extent.segment.mapped(extent, self._map_file)
        except Exception:  # the ring's read meets the same cause and reports it
            view = None
        if view is not None and self._resident(view):
            self.core.metrics.read(True)
            done(view)  # a read-only buffer: what replies carry
            return
        self.core.metrics.read(False)
        self.ring_ops.read(extent, done)

    def io_pending(self) -> int:
        return self.loop.pending_ops + self._syncfs_jobs

    def appends_now(self, ops: Sequence[Op], conn: ServedConnection | GatherPart | None) -> bool:
        """`--append-writes inline`, or "auto" and a lone store write it would copy on the loop
        anyway (what `_submit_write_run` does with a run of one) that is the last request of
        what its connection sent: one that more of the received bytes follow waits for the end
        of the pass, where the back-to-back appends of a pipelining producer go out in one
        pwritev (64 KiB batch ingest, 8 rounds alternated: 3.7% more MB/s at 4% less CPU per
        GB than a pwritev each; the general path's bookkeeping included)."""
        if self.inline_appends:
            return True
        # `_inline_write`, without its call: this runs on every produce
        return (
            len(ops) == 1
            and isinstance(op := ops[0], Write)
            and op.length <= self.inline_write_max
            and (conn is None or conn.taken_all())
        )

    def run_append(self, partition: Partition, ops: Sequence[Op], done: Written) -> None:
        if self.inline_appends:  # a pwritev on the loop itself (uring_options.py says why)
            try:
                run_ops(self.loop_io, ops)
            except OSError as exc:
                done(exc)
                return
            done(None)
        elif len(ops) == 1 and isinstance(ops[0], Write):
            # The common case, one store write: gathered with the others of this pass (below).
            if not self._store_writes:
                self.loop.at_end_of_pass(self._submit_store_writes)
            self._store_writes.setdefault(partition, []).append((ops[0], done))
        else:
            self.run_ops(ops, done)

    def _submit_store_writes(self) -> None:
        """End of a pass: the store writes of every append prepared in it, as few writevs as can be.

        A pipelining producer's batches arrive several per recv and land back to back in the
        store, so one writev (and, on a file system that punts buffered writes to io-wq, one
        kernel-thread hand-off instead of several) carries them all, up to `WRITEV_IOVECS_MAX`
        buffers. Each append still completes, and becomes visible, on its own terms.
        """
        batches, self._store_writes = self._store_writes, {}
        for items in batches.values():
            op, done = items[0]
            fd, start, end = op.fd, op.offset, op.offset + op.length
            buffers, waiting = list(op.buffers), [done]
            for op, done in items[1:]:
                if op.fd != fd or op.offset != end or len(buffers) + len(op.buffers) > WRITEV_IOVECS_MAX:
                    self._submit_write_run(Write(fd, tuple(buffers), start, end - start), waiting)
                    fd, start, end = op.fd, op.offset, op.offset
                    buffers, waiting = [], []
                buffers += op.buffers
                waiting.append(done)
                end += op.length
            self._submit_write_run(Write(fd, tuple(buffers), start, end - start), waiting)

    def _submit_write_run(self, op: Write, waiting: list[Written]) -> None:
        """One write of the appends of `waiting`, back to back in one file."""

        def written(exc: OSError | None) -> None:
            for done in reversed(waiting):  # last first: the first to be told makes them all visible
                done(exc)

        if op.length <= self.inline_write_max:  # the copy costs less than an io-wq hand-off
            try:
                run_ops(self.loop_io, [op])
            except OSError as exc:
                written(exc)
                return
            written(None)
            return
        self.run_ops([op], written)

    def threadsafe_post(self) -> Post:
        if self._wake_fd < 0:  # the first caller: blocking calls' pool or the syncfs threads
            self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._arm_wake()
        return self._post

    def _post(self, callback: Callable[[], None]) -> None:
        """Any thread: run `callback` on the loop (appended first, so the read that the write
        completes always finds it)."""
        self._from_threads.append(callback)
        os.eventfd_write(self._wake_fd, 1)

    def _arm_wake(self) -> None:
        ud = self.loop.op(self._woken)
        self._standing[ud] = "wake"
        self.ring.prep_read(self._wake_fd, self._wake_buf, 0, ud)

    def _woken(self, res: int, flags: int) -> None:
        self._standing = {k: v for k, v in self._standing.items() if v != "wake"}
        if self._accepting:  # else stop_accepting cancelled it: the shutdown sequence polls
            self._arm_wake()
        self._drain_posted()

    def _drain_posted(self) -> None:
        posted = self._from_threads
        for _ in range(len(posted)):  # what comes meanwhile has written the eventfd again
            posted.popleft()()

    def after_sweep(self) -> None:
        """A small recv buffer again for each connection that grew one and was quiet since the
        last sweep."""
        quiet = time.monotonic() - self.admission.sweep_s
        for conn in self.connections:
            assert isinstance(conn, Connection)
            if conn.recv_size > RECV_BUFFER_BYTES_MIN and conn.budget.last_active < quiet:
                self.admission.memory.freed += conn.recv_size  # malloc_trim when enough is given back
                conn.shrink_recv_buffer()

    # ------------------------------------------------------------------------- connections

    def open_peer(self, core: int, long_poll: bool) -> PeerConnection | None:
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

    def open_remote(self, host: str, port: int, long_poll: bool) -> RemoteConnection | None:
        """A TCP link to another broker's core: a connect SQE, never a blocking connect."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        except OSError as exc:
            log.warning("cannot open a socket to %s:%d: %s", host, port, exc)
            return None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            return None
        rc = RemoteConnection(self, sock.detach(), (host, port), long_poll)
        try:
            rc.connect((host, port))
        except (OSError, ValueError) as exc:
            log.warning("cannot connect to %s: %s", rc, exc)
            rc.closed = rc._fd_closed = True
            os.close(rc.fd)
            return None
        return rc

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
        ctx = self.tls_context
        if ctx is None or from_peer:
            conn = Connection(self, fd, peer, from_peer)
        else:
            conn = TlsConnection(self, fd, peer, ctx)
        if self.accepted(conn):
            conn.arm_recv()

    def stop_accepting(self) -> None:
        self._accepting = False
        for ud in list(self._standing):  # closing a listener would not end an accept in flight
            self.ring.prep_cancel(ud, self.loop.op(ignore))

    # ------------------------------------------------------------------------- lifecycle

    def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGINT/SIGTERM, then run the shared shutdown sequence."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        wake_buf = bytearray(64)

        def arm_signal_read() -> None:
            ud = self.loop.op(signalled)
            self._standing[ud] = "signal"
            self.ring.prep_read(wake_r, wake_buf, 0, ud)

        def signalled(res: int, flags: int) -> None:
            self._standing = {k: v for k, v in self._standing.items() if v != "signal"}
            if not self.stopping():
                arm_signal_read()

        old_handlers = {
            sig: signal.signal(sig, lambda signum, frame: self.request_stop())
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            for listener in self.listeners:
                self._accept(listener)
            arm_signal_read()
            self.started(ready, len(self.listeners), "io_uring")
            loop = self.loop
            while not self.stopping():
                loop.run_once()
            for wait_s in self.shutdown():
                # One pass that waits at most `wait_s` (shutdown must not block on a quiet ring).
                loop.call_later(wait_s, _nothing)
                loop.run_once()
                self._drain_posted()  # the wake-up read is cancelled: a group's syncfs ends here
        finally:
            self.close_blocking()
            if self._syncfs_pool is not None:
                self._syncfs_pool.close()
            self.filesystems.close(self.loop_io)
            if self._wake_fd >= 0:
                os.close(self._wake_fd)
                self._wake_fd = -1
            self.pipes.close()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(old_wakeup)
            os.close(wake_r)
            os.close(wake_w)


def run(
    config: BrokerConfig,
    listeners: Sequence[socket.socket],
    ready: Callable[[], None] | None = None,
    options: UringOptions | None = None,
) -> None:
    """Run one worker on io_uring until a signal stops it. Raises `native.RingUnavailable` when
    the kernel refuses a ring; the caller then falls back to the uvloop backend."""
    from native.ring import Ring  # noqa: PLC0415 - the compiled bindings, only when serving

    ring = Ring(RING_ENTRIES)
    try:
        UringServer(config, ring, listeners, options).serve(ready)
    finally:
        ring.close()


class _FlushRun:
    """One group commit's operations, in order (`UringServer.run_flush`): those on the loop run
    there, a run of the others goes to the ring and the rest resumes when it completes.

    An object, not closures naming each other: `step` and its `resume` had made a reference cycle
    in every flush, so each durable produce's wait (its append, its answer, its partition's
    pending produce) lived on until the cyclic collector freed it."""

    __slots__ = ("done", "inline_sync", "ops", "server", "started", "synced_inline")

    def __init__(self, server: UringServer, ops: list[Op], done: Written, inline_sync: bool) -> None:
        self.server = server
        self.ops = ops
        self.done = done
        self.inline_sync = inline_sync
        self.synced_inline = False
        self.started = time.monotonic_ns()

    def _on_loop(self, op: Op) -> bool:
        return self.server._inline_write(op) or (self.inline_sync and isinstance(op, Sync))

    def _finished(self, exc: OSError | None) -> None:
        self.server.sync_placement.took(time.monotonic_ns() - self.started, self.synced_inline)
        self.done(exc)

    def _resume(self, j: int, exc: OSError | None) -> None:
        """After a ring operation, in a later pass: whether the loop is idle there is unknown."""
        if exc is not None:
            self._finished(exc)
            return
        self.inline_sync = False
        self.step(j)

    def step(self, i: int) -> None:
        ops, server = self.ops, self.server
        j = i
        while j < len(ops) and not self._on_loop(ops[j]):
            j += 1
        if j > i:
            server.ring_ops.run(ops[i:j], lambda exc: self._resume(j, exc))
            return
        while i < len(ops) and self._on_loop(ops[i]):
            op = ops[i]
            try:
                if isinstance(op, Sync):
                    self.synced_inline = True
                    server._sync_inline(op.fd)
                    server.core.metrics.synced_inline()
                else:
                    run_ops(server.loop_io, [op])
            except OSError as exc:
                self._finished(exc)
                return
            i += 1
        if i == len(ops):
            self._finished(None)
        else:
            self.step(i)
