"""The client's half of the SASL exchange docs/PROTOCOL.md §4.15 describes: which request comes
next and what its token is (sans-I/O, like the rest of this package: the caller sends).

Both clients of a broker use it, as one `SaslLogin` per connection: the Python client
(broker/client/connection.py) and a broker's own links to the other nodes of its cluster
(broker/core/remote.py), which authenticate as the inter-broker user. SCRAM (RFC 5802/7677) is
`scramp`'s client, which also checks the server's final signature: a server that does not know
the password cannot pass for the real one.
"""

from __future__ import annotations

from scramp import ScramClient, ScramException

from ringlog_proto import messages as m


class ScramExchange:
    """The client's half of one SCRAM exchange; raises `ValueError` when the server's answer does
    not prove it knows the password (or is not SCRAM at all)."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self._client = ScramClient([mechanism], username, password)

    def first(self) -> bytes:
        return self._client.get_client_first().encode()

    def final(self, server_first: bytes) -> bytes:
        try:
            self._client.set_server_first(server_first.decode())
            return self._client.get_client_final().encode()
        except (ScramException, UnicodeDecodeError) as exc:
            raise ValueError(f"the broker's SCRAM message is not valid: {exc}") from exc

    def verify(self, server_final: bytes) -> None:
        try:
            self._client.set_server_final(server_final.decode())
        except (ScramException, UnicodeDecodeError) as exc:
            raise ValueError(f"the broker did not prove it knows the password: {exc}") from exc


def plain_token(username: str, password: str) -> bytes:
    """RFC 4616: authzid (empty), authcid and password, NUL-separated."""
    return b"\0" + username.encode() + b"\0" + password.encode()


class SaslLogin:
    """The client's half of one connection's SASL exchange (docs/PROTOCOL.md §4.15), as requests
    and answers: SaslHandshake, then one SaslAuthenticate (PLAIN) or two (SCRAM, whose last answer
    must prove the broker knows the password). `answer` raises ValueError when refused.

        req = login.first()
        while req is not None:
            req = login.answer(await send(req))
    """

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self.mechanism = mechanism
        self._user = user
        self._password = password
        self._scram = None if mechanism == "PLAIN" else ScramExchange(mechanism, user, password)
        self._answers = 0

    def first(self) -> m.Request:
        return m.SaslHandshakeRequest(self.mechanism)

    def answer(self, response: m.Response) -> m.Request | None:
        """The next request of the exchange, or None when it succeeded."""
        if response.error != m.ErrorCode.NONE:
            raise ValueError(f"{response.error.name}: {response.message}")
        self._answers += 1
        scram = self._scram
        if self._answers == 1:
            token = plain_token(self._user, self._password) if scram is None else scram.first()
            return m.SaslAuthenticateRequest(token)
        if scram is None:
            return None
        if not isinstance(response, m.SaslAuthenticateResponse):
            raise ValueError(f"a SaslAuthenticate answered with api {response.API_KEY}")
        if self._answers == 2:
            return m.SaslAuthenticateRequest(scram.final(response.auth_bytes))
        scram.verify(response.auth_bytes)
        return None


__all__ = ["SaslLogin", "ScramExchange", "plain_token"]
