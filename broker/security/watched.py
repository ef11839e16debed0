"""A small JSON file the workers read and `broker users` / `broker acls` change: the users file
and the ACL file (docs/SECURITY.md).

Reads are cheap and fresh: `get()` stats the file (microseconds) and parses it again only when
its modification time or size changed, so a change takes effect at the next request without a
restart or a signal. Writes (`update`) read, change and replace it under an flock (several
commands may run at once), atomically and durably (broker/storage/durable_file.py), as a file
only its owner may read (0600): it holds credentials or who may do what.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

from broker.storage.durable_file import exclusive_lock, load_json, replace_json

T = TypeVar("T")


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
            replace_json(self.path, change(self._parse(load_json(self.path))), mode=0o600)
