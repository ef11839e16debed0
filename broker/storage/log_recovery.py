"""What a crash left in a log's directory, sorted out when the log opens (`Log.open`).

Rules this module keeps:
- Each segment repairs itself when it opens (`Segment.open`: the index rebuilt from the store if
  it cannot be trusted, a torn tail cut); here is what lies between segments. An index file
  without its store (a crash between creating the two) is removed; segments that overlap are
  refused, never guessed between; offsets missing between two segments are logged and served
  around.
- The directories the log's open creates are remembered, so that its first flush syncs their
  parents too (`missing_dirs`).
- What a log cleaner's swap left (`finish_swaps`, before anything else is read). A clean writes
  each of its segments as `.cleaned` files, synced; its commit renames every `.cleaned` file to
  `.swap` (every index first, then every store), so it is committed once no `.cleaned` file is
  left. A `.cleaned` file therefore means a clean that was not committed: it and every `.swap`
  file go. Otherwise each `.log.swap` is completed: every segment whose base offset lies in its
  range is removed (with its `.txnindex`), then its `.swap` files take their final names. So a
  crash at any point of a clean leaves the old segments or all the new ones, never a mix
  (broker/storage/log_cleaning.py does the steps in that order).
"""

from __future__ import annotations

import contextlib
import logging
import os

from broker.storage.errors import StorageError
from broker.storage.fileio import FileIO
from broker.storage.layout import (
    CLEANED_SUFFIX,
    INDEX_SUFFIX,
    STORE_SUFFIX,
    SWAP_SUFFIX,
    TXN_INDEX_SUFFIX,
    cleaning_name,
    index_file_name,
    parse_cleaning_name,
    parse_segment_name,
    store_file_name,
    txn_index_file_name,
)
from broker.storage.segment import Segment
from broker.storage.segment_recovery import SCAN_CHUNK_BYTES
from ringlog_proto.batch import HEADER_SIZE, invalid_stored_header, read_header

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
    names = io.listdir(directory)  # once: a start lists every stored partition's directory
    for name in names:
        parsed = parse_segment_name(name)
        if parsed is not None:
            (stores if parsed[1] == STORE_SUFFIX else indexes).add(parsed[0])
    for base in sorted(indexes - stores):
        orphan = os.path.join(directory, index_file_name(base))
        log.warning("%s: index without a store file; removing it", orphan)
        io.unlink(orphan)
    for name in names:
        stem, _, suffix = name.partition(".")
        if "." + suffix == TXN_INDEX_SUFFIX and stem.isdigit() and int(stem) not in stores:
            log.warning("%s: a .txnindex without a store file; removing it", name)
            _unlink_missing_ok(io, os.path.join(directory, name))
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


def finish_swaps(directory: str, io: FileIO) -> None:
    """Remove an uncommitted clean's files and complete a committed one's swap (module rules)."""
    swaps: dict[int, set[str]] = {}
    cleaning: list[str] = []
    committed = True
    for name in io.listdir(directory):
        parsed = parse_cleaning_name(name)
        if parsed is None:
            continue
        cleaning.append(name)
        base, suffix, stage = parsed
        if stage == CLEANED_SUFFIX:
            committed = False
        else:
            swaps.setdefault(base, set()).add(suffix)
    if not committed:
        for name in sorted(cleaning):
            log.info("%s: a clean that was not committed; removing it", os.path.join(directory, name))
            io.unlink(os.path.join(directory, name))
        io.fsync_dir(directory)
        return
    changed = False
    for base, suffixes in sorted(swaps.items()):
        index_swap = os.path.join(directory, cleaning_name(index_file_name(base), SWAP_SUFFIX))
        if STORE_SUFFIX not in suffixes:  # not a clean's: its commit renames stores last
            log.warning("%s: a swap index without its store; removing it", index_swap)
            io.unlink(index_swap)
            changed = True
            continue
        store_swap = os.path.join(directory, cleaning_name(store_file_name(base), SWAP_SUFFIX))
        end = _next_offset_of(store_swap, io)
        for other in segment_bases_present(directory, io):
            if base < other < end:
                log.info("%s: replaced by the cleaned segment %d; removing it", store_file_name(other), base)
                _unlink_missing_ok(io, os.path.join(directory, store_file_name(other)))
                _unlink_missing_ok(io, os.path.join(directory, index_file_name(other)))
                _unlink_missing_ok(io, os.path.join(directory, txn_index_file_name(other)))
        _unlink_missing_ok(io, os.path.join(directory, txn_index_file_name(base)))  # the replaced first's
        if INDEX_SUFFIX in suffixes:
            io.rename(index_swap, os.path.join(directory, index_file_name(base)))
        io.rename(store_swap, os.path.join(directory, store_file_name(base)))
        log.info(
            "%s: completed the swap of a cleaned segment", os.path.join(directory, store_file_name(base))
        )
        changed = True
    if changed:
        io.fsync_dir(directory)


def segment_bases_present(directory: str, io: FileIO) -> list[int]:
    """The base offsets of the store files in `directory` (nothing removed, unlike `segment_bases`)."""
    out = []
    for name in io.listdir(directory):
        parsed = parse_segment_name(name)
        if parsed is not None and parsed[1] == STORE_SUFFIX:
            out.append(parsed[0])
    return sorted(out)


def _unlink_missing_ok(io: FileIO, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        io.unlink(path)


def _next_offset_of(path: str, io: FileIO) -> int:
    """One past the last offset of the batches in the store file at `path` (a cleaned segment,
    synced before its commit: whole, its last batch where the segments it replaces ended)."""
    fd = io.open(path, create=False)
    try:
        size = io.size(fd)
        pos = 0
        end = -1
        chunk = b""
        chunk_at = 0
        while size - pos >= HEADER_SIZE:
            if pos + HEADER_SIZE > chunk_at + len(chunk):
                chunk = io.pread(fd, SCAN_CHUNK_BYTES, pos)
                chunk_at = pos
            h = read_header(chunk, pos - chunk_at)
            if invalid_stored_header(h, size - pos) is not None:
                break
            end = h.next_offset
            pos += h.size
    finally:
        io.close(fd)
    if end < 0:
        raise StorageError(f"{path}: a committed cleaned segment holds no batch: refusing to guess its range")
    return end
