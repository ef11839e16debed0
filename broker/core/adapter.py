"""What a backend asks of a protocol: the adapter interface.

Rules this module keeps:
- The backends (broker/backends/) know the protocols only through these interfaces; the worker
  makes the adapters over its `Core` (`Adapters`, handed in as `BrokerConfig.make_adapters`).
  A third protocol would be a third adapter, and nothing in the backends would change.
- One port serves every client protocol: each adapter recognises its own first frame
  (`recognises`), and the one that does gives the connection its decoder. From then on each
  request is counted (`count_request`), charged what its reply may hold (`reply_reserve`) and
  turned, with the connection's authentication state, into an `Outcome` over the same `Core`
  (`handle`); the backend carries the outcome out, reading nothing of the request but its api
  key, and asks the adapter what to answer when carrying it out fails (`error_reply`).
- Our protocol is also the one between cores (forwards, notices): the backend keeps it as the
  `InternalAdapter`, which takes a request from another core (`handle(frame, from_peer=True)`)
  and re-handles a parked `Wait`'s frame.
- The request path pays no layer for this: per request the backend calls the adapter's methods
  directly (`count_request` is the core's metrics counter itself, bound).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from broker.core.forwarding import AnswersErrors
from broker.core.outcomes import Outcome, Reply
from broker.security.session import ConnectionAuth
from ringlog_proto.frames import Buffer, Frame, _NeedData

if TYPE_CHECKING:
    from broker.core.core import Core

RequestT_co = TypeVar("RequestT_co", covariant=True)


class RequestDecoder(Protocol[RequestT_co]):
    """A connection's bytes in, whole requests out (ours: ringlog_proto's `FrameDecoder`; Kafka's:
    broker/kafka/codec.py's `KafkaFrameDecoder`). Raises `ProtocolError` for bytes that cannot be
    framed: the backend closes the connection."""

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as requests."""
        ...

    def feed(self, data: Buffer) -> None: ...

    def next_frame(self) -> RequestT_co | _NeedData: ...


class Request(Protocol):
    """What the backend reads of any protocol's request: its api key, for the metrics. (Its size
    is what the decoder let go of in taking it.)"""

    @property
    def api_key(self) -> int: ...


RequestR = TypeVar("RequestR", bound=Request)


class Adapter(Protocol[RequestR]):
    """One protocol on one core, for the client connections whose first bytes are its own."""

    frame_name: str  # what its first frame is, for the error naming what a connection sent instead

    def recognises(self, first: Buffer) -> bool | None:
        """Whether a connection's first bytes begin a request of this protocol; None while too
        few have arrived to tell."""
        ...

    def decoder(self, max_frame_bytes: int, auth: ConnectionAuth) -> RequestDecoder[RequestR]:
        """The decoder of a connection this protocol serves (`auth` is the connection's)."""
        ...

    def count_request(self, api_key: int, nbytes: int) -> int:
        """Count a request of this protocol in the core's metrics; returns the monotonic ns its
        answer's latency is measured from."""
        ...

    def reply_reserve(self, request: RequestR) -> int:
        """Bytes held for `request`'s reply from the moment it is taken (our fetch: its
        max_bytes), beyond its own bytes and the backend's overhead per request."""
        ...

    def handle(self, request: RequestR, auth: ConnectionAuth | None = None) -> Outcome:
        """The outcome of one request on a connection whose authentication state is `auth`.
        Raises `ProtocolError` when the connection must close."""
        ...

    def error_reply(self, request: RequestR, exc: BaseException) -> Reply | None:
        """The answer to `request` when carrying out its outcome failed (`exc`), or None when
        the protocol has none (the backend closes the connection)."""
        ...


class InternalAdapter(Adapter[Frame], AnswersErrors, Protocol):
    """Our protocol, which is also the one between this broker's cores: what forwarding asks of it
    (`AnswersErrors`), and the request of another core, trusted and never forwarded again."""

    def handle(self, request: Frame, auth: ConnectionAuth | None = None, from_peer: bool = False) -> Outcome:
        """`Adapter.handle`; `from_peer`: the frame came from another core of this broker."""
        ...

    def error_reply(self, request: Frame, exc: BaseException) -> Reply: ...


@dataclass(frozen=True, slots=True)
class Adapters:
    """The protocols one core serves, made over its `Core` by the worker."""

    internal: InternalAdapter  # ours: clients' and other cores'
    clients: tuple[Adapter[Any], ...]  # every protocol of the client port, in the order tried


MakeAdapters = Callable[["Core"], Adapters]
