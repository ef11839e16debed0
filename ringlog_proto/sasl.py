"""The client's half of the SASL mechanisms docs/PROTOCOL.md §4.15 carries: the tokens, not the
frames (sans-I/O, like the rest of this package).

Both clients of a broker use it: the Python client (broker/client/connection.py) and a broker's
own links to the other nodes of its cluster (broker/core/remote.py), which authenticate as the
inter-broker user. SCRAM (RFC 5802/7677) is `scramp`'s client, which also checks the server's
final signature: a server that does not know the password cannot pass for the real one.
"""

from __future__ import annotations

from scramp import ScramClient, ScramException


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


__all__ = ["ScramExchange", "plain_token"]
