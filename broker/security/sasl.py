"""SASL on a connection: which mechanisms a listener offers, and the exchange of one connection.

Rules this module keeps:
- Protocol-neutral: the Kafka adapter (SaslHandshake, SaslAuthenticate) and our own protocol
  carry the same tokens; this module sees tokens, never frames.
- Mechanisms: PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, 7677; the server side
  is `scramp`'s). PLAIN sends the password itself, so it is offered only on a TLS connection,
  unless the operator allowed it in plaintext (`--sasl-plain-without-tls`).
- An unknown user gets the same exchange as a wrong password (a SCRAM salt made from the name, so
  asking twice gives the same answer): the failure names neither, and no timing says which.
- A principal is "User:<name>", as Kafka writes them (ACLs name principals).
- Failures are counted and logged at most once a second per reason, with the count suppressed;
  the password and the tokens never reach a log line or a metric.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from dataclasses import dataclass
from typing import Final

from scramp import ScramException, ScramMechanism

from broker.security.credentials import (
    ITERATIONS_DEFAULT,
    SCRAM_MECHANISMS,
    CredentialStore,
    ScramCredential,
    password_matches,
)

log = logging.getLogger(__name__)

PLAIN: Final = "PLAIN"
MECHANISMS: Final = (PLAIN, *SCRAM_MECHANISMS)
USER_PRINCIPAL: Final = "User:"
ANONYMOUS: Final = "User:ANONYMOUS"  # Kafka's principal for a connection that did not authenticate


class AuthenticationFailed(Exception):
    """The exchange failed: the client gets a generic message and the connection closes."""


@dataclass(frozen=True, slots=True)
class SaslConfig:
    """A listener's SASL settings (`broker serve --sasl-mechanisms`, `--sasl-plain-without-tls`)."""

    mechanisms: tuple[str, ...] = ()  # empty: SASL is off, every connection is ANONYMOUS
    plain_without_tls: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.mechanisms)

    def offered(self, tls: bool) -> tuple[str, ...]:
        """The mechanisms a connection may use: PLAIN only over TLS unless allowed in plaintext."""
        return tuple(m for m in self.mechanisms if m != PLAIN or tls or self.plain_without_tls)


class _RateLimitedWarnings:
    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warn(self, reason: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(reason, -10.0) < 1.0:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        more = self._suppressed.pop(reason, 0)
        self._last[reason] = now
        log.warning(message + (f" (and {more} more in the last second)" if more else ""), *args)


class Authenticator:
    """A worker's SASL server: the credential store, the settings, the failure count."""

    def __init__(self, data_dir: str, config: SaslConfig) -> None:
        self.config = config
        self.store = CredentialStore(data_dir)
        self.failures = 0
        self.successes = 0
        self._warnings = _RateLimitedWarnings()
        self._secret = os.urandom(32)  # fake salts for unknown users: stable within a worker

    def start(self, mechanism: str, tls: bool, peer: str = "") -> Exchange | None:
        """An exchange of `mechanism`, or None when this connection may not use it."""
        if mechanism not in self.config.offered(tls):
            return None
        return Exchange(self, mechanism, peer)

    def failed(self, peer: str, mechanism: str, user: str | None) -> None:
        self.failures += 1
        self._warnings.warn(
            "authentication failed", "authentication failed: %s, %s, user %r", peer, mechanism, user
        )

    def scram_auth(self, mechanism: str, user: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's auth_fn: the user's credential, or a decoy that can never verify."""
        cred = self.store.lookup(user, mechanism)
        if cred is None:
            digest = hmac.new(self._secret, f"{mechanism}\0{user}".encode(), hashlib.sha256).digest()
            cred = ScramCredential(digest[:16], ITERATIONS_DEFAULT, os.urandom(64), os.urandom(64))
        return cred.salt, cred.stored_key, cred.server_key, cred.iterations


def _sasl_name(raw: str) -> str:
    """RFC 5802's saslname: ',' and '=' arrive as '=2C' and '=3D'."""
    return raw.replace("=2C", ",").replace("=3D", "=")


class Exchange:
    """One connection's authentication: `step(token)` until `principal` is set."""

    def __init__(self, auth: Authenticator, mechanism: str, peer: str = "") -> None:
        self.auth = auth
        self.mechanism = mechanism
        self.peer = peer
        self.principal: str | None = None
        self.user: str | None = None
        self._scram = None if mechanism == PLAIN else ScramMechanism(mechanism).make_server(self._lookup)
        self._round = 0

    def _lookup(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        self.user = _sasl_name(user)
        return self.auth.scram_auth(self.mechanism, self.user)

    def step(self, token: bytes) -> bytes:
        """The server's answer to the client's next token. Raises `AuthenticationFailed` (counted
        and logged); once `principal` is set the exchange is over."""
        try:
            return self._step(token)
        except AuthenticationFailed:
            self.auth.failed(self.peer, self.mechanism, self.user)
            raise

    def _step(self, token: bytes) -> bytes:
        if self.principal is not None:
            raise AuthenticationFailed("already authenticated")
        self._round += 1
        if self._scram is None:
            return self._plain(token)
        try:
            text = token.decode("utf-8")
            if self._round == 1:
                self._scram.set_client_first(text)
                return self._scram.get_server_first().encode()
            if self._round == 2:
                self._scram.set_client_final(text)
                final = self._scram.get_server_final().encode()
                self.principal = USER_PRINCIPAL + (self.user or "")
                self.auth.successes += 1
                return final
        except (ScramException, UnicodeDecodeError, ValueError, KeyError) as exc:
            raise AuthenticationFailed(f"{self.mechanism} authentication failed") from exc
        raise AuthenticationFailed("unexpected SASL token")

    def _plain(self, token: bytes) -> bytes:
        try:
            authzid, authcid, password = token.decode("utf-8").split("\0")
        except (UnicodeDecodeError, ValueError) as exc:
            raise AuthenticationFailed("malformed PLAIN token") from exc
        self.user = authcid
        if authzid and authzid != authcid:  # acting as another user is not supported
            raise AuthenticationFailed("PLAIN authentication failed")
        store = self.auth.store
        mechanism = next((m for m in reversed(SCRAM_MECHANISMS) if store.lookup(authcid, m)), None)
        cred = store.lookup(authcid, mechanism) if mechanism is not None else None
        if mechanism is None or cred is None:
            # the same work as a real check, so the time taken does not say the user is unknown
            decoy = ScramCredential(b"\0" * 16, ITERATIONS_DEFAULT, b"", b"")
            password_matches("SCRAM-SHA-512", decoy, password)
            raise AuthenticationFailed("PLAIN authentication failed")
        if not password_matches(mechanism, cred, password):
            raise AuthenticationFailed("PLAIN authentication failed")
        self.principal = USER_PRINCIPAL + authcid
        self.auth.successes += 1
        return b""
