"""A partition as the request handlers see it: its log, idempotent-producer state, consumer-group
offsets, and the consumers long-polling at its end.

Rules this module keeps:
- Owned by one core (the one `routing.owner` names); no locks, no threads.
- Duplicate detection is by (producer id, epoch, sequence range): a producer retrying a batch it
  already sent gets the original offsets back and nothing is appended twice. The state is rebuilt
  from the batch headers in the log when the partition opens, so it survives a broker restart.
- Group offsets are one small JSON file replaced atomically per commit (write, fsync, rename,
  fsync the directory): a commit acknowledged is a commit kept.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.storage.durable_file import load_json, replace_json
from broker.storage.fdcache import FdCache
from broker.storage.layout import group_offsets_path
from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import NO_PRODUCER_ID, BatchHeader

log = logging.getLogger(__name__)

PRODUCER_BATCHES_KEPT = 5  # recent batches remembered per producer: what a client may retry


class SequenceError(Exception):
    """An idempotent producer skipped sequence numbers or used a stale epoch."""


class RetryInFlightError(Exception):
    """A retried batch whose original is still being written: its outcome is not known yet, so
    the retry can be neither stored again nor answered with the original's offsets. Retriable."""


@dataclass(slots=True)
class ProducerState:
    epoch: int
    # (first sequence, last sequence, base offset) of the most recent batches, oldest first
    batches: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=PRODUCER_BATCHES_KEPT))

    @property
    def last_sequence(self) -> int:
        return self.batches[-1][1] if self.batches else -1


class Partition:
    """One partition's state on its owning core."""

    def __init__(
        self, topic_id: int, index: int, directory: str, config: LogConfig, cache: FdCache | None = None
    ) -> None:
        self.topic_id = topic_id
        self.index = index
        self.directory = directory
        self.log = Log.open(directory, config, cache=cache)
        self.producers: dict[int, ProducerState] = {}
        # Batches prepared but not yet written, per producer, in prepare order: (epoch, first
        # sequence, last sequence). A backend that writes asynchronously (io_uring) checks the
        # next pipelined batch of a producer while the one before is still in flight.
        self.in_flight: dict[int, list[tuple[int, int, int]]] = {}
        self.waiters: list[Callable[[], None]] = []
        self._offsets_path = group_offsets_path(directory)
        self.group_offsets: dict[str, tuple[int, str]] = self._load_offsets()
        for h in self.log.batch_headers(self.log.start_offset):
            self._remember(h)

    def close(self) -> None:
        self.wake_waiters()
        self.log.close()

    # ------------------------------------------------------------------------- idempotence

    def check_sequences(self, headers: list[BatchHeader]) -> int | None:
        """Before appending: the base offset already given to these batches if they are a retry,
        else None (append them). Raises SequenceError on a gap or a fenced epoch.

        A request is all duplicates or all new: a mixture is refused as out of order.
        """
        dup_offsets: list[int] = []
        expected: dict[int, int] = {}  # next sequence per producer within this request
        for h in headers:
            pid = h.producer_id
            if pid == NO_PRODUCER_ID:
                continue
            state = self.producers.get(pid)
            last = h.last_sequence
            flying = self.in_flight.get(pid)
            if flying:
                epoch, _, flying_last = flying[-1]
                if (h.producer_epoch, h.base_sequence, last) in flying:
                    raise RetryInFlightError(
                        f"producer {pid}: the batch of sequences {h.base_sequence}-{last} is still "
                        "being written; retry"
                    )
            else:
                epoch = state.epoch if state is not None else -1
                flying_last = -1
            fresh = (state is None and not flying) or h.producer_epoch > epoch
            if not fresh:
                if h.producer_epoch < epoch:
                    raise SequenceError(f"producer {pid} epoch {h.producer_epoch} is fenced by epoch {epoch}")
                if state is not None and state.epoch == h.producer_epoch:
                    cached = next(
                        (b for f, l_, b in state.batches if f == h.base_sequence and l_ == last), None
                    )
                    if cached is not None:
                        dup_offsets.append(cached)
                        continue
            # A producer (or epoch) this partition has not seen starts at sequence 0, as in
            # Kafka: otherwise a retried first batch could land after its successor.
            if fresh:
                default = 0
            elif flying:
                default = flying_last + 1
            else:
                default = state.last_sequence + 1  # type: ignore[union-attr]
            want = expected.get(pid, default)
            if h.base_sequence != want:
                raise SequenceError(
                    f"producer {pid} epoch {h.producer_epoch}: sequence {h.base_sequence} where {want} "
                    "was expected (records lost, or producer state expired with the segments holding it)"
                )
            expected[pid] = last + 1
        if dup_offsets and len(dup_offsets) != len(headers):
            raise SequenceError("a request mixing retried and new batches")
        return dup_offsets[0] if dup_offsets else None

    def _remember(self, h: BatchHeader) -> None:
        if h.producer_id == NO_PRODUCER_ID:
            return
        state = self.producers.get(h.producer_id)
        if state is None or h.producer_epoch > state.epoch:
            state = self.producers[h.producer_id] = ProducerState(h.producer_epoch)
        state.batches.append((h.base_sequence, h.last_sequence, h.base_offset))

    def reserve(self, headers: list[BatchHeader]) -> None:
        """An append of these batches was prepared: later batches of their producers follow them."""
        for h in headers:
            if h.producer_id != NO_PRODUCER_ID:
                entry = (h.producer_epoch, h.base_sequence, h.last_sequence)
                self.in_flight.setdefault(h.producer_id, []).append(entry)

    def unreserve(self, headers: list[BatchHeader]) -> None:
        """The prepared append of these batches completed or was undone."""
        for h in headers:
            flying = self.in_flight.get(h.producer_id)
            if flying:
                entry = (h.producer_epoch, h.base_sequence, h.last_sequence)
                with contextlib.suppress(ValueError):
                    flying.remove(entry)
                if not flying:
                    del self.in_flight[h.producer_id]

    def appended(self, headers: list[BatchHeader]) -> None:
        """After an append completed: remember sequences, wake long-polling fetches."""
        if self.in_flight:
            self.unreserve(headers)
        for h in headers:
            self._remember(h)
        self.wake_waiters()

    # ------------------------------------------------------------------------- long polls

    def wake_waiters(self) -> None:
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()

    # ------------------------------------------------------------------------- group offsets

    def _load_offsets(self) -> dict[str, tuple[int, str]]:
        doc = load_json(self._offsets_path)
        if not isinstance(doc, dict):
            return {}
        return {g: (int(v[0]), str(v[1])) for g, v in doc.items()}

    def commit_offset(self, group: str, offset: int, metadata: str) -> None:
        offsets = dict(self.group_offsets)
        offsets[group] = (offset, metadata)
        replace_json(self._offsets_path, {g: list(v) for g, v in offsets.items()})
        self.group_offsets = offsets
