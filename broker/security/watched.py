"""A small JSON file the workers read and `broker users` / `broker acls` change: the users file
and the ACL file (docs/SECURITY.md).

In a cluster the documents live in the control plane instead (broker/cluster/security_docs.py,
a `Documents` of its own for the commands) and each node's agent keeps its files a copy of them,
marked with `MIRROR_OF`: the workers read the same files either way, and a command that would
change a copy in place is refused (`MirroredFileError`) rather than undone by the next change.

Reads are cheap and fresh: `get()` stats the file (microseconds) and parses it again only when
its modification time or size changed, so a change takes effect at the next request without a
restart or a signal. Writes (`update`) read, change and replace it under an flock (several
commands may run at once), atomically and durably (broker/storage/durable_file.py), as a file
only its owner may read (0600): it holds credentials or who may do what.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final, Generic, Protocol, TypeVar

from broker.storage.durable_file import exclusive_lock, load_json, replace_json

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)  # a document is only read out and passed to `change`

# The field of a node's copy of a cluster's document that names where the original lives.
MIRROR_OF: Final = "mirror_of"


class MirroredFileError(OSError):
    """A change to a node's copy of its cluster's document: change the cluster's instead."""


class Document(Protocol[T_co]):
    """One document as its parser makes it: `get` the current one, `update` it atomically."""

    path: str  # where it lives, for messages: a file, or a key of the cluster's store

    def get(self) -> T_co: ...
    def update(self, change: Callable[[T_co], object]) -> None: ...


class Documents(Protocol):
    """Where the security documents live, by file name (users.json, acls.json)."""

    def open(self, name: str, parse: Callable[[object | None], T]) -> Document[T]: ...


class WatchedFile(Generic[T]):
    """`path`'s document as `parse` makes it (`parse(None)` when there is no file)."""

    def __init__(self, path: str, parse: Callable[[object | None], T]) -> None:
        self.path = path
        self._parse = parse
        self._seen: tuple[int, int] | None = None
        self._value = parse(None)

    def get(self) -> T:
        try:
            st = os.stat(self.path)
            seen: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            seen = None
        if seen != self._seen:
            self._value = self._parse(load_json(self.path) if seen is not None else None)
            self._seen = seen
        return self._value

    def update(self, change: Callable[[T], object]) -> None:
        """Replace the file with `change(current)`'s document, under the lock."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        with exclusive_lock(self.path + ".lock"):
            doc = load_json(self.path)
            if isinstance(doc, dict) and doc.get(MIRROR_OF):
                raise MirroredFileError(
                    f"{self.path} is this node's copy of {doc[MIRROR_OF]}: change the cluster's "
                    "(broker users|acls ... --etcd ENDPOINTS --cluster-name NAME)"
                )
            replace_json(self.path, change(self._parse(doc)), mode=0o600)
