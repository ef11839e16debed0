"""A stream socket on the io_uring ring: the bytes every connection of the io_uring backend moves.

Rules this module keeps:
- Each stream has one recv and one sendmsg in flight at most. What a pass writes to a stream with
  no sendmsg in flight is sent at the end of the pass, in one non-blocking `sendmsg` on the loop
  (as uvloop's transports send at once); only what that leaves goes to the ring. When the pass
  wrote to several streams, their sends go to the ring together instead, in one submission
  (`PassSends`): a send that wakes a process on the worker's CPU does not hand it the CPU before
  the other streams' bytes have left. A stream that
  may not be read is simply not re-armed (single-shot recvs make the pause exact). Its recv size
  grows when a recv fills it; the sweep gives a quiet stream's grown size back
  (`shrink_recv_buffer`).
- What the bytes mean is a subclass's (broker/backends/uring_connections.py): `received`, and
  where a recv reads into (`_recv_into`: a stream's own buffer, or a decoder's lent space that may
  not move until the recv has completed, native/frames.c "Lending").
- Lifetimes: `native.Ring` keeps every buffer an SQE references alive until its final
  completion; a stream keeps its fd open until none of its operations is in flight, then closes
  it through the ring.
- With `--fetch-sends splice`, records of a mapped segment go to the socket by reference, through
  one of the worker's `SplicePipes`; a pipe that failed mid-send is closed, never lent again.
- A stream knows the worker that runs it only as a `RingHost` (its ring, loop and pipes):
  broker/backends/uring.py imports this module, never the reverse. Importable without the
  compiled bindings.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import select
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from broker.backends.uring_loop import Loop, ignore
from broker.security.tls import TlsSession
from broker.storage.fileio import Buffer, remaining_buffers
from native.constants import (
    RECV_BUFFER_BYTES_MAX,
    RECV_BUFFER_BYTES_MIN,
    RECV_BUFFER_GROWTH,
    SEND_IOVECS_MAX,
    SPLICE_MIN_BYTES,
    SPLICE_PIPE_BYTES,
    SPLICE_PIPES_MAX,
)

if TYPE_CHECKING:
    from native.ring import Ring

log = logging.getLogger("broker.backends.uring")  # the backend's lines, as before this module was apart

_DONTWAIT = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


class SplicePipes:
    """The worker's pipes for sending mapped records without copying them (`RingStream._splice`):
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


class PassSends:
    """The streams a pass wrote to outside their receive (a woken long poll's answer, a disk
    read's, a peer link's request), sent at the end of the pass: one stream with a `sendmsg` on
    the loop (no SQE, no completion, no second pass), several with a `sendmsg` SQE each, which the
    next pass's `io_uring_enter` submits together.

    Why together: each `sendmsg` on the loop is a system call, and its return to user space is
    where the kernel hands the CPU to a process the send woke on this CPU. A leader waking its
    two followers' parked fetches sent to the follower on its own CPU, then waited for that
    follower's whole append (~200 us) before the other follower, on the other CPU, got its bytes
    (3 nodes on 2 CPUs, one acks=all record at a time, timestamps in each process: the second
    follower's records arrived 547-697 us after the wake; submitted together, 354-511 us, both
    sent before the CPU changes hands; docs/PERFORMANCE.md)."""

    __slots__ = ("_due", "_loop")

    def __init__(self, loop: Loop) -> None:
        self._loop = loop
        self._due: list[RingStream] = []

    def due(self, stream: RingStream) -> None:
        """`stream` has bytes to send at the end of this pass (once per pass: its `_flushing`)."""
        if not self._due:
            self._loop.at_end_of_pass(self._send)
        self._due.append(stream)

    def _send(self) -> None:
        due, self._due = self._due, []
        if len(due) == 1:
            due[0]._flush()
            return
        for stream in due:
            stream._flush_on_ring()


class RingHost(Protocol):
    """What a stream uses of the worker that runs it (broker/backends/uring.py's `UringServer`),
    declared here since that module imports this one."""

    ring: Ring
    loop: Loop
    pipes: SplicePipes
    pass_sends: PassSends


class RingStream:
    """A stream socket on the ring: one recv at a time, one sendmsg at a time, a close that waits
    for both. Subclasses say what received bytes mean (`received`) and when to stop reading."""

    def __init__(self, server: RingHost, fd: int) -> None:
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
        self.pass_sends = server.pass_sends
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
            self.pass_sends.due(self)

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

    def _flush_on_ring(self) -> None:
        """End of a pass that wrote to other streams too: what is queued goes to the ring, to be
        submitted with theirs (`PassSends`)."""
        self._flushing = False
        if self.closed or self.sending or not self.send_queue:
            return
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
                RingStream.write(self, [out])
            self.close()
            return
        out = tls.pending()
        if out:
            RingStream.write(self, [out])
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
