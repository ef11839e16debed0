"""The cluster's users and ACLs in the metadata store, and each node's copy of them.

Rules this module keeps:
- `security/users.json` and `security/acls.json` under the cluster's prefix hold the documents a
  single node keeps in its data dir (broker/security/credentials.py, acls.py): salted SCRAM
  credentials, never a password, and the ACL bindings. `broker users|acls ... --etcd` changes
  them through `EtcdDocuments`, each change one transaction compared with the revision it read:
  of two commands at once, one reads the other's result and applies its change to it.
- Each node's agent copies every change into its data dir's security/ files (`write_copies`),
  which the workers already read again at their next request: a user or an ACL added once
  applies on every node within a watch event, and a node that was down catches up at its next
  full read. The copies carry `MIRROR_OF`, so a command run against a node's data dir is refused
  instead of being silently undone. A document absent from the store is an empty copy: in a
  cluster the cluster's word wins over what a node held alone before it joined (logged).
- Blocking store calls: the CLI and the agent's threads make them, never a worker's loop.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Final, Generic, TypeVar

from broker.cluster.records import Keys
from broker.cluster.store import KeyValue, MetadataStore, Put, StoreError, absent, mod_revision_is
from broker.security.acls import ACLS_FILE
from broker.security.credentials import USERS_FILE
from broker.security.watched import MIRROR_OF
from broker.storage.durable_file import load_json, replace_json

log = logging.getLogger(__name__)

T = TypeVar("T")

DOCUMENTS: Final = (USERS_FILE, ACLS_FILE)
RACE_RETRIES: Final = 10


class EtcdDocument(Generic[T]):
    """One of the cluster's security documents (a `Document`, broker/security/watched.py)."""

    def __init__(self, store: MetadataStore, key: str, parse: Callable[[object | None], T]) -> None:
        self.store = store
        self.key = key
        self.path = f"etcd {key}"
        self._parse = parse

    def get(self) -> T:
        return self._parsed(self.store.get(self.key))

    def _parsed(self, kv: KeyValue | None) -> T:
        return self._parse(json.loads(kv.value) if kv is not None else None)

    def update(self, change: Callable[[T], object]) -> None:
        for _ in range(RACE_RETRIES):
            kv = self.store.get(self.key)
            doc = change(self._parsed(kv))
            unchanged = mod_revision_is(self.key, kv.mod_revision) if kv is not None else absent(self.key)
            if self.store.txn([unchanged], [Put(self.key, json.dumps(doc, sort_keys=True))]).succeeded:
                return
        raise StoreError(f"{self.key} changed under this command {RACE_RETRIES} times in a row: try again")


class EtcdDocuments:
    """The cluster's security documents, for `CredentialStore` and `AclStore` (`documents=`)."""

    def __init__(self, store: MetadataStore, keys: Keys) -> None:
        self.store = store
        self.keys = keys

    def open(self, name: str, parse: Callable[[object | None], T]) -> EtcdDocument[T]:
        return EtcdDocument(self.store, self.keys.security + name, parse)


def write_copies(security_dir: str, origin: str, documents: Mapping[str, bytes]) -> None:
    """Make the node's files of every document of `DOCUMENTS` a copy of the cluster's
    (`documents`: name -> the stored JSON; absent: none), marked as the copy of `origin`."""
    os.makedirs(security_dir, mode=0o700, exist_ok=True)
    for name in DOCUMENTS:
        path = os.path.join(security_dir, name)
        raw = documents.get(name)
        try:
            doc = json.loads(raw) if raw is not None else {}
        except ValueError as exc:
            log.warning("the cluster's %s is not JSON (%s): this node keeps its last copy", name, exc)
            continue
        if not isinstance(doc, dict):
            log.warning("the cluster's %s is not a JSON object: this node keeps its last copy", name)
            continue
        copy = {**doc, MIRROR_OF: f"{origin}{name}"}
        try:
            current = load_json(path)
        except ValueError:
            current = None
        if current == copy:
            continue
        if isinstance(current, dict) and not current.get(MIRROR_OF) and current != {}:
            log.warning("%s: this node's own %s is replaced by the cluster's (%s)", path, name, origin)
        replace_json(path, copy, mode=0o600)
