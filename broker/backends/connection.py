"""The connections a core serves and the links it opens: frames in, replies out in request order.

Rules this module keeps:
- `ServedConnection` is the request side of a connection (a client's or, `from_peer`, another
  core's), `PeerStream` this core's end of a link to another core; a backend subclasses them and
  moves the bytes (broker/backends/backend_core.py says which primitives it supplies). They know
  the core that serves them as a `ServingCore`: the core imports this module, never the reverse.
- One port, every client protocol: a client connection's first bytes choose its adapter
  (`FirstBytes`, over the core's `Adapters`: each recognises its own first frame; ours has 0x52 at
  byte 4, Kafka's its api key's zero high byte there), which gives the connection its decoder;
  bytes no adapter recognises are a protocol error and close the connection. Every adapter's
  outcomes are carried out here alike, in the same reply slots. Inter-core links speak ours only
  (the internal adapter).
- A connection answers in request order: every request gets a `Slot` when it arrives, and a
  connection sends the replies at the head of its slots that are done (`ServedConnection.fill`).
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from broker.core.adapter import Adapter, Adapters, RequestDecoder
from broker.core.forwarding import NO_DEADLINE, Done, Forwarder, PeerLink, PeerPool
from broker.core.outcomes import Reply, Silent
from broker.security.session import AUTH_FAILURE_CLOSE_DELAY_S, ConnectionAuth
from ringlog_proto.frames import NEED_DATA, Buffer, Frame, ProtocolError, _NeedData

if TYPE_CHECKING:
    import ssl

    from broker.backends.rate_limited_log import RateLimitedLog
    from broker.core.config import BrokerConfig
    from broker.core.core import Core

log = logging.getLogger(__name__)

PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection
# tcp_info's first byte (linux/tcp.h): the socket's state. A connection the core does not read
# never sees its client's FIN or RST by reading; the sweep looks for these states instead.
TCP_CLOSE = 7  # reset by the peer (or failed)
TCP_CLOSE_WAIT = 8  # the peer sent its FIN


class FirstBytes:
    """A client connection's bytes before they say which protocol it speaks: one port serves
    every protocol of `adapters`, and each recognises its own first frame (our magic 0x52 after
    the length; a Kafka request's api key, whose high byte is 0, there instead). `decide` names
    the adapter, `hand_over` gives its decoder the bytes so far."""

    __slots__ = ("_buf", "adapters", "max_frame_bytes")

    def __init__(self, adapters: tuple[Adapter[Any], ...], max_frame_bytes: int) -> None:
        self.adapters = adapters
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: Buffer) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_frame(self) -> _NeedData:
        return NEED_DATA

    def decide(self) -> Adapter[Any] | None:
        """The first adapter whose protocol the bytes so far begin, or None while too few have
        arrived to tell. Raises `ProtocolError` for bytes that begin no protocol's frame."""
        buf = self._buf
        undecided = False
        for adapter in self.adapters:
            starts = adapter.recognises(buf)
            if starts:
                return adapter
            undecided = undecided or starts is None
        if undecided:
            return None
        names = [a.frame_name for a in self.adapters]
        begins = f"neither {' nor '.join(names)}" if len(names) > 1 else f"not {names[0]}"
        raise ProtocolError(f"first bytes {bytes(buf[:8]).hex()} begin {begins}")

    def hand_over(self, adapter: Adapter[Any], auth: ConnectionAuth) -> RequestDecoder[Any]:
        """`adapter`'s decoder for the connection whose authentication state is `auth`, holding
        the bytes received so far."""
        decoder = adapter.decoder(self.max_frame_bytes, auth)
        decoder.feed(self._buf)
        return decoder


class Slot:
    """A request's place in its connection's reply order."""

    __slots__ = ("buffers", "charge", "done", "started_ns", "then_close")

    def __init__(self, started_ns: int, charge: int = 0) -> None:
        self.buffers: Sequence[Buffer] = []
        self.done = False
        self.then_close = False
        self.started_ns = started_ns  # for the latency histogram (metrics.reply)
        self.charge = charge  # bytes counted in flight for this request (admission.py's rules)


class GatherPart:
    """What one part of a `Gather` is carried out on: its connection's state, and a `fill` that
    tells the gather the part is done instead of sending anything."""

    __slots__ = ("_conn", "_done")

    def __init__(self, conn: ServedConnection, done: Callable[[Slot], None]) -> None:
        self._conn = conn
        self._done = done

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def from_peer(self) -> bool:
        return self._conn.from_peer

    @property
    def budget(self) -> ConnectionBudget:
        return self._conn.budget

    @property
    def served(self) -> ServedConnection:
        return self._conn

    def taken_all(self) -> bool:
        return self._conn.taken_all()

    def fill(self, slot: Slot, outcome: Reply | Silent) -> None:
        self._done(slot)


class ConnectionBudget:
    """What the shared code keeps per connection: its bytes in flight and its activity times."""

    __slots__ = ("buffered", "counted", "frame_started", "gated", "held", "last_active", "queued")

    def __init__(self, now: float) -> None:
        self.held = 0  # charges of the requests taken and unanswered + `queued`
        self.queued = 0  # reply bytes handed to the transport and not yet sent
        self.buffered = 0  # decoder bytes counted (received, not yet taken as frames)
        self.counted = False  # a client connection admitted under the cap (uncounted at close)
        self.gated = False  # stopped taking or reading for a budget: resume when memory is released
        self.last_active = now  # last time bytes moved either way (time.monotonic())
        self.frame_started = 0.0  # when the partial frame in the decoder began, 0.0 if none


def peer_uid(fd: int | None) -> int | None:
    """The user id of the process at the other end of unix socket `fd` (SO_PEERCRED), or None."""
    if fd is None or fd < 0:
        return None
    sock = socket.socket(fileno=fd)
    try:
        _pid, uid, _gid = PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
        )
        return int(uid)
    except OSError:
        return None
    finally:
        sock.detach()


def closed_by_peer(fd: int | None) -> bool:
    """Whether the client of TCP socket `fd` closed or reset it (False for a unix socket or an
    fd that cannot tell): what a read would find, for a connection the core does not read."""
    if fd is None or fd < 0:
        return False
    sock = socket.socket(fileno=fd)
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return False
    finally:
        sock.detach()
    return state in (TCP_CLOSE, TCP_CLOSE_WAIT)


def reset_on_close(fd: int) -> None:
    """SO_LINGER 0 on `fd`: its close resets the connection (no TIME_WAIT left for a flood of them)."""
    sock = socket.socket(fileno=fd)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    except OSError:
        pass
    finally:
        sock.detach()


class ServingCore(Protocol):
    """What a connection and a peer link use of the core that serves them (broker/backends/
    backend_core.py's `BackendCore`), declared here since that module imports this one."""

    config: BrokerConfig
    tls_context: ssl.SSLContext | None
    core: Core
    adapters: Adapters
    limit_log: RateLimitedLog
    connections: set[ServedConnection]
    peers: PeerPool

    @property
    def admission(self) -> ConnectionAdmission: ...

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> object: ...

    def take_requests(self, conn: ServedConnection) -> None: ...

    def accepted(self, conn: ServedConnection) -> bool: ...


class ConnectionAdmission(Protocol):
    """What a connection asks of its core's memory admission (broker/backends/admission.py's
    `Admission`), declared here since that module imports this one."""

    def may_read(self, conn: ServedConnection) -> bool: ...

    def replied(self, slot: Slot, reply_bytes: int) -> int: ...

    def queued(self, conn: ServedConnection, released: int, unsent: int, replied: int = 0) -> None: ...

    def forget(self, conn: ServedConnection) -> None: ...


class ServedConnection:
    """A connection this core serves (a client's or, `from_peer`, another core's): frames in,
    replies out in request order, read only while the budgets allow.

    The request side lives here; a backend's subclass moves the bytes. It calls `received(data)`
    with what it read, `sent_some()` when queued bytes went out, `lost()` when the peer went away
    and `closing()` once when the connection closes, and provides the primitives below.
    """

    if TYPE_CHECKING:  # the backend's primitives (declared, not defined: its stream class has them)

        def write(self, buffers: Sequence[Buffer]) -> None:
            """Queue `buffers` to be sent in order."""

        def unsent(self) -> int:
            """Bytes queued and not yet sent."""

        def reading_changed(self) -> None:
            """Read, or stop reading, as `paused()` now says."""

        def abort(self) -> None:
            """Close now: nothing more is read or sent."""

        def close(self) -> None:
            """Close at shutdown (replies already queued may still go)."""

        def fileno(self) -> int | None: ...

    def __init__(self, server: ServingCore, from_peer: bool, peer: str) -> None:
        self.server = server
        self.from_peer = from_peer
        self.peer = peer
        self.closed = False
        self.auth = ConnectionAuth.for_connection(
            server.config.sasl, peer, from_peer, tls=not from_peer and server.tls_context is not None
        )
        # The adapter serving it and the bytes received, not yet taken: another core's are ours; a
        # client's first bytes choose its adapter (`FirstBytes`), None until they have.
        max_bytes = server.config.limits.max_request_bytes
        adapters = server.adapters
        self.adapter: Adapter[Any] | None = adapters.internal if from_peer else None
        self.decoder: FirstBytes | RequestDecoder[Any] = (
            adapters.internal.decoder(max_bytes, self.auth)
            if from_peer
            else FirstBytes(adapters.clients, max_bytes)
        )
        self.slots: deque[Slot] = deque()  # the requests not yet answered, in arrival order
        self.budget = ConnectionBudget(time.monotonic())
        self.refusing = False  # a reply that closes was queued: nothing more is taken
        # a request's partitions are being opened (an `Opening`): nothing more is taken or read
        # until it is carried out, so its connection's requests keep their order
        self.opening = False
        self.forward_blocked = 0  # peer cores whose forward limit this connection waits on

    def received(self, data: bytes | memoryview) -> None:
        self.budget.last_active = time.monotonic()
        self.decoder.feed(data)
        self.resume()

    def received_lent(self, n: int) -> None:
        """`n` bytes arrived in the space the decoder lent to the backend's receive (a
        `LENDING_DECODER`'s `buffer`), its view already released: `received` without the feed."""
        self.budget.last_active = time.monotonic()
        self.decoder.received(n)  # type: ignore[union-attr]  # only a LENDING_DECODER lends its space
        self.resume()

    def resume(self) -> None:
        """Take the frames buffered (`take_requests`) and read again if the budgets allow."""
        try:
            self.server.take_requests(self)
        except ProtocolError as exc:
            self.server.limit_log.warning("protocol error", "closing %s: %s", self.peer, exc)
            self.abort()
            return
        self.reading_changed()

    def paused(self) -> bool:
        return (
            self.refusing
            or self.opening
            or self.forward_blocked > 0
            or not self.server.admission.may_read(self)
        )

    def taken_all(self) -> bool:
        """Whether the bytes received hold no request still to take: what a request being
        carried out now starts (a reply's send, a flush) has nothing of this connection's to
        wait for in this pass."""
        return not self.decoder.buffered

    def fill(self, slot: Slot, outcome: Reply | Silent) -> None:
        """A reply is ready: send every reply at the head of the queue that is ready too."""
        slot.done = True
        server = self.server
        replied_ns = time.monotonic_ns()  # counted after the write: the client waits for the write
        reply = False
        if isinstance(outcome, Reply):
            reply = True
            slot.buffers = outcome.buffers
            slot.then_close = outcome.then_close
        if self.closed:
            if reply:
                server.core.metrics.reply(sum(map(len, slot.buffers)), slot.started_ns, replied_ns)
            return
        slots = self.slots
        out: list[Buffer] = []
        released = 0
        close = False
        sent_slot = False
        while slots and slots[0].done:
            done = slots.popleft()
            out.extend(done.buffers)
            released += done.charge
            close = close or done.then_close
            sent_slot = sent_slot or done is slot
        if out:
            self.write(out)  # first: the client waits for it, the counting below does not
        size = sum(map(len, slot.buffers)) if reply else 0
        # A reply that waits behind an earlier one is counted by its size from now on; one that
        # went out with this write releases its slot's count (`released`) as it is.
        change = 0 if sent_slot else server.admission.replied(slot, size)
        if reply:
            server.core.metrics.reply(size, slot.started_ns, replied_ns)
        if close and not self.refusing:
            self.refusing = True
            server.call_later(AUTH_FAILURE_CLOSE_DELAY_S, self.close)
        server.admission.queued(self, released, self.unsent(), change)
        self.reading_changed()  # a connection paused on its budget may read again

    def sent_some(self) -> None:
        """Queued bytes went out (`unsent()` is less)."""
        self.budget.last_active = time.monotonic()
        self.server.admission.queued(self, 0, self.unsent())

    def drop(self) -> None:
        """Close at once (a limit was hit): nothing more is read or sent, and the close resets."""
        if not self.closed and not self.from_peer:
            fd = self.fileno()
            if fd is not None and fd >= 0:
                reset_on_close(fd)
        self.abort()

    def lost(self) -> None:
        """The peer closed or the connection failed (not our own close)."""
        if self.decoder.buffered:
            log.info("client %s went away mid-frame (%d bytes unread)", self.peer, self.decoder.buffered)

    def closing(self) -> None:
        self.server.connections.discard(self)
        self.server.admission.forget(self)

    def waits_for_forward(self) -> bool:
        return self.forward_blocked > 0

    def wait_for_forward_room(self, forwarder: Forwarder, core: int) -> None:
        """Stop reading until forwards to `core` are below their limit again."""
        self.forward_blocked += 1
        self.reading_changed()

        def resume() -> None:
            self.forward_blocked -= 1
            self.reading_changed()

        forwarder.when_room(core, resume)


class PeerStream:
    """This core's end of one link carrying our requests to another core: an inter-core connection
    (a `PeerChannel` of broker/core/forwarding.py, `open_peer`) or a TCP link to another broker's
    core (a `RemoteChannel` of broker/core/remote.py, `open_remote`; `core` is -1). It moves bytes
    for a `PeerLink`: the backend's subclass writes (queuing what is written before the connection
    is up), reads into `received` and calls `gone` when the connection closes or fails to open."""

    if TYPE_CHECKING:

        def write(self, buffers: Sequence[Buffer]) -> None: ...
        def close(self) -> None: ...

    def __init__(self, server: ServingCore, core: int, long_poll: bool, peer: str | None = None) -> None:
        self.server = server
        self.core = core
        self.long_poll = long_poll
        self.link = PeerLink(core, peer)
        # Told first when the link goes (a remote link's `RemoteLinks`); None: the inter-core pool.
        self.on_gone: Callable[[BaseException | None], None] | None = None
        self._gone = False

    def send(self, frame: Frame, done: Done | None, deadline: float = NO_DEADLINE) -> None:
        self.write(self.link.request(frame, done, deadline))

    def received(self, data: bytes | memoryview) -> None:
        try:
            self.link.receive(data)
        except ProtocolError as exc:
            self._not_frames(exc)

    def received_lent(self, n: int) -> None:
        """`n` bytes arrived in the space the link's decoder lent (`PeerLink.lend`): `received`
        without the copy. The view may still be held (uvloop's transport lets go of it after
        this returns): the decoder takes frames and moves nothing meanwhile."""
        try:
            self.link.received_lent(n)
        except ProtocolError as exc:
            self._not_frames(exc)

    def _not_frames(self, exc: ProtocolError) -> None:
        log.error("%s sent bytes that are not frames (%s): dropping the connection", self.link.peer, exc)
        self.close()

    def gone(self, exc: BaseException | None = None) -> None:
        """Once: the owner forgets this link, then everything pending on it fails."""
        if self._gone:
            return
        self._gone = True
        if self.on_gone is None:
            self.server.peers.gone(self)
        else:
            self.on_gone(exc)
        self.link.lost(exc)
