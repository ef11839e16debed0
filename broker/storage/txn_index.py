"""The aborted transactions of one partition's log, as read_committed readers need them: which
producer's records, from which offset to which marker, to skip (Kafka's TransactionIndex).

Rules this module keeps:
- An entry is Kafka's AbortedTxn: producer id, first offset of the transaction here, the offset
  of its ABORT marker, and the last stable offset right after the marker was stored. Entries
  are held in marker order (markers are appended in offset order), in memory: the partition's
  open walk rebuilds them from the log's markers, so they survive a restart without a file of
  their own; an entry lives as long as its marker (`expire` after the log start moved,
  `truncate` after the log end moved back).
- `collect(fetch_offset, upper_bound)` answers Kafka's `collectAbortedTransactions`: every
  entry whose marker is at or after `fetch_offset` and whose first offset is below
  `upper_bound` (the end of what the read returned). Kafka walks its per-segment indexes from
  the segment of the fetch and stops at the first segment holding an entry whose last stable
  offset reaches the bound (every transaction begun below the bound had ended by then); here
  the same stop applies to one list, searched from the first marker at or after the fetch.
- Kafka keeps these entries per segment, in `<base>.txnindex`; `entries_between` gives a
  segment's share of them (the markers in its offset range). Ringlog's `.txnindex` (the file
  form below) caches each closed segment's markers instead, from which the open walk rebuilds
  these entries without reading the markers' records.
"""

from __future__ import annotations

import bisect
import struct
from typing import NamedTuple

from crc32c import crc32c


class AbortedTxn(NamedTuple):
    """An aborted transaction (Kafka's AbortedTxn): records of `producer_id` from `first_offset`
    to `last_offset` (its ABORT marker) are not for read_committed readers."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TxnIndex:
    """The aborted transactions of one log, in marker order (owned with its partition's core)."""

    __slots__ = ("_entries", "_lasts")

    def __init__(self) -> None:
        self._entries: list[AbortedTxn] = []
        self._lasts: list[int] = []  # each entry's last_offset, for bisect

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: AbortedTxn) -> None:
        """An ABORT marker was stored (after every marker held: markers only go forward)."""
        assert not self._lasts or entry.last_offset > self._lasts[-1], (entry, self._lasts[-1])
        self._entries.append(entry)
        self._lasts.append(entry.last_offset)

    def collect(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions a read from `fetch_offset` whose batches end before
        `upper_bound` overlaps (module rules)."""
        found: list[AbortedTxn] = []
        for i in range(bisect.bisect_left(self._lasts, fetch_offset), len(self._entries)):
            entry = self._entries[i]
            if entry.first_offset < upper_bound:
                found.append(entry)
            if entry.last_stable_offset >= upper_bound:
                break
        return found

    def entries_between(self, low: int, high: int) -> list[AbortedTxn]:
        """The entries whose marker is in [low, high): a segment's share."""
        return self._entries[bisect.bisect_left(self._lasts, low) : bisect.bisect_left(self._lasts, high)]

    def entries(self) -> list[AbortedTxn]:
        return list(self._entries)

    def replace_between(
        self, low: int, high: int, entries: tuple[AbortedTxn, ...] | list[AbortedTxn]
    ) -> None:
        """The log's batches in [low, high) were rewritten (a clean): their markers' entries
        are now `entries` (in marker order, all in that range)."""
        i, j = bisect.bisect_left(self._lasts, low), bisect.bisect_left(self._lasts, high)
        assert all(low <= e.last_offset < high for e in entries), (low, high, entries)
        self._entries[i:j] = entries
        self._lasts[i:j] = [e.last_offset for e in entries]

    def expire(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: entries whose marker went, go."""
        cut = bisect.bisect_left(self._lasts, start_offset)
        if cut:
            del self._entries[:cut], self._lasts[:cut]

    def truncate(self, end_offset: int) -> None:
        """The log now ends at `end_offset`: entries whose marker went, go."""
        cut = bisect.bisect_left(self._lasts, end_offset)
        del self._entries[cut:], self._lasts[cut:]


# ----------------------------------------------------------------------------- the file form
#
# `<base>.txnindex` beside a closed segment's `.log` and `.index`: every marker the segment holds
# (offset, kind, coordinator epoch), so that the open walk learns them without reading each
# marker's record (a second pread per marker). Kafka's `.txnindex` holds the aborted
# transactions alone, because its producer-state snapshot carries the rest; ringlog has no
# snapshot, and the walk needs every marker (a commit ends a transaction and sets its producer's
# coordinator epoch too), the aborted list following from the walk. It is a cache under the
# `.index`'s rules: a header naming the segment it describes (base offset, next offset, store
# size) with its crc, then one entry per marker with its own crc; a file that does not match its
# segment, or any entry that does not check, is ignored whole and the walk reads the markers.

TXN_FILE_MAGIC = b"RLTX"
TXN_FILE_VERSION = 1
_TXN_HEADER = struct.Struct(">4sHxxqqq")  # magic, version, base offset, next offset, store size
TXN_HEADER_SIZE = _TXN_HEADER.size + 4  # and its crc32c
_TXN_ENTRY = struct.Struct(">qih")  # marker offset, coordinator epoch, control type
TXN_ENTRY_SIZE = _TXN_ENTRY.size + 4  # and its crc32c


class MarkerEntry(NamedTuple):
    """A marker of a segment, as its `.txnindex` keeps it."""

    offset: int
    coordinator_epoch: int
    type: int  # Kafka's control type: 0 ABORT, 1 COMMIT


def encode_txn_file(base_offset: int, next_offset: int, store_size: int, markers: list[MarkerEntry]) -> bytes:
    header = _TXN_HEADER.pack(TXN_FILE_MAGIC, TXN_FILE_VERSION, base_offset, next_offset, store_size)
    parts = [header, struct.pack(">I", crc32c(header))]
    for m in markers:
        entry = _TXN_ENTRY.pack(m.offset, m.coordinator_epoch, m.type)
        parts += (entry, struct.pack(">I", crc32c(entry)))
    return b"".join(parts)


def decode_txn_file(
    data: bytes, base_offset: int, next_offset: int, store_size: int
) -> list[MarkerEntry] | str:
    """The markers of a `.txnindex` file describing the segment (`base_offset`, `next_offset`,
    `store_size`), or why it cannot be trusted."""
    if len(data) < TXN_HEADER_SIZE or (len(data) - TXN_HEADER_SIZE) % TXN_ENTRY_SIZE:
        return f"{len(data)} bytes: not a whole header and entries"
    header = data[: _TXN_HEADER.size]
    if crc32c(header) != struct.unpack_from(">I", data, _TXN_HEADER.size)[0]:
        return "header crc mismatch"
    magic, version, base, end, size = _TXN_HEADER.unpack(header)
    if magic != TXN_FILE_MAGIC or version != TXN_FILE_VERSION:
        return f"magic {magic!r} version {version}"
    if (base, end, size) != (base_offset, next_offset, store_size):
        return f"describes offsets {base}..{end} in {size} bytes, not the segment's"
    out: list[MarkerEntry] = []
    for pos in range(TXN_HEADER_SIZE, len(data), TXN_ENTRY_SIZE):
        entry = data[pos : pos + _TXN_ENTRY.size]
        if crc32c(entry) != struct.unpack_from(">I", data, pos + _TXN_ENTRY.size)[0]:
            return f"entry at byte {pos}: crc mismatch"
        m = MarkerEntry(*_TXN_ENTRY.unpack(entry))
        if not (base_offset <= m.offset < next_offset) or (out and m.offset <= out[-1].offset):
            return f"entry at byte {pos}: offset {m.offset} out of order or range"
        out.append(m)
    return out
