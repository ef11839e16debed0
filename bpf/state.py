"""The eBPF snapshot file: what the supervisor loaded and its counters, for workers and `broker stats`.

Rules this module keeps:
- The supervisor (the only process holding the programs and maps) writes
  `<data_dir>/run/bpf.json` when it loads them, about once a second while it runs, and a final one
  with `"steering": false` when it detaches them. Atomic replace, no fsync: it is a view, not data.
- Readers never need bcc: workers read `steering` for Metadata (cached by the file's mtime, so a
  Metadata request costs one stat), `broker stats` and the Prometheus endpoint read the counters.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Final

FILE_NAME: Final = "bpf.json"
# broker/storage/layout.py: RUN_DIR, not imported (bpf/ does not import broker/); tests/storage/test_layout.py
RUN_DIR: Final = "run"

_cache: dict[str, tuple[int, dict[str, Any]]] = {}


def path(data_dir: str) -> str:
    return os.path.join(data_dir, RUN_DIR, FILE_NAME)


def publish(data_dir: str, doc: dict[str, Any]) -> None:
    p = path(data_dir)
    tmp = f"{p}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, p)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(data_dir: str) -> dict[str, Any] | None:
    """The last published snapshot, or None (no eBPF plane ever published, or unreadable)."""
    p = path(data_dir)
    try:
        mtime = os.stat(p).st_mtime_ns
    except OSError:
        return None
    hit = _cache.get(p)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        with open(p, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    _cache[p] = (mtime, doc)
    return doc


def steering_on(data_dir: str) -> bool:
    """Whether the public port steers new connections to partition owners (Metadata's flag)."""
    doc = read(data_dir)
    return bool(doc and doc.get("steering"))
