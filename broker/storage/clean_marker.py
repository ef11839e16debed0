"""The clean-shutdown marker of one core: `<data_dir>/run/core-<k>.clean`.

Rules this module keeps:
- Written by a core after its close flushed and closed every partition it had open without an
  error (each leaving its snapshot: broker/storage/producer_snapshot.py), durably (fsynced,
  then the directory). It names the core, the node's core count of that run and the run's
  token (random, made at the core's start), which each snapshot that run wrote carries too.
- Taken at the core's next start, before it opens any partition: read, then removed durably
  (unlink, fsync of the directory) whether or not it is used, so that once the core serves, a
  crash of this run finds no marker. A marker that does not name this core and this run's core
  count (the partitions a core owns follow the core count) is not used.
- Core 0 also removes the markers of cores this run does not have (a run with fewer cores): a
  later run with more cores must not find one left from before a crash.
- No marker, or one not used, is today's full path: every partition's active segment recovered,
  synced, its state rebuilt by the header walk. A marker only lets a partition skip those when its
  own snapshot also describes its files as they are (broker/core/partition.py).
"""

from __future__ import annotations

import contextlib
import os
import re

from broker.storage import layout
from broker.storage.durable_file import load_json, replace_json

_NAME = re.compile(r"core-(\d+)\.clean\Z")


def marker_path(data_dir: str, core_id: int) -> str:
    return os.path.join(layout.run_dir(data_dir), f"core-{core_id}.clean")


def is_marker(name: str) -> bool:
    """Whether `name` (in the run directory) is a core's marker: kept across starts."""
    return _NAME.match(name) is not None


def new_token() -> int:
    """A run's token: what ties its snapshots to its marker."""
    return int.from_bytes(os.urandom(8), "big")


def write(data_dir: str, core_id: int, cores: int, token: int) -> None:
    """Mark core `core_id` (of `cores`) closed cleanly in the run of `token` (module rules).
    Raises OSError."""
    os.makedirs(layout.run_dir(data_dir), exist_ok=True)
    replace_json(marker_path(data_dir, core_id), {"core": core_id, "cores": cores, "token": token})


def take(data_dir: str, core_id: int, cores: int) -> int | None:
    """The token of the last run if core `core_id` of `cores` closed cleanly then, else None;
    its marker is gone, durably, when this returns (module rules). Raises OSError when it
    cannot be removed: a core must not serve while a marker stays that a crash of this run
    would leave behind."""
    run = layout.run_dir(data_dir)
    path = marker_path(data_dir, core_id)
    try:
        doc = load_json(path)
    except (OSError, ValueError):
        doc = None
    token = doc.get("token") if isinstance(doc, dict) else None
    if doc != {"core": core_id, "cores": cores, "token": token} or not isinstance(token, int):
        token = None
    removed = False
    names = [path]
    if core_id == 0:
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(run):
                found = _NAME.match(name)
                if found is not None and int(found.group(1)) >= cores:
                    names.append(os.path.join(run, name))
    for name in names:
        try:
            os.unlink(name)
            removed = True
        except FileNotFoundError:
            pass
    if removed:
        fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return token
