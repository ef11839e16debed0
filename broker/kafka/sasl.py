"""SASL on the Kafka listener: SaslHandshake (v0-1) and SaslAuthenticate (v0-2), KIP-43 and KIP-152.

Rules this module keeps:
- When the listener requires SASL (`broker serve --sasl-mechanisms`), a connection may send only
  ApiVersions, SaslHandshake and SaslAuthenticate until it has authenticated; anything else
  closes it, as Kafka does (`gate`). Without SASL every connection is User:ANONYMOUS and a
  SaslHandshake is answered UNSUPPORTED_SASL_MECHANISM with no mechanisms.
- SaslHandshake names the mechanism; v1 is followed by SaslAuthenticate requests carrying the
  tokens, v0 by bare tokens, each framed by a 4-byte size and nothing else (`raw_token`).
- A failed exchange answers SASL_AUTHENTICATION_FAILED with Kafka's own generic message (neither
  the user nor which part was wrong), then the connection closes after
  `AUTH_FAILURE_CLOSE_DELAY_S` (`Reply.then_close`); a v0 client gets no answer, only the close.
- The mechanisms themselves (PLAIN, SCRAM) are broker/security/sasl.py's, shared with our own
  protocol.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.kafka.codec import SASL_AUTHENTICATE, KafkaRequest, encode_response, make, response_schema
from broker.security.sasl import FAILED_MESSAGE, AuthenticationFailed, Authenticator
from broker.security.session import ConnectionAuth
from ringlog_proto.frames import ProtocolError

SASL_HANDSHAKE: Final = 17
VERSIONS: Final = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
API_VERSIONS: Final = 18
ALLOWED_BEFORE_AUTH: Final = frozenset((API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE))
_SIZE = struct.Struct(">i")
NO_LIFETIME: Final = datetime.timedelta(0)  # KIP-368: sessions are not re-authenticated


def gate(request: KafkaRequest, auth: ConnectionAuth) -> None:
    """Raise `ProtocolError` (the connection closes) for a request before authentication."""
    if not auth.authenticated and request.api_key not in ALLOWED_BEFORE_AUTH:
        raise ProtocolError(
            f"kafka api {request.api_key} before SASL authentication: this listener requires it"
        )


def _reply(request: KafkaRequest, **values: Any) -> Reply:
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    return Reply(encode_response(request.correlation_id, make(schema, **values)))


def handshake(
    authenticator: Authenticator | None, request: KafkaRequest, body: Any, auth: ConnectionAuth
) -> Outcome:
    offered = authenticator.config.offered(auth.tls) if authenticator is not None else ()
    if authenticator is None:
        return _reply(request, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=())
    if auth.authenticated or auth.exchange is not None:  # a second handshake
        reply = _reply(request, error_code=ErrorCode.illegal_sasl_state, mechanisms=offered)
        reply.then_close = True
        return reply
    exchange = authenticator.start(str(body.mechanism), auth.tls, auth.peer)
    if exchange is None:
        return _reply(request, error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=offered)
    auth.exchange = exchange
    auth.raw_tokens = request.api_version == 0
    return _reply(request, error_code=ErrorCode.none, mechanisms=offered)


def authenticate(
    authenticator: Authenticator | None, request: KafkaRequest, body: Any, auth: ConnectionAuth
) -> Outcome:
    exchange = auth.exchange
    if authenticator is None:  # a listener without SASL: answered, as Kafka does, not closed
        return _reply(
            request,
            error_code=ErrorCode.illegal_sasl_state,
            error_message="this listener has no SASL",
            auth_bytes=b"",
            session_lifetime=NO_LIFETIME,
        )
    if exchange is None or auth.raw_tokens or auth.authenticated:
        reply = _reply(
            request,
            error_code=ErrorCode.illegal_sasl_state,
            error_message="SaslAuthenticate without a SaslHandshake v1 before it",
            auth_bytes=b"",
            session_lifetime=NO_LIFETIME,
        )
        reply.then_close = True
        return reply
    try:
        out = exchange.step(bytes(body.auth_bytes))
    except AuthenticationFailed:
        reply = _reply(
            request,
            error_code=ErrorCode.sasl_authentication_failed,
            error_message=FAILED_MESSAGE,
            auth_bytes=b"",
            session_lifetime=NO_LIFETIME,
        )
        reply.then_close = True
        return reply
    if exchange.principal is not None:
        auth.principal = exchange.principal
        auth.exchange = None
    return _reply(
        request, error_code=ErrorCode.none, error_message=None, auth_bytes=out, session_lifetime=NO_LIFETIME
    )


def raw_token(token: bytes, auth: ConnectionAuth) -> Outcome:
    """A bare token after a SaslHandshake v0: the answer is a bare token too; a failure closes."""
    exchange = auth.exchange
    assert exchange is not None
    try:
        out = exchange.step(token)
    except AuthenticationFailed as exc:
        raise ProtocolError("SASL authentication failed (handshake v0)") from exc
    if exchange.principal is not None:
        auth.principal = exchange.principal
        auth.exchange = None
        auth.raw_tokens = False
    return Reply([_SIZE.pack(len(out)), out])
