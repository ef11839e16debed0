"""SASL on a connection: which mechanisms a listener offers, and the exchange of one connection.

Rules this module keeps:
- Protocol-neutral: the Kafka adapter (SaslHandshake, SaslAuthenticate) and our own protocol
  carry the same tokens; this module sees tokens, never frames.
- Mechanisms: PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, 7677; `ScramServer`
  below, tested against `scramp`'s client and librdkafka's). PLAIN sends the password itself, so
  it is offered only on a TLS connection, unless the operator allowed it in plaintext
  (`--sasl-plain-without-tls`). No channel binding (a "p=" client is refused): Kafka has none.
- librdkafka before 2.6.1 puts its own nonce in front of the combined nonce in its final message
  (librdkafka#4895; kcat here is 2.0.2). As Kafka 3.8.1-3.9 did, that one form is accepted too:
  the proof still covers the message as sent, and the server's nonce is still in it, so it
  proves the same thing. Anything else but the exact nonce is refused.
- An unknown user gets the same exchange as a wrong password: a decoy credential made from the
  name and the decoy secret (`Authenticator.decoy`), with a salt of the same length as a real
  one and an iteration count taken from the real users' (all of them share the default unless
  the operator chose otherwise: then a decoy shows each count as often as the users have it).
  The secret is in the users document (broker/security/credentials.py), so every core, every
  restart and, in a cluster, every node answers a name the same; before the first
  `broker users add` there is none, and `<data dir>/security/decoy.key` (0600, made by the first
  worker that needs it) stands in. PLAIN checks a wrong password of an unknown user against its
  decoy: the same PBKDF2, the same time. The failure names neither.
- A principal is "User:<name>", as Kafka writes them (ACLs name principals).
- Failures are counted and logged at most once a second per reason, with the count suppressed;
  the password and the tokens never reach a log line or a metric. A line names the user only
  when it is one (escaped, and at most `LOGGED_NAME_MAX` characters): a name that is no user's
  is whatever an unauthenticated client sent (a password typed in the wrong field, or megabytes
  of it), so the line gives its length instead. A line is thus a few hundred bytes at most.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from broker.security.credentials import (
    DECOY_SECRET_BYTES,
    HASHES,
    ITERATIONS_DEFAULT,
    SALT_BYTES,
    SCRAM_MECHANISMS,
    SECURITY_DIR,
    CredentialStore,
    ScramCredential,
    password_matches,
)

log = logging.getLogger(__name__)

PLAIN: Final = "PLAIN"
MECHANISMS: Final = (PLAIN, *SCRAM_MECHANISMS)
USER_PRINCIPAL: Final = "User:"
ANONYMOUS: Final = "User:ANONYMOUS"  # Kafka's principal for a connection that did not authenticate
# What a client whose exchange failed is told, whatever was wrong: Kafka's words, on both protocols
FAILED_MESSAGE: Final = "Authentication failed: Invalid username or password"
LOGGED_NAME_MAX: Final = 64  # characters of a user's name a failure's log line shows


class AuthenticationFailed(Exception):
    """The exchange failed: the client gets a generic message and the connection closes."""


@dataclass(frozen=True, slots=True)
class InterBrokerLogin:
    """Who a node of a cluster is to the others (`--inter-broker-user`): its links to their cores
    (the replica fetcher's, broker/core/remote.py) run the SASL exchange as this user, as Kafka's
    brokers do with `sasl.mechanism.inter.broker.protocol`. Every node that has it treats its
    principal as a super user (the replica fetch needs alter on the cluster): whoever holds this
    password can already read every partition by being a node."""

    user: str
    password: str = field(repr=False)

    @property
    def principal(self) -> str:
        return USER_PRINCIPAL + self.user


# Where a node's workers find the inter-broker password (their spec is on their command line,
# which `ps` shows; an environment only its user and root can read), and where `broker serve`
# looks for it without --inter-broker-password-file.
INTER_BROKER_PASSWORD_ENV: Final = "RINGLOG_INTER_BROKER_PASSWORD"

# What a node authenticates to its peers with, best first (PLAIN only where it is offered).
PEER_MECHANISMS: Final = ("SCRAM-SHA-512", "SCRAM-SHA-256", PLAIN)


@dataclass(frozen=True, slots=True)
class SaslConfig:
    """A listener's SASL settings (`broker serve --sasl-mechanisms`, `--sasl-plain-without-tls`)."""

    mechanisms: tuple[str, ...] = ()  # empty: SASL is off, every connection is ANONYMOUS
    plain_without_tls: bool = False
    inter_broker: InterBrokerLogin | None = None  # a cluster's nodes: how they log in to each other

    @property
    def super_users(self) -> tuple[str, ...]:
        """The principals SASL itself makes super users: the inter-broker user's."""
        return (self.inter_broker.principal,) if self.inter_broker is not None else ()

    def peer_mechanism(self, tls: bool) -> str | None:
        """The mechanism this node's links to its peers use (they share its settings), or None
        when SASL is off."""
        offered = self.offered(tls)
        return next((m for m in PEER_MECHANISMS if m in offered), None)

    @property
    def enabled(self) -> bool:
        return bool(self.mechanisms)

    def offered(self, tls: bool) -> tuple[str, ...]:
        """The mechanisms a connection may use: PLAIN only over TLS unless allowed in plaintext."""
        return tuple(m for m in self.mechanisms if m != PLAIN or tls or self.plain_without_tls)


def parse_mechanisms(text: str) -> tuple[str, ...]:
    """`--sasl-mechanisms`: a comma-separated list of MECHANISMS (case-insensitive), in order."""
    out: list[str] = []
    for part in text.split(","):
        name = part.strip().upper()
        if not name:
            continue
        if name not in MECHANISMS:
            raise ValueError(f"unknown mechanism {part.strip()!r}: one of {', '.join(MECHANISMS)}")
        if name not in out:
            out.append(name)
    return tuple(out)


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
        self._data_dir = data_dir
        self._fallback_secret: bytes | None = None  # decoy.key's, read once (module rules)
        self.on_failure: Callable[[], None] = lambda: None  # the core's metrics counter

    def start(self, mechanism: str, tls: bool, peer: str = "") -> Exchange | None:
        """An exchange of `mechanism`, or None when this connection may not use it."""
        if mechanism not in self.config.offered(tls):
            return None
        return Exchange(self, mechanism, peer)

    def failed(self, peer: str, mechanism: str, user: str | None) -> None:
        self.failures += 1
        self.on_failure()
        self._warnings.warn(
            "authentication failed", "authentication failed: %s, %s, %s", peer, mechanism, self._who(user)
        )

    def _who(self, user: str | None) -> str:
        """How a failure's log line names the user it claimed (module rules)."""
        if user is None:
            return "no user name"
        if not any(self.store.lookup(user, m) is not None for m in SCRAM_MECHANISMS):
            return f"a user name that is no user's ({len(user)} characters)"
        shown = user[:LOGGED_NAME_MAX].encode("unicode_escape").decode("ascii")
        return f"user {shown}" + ("..." if len(user) > LOGGED_NAME_MAX else "")

    def credential(self, mechanism: str, user: str) -> ScramCredential:
        """The user's credential, or a decoy that can never verify (see the module rules)."""
        cred = self.store.lookup(user, mechanism)
        return cred if cred is not None else self.decoy(mechanism, user)

    def decoy(self, mechanism: str, user: str) -> ScramCredential:
        """What an unknown `user` is answered with: a salt and an iteration count made from the
        decoy secret and the name, so the same on every core, node and restart; keys no
        password matches (random, and a PBKDF2 result equal to them is out of reach)."""
        doc = self.store.document()
        secret = doc.decoy_secret or self._local_secret()

        def derived(what: str) -> bytes:
            return hmac.new(secret, f"{what}\0{mechanism}\0{user}".encode(), hashlib.sha512).digest()

        counts = doc.iterations.get(mechanism) or (ITERATIONS_DEFAULT,)
        iterations = counts[int.from_bytes(derived("iterations")[:8], "big") % len(counts)]
        size = HASHES[mechanism]().digest_size
        return ScramCredential(derived("salt")[:SALT_BYTES], iterations, os.urandom(size), os.urandom(size))

    def _local_secret(self) -> bytes:
        """The data dir's own decoy secret, for a users document without one (module rules):
        made once, atomically (a link never replaces a file another worker made first)."""
        if self._fallback_secret is not None:
            return self._fallback_secret
        path = os.path.join(self._data_dir, SECURITY_DIR, "decoy.key")
        try:
            try:
                with open(path, "rb") as f:
                    secret = f.read()
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                tmp = f"{path}.{os.getpid()}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.write(fd, os.urandom(DECOY_SECRET_BYTES))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass  # another worker's came first: everyone uses that one
                finally:
                    os.unlink(tmp)
                with open(path, "rb") as f:
                    secret = f.read()
            if len(secret) < DECOY_SECRET_BYTES:
                raise OSError(f"{path} holds {len(secret)} bytes, not {DECOY_SECRET_BYTES}")
        except OSError as exc:
            log.warning(
                "decoy secret: %s; this worker makes its own, so unknown users' salts differ by core", exc
            )
            secret = os.urandom(DECOY_SECRET_BYTES)
        self._fallback_secret = secret
        return secret


def _sasl_name(raw: str) -> str:
    """RFC 5802's saslname: ',' and '=' arrive as '=2C' and '=3D'."""
    return raw.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """The server side of one SCRAM exchange (RFC 5802): `client_first`, `server_first`,
    `client_final`, in that order; a ValueError at any step ends it."""

    def __init__(self, mechanism: str) -> None:
        self.hf = HASHES[mechanism]
        self._cred: ScramCredential | None = None

    def client_first(self, text: str) -> str:
        """Read the client's first message; the user name it names."""
        gs2, _, bare = text.partition(",")
        authzid, _, bare = bare.partition(",")
        if gs2 not in ("n", "y"):
            raise ValueError("channel binding is not supported")
        attrs = _attributes(bare)
        user, nonce = attrs.get("n"), attrs.get("r")
        if not user or not nonce or "m" in attrs or attrs.get("tokenauth") == "true":
            raise ValueError("client-first-message without n= and r=, or asking for what is not offered")
        if authzid and _sasl_name(authzid.removeprefix("a=")) != _sasl_name(user):
            raise ValueError("acting as another user is not supported")
        self._gs2 = f"{gs2},{authzid},"
        self._bare = bare
        self._client_nonce = nonce
        return _sasl_name(user)

    def server_first(self, cred: ScramCredential) -> str:
        self._cred = cred
        self._nonce = self._client_nonce + base64.b64encode(os.urandom(24)).decode()
        salt = base64.b64encode(cred.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={cred.iterations}"
        return self._server_first

    def client_final(self, text: str) -> str:
        """Check the client's proof; the server's signature (the client checks it in turn)."""
        cred = self._cred
        assert cred is not None
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise ValueError("client-final-message without a proof")
        attrs = _attributes(without_proof)
        if base64.b64decode(attrs.get("c", "")) != self._gs2.encode():
            raise ValueError("channel binding data differs from the first message's")
        nonce = attrs.get("r", "")
        if nonce != self._nonce and nonce != self._client_nonce + self._nonce:  # librdkafka#4895
            raise ValueError("nonce differs from the server's")
        auth_message = f"{self._bare},{self._server_first},{without_proof}".encode()
        hf = self.hf
        signature = hmac.new(cred.stored_key, auth_message, hf).digest()
        proof = base64.b64decode(proof_b64, validate=True)
        if len(proof) != len(signature):
            raise ValueError("proof of the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hf(client_key).digest(), cred.stored_key):
            raise ValueError("wrong proof")
        server_signature = hmac.new(cred.server_key, auth_message, hf).digest()
        return "v=" + base64.b64encode(server_signature).decode()


def _attributes(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key in out:
            raise ValueError("malformed SCRAM attribute")
        out[key] = value
    return out


class Exchange:
    """One connection's authentication: `step(token)` until `principal` is set."""

    def __init__(self, auth: Authenticator, mechanism: str, peer: str = "") -> None:
        self.auth = auth
        self.mechanism = mechanism
        self.peer = peer
        self.principal: str | None = None
        self.user: str | None = None
        self._scram = None if mechanism == PLAIN else ScramServer(mechanism)
        self._round = 0

    def step(self, token: bytes) -> bytes:
        """The server's answer to the client's next token. Raises `AuthenticationFailed` (counted
        and logged); once `principal` is set the exchange is over."""
        try:
            return self._step(token)
        except AuthenticationFailed as exc:
            log.debug("%s exchange with %s failed: %s", self.mechanism, self.peer, exc.__cause__ or exc)
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
                self.user = self._scram.client_first(text)
                return self._scram.server_first(self.auth.credential(self.mechanism, self.user)).encode()
            if self._round == 2:
                final = self._scram.client_final(text).encode()
                self.principal = USER_PRINCIPAL + (self.user or "")
                self.auth.successes += 1
                return final
        except (UnicodeDecodeError, ValueError, KeyError) as exc:
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
        found = [(m, c) for m in reversed(SCRAM_MECHANISMS) if (c := store.lookup(authcid, m)) is not None]
        if not found:
            # the work a real user's check costs (its decoy's iterations, the mechanism most
            # users' PLAIN is checked with), so the time taken does not say the user is unknown
            counts = store.document().iterations
            mechanism = (
                "SCRAM-SHA-512" if counts["SCRAM-SHA-512"] or not counts["SCRAM-SHA-256"] else "SCRAM-SHA-256"
            )
            password_matches(mechanism, self.auth.decoy(mechanism, authcid), password)
            raise AuthenticationFailed("PLAIN authentication failed")
        mechanism, cred = found[0]  # SCRAM-SHA-512's when the user has both
        if not password_matches(mechanism, cred, password):
            raise AuthenticationFailed("PLAIN authentication failed")
        self.principal = USER_PRINCIPAL + authcid
        self.auth.successes += 1
        return b""
