"""ACLs: who may do what to which topic, group or the cluster (`<data dir>/security/acls.json`).

Rules this module keeps:
- A binding is Kafka's: principal ("User:alice", or "User:*" for everyone) x resource (topic,
  group or cluster; a literal name, "*" for every name, or a prefix) x operation (read, write,
  create, delete, describe, alter, describe_configs, alter_configs, or all) x allow or deny.
  Hosts are not matched (every binding is for any host, Kafka's "*").
- `Authorizer.allowed`: a super user (`broker serve --super-users`) and the broker's own cores may
  do anything; otherwise a matching deny wins over any allow, and without a matching allow the
  answer is no (deny by default). As in Kafka, read, write, delete and alter each imply describe
  on the same resource, and alter_configs implies describe_configs.
- The authorizer is on exactly when the listener authenticates (SASL, or mutual TLS): without
  authentication every client is User:ANONYMOUS and everything is allowed, as today.
- The file is written and reread like the users file (broker/security/watched.py): `broker acls
  add` takes effect at the next request.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Final

from broker.security.credentials import SECURITY_DIR
from broker.security.session import CORE_PRINCIPAL
from broker.security.watched import Document, Documents, WatchedFile

ACLS_FILE: Final = "acls.json"
RESOURCE_TYPES: Final = ("topic", "group", "cluster", "transactional_id")
OPERATIONS: Final = (
    "read",
    "write",
    "create",
    "delete",
    "describe",
    "alter",
    "describe_configs",
    "alter_configs",
    "all",
)
PATTERNS: Final = ("literal", "prefixed")
PERMISSIONS: Final = ("allow", "deny")
CLUSTER_NAME: Final = "kafka-cluster"  # the one cluster resource's name, as Kafka names it
WILDCARD: Final = "*"
_IMPLY_DESCRIBE: Final = frozenset(("read", "write", "delete", "alter"))


class AclError(ValueError):
    """A binding that cannot be stored, or one to remove that does not exist."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    principal: str
    resource_type: str
    name: str
    operation: str
    permission: str = "allow"
    pattern: str = "literal"

    def check(self) -> AclBinding:
        if not self.principal.startswith("User:") or len(self.principal) == len("User:"):
            raise AclError(f"principal {self.principal!r}: write it User:<name> (User:* for everyone)")
        for value, allowed, what in (
            (self.resource_type, RESOURCE_TYPES, "resource type"),
            (self.operation, OPERATIONS, "operation"),
            (self.permission, PERMISSIONS, "permission"),
            (self.pattern, PATTERNS, "pattern"),
        ):
            if value not in allowed:
                raise AclError(f"{what} {value!r}: one of {', '.join(allowed)}")
        if not self.name:
            raise AclError("an empty resource name")
        if self.resource_type == "cluster" and self.name != CLUSTER_NAME:
            raise AclError(f"the cluster resource is named {CLUSTER_NAME}")
        return self

    def covers(self, name: str) -> bool:
        """Whether this binding applies to the resource `name`: its prefix, "*", or that name."""
        if self.pattern == "prefixed":
            return name.startswith(self.name)
        return self.name in (WILDCARD, name)

    def matches(self, principal: str, operation: str, resource_type: str, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.principal not in (principal, "User:*"):
            return False
        if not self.covers(name):
            return False
        if self.operation in ("all", operation):
            return True
        # read, write, delete and alter allow describe too, alter_configs allows describe_configs
        # (a deny of them does not deny it)
        if self.permission != "allow":
            return False
        if operation == "describe":
            return self.operation in _IMPLY_DESCRIBE
        return operation == "describe_configs" and self.operation == "alter_configs"

    def __str__(self) -> str:
        return f"{self.permission} {self.principal} {self.operation} {self.resource_type}:{self.name}" + (
            " (prefixed)" if self.pattern == "prefixed" else ""
        )


def acls_path(data_dir: str) -> str:
    return os.path.join(data_dir, SECURITY_DIR, ACLS_FILE)


def _parse_acls(doc: object | None) -> tuple[AclBinding, ...]:
    if not isinstance(doc, dict):
        return ()
    return tuple(AclBinding(**b) for b in doc.get("acls", []))


def _acls_doc(bindings: Iterable[AclBinding]) -> dict[str, object]:
    return {"acls": [asdict(b) for b in bindings]}


class AclStore:
    """The ACL file of one data dir: read by the workers, changed by `broker acls`."""

    def __init__(self, data_dir: str, documents: Documents | None = None) -> None:
        """The ACLs of `data_dir`, or of a cluster (`documents`: broker/cluster/security_docs.py)."""
        self._file: Document[tuple[AclBinding, ...]] = (
            WatchedFile(acls_path(data_dir), _parse_acls)
            if documents is None
            else documents.open(ACLS_FILE, _parse_acls)
        )
        self.path = self._file.path

    def bindings(self) -> tuple[AclBinding, ...]:
        return self._file.get()

    def add(self, binding: AclBinding) -> bool:
        """Store `binding`; False when it was there already."""
        binding.check()
        added = [False]

        def change(current: tuple[AclBinding, ...]) -> dict[str, object]:
            added[0] = binding not in current
            return _acls_doc(current if not added[0] else (*current, binding))

        self._file.update(change)
        return added[0]

    def replace(self, change: Callable[[tuple[AclBinding, ...]], tuple[AclBinding, ...]]) -> None:
        """Store `change(current bindings)` (each checked), under the file's lock: the Kafka ACL
        admin APIs add and remove several at once."""

        def doc(current: tuple[AclBinding, ...]) -> dict[str, object]:
            return _acls_doc(b.check() for b in change(current))

        self._file.update(doc)

    def remove(self, binding: AclBinding) -> None:
        def change(current: tuple[AclBinding, ...]) -> dict[str, object]:
            if binding not in current:
                raise AclError(f"no such ACL: {binding}")
            return _acls_doc(b for b in current if b != binding)

        self._file.update(change)


class Authorizer:
    """A worker's access decisions (module rules)."""

    def __init__(self, data_dir: str, enabled: bool, super_users: tuple[str, ...] = ()) -> None:
        self.enabled = enabled
        self.super_users = frozenset(super_users)
        self.store = AclStore(data_dir)

    def allowed(self, principal: str | None, operation: str, resource_type: str, name: str) -> bool:
        if not self.enabled or principal == CORE_PRINCIPAL or principal in self.super_users:
            return True
        if principal is None:
            return False
        allow = False
        for b in self.store.bindings():
            if b.matches(principal, operation, resource_type, name):
                if b.permission == "deny":
                    return False
                allow = True
        return allow
