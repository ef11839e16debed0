"""What a crash left in a log's directory, sorted out when the log opens (`Log.open`).

Rules this module keeps:
- Each segment repairs itself when it opens (`Segment.open`: the index rebuilt from the store if
  it cannot be trusted, a torn tail cut); here is what lies between segments. An index file
  without its store (a crash between creating the two) is removed; segments that overlap are
  refused, never guessed between; offsets missing between two segments are logged and served
  around.
- The directories the log's open creates are remembered, so that its first flush syncs their
  parents too (`missing_dirs`).
"""

from __future__ import annotations

import logging
import os

from broker.storage.errors import StorageError
from broker.storage.fileio import FileIO
from broker.storage.layout import STORE_SUFFIX, index_file_name, parse_segment_name
from broker.storage.segment import Segment

log = logging.getLogger("broker.storage.log")  # the log's lines, as before this module was apart


def missing_dirs(directory: str) -> list[str]:
    """The directories makedirs is about to create for `directory`, deepest first."""
    created = []
    path = os.path.abspath(directory)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        created.append(path)
        path = os.path.dirname(path)
    return created


def segment_bases(directory: str, io: FileIO) -> list[int]:
    """The base offsets of the segments in `directory`, oldest first, once every index file
    without its store is removed."""
    stores: set[int] = set()
    indexes: set[int] = set()
    for name in io.listdir(directory):
        parsed = parse_segment_name(name)
        if parsed is not None:
            (stores if parsed[1] == STORE_SUFFIX else indexes).add(parsed[0])
    for base in sorted(indexes - stores):
        orphan = os.path.join(directory, index_file_name(base))
        log.warning("%s: index without a store file; removing it", orphan)
        io.unlink(orphan)
    return sorted(stores)


def check_follows(prev: Segment, seg: Segment) -> None:
    """Refuse `seg` if it overlaps `prev`, the segment before it; say so if offsets are missing
    between them."""
    base = seg.base_offset
    if prev.next_offset > base:
        raise StorageError(
            f"{seg.store_path}: segment starts at {base} but {prev.store_path} runs to "
            f"{prev.next_offset}: overlapping segments, refusing to guess which is right"
        )
    if prev.next_offset < base:
        log.warning(
            "%s: offsets %d..%d are missing before it",
            seg.store_path,
            prev.next_offset,
            base - 1,
        )
