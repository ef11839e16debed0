"""A core's transactions: the transaction coordinator (broker/core/txn_coordinator.py) wired to
the internal topic that keeps its state and to the appends the core makes itself.

Rules this module keeps:
- State lives in the internal compacted topic `__transaction_state` (Kafka's name and
  `cleanup.policy=compact`; `--transaction-state-partitions` partitions, Kafka's
  transaction.state.log.num.partitions, 50), created on first use (`ensure_topic`:
  FindCoordinator for a transactional id, or any coordinator call; COORDINATOR_NOT_AVAILABLE
  while it cannot be). In a cluster it is made through the controller as any topic
  (`ClusterCalls.create_topic`, off the loop; the cluster's default replication, so fewer live
  nodes than that refuse it and the client hears COORDINATOR_NOT_AVAILABLE), with
  `min.insync.replicas=2` (Kafka's transaction.state.log.min.isr).
- A transactional id's partition is `routing.txn_partition` over the topic's partitions; its
  coordinator is that partition's leader (Kafka's rule): one node, the core that owns the
  partition (`Core.owner`); a cluster, the leader node the view names and the core owning the
  partition there. State and coordinator move together; the coordinator epoch is the
  partition's leader epoch (0 on one node), which the markers carry so a partition refuses an
  older coordinator's.
- A state partition is loaded when this core leads it: in a cluster when the view makes it
  leader (`follow`, after the replica manager gives the roles), at a new epoch again; on one
  node when the core starts (those with files) or the first time one of its ids is asked for.
  Its records are read start to log end a chunk (`LOAD_CHUNK`) per loop turn, the ids
  answering COORDINATOR_LOAD_IN_PROGRESS meanwhile, then the coordinator serves them and sends
  again the markers of transactions it finds prepared (Kafka's
  loadTransactionsForTxnTopicPartition). A partition this core stops leading is unloaded:
  its ids answer NOT_COORDINATOR, and so does every answer still waiting for a state write.
- A state record is one record (key = id, value = the coordinator's JSON) produced through the
  partition's door with acks=all (one node: flushed; a cluster: the high watermark past it),
  carried out by the backend as the core's own append (`own_append`, the backend's
  `run_own_append`): the coordinator hears `NONE` once it is durable, NOT_COORDINATOR where
  this core no longer leads the partition, else COORDINATOR_NOT_AVAILABLE, with nothing applied.
- Markers go through `MarkerSender` (broker/core/txn_markers.py).
- Clients never write the internal topic (their produce and delete are refused by the adapters,
  `is_internal`, and by the cluster's delete); it is read only by its coordinators.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from broker.core.outcomes import Append, Reply, Silent
from broker.core.own_appends import OwnAppend, append_own
from broker.core.replication import LeaderState, NotLeaderError
from broker.core.topics import Topic, TopicError, TopicFault
from broker.core.txn_coordinator import (
    EXPIRY_INTERVAL_MS,
    Done,
    MarkerRequest,
    TransactionCoordinator,
    TxnCode,
)
from broker.core.txn_log import TxnLogLoader
from broker.core.txn_markers import MarkerSender
from ringlog_proto.batch_decode import decode_records, iter_batches
from ringlog_proto.batch_encode import encode_batch
from ringlog_proto.messages import Acks
from ringlog_proto.record import Record
from ringlog_proto.routing import owner, txn_partition

if TYPE_CHECKING:
    from broker.core.partition import Partition

log = logging.getLogger(__name__)

TXN_STATE_TOPIC: Final = "__transaction_state"
TXN_STATE_PARTITIONS: Final = 50  # Kafka's transaction.state.log.num.partitions
TXN_STATE_MIN_INSYNC: Final = 2  # Kafka's transaction.state.log.min.isr
INTERNAL_TOPICS: Final = frozenset({TXN_STATE_TOPIC})
LOAD_CHUNK: Final = 1 << 20  # bytes of a state partition read per loop turn while loading


def is_internal(topic: str) -> bool:
    return topic in INTERNAL_TOPICS


class CoreTransactions:
    """The transaction coordinator of one core, and what it needs of the core (module rules)."""

    # core: the Core (broker/core/core.py), which imports this module
    def __init__(self, core: Any, partitions: int | None = None) -> None:
        self.core = core
        self.partitions = partitions or core.config.transaction_state_partitions
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
            id_expiration_ms=core.config.transactional_id_expiration_ms,
            # scanning less often than ids expire would keep them past their expiry
            expiry_interval_ms=min(EXPIRY_INTERVAL_MS, core.config.transactional_id_expiration_ms),
        )
        self._creating = False  # a cluster's creation of the topic is under way (off the loop)
        self._closed = False

    def partition_for(self, txn_id: str) -> int:
        """The state partition of `txn_id`: over the topic's partitions once it exists (a node
        started with another `--transaction-state-partitions` agrees with the others)."""
        topic = self.core.registry.by_name.get(TXN_STATE_TOPIC)
        return txn_partition(txn_id, topic.partitions if topic is not None else self.partitions)

    # ------------------------------------------------------------------------- the topic

    def topic(self) -> Topic | None:
        registry = self.core.registry
        topic = registry.by_name.get(TXN_STATE_TOPIC)
        if topic is None:
            self.core.refresh_topics(force=True)
            topic = registry.by_name.get(TXN_STATE_TOPIC)
        return topic

    def ensure_topic(self) -> Topic | None:
        """The state topic, its creation started if it is not there yet; None while it is not
        (a cluster creates it off the loop: the client's next call finds it)."""
        topic = self.topic()
        if topic is not None:
            return topic
        cluster = self.core.config.cluster
        if cluster is not None:
            self._create_in_cluster(cluster.calls)
            return None
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

    def _create_in_cluster(self, calls: Any) -> None:
        if self._creating:
            return
        self._creating = True
        registry = self.core.registry
        # a cluster whose default replication is below Kafka's min.isr keeps its own
        min_insync = min(TXN_STATE_MIN_INSYNC, getattr(calls, "default_replication", TXN_STATE_MIN_INSYNC))
        configs = {"cleanup.policy": "compact", "min.insync.replicas": str(min_insync)}

        def create() -> Topic:
            return calls.create_topic(registry, TXN_STATE_TOPIC, self.partitions, configs)

        def done(result: Topic | BaseException) -> None:
            self._creating = False
            if isinstance(result, TopicError) and result.kind is TopicFault.EXISTS:
                return
            if isinstance(result, BaseException):
                log.warning("cannot create %s now: %s", TXN_STATE_TOPIC, result)
            else:
                log.info("created %s (%d partitions)", TXN_STATE_TOPIC, result.partitions)

        self.core.run_blocking(create, done)

    def coordinator_of(self, txn_id: str) -> tuple[int, int] | None:
        """(node, core) coordinating `txn_id`: its state partition's leader (the topic made if
        new); None while there is no topic or the partition has no live leader."""
        topic = self.ensure_topic()
        if topic is None:
            return None
        index = self.partition_for(txn_id)
        view = self.core.cluster
        if not view.clustered:
            return self.core.config.node_id, self.core.owner(topic.topic_id, index)
        state = view.state_of(topic.topic_id, index)
        if state is None or state.leader not in view.live:
            return None
        node = view.nodes.get(state.leader)
        if node is None or not node.cores:
            return None
        return state.leader, owner(topic.topic_id, index, range(node.cores))

    # ------------------------------------------------------------------------- serving an id

    def ready(self, txn_id: str) -> TxnCode:
        """NONE when this core coordinates `txn_id` (its partition loaded or loading: the
        coordinator answers COORDINATOR_LOAD_IN_PROGRESS meanwhile), else why not."""
        topic = self.ensure_topic()
        if topic is None:
            return TxnCode.COORDINATOR_NOT_AVAILABLE
        index = self.partition_for(txn_id)
        if self.core.owner(topic.topic_id, index) != self.core.config.core_id:
            return TxnCode.NOT_COORDINATOR
        epoch = self._leader_epoch(topic, index)
        if epoch is None:
            return TxnCode.NOT_COORDINATOR
        if self.coordinator.epoch_of(index) != epoch:
            try:
                self._load(topic, index, epoch)
            except NotLeaderError:
                return TxnCode.NOT_COORDINATOR
            except Exception:
                log.exception("loading %s partition %d failed", TXN_STATE_TOPIC, index)
                return TxnCode.COORDINATOR_NOT_AVAILABLE
        return TxnCode.NONE

    def _leader_epoch(self, topic: Topic, index: int) -> int | None:
        """The epoch at which this core leads state partition `index` (0 on one node), or None
        when it does not lead it."""
        if not self.core.cluster.clustered:
            return 0 if self.core.owner(topic.topic_id, index) == self.core.config.core_id else None
        p = self.core.partitions.get((topic.topic_id, index))
        if p is None:
            state = self.core.cluster.state_of(topic.topic_id, index)
            if state is None or state.leader != self.core.config.node_id:
                return None
            try:  # led here by the view, not opened yet: opening it gives it its role
                p = self.core.partition_by_id(topic.topic_id, index)
            except (NotLeaderError, TopicError):
                return None
        replica = p.replica
        return replica.epoch if isinstance(replica, LeaderState) else None

    def start(self) -> None:
        """Arm the coordinator's timeout and expiry scans and load the state partitions this core
        leads now (one node: those it opened at start, which have files): transactions a crash
        left prepared send their markers now, not when one of their partition's ids is next
        asked for. The backend calls it once its loop runs."""
        self.coordinator.start()
        self.follow()

    def follow(self) -> None:
        """Load the state partitions this core leads now (again at a new leader epoch) and unload
        those it stopped leading (Kafka's onElection / onResignation): in a cluster after each
        new view's roles are given (broker/core/replica_manager.py)."""
        if self._closed:
            return
        topic = self.core.registry.by_name.get(TXN_STATE_TOPIC)
        for index in self.coordinator.owned():
            if topic is None or self._leader_epoch(topic, index) != self.coordinator.epoch_of(index):
                log.info("%s partition %d: no longer led here, unloaded", TXN_STATE_TOPIC, index)
                self.coordinator.unload(index)
        if topic is None:
            return
        for index in range(topic.partitions):
            if (topic.topic_id, index) not in self.core.partitions or self.coordinator.owns(index):
                continue
            epoch = self._leader_epoch(topic, index)
            if epoch is None:
                continue
            try:
                self._load(topic, index, epoch)
            except Exception:
                log.exception("loading %s partition %d failed (tried again on use)", TXN_STATE_TOPIC, index)

    def _load(self, topic: Topic, index: int, epoch: int) -> None:
        """Read partition `index` into the coordinator at `epoch`, a chunk per loop turn (the
        first at once: a small partition is served from this call on)."""
        p = self.core.partition_by_id(topic.topic_id, index)
        self.coordinator.begin_load(index, epoch)
        loader = TxnLogLoader()
        chunks = _chunks(p)
        try:
            ahead = [next(chunks, None)]  # the chunk the next step feeds
        except Exception:
            self.coordinator.unload(index)
            raise

        def step() -> None:
            if self._closed or self.coordinator.epoch_of(index) != epoch:
                return  # unloaded, or loading again at a newer epoch
            try:
                records = ahead[0]
                if records is not None:
                    loader.feed(records)
                    ahead[0] = next(chunks, None)
            except Exception:
                log.exception("loading %s partition %d failed (tried again on use)", TXN_STATE_TOPIC, index)
                self.coordinator.unload(index)
                return
            if ahead[0] is not None:
                self.core.call_later(0, step)
                return
            self.coordinator.complete_load(index, epoch, loader.state())
            log.info(
                "%s partition %d loaded at coordinator epoch %d: %d transactional ids",
                TXN_STATE_TOPIC,
                index,
                epoch,
                len(loader.state()),
            )

        step()

    # ------------------------------------------------------------------------- TxnIO

    def append(self, partition: int, key: bytes, value: bytes | None, done: Done) -> None:
        topic = self.topic()
        if topic is None:
            done(TxnCode.NOT_COORDINATOR)
            return
        try:
            p = self.core.partition_by_id(topic.topic_id, partition)
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

        def delivered(error: BaseException | None) -> None:
            if error is not None:
                log.error("%s partition %d: state not written: %s", TXN_STATE_TOPIC, partition, error)
                not_leader = isinstance(error, NotLeaderError)
                done(TxnCode.NOT_COORDINATOR if not_leader else TxnCode.COORDINATOR_NOT_AVAILABLE)
                return
            done(TxnCode.NONE)

        append_own(self._own_append, p, produced, delivered)

    def send_markers(self, markers: MarkerRequest, done: Callable[[], None]) -> None:
        self.markers.send(markers, done)

    def _own_append(self, outcome: Append, done: Callable[[Reply | Silent], None]) -> None:
        if self.own_append is None:
            raise RuntimeError("this core has no backend to append with")
        self.own_append(outcome, done)

    def close(self) -> None:
        self._closed = True
        self.coordinator.close()
        self.markers.close()


def _chunks(p: Partition) -> Iterator[list[tuple[bytes | None, bytes | None]]]:
    """The (key, value) of every record of a state partition, in log order, about `LOAD_CHUNK`
    bytes of whole batches at a time (a batch larger than that whole)."""
    log_ = p.log
    for seg in list(log_.segments):
        pos, size, want = 0, seg.size, LOAD_CHUNK
        while pos < size:
            n = min(want, size - pos)
            data = log_.io.pread(seg.store_fd, n, pos)
            used = 0
            records: list[tuple[bytes | None, bytes | None]] = []
            for at, h in iter_batches(data):
                if not h.control:
                    records.extend((r.key, r.value) for r in decode_records(data, at))
                used = at + h.size
            if not used:
                if n == size - pos:
                    break  # a torn tail (recovery truncates it at the next open)
                want *= 2
                continue
            want = LOAD_CHUNK
            pos += used
            yield records
