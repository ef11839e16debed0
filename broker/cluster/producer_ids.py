"""Producer id blocks from the cluster's store: `claim_block` (broker/core/producer_ids.py's one
call) on the `producer-ids` key, so no two nodes, nor two cores, ever hand out the same id.

Rules this module keeps:
- The counter is one key holding `{"version": 1, "next_producer_id": N}` (the file counter's
  document), written only by a txn that compares the mod revision the claimer read (or the key's
  absence): of two concurrent claims one succeeds and the other reads again and claims the next
  block. A late txn (sent, held by a frozen member, applied later) fails its compare: the counter
  never goes back.
- A claim whose txn is uncertain (StoreUncertain) is not resolved: the claimer reads again and
  claims from what it reads. If the uncertain txn applied, its block is skipped, never given
  twice; ids are plentiful (2**40), repeats are not allowed.
- Running out is `ProducerIdsExhaustedError`, as on one node.
- A claim waits on the network (`remote`): the core runs it on its `run_blocking` threads, never
  on its loop (broker/kafka/init_producer_id.py). A store that cannot be reached is
  `ProducerIdsUnavailable` (retriable: COORDINATOR_NOT_AVAILABLE to a Kafka client).
"""

from __future__ import annotations

import json
import time
from typing import Final

from broker.cluster.store import (
    MetadataStore,
    Put,
    StoreError,
    StoreUncertain,
    absent,
    mod_revision_is,
)
from broker.core.producer_ids import COUNTER_VERSION, ProducerIdsExhaustedError, ProducerIdsUnavailable
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT

CLAIM_DEADLINE: Final = 10.0  # s: contention and failovers included; then StoreUnavailable


class EtcdBlockSource:
    """`BlockSource` over the store: the cluster's producer id counter at `key`."""

    remote = True  # a claim is etcd round trips (module rules)

    def __init__(self, store: MetadataStore, key: str, deadline: float = CLAIM_DEADLINE) -> None:
        self.store = store
        self.key = key
        self.deadline = deadline

    def claim_block(self, size: int) -> int:
        try:
            return self._claim(size)
        except StoreError as exc:
            raise ProducerIdsUnavailable(f"{self.key}: no producer id block claimed: {exc}") from exc

    def _claim(self, size: int) -> int:
        end_by = time.monotonic() + self.deadline
        while time.monotonic() < end_by:
            kv = self.store.get(self.key)
            first = 0 if kv is None else self._parse(kv.value)
            end = first + size
            if end > BROKER_PRODUCER_ID_LIMIT:
                raise ProducerIdsExhaustedError(
                    f"{self.key}: every producer id below {BROKER_PRODUCER_ID_LIMIT} was handed out"
                )
            fence = absent(self.key) if kv is None else mod_revision_is(self.key, kv.mod_revision)
            doc = json.dumps({"version": COUNTER_VERSION, "next_producer_id": end})
            try:
                if self.store.txn([fence], [Put(self.key, doc)]).succeeded:
                    return first
            except StoreUncertain:
                pass  # applied or not, the next read says where the free ids start
        raise ProducerIdsUnavailable(f"{self.key}: no producer id block claimed in {self.deadline} s")

    def _parse(self, value: bytes) -> int:
        doc = json.loads(value)
        if not isinstance(doc, dict) or doc.get("version") != COUNTER_VERSION:
            raise ValueError(f"{self.key}: not a producer id counter of version {COUNTER_VERSION}")
        n = doc.get("next_producer_id")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{self.key}: next_producer_id {n!r} is not an id")
        return n
