"""A partition's state derived from its batch headers, written at a clean close so that the next
start need not walk the log for it (Kafka's `<offset>.snapshot`): its producers, open and
completed transactions, leader epochs and aborted transactions, at the log's end.

Rules this module keeps:
- A cache, never the truth: the open walk (`Partition._rebuild`) makes the same state from the
  log. The snapshot is read only when its core's clean-shutdown marker says every partition it
  had open closed cleanly (broker/storage/clean_marker.py), and used only when it checks out
  whole (magic, version, crc32c over every byte) and describes the log as it opened: the same
  log start and end, the same active segment base and store size. Anything else (missing,
  torn, older, a log changed since) and the walk runs, as after a crash.
- One file per partition, `clean.snapshot` in its directory, written at a clean close (not
  synced: a power loss leaves it whole, torn, absent or as an earlier close wrote it, and the crc
  and token tell). It carries the token of the run that wrote it, which the core's marker names
  too: a snapshot of an earlier run (a partition this run did not open, left as a crashed run
  left it) is not this marker's and is not used. Nothing removes it at open (an unlink per
  partition would cost what the walk saves): the token and the checks against the log do.
- Pure data and its codec here; what the state means is broker/core/producer_state.py,
  broker/storage/epochs.py and broker/storage/txn_index.py (the partition converts).

The file (big-endian): a 64-byte header: `RLPS`, version (u16), 2 zero bytes, the run's token
(u64), log start, log end, active segment base, active segment store size (i64 each), the counts
of producers, completed transactions, epochs and aborted transactions (u32 each). Then each
producer: id (i64), epoch (i32), last batch's max timestamp, first offset of its open
transaction or -1 (i64 each), coordinator epoch (i32), last marker offset, last write time in the
broker's clock (i64 each), batch count (u8), and its batches: first and last sequence (i32 each),
base offset (i64). Then the completed transactions (first offset, marker offset: i64 each), the
epochs (epoch: i32, start: i64), the aborted transactions (producer id, first offset, marker
offset, last stable offset: i64 each), and a crc32c (u32) of every byte before it.
"""

from __future__ import annotations

import os
import struct
from typing import Any, NamedTuple

from crc32c import crc32c

SNAPSHOT_FILE = "clean.snapshot"
MAGIC = b"RLPS"
VERSION = 1
_HEADER = struct.Struct(">4sHxxQqqqqIIII")
_PRODUCER = struct.Struct(">qiqqiqqB")
_BATCH = struct.Struct(">iiq")
_PAIR = struct.Struct(">qq")
_EPOCH = struct.Struct(">iq")
_ABORTED = struct.Struct(">qqqq")
_CRC = struct.Struct(">I")


class SnapshotProducer(NamedTuple):
    """One producer as broker/core/producer_state.py `_Producer` holds it."""

    producer_id: int
    epoch: int
    batches: tuple[tuple[int, int, int], ...]  # (first sequence, last sequence, base offset), oldest first
    last_timestamp: int
    txn_first_offset: int
    coordinator_epoch: int
    marker_offset: int
    last_write_ms: int


class Snapshot(NamedTuple):
    """A partition's header-derived state at its log end, and the log it describes."""

    token: int  # of the run whose clean close wrote it (broker/storage/clean_marker.py)
    log_start: int
    log_end: int
    active_base: int
    active_size: int
    producers: tuple[SnapshotProducer, ...]
    completed: tuple[tuple[int, int], ...]  # (first offset, marker offset), in marker order
    epochs: tuple[tuple[int, int], ...]  # (epoch, start offset), oldest first
    aborted: tuple[tuple[int, int, int, int], ...]  # AbortedTxn fields, in marker order


def encode(s: Snapshot) -> bytes:
    parts = [
        _HEADER.pack(
            MAGIC,
            VERSION,
            s.token,
            s.log_start,
            s.log_end,
            s.active_base,
            s.active_size,
            len(s.producers),
            len(s.completed),
            len(s.epochs),
            len(s.aborted),
        )
    ]
    for p in s.producers:
        parts.append(
            _PRODUCER.pack(
                p.producer_id,
                p.epoch,
                p.last_timestamp,
                p.txn_first_offset,
                p.coordinator_epoch,
                p.marker_offset,
                p.last_write_ms,
                len(p.batches),
            )
        )
        parts.extend(_BATCH.pack(*b) for b in p.batches)
    parts.extend(_PAIR.pack(*c) for c in s.completed)
    parts.extend(_EPOCH.pack(*e) for e in s.epochs)
    parts.extend(_ABORTED.pack(*a) for a in s.aborted)
    body = b"".join(parts)
    return body + _CRC.pack(crc32c(body))


def decode(data: bytes) -> Snapshot | str:
    """The snapshot in `data`, or why it cannot be trusted."""
    if len(data) < _HEADER.size + _CRC.size:
        return f"{len(data)} bytes: shorter than a header"
    body = memoryview(data)[: -_CRC.size]
    if crc32c(body) != _CRC.unpack_from(data, len(body))[0]:
        return "crc mismatch"
    magic, version, token, start, end, base, size, n_producers, n_completed, n_epochs, n_aborted = (
        _HEADER.unpack_from(data)
    )
    if magic != MAGIC or version != VERSION:
        return f"magic {magic!r} version {version}"
    pos = _HEADER.size
    try:
        producers = []
        for _ in range(n_producers):
            pid, epoch, ts, txn_first, coord, marker, write_ms, n = _PRODUCER.unpack_from(body, pos)
            pos += _PRODUCER.size
            batches, pos = _many(_BATCH, body, pos, n)
            producers.append(SnapshotProducer(pid, epoch, batches, ts, txn_first, coord, marker, write_ms))
        completed, pos = _many(_PAIR, body, pos, n_completed)
        epochs, pos = _many(_EPOCH, body, pos, n_epochs)
        aborted, pos = _many(_ABORTED, body, pos, n_aborted)
    except struct.error as exc:
        return f"truncated: {exc}"
    if pos != len(body):
        return f"{len(body) - pos} bytes after the last entry"
    return Snapshot(token, start, end, base, size, tuple(producers), completed, epochs, aborted)


def _many(shape: struct.Struct, body: memoryview, pos: int, count: int) -> tuple[Any, int]:
    """`count` entries of `shape` from `pos` (the types the counts and shapes of the file make
    them), and where they end."""
    end = pos + count * shape.size
    if end > len(body):
        raise struct.error(f"{count} entries of {shape.size} bytes at {pos} pass the end")
    return tuple(shape.iter_unpack(body[pos:end])), end


def path(directory: str) -> str:
    return os.path.join(directory, SNAPSHOT_FILE)


def write(directory: str, s: Snapshot) -> None:
    """Write the snapshot of the log in `directory` (module rules: not synced). Raises OSError."""
    data = encode(s)
    # Overwritten in place, then cut to length: not O_TRUNC, on which ext4 (auto_da_alloc) starts
    # the file's writeback at close, a write per partition at every shutdown. A power loss
    # between may leave old and new bytes mixed: the crc refuses them.
    fd = os.open(path(directory), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        view, at = memoryview(data), 0
        while at < len(data):
            at += os.pwrite(fd, view[at:], at)
        if os.fstat(fd).st_size > len(data):
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def read(directory: str) -> Snapshot | str:
    """The snapshot of the log in `directory`, or why there is none to use."""
    try:
        fd = os.open(path(directory), os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, os.fstat(fd).st_size)  # a short read fails the crc: the walk
        finally:
            os.close(fd)
    except FileNotFoundError:
        return "none"
    except OSError as exc:
        return f"unreadable: {exc}"
    return decode(data)
