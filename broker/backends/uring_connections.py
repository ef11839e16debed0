"""The io_uring backend's connections: what the bytes of its streams mean.

Rules this module keeps:
- Each class is a `RingStream` (broker/backends/uring_stream.py: the bytes on the ring) and one
  of the shared sides of broker/backends/connection.py: `Connection` a client's connection (or,
  `from_peer`, another core's) that the core serves, `TlsConnection` a client's with TLS,
  `RemoteConnection` this core's end of a TCP link to another broker's core, `PeerConnection` its
  end of a link to another core of this node.
- Nothing stands between the bytes and the decoder on the common path: a connection without TLS
  receives into its decoder (our protocol's straight into the space the decoder lends,
  native/frames.c "Lending"; Kafka's through the stream's own buffer) and writes straight into
  its stream's send queue. TLS sits between them only in the classes that have it, which read
  ciphertext into the stream's own buffer.
- A remote link's connect is a connect SQE with a linked timeout (`REMOTE_CONNECT_TIMEOUT_S`);
  what is written before the link (and its TLS handshake) is up waits in the connection.
- The connections know the worker that runs them as a `UringCore`, declared here since
  broker/backends/uring.py imports this module. Importable without the compiled bindings.
"""

from __future__ import annotations

import errno
import os
import ssl
from collections.abc import Sequence
from typing import Protocol

from broker.backends.connection import PeerStream, ServedConnection, ServingCore
from broker.backends.uring_loop import ignore
from broker.backends.uring_stream import RingHost, RingStream
from broker.core.limits import REMOTE_CONNECT_TIMEOUT_S
from broker.security.tls import TLS_HANDSHAKE_TIMEOUT_S, TlsSession
from broker.storage.fileio import Buffer
from ringlog_proto.frames import LENDING_DECODER


class UringCore(ServingCore, RingHost, Protocol):
    """What a connection uses of the worker that runs it (broker/backends/uring.py's
    `UringServer`): the core that serves it and the ring its stream moves bytes on."""

    peer_tls_context: ssl.SSLContext | None  # a remote link's TLS, where the node serves TLS


class LendingStream(RingStream):
    """A stream that receives straight into its decoder's space where the decoder lends it
    (`_lend`: native/frames.c, "Lending"), else into the stream's own buffer: the bytes are not
    copied from a recv buffer into the decoder's, and a large body stays a view of where it
    arrived. Client connections and links (a follower's fetch answers) alike."""

    def _lend(self, size: int) -> memoryview | None:
        """`size` bytes of the decoder's space for the next recv, or None where it does not lend."""
        raise NotImplementedError

    def received_lent(self, n: int) -> None:
        raise NotImplementedError

    def _recv_into(self, size: int) -> bytearray | memoryview:
        space = self._lend(size)
        return space if space is not None else RingStream._recv_into(self, size)

    def _arrived(self, buf: bytearray | memoryview, res: int) -> None:
        if type(buf) is memoryview:  # lent by the decoder: the view goes before the frames are taken
            buf.release()
            self.received_lent(res)
        else:
            self.received(memoryview(buf)[:res])

    def _recv_ended(self, buf: bytearray | memoryview) -> None:
        if type(buf) is memoryview:
            buf.release()


class Connection(ServedConnection, LendingStream):
    """A client connection (or, `from_peer`, one from another core) on the ring. Without TLS its
    bytes go straight to the decoder (`ServedConnection.received`) and its replies straight to
    the send queue (`RingStream.write`): no wrapper in between on every request; `TlsConnection`
    is the one with TLS."""

    tls: TlsSession | None = None

    def __init__(self, server: UringCore, fd: int, peer: str, from_peer: bool = False) -> None:
        ServedConnection.__init__(self, server, from_peer, peer)
        RingStream.__init__(self, server, fd)

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

    def _lend(self, size: int) -> memoryview | None:
        """The decoder lends its space once the first bytes chose it (native/frames.c's, ours and
        Kafka's alike): a pass over every byte received saved (64 KiB batch ingest, two runs of
        8 rounds alternated: 1345 -> 1382 and 1412 -> 1440 MB/s, 0.736 -> 0.724 and 0.706 ->
        0.690 CPU-s per GB). The first bytes, Python's decoders and TLS connections keep the
        stream's own buffer."""
        decoder = self.decoder
        if LENDING_DECODER is not None and isinstance(decoder, LENDING_DECODER):
            return decoder.buffer(size)
        return None

    def abort(self) -> None:
        self.close()

    def fileno(self) -> int | None:
        return self.fd


class TlsConnection(Connection):
    """A client connection with TLS (module rules): what it receives is decrypted before the
    decoder sees it, and what it writes is encrypted, once the handshake is done."""

    tls: TlsSession

    def __init__(self, server: UringCore, fd: int, peer: str, ctx: ssl.SSLContext) -> None:
        super().__init__(server, fd, peer)
        self.tls = TlsSession(ctx)
        server.loop.call_later(TLS_HANDSHAKE_TIMEOUT_S, self._handshake_deadline)

    # what arrives is ciphertext: read into the stream's own buffer, decrypted, then fed
    _recv_into = RingStream._recv_into
    _arrived = RingStream._arrived
    _recv_ended = RingStream._recv_ended

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
            RingStream.write(self, [self.tls.encrypt(buffers)])

    def _handshake_deadline(self) -> None:
        if not self.tls.handshake_done and not self.closed:
            self.server.limit_log.warning(
                "tls", "closing %s: no TLS handshake within %gs", self.peer, TLS_HANDSHAKE_TIMEOUT_S
            )
            self.close()


class RemoteConnection(PeerStream, LendingStream):
    """This core's end of a TCP link to another broker's core (broker/core/remote.py), on the
    ring: a connect SQE with a linked timeout (`REMOTE_CONNECT_TIMEOUT_S`), then the same recv and
    sendmsg as any stream; where the node serves TLS, a client `TlsSession` between the two (the
    handshake is bounded by the deadlines of what waits for it, like the connect). What is
    written before the connection (and its handshake) is up waits here."""

    def __init__(self, server: UringCore, fd: int, address: tuple[str, int], long_poll: bool) -> None:
        host, port = address
        PeerStream.__init__(
            self, server, -1, long_poll, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        )
        RingStream.__init__(self, server, fd)
        self.connected = False
        self.connect_ud = 0  # the connect in flight, 0 if none
        self.early: list[Buffer] = []  # written before the connection was up
        self.error: BaseException | None = None
        ctx = server.peer_tls_context
        self.tls = TlsSession(ctx, server_hostname=host) if ctx is not None else None

    def __str__(self) -> str:
        return self.link.peer

    def _lend(self, size: int) -> memoryview | None:
        """A follower's fetch answers, most of what a link carries, cost no copy into the decoder
        and none out of it (in a follower's profile before: 31% of its samples, that memmove).
        With TLS the stream's own buffer takes the ciphertext."""
        return self.link.lend(size) if self.tls is None else None

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
            RingStream.write(self, [self.tls.start()])  # what was written waits for the handshake
        else:
            early, self.early = self.early, []
            RingStream.write(self, early)
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
            RingStream.write(self, [self.tls.encrypt(early)])

    def write(self, buffers: Sequence[Buffer]) -> None:
        if self.closed or not buffers:
            return
        tls = self.tls
        if not self.connected or (tls is not None and not tls.handshake_done):
            self.early.extend(buffers)
        elif tls is not None:
            RingStream.write(self, [tls.encrypt(buffers)])
        else:
            RingStream.write(self, buffers)

    def paused(self) -> bool:
        return not self.connected

    def failed(self, res: int) -> None:
        self.error = OSError(-res, os.strerror(-res)) if res < 0 else None  # None: closed by the remote

    def closing(self) -> None:
        self.gone(self.error)

    def close(self) -> None:
        if not self.closed and self.connect_ud:
            self.ring.prep_cancel(self.connect_ud, self.loop.op(ignore))
        RingStream.close(self)

    def _maybe_release(self) -> None:
        if not self.connect_ud:  # the connect still references the fd
            RingStream._maybe_release(self)


class PeerConnection(PeerStream, LendingStream):
    """This core's end of one inter-core connection, on the ring."""

    def __init__(self, server: UringCore, fd: int, core: int, long_poll: bool) -> None:
        PeerStream.__init__(self, server, core, long_poll)
        RingStream.__init__(self, server, fd)

    def __str__(self) -> str:
        return f"core {self.core}"

    def _lend(self, size: int) -> memoryview | None:
        return self.link.lend(size)

    def closing(self) -> None:
        self.gone()
