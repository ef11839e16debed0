"""Small files replaced atomically and durably: the topic registry, group offsets, producer ids.

Write a temporary file, fsync it, rename it over the old one, fsync the directory. A crash
leaves either the old or the new version, never a torn one, and a return means the new version
survives a power loss.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator


def replace_json(path: str, doc: object, mode: int = 0o600) -> None:
    """Replace `path` with `doc` (see the module docstring), a file of permissions `mode` (0o600
    for secrets: made so, never readable by others for a moment). On failure (a full disk) the old
    version stays and no temporary file is left to hold space."""
    tmp = path + ".tmp"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a crash's leftover: O_CREAT would keep its permissions
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_json(path: str) -> object | None:
    """The document at `path`, or None if there is none yet."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@contextlib.contextmanager
def exclusive_lock(lock_path: str) -> Iterator[None]:
    """Hold an flock on `lock_path` (made if missing): the cores are separate processes that
    read, change and replace the same small file."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock
