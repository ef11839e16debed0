"""The leader epoch history of one log: where each leader epoch's batches start (KIP-101).

Rules this module keeps:
- Pure data, no I/O: the history is derived from the `partition_leader_epoch` of the batches the
  log holds (in log order: `assign` per batch, which changes something only when the epoch
  changes), so it is rebuilt at open from the same header walk as the producer state and needs
  no file of its own. An epoch in which no batch was written is not in it: a leader adds its own
  current epoch when it answers (`end_offset_for_epoch(..., leader_epoch=)`).
- Entries are (epoch, start offset), both strictly increasing. Assigning an epoch at or below
  the latest, or at a start at or below the latest entry's, drops the entries it supersedes
  (a follower taking a leader's batches over its own truncated tail).
- `end_offset_for_epoch` is Kafka's rule: the largest epoch <= the one asked and the start of
  the next higher epoch, or the log end for the latest; an epoch below the first one known ends
  where that one starts (the epoch asked, that start: nothing before it is known here); (-1, -1)
  for an epoch above every epoch known, or for -1. A ReplicaFetch answer of (-1, -1) says "no
  divergence", so a follower whose last epoch is older than everything its new leader holds (a
  leader that wrote alone, then stepped down to one whose log starts in a later epoch) must get
  the former, or it never truncates and fetches past the leader's end forever.
"""

from __future__ import annotations

import bisect

UNDEFINED = -1  # Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET


class EpochHistory:
    """(epoch, start offset) of each leader epoch with batches in the log, oldest first."""

    __slots__ = ("_epochs", "_starts", "latest_epoch")

    def __init__(self) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        # the epoch of the log's last batch, -1 for an empty history (an attribute: every
        # produce compares its batch's epoch with it)
        self.latest_epoch = UNDEFINED

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    def assign(self, epoch: int, start_offset: int) -> None:
        """A batch of `epoch` was stored at `start_offset` (in log order)."""
        epochs, starts = self._epochs, self._starts
        if epochs and epochs[-1] == epoch and starts[-1] <= start_offset:
            return
        if epoch < 0:
            return  # a batch from before epochs were stamped: nothing to learn from it
        while epochs and (epochs[-1] >= epoch or starts[-1] >= start_offset):
            epochs.pop()
            starts.pop()
        epochs.append(epoch)
        starts.append(start_offset)
        self.latest_epoch = epoch

    def truncate_from(self, end_offset: int) -> None:
        """The log was truncated to `end_offset`: forget the epochs that started at or after it."""
        while self._starts and self._starts[-1] >= end_offset:
            self._epochs.pop()
            self._starts.pop()
        self.latest_epoch = self._epochs[-1] if self._epochs else UNDEFINED

    def expire_before(self, start_offset: int) -> None:
        """Retention moved the log start to `start_offset`: the epoch holding it starts there."""
        i = bisect.bisect_right(self._starts, start_offset) - 1
        if i > 0:  # the epochs wholly below the new start go (the latest one never does)
            del self._epochs[:i]
            del self._starts[:i]
        if self._starts and self._starts[0] < start_offset:
            self._starts[0] = start_offset

    def end_offset_for_epoch(
        self, epoch: int, log_end: int, leader_epoch: int | None = None
    ) -> tuple[int, int]:
        """(epoch, end offset) for `epoch` asked (module rules). `leader_epoch`: the epoch this
        replica leads in, counted as starting at the log end when no batch of it is stored yet."""
        epochs, starts = self._epochs, self._starts
        if leader_epoch is not None and (not epochs or leader_epoch > epochs[-1]):
            epochs = [*epochs, leader_epoch]
            starts = [*starts, log_end]
        if epoch < 0 or not epochs or epoch > epochs[-1]:
            return UNDEFINED, UNDEFINED
        if epoch < epochs[0]:
            return epoch, starts[0]
        i = bisect.bisect_right(epochs, epoch) - 1
        end = starts[i + 1] if i + 1 < len(epochs) else log_end
        return epochs[i], end
