"""TLS on the client listeners (`broker serve --tls-cert --tls-key [--tls-client-ca]`).

Rules this module keeps:
- Python's `ssl` does the cryptography. The uvloop backend hands the context to asyncio's TLS
  (`create_server(ssl=...)`); the io_uring backend drives a `TlsSession`: an `ssl.SSLObject`
  between two memory BIOs, fed the ciphertext its ring receives and giving back the ciphertext to
  send, so the handshake never blocks the loop (kernel TLS is not built on the machine this was
  written on: no untested code for it).
- TLS 1.2 at least, and on TLS 1.2 only AEAD suites with forward secrecy (`TLS12_CIPHERS`:
  ECDHE key exchange, AES-GCM or ChaCha20-Poly1305), as TLS 1.3 has only those: OpenSSL's default
  list also offered CBC suites with HMAC-SHA1 and RSA key exchange. Every TLS 1.2 client of the
  last decade (librdkafka, Java 8+, Python) has the ECDHE-GCM ones.
- With `--tls-client-ca` a client must present a certificate that CA signed (mutual TLS), and
  its subject becomes the connection's principal, written as Kafka's default
  mapping writes it: "User:" + the distinguished name, most specific first ("User:CN=alice,O=acme").
  SASL, when the listener has it too, names the principal instead.
- Inter-core links (unix sockets between the cores of one broker) are not wrapped. A cluster's
  links between nodes (the replica fetcher's, broker/core/remote.py) are: a node whose listeners
  serve TLS connects to its peers' (which share its settings) as a TLS client (`peer_context`).
  It checks the peer's certificate against `--tls-peer-ca` (else `--tls-client-ca`, else the
  system's CAs) and that it names the address connected to (an IP: the certificate needs it as
  an IP subjectAltName), and presents its own certificate, which a peer with
  `--tls-client-ca` requires. Without SASL its subject is then the node's principal there,
  which replication needs as a super user: the operator names it in `--super-users`.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from broker.security.sasl import USER_PRINCIPAL

TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0  # a client that connects and never finishes is closed
# OpenSSL's names for TLS 1.2's suites (TLS 1.3's are set apart and are all AEAD with ECDHE)
TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"
_SHORT_NAMES: Final = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "domainComponent": "DC",
    "emailAddress": "EMAILADDRESS",
    "userId": "UID",
}


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert: str = ""  # PEM: the server's certificate chain
    key: str = ""  # PEM: its private key
    client_ca: str = ""  # PEM: CAs whose client certificates are required (mutual TLS); "": none
    peer_ca: str = ""  # PEM: CAs that signed the other nodes' certificates; "": client_ca's

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


def server_context(config: TlsConfig) -> ssl.SSLContext:
    """The listeners' context; raises `ssl.SSLError` or `OSError` for files that do not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.load_cert_chain(config.cert, config.key)
    if config.client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(config.client_ca)
    return ctx


def peer_context(config: TlsConfig) -> ssl.SSLContext:
    """The client context of this node's links to its peers' cores (module rules)."""
    ctx = ssl.create_default_context(cafile=config.peer_ca or config.client_ca or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.load_cert_chain(config.cert, config.key)
    return ctx


def principal_of(peercert: dict[str, Any] | None) -> str | None:
    """ "User:<distinguished name>" of a verified client certificate, or None without one."""
    if not peercert or not peercert.get("subject"):
        return None
    parts = []
    for rdn in reversed(peercert["subject"]):
        for key, value in rdn:
            parts.append(f"{_SHORT_NAMES.get(key, key)}={_escape(value)}")
    return USER_PRINCIPAL + ",".join(parts)


def _escape(value: str) -> str:
    """RFC 4514's escapes, so a "," inside a name cannot forge another attribute."""
    out = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" "):
        out = out[:-1] + "\\ "
    return out


class TlsSession:
    """Sans-I/O TLS for one connection: `feed` ciphertext in, plaintext out; `encrypt` plaintext
    into ciphertext; `pending()` is the ciphertext to send now (handshake records, alerts,
    tickets). A server's by default; with `server_hostname`, a client's (a link to a peer),
    whose `start()` makes its first flight. Raises `ssl.SSLError` on a broken or refused
    handshake (a client's: also a certificate that does not verify)."""

    __slots__ = ("_in", "_out", "_ssl", "handshake_done")

    def __init__(self, ctx: ssl.SSLContext, server_hostname: str | None = None) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = ctx.wrap_bio(
            self._in, self._out, server_side=server_hostname is None, server_hostname=server_hostname
        )
        self.handshake_done = False

    def start(self) -> bytes:
        """A client's first flight (its ClientHello), to send once connected."""
        self._handshake()
        return self._out.read()

    def _handshake(self) -> bool:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            return False
        self.handshake_done = True
        return True

    def feed(self, data: bytes | memoryview) -> tuple[list[bytes], bool]:
        """The plaintext `data` completes (in one piece: a read hands out a TLS record, at most
        16 KiB, and the frame decoder behind is cheaper fed once than once per record), and
        whether the other end closed (close_notify)."""
        self._in.write(data)
        if not self.handshake_done and not self._handshake():
            return [], False
        out: list[bytes] = []
        eof = False
        while True:
            try:
                chunk = self._ssl.read(65536)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            out.append(chunk)
        return ([b"".join(out)] if len(out) > 1 else out), eof

    def encrypt(self, buffers: Sequence[bytes | bytearray | memoryview]) -> bytes:
        for b in buffers:
            self._ssl.write(b)
        return self._out.read()

    def pending(self) -> bytes:
        return self._out.read()

    def peer_principal(self) -> str | None:
        return principal_of(self._ssl.getpeercert())
