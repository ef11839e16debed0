"""The asyncio backend (uvloop when installed): moves bytes between sockets and `Handlers`.

Rules this module keeps:
- No request logic here. Each connection feeds a `FrameDecoder`; each frame goes to
  `Handlers.handle`; the `Outcome` is carried out with blocking file calls (appends and reads hit
  the page cache; fsyncs are grouped, below) and the reply is queued.
- Replies leave each connection in request order, whatever order they complete in: a long-poll
  fetch holds back the replies pipelined behind it.
- Group commit: every acks=durable produce of one loop turn waits for one flush per partition,
  run at the end of that turn (`loop.call_soon` runs after all the I/O callbacks already due).
- Limits (broker/backends/shared.py keeps the accounting): a client connection over its budget of bytes in
  flight, or on a core over its budget, is not read (`pause_reading`) until memory is released;
  the transport's write buffer counts in that budget (its high-water mark is 0, so that
  `resume_writing` says when it has drained). Idle and stalled connections are closed by the sweep.
- A frame that cannot be delimited (`ProtocolError`) closes that connection, and only it.
- Listeners are made by the caller (the supervisor: they outlive a worker restart) and served
  alike; the one difference is that frames arriving on an AF_UNIX listener come from another core
  (`Handlers.handle(frame, from_peer=True)`: forwarded requests and topic notices).
- Forwarding: this module only opens inter-core connections and moves their bytes; which
  connection carries a forward (one per peer core, one per forwarded long poll) is
  broker/core/forwarding.py's `PeerPool`, shared with the io_uring backend.

The backend contract (broker/backends/uring.py keeps it too):
    Server(config, listeners)                  # pre-made listening sockets, inherited from the supervisor
    run(config, listeners, ready) -> None      # serve until SIGTERM/SIGINT; ready() once all listen
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import cast

from broker.backends.shared import BackendCore, ConnectionBudget, ReplyTarget, Slot, tune_malloc
from broker.core.config import BrokerConfig
from broker.core.forwarding import NO_DEADLINE, Done, Forwarder, PeerLink, PeerPool
from broker.core.handlers import Handlers
from broker.core.metrics import publish
from broker.core.outcomes import Append, Read, Reply, Silent
from broker.core.partition import Partition
from broker.storage.fileio import SyncFileIO, run_ops
from ringlog_proto.frames import Frame, FrameDecoder, ProtocolError
from ringlog_proto.messages import Acks

log = logging.getLogger(__name__)

RETENTION_CHECK_S = 30.0
SHUTDOWN_GRACE_S = 10.0
HOUSEKEEPING_S = 1.0  # metrics snapshot published, topics.json checked for other cores' changes
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection


class Connection(asyncio.Protocol):
    """One client connection (or, `from_peer`, one from another core). Owned by the event loop's thread."""

    def __init__(self, server: Server, from_peer: bool = False) -> None:
        self.server = server
        self.from_peer = from_peer
        self.decoder = FrameDecoder(server.config.limits.max_request_bytes)
        self.transport: asyncio.Transport | None = None
        self.slots: list[Slot] = []
        self.closed = False
        self.peer = "?"
        self.budget = ConnectionBudget(time.monotonic())
        self._reading_paused = False
        self._aborted = False
        self._forward_blocked = 0  # peers whose forward limit this connection waits on

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = "core peer" if self.from_peer else str(transport.get_extra_info("peername"))
        if not self.server.admit_connection(self):
            self.drop()
            return
        # High-water mark 0: `pause_writing` as soon as a reply waits in the transport (after a
        # write the socket did not take whole), `resume_writing` once it has all gone; the
        # memory budget counts what waits (see fill) until then.
        self.transport.set_write_buffer_limits(high=0)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.server.forget(self)
        if self.decoder.buffered and not self._aborted:
            log.info("client %s went away mid-frame (%d bytes unread)", self.peer, self.decoder.buffered)

    def data_received(self, data: bytes) -> None:
        self.budget.last_active = time.monotonic()
        self.decoder.feed(data)
        self.resume()

    def resume(self) -> None:
        try:
            self.server.take_requests(self)
        except ProtocolError as exc:
            self.server.limit_log.warning("protocol error", "closing %s: %s", self.peer, exc)
            self.abort()
            return
        self._update_reading()

    def fill(self, slot: Slot, outcome: Reply | Silent) -> None:
        """A reply is ready: send every reply at the head of the queue that is ready too."""
        slot.done = True
        server = self.server
        if isinstance(outcome, Reply):
            slot.buffers = outcome.buffers
            size = sum(len(b) for b in outcome.buffers)
            server.handlers.metrics.reply(size, slot.started_ns)
            change = server.replied(slot, size)
        else:
            change = server.replied(slot, 0)
        if self.closed or self.transport is None:
            return
        ready = 0
        released = 0
        out: list[bytes] = []
        for s in self.slots:
            if not s.done:
                break
            out.extend(s.buffers)
            released += s.charge
            ready += 1
        if ready:
            del self.slots[:ready]
            if out:
                self.transport.writelines(out)
            server.queued(self, released, self.transport.get_write_buffer_size(), change)
            self._update_reading()
        elif change:
            server.queued(self, 0, self.budget.queued, change)

    def abort(self) -> None:
        self.closed = True
        self._aborted = True
        if self.transport is not None:
            self.transport.abort()

    def drop(self) -> None:
        """Close at once for a limit: reset the connection (no TIME_WAIT left for a flood of them)."""
        if self.transport is not None:
            sock = self.transport.get_extra_info("socket")
            if sock is not None and not self.from_peer:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        self.abort()

    def waits_for_forward(self) -> bool:
        return self._forward_blocked > 0

    def pause_writing(self) -> None:
        pass  # the memory budget counts the replies waiting (see fill)

    def resume_writing(self) -> None:
        self.budget.last_active = time.monotonic()
        self.server.queued(self, 0, 0)
        self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self.closed:
            return
        pause = self._forward_blocked > 0 or not self.server.may_read(self)
        if pause and not self._reading_paused:
            self.transport.pause_reading()
        elif not pause and self._reading_paused:
            self.transport.resume_reading()
        self._reading_paused = pause

    def wait_for_forward_room(self, forwarder: Forwarder, core: int) -> None:
        """Stop reading until forwards to `core` are below their limit again."""
        self._forward_blocked += 1
        self._update_reading()

        def resume() -> None:
            self._forward_blocked -= 1
            self._update_reading()

        forwarder.when_room(core, resume)


class PeerConnection(asyncio.Protocol):
    """This core's end of one inter-core connection: moves bytes for a `PeerLink`."""

    def __init__(self, server: Server, core: int, long_poll: bool) -> None:
        self.server = server
        self.core = core
        self.long_poll = long_poll
        self.link = PeerLink(core)
        self.transport: asyncio.Transport | None = None
        self._unsent: list[bytes] = []  # written before the connection is made

    def send(self, frame: Frame, done: Done | None, deadline: float = NO_DEADLINE) -> None:
        buffers = self.link.request(frame, done, deadline)
        if self.transport is None:
            self._unsent.extend(buffers)
        else:
            self.transport.writelines(buffers)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.link.closed:  # the pool gave up on it while it connected (its core went down)
            self.transport.abort()
            return
        if self._unsent:
            self.transport.writelines(self._unsent)
            self._unsent = []

    def data_received(self, data: bytes) -> None:
        try:
            self.link.receive(data)
        except ProtocolError as exc:
            log.error("core %d sent bytes that are not frames (%s): dropping the connection", self.core, exc)
            self.close(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(exc)

    def close(self, exc: BaseException | None = None) -> None:
        self.server.peer_gone(self)
        if self.transport is not None:
            self.transport.abort()
        self.link.lost(exc)


class Server(BackendCore):
    """One worker process (one core) on the asyncio backend, serving pre-made listeners."""

    def __init__(self, config: BrokerConfig, listeners: Sequence[socket.socket]) -> None:
        super().__init__(config)
        self.config = config
        self.listeners = list(listeners)
        self.io = SyncFileIO()
        self.handlers = Handlers(config)
        self.peers = PeerPool.for_config(config, self._open_peer, self.stopping, self.call_later)
        self.forwarder = Forwarder(self.handlers, self.peers.send_to_core, self.call_later)
        self.handlers.gauges = {
            "inflight_requests": lambda: sum(len(c.slots) for c in self.connections if not c.from_peer),
            "pending_forwards": lambda: self.forwarder.pending,
            "parked_long_polls": lambda: self.parked_long_polls,
            "commit_waiters": lambda: sum(len(w) for w in self._flush_waiting.values()),
            "client_connections": lambda: self.client_connections,
            "bytes_in_flight": lambda: self.memory.used,
        }
        self.connections: set[Connection] = set()
        self._flush_waiting: dict[
            Partition, list[tuple[Callable[[], None], Callable[[BaseException], None]]]
        ] = {}
        self._flush_scheduled = False
        self._stopping: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------- outcomes

    def _read(self, outcome: Read, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        try:
            extent = outcome.extent
            data = self.io.pread(extent.segment.store_fd, extent.length, extent.position)
            reply = outcome.finish(data)
        except Exception as exc:  # becomes an error reply
            reply = self.handlers.error_reply(frame, exc)
        conn.fill(slot, reply)

    # ------------------------------------------------------------------------- inter-core I/O

    def _open_peer(self, core: int, long_poll: bool) -> PeerConnection:
        loop = asyncio.get_running_loop()
        pc = PeerConnection(self, core, long_poll)
        address = self.config.peer_addresses[core]

        async def connect() -> None:
            # The socket is made here, not by create_unix_connection: libuv takes a path as a C
            # string, which cannot hold an abstract address (it starts with a NUL byte).
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
                await loop.create_unix_connection(lambda: pc, sock=sock)
            except OSError as exc:
                sock.close()
                log.warning("cannot reach core %d: %s", core, exc)
                pc.close(exc)

        task = loop.create_task(connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pc

    def peer_gone(self, pc: PeerConnection) -> None:
        self.peers.gone(pc)

    def _append(self, outcome: Append, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        log_ = outcome.partition.log
        try:
            run_ops(self.io, outcome.pending.ops)
        except OSError as exc:
            log.error("append to %s failed: %s", outcome.pending.segment.store_path, exc)
            log_.abort_append(outcome.pending)
            conn.fill(slot, outcome.fail(exc))
            return
        reply = outcome.complete()
        if outcome.acks != Acks.DURABLE:
            conn.fill(slot, reply)
            return
        self._after_flush(
            outcome.partition,
            lambda: conn.fill(slot, reply),
            lambda exc: conn.fill(slot, outcome.fail(exc)),
        )

    def _after_flush(
        self, partition: Partition, done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        self._flush_waiting.setdefault(partition, []).append((done, failed))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._group_commit)

    def _group_commit(self) -> None:
        """One flush per partition for every durable produce of this loop turn."""
        self._flush_scheduled = False
        waiting, self._flush_waiting = self._flush_waiting, {}
        for partition, callbacks in waiting.items():
            log_ = partition.log
            plan = None
            try:
                plan = log_.prepare_flush()
                run_ops(self.io, plan.ops)
                log_.complete_flush(plan)
            except Exception as exc:  # every waiter learns of it
                if isinstance(exc, OSError):
                    log_.fail_flush(exc, plan)
                log.error("flush of %s failed: %s", log_.directory, exc)
                for _, failed in callbacks:
                    failed(exc)
                continue
            self.handlers.metrics.flushed(len(callbacks))
            for done, _ in callbacks:
                done()

    def stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback)

    def call_soon(self, callback: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_soon(callback)

    # ------------------------------------------------------------------------- lifecycle

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGINT/SIGTERM; then stop accepting, answer in-flight requests, flush, close."""
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        servers: list[asyncio.AbstractServer] = []
        for sock in self.listeners:
            if sock.family == socket.AF_UNIX:
                servers.append(
                    await loop.create_unix_server(lambda: Connection(self, from_peer=True), sock=sock)
                )
            else:
                servers.append(await loop.create_server(lambda: Connection(self), sock=sock))
        backend = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio (uvloop not installed)"
        self.handlers.metrics.backend = backend.split(maxsplit=1)[0]
        log.info(
            "core %d serving %d listener(s) (data dir %s, backend %s)",
            self.config.core_id,
            len(servers),
            os.path.abspath(self.config.data_dir),
            backend,
        )
        self._publish_metrics()
        if ready is not None:
            ready()
        retention = loop.create_task(self._retention_loop())
        housekeeping = loop.create_task(self._housekeeping_loop())
        sweeping = loop.create_task(self._sweep_loop())
        await self._stopping.wait()
        log.info("shutting down: no new connections, answering in-flight requests")
        for server in servers:
            server.close()
        retention.cancel()
        housekeeping.cancel()
        sweeping.cancel()
        for p in self.handlers.partitions.values():
            p.wake_waiters()  # parked fetches answer now (their re-handle sees _stopping)
        await self._drain()
        if self._flush_scheduled:
            self._group_commit()
        self.forwarder.fail_all()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        self.peers.close_all()
        self.handlers.close()
        self._publish_metrics()
        log.info("stopped cleanly")

    def _publish_metrics(self) -> None:
        try:
            publish(self.config.data_dir, self.handlers.metrics.snapshot(self.handlers.gauges))
        except OSError as exc:
            log.warning("cannot publish metrics: %s", exc)

    async def _housekeeping_loop(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            self._publish_metrics()
            try:
                self.handlers.refresh_topics()
            except (OSError, ValueError) as exc:
                log.error("cannot read the topic registry: %s", exc)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            self.sweep(self.connections)

    async def _drain(self) -> None:
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_GRACE_S
        while any(c.slots for c in self.connections) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(RETENTION_CHECK_S)
            deleted = self.handlers.apply_retention()
            if deleted:
                log.info("retention deleted %d segment(s)", deleted)


def run(
    config: BrokerConfig, listeners: Sequence[socket.socket], ready: Callable[[], None] | None = None
) -> None:
    """Serve `listeners` as core `config.core_id` until SIGTERM/SIGINT, on uvloop when installed;
    `ready()` once every listener is served."""
    if not tune_malloc():
        log.info("glibc malloc tuning unavailable; large requests will cost more page faults")
    try:
        import uvloop  # noqa: PLC0415 - optional: the portable fallback is plain asyncio

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(Server(config, listeners).serve(ready))
