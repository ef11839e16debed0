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
  segment's share of them (the markers in its offset range), for that file.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple


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
