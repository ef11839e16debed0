"""The SASL server (broker/security/sasl.py) against scramp's client and hand-made PLAIN tokens,
over a real users file: right and wrong passwords, unknown users, PLAIN only where allowed, a
password change seen without a restart, and a file that holds no password."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from scramp import ScramClient

from broker.security.credentials import CredentialError, CredentialStore
from broker.security.sasl import PLAIN, AuthenticationFailed, Authenticator, SaslConfig

ALL = SaslConfig(mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))


def scram(auth: Authenticator, mechanism: str, user: str, password: str) -> str | None:
    """Run a whole SCRAM exchange; the principal, or None when the server refused."""
    ex = auth.start(mechanism, tls=False)
    assert ex is not None
    client = ScramClient([mechanism], user, password)
    try:
        first = ex.step(client.get_client_first().encode())
        client.set_server_first(first.decode())
        final = ex.step(client.get_client_final().encode())
    except AuthenticationFailed:
        return None
    client.set_server_final(final.decode())  # the server proved it knows the credential too
    return ex.principal


@pytest.fixture
def auth(tmp_path: Path) -> Authenticator:
    CredentialStore(str(tmp_path)).add("alice", "s3cret pass")
    return Authenticator(str(tmp_path), ALL)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram(auth: Authenticator, mechanism: str) -> None:
    assert scram(auth, mechanism, "alice", "s3cret pass") == "User:alice"
    assert scram(auth, mechanism, "alice", "wrong") is None
    assert scram(auth, mechanism, "mallory", "s3cret pass") is None
    assert auth.failures == 2 and auth.successes == 1


def test_plain(auth: Authenticator) -> None:
    def plain(token: bytes) -> str | None:
        ex = auth.start(PLAIN, tls=True)
        assert ex is not None
        try:
            assert ex.step(token) == b""
        except AuthenticationFailed:
            return None
        return ex.principal

    assert plain(b"\0alice\0s3cret pass") == "User:alice"
    assert plain(b"alice\0alice\0s3cret pass") == "User:alice"
    assert plain(b"\0alice\0wrong") is None
    assert plain(b"\0nobody\0s3cret pass") is None
    assert plain(b"bob\0alice\0s3cret pass") is None  # acting for another user
    assert plain(b"no separators") is None


def test_plain_only_over_tls_unless_allowed(tmp_path: Path) -> None:
    assert Authenticator(str(tmp_path), ALL).start(PLAIN, tls=False) is None
    assert Authenticator(str(tmp_path), ALL).start(PLAIN, tls=True) is not None
    allowed = SaslConfig(mechanisms=ALL.mechanisms, plain_without_tls=True)
    assert Authenticator(str(tmp_path), allowed).start(PLAIN, tls=False) is not None
    only = SaslConfig(mechanisms=("SCRAM-SHA-512",))
    assert Authenticator(str(tmp_path), only).start("SCRAM-SHA-256", tls=True) is None


def test_changes_are_seen_without_a_restart(tmp_path: Path, auth: Authenticator) -> None:
    store = CredentialStore(str(tmp_path))
    store.add("alice", "new password")
    assert scram(auth, "SCRAM-SHA-512", "alice", "s3cret pass") is None
    assert scram(auth, "SCRAM-SHA-512", "alice", "new password") == "User:alice"
    store.add("bob", "bob's")
    assert scram(auth, "SCRAM-SHA-256", "bob", "bob's") == "User:bob"
    store.remove("bob")
    assert scram(auth, "SCRAM-SHA-256", "bob", "bob's") is None
    assert store.users() == {"alice": ("SCRAM-SHA-256", "SCRAM-SHA-512")}


def test_the_file_holds_no_password_and_only_its_owner_reads_it(tmp_path: Path) -> None:
    store = CredentialStore(str(tmp_path))
    store.add("carol", "hunter2-but-longer")
    raw = Path(store.path).read_bytes()
    assert b"hunter2" not in raw and b"carol" in raw
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    with pytest.raises(CredentialError):
        store.add("bad name", "x")
    with pytest.raises(CredentialError):
        store.add("dave", "")
    with pytest.raises(CredentialError):
        store.remove("nobody")


def _client_final(mechanism: str, password: str, bare: str, server_first: str, nonce: str) -> str:
    """A client-final-message for `nonce`, computed here from RFC 5802 (not by the server's code)."""
    import base64
    import hashlib
    import hmac

    hf = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}[mechanism]
    attrs = dict(a.split("=", 1) for a in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(hf().name, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", hf).digest()
    without_proof = f"c=biws,r={nonce}"
    signature = hmac.new(
        hf(client_key).digest(), f"{bare},{server_first},{without_proof}".encode(), hf
    ).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


@pytest.mark.parametrize(
    ("form", "accepted"),
    [("exact", True), ("librdkafka<2.6.1", True), ("client nonce only", False), ("other", False)],
)
def test_scram_final_nonce(auth: Authenticator, form: str, accepted: bool) -> None:
    """librdkafka before 2.6.1 sends its nonce again in front of the combined one (librdkafka#4895;
    Debian's kcat is 2.0.2): accepted, as Kafka 3.8.1-3.9 do; any other nonce is refused."""
    ex = auth.start("SCRAM-SHA-512", tls=False)
    assert ex is not None
    bare = "n=alice,r=cl13nt=n0nce"
    server_first = ex.step(f"n,,{bare}".encode()).decode()
    combined = server_first.split(",")[0].removeprefix("r=")
    assert combined.startswith("cl13nt=n0nce") and len(combined) > len("cl13nt=n0nce")
    nonce = {
        "exact": combined,
        "librdkafka<2.6.1": "cl13nt=n0nce" + combined,
        "client nonce only": "cl13nt=n0nce",
        "other": combined[:-1] + ("A" if combined[-1] != "A" else "B"),
    }[form]
    final = _client_final("SCRAM-SHA-512", "s3cret pass", bare, server_first, nonce)
    if accepted:
        assert ex.step(final.encode()).startswith(b"v=") and ex.principal == "User:alice"
    else:
        with pytest.raises(AuthenticationFailed):
            ex.step(final.encode())
        assert ex.principal is None
