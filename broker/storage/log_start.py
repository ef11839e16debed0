"""A log's start offset when it lies inside a segment: where Kafka's DeleteRecords moved it.

Rules this module keeps:
- The log start is its first segment's base offset unless records were deleted below an offset
  inside a segment (Kafka's DeleteRecords, or a follower following its leader's start): that
  offset is kept in `log-start-offset.json` in the log's directory, and the log starts at the
  larger of the two (`Log.start_offset`). Segments wholly below it are deleted; the segment
  holding it keeps its bytes below it, never served again.
- The file is small and replaced atomically and durably (broker/storage/durable_file.py) before
  the new start is answered: a restart, kill -9 or power loss, never serves a deleted record
  again. It is written only when the start moves inside a segment: a cold path.
- A recorded start above the log's end (the records after the durable point were lost with the
  machine) starts the log over, empty, at the recorded start: everything below it was deleted.

Fileformat (JSON): {"log_start_offset": <int, >= 0>}. A file that does not parse is ignored with
a warning (the segments' own start is then the log's start): it only ever holds a lower bound.
"""

from __future__ import annotations

import json
import logging

from broker.storage.durable_file import load_json, replace_json
from broker.storage.layout import log_start_path

log = logging.getLogger("broker.storage.log")


def read(directory: str) -> int:
    """The recorded log start of the log in `directory` (0: none recorded)."""
    path = log_start_path(directory)
    try:
        doc = load_json(path)
    except (OSError, ValueError) as exc:
        log.warning("%s: ignoring the recorded log start: %s", path, exc)
        return 0
    if doc is None:
        return 0
    value = doc.get("log_start_offset") if isinstance(doc, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        log.warning("%s: ignoring the recorded log start %s", path, json.dumps(doc)[:100])
        return 0
    return value


def write(directory: str, offset: int) -> None:
    """Record `offset` as the log's start, durably (module rules)."""
    assert offset >= 0
    replace_json(log_start_path(directory), {"log_start_offset": offset}, mode=0o644)
