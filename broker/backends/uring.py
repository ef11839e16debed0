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
  io-wq hand-off costs a durable produce ~40-60 us (uring_options.py).
- Each connection has one recv and one sendmsg in flight at most. What a pass writes to a
  connection with no sendmsg in flight is sent at the end of the pass, in one non-blocking
  `sendmsg` on the loop (as uvloop's transports send at once); only what that leaves goes to the
  ring. A connection the shared core says may not be read is simply not re-armed (single-shot
  recvs make the pause exact). Its recv size grows when a recv fills it; the sweep gives a
  quiet connection's grown size back. A client connection speaking our protocol receives
  straight into its decoder's buffer, which the decoder lends for the recv and may not move
  until the recv has completed (native/frames.c, "Lending"); the others have a buffer of their
  own.
- Ring and buffer lifetimes: `native.Ring` keeps every buffer an SQE references alive until its
  final completion; this module keeps each connection's fd open until none of its operations is
  in flight, then closes it through the ring.
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
import fcntl
import logging
import os
import select
import signal
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from broker.backends.backend_core import BackendCore
from broker.backends.blocking import Post
from broker.backends.connection import GatherPart, PeerStream, ServedConnection
from broker.backends.uring_loop import Loop, Timer, ignore
from broker.backends.uring_options import SyncPlacement, UringOptions
from broker.core.config import BrokerConfig
from broker.core.limits import REMOTE_CONNECT_TIMEOUT_S
from broker.core.partition import Partition
from broker.security.tls import TLS_HANDSHAKE_TIMEOUT_S, TlsSession
from broker.storage.fileio import Buffer, Op, Sync, SyncFileIO, Write, remaining_buffers, run_ops
from broker.storage.ring_ops import RingOps
from broker.storage.segment import Extent
from native.constants import (
    ACCEPT_RETRY_S,
    APPEND_INLINE_BYTES_MAX,
    CQE_F_MORE,
    RECV_BUFFER_BYTES_MAX,
    RECV_BUFFER_BYTES_MIN,
    RECV_BUFFER_GROWTH,
    RING_ENTRIES,
    SEND_IOVECS_MAX,
    SPLICE_MIN_BYTES,
    SPLICE_PIPE_BYTES,
    SPLICE_PIPES_MAX,
    WRITEV_IOVECS_MAX,
)
from ringlog_proto.frames import LENDING_DECODER

if TYPE_CHECKING:
    from native.ring import Ring

log = logging.getLogger(__name__)

Written = Callable[[OSError | None], None]

_DONTWAIT = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


class _Pipes:
    """The worker's pipes for sending mapped records without copying them (`_Stream._splice`):
    at most `SPLICE_PIPES_MAX`, made on first need, each lent to one send at a time and given
    back empty; one that failed mid-send is closed with what it held."""

    def __init__(
        self,
        is_mapped: Callable[[object], bool],
        vmsplice: Callable[[int, memoryview], int],
        splice_to_socket: Callable[[int, int, int], int],
        *,
        on: bool = True,
    ) -> None:
        self.on = on  # `--fetch-sends splice`; off, mapped records are copied like any buffer
        self.is_mapped = is_mapped
        self.vmsplice = vmsplice
        self.splice_to_socket = splice_to_socket
        self._free: list[tuple[int, int]] = []
        self._made = 0

    def take(self) -> tuple[int, int] | None:
        if self._free:
            return self._free.pop()
        if self._made >= SPLICE_PIPES_MAX:
            return None
        try:
            pipe = os.pipe2(os.O_CLOEXEC)
        except OSError:  # out of descriptors: the records are copied instead
            return None
        with contextlib.suppress(OSError):  # the default size (64 KiB) only takes more rounds
            fcntl.fcntl(pipe[1], fcntl.F_SETPIPE_SZ, SPLICE_PIPE_BYTES)
        self._made += 1
        return pipe

    def give(self, pipe: tuple[int, int]) -> None:
        self._free.append(pipe)

    def drop(self, pipe: tuple[int, int]) -> None:
        self._made -= 1
        for fd in pipe:
            os.close(fd)

    def close(self) -> None:
        while self._free:
            self.drop(self._free.pop())


def _mapped_at(queue: list[Buffer], is_mapped: Callable[[object], bool]) -> int:
    """Index of the first buffer in `queue` worth splicing (mapped, `SPLICE_MIN_BYTES` or more), or -1."""
    for i, buf in enumerate(queue):
        if len(buf) >= SPLICE_MIN_BYTES and is_mapped(buf):
            return i
    return -1


class _Stream:
    """A stream socket on the ring: one recv at a time, one sendmsg at a time, a close that waits
    for both. Subclasses say what received bytes mean (`received`) and when to stop reading."""

    def __init__(self, server: UringServer, fd: int) -> None:
        self.ring = server.ring
        self.loop = server.loop
        self.fd = fd
        self.closed = False
        self.recv_size = RECV_BUFFER_BYTES_MIN  # what the next recv asks for (grows, shrinks)
        self.buf = bytearray(RECV_BUFFER_BYTES_MIN)  # what a recv reads into, unless lent (`_recv_into`)
        self.recv_buf: bytearray | memoryview = self.buf  # what the recv in flight reads into
        self.receiving = False  # inside `received`: arm the next recv after it, not during
        self.recv_ud = 0  # user_data of the recv in flight, 0 if none
        self.sending = False
        self.send_queue: list[Buffer] = []
        self.unsent_bytes = 0
        self._fd_closed = False
        self._sock: socket.socket | None = None  # made by the first `_flush`
        self._flushing = False  # a `_flush` is due at the end of this pass
        self.pipes = server.pipes
        self._shrinking = False  # the recv in flight is being cancelled to re-arm with a small buffer

    def paused(self) -> bool:
        return False

    def taken_all(self) -> bool:
        """Whether what was received holds no request still to take (a reply written now is the
        last that it makes). False where unknown: the reply waits for the end of the pass."""
        return False

    def received(self, data: memoryview) -> None:
        raise NotImplementedError

    def failed(self, res: int) -> None:
        """The peer closed (res 0) or the connection failed (-errno); `close()` follows."""

    def closing(self) -> None:
        """Called once, when the connection is closed for whatever reason."""

    def sent_some(self) -> None:
        """A sendmsg completed (`unsent_bytes` is less)."""

    # ------------------------------------------------------------------------- receive

    def arm_recv(self) -> None:
        if self.closed or self.recv_ud or self.receiving or self.paused():
            return
        self.recv_ud = ud = self.loop.op(self._recv_done)
        self.recv_buf = buf = self._recv_into(self.recv_size)
        self.ring.prep_recv(self.fd, buf, ud)

    def _recv_into(self, size: int) -> bytearray | memoryview:
        """The buffer the next recv reads into: the stream's own (`_arrived` hands its bytes on)."""
        if len(self.buf) != size:
            self.buf = bytearray(size)
        return self.buf

    def _arrived(self, buf: bytearray | memoryview, res: int) -> None:
        """`res` bytes arrived at the start of `buf`, the recv's buffer."""
        self.received(memoryview(buf)[:res])

    def _recv_ended(self, buf: bytearray | memoryview) -> None:
        """The recv into `buf` ended without bytes for `_arrived` (cancelled, failed, closed)."""

    def shrink_recv_buffer(self) -> None:
        """Quiet connection: arm its recv with a `RECV_BUFFER_BYTES_MIN` buffer instead of the
        grown one (cancel the recv in flight; `_recv_done` re-arms on its -ECANCELED)."""
        self.recv_size = RECV_BUFFER_BYTES_MIN
        if len(self.buf) > RECV_BUFFER_BYTES_MIN:
            self.buf = bytearray(RECV_BUFFER_BYTES_MIN)
        if self.recv_ud and not self._shrinking and len(self.recv_buf) > RECV_BUFFER_BYTES_MIN:
            self._shrinking = True
            self.ring.prep_cancel(self.recv_ud, self.loop.op(ignore))

    def _recv_done(self, res: int, flags: int) -> None:
        self.recv_ud = 0
        shrinking, self._shrinking = self._shrinking, False
        # The bytes are in the buffer this recv was armed with, whatever `self.buf` is now; and
        # no recv is armed while they are being read (replies queued meanwhile call arm_recv).
        buf = self.recv_buf
        if res == -errno.ECANCELED and shrinking and not self.closed:
            self._recv_ended(buf)
            self.arm_recv()
            return
        if res <= 0:
            self._recv_ended(buf)
            if res < 0 and res not in (-errno.ECONNRESET, -errno.ECANCELED, -errno.EPIPE):
                log.info("recv from %s failed: %s", self, os.strerror(-res))
            if not self.closed:
                self.failed(res)
            self.close()
            return
        if self.closed:
            self._recv_ended(buf)
            self._maybe_release()
            return
        size = len(buf)
        if res == size < RECV_BUFFER_BYTES_MAX and self.recv_size == size:
            self.recv_size = min(RECV_BUFFER_GROWTH * res, RECV_BUFFER_BYTES_MAX)
        self.receiving = True
        try:
            self._arrived(buf, res)
        finally:
            self.receiving = False
        self.arm_recv()

    # ------------------------------------------------------------------------- send

    def write(self, buffers: Sequence[Buffer]) -> None:
        if self.closed or not buffers:
            return
        if not (self.sending or self.send_queue) and self.receiving and self.taken_all():
            # The last reply of what was received, with nothing queued before it: what `_flush`
            # would do with it at once (below), without the queue on the way.
            total = sum(map(len, buffers))
            if len(buffers) <= SEND_IOVECS_MAX and (total < SPLICE_MIN_BYTES or not self.pipes.on):
                try:
                    sent = self._socket().sendmsg(buffers, (), _DONTWAIT)
                except OSError:
                    sent = 0  # left for the ring's sendmsg to meet again, as in `_flush`
                if sent == total:
                    self.sent_some()
                    return
                self.send_queue = list(remaining_buffers(tuple(buffers), sent))
                self.unsent_bytes += total - sent
                if sent:
                    self.sent_some()
                self._send()
                return
        self.send_queue.extend(buffers)
        self.unsent_bytes += sum(map(len, buffers))
        if self.sending:
            return
        if self.receiving and self.taken_all():
            # The last reply the bytes of this recv make (the others, if any, are queued before
            # it): send now, not at the end of the pass. The wait for a reply is the client's
            # latency, and what the pass does after it (the recv re-armed, the loop's own
            # bookkeeping) can as well happen while the reply travels.
            self._flush()
        elif not self._flushing:
            self._flushing = True
            self.loop.at_end_of_pass(self._flush)

    def _flush(self) -> None:
        """End of the pass that queued bytes with no sendmsg in flight: send them at once, as an
        event loop's transport does, in one non-blocking `sendmsg` for all the replies of the
        pass. They usually fit the socket's buffer: then there is no sendmsg SQE, no completion
        and no second pass of the loop for them (one-record acks=1 produce, A/B on the 2-CPU VM:
        230-264 -> 155-203 us of broker CPU per request). What it leaves goes to the ring, in
        order; a failure is left for the ring's sendmsg to meet again, so that it takes the one
        failure path."""
        self._flushing = False
        queue = self.send_queue
        if self.closed or self.sending or not queue:
            return
        # what goes before records to splice (none in less than one splice's worth of bytes)
        pipes = self.pipes
        cut = _mapped_at(queue, pipes.is_mapped) if pipes.on and self.unsent_bytes >= SPLICE_MIN_BYTES else -1
        head = queue if cut < 0 else queue[:cut]
        if head and len(head) <= SEND_IOVECS_MAX:
            try:
                sent = self._socket().sendmsg(head, (), _DONTWAIT if cut < 0 else _DONTWAIT | socket.MSG_MORE)
            except OSError:
                sent = 0
            if sent:
                self.unsent_bytes -= sent
                if not self.unsent_bytes:
                    self.send_queue = []
                    self.sent_some()
                    if not self.recv_ud:
                        self.arm_recv()  # a connection paused on unsent bytes reads again
                    return
                self.send_queue = list(remaining_buffers(tuple(queue), sent))
                self.sent_some()
        self._send()

    def _socket(self) -> socket.socket:
        """A socket object on this stream's fd, for the sends made on the loop (`_flush`);
        detached, never closed by Python, when the ring closes the fd."""
        sock = self._sock
        if sock is None:
            sock = self._sock = socket.socket(fileno=self.fd)
        return sock

    def _send(self) -> None:
        queue = self.send_queue
        cut = _mapped_at(queue, self.pipes.is_mapped) if self.pipes.on else -1
        if cut == 0:
            view = queue[0]
            assert isinstance(view, memoryview)  # mapped: a view of a segment's pages
            done = self._splice(view)
            if done is False:  # the rest waits in the pipe for room (`_splice_out`)
                return
            if done:
                self.sent_some()
                self._send_more()
                return
        end = min(cut, SEND_IOVECS_MAX) if cut > 0 else SEND_IOVECS_MAX  # up to records to splice
        if len(queue) > end:
            batch, self.send_queue = queue[:end], queue[end:]
        else:
            batch, self.send_queue = queue, []
        self.sending = True
        length = sum(map(len, batch))
        ud = self.loop.op(lambda res, flags: self._sent(res, batch, length))
        self.ring.prep_sendmsg(self.fd, batch, ud)

    def _splice(self, view: memoryview) -> bool | None:
        """Send `view` (records of a mapped segment, at the head of the queue) by reference: its
        pages into a pipe (vmsplice), then from the pipe to the socket (splice), both on the loop
        without waiting: neither copies the bytes. What the socket has no room for stays in the
        pipe until a poll SQE says the socket has room (`_splice_out`).

        True: sent whole. False: the rest waits in the pipe for room. None, and nothing done:
        no pipe is free or the pages cannot be spliced, and the caller copies them with a sendmsg
        as it would any buffer."""
        pipes = self.pipes
        pipe = pipes.take()
        if pipe is None:
            return None
        try:
            n = pipes.vmsplice(pipe[1], view)
        except OSError:
            n = 0
        if n <= 0:
            pipes.give(pipe)  # still empty
            return None
        if n < len(view):  # more than the pipe holds: the rest goes next, the same way
            self.send_queue[0] = view[n:]
        else:
            del self.send_queue[0]
        try:
            sent = pipes.splice_to_socket(pipe[0], self.fd, n)
        except OSError:
            sent = 0  # `_writable` meets the failure again, and takes the one failure path
        self.unsent_bytes -= sent
        if sent == n:
            pipes.give(pipe)
            return True
        self._splice_out(pipe, n - sent)
        return False

    def _splice_out(self, pipe: tuple[int, int], length: int) -> None:
        """`length` bytes wait in `pipe` for room in the socket: a poll SQE says when there is,
        and `_writable` splices again (a splice SQE would be an io-wq hand-off per reply)."""
        self.sending = True
        ud = self.loop.op(lambda res, flags: self._writable(res, pipe, length))
        self.ring.prep_poll(self.fd, select.POLLOUT, ud)

    def _writable(self, res: int, pipe: tuple[int, int], length: int) -> None:
        self.sending = False
        sent = 0
        if res >= 0:
            try:
                sent = self.pipes.splice_to_socket(pipe[0], self.fd, length)
            except OSError as exc:
                res = -(exc.errno or errno.EIO)
        if res < 0:  # what the pipe holds is lost with it: the connection is closed anyway
            self.pipes.drop(pipe)
            self._send_failed(res, "splice")
            return
        self.unsent_bytes -= sent
        if sent < length:  # still no room for the rest: it stays first in line
            if sent:
                self.sent_some()
            self._splice_out(pipe, length - sent)
            return
        self.pipes.give(pipe)
        self.sent_some()
        self._send_more()

    def _sent(self, res: int, batch: list[Buffer], length: int) -> None:
        self.sending = False
        if res < 0:
            self._send_failed(res, "send")
            return
        self.unsent_bytes -= res
        if res < length:  # a short send: the rest goes first next time
            self.send_queue[:0] = remaining_buffers(tuple(batch), res)
        self.sent_some()
        self._send_more()

    def _send_more(self) -> None:
        """A send completed: a closed stream lets go of its fd, an open one sends what is queued
        or, with nothing queued, reads again (a connection paused on unsent bytes)."""
        if self.closed:
            self._maybe_release()
        elif self.send_queue:
            self._send()
        else:
            self.arm_recv()

    def _send_failed(self, res: int, what: str) -> None:
        if res not in (-errno.ECONNRESET, -errno.EPIPE, -errno.ECANCELED):
            log.info("%s to %s failed: %s", what, self, os.strerror(-res))
        if not self.closed:
            self.failed(res)
        self.close()

    # ------------------------------------------------------------------------- TLS

    def tls_received(
        self,
        tls: TlsSession,
        data: bytes | memoryview,
        receive: Callable[[bytes], None],
        refused: Callable[[ssl.SSLError], None],
        established: Callable[[], None] | None = None,
    ) -> None:
        """Ciphertext read into `tls`: what it must send goes out (handshake records; on a broken
        handshake the alert that says why, after `refused(exc)`, then the close), the handshake's
        end calls `established`, and the plaintext goes to `receive` until the stream closes."""
        was_done = tls.handshake_done
        try:
            plain, eof = tls.feed(data)
        except ssl.SSLError as exc:
            refused(exc)
            out = tls.pending()
            if out:
                _Stream.write(self, [out])
            self.close()
            return
        out = tls.pending()
        if out:
            _Stream.write(self, [out])
        if tls.handshake_done and not was_done and established is not None:
            established()
        for chunk in plain:
            if self.closed:
                return
            receive(chunk)
        if eof:
            self.close()

    # ------------------------------------------------------------------------- close

    def close(self) -> None:
        """Stop serving this connection; its fd is closed once no operation on it is in flight.
        What was written and not yet sent still goes (as a sendmsg the close waits for)."""
        if not self.closed:
            if self.send_queue and not self.sending:
                self._send()
            self.closed = True
            self.closing()
            if self.recv_ud:
                self.ring.prep_cancel(self.recv_ud, self.loop.op(ignore))
        self._maybe_release()

    def _maybe_release(self) -> None:
        if self._fd_closed or self.recv_ud or self.sending:
            return
        self._fd_closed = True
        if self._sock is not None:
            self._sock.detach()
            self._sock = None
        self.ring.prep_close(self.fd, self.loop.op(ignore))


class Connection(ServedConnection, _Stream):
    """A client connection (or, `from_peer`, one from another core) on the ring. Without TLS its
    bytes go straight to the decoder (`ServedConnection.received`) and its replies straight to
    the send queue (`_Stream.write`): no wrapper in between on every request; `TlsConnection`
    is the one with TLS."""

    tls: TlsSession | None = None

    def __init__(self, server: UringServer, fd: int, peer: str, from_peer: bool = False) -> None:
        ServedConnection.__init__(self, server, from_peer, peer)
        _Stream.__init__(self, server, fd)

    def __str__(self) -> str:
        return self.peer

    def failed(self, res: int) -> None:
        self.lost()

    def unsent(self) -> int:
        return self.unsent_bytes

    def reading_changed(self) -> None:
        # arm_recv is a no-op inside `received` (`_recv_done` arms after it), with a recv in
        # flight or while paused; the first two are tested here, a call saved on every reply
        if not (self.receiving or self.recv_ud):
            self.arm_recv()

    def _recv_into(self, size: int) -> bytearray | memoryview:
        """Straight into the decoder when it lends its space (ours, once the first bytes chose
        it; native/frames.c): the bytes are not copied from a recv buffer into the decoder's,
        a pass over every byte received (64 KiB batch ingest, two runs of 8 rounds alternated:
        1345 -> 1382 and 1412 -> 1440 MB/s, 0.736 -> 0.724 and 0.706 -> 0.690 CPU-s per GB).
        Kafka's decoder (Python) and TLS connections keep the stream's own buffer."""
        decoder = self.decoder
        if type(decoder) is LENDING_DECODER:
            return decoder.buffer(size)
        return _Stream._recv_into(self, size)

    def _arrived(self, buf: bytearray | memoryview, res: int) -> None:
        if type(buf) is memoryview:  # lent by the decoder: the view goes before the frames are taken
            buf.release()
            self.received_lent(res)
        else:
            self.received(memoryview(buf)[:res])

    def _recv_ended(self, buf: bytearray | memoryview) -> None:
        if type(buf) is memoryview:
            buf.release()

    def abort(self) -> None:
        self.close()

    def fileno(self) -> int | None:
        return self.fd


class TlsConnection(Connection):
    """A client connection with TLS (module rules): what it receives is decrypted before the
    decoder sees it, and what it writes is encrypted, once the handshake is done."""

    tls: TlsSession

    def __init__(self, server: UringServer, fd: int, peer: str, ctx: ssl.SSLContext) -> None:
        super().__init__(server, fd, peer)
        self.tls = TlsSession(ctx)
        server.loop.call_later(TLS_HANDSHAKE_TIMEOUT_S, self._handshake_deadline)

    # what arrives is ciphertext: read into the stream's own buffer, decrypted, then fed
    _recv_into = _Stream._recv_into
    _arrived = _Stream._arrived
    _recv_ended = _Stream._recv_ended

    def received(self, data: bytes | memoryview) -> None:
        self.tls_received(self.tls, data, self._plain, self._tls_refused, self._tls_established)

    def _plain(self, data: bytes) -> None:
        ServedConnection.received(self, data)

    def _tls_refused(self, exc: ssl.SSLError) -> None:
        self.server.limit_log.warning("tls", "closing %s: TLS: %s", self.peer, exc.reason or exc)

    def _tls_established(self) -> None:
        self.auth.tls_established(self.tls.peer_principal(), self.server.config.sasl)

    def write(self, buffers: Sequence[Buffer]) -> None:
        if not self.closed and buffers:
            _Stream.write(self, [self.tls.encrypt(buffers)])

    def _handshake_deadline(self) -> None:
        if not self.tls.handshake_done and not self.closed:
            self.server.limit_log.warning(
                "tls", "closing %s: no TLS handshake within %gs", self.peer, TLS_HANDSHAKE_TIMEOUT_S
            )
            self.close()


class RemoteConnection(PeerStream, _Stream):
    """This core's end of a TCP link to another broker's core (broker/core/remote.py), on the
    ring: a connect SQE with a linked timeout (`REMOTE_CONNECT_TIMEOUT_S`), then the same recv and
    sendmsg as any stream; where the node serves TLS, a client `TlsSession` between the two (the
    handshake is bounded by the deadlines of what waits for it, like the connect). What is
    written before the connection (and its handshake) is up waits here."""

    def __init__(self, server: UringServer, fd: int, address: tuple[str, int], long_poll: bool) -> None:
        host, port = address
        PeerStream.__init__(
            self, server, -1, long_poll, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        )
        _Stream.__init__(self, server, fd)
        self.connected = False
        self.connect_ud = 0  # the connect in flight, 0 if none
        self.early: list[Buffer] = []  # written before the connection was up
        self.error: BaseException | None = None
        ctx = server.peer_tls_context
        self.tls = TlsSession(ctx, server_hostname=host) if ctx is not None else None

    def __str__(self) -> str:
        return self.link.peer

    def connect(self, address: tuple[str, int]) -> None:
        """Raises ValueError (not an IP literal) or OSError (the ring refused the SQE)."""
        ud = self.loop.op(self._connected)
        self.ring.prep_connect(self.fd, address, ud, link=True)
        self.connect_ud = ud
        self.ring.prep_link_timeout(REMOTE_CONNECT_TIMEOUT_S, self.loop.op(ignore))

    def _connected(self, res: int, flags: int) -> None:
        self.connect_ud = 0
        if self.closed:
            self._maybe_release()
            return
        if res < 0:
            if res == -errno.ECANCELED:  # the linked timeout cancelled it
                self.error = TimeoutError(
                    errno.ETIMEDOUT, f"no connection to {self} within {REMOTE_CONNECT_TIMEOUT_S:g} s"
                )
            else:
                self.error = OSError(-res, f"cannot connect to {self}: {os.strerror(-res)}")
            self.close()
            return
        self.connected = True
        if self.tls is not None:
            _Stream.write(self, [self.tls.start()])  # what was written waits for the handshake
        else:
            early, self.early = self.early, []
            _Stream.write(self, early)
        self.arm_recv()

    def received(self, data: bytes | memoryview) -> None:
        if self.tls is None:
            PeerStream.received(self, data)
        else:
            self.tls_received(self.tls, data, self._plain, self._tls_refused, self._tls_established)

    def _plain(self, data: bytes) -> None:
        PeerStream.received(self, data)

    def _tls_refused(self, exc: ssl.SSLError) -> None:  # also a certificate that does not verify
        self.error = exc  # what the link's requests fail with, and what RemoteLinks logs

    def _tls_established(self) -> None:
        """What waited for the handshake goes, encrypted."""
        assert self.tls is not None
        early, self.early = self.early, []
        if early:
            _Stream.write(self, [self.tls.encrypt(early)])

    def write(self, buffers: Sequence[Buffer]) -> None:
        if self.closed or not buffers:
            return
        tls = self.tls
        if not self.connected or (tls is not None and not tls.handshake_done):
            self.early.extend(buffers)
        elif tls is not None:
            _Stream.write(self, [tls.encrypt(buffers)])
        else:
            _Stream.write(self, buffers)

    def paused(self) -> bool:
        return not self.connected

    def failed(self, res: int) -> None:
        self.error = OSError(-res, os.strerror(-res)) if res < 0 else None  # None: closed by the remote

    def closing(self) -> None:
        self.gone(self.error)

    def close(self) -> None:
        if not self.closed and self.connect_ud:
            self.ring.prep_cancel(self.connect_ud, self.loop.op(ignore))
        _Stream.close(self)

    def _maybe_release(self) -> None:
        if not self.connect_ud:  # the connect still references the fd
            _Stream._maybe_release(self)


class PeerConnection(PeerStream, _Stream):
    """This core's end of one inter-core connection, on the ring."""

    def __init__(self, server: UringServer, fd: int, core: int, long_poll: bool) -> None:
        PeerStream.__init__(self, server, core, long_poll)
        _Stream.__init__(self, server, fd)

    def __str__(self) -> str:
        return f"core {self.core}"

    def closing(self) -> None:
        self.gone()


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
        self.loop = Loop(ring, options.busy_poll_us)
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
        self.pipes = _Pipes(is_mapped, vmsplice, splice_to_socket, on=options.fetch_sends == "splice")
        self._store_writes: dict[Partition, list[tuple[Write, Written]]] = {}
        self._accepting = True
        self._standing: dict[int, str] = {}  # user_data of multishot accepts, the signal and wake reads
        self._wake_fd = -1  # the eventfd threads write to wake the loop (made on first use)
        self._wake_buf = bytearray(8)
        self._from_threads: deque[Callable[[], None]] = deque()
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
        ops = list(ops)
        placement = self.sync_placement
        inline_sync = placement.inline(alone and self.loop.quiet())
        started = time.monotonic_ns()

        def on_loop(op: Op) -> bool:
            return self._inline_write(op) or (inline_sync and isinstance(op, Sync))

        def finished(exc: OSError | None) -> None:
            placement.took(time.monotonic_ns() - started)
            done(exc)

        def resume(j: int) -> None:
            # after a ring operation, in a later pass: whether the loop is idle there is unknown
            nonlocal inline_sync
            inline_sync = False
            step(j)

        def step(i: int) -> None:
            j = i
            while j < len(ops) and not on_loop(ops[j]):
                j += 1
            if j > i:
                self.ring_ops.run(ops[i:j], lambda exc: finished(exc) if exc is not None else resume(j))
                return
            while i < len(ops) and on_loop(ops[i]):
                op = ops[i]
                try:
                    if isinstance(op, Sync):
                        self._sync_inline(op.fd)
                        self.core.metrics.synced_inline()
                    else:
                        run_ops(self.loop_io, [op])
                except OSError as exc:
                    finished(exc)
                    return
                i += 1
            if i == len(ops):
                finished(None)
            else:
                step(i)

        step(0)
        # Started before the end of the pass (`after_flush(now=True)`): the device works while
        # the pass finishes, not after its submit. At the end of a pass this costs one syscall
        # more, per flush. Only sooner: what this submit cannot take, the pass's own submit does.
        if self.ring.sq_ready:
            with contextlib.suppress(OSError):
                self.ring.submit()

    def _inline_write(self, op: Op) -> bool:
        return isinstance(op, Write) and op.length <= self.inline_write_max

    def read(self, extent: Extent, done: Callable[[bytes | BaseException], None]) -> None:
        """From the page cache's own pages when they are all there (`Segment.mapped`, asked with
        mincore): no copy, no buffer, no SQE, and no wait for the disk. Otherwise, or if the file
        cannot be mapped, a read on the ring, which may wait for the disk without holding the loop."""
        try:
            view = extent.segment.mapped(extent, self._map_file)
        except Exception:  # the ring's read meets the same cause and reports it
            view = None
        mapped = view is not None and self._resident(view)
        self.core.metrics.read(mapped)
        if mapped:
            done(view)  # type: ignore[arg-type]  # a read-only buffer: what replies carry
            return
        self.ring_ops.read(extent, done)

    def io_pending(self) -> int:
        return self.loop.pending_ops

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
        finally:
            self.close_blocking()
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
