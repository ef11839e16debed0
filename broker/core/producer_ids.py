"""Producer ids the broker hands out (Kafka's InitProducerId): unique across the cores of the node
and across its restarts, and never one of the ids clients pick themselves.

Rules this module keeps:
- Ids come from one counter (`BlockSource.claim_block(size)`: the first id of a block of `size`
  ids no one else will ever be given). On one node that counter is a file of the data dir
  (`FileBlockSource`, `layout.producer_ids_path`); the cluster issue moves it to etcd behind the
  same one call.
- A core takes `BLOCK_SIZE` ids at a time and claims the next block only when it has none left.
  The cores are separate processes: a claim runs under an exclusive flock of
  `layout.producer_ids_lock_path`, reads the counter, and writes it past the block durably (fsync,
  rename, fsync of the directory: broker/storage/durable_file.py) before any id of the block is
  given out. A crash or restart therefore skips the rest of a block, never repeats an id.
- A claim blocks its core's loop for one flock and two fsyncs, once per `BLOCK_SIZE` ids
  (InitProducerId is asked once per producer, not per produce).
- Broker ids are below `BROKER_PRODUCER_ID_LIMIT` (2**40, ringlog_proto/batch.py); our own
  client's self-picked ids (random, or given by the user) are at or above it, so they never meet.
  2**40 ids at one InitProducerId a microsecond last twelve days of nothing else; running out
  is an error, not a wrap-around.
- An epoch bump (KIP-360: a producer asking again with its id and epoch) keeps the id and adds one
  to the epoch; a producer whose epoch is already `EPOCH_LAST` (32766: as in Kafka, 32767 is never
  given), or whose id or epoch this broker cannot have given, gets a new id at epoch 0. Any core
  may answer: a partition fences an older epoch and starts a higher one over at sequence 0
  (broker/core/producer_state.py), so no coordinator is needed on one node.
"""

from __future__ import annotations

import contextlib
from typing import Final, Protocol

from broker.storage import layout
from broker.storage.durable_file import exclusive_lock, load_json, replace_json
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT

BLOCK_SIZE: Final = 1000
EPOCH_LAST: Final = (1 << 15) - 2  # the highest epoch given: Kafka's Short.MaxValue - 1
COUNTER_VERSION: Final = 1


class ProducerIdsExhaustedError(Exception):
    """Every broker producer id below `BROKER_PRODUCER_ID_LIMIT` was handed out."""


class ProducerIdsUnavailable(Exception):
    """The counter cannot be reached now (a cluster's etcd is away): no id was given; the client
    asks again (retriable)."""


class BlockSource(Protocol):
    """Where blocks of producer ids come from: one counter shared by every core (and, later, node)."""

    def claim_block(self, size: int) -> int:
        """The first id of `size` consecutive ids given to no one before, stored durably."""
        ...


class FileBlockSource:
    """The counter of one node: `producer-ids.json` in the data dir, claimed under a flock."""

    remote = False  # a claim is a flock and two fsyncs: on the loop (module rules)

    def __init__(self, data_dir: str) -> None:
        self.path = layout.producer_ids_path(data_dir)
        self.lock_path = layout.producer_ids_lock_path(data_dir)

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive_lock(self.lock_path)

    def next_unclaimed(self) -> int:
        """The first id no block holds yet (0 on a new data dir)."""
        doc = load_json(self.path)
        if doc is None:
            return 0
        if not isinstance(doc, dict) or doc.get("version") != COUNTER_VERSION:
            raise ValueError(f"{self.path}: not a producer id counter of version {COUNTER_VERSION}")
        value = doc.get("next_producer_id")
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{self.path}: next_producer_id {value!r} is not an id")
        return value

    def claim_block(self, size: int) -> int:
        with self._locked():
            first = self.next_unclaimed()
            end = first + size
            if end > BROKER_PRODUCER_ID_LIMIT:
                raise ProducerIdsExhaustedError(
                    f"{self.path}: every producer id below {BROKER_PRODUCER_ID_LIMIT} was handed out"
                )
            replace_json(self.path, {"version": COUNTER_VERSION, "next_producer_id": end})
            return first


class ProducerIds:
    """One core's producer ids: a block at a time from `source`."""

    __slots__ = ("_end", "_next", "block_size", "source")

    def __init__(self, source: BlockSource, block_size: int = BLOCK_SIZE) -> None:
        self.source = source
        self.block_size = block_size
        self._next = 0
        self._end = 0  # nothing claimed yet: the first `new()` claims

    def needs_block(self, producer_id: int = -1, epoch: int = -1) -> bool:
        """Whether `init(producer_id, epoch)` would claim a block first."""
        return self._next >= self._end and not _bumpable(producer_id, epoch)

    def add_block(self, first: int) -> None:
        """A block claimed off the loop (`source.claim_block(block_size)`); dropped if another
        claim filled the gap meanwhile (its ids are skipped, never given twice)."""
        if self._next >= self._end:
            self._next, self._end = first, first + self.block_size

    def new(self) -> int:
        """An id given to no producer before, on any core, before or after a restart."""
        if self._next >= self._end:
            self._next = self.source.claim_block(self.block_size)
            self._end = self._next + self.block_size
        pid = self._next
        self._next += 1
        return pid

    def init(self, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        """(id, epoch) for a producer starting (no id given: a new id, epoch 0) or bumping its
        epoch (its current id and epoch given: the same id, epoch + 1; a new id when the epoch is
        exhausted or the pair is not one this broker hands out)."""
        if _bumpable(producer_id, epoch):
            return producer_id, epoch + 1
        return self.new(), 0


def _bumpable(producer_id: int, epoch: int) -> bool:
    """A producer id and epoch this broker gave, whose epoch may still grow (`ProducerIds.init`)."""
    return 0 <= producer_id < BROKER_PRODUCER_ID_LIMIT and 0 <= epoch < EPOCH_LAST
