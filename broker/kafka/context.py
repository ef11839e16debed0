"""What every Kafka API module is handed: the core, its ACLs, the connection of the request being
handled and the cluster id.

Rules this module keeps:
- One `Context` per core, made by the adapter (broker/kafka/adapter.py), which sets `auth` to the
  connection of each request before it calls the API's function: an API module is plain
  functions of `(ctx, request, body) -> Outcome`, registered in the adapter's table.
"""

from __future__ import annotations

from broker.core.core import Core
from broker.kafka import authorize
from broker.kafka.errors import TopicNotAuthorized
from broker.kafka.metadata_entries import TopicEntries
from broker.security.session import ConnectionAuth


class Context:
    """The core and the request's connection, as the Kafka APIs see them (module rules)."""

    __slots__ = ("auth", "authenticator", "authorizer", "cluster_id", "core", "metadata_entries")

    def __init__(self, core: Core, cluster_id: str) -> None:
        self.core = core
        self.cluster_id = cluster_id
        # one SASL server and one set of ACL decisions per core, shared with our protocol
        self.authenticator = core.authenticator
        self.authorizer = core.authorizer
        self.auth = ConnectionAuth("")  # the connection of the request being handled
        self.metadata_entries = TopicEntries()  # Metadata's encoded topics, kept per core

    def may_use(self, api_key: int, topic: str) -> bool:
        """Whether the request's principal may use `topic` in this api (broker/kafka/authorize.py
        `PER_TOPIC`); counts nothing: the adapter's look ahead asks it too."""
        authorizer = self.authorizer
        return not authorizer.enabled or authorizer.allowed(
            self.auth.principal, authorize.PER_TOPIC[api_key], "topic", topic
        )

    def topic_refusal(self, api_key: int, topic: str) -> TopicNotAuthorized | None:
        """Why the request's principal may not use `topic` in this api (`may_use`), counted as a
        denial, or None when it may."""
        if self.may_use(api_key, topic):
            return None
        self.core.metrics.denied()
        return TopicNotAuthorized(f"not authorized: {authorize.PER_TOPIC[api_key]} topic {topic}")
