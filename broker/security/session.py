"""What a connection has proved about who is on the other end.

One `ConnectionAuth` per served connection (broker/backends/connection.py makes it), read by the
protocol adapters: `principal` is None until a SASL exchange succeeds when the listener requires
one, "User:ANONYMOUS" when it does not, and the core's own principal on inter-core links.

The cores' principal is of a type of its own ("Core:"), which no login can produce: a SASL login
makes "User:<name>" and a client certificate "User:<distinguished name>", whatever the name. No
ACL or `--super-users` entry can name it either (both take only "User:" principals). It was
"User:ringlog-core" once, and a user made with that name was a super user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from broker.security.sasl import ANONYMOUS, Exchange, SaslConfig

CORE_PRINCIPAL: Final = "Core:ringlog"  # another core of this broker: trusted, never checked
# A client whose authentication failed gets its answer, then the connection closes this much later
# (Kafka: connection.failed.authentication.delay.ms, 100 by default): a guessing client pays a
# round trip and a reconnect per guess, and cannot tell a slow check from a failed one.
AUTH_FAILURE_CLOSE_DELAY_S: Final = 0.1


@dataclass(slots=True)
class ConnectionAuth:
    peer: str
    tls: bool = False
    principal: str | None = ANONYMOUS
    exchange: Exchange | None = None
    raw_tokens: bool = False  # after a SaslHandshake v0: the tokens come without Kafka headers

    @classmethod
    def for_connection(
        cls, sasl: SaslConfig, peer: str, from_peer: bool, tls: bool = False
    ) -> ConnectionAuth:
        if from_peer:
            return cls(peer, tls, CORE_PRINCIPAL)
        return cls(peer, tls, None if sasl.enabled else ANONYMOUS)

    def tls_established(self, cert_principal: str | None, sasl: SaslConfig) -> None:
        """The handshake is done: a client certificate names the principal, unless SASL will."""
        self.tls = True
        if cert_principal is not None and not sasl.enabled:
            self.principal = cert_principal

    @property
    def authenticated(self) -> bool:
        return self.principal is not None
