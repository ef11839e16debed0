"""What a backend asks of a protocol: the adapter interface.

A connection's first bytes pick its adapter (broker/backends/connection.py `FirstBytes`): ours
(broker/ringlog/adapter.py) or Kafka's (broker/kafka/adapter.py). Each turns one request of its
protocol, with the connection's authentication state, into an `Outcome` over the same `Core`; the
backend carries the outcome out and never looks inside the request. A third protocol would be a
third adapter with this one method.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from broker.core.outcomes import Outcome
from broker.security.session import ConnectionAuth

RequestT_contra = TypeVar("RequestT_contra", contravariant=True)


class Adapter(Protocol[RequestT_contra]):
    """One protocol on one core: a request and its connection's auth in, an outcome out."""

    def handle(self, request: RequestT_contra, auth: ConnectionAuth | None = None) -> Outcome: ...
