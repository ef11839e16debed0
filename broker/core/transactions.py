"""A core's transactions: the transaction coordinator (broker/core/txn_coordinator.py) wired to
the internal topic that keeps its state and to the appends the core makes itself.

Rules this module keeps:
- State lives in the internal compacted topic `__transaction_state` (Kafka's name, partitions,
  `cleanup.policy=compact`), created on first use (`ensure_topic`: FindCoordinator for a
  transactional id, or any coordinator call; COORDINATOR_NOT_AVAILABLE while it cannot be).
  A transactional id's partition is `routing.txn_partition`; its coordinator is the core that
  owns that partition (`Core.owner`, as any partition's), so state and coordinator move
  together and a changed `--cores` moves partitions, not ids.
- A state partition is loaded on its owning core when the core starts (those with files) or
  the first time one of its ids is asked for (Kafka loads on leadership; one node has no
  leadership change, and a core that restarts loads again from its log): its records are read
  start to end, then the coordinator serves its ids and sends again the markers of
  transactions it finds prepared.
- A state record is one record (key = id, value = the coordinator's JSON) produced through the
  partition's door with acks=all, carried out by the backend as the core's own append
  (`own_append`, the backend's `run_own_append`): the coordinator hears `NONE` once it is
  durable, NOT_COORDINATOR where this core no longer owns the partition, else
  COORDINATOR_NOT_AVAILABLE, with nothing applied.
- Markers go through `MarkerSender` (broker/core/txn_markers.py).
- A clustered node does not serve transactions yet (`refusal`): its coordinator would need the
  state partition's leadership and epoch, which one node's wiring does not follow. Every
  transactional request there answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED with the reason
  where the response has room for it (FindCoordinator), so a client fails at once instead of
  retrying; idempotent producers are unaffected.
- Clients never write the internal topic (their produce and delete are refused by the adapters,
  `is_internal`); it is read only by its coordinators.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from broker.core.outcomes import Append, Reply, Silent
from broker.core.replication import NotLeaderError
from broker.core.topics import Topic, TopicError, TopicFault
from broker.core.txn_coordinator import Done, MarkerRequest, TransactionCoordinator, TxnCode
from broker.core.txn_log import TxnLogLoader
from broker.core.txn_markers import MarkerSender
from ringlog_proto.batch_decode import decode_batches
from ringlog_proto.batch_encode import encode_batch
from ringlog_proto.messages import Acks
from ringlog_proto.record import Record
from ringlog_proto.routing import txn_partition

if TYPE_CHECKING:
    from broker.core.partition import Partition

log = logging.getLogger(__name__)

TXN_STATE_TOPIC: Final = "__transaction_state"
TXN_STATE_PARTITIONS: Final = 50  # Kafka's transaction.state.log.num.partitions
INTERNAL_TOPICS: Final = frozenset({TXN_STATE_TOPIC})

OwnAppend = Callable[[Append, Callable[[Reply | Silent], None]], None]


def is_internal(topic: str) -> bool:
    return topic in INTERNAL_TOPICS


class CoreTransactions:
    """The transaction coordinator of one core, and what it needs of the core (module rules)."""

    # core: the Core (broker/core/core.py), which imports this module
    def __init__(self, core: Any, partitions: int = TXN_STATE_PARTITIONS) -> None:
        self.core = core
        self.partitions = partitions
        # the backend's `run_own_append`, set when the backend opens the core (none: no appends)
        self.own_append: OwnAppend | None = None
        self.markers = MarkerSender(core, self._own_append)
        self.coordinator = TransactionCoordinator(
            self,
            core.producer_ids,
            self.partition_for,
            core.call_later,
            max_timeout_ms=core.config.transaction_max_timeout_ms,
            abort_interval_ms=core.config.transaction_abort_interval_ms,
        )

    def partition_for(self, txn_id: str) -> int:
        return txn_partition(txn_id, self.partitions)

    # ------------------------------------------------------------------------- the topic

    def topic(self) -> Topic | None:
        registry = self.core.registry
        topic = registry.by_name.get(TXN_STATE_TOPIC)
        if topic is None:
            self.core.refresh_topics(force=True)
            topic = registry.by_name.get(TXN_STATE_TOPIC)
        return topic

    def ensure_topic(self) -> Topic | None:
        """The state topic, created if it is not there yet; None when it cannot be (logged)."""
        topic = self.topic()
        if topic is not None:
            return topic
        try:
            topic = self.core.create_topic(TXN_STATE_TOPIC, self.partitions, {"cleanup.policy": "compact"})
        except TopicError as exc:
            if exc.kind is not TopicFault.EXISTS:
                log.error("cannot create %s: %s", TXN_STATE_TOPIC, exc)
                return None
            topic = self.topic()
        except Exception as exc:  # a full disk: the client asks again
            log.error("cannot create %s: %s", TXN_STATE_TOPIC, exc)
            return None
        return topic

    def refusal(self) -> str | None:
        """Why this node serves no transactions (module rules), or None when it does."""
        if self.core.config.cluster is not None:
            return (
                "ringlog serves transactions on a single node only so far: this node is in a "
                "cluster (an idempotent producer without transactional.id is supported)"
            )
        return None

    def coordinator_of(self, txn_id: str) -> int | None:
        """The core coordinating `txn_id` (the topic made if new); None while there is no topic."""
        topic = self.ensure_topic()
        if topic is None:
            return None
        return self.core.owner(topic.topic_id, self.partition_for(txn_id))

    # ------------------------------------------------------------------------- serving an id

    def ready(self, txn_id: str) -> TxnCode:
        """NONE when this core coordinates `txn_id` and its partition is loaded (loading it if
        it is not yet), else why not."""
        if self.refusal() is not None:
            return TxnCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        topic = self.ensure_topic()
        if topic is None:
            return TxnCode.COORDINATOR_NOT_AVAILABLE
        index = self.partition_for(txn_id)
        if self.core.owner(topic.topic_id, index) != self.core.config.core_id:
            return TxnCode.NOT_COORDINATOR
        if not self.coordinator.owns(index):
            try:
                self._load(topic, index)
            except Exception as exc:
                log.exception("loading %s partition %d failed", TXN_STATE_TOPIC, index)
                self.coordinator.unload(index)
                return (
                    TxnCode.COORDINATOR_NOT_AVAILABLE
                    if not isinstance(exc, NotLeaderError)
                    else (TxnCode.NOT_COORDINATOR)
                )
        return TxnCode.NONE

    def start(self) -> None:
        """Arm the coordinator's timeout and expiry scans and load the state partitions this core
        opened at start (those with files): transactions a crash left prepared send their
        markers now, not when one of their partition's ids is next asked for. The backend calls
        it once its loop runs."""
        self.coordinator.start()
        if self.refusal() is not None:
            return
        topic = self.core.registry.by_name.get(TXN_STATE_TOPIC)
        if topic is None:
            return
        for tid, index in sorted(self.core.partitions):
            if tid == topic.topic_id and not self.coordinator.owns(index):
                try:
                    self._load(topic, index)
                except Exception:
                    log.exception(
                        "loading %s partition %d failed (tried again on use)", TXN_STATE_TOPIC, index
                    )
                    self.coordinator.unload(index)

    def _load(self, topic: Topic, index: int) -> None:
        p = self.core.partition(topic.topic_id, index)
        self.coordinator.begin_load(index, 0)
        loader = TxnLogLoader()
        loader.feed(_records(p))
        self.coordinator.complete_load(index, 0, loader.state())
        log.info("%s partition %d loaded: %d transactional ids", TXN_STATE_TOPIC, index, len(loader.state()))

    # ------------------------------------------------------------------------- TxnIO

    def append(self, partition: int, key: bytes, value: bytes | None, done: Done) -> None:
        topic = self.topic()
        if topic is None:
            done(TxnCode.NOT_COORDINATOR)
            return
        try:
            p = self.core.partition(topic.topic_id, partition)
            produced = p.produce(encode_batch([Record(value, key)]), self.core.space, Acks.ALL)
        except (NotLeaderError, TopicError) as exc:
            log.info("%s partition %d: state not written: %s", TXN_STATE_TOPIC, partition, exc)
            done(TxnCode.NOT_COORDINATOR)
            return
        except Exception as exc:
            log.error("%s partition %d: state not written: %s", TXN_STATE_TOPIC, partition, exc)
            done(TxnCode.COORDINATOR_NOT_AVAILABLE)
            return
        if not hasattr(produced, "pending"):  # a Stored retry: none without a producer id
            done(TxnCode.NONE)
            return
        failed: list[BaseException] = []

        def fail(exc: BaseException) -> Silent:
            produced.fail()
            failed.append(exc)
            return Silent()

        def delivered(_answer: Reply | Silent) -> None:
            if failed:
                log.error("%s partition %d: state not written: %s", TXN_STATE_TOPIC, partition, failed[0])
            done(TxnCode.COORDINATOR_NOT_AVAILABLE if failed else TxnCode.NONE)

        self._own_append(
            Append(p, produced.pending, produced.waits, produced.complete, Silent, fail), delivered
        )

    def send_markers(self, markers: MarkerRequest, done: Callable[[], None]) -> None:
        self.markers.send(markers, done)

    def _own_append(self, outcome: Append, done: Callable[[Reply | Silent], None]) -> None:
        if self.own_append is None:
            raise RuntimeError("this core has no backend to append with")
        self.own_append(outcome, done)

    def close(self) -> None:
        self.coordinator.close()
        self.markers.close()


def _records(p: Partition) -> Iterator[tuple[bytes | None, bytes | None]]:
    """Every record of a state partition, in log order (the partition is small: compacted,
    a few hundred bytes an id)."""
    log_ = p.log
    for seg in list(log_.segments):
        if seg.size:
            data = log_.io.pread(seg.store_fd, seg.size, 0)
            for r in decode_batches(data):
                yield r.key, r.value
