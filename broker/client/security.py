"""TLS and SASL for the client's connections: what a broker with `--tls-cert` or
`--sasl-mechanisms` asks of a client (docs/SECURITY.md).

Rules this module keeps:
- One `Security` per client, given to the producer, consumer or admin (`security=`); every
  connection the client opens (bootstrap, each core's direct port) gets the same TLS settings and
  runs the same SASL exchange before any other request. Without it nothing changes: plaintext,
  no authentication, as before.
- TLS verifies the broker's certificate against `cafile` (or the system's CAs) and its host name,
  like every Kafka client (`ssl.endpoint.identification.algorithm=https`); `certfile`/`keyfile`
  present a client certificate (mutual TLS: its subject is the principal).
- The SASL exchange is docs/PROTOCOL.md §4.15: SaslHandshake, then SaslAuthenticate rounds. SCRAM
  (RFC 5802/7677) is scramp's client (ringlog_proto/sasl.py), which also checks the server's
  signature, so a broker that does not know the password cannot pass for the real one. PLAIN
  sends the password itself: use it over TLS only (the broker offers it only there, unless told
  otherwise).
- A refused exchange raises `AuthenticationFailedError` (not retriable: the same password fails
  again); the connection is closed by the broker.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Final

SCRAM_MECHANISMS: Final = ("SCRAM-SHA-512", "SCRAM-SHA-256")
PLAIN: Final = "PLAIN"
MECHANISMS: Final = (*SCRAM_MECHANISMS, PLAIN)


@dataclass(frozen=True)
class Security:
    """How a client protects its connections and proves who it is (module rules)."""

    tls: bool = False  # wrap every connection in TLS
    cafile: str | None = None  # the CA that signed the broker's certificate (None: the system's)
    certfile: str | None = None  # a client certificate, for mutual TLS
    keyfile: str | None = None  # its key (None: in certfile)
    check_hostname: bool = True  # the broker's certificate must name the host connected to
    ssl_context: ssl.SSLContext | None = None  # made by the caller: overrides the four above
    sasl_mechanism: str | None = None  # "SCRAM-SHA-512", "SCRAM-SHA-256" or "PLAIN"
    username: str = ""
    password: str = field(default="", repr=False)
    _context: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.sasl_mechanism is not None:
            mechanism = self.sasl_mechanism.upper()
            if mechanism not in MECHANISMS:
                raise ValueError(f"sasl_mechanism {self.sasl_mechanism!r}: one of {', '.join(MECHANISMS)}")
            object.__setattr__(self, "sasl_mechanism", mechanism)
            if not self.username:
                raise ValueError("sasl_mechanism needs a username (and a password)")
        if self.ssl_context is not None:
            object.__setattr__(self, "_context", self.ssl_context)
        elif self.tls:
            ctx = ssl.create_default_context(cafile=self.cafile)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = self.check_hostname
            if self.certfile is not None:
                ctx.load_cert_chain(self.certfile, self.keyfile)
            object.__setattr__(self, "_context", ctx)

    @property
    def context(self) -> ssl.SSLContext | None:
        """The TLS context of every connection, or None for plaintext."""
        return self._context

    @property
    def sasl(self) -> bool:
        return self.sasl_mechanism is not None


__all__ = ["MECHANISMS", "Security"]
