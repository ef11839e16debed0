"""Users and their SCRAM credentials: `<data dir>/security/users.json`.

Rules this module keeps:
- A password is never stored. Each user has, per SCRAM mechanism (SCRAM-SHA-256, SCRAM-SHA-512),
  what RFC 5802 lets a server keep: a random salt, the iteration count, StoredKey = H(ClientKey)
  and ServerKey (made by `scramp`, a maintained SCRAM library). PLAIN is checked against the same
  record: the password given is salted and iterated as SCRAM would, and its StoredKey compared.
- The file is replaced atomically and durably, with permissions 0600, under an flock
  (broker/security/watched.py).
- The workers read it again when it changes (broker/security/watched.py; a stat costs
  microseconds against an authentication's PBKDF2): `broker users add` takes effect at the next
  authentication, without a restart.
- The document also holds the decoy secret (`decoy_secret`, 32 random bytes made by the first
  change that finds none): the key of the decoy credentials an unknown user is answered with
  (broker/security/sasl.py). It lives beside the users so that in a cluster, where the document
  is in etcd and every node keeps a copy, every node answers an unknown name the same; the copy
  is 0600 like the rest. Every salt is `SALT_BYTES`, decoys' too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from typing import Any, Final

from scramp import ScramMechanism

from broker.security.watched import Document, Documents, WatchedFile

SCRAM_MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
ITERATIONS_DEFAULT: Final = 8192  # Kafka's minimum is 4096 (so is scramp's)
ITERATIONS_MAX: Final = 1_000_000  # an authentication costs this many HMACs: bounded CPU per attempt
USERS_FILE: Final = "users.json"
SECURITY_DIR: Final = "security"
# Kafka's user names may be anything SCRAM can carry; ours keep to what a shell and an ACL line
# show unambiguously.
USER_NAME_RE: Final = re.compile(r"^[A-Za-z0-9._@-]{1,255}$")
# Names no user may have (compared without case): Kafka's principal of a connection that did not
# authenticate, and the name the cores' own principal had before it became a type of its own
# (broker/security/session.py): a user so named would read as one of them in ACLs and logs.
RESERVED_USER_NAMES: Final = frozenset(("anonymous", "ringlog-core"))
HASHES: Final = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
SALT_BYTES: Final = 32  # every user's salt (scramp's default length), and every decoy's
DECOY_SECRET_BYTES: Final = 32


class CredentialError(ValueError):
    """A user name or password that cannot be stored, or a user that does not exist."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def as_json(self) -> dict[str, object]:
        return {
            "salt": base64.b64encode(self.salt).decode(),
            "iterations": self.iterations,
            "stored_key": base64.b64encode(self.stored_key).decode(),
            "server_key": base64.b64encode(self.server_key).decode(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ScramCredential:
        return cls(
            base64.b64decode(str(doc["salt"])),
            int(doc["iterations"]),
            base64.b64decode(str(doc["stored_key"])),
            base64.b64decode(str(doc["server_key"])),
        )


def make_credential(mechanism: str, password: str, iterations: int = ITERATIONS_DEFAULT) -> ScramCredential:
    salt, stored_key, server_key, i = ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=iterations, salt=os.urandom(SALT_BYTES)
    )
    return ScramCredential(salt, i, stored_key, server_key)


def password_matches(mechanism: str, credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one `credential` was made from (for SASL/PLAIN)."""
    hf = HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(hf().name, password.encode(), credential.salt, credential.iterations)
    client_key = hmac.new(salted, b"Client Key", hf).digest()
    return hmac.compare_digest(hf(client_key).digest(), credential.stored_key)


def check_user_name(name: str) -> str:
    if not USER_NAME_RE.match(name):
        raise CredentialError(f"user name {name[:64]!r}: use 1-255 of A-Z a-z 0-9 . _ @ -")
    if name.lower() in RESERVED_USER_NAMES:
        raise CredentialError(f"user name {name!r} is reserved (the broker's own principals use it)")
    return name


def users_path(data_dir: str) -> str:
    return os.path.join(data_dir, SECURITY_DIR, USERS_FILE)


Users = dict[str, dict[str, ScramCredential]]


@dataclass(frozen=True, slots=True)
class UsersDocument:
    """The users file as read: the users, the decoy secret (None in a file made before there
    was one), and per mechanism every user's iteration count, sorted (a decoy takes one)."""

    users: Users
    decoy_secret: bytes | None
    iterations: dict[str, tuple[int, ...]]


def _parse_users(doc: object | None) -> UsersDocument:
    users: Users = {}
    secret: bytes | None = None
    if isinstance(doc, dict):
        for name, mechs in dict(doc.get("users", {})).items():
            users[name] = {m: ScramCredential.from_json(c) for m, c in mechs.items() if m in HASHES}
        if doc.get("decoy_secret"):
            secret = base64.b64decode(str(doc["decoy_secret"]))
    iterations = {
        m: tuple(sorted(c[m].iterations for c in users.values() if m in c)) for m in SCRAM_MECHANISMS
    }
    return UsersDocument(users, secret, iterations)


def _users_doc(users: Users, secret: bytes | None) -> dict[str, object]:
    return {
        "users": {n: {m: c.as_json() for m, c in mechs.items()} for n, mechs in sorted(users.items())},
        "decoy_secret": base64.b64encode(secret or os.urandom(DECOY_SECRET_BYTES)).decode(),
    }


class CredentialStore:
    """The users file of one data dir: read by the workers, changed by `broker users`."""

    def __init__(self, data_dir: str, documents: Documents | None = None) -> None:
        """The users of `data_dir`, or of a cluster (`documents`: broker/cluster/security_docs.py)."""
        self._file: Document[UsersDocument] = (
            WatchedFile(users_path(data_dir), _parse_users)
            if documents is None
            else documents.open(USERS_FILE, _parse_users)
        )
        self.path = self._file.path

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._file.get().users.get(user, {}).get(mechanism)

    def document(self) -> UsersDocument:
        """The whole document as last read (the decoys need its secret and iteration counts)."""
        return self._file.get()

    def users(self) -> dict[str, tuple[str, ...]]:
        """Every user and the mechanisms it has credentials for (never the credentials)."""
        return {name: tuple(sorted(mechs)) for name, mechs in sorted(self._file.get().users.items())}

    def add(
        self,
        user: str,
        password: str,
        mechanisms: tuple[str, ...] = SCRAM_MECHANISMS,
        iterations: int = ITERATIONS_DEFAULT,
    ) -> None:
        """Add `user`, or replace its password (every mechanism named gets a new salt)."""
        check_user_name(user)
        if not password:
            raise CredentialError("an empty password is not a password")
        if not 4096 <= iterations <= ITERATIONS_MAX:
            raise CredentialError(f"iterations must be in 4096..{ITERATIONS_MAX}, not {iterations}")
        for m in mechanisms:
            if m not in HASHES:
                raise CredentialError(f"unknown mechanism {m!r}: one of {', '.join(SCRAM_MECHANISMS)}")
        creds = {m: make_credential(m, password, iterations) for m in mechanisms}
        self._file.update(lambda doc: _users_doc({**doc.users, user: creds}, doc.decoy_secret))

    def remove(self, user: str) -> None:
        def change(doc: UsersDocument) -> dict[str, object]:
            if user not in doc.users:
                raise CredentialError(f"no user {user!r}")
            return _users_doc({n: c for n, c in doc.users.items() if n != user}, doc.decoy_secret)

        self._file.update(change)
