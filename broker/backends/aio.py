"""The asyncio backend (uvloop when installed): moves bytes between sockets and the shared core.

Rules this module keeps:
- Byte moving only. What requests, outcomes, budgets, group commit and shutdown mean is
  broker/backends/backend_core.py's `BackendCore`; this module supplies its primitives: asyncio
  protocols for the connections, blocking file calls for storage operations (appends and reads
  hit the page cache; fsyncs are grouped by the shared core, started once per loop turn through
  `loop.call_soon`, which runs after all the I/O callbacks already due). A group commit's
  operations run on a small thread pool (`FLUSH_THREADS`), as the io_uring backend runs them on
  the ring: an fsync takes milliseconds, during which the loop keeps taking and writing requests
  (the log's flush plans are made for that: they name what they cover and pin what they use).
  A group commit over many partitions is one job there, one syncfs per file system instead of
  each partition's fdatasyncs (broker/backends/appends.py says when).
  Their completions come back to the loop; while stopping they run on the loop itself.
- Blocking calls (`run_blocking`, broker/core/blocking.py) run on broker/backends/blocking.py's
  daemon threads, not on an executor's (the interpreter joins those at exit, and a call hanging on
  a store would keep the worker alive); results come back with `call_soon_threadsafe`.
- A client connection is paused (`pause_reading`) while the shared core says it may not be read;
  the transport's write buffer counts in its budget (its high-water mark is 0, so that
  `resume_writing` says when it has drained).
- Listeners are made by the caller (the supervisor: they outlive a worker restart) and served
  alike; the one difference is that frames arriving on an AF_UNIX listener come from another core
  (`from_peer`: forwarded requests and topic notices).
- Forwarding: this module only opens inter-core connections and moves their bytes; which
  connection carries a forward is broker/core/forwarding.py's `PeerPool`. Likewise for TCP links
  to other brokers' cores (`open_remote`) and broker/core/remote.py's `RemoteLinks`.

The backend contract (broker/backends/uring.py keeps it too; its primitives: backend_core.py's rules):
    Server(config, listeners)                  # pre-made listening sockets, inherited from the supervisor
    run(config, listeners, ready) -> None      # serve until SIGTERM/SIGINT; ready() once all listen
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from broker.backends.backend_core import BackendCore
from broker.backends.blocking import Post
from broker.backends.connection import GatherPart, PeerStream, ServedConnection
from broker.core.config import BrokerConfig
from broker.core.limits import REMOTE_CONNECT_TIMEOUT_S
from broker.core.remote import address_label
from broker.security.tls import TLS_HANDSHAKE_TIMEOUT_S, principal_of
from broker.storage.fileio import Buffer, Op, SyncFileIO, run_ops, run_together
from broker.storage.segment import Extent
from ringlog_proto.frames import LENDING_DECODER

log = logging.getLogger(__name__)

FLUSH_THREADS = 4  # group commits of as many partitions at once (one fsync each, mostly waiting)
# The least a link's read asks for (the transport's hint is 64 KiB): a follower's fetch answer
# of ~1 MB then takes a few reads, not sixteen.
PEER_READ_BYTES = 256 * 1024
# What a client connection's read asks its decoder to lend: small at first and again once the
# connection is quiet for a sweep (its decoder holds the space lent between reads: thousands of
# idle connections cost little), grown by READ_GROWTH whenever a read fills it, up to where a
# stream of 1 MiB produces needs a few reads a request. The io_uring backend's recv buffers follow
# the same rule (native/constants.py RECV_BUFFER_BYTES_*).
READ_BYTES_MIN = 4 * 1024
READ_BYTES_MAX = 256 * 1024
READ_GROWTH = 4


class LentReads:
    """What a protocol that reads into space its decoder lends keeps: the view of the space lent
    to the read in progress. uvloop holds that view until `buffer_updated` returns, so it is let
    go of at the next `get_buffer`, or at the sweep or at close (`_let_go`)."""

    _space: memoryview | None = None

    def _let_go(self) -> bool:
        """Release the view of the decoder's space the last read was lent; whether there was one."""
        space, self._space = self._space, None
        if space is None:
            return False
        with contextlib.suppress(BufferError):  # inside `buffer_updated`: the read holds it yet
            space.release()
        return True


class Connection(ServedConnection, LentReads, asyncio.BufferedProtocol):
    """One client connection (or, `from_peer`, one from another core) on an asyncio transport.

    Once its first bytes chose a decoder that lends (native/frames.c's, ours and Kafka's), the
    transport reads straight into the decoder's space, as the io_uring backend's recvs do: a
    request's bytes are not copied into a bytes object, then into the decoder, then out of it,
    and a large body stays a view of where it arrived. The transport (uvloop's) lets go of the
    space only after `buffer_updated` returns, so the view is released at the next `get_buffer`
    (or at the sweep, or at close); the decoder takes frames meanwhile and moves nothing while it
    is held (native/frames.c, "Lending"). Until then, or with a decoder that does not lend, a read
    goes to the server's one read buffer and is fed from there before `buffer_updated` returns."""

    def __init__(self, server: Server, from_peer: bool = False) -> None:
        super().__init__(server, from_peer, "?")
        self.server: Server = server
        self.transport: asyncio.Transport | None = None
        self._reading_paused = False
        self.read_size = READ_BYTES_MIN  # what the next lent read asks for (grows, shrinks)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = self.auth.peer = (
            "core peer" if self.from_peer else str(transport.get_extra_info("peername"))
        )
        if not self.from_peer and transport.get_extra_info("ssl_object") is not None:
            cert = principal_of(transport.get_extra_info("peercert"))
            self.auth.tls_established(cert, self.server.config.sasl)
        if self.server.accepted(self):
            # High-water mark 0: `pause_writing` as soon as a reply waits in the transport,
            # `resume_writing` once it has all gone; the budget counts what waits until then.
            self.transport.set_write_buffer_limits(high=0)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.lost()
        self.closed = True
        self.closing()
        self._let_go()

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        self._let_go()
        decoder = self.decoder
        if LENDING_DECODER is not None and isinstance(decoder, LENDING_DECODER):
            self._space = space = decoder.buffer(self.read_size)
            return space
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        space = self._space
        if space is None:
            with memoryview(self.server.read_buffer) as view:
                self.received(view[:nbytes])
            return
        if nbytes == len(space) and self.read_size < READ_BYTES_MAX:
            self.read_size = min(READ_GROWTH * nbytes, READ_BYTES_MAX)
        self.received_lent(nbytes)

    def quiet(self) -> None:
        """Quiet since the last sweep: its next read asks for `READ_BYTES_MIN` again, and the
        decoder lets go of the space the last one was lent (a large allocation is shrunk to what
        it holds plus that: native/frames.c `buffer`)."""
        self.read_size = READ_BYTES_MIN
        decoder = self.decoder
        if self._let_go() and LENDING_DECODER is not None and isinstance(decoder, LENDING_DECODER):
            with contextlib.suppress(BufferError):
                decoder.buffer(READ_BYTES_MIN).release()

    def pause_writing(self) -> None:
        pass  # the memory budget counts the replies waiting (`unsent`)

    def resume_writing(self) -> None:
        self.sent_some()
        self.reading_changed()

    def write(self, buffers: Sequence[Buffer]) -> None:
        assert self.transport is not None
        self.transport.writelines(buffers)

    def unsent(self) -> int:
        if self.transport is None or self.closed:
            return 0
        return self.transport.get_write_buffer_size()

    def reading_changed(self) -> None:
        if self.transport is None or self.closed:
            return
        pause = self.paused()
        if pause != self._reading_paused:
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()
            self._reading_paused = pause

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def fileno(self) -> int | None:
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        return sock.fileno() if sock is not None else None


class PeerConnection(PeerStream, LentReads, asyncio.BufferedProtocol):
    """This core's end of one inter-core connection, or (`open_remote`, core -1) of a TCP link to
    another broker's core, on an asyncio transport.

    It reads straight into the space its link's decoder lends (`PeerLink.lend`), as the io_uring
    backend's links do: a follower's fetch answers, most of what a link carries, are then not
    copied into a bytes object, into the decoder and out of it. The transport (uvloop's) lets go
    of the space only after `buffer_updated` returns, so the view is released at the next
    `get_buffer` (or at close), not in `buffer_updated`: the decoder takes frames meanwhile and
    moves nothing while the view is held (native/frames.c, "Lending")."""

    def __init__(self, server: Server, core: int, long_poll: bool, peer: str | None = None) -> None:
        super().__init__(server, core, long_poll, peer)
        self.transport: asyncio.Transport | None = None
        self._unsent: list[Buffer] = []  # written before the connection is made
        self._own = bytearray()  # where a read goes when the decoder does not lend

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        self._let_go()
        size = max(sizehint, PEER_READ_BYTES)
        space = self.link.lend(size)
        if space is None:
            if len(self._own) != size:
                self._own = bytearray(size)
            return self._own
        self._space = space
        return space

    def buffer_updated(self, nbytes: int) -> None:
        if self._space is not None:
            self.received_lent(nbytes)
        else:
            self.received(memoryview(self._own)[:nbytes])

    def write(self, buffers: Sequence[Buffer]) -> None:
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

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(exc)

    def close(self, exc: BaseException | None = None) -> None:
        self.gone(exc)
        if self.transport is not None:
            self.transport.abort()
        self._let_go()


class Server(BackendCore):
    """One worker process (one core) on the asyncio backend, serving pre-made listeners."""

    def __init__(self, config: BrokerConfig, listeners: Sequence[socket.socket]) -> None:
        super().__init__(config)
        self.listeners = list(listeners)
        self.loop_io = SyncFileIO()
        # where a connection reads while its decoder does not lend (its first bytes, TLS's
        # Python decoders): fed to the decoder before the read's `buffer_updated` returns, so one
        # serves every connection of the loop
        self.read_buffer = bytearray(READ_BYTES_MAX)
        self._flusher = ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="flush")
        self._flushes = 0  # group commits running on `_flusher`
        self.open_core()
        self._servers: list[asyncio.AbstractServer] = []
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback)

    def call_soon(self, callback: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_soon(callback)

    end_of_turn = call_soon  # call_soon runs after the I/O callbacks already due: the turn's end

    def after_sweep(self) -> None:
        """A small read again for each connection whose reads grew and that was quiet since the
        last sweep (the io_uring backend's rule for its recv buffers)."""
        quiet = time.monotonic() - self.admission.sweep_s
        for conn in self.connections:
            if (
                isinstance(conn, Connection)
                and conn.read_size > READ_BYTES_MIN
                and conn.budget.last_active < quiet
            ):
                self.admission.memory.freed += conn.read_size  # malloc_trim when enough is given back
                conn.quiet()

    def run_ops(self, ops: Sequence[Op], done: Callable[[OSError | None], None]) -> None:
        try:
            run_ops(self.loop_io, ops)
        except OSError as exc:
            done(exc)
            return
        done(None)

    def appends_now(self, ops: Sequence[Op], conn: ServedConnection | GatherPart | None) -> bool:
        return True  # every store write is a pwritev on the loop (`run_ops`)

    def run_flush(
        self, ops: Sequence[Op], done: Callable[[OSError | None], None], alone: bool = True
    ) -> None:
        if self.stopping():  # the shutdown sequence flushes, then closes: on the loop
            self.run_ops(ops, done)
            return
        self._flushes += 1

        def finished(future: asyncio.Future[None]) -> None:
            self._flushes -= 1
            exc = future.exception()
            if exc is not None and not isinstance(exc, OSError):  # a bug: still a failed flush
                log.error("flush failed: %r", exc)
                exc = OSError(f"flush failed: {exc!r}")
            done(exc)

        future = asyncio.get_running_loop().run_in_executor(self._flusher, run_ops, self.loop_io, ops)
        future.add_done_callback(finished)

    def run_flush_together(
        self,
        flushes: Sequence[tuple[Sequence[Op], str]],
        done: Callable[[Sequence[OSError | None]], None],
    ) -> None:
        """A group commit over many partitions: one job on the flusher pool, whose syncfs calls
        (one per file system) replace the flushes' own syncs (fileio.py's `run_together`)."""
        self._flushes += 1
        io, filesystems = self.loop_io, self.filesystems

        def finished(future: asyncio.Future[tuple[list[OSError | None], int]]) -> None:
            self._flushes -= 1
            exc = future.exception()
            if exc is not None:  # a bug: every flush of the group failed
                log.error("flush failed: %r", exc)
                done([OSError(f"flush failed: {exc!r}")] * len(flushes))
                return
            done(future.result()[0])

        future = asyncio.get_running_loop().run_in_executor(
            self._flusher, run_together, io, flushes, filesystems
        )
        future.add_done_callback(finished)

    def io_pending(self) -> int:
        return self._flushes

    def threadsafe_post(self) -> Post:
        return asyncio.get_running_loop().call_soon_threadsafe

    def close_threads(self) -> None:
        """After serving: wait for a flush still running (one that outlived the shutdown grace);
        drop the results of blocking calls still running (their threads do not hold the exit)."""
        self.close_blocking()
        self._flusher.shutdown(wait=True)
        self.filesystems.close(self.loop_io)

    def read(self, extent: Extent, done: Callable[[Buffer | BaseException], None]) -> None:
        self.core.metrics.read(mapped=False)
        try:
            data = self.loop_io.pread(extent.segment.store_fd, extent.length, extent.position)
        except Exception as exc:  # becomes an error reply
            done(exc)
            return
        done(data)

    def open_peer(self, core: int, long_poll: bool) -> PeerConnection:
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

    def open_remote(self, host: str, port: int, long_poll: bool) -> PeerConnection:
        """A TCP link to another broker's core: `loop.sock_connect` in a task, bounded by
        `REMOTE_CONNECT_TIMEOUT_S`, then asyncio's TLS where the node serves TLS; what is sent
        meanwhile waits in the `PeerConnection`."""
        loop = asyncio.get_running_loop()
        pc = PeerConnection(self, -1, long_poll, address_label(host, port))

        async def connect() -> None:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    await asyncio.wait_for(loop.sock_connect(sock, (host, port)), REMOTE_CONNECT_TIMEOUT_S)
                except TimeoutError:
                    raise TimeoutError(
                        errno.ETIMEDOUT,
                        f"no connection to {pc.link.peer} within {REMOTE_CONNECT_TIMEOUT_S:g} s",
                    ) from None
                if pc.link.closed:  # given up on while it connected
                    sock.close()
                    return
                ctx = self.peer_tls_context
                if ctx is None:
                    await loop.create_connection(lambda: pc, sock=sock)
                else:  # the peer's certificate must name `host` (broker/security/tls.py)
                    await loop.create_connection(
                        lambda: pc,
                        sock=sock,
                        ssl=ctx,
                        server_hostname=host,
                        ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
                    )
            except OSError as exc:
                sock.close()
                pc.close(exc)

        task = loop.create_task(connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pc

    def request_stop(self) -> None:
        super().request_stop()
        self._stop.set()

    def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGINT/SIGTERM, then run the shared shutdown sequence."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        for sock in self.listeners:
            if sock.family == socket.AF_UNIX:  # frames from another core (forwards, notices)
                server = await loop.create_unix_server(lambda: Connection(self, from_peer=True), sock=sock)
            elif self.tls_context is not None:
                server = await loop.create_server(
                    lambda: Connection(self),
                    sock=sock,
                    ssl=self.tls_context,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
                )
            else:
                server = await loop.create_server(lambda: Connection(self), sock=sock)
            self._servers.append(server)
        backend = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio (uvloop not installed)"
        self.started(ready, len(self._servers), backend)
        await self._stop.wait()
        for wait_s in self.shutdown():
            await asyncio.sleep(wait_s)


def run(
    config: BrokerConfig, listeners: Sequence[socket.socket], ready: Callable[[], None] | None = None
) -> None:
    """Serve `listeners` as core `config.core_id` until SIGTERM/SIGINT, on uvloop when installed;
    `ready()` once every listener is served."""
    try:
        import uvloop  # noqa: PLC0415 - optional: the portable fallback is plain asyncio

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        server = Server(config, listeners)
        try:
            runner.run(server.serve(ready))
        finally:
            server.close_threads()
