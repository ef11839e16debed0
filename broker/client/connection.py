"""One TCP connection to the broker, with pipelining.

Rules this module keeps:
- Requests are written as soon as they are made, each with a fresh correlation id, and many may be
  in flight. The connection is an `asyncio.BufferedProtocol` (`_ConnProtocol`): the transport
  receives straight into the sans-I/O `FrameReader`'s buffer (`frame_reader()`: its C twin when
  native/ is built), kept for the connection's life, and
  `buffer_updated` resolves the future waiting for each response by its correlation id, right
  there in the event loop's read callback; there is no reader task, no stream buffer and no
  `bytes` per read in between (see `FrameReader` for what that saves on large fetches). (The
  broker answers in request order, but matching by id costs a dict lookup and catches a broker
  that does not.)
- A response is decoded by `decode_response` unless its request named another decoder
  (`request_nowait(decode=...)`: the consumer's fetches keep their records in the frame's body,
  `read_fetch_response`).
- A response goes to a future, or to a `ResponseSink` the caller gave (`request_to`): the
  producer's, which acts on a success right in the read callback. A future's done-callbacks run
  one loop turn after `set_result`, and that turn is in every one-at-a-time produce's latency.
- A connection that fails fails *everything* in flight on it with `BrokerUnavailable`, and stays
  failed: callers (the `AsyncClient`) open a new one. Whether the broker acted on those requests is
  unknown; that is what idempotent produce is for. The transport's `connection_lost` (EOF, a socket
  error, or our own close) is where that happens at the latest.
- A request that gets no answer within its timeout closes the connection: responses come back in
  order, so everything behind a stuck request is stuck too, and a late answer must not be matched
  to a request that has already been given up on. One timer per connection watches the earliest
  deadline (`_watch`), where every request used to make a timer and cancel it on its answer.
- Frames are written with `transport.writelines` (the record bytes of a produce are never joined
  into a frame here; uvloop hands the buffers to writev).
- A steered connection (`connect_steered`, used when Metadata says `steering`) is opened to the
  public port with its first frame in the SYN (TCP Fast Open, `MSG_FASTOPEN`, no cookie): an
  ApiVersions request whose frame header carries the partition identity the connection is for, so
  the broker's reuseport program hands it to the partition's owner. Its source port is chosen so
  that the port rule (`routing.port_owner`) names that core too (the program's fallback rule when
  the SYN carries no data).
  Without TFO on this host the same frame is sent after the handshake and the port rule decides.
- Flow control: the transport calls `pause_writing` when its write buffer passes the high-water
  mark and `resume_writing` when it drains below the low one; `drain()` (and `request`,
  `send_no_response`) wait only while it is paused, and return at once, without yielding to the
  loop, otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import random
import socket
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from broker.client.errors import AuthenticationError, BrokerUnavailable, ProtocolViolation, error_for
from broker.client.security import Security
from ringlog_proto.frames import (
    FRAME_BYTES_MAX_DEFAULT,
    NEED_DATA,
    Frame,
    ProtocolError,
    frame_reader,
    set_correlation_id,
    set_identity,
)
from ringlog_proto.messages import (
    Acks,
    ApiVersionsRequest,
    ErrorCode,
    MalformedBody,
    ProduceRequest,
    Request,
    Response,
    decode_response,
    encode_request,
)
from ringlog_proto.routing import source_ports
from ringlog_proto.sasl import SaslLogin

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Response)

CORRELATION_MASK: Final = 0xFFFFFFFF
MSG_FASTOPEN: Final = 0x20000000
TCP_FASTOPEN_NO_COOKIE: Final = 34  # per-socket: send data in the SYN without a cookie
# Random source ports tried for the port rule before letting the kernel pick one: a busy range
# makes a few collide; past this many the connection is simply not steered by port.
SOURCE_PORT_TRIES: Final = 16
EPHEMERAL_DEFAULT: Final = (32768, 60999)


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


def _resolve(fut: asyncio.Future[None]) -> None:
    """A writer callback: the loop calls it on every writable poll until it is removed."""
    if not fut.done():
        fut.set_result(None)


def bind_source_port_for(sock: socket.socket, family: int, core: int, cores: int) -> int:
    """Bind `sock` to a free source port that the steering program's port rule sends to `core`
    (`routing.source_ports`); 0 when none was found in `SOURCE_PORT_TRIES` tries (the kernel picks
    one at connect)."""
    if cores <= 1:
        return 0
    ports = source_ports(core, cores, *_ephemeral_range())
    if not ports:
        return 0
    local = "::" if family == socket.AF_INET6 else "0.0.0.0"
    for _ in range(SOURCE_PORT_TRIES):
        port = random.choice(ports)
        try:
            sock.bind((local, port))
            return port
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
    return 0


class ResponseSink(Protocol):
    """Where a request's outcome goes: an `asyncio.Future` is one. `set_result` and
    `set_exception` are called in the read callback, or in whatever closes the connection (a failed
    write inside `request_to` too): a sink that may start new requests from them must be ready for
    that, or defer (the producer acts on a success at once and defers the rest)."""

    def done(self) -> bool: ...

    def set_result(self, result: Any, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


# The pending entry of one request: its sink, the api key of the request, the decoder of its
# response, its deadline on the loop's clock (inf: none) and its timeout in seconds (for the error).
_Pending = tuple[ResponseSink, int, Callable[[Frame], Any], float, float]
NO_DEADLINE: Final = float("inf")
# A timer may fire up to a millisecond before its deadline (libuv counts in milliseconds).
DEADLINE_SLACK: Final = 0.001


class _ConnProtocol(asyncio.BufferedProtocol):
    """The transport's callbacks for one `AsyncConnection`; all state lives on the connection."""

    __slots__ = ("_conn",)

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection makes a Transport; the protocol's signature says only BaseTransport.
        self._conn._transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._conn._decoder.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._conn._buffer_updated(nbytes)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn._connection_lost(exc)

    def pause_writing(self) -> None:
        self._conn._paused = True

    def resume_writing(self) -> None:
        conn = self._conn
        conn._paused = False
        conn._wake_drainers()


class AsyncConnection:
    """A pipelined request/response connection. Create with `await AsyncConnection.connect(...)`.

    Not thread-safe: use it from the event loop that created it.
    """

    def __init__(
        self,
        address: str,
        *,
        request_timeout: float | None = 30.0,
        max_frame_bytes: int = FRAME_BYTES_MAX_DEFAULT,
    ) -> None:
        self.address = address
        self.request_timeout = request_timeout
        self._decoder = frame_reader(max_frame_bytes)
        self._loop = asyncio.get_running_loop()
        self._pending: dict[int, _Pending] = {}  # by correlation id
        self._timer: asyncio.TimerHandle | None = None  # fires at `_timer_at`, the earliest deadline
        self._timer_at = NO_DEADLINE
        self._next_id = 1
        self._error: BrokerUnavailable | None = None
        self._protocol = _ConnProtocol(self)
        self._transport: asyncio.Transport | None = None  # set by connection_made
        self._paused = False  # the transport's write buffer is above its high-water mark
        self._drainers: list[asyncio.Future[None]] = []
        self._lost = self._loop.create_future()  # done once the transport has called connection_lost
        # Called (once) when a request goes unanswered past its timeout, before the connection
        # closes: the peer may be paused or cut off, and its owner may want to ask another.
        self.on_unanswered: Callable[[], None] | None = None

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        connect_timeout: float | None = 10.0,
        request_timeout: float | None = 30.0,
        max_frame_bytes: int = FRAME_BYTES_MAX_DEFAULT,
        security: Security | None = None,
    ) -> AsyncConnection:
        """Open a connection (over TLS and authenticated, as `security` says); raises
        `BrokerUnavailable` if the broker cannot be reached, `AuthenticationError` if it refuses
        the credentials."""
        address = f"{host}:{port}"
        conn = cls(address, request_timeout=request_timeout, max_frame_bytes=max_frame_bytes)
        protocol = conn._protocol
        ctx = security.context if security is not None else None
        try:
            async with asyncio.timeout(connect_timeout):
                if ctx is None:
                    await conn._loop.create_connection(lambda: protocol, host, port)
                else:
                    await conn._loop.create_connection(
                        lambda: protocol, host, port, ssl=ctx, server_hostname=host
                    )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError: a refused certificate
            if conn._transport is not None:
                conn._transport.abort()
            raise BrokerUnavailable(
                f"cannot connect to the broker at {address}: {exc or 'timed out'}"
            ) from exc
        if security is not None and security.sasl:
            await conn._authenticate(security)
        return conn

    async def _authenticate(self, security: Security) -> None:
        """The SASL exchange (docs/PROTOCOL.md §4.15) before anything else is sent; closes the
        connection and raises `AuthenticationError` when it fails."""
        mechanism = security.sasl_mechanism
        assert mechanism is not None
        login = SaslLogin(mechanism, security.username, security.password)
        try:
            req: Request | None = login.first()
            while req is not None:
                req = login.answer(await self.request(req))
        except ValueError as exc:
            await self.close()
            raise AuthenticationError(ErrorCode.SASL_AUTHENTICATION_FAILED, str(exc)) from exc
        except BaseException:
            await self.close()
            raise

    @classmethod
    async def connect_steered(
        cls,
        host: str,
        port: int,
        identity: tuple[int, int] | None,
        core: int,
        cores: int,
        *,
        client_name: str = "ringlog-python",
        connect_timeout: float | None = 10.0,
        request_timeout: float | None = 30.0,
        max_frame_bytes: int = FRAME_BYTES_MAX_DEFAULT,
        security: Security | None = None,
    ) -> AsyncConnection:
        """Open a connection to the public port that the broker steers to `core` (module rules):
        `identity` is a (topic id, partition) owned by `core`, carried by the first frame. Not
        with TLS (the first frame would have to be a TLS hello); SASL follows the first frame."""
        if security is not None and security.context is not None:
            raise ValueError("a steered connection carries a ringlog frame in its SYN: not with TLS")
        address = f"{host}:{port}"
        conn = cls(address, request_timeout=request_timeout, max_frame_bytes=max_frame_bytes)
        loop = conn._loop
        try:
            family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except OSError as exc:
            raise BrokerUnavailable(f"cannot connect to the broker at {address}: {exc}") from exc
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):  # an old kernel: no data in the SYN, the port rule steers
                sock.setsockopt(socket.IPPROTO_TCP, TCP_FASTOPEN_NO_COOKIE, 1)
            bind_source_port_for(sock, family, core, cores)
            hello = b"".join(encode_request(ApiVersionsRequest(client_name), 0))
            corr, fut = conn._expect(ApiVersionsRequest.API_KEY, None)
            frame = bytearray(hello)
            set_correlation_id(frame, corr)
            if identity is not None:
                set_identity(frame, *identity)
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits the hello
            async with asyncio.timeout(connect_timeout):
                try:
                    sent = sock.sendto(frame, MSG_FASTOPEN, addr)
                except BlockingIOError:  # connecting; the SYN carried no data (no TFO here)
                    sent = 0
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.ENOPROTOOPT):
                        raise
                    sent = 0  # TFO disabled for clients on this host: a plain connect
                    with contextlib.suppress(BlockingIOError):
                        sock.connect(addr)
                writable = loop.create_future()
                loop.add_writer(sock.fileno(), _resolve, writable)
                try:
                    await writable
                finally:
                    loop.remove_writer(sock.fileno())
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, f"connect: {errno.errorcode.get(err, err)}")
                await loop.create_connection(lambda: conn._protocol, sock=sock)
        except (OSError, TimeoutError) as exc:
            if conn._transport is not None:
                conn._transport.abort()
            else:
                sock.close()
            conn._fail(BrokerUnavailable(f"cannot connect to the broker at {address}: {exc or 'timed out'}"))
            raise BrokerUnavailable(
                f"cannot connect to the broker at {address}: {exc or 'timed out'}"
            ) from exc
        except BaseException:
            sock.close()
            raise
        if sent < len(frame):
            transport = conn._transport
            assert transport is not None  # create_connection has called connection_made
            transport.write(bytes(frame[sent:]))
        if security is not None and security.sasl:
            await conn._authenticate(security)
        return conn

    def _expect(self, api_key: int, timeout: float | None) -> tuple[int, asyncio.Future[Response]]:
        """A correlation id and the future its response will resolve (for frames built here)."""
        corr = self._next_id
        self._next_id = (corr + 1) & CORRELATION_MASK
        fut: asyncio.Future[Response] = self._loop.create_future()
        self._pending[corr] = (fut, api_key, decode_response, *self._deadline(timeout))
        return corr, fut

    def _deadline(self, timeout: float | None) -> tuple[float, float]:
        """(deadline, timeout) of a request sent now, the connection's timer armed for it."""
        timeout = self.request_timeout if timeout is None else timeout
        if timeout is None or timeout <= 0:
            return NO_DEADLINE, 0.0
        deadline = self._loop.time() + timeout
        if deadline < self._timer_at:
            self._watch(deadline)
        return deadline, timeout

    def _watch(self, deadline: float) -> None:
        """Arm the connection's one timer for `deadline`, the earliest of those pending. Requests
        with one timeout have deadlines in the order they were sent, so this runs once per
        timeout's length while requests keep coming, not once per request."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(deadline, self._check_deadlines)
        self._timer_at = deadline

    def _check_deadlines(self) -> None:
        self._timer = None
        self._timer_at = NO_DEADLINE
        now = self._loop.time() + DEADLINE_SLACK
        earliest = NO_DEADLINE
        for corr, (_sink, api_key, _decode, deadline, timeout) in self._pending.items():
            if deadline <= now:
                if self.on_unanswered is not None and self._error is None:
                    self.on_unanswered()
                self._fail(
                    BrokerUnavailable(
                        f"{self.address}: no response to request {corr} (api {api_key}) within "
                        f"{timeout:g} s; connection closed"
                    )
                )
                return
            earliest = min(earliest, deadline)
        if earliest < NO_DEADLINE:
            self._watch(earliest)

    # ----------------------------------------------------------------------------------- state

    @property
    def closed(self) -> bool:
        return self._error is not None

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    def __repr__(self) -> str:
        state = f"closed: {self._error}" if self._error else f"{len(self._pending)} in flight"
        return f"<AsyncConnection {self.address} {state}>"

    # ----------------------------------------------------------------------------------- requests

    async def request(self, req: Request, *, timeout: float | None = None, check: bool = True) -> Response:
        """Send `req` and wait for its response.

        `check` (default) raises the `RingLogError` subclass for an error response; with
        `check=False` the error response is returned as is. `timeout` (seconds) defaults to the
        connection's `request_timeout`; when it passes the connection is closed (see the module
        docstring) and `BrokerUnavailable` is raised. A produce with acks=0 must use
        `send_no_response`, since no response will ever come.
        """
        if isinstance(req, ProduceRequest) and req.acks == Acks.NONE:
            raise ValueError("a produce with acks=0 gets no response: use send_no_response()")
        fut: asyncio.Future[Response] = self._loop.create_future()
        self._send(req, fut, timeout)
        if self._paused:
            await self._drain()
        resp = await fut
        if check and resp.error != ErrorCode.NONE:
            raise error_for(resp.error, resp.message)
        return resp

    def request_nowait(
        self,
        req: Request,
        *,
        timeout: float | None = None,
        decode: Callable[[Frame], Any] = decode_response,
    ) -> asyncio.Future[Any]:
        """Write `req` now and return the future of its (unchecked) response without awaiting.

        For callers that pipeline many requests from one task; they should `await drain()` now and
        then so a slow broker applies backpressure. `decode` turns the response frame into the
        future's result (raising `MalformedBody` for a body it cannot read).
        """
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._send(req, fut, timeout, decode)
        return fut

    def request_to(
        self,
        req: Request,
        sink: ResponseSink,
        *,
        timeout: float | None = None,
        decode: Callable[[Frame], Any] = decode_response,
    ) -> None:
        """Write `req` now; its (unchecked) response goes to `sink.set_result` in the read
        callback, a failure to `sink.set_exception` (see `ResponseSink` for when each runs).
        Raises `BrokerUnavailable` if the connection has failed, as `request_nowait` does."""
        self._send(req, sink, timeout, decode)

    async def send_no_response(self, req: Request) -> None:
        """Send a request the broker does not answer (produce with acks=0)."""
        self._send(req, None, None)
        await self._drain()

    def send_no_response_nowait(self, req: Request) -> None:
        """Write a request the broker does not answer, without waiting (see `write_buffer_size`)."""
        self._send(req, None, None)

    def write_buffer_size(self) -> int:
        """Bytes written and not yet handed to the kernel: callers that do not drain watch this."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return 0
        return transport.get_write_buffer_size()

    async def drain(self) -> None:
        """Wait until the socket's send buffer is below its high-water mark."""
        await self._drain()

    def claim_id(self) -> int:
        """A correlation id for a frame the caller encodes itself, written with `write_frame` and
        its response's sink registered afterwards with `expect` (in the same callback: the
        response is read by a later one). A one-record produce makes its whole frame in one call,
        and does its bookkeeping while the request travels. Raises `BrokerUnavailable` if the
        connection has failed."""
        if self._error is not None:
            raise BrokerUnavailable(str(self._error))
        return self._claim_id()

    def write_frame(self, frame: bytes) -> None:
        """Write a whole frame the caller encoded (its id from `claim_id`). Raises
        `BrokerUnavailable` if the write fails (then nothing was sent and nothing waits)."""
        try:
            # Set by connection_made before `connect` returns; no check on the per-request path.
            self._transport.write(frame)  # type: ignore[union-attr]
        except (OSError, RuntimeError) as exc:  # RuntimeError: transport closed under us
            raise self._write_failed(exc) from exc

    def expect(
        self,
        corr: int,
        sink: ResponseSink,
        api_key: int,
        timeout: float | None = None,
        decode: Callable[[Frame], Any] = decode_response,
    ) -> None:
        """Register `sink` for the response to the frame `write_frame` wrote as `corr`."""
        if self._error is not None:  # failed since the write: the sink hears it as it would have
            self._loop.call_soon(sink.set_exception, BrokerUnavailable(str(self._error)))
            return
        self._pending[corr] = (sink, api_key, decode, *self._deadline(timeout))

    def _send(
        self,
        req: Request,
        sink: ResponseSink | None,
        timeout: float | None,
        decode: Callable[[Frame], Any] = decode_response,
    ) -> None:
        """Write `req`; with a `sink`, register it for the response (None: no response comes)."""
        if self._error is not None:
            raise BrokerUnavailable(str(self._error))
        corr = self._claim_id()
        if sink is not None:
            # The deadline is taken before the write: a write that fails closes the connection,
            # which must find the request to fail it.
            self._pending[corr] = (sink, req.API_KEY, decode, *self._deadline(timeout))
        self._write(req, corr)

    def _claim_id(self) -> int:
        """The next correlation id no pending request holds (2**32 requests later, one may
        still be waiting)."""
        pending = self._pending
        corr = self._next_id
        self._next_id = (corr + 1) & CORRELATION_MASK
        while corr in pending:
            corr = self._next_id
            self._next_id = (corr + 1) & CORRELATION_MASK
        return corr

    def _write(self, req: Request, corr: int) -> None:
        try:
            # Set by connection_made before `connect` returns; no check on the per-request path.
            self._transport.writelines(encode_request(req, corr))  # type: ignore[union-attr]
        except (OSError, RuntimeError) as exc:  # RuntimeError: transport closed under us
            raise self._write_failed(exc) from exc

    def _write_failed(self, exc: BaseException) -> BrokerUnavailable:
        """A write raised: the connection fails (what waits on it hears so); the caller raises
        what this returns."""
        self._fail(BrokerUnavailable(f"{self.address}: write failed: {exc}"))
        return BrokerUnavailable(f"{self.address}: write failed: {exc}")

    async def _drain(self) -> None:
        """Return at once unless the transport has paused writing; then wait for it to resume."""
        if self._paused and self._error is None:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._drainers.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._drainers:
                    self._drainers.remove(waiter)
                raise
        if self._error is not None:
            err = BrokerUnavailable(str(self._error))
            err.__cause__ = self._error.__cause__
            raise err

    def _wake_drainers(self) -> None:
        drainers, self._drainers = self._drainers, []
        for waiter in drainers:
            if not waiter.done():
                waiter.set_result(None)

    # ----------------------------------------------------------------------------------- reading

    def _buffer_updated(self, nbytes: int) -> None:
        decoder = self._decoder
        decoder.received(nbytes)
        if self._error is not None:
            return  # closing: nobody is waiting any more
        try:
            while self._error is None:  # a sink may have closed the connection
                frame = decoder.next_frame()
                if frame is NEED_DATA:
                    break
                assert isinstance(frame, Frame)  # mypy does not narrow `is` on a sentinel
                self._dispatch(frame)
        except ProtocolError as exc:
            err = BrokerUnavailable(f"{self.address}: unreadable stream from the broker ({exc}); closed")
            err.__cause__ = exc
            self._fail(err)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._error is None:
            if exc is None:
                err = BrokerUnavailable(f"{self.address}: connection closed by the broker")
            else:
                err = BrokerUnavailable(f"{self.address}: connection lost: {exc}")
                err.__cause__ = exc
            self._fail(err)
        self._paused = False
        self._wake_drainers()
        if not self._lost.done():
            self._lost.set_result(None)

    def _dispatch(self, frame: Frame) -> None:
        entry = self._pending.pop(frame.correlation_id, None)
        if entry is None:
            # Only possible for a broker bug: a timed-out request closes the connection.
            log.warning(
                "%s: response to unknown correlation id %d ignored", self.address, frame.correlation_id
            )
            return
        fut, api_key, decode, _deadline, _timeout = entry
        if fut.done():  # the caller was cancelled
            return
        if not frame.is_response or frame.api_key != api_key:
            fut.set_exception(
                ProtocolViolation(
                    f"{self.address}: correlation id {frame.correlation_id} answered with api "
                    f"{frame.api_key} (request was api {api_key})"
                )
            )
            return
        try:
            resp = decode(frame)
        except MalformedBody as exc:
            fut.set_exception(ProtocolViolation(f"{self.address}: unparseable response: {exc}"))
            return
        fut.set_result(resp)

    # ----------------------------------------------------------------------------------- closing

    def _fail(self, err: BrokerUnavailable) -> None:
        """Close the connection and fail everything in flight with `err` (first error wins)."""
        if self._error is None:
            self._error = err
        pending, self._pending = self._pending, {}
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = NO_DEADLINE  # closed: nothing is watched again
        for fut, *_ in pending.values():
            if not fut.done():
                each = BrokerUnavailable(str(err))  # one instance per waiter: tracebacks stay apart
                each.__cause__ = err.__cause__
                fut.set_exception(each)
                if isinstance(fut, asyncio.Future):
                    fut.exception()  # mark retrieved: a caller that was cancelled will never look
        self._wake_drainers()  # they raise: the connection is closed
        if self._transport is not None:
            self._transport.close()

    async def close(self) -> None:
        """Close the connection; requests still in flight fail with `BrokerUnavailable`."""
        self._fail(BrokerUnavailable(f"{self.address}: connection closed by the client"))
        if self._transport is not None:
            await asyncio.shield(self._lost)


def check(resp: R) -> R:
    """`resp` itself, or raise its error (for responses fetched with `check=False`)."""
    if resp.error != ErrorCode.NONE:
        raise error_for(resp.error, resp.message)
    return resp
