"""Request handlers: decode, validate, decide; never wait, never touch a socket.

Rules this module keeps:
- `Handlers.handle(frame)` returns an `Outcome` saying what to do, not doing the I/O itself:
  `Reply` (send these buffers), `Silent` (send nothing: acks=0), `Append` (run the log writes, then
  call `complete` or `fail`), `Read` (read this extent, then call `finish`), `Wait` (nothing to
  fetch yet: re-handle the frame when the partition grows or the deadline passes), `Forward` (the
  partition belongs to another core: send the frame there and relay its answer), `Notify` (tell
  other cores about a topic change, then answer). The uvloop backend runs these with blocking
  file calls; the io_uring backend will run the very same outcomes as SQEs. The handlers are
  therefore testable with no server at all.
- A core serves only the partitions it owns (`shard_for(topic_id, partition, cores)`); a partition
  request for another core's partition becomes `Forward` before its body is even decoded, except
  when it came from another core (`handle(frame, from_peer=True)`): then it is NOT_OWNER, so a
  forward can never loop. OffsetCommit and OffsetFetch go to the group's coordinator core instead
  (`coordinator_for(group, cores)`, the group read from the body), whose store both protocols
  share (broker/core/groups.py, broker/core/coordinator.py).
- Partitions open on first use: a core opens, at start, the partitions it owns that have files,
  and any other only when a request for it arrives (creating its directory and first segment
  then, in that one request). CreateTopic therefore only writes the registry, whatever the
  partition count: no request ever waits behind thousands of partition creations, and no
  request sees a half-made partition (one is made whole within the request that needs it).
- Topic metadata is shared by all cores through topics.json (broker/core/topics.py). A core learns of
  another core's change on a miss (a partition it should own but has not opened, an unknown topic:
  reload once, then answer), from Metadata and `refresh_topics()` (a stat of the file, run by the
  backend about once a second), and from a DeleteTopic frame sent by the deleting core over the
  inter-core channel (`from_peer=True`): that core answers the client only after every peer closed
  the topic's partitions (or the notice timed out), so once DeleteTopic is answered no live core
  accepts produce for it. The deleting core removes the files last.
- One place maps exceptions to wire error codes (`error_of`). A request that fails gets an error
  response; only a frame that cannot be delimited closes its connection (the server's business).
- Responses leave in request order per connection; the backend guarantees it, not this module.
- A produce is one question to its partition (`Partition.produce`, which drives the log and the
  producer state); the handler decodes the request and turns the answer, or the exception, into
  an outcome. It never calls the log or the producer state of a produce itself.
- A full disk refuses writes, never reads (broker/storage/diskspace.py): Produce (through the
  partition, after its retry check: a retry of stored batches is still answered), CreateTopic and
  OffsetCommit ask `space.check_writable()` first and get OUT_OF_SPACE (retriable); a write that
  fails with ENOSPC anyway answers the same and tells `space`. Fetch, ListOffsets, Metadata,
  OffsetFetch, DeleteTopic and retention never ask.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from broker import __version__
from broker.core.access import Access
from broker.core.blocking import RunBlocking, no_threads
from broker.core.cluster_view import ClusterView, ViewFile
from broker.core.config import BrokerConfig
from broker.core.coordinator import CallLater, GroupCode, GroupCoordinator, JoinResult, SyncResult
from broker.core.groups import (
    OFFSET_METADATA_MAX,
    Committed,
    GroupError,
    GroupOffsetStore,
    OffsetsUnavailable,
    check_group,
)
from broker.core.limits import FETCH_MAX_BYTES_MAX, FETCH_WAIT_MS_MAX
from broker.core.metrics import CoreMetrics, read_snapshots
from broker.core.outcomes import (
    Append,
    Durable,
    Forward,
    Gather,
    Later,
    Notify,
    Outcome,
    Read,
    Reply,
    Silent,
    Wait,
)
from broker.core.partition import Diverging, Partition, PendingRead, ReadAnswer, Stored
from broker.core.producer_ids import FileBlockSource, ProducerIds
from broker.core.producer_state import RetryInFlightError, SequenceError
from broker.core.remote import RemoteLinks
from broker.core.replication import NotEnoughReplicasError, NotLeaderError
from broker.core.topics import Topic, TopicError, TopicRegistry
from broker.core.views import MetadataView, NodeView, PartitionView, TopicView
from broker.storage import layout
from broker.storage.diskspace import DiskSpace, is_out_of_space
from broker.storage.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    InvalidBatchError,
    LogClosedError,
    OffsetOutOfRangeError,
    OutOfSpaceError,
    RecordFramingError,
    StorageError,
    UnsupportedBatchError,
)
from broker.storage.fdcache import FdCache
from ringlog_proto import messages as m
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import Frame
from ringlog_proto.routing import coordinator_for, coordinator_node, owner, shard_for

T = TypeVar("T")
log = logging.getLogger(__name__)

BROKER_VERSION = __version__
FORCED_REFRESH_GAP_S = 0.001  # see `refresh_topics`
MIRROR_WAIT_S = 3.0  # a store change not in this node's registry by then is answered anyway
MIRROR_POLL_S = 0.005
OWNER_CACHE_MAX = 100_000  # (topic id, partition) -> core entries kept; cleared when full
PARTITION_APIS = frozenset({m.ApiKey.PRODUCE, m.ApiKey.FETCH, m.ApiKey.LIST_OFFSETS})
# to the group's coordinator core
GROUP_APIS = frozenset(
    {
        m.ApiKey.OFFSET_COMMIT,
        m.ApiKey.OFFSET_FETCH,
        m.ApiKey.JOIN_GROUP,
        m.ApiKey.SYNC_GROUP,
        m.ApiKey.HEARTBEAT,
        m.ApiKey.LEAVE_GROUP,
    }
)
# answers that wait at the coordinator for the rest of the group: forwarded as long polls
_WAITING_GROUP_APIS = frozenset({m.ApiKey.JOIN_GROUP, m.ApiKey.SYNC_GROUP})
# the coordinator's answers in our error codes (MEMBER_ID_REQUIRED never: we join in one step)
_GROUP_CODES: dict[GroupCode, m.ErrorCode] = {
    GroupCode.NONE: m.ErrorCode.NONE,
    GroupCode.UNKNOWN_MEMBER_ID: m.ErrorCode.UNKNOWN_MEMBER_ID,
    GroupCode.ILLEGAL_GENERATION: m.ErrorCode.ILLEGAL_GENERATION,
    GroupCode.REBALANCE_IN_PROGRESS: m.ErrorCode.REBALANCE_IN_PROGRESS,
    GroupCode.INCONSISTENT_GROUP_PROTOCOL: m.ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
    GroupCode.MEMBER_ID_REQUIRED: m.ErrorCode.UNKNOWN_MEMBER_ID,
    GroupCode.INVALID_SESSION_TIMEOUT: m.ErrorCode.INVALID_REQUEST,
    GroupCode.NOT_COORDINATOR: m.ErrorCode.NOT_OWNER,
    GroupCode.INVALID_REQUEST: m.ErrorCode.INVALID_REQUEST,
}


def _no_timers(delay_s: float, callback: Callable[[], None]) -> object:
    raise RuntimeError("these handlers have no event loop: group membership needs one")


def error_of(exc: BaseException) -> tuple[m.ErrorCode, str]:
    """The one mapping from exceptions to wire error codes."""
    E = m.ErrorCode
    match exc:
        case m.MalformedBody():
            return E.INVALID_REQUEST, f"malformed request: {exc}"
        case BatchTooLargeError():
            return E.MESSAGE_TOO_LARGE, str(exc)
        case RecordFramingError() | UnsupportedBatchError():
            return E.INVALID_BATCH, str(exc)
        case InvalidBatchError():
            return E.CORRUPT_MESSAGE, str(exc)
        case OffsetOutOfRangeError():
            return E.OFFSET_OUT_OF_RANGE, str(exc)
        case SequenceError():
            return E.OUT_OF_ORDER_SEQUENCE, str(exc)
        case RetryInFlightError():
            return E.REQUEST_TIMED_OUT, str(exc)
        case NotLeaderError():
            return E.NOT_OWNER, f"not the leader: {exc}"
        case NotEnoughReplicasError():
            return E.NOT_ENOUGH_REPLICAS, str(exc)
        case OutOfSpaceError():
            return E.OUT_OF_SPACE, str(exc)
        case StorageError() | OSError() if is_out_of_space(exc):
            return E.OUT_OF_SPACE, f"the disk holding the data dir is full, nothing was stored: {exc}"
        case CorruptBatchError() | LogClosedError() | StorageError() | OSError():
            return E.STORAGE_ERROR, str(exc)
        case TopicError(kind="exists"):
            return E.TOPIC_ALREADY_EXISTS, str(exc)
        case TopicError(kind="unknown"):
            return E.UNKNOWN_TOPIC_OR_PARTITION, str(exc)
        case TopicError(kind="invalid"):
            return E.INVALID_TOPIC, str(exc)
        case TopicError(kind="limit"):
            return E.LIMIT_EXCEEDED, str(exc)
        case TopicError():
            return E.INVALID_CONFIG, str(exc)
        case GroupError():
            return E.INVALID_GROUP, str(exc)
        case OffsetsUnavailable():
            return E.REQUEST_TIMED_OUT, str(exc)
        case ValueError():
            return E.INVALID_REQUEST, str(exc)
    return E.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"


class Handlers:
    """The request-handling state of one core: its topics view and the partitions it owns.

    Owned by the core's event-loop thread. `metrics` are this core's counters (the backend bumps
    the per-request ones; Handlers counts errors); `gauges` are set by the backend (queue depths,
    read when a snapshot is taken: STATS and the published files).
    """

    def __init__(
        self,
        config: BrokerConfig,
        metrics: CoreMetrics | None = None,
        call_later: CallLater | None = None,
        run_blocking: RunBlocking | None = None,
    ) -> None:
        self.config = config
        # slow control-plane calls off the loop: `self.run_blocking(fn, done)` (broker/core/blocking.py)
        self.run_blocking: RunBlocking = run_blocking or no_threads
        self.metrics = metrics if metrics is not None else CoreMetrics(config.core_id, config.backend)
        self.gauges: dict[str, Callable[[], int]] = {}
        # This core's TCP links to other brokers' cores (broker/core/remote.py), set by the backend
        # that serves it: how replication reaches a leader's core. None without a backend (tests).
        self.remote_links: RemoteLinks | None = None
        self._forced_at = -1.0  # when `refresh_topics(force=True)` last reread the registry
        self.space = DiskSpace(config.data_dir, config.limits.min_free_bytes)  # broker/storage/diskspace.py
        os.makedirs(layout.topics_dir(config.data_dir), exist_ok=True)
        self.registry = TopicRegistry(
            config.data_dir, config.log_defaults, remove_orphans=False, limits=config.limits
        )
        with self.registry.locked():  # orphans are removed only here: at start, under the lock
            self.registry.load()
            self.registry.remove_orphans()
        # Files of closed segments this core keeps open (broker/storage/fdcache.py).
        self.fd_cache = FdCache(config.limits.segment_fd_cache)
        self.partitions: dict[tuple[int, int], Partition] = {}
        # The cluster as the node's supervisor last published it (one node: none, and no cost).
        # A clustered core starts from the view the agent published before the workers started
        # (or an empty one: every partition refused until a view names its replicas here).
        self.cluster = ClusterView.single(config.node_id)
        if config.cluster is not None:
            self.cluster = ViewFile(layout.run_dir(config.data_dir)).poll() or ClusterView(
                config.node_id, -1, clustered=True
            )
        # Broker-assigned producer ids (Kafka's InitProducerId); the first use claims a block.
        # (a cluster's come from its store: ids unique across nodes, as a partition's producer state
        # moves between them; a claim blocks this loop once per block, as the file's flock does)
        ids = config.cluster.producer_ids if config.cluster is not None else None
        self.producer_ids = ProducerIds(ids or FileBlockSource(config.data_dir))
        self._owners: dict[tuple[int, int], int] = {}
        for topic in self.registry.by_id.values():
            self._open_stored(topic)
        self.call_later: CallLater = call_later or _no_timers
        # the groups this core coordinates: membership (timers on the backend's loop) and offsets
        self.coordinator = GroupCoordinator(
            (config.cluster.group_offsets if config.cluster is not None else None)
            or GroupOffsetStore(config.data_dir),
            self.call_later,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        )
        self._dispatch: dict[int, Callable[[m.Request, Frame], Outcome]] = {
            m.ApiKey.API_VERSIONS: self._api_versions,
            m.ApiKey.METADATA: self._metadata,
            m.ApiKey.CREATE_TOPIC: self._create_topic,
            m.ApiKey.DELETE_TOPIC: self._delete_topic,
            m.ApiKey.PRODUCE: self._produce,
            m.ApiKey.FETCH: self._fetch,
            m.ApiKey.LIST_OFFSETS: self._list_offsets,
            m.ApiKey.OFFSET_COMMIT: self._offset_commit,
            m.ApiKey.OFFSET_FETCH: self._offset_fetch,
            m.ApiKey.STATS: self._stats,
            m.ApiKey.JOIN_GROUP: self._join_group,
            m.ApiKey.SYNC_GROUP: self._sync_group,
            m.ApiKey.HEARTBEAT: self._heartbeat,
            m.ApiKey.LEAVE_GROUP: self._leave_group,
            m.ApiKey.REPLICA_FETCH: self._replica_fetch,
            # SASL belongs to a connection: the backend hands these to `access` (which knows the
            # connection's state) before they could get here; what does is from another core.
            m.ApiKey.SASL_HANDSHAKE: self._sasl_elsewhere,
            m.ApiKey.SASL_AUTHENTICATE: self._sasl_elsewhere,
        }
        # Authentication and ACLs of our protocol; the Kafka adapter shares its two parts.
        self.access = Access(self)

    def close(self) -> None:
        """Close every partition (flushing them). Call once, at shutdown."""
        for p in self.partitions.values():
            try:
                p.close()
            except StorageError as exc:
                log.error("closing partition %d/%d: %s", p.topic_id, p.index, exc)
        self.partitions.clear()

    def owner(self, topic_id: int, partition: int) -> int:
        key = (topic_id, partition)
        core = self._owners.get(key)
        if core is None:
            if len(self._owners) >= OWNER_CACHE_MAX:
                self._owners.clear()
            core = self._owners[key] = shard_for(topic_id, partition, self.config.cores)
        return core

    def _open_stored(self, topic: Topic) -> None:
        """At start: open the partitions of `topic` this core owns that have files (the others
        open on first use). Retention and recovery thus reach every partition holding data."""
        try:
            names = os.listdir(layout.topic_dir(self.config.data_dir, topic.topic_id))
        except FileNotFoundError:
            return
        for i in sorted(n for n in map(layout.parse_number_name, names) if n is not None):
            if i < topic.partitions and self.owner(topic.topic_id, i) == self.config.core_id:
                if self.cluster.clustered and not self.replicated_here(topic.topic_id, i):
                    continue  # files of a replica moved away: kept, not served
                try:
                    self._open_partition(topic, i)
                except (StorageError, OSError) as exc:
                    # It needs a new segment file (none survived) on a full disk: serve the
                    # rest; it opens on its first request once there is room (_partition).
                    if not is_out_of_space(exc):
                        raise
                    log.error("opening partition %d of topic %s: %s (retried on use)", i, topic.name, exc)

    def _open_partition(self, topic: Topic, index: int) -> Partition:
        """Open (creating it if new) partition `index` of `topic`, which this core owns."""
        key = (topic.topic_id, index)
        p = self.partitions.get(key)
        if p is None:
            path = self.registry.partition_dir(topic.topic_id, index)
            p = Partition(topic.topic_id, index, path, topic.log_config(), self.fd_cache)
            self.partitions[key] = p
            if self.cluster.clustered:
                self.give_role(p)
        return p

    def group_coordinator(self, group: str) -> tuple[int, int]:
        """(node, core) coordinating `group`: a core of this node alone; in a cluster the node is
        `routing.coordinator_node` over the live nodes that are not draining (`ClusterView.serving`:
        what clients compute too, from Metadata), then the core
        over its cores. Groups' offsets stay on that node (docs/CLUSTER.md says what that means)."""
        c = self.cluster
        live = [n for n in c.serving if n in c.nodes] if c.clustered else []
        if not live:
            return self.config.node_id, coordinator_for(group, self.config.cores)
        node = coordinator_node(group, live)
        return node, coordinator_for(group, c.nodes[node].cores)

    def replicated_here(self, topic_id: int, index: int) -> bool:
        """Whether the cluster view puts a replica of the partition on this node."""
        state = self.cluster.state_of(topic_id, index)
        return state is not None and self.config.node_id in state.replicas

    def give_role(self, p: Partition) -> None:
        """The role the view names for this node's replica of `p` (a clustered core's partitions
        always have one: a partition without a role would serve as if alone)."""
        state = self.cluster.state_of(p.topic_id, p.index)
        me = self.config.node_id
        settings = self.config.cluster
        if state is None or me not in state.replicas or settings is None:
            return
        if state.leader == me:
            p.become_leader(state.leader_epoch, state.replicas, state.isr, me, min_insync=settings.min_insync)
        else:
            p.become_follower(state.leader_epoch, state.leader)

    # ------------------------------------------------------------------------- topics shared by cores

    def refresh_topics(self, force: bool = False) -> None:
        """Catch up with topic changes made by other cores: reread topics.json when it was replaced
        (or always, with `force`), open the partitions of new topics this core owns and close those
        of topics that are gone. Never removes files (see broker/core/topics.py)."""
        if force:
            # One forced reread per millisecond at most: a request naming thousands of unknown
            # topics or partitions asked for one per entry (~30 us each); between two,
            # the replace check below still sees a registry another core rewrote.
            now = time.monotonic()
            if now - self._forced_at < FORCED_REFRESH_GAP_S:
                force = False
            else:
                self._forced_at = now
        try:
            if force:
                self.registry.load()
            elif not self.registry.refresh():
                return
        except (ValueError, KeyError, TypeError, OSError) as exc:
            # A registry this core cannot read (damaged by hand, a disk error): keep serving the
            # topics it knows; creates and deletes, which must read it, fail with the reason.
            log.error(
                "cannot read the topic registry (%s); keeping the %d topics known",
                exc,
                len(self.registry.by_id),
            )
            return
        self._sync_partitions()

    def _sync_partitions(self) -> None:
        """Close the partitions of topics that are gone (new topics' partitions open on first use)."""
        live = self.registry.by_id
        for key in [k for k in self.partitions if k[0] not in live]:
            p = self.partitions.pop(key)
            log.info("topic id %d is gone: closing partition %d", key[0], key[1])
            try:
                p.close(discard=True)  # its files go with the topic: nothing to flush first
            except StorageError as exc:
                log.error("closing partition %d/%d: %s", p.topic_id, p.index, exc)

    # ------------------------------------------------------------------------- entry point

    def handle(self, frame: Frame, from_peer: bool = False) -> Outcome:
        """The outcome of one request frame. `from_peer`: it arrived over the inter-core channel
        (forwarded by, or a notice from, another core of this broker)."""
        reason = m.unsupported(frame)
        if reason is not None:
            return self._error(frame, m.ErrorCode.UNSUPPORTED_VERSION, reason)
        if frame.api_key in PARTITION_APIS and self.config.cores > 1:
            core = self.owner(frame.topic_id, frame.partition)
            if core != self.config.core_id:
                if from_peer:
                    return self._error(
                        frame, m.ErrorCode.NOT_OWNER, f"core {self.config.core_id} does not own it"
                    )
                return Forward(core, frame, _is_long_poll(frame), not _is_silent_produce(frame))
        if frame.api_key in GROUP_APIS and (self.config.cores > 1 or self.cluster.clustered):
            try:
                group = m.decode_request(frame).group  # type: ignore[attr-defined]
            except Exception as exc:  # a body that does not parse: answered by the dispatch below
                group = None
                log.debug("group request that does not decode: %s", exc)
            if group:
                node, core = self.group_coordinator(group)
                if node != self.config.node_id:
                    return self._error(
                        frame, m.ErrorCode.NOT_OWNER, f"node {node} coordinates group {group!r}"
                    )
                if core != self.config.core_id:
                    if from_peer:
                        return self._error(
                            frame, m.ErrorCode.NOT_OWNER, f"core {self.config.core_id} does not coordinate it"
                        )
                    return Forward(core, frame, frame.api_key in _WAITING_GROUP_APIS, True)
        if from_peer and frame.api_key == m.ApiKey.DELETE_TOPIC:
            return self._topic_deleted_elsewhere(frame)
        try:
            req = m.decode_request(frame)
            return self._dispatch[frame.api_key](req, frame)
        except Exception as exc:  # every failure becomes an error response
            code, message = error_of(exc)
            if code == m.ErrorCode.OUT_OF_SPACE and not isinstance(exc, OutOfSpaceError):
                self.space.saw_full(exc)  # a write failed with ENOSPC (a roll, a commit, a create)
            if code == m.ErrorCode.UNKNOWN_SERVER_ERROR:
                log.exception("unexpected error handling api %d", frame.api_key)
            if _is_silent_produce(frame):
                # acks=0 promises no response at all (docs/PROTOCOL.md §1): an error answer would
                # be taken for the reply to the client's next request. Counted, not sent.
                self.metrics.error()
                log.debug("acks=0 produce refused: %s: %s", code.name, message)
                return Silent()
            return self._error(frame, code, message)

    def _reply(self, frame: Frame, resp: m.Response) -> Reply:
        return Reply(m.encode_response(resp, frame.correlation_id, None, frame.topic_id, frame.partition))

    def error_reply(self, frame: Frame, exc: BaseException) -> Reply:
        """The error response for `exc` raised while carrying out an outcome for `frame`."""
        code, message = error_of(exc)
        return self._error(frame, code, message)

    def error_answer(self, frame: Frame, code: m.ErrorCode, message: str) -> Reply:
        """The error response with `code` to `frame` (counted in this core's metrics)."""
        return self._error(frame, code, message)

    def _error(self, frame: Frame, code: m.ErrorCode, message: str) -> Reply:
        self.metrics.error()
        resp = m.error_response(frame.api_key, code, message)
        return Reply(
            m.encode_response(resp, frame.correlation_id, frame.api_key, frame.topic_id, frame.partition)
        )

    def _partition(self, frame: Frame) -> Partition:
        """The partition a request names, opened (made, if new) on its first use."""
        p = self.partitions.get((frame.topic_id, frame.partition))
        if p is not None:
            return p
        topic = self.registry.by_id.get(frame.topic_id)
        if topic is None or not 0 <= frame.partition < topic.partitions:
            self.refresh_topics(force=True)  # a miss: another core may have created the topic
        else:
            self.refresh_topics()  # a stat: a topic deleted meanwhile is not made again
        topic = self.registry.by_id.get(frame.topic_id)
        if topic is None or not 0 <= frame.partition < topic.partitions:
            raise TopicError("unknown", f"no partition {frame.partition} of topic id {frame.topic_id}")
        if self.owner(topic.topic_id, frame.partition) != self.config.core_id:
            raise TopicError(
                "unknown", f"partition {frame.partition} of topic id {frame.topic_id} is not on this core"
            )
        if self.cluster.clustered and not self.replicated_here(topic.topic_id, frame.partition):
            node = self.config.node_id
            raise NotLeaderError(f"node {node} holds no replica of partition {frame.partition}")
        return self._open_partition(topic, frame.partition)

    def partition_named(self, topic: str, index: int) -> Partition | int:
        """Partition `index` of the topic named `topic` when this core owns it (opened, made if
        new), else the core that owns it: the protocol-neutral lookup of a multi-partition
        request (Kafka's), which answers a partition of another core rather than forward it.
        Raises `TopicError` for an unknown topic or partition."""
        t = self.registry.by_name.get(topic)
        if t is None or not 0 <= index < t.partitions:
            self.refresh_topics(force=True)
            t = self.registry.by_name.get(topic)
        if t is None or not 0 <= index < t.partitions:
            raise TopicError("unknown", f"no partition {index} of topic {topic!r}")
        core = self.owner(t.topic_id, index)
        if core != self.config.core_id:
            return core
        p = self.partitions.get((t.topic_id, index))
        if p is not None:
            return p
        self.refresh_topics()  # a stat: a topic deleted meanwhile is not made again
        current = self.registry.by_id.get(t.topic_id)
        if current is None:
            raise TopicError("unknown", f"no partition {index} of topic {topic!r}")
        return self._open_partition(current, index)

    # ------------------------------------------------------------------------- admin

    def _api_versions(self, req: m.Request, frame: Frame) -> Outcome:
        apis = tuple(m.ApiVersion(k, lo, hi) for k, (lo, hi) in sorted(m.SUPPORTED_VERSIONS.items()))
        resp = m.ApiVersionsResponse(
            broker_version=BROKER_VERSION, node_id=self.config.node_id, cores=self.config.cores, apis=apis
        )
        return self._reply(frame, resp)

    def metadata_view(self, names: Sequence[str] | None = None) -> MetadataView:
        """Topics (`names`, or every one when None), their partitions with owning cores, and
        where each core is reached: the one answer both protocols encode (broker/core/views.py)."""
        self.refresh_topics()
        if names and any(name not in self.registry.by_name for name in names):
            self.refresh_topics(force=True)
        if names is None:
            names = sorted(self.registry.by_name)
        cluster = self.cluster
        node_id = self.config.node_id
        nodes = {
            n.node_id: NodeView(
                n.node_id, n.host, n.port, n.cores, n.core_ports, n.rack, n.node_id in cluster.serving
            )
            for n in cluster.nodes.values()
        }
        if node_id not in nodes:
            config = self.config
            nodes[node_id] = NodeView(
                node_id, config.public_host, config.port, config.cores, config.core_ports
            )
        topics = []
        for name in names:
            topic = self.registry.by_name.get(name)
            if topic is None:
                topics.append(TopicView(name, 0, known=False))
                continue
            parts = []
            for i in range(topic.partitions):
                p = self.partitions.get((topic.topic_id, i))
                start, end = (p.log.start_offset, p.high_watermark) if p is not None else (-1, -1)
                state = cluster.state_of(topic.topic_id, i) if cluster.clustered else None
                if state is None and cluster.clustered:  # its first state is not written yet
                    parts.append(PartitionView(i, -1, -1, -1, -1, 0, (), ()))
                    continue
                if state is None:
                    core = self.owner(topic.topic_id, i)
                    me = ((node_id, core),)
                    parts.append(PartitionView(i, core, start, end, node_id, 0, me, me))
                    continue
                placed = {r: (r, _core_on(nodes.get(r), topic.topic_id, i)) for r in state.replicas}
                leader = nodes.get(state.leader)
                if leader is not None and not leader.live:
                    leader = None
                parts.append(
                    PartitionView(
                        i,
                        _core_on(leader, topic.topic_id, i) if leader is not None else -1,
                        start,
                        end,
                        state.leader if leader is not None else -1,
                        state.leader_epoch,
                        tuple(placed[r] for r in state.replicas),
                        tuple(placed[r] for r in state.isr if r in placed),
                    )
                )
            topics.append(
                TopicView(
                    topic.name,
                    topic.topic_id,
                    known=True,
                    retention_ms=_wire_limit(topic.retention_ms),
                    retention_bytes=_wire_limit(topic.retention_bytes),
                    segment_bytes=topic.segment_bytes,
                    partitions=tuple(parts),
                )
            )
        return MetadataView(
            host=self.config.public_host,
            port=self.config.port,
            cores=self.config.cores,
            core_ports=self.config.core_ports,
            steering=bool((self.config.bpf_snapshot() or {}).get("steering")),  # the supervisor's bpf.json
            topics=tuple(topics),
            node_id=node_id,
            nodes=tuple(sorted(nodes.values(), key=lambda n: n.node_id)),
            clustered=cluster.clustered,
            controller=cluster.controller if cluster.controller in cluster.live else node_id,
        )

    def _sasl_elsewhere(self, req: m.Request, frame: Frame) -> Outcome:
        return self._error(frame, m.ErrorCode.ILLEGAL_SASL_STATE, "SASL is not spoken between cores")

    def topic_name(self, topic_id: int) -> str | None:
        """The name of topic `topic_id` (None if there is none): the resource an ACL names."""
        topic = self.registry.by_id.get(topic_id)
        if topic is None:
            self.refresh_topics(force=True)  # another core may have created it
            topic = self.registry.by_id.get(topic_id)
        return topic.name if topic is not None else None

    def _metadata(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.MetadataRequest)
        return self.metadata_reply(req, frame)

    def metadata_reply(
        self, req: m.MetadataRequest, frame: Frame, may_describe: Callable[[str], bool] | None = None
    ) -> Reply:
        """The Metadata answer. With `may_describe` (ACLs on: broker/core/access.py) a topic the
        principal may not describe is left out of a listing of every topic, and answered
        TOPIC_AUTHORIZATION_FAILED, without its id or settings, when named: whether it exists is
        not told either (Kafka's rule)."""
        view = self.metadata_view(req.topics or None)
        # one decision per topic (each reads the ACLs): refused ones are left out of a listing
        refused = set() if may_describe is None else {t.name for t in view.topics if not may_describe(t.name)}
        shown = [t for t in view.topics if req.topics or t.name not in refused]
        topics = tuple(
            m.TopicMetadata(m.ErrorCode.TOPIC_AUTHORIZATION_FAILED, t.name, 0)
            if t.name in refused
            else m.TopicMetadata(
                m.ErrorCode.NONE if t.known else m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                t.name,
                t.topic_id,
                t.retention_ms,
                t.retention_bytes,
                t.segment_bytes,
                tuple(
                    m.PartitionMetadata(
                        p.index,
                        p.owner_core,
                        p.start_offset,
                        p.end_offset,
                        p.leader_node,
                        p.leader_epoch,
                        p.replicas,
                        p.isr,
                    )
                    for p in t.partitions
                ),
            )
            for t in shown
        )
        resp = m.MetadataResponse(
            host=view.host,
            port=view.port,
            cores=view.cores,
            steering=view.steering,
            topics=topics,
            core_ports=view.core_ports,
            node_id=view.node_id,
            clustered=view.clustered,
            nodes=tuple(
                m.NodeMetadata(n.node_id, n.host, n.port, n.cores, n.core_ports, n.rack, n.live)
                for n in view.nodes
            ),
        )
        return self._reply(frame, resp)

    def _create_topic(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.CreateTopicRequest)
        if req.replication not in (-1, 1) and not self.cluster.clustered:
            return self._error(
                frame,
                m.ErrorCode.INVALID_CONFIG,
                f"one node keeps one copy: replication {req.replication} needs a cluster",
            )
        settings = self.config.cluster
        if settings is not None:
            calls = settings.calls
            registry = self.registry
            args = (req.name, req.partitions, req.retention_ms, req.retention_bytes, req.segment_bytes)

            def create() -> Topic:
                return calls.create_topic(registry, *args, replication=req.replication)

            return self.in_cluster(
                create, lambda t: self._reply(frame, m.CreateTopicResponse(topic_id=t.topic_id)), frame
            )
        topic = self.create_topic(
            req.name, req.partitions, req.retention_ms, req.retention_bytes, req.segment_bytes
        )
        return self._reply(frame, m.CreateTopicResponse(topic_id=topic.topic_id))

    def in_cluster(
        self,
        call: Callable[[], Any],
        answer: Callable[[Any], Reply],
        frame: Frame | None = None,
        until: Callable[[Any], bool] | None = None,
    ) -> Outcome:
        """Run `call` (a write to the cluster's store) off the loop, then answer with its result;
        an error answers as the handlers map it (`frame`), or is passed to `answer`. `until`:
        first wait (up to `MIRROR_WAIT_S`) until this core's registry shows the change: the agent
        copies it into topics.json within milliseconds, and the client's next request here must
        see the topic it just created."""

        def start(reply: Callable[[Reply | Silent], None]) -> None:
            def done(result: object) -> None:
                if isinstance(result, BaseException):
                    reply(self.error_reply(frame, result) if frame is not None else answer(result))
                    return
                deadline = time.monotonic() + MIRROR_WAIT_S

                def mirrored() -> None:
                    self.refresh_topics(force=True)
                    if until is None or until(result) or time.monotonic() > deadline:
                        reply(answer(result))
                    else:
                        self.call_later(MIRROR_POLL_S, mirrored)

                mirrored()

            self.run_blocking(call, done)

        return Later(start)

    def has_topic(self, topic: Topic) -> bool:
        current = self.registry.by_name.get(topic.name)
        return current is not None and current.topic_id == topic.topic_id

    def create_topic(
        self, name: str, partitions: int, retention_ms: int, retention_bytes: int, segment_bytes: int
    ) -> Topic:
        """Create a topic (both protocols' CreateTopic(s)); raises `TopicError` or what refuses it
        (a full disk). The limits are as the registry reads them (-2: the broker's default)."""
        self.space.check_writable()
        with self.registry.locked():  # reload, change, save: other cores change it too
            self.registry.load()
            topic = self.registry.create(name, partitions, retention_ms, retention_bytes, segment_bytes)
        self._sync_partitions()
        # No partition is made here: each is made on its first use (module rules), so this
        # answer costs one registry write whatever the partition count.
        log.info("created topic %s (id %d, %d partitions)", topic.name, topic.topic_id, topic.partitions)
        return topic

    def _delete_topic(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.DeleteTopicRequest)
        settings = self.config.cluster
        if settings is not None:
            calls = settings.calls
            return self.in_cluster(
                lambda: calls.delete_topic(req.name),
                lambda _t: self._reply(frame, m.DeleteTopicResponse()),
                frame,
            )
        return self.delete_topic(req.name, lambda: self._reply(frame, m.DeleteTopicResponse()), frame)

    def delete_topic(self, name: str, answer: Callable[[], Reply], notice: Frame | None = None) -> Outcome:
        """Delete a topic (both protocols' DeleteTopic(s)): out of the registry now; every other
        core is told (a DeleteTopic frame of ours, `notice`, made here if not given) and closes
        its partitions of it; then the files go and `answer()` is sent. Raises `TopicError`."""
        with self.registry.locked():
            self.registry.load()
            topic = self.registry.delete(name)
        self._sync_partitions()  # closes this core's partitions of it, and catches up on the rest

        def finish() -> Reply:
            self.registry.remove_files(topic)
            log.info("deleted topic %s (id %d)", topic.name, topic.topic_id)
            return answer()

        peers = tuple(c for c in range(self.config.cores) if c != self.config.core_id)
        if not peers:
            return finish()
        if notice is None:
            notice = m.request_frame(m.DeleteTopicRequest(name=name))
        return Notify(notice, peers, finish)

    def _topic_deleted_elsewhere(self, frame: Frame) -> Outcome:
        """Another core deleted a topic: close our partitions of it before it answers its client."""
        self.refresh_topics(force=True)
        return self._reply(frame, m.DeleteTopicResponse())

    # ------------------------------------------------------------------------- produce

    def _produce(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.ProduceRequest)
        if req.acks not in (m.Acks.NONE, m.Acks.WRITTEN, m.Acks.DURABLE, m.Acks.ALL):
            raise ValueError(f"acks must be 0, 1, 2 or -1, not {req.acks}")
        p = self._partition(frame)
        acks = req.acks
        if p.replica is not None and acks == m.Acks.DURABLE:
            acks = m.Acks.ALL  # a replicated partition's durability is its in-sync copies (CLUSTER.md)
        if acks == m.Acks.ALL and p.replica is not None:
            p.check_replicas()
        try:
            produced = p.produce(req.records, self.space)
        except OutOfSpaceError:
            if req.acks == m.Acks.NONE:
                return Silent()  # acks=0 gets no answer, not even this one (docs/PROTOCOL.md)
            raise
        if isinstance(produced, Stored):
            # A retry of batches already stored, which the log stands behind: answer with their
            # offsets; a durable retry waits for a flush covering the original, a replicated
            # acks=all retry for the high watermark to pass it.
            if req.acks == m.Acks.NONE:
                return Silent()
            reply = self._produced(frame, produced)
            return self.stored_reply(p, acks, produced, reply, lambda exc: self.error_reply(frame, exc))

        def answer() -> Reply | Silent:
            if req.acks == m.Acks.NONE:
                return Silent()
            return self._produced(frame, produced.stored())

        def fail(exc: BaseException) -> Reply | Silent:
            produced.fail()
            if is_out_of_space(exc):
                self.space.saw_full(exc)
            if req.acks == m.Acks.NONE:
                return Silent()
            return self.error_reply(frame, exc)

        return Append(p, produced.pending, acks, produced.complete, answer, fail)

    @staticmethod
    def stored_reply(
        p: Partition, acks: int, stored: Stored, reply: Reply, fail: Callable[[BaseException], Reply]
    ) -> Outcome:
        """The answer to a retry of stored batches: at once, after a flush (acks=durable, or
        acks=all unreplicated) or once the high watermark passes them (acks=all replicated)."""
        if acks == m.Acks.ALL and p.replica is not None:
            if stored.end_offset <= p.high_watermark:
                return reply

            def start(answer: Callable[[Reply | Silent], None]) -> None:
                p.after_replicated(stored.end_offset, lambda: answer(reply), lambda exc: answer(fail(exc)))

            return Later(start)
        if acks in (m.Acks.DURABLE, m.Acks.ALL) and not stored.durable:
            return Durable(p, reply, fail)
        return reply

    def _produced(self, frame: Frame, stored: Stored) -> Reply:
        return Reply(
            m.encode_produced(
                frame.correlation_id,
                frame.topic_id,
                frame.partition,
                stored.base_offset,
                stored.end_offset,
                stored.log_start_offset,
            )
        )

    # ------------------------------------------------------------------------- fetch

    def _fetch(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.FetchRequest)
        if req.max_bytes <= 0 or req.max_wait_ms < 0:
            raise ValueError(
                f"max_bytes must be > 0 and max_wait_ms >= 0 ({req.max_bytes}, {req.max_wait_ms})"
            )
        p = self._partition(frame)
        read = p.read(req.offset, min(req.max_bytes, FETCH_MAX_BYTES_MAX))

        def answer(found: ReadAnswer) -> Reply:
            records, high_watermark, log_start_offset = found
            resp = m.FetchResponse(
                high_watermark=high_watermark, log_start_offset=log_start_offset, records=records
            )
            return self._reply(frame, resp)

        if read.extent is not None:
            return Read(read.extent, lambda data: answer(read.finish(data)))
        if req.max_wait_ms == 0:
            return answer(read.nothing())
        deadline = now_ms() + min(req.max_wait_ms, FETCH_WAIT_MS_MAX)
        return Wait((p,), frame, deadline, lambda: answer(read.nothing()))

    def _list_offsets(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.ListOffsetsRequest)
        offset = self._partition(frame).list_offset(req.spec)
        return self._reply(frame, m.ListOffsetsResponse(offset=offset))

    # ------------------------------------------------------------------------- replication

    def _replica_fetch(self, req: m.Request, frame: Frame) -> Outcome:
        """A follower's fetch of every partition it follows on this core. Per partition: a
        diverging epoch (KIP-320) instead of records; else its log end (the fetch offset) is
        taken, which may advance the HW (answering acks=all produces), and the batches from it
        are read (up to the log end: a follower reads past the HW). Waits like Fetch when
        nothing is there, on all its partitions."""
        assert isinstance(req, m.ReplicaFetchRequest)
        if req.max_bytes <= 0 or req.max_wait_ms < 0:
            raise ValueError(
                f"max_bytes must be > 0 and max_wait_ms >= 0 ({req.max_bytes}, {req.max_wait_ms})"
            )
        now = now_ms()
        results: list[m.ReplicaFetchPartitionData] = []
        parts: list[Outcome] = []
        ours: list[Partition] = []
        budget = min(req.max_bytes, FETCH_MAX_BYTES_MAX)
        readable = 0
        for i, fp in enumerate(req.partitions):
            tid, index = fp.topic_id, fp.partition
            try:
                p = self.partition_by_id(tid, index)
                read = p.read_for_follower(
                    req.replica_node,
                    fp.fetch_offset,
                    fp.last_fetched_epoch,
                    fp.current_leader_epoch,
                    max(budget - readable, 1),
                    now,
                )
            except OffsetOutOfRangeError as exc:  # where the follower may start over, if below
                log.info("replica fetch of %d/%d by node %d: %s", tid, index, req.replica_node, exc)
                results.append(
                    m.ReplicaFetchPartitionData(
                        tid, index, m.ErrorCode.OFFSET_OUT_OF_RANGE, p.high_watermark, p.log_start_offset
                    )
                )
                continue
            except Exception as exc:
                results.append(m.ReplicaFetchPartitionData(tid, index, error_of(exc)[0]))
                continue
            if isinstance(read, Diverging):
                results.append(
                    m.ReplicaFetchPartitionData(
                        tid, index, m.ErrorCode.NONE, p.high_watermark, p.log_start_offset, *read
                    )
                )
                continue
            # the high watermark is the one at the answer: this fetch may move it
            results.append(m.ReplicaFetchPartitionData(tid, index, m.ErrorCode.NONE, -1, p.log_start_offset))
            ours.append(p)
            if read.extent is not None:
                readable += read.extent.length
                parts.append(self._replica_read(read, results, i))

        def answer() -> Reply:
            final = tuple(
                r
                if r.error != m.ErrorCode.NONE or r.high_watermark != -1
                else m.ReplicaFetchPartitionData(
                    r.topic_id,
                    r.partition,
                    r.error,
                    self._hw_of(r.topic_id, r.partition),
                    r.log_start_offset,
                    r.diverging_epoch,
                    r.diverging_end_offset,
                    r.records,
                )
                for r in results
            )
            return self._reply(frame, m.ReplicaFetchResponse(partitions=final))

        enough = readable >= max(1, req.min_bytes) or req.min_bytes <= 0
        if not enough and ours and len(results) == len(ours) and req.max_wait_ms > 0:
            deadline = now + min(req.max_wait_ms, FETCH_WAIT_MS_MAX)
            if not parts:
                return Wait(tuple(ours), frame, deadline, answer)
        if not parts:
            return answer()
        return Gather(parts, answer)

    def _hw_of(self, topic_id: int, index: int) -> int:
        p = self.partitions.get((topic_id, index))
        return -1 if p is None else p.high_watermark

    @staticmethod
    def _replica_read(read: PendingRead, results: list[m.ReplicaFetchPartitionData], i: int) -> Read:
        assert read.extent is not None

        def finish(data: bytes) -> Reply:
            found = read.finish(data)
            r = results[i]
            results[i] = m.ReplicaFetchPartitionData(
                r.topic_id, r.partition, r.error, -1, found.log_start_offset, records=found.records
            )
            return Reply([])

        def fail(exc: BaseException) -> Reply:
            r = results[i]
            results[i] = m.ReplicaFetchPartitionData(r.topic_id, r.partition, error_of(exc)[0])
            return Reply([])

        return Read(read.extent, finish, fail)

    def partition_by_id(self, topic_id: int, index: int) -> Partition:
        """Partition `index` of topic id `topic_id` when this core owns it (opened, made if new):
        what ReplicaFetch names, and what the cluster agent gives roles to (`become_leader`,
        `become_follower`). `NotLeaderError` for another core's, `TopicError` for an unknown one."""
        p = self.partitions.get((topic_id, index))
        if p is not None:
            return p
        if self.owner(topic_id, index) != self.config.core_id:
            raise NotLeaderError(
                f"partition {index} of topic id {topic_id} is on core {self.owner(topic_id, index)}"
            )
        return self._partition(Frame(m.ApiKey.REPLICA_FETCH, 1, 0, 0, topic_id, index, b""))

    # ------------------------------------------------------------------------- groups

    def topic_of(self, topic_id: int, partition: int) -> Topic:
        """The topic of a partition this broker has (any core's), else `TopicError` "unknown"."""
        topic = self.registry.by_id.get(topic_id)
        if topic is None or not 0 <= partition < topic.partitions:
            self.refresh_topics(force=True)
            topic = self.registry.by_id.get(topic_id)
        if topic is None or not 0 <= partition < topic.partitions:
            raise TopicError("unknown", f"no partition {partition} of topic id {topic_id}")
        return topic

    def _offset_commit(self, req: m.Request, frame: Frame) -> Outcome:
        """A commit into the coordinator's store: a member's with its generation, or one outside
        membership (generation -1), which is refused while the group has members. The offset is
        not compared with the partition's log (Kafka's coordinator stores any offset: one past
        the high watermark is what librdkafka's tests commit); a negative one is refused, this
        protocol's field being >= 0 (docs/PROTOCOL.md §4.10)."""
        assert isinstance(req, m.OffsetCommitRequest)
        check_group(req.group)
        self.topic_of(frame.topic_id, frame.partition)
        if req.offset < 0:
            raise ValueError(f"cannot commit negative offset {req.offset}")
        if len(req.metadata) > OFFSET_METADATA_MAX:
            return self._error(
                frame,
                m.ErrorCode.LIMIT_EXCEEDED,
                f"offset metadata of {len(req.metadata)} characters: at most {OFFSET_METADATA_MAX}",
            )
        self.space.check_writable()
        key = (frame.topic_id, frame.partition)

        def start(answer: Callable[[Reply | Silent], None]) -> None:
            # Kafka's coordinator stores any offset: it never compares one with the log's end
            # (docs/KAFKA.md, "Committed offsets")
            try:
                code = self.coordinator.commit_check(req.group, req.generation, req.member_id)
                if code != GroupCode.NONE:
                    answer(self._group_error(frame, req.group, code))
                    return
            except Exception as exc:  # an error answer, as in `handle`
                answer(self.error_reply(frame, exc))
                return
            offsets = {key: Committed(req.offset, req.metadata)}
            live = frozenset(self.registry.by_id).__contains__

            def stored(result: object) -> None:
                if isinstance(result, BaseException):  # the store's write failed
                    answer(self.error_reply(frame, result))
                else:
                    answer(self._reply(frame, m.OffsetCommitResponse()))

            self.offsets_run(lambda: self.coordinator.offsets.commit(req.group, offsets, live), stored)

        return Later(start)

    def _offset_fetch(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.OffsetFetchRequest)
        check_group(req.group)
        self.topic_of(frame.topic_id, frame.partition)
        store = self.coordinator.offsets

        def read() -> Committed:
            return store.committed(req.group, frame.topic_id, frame.partition)

        def reply(result: Committed | BaseException) -> Reply:
            if isinstance(result, BaseException):
                return self.error_reply(frame, result)
            return self._reply(frame, m.OffsetFetchResponse(offset=result.offset, metadata=result.metadata))

        return self.with_offsets(read, reply)

    def offsets_run(self, call: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
        """`done(call())` (or `done(exception)`) for a call on the group offsets' store: at once
        on the loop where the store answers from a file, on a `run_blocking` thread where it may
        wait on the network (`GroupOffsetStore.remote`: a cluster's etcd, which may be away)."""
        if self.coordinator.offsets.remote:
            self.run_blocking(call, done)
            return
        try:
            result: T | BaseException = call()
        except Exception as exc:
            result = exc
        done(result)

    def with_offsets(self, call: Callable[[], T], reply: Callable[[T | BaseException], Reply]) -> Outcome:
        """The outcome that answers `reply(call())` (`offsets_run`): the reply itself when the
        store answered at once, else a `Later`."""
        answered: list[Reply] = []
        if not self.coordinator.offsets.remote:
            self.offsets_run(call, lambda result: answered.append(reply(result)))
            return answered[0]
        return Later(lambda answer: self.offsets_run(call, lambda result: answer(reply(result))))

    def _group_error(self, frame: Frame, group: str, code: GroupCode) -> Reply:
        return self._error(frame, _GROUP_CODES[code], f"group {group!r}: {code.value}")

    def _join_group(self, req: m.Request, frame: Frame) -> Outcome:
        """Answered when the group's join phase ends (`Later`): members assigned by the broker
        in one step (our clients need no MEMBER_ID_REQUIRED round trip)."""
        assert isinstance(req, m.JoinGroupRequest)
        check_group(req.group)

        def start(answer: Callable[[Reply | Silent], None]) -> None:
            def done(result: JoinResult) -> None:
                if result.code != GroupCode.NONE:
                    answer(self._group_error(frame, req.group, result.code))
                    return
                members = tuple(m.GroupMember(member, meta) for member, _instance, meta in result.members)
                resp = m.JoinGroupResponse(
                    generation=result.generation,
                    protocol=result.protocol_name or "",
                    leader=result.leader,
                    member_id=result.member_id,
                    members=members,
                )
                answer(self._reply(frame, resp))

            self.coordinator.join(
                req.group,
                req.member_id,
                req.protocol_type,
                [(p.name, p.metadata) for p in req.protocols],
                req.session_timeout_ms,
                req.rebalance_timeout_ms,
                done,
                client_id="ringlog",
            )

        return Later(start)

    def _sync_group(self, req: m.Request, frame: Frame) -> Outcome:
        """Answered when the leader's assignment arrives (`Later`)."""
        assert isinstance(req, m.SyncGroupRequest)
        check_group(req.group)

        def start(answer: Callable[[Reply | Silent], None]) -> None:
            def done(result: SyncResult) -> None:
                if result.code != GroupCode.NONE:
                    answer(self._group_error(frame, req.group, result.code))
                else:
                    answer(self._reply(frame, m.SyncGroupResponse(assignment=result.assignment)))

            assignments = {a.member_id: a.assignment for a in req.assignments}
            self.coordinator.sync(req.group, req.generation, req.member_id, assignments, done)

        return Later(start)

    def _heartbeat(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.HeartbeatRequest)
        check_group(req.group)
        code = self.coordinator.heartbeat(req.group, req.generation, req.member_id)
        if code != GroupCode.NONE:
            return self._group_error(frame, req.group, code)
        return self._reply(frame, m.HeartbeatResponse())

    def _leave_group(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.LeaveGroupRequest)
        check_group(req.group)
        (code,) = self.coordinator.leave(req.group, [(req.member_id, None)])
        if code != GroupCode.NONE:
            return self._group_error(frame, req.group, code)
        return self._reply(frame, m.LeaveGroupResponse())

    # ------------------------------------------------------------------------- stats

    def _stats(self, req: m.Request, frame: Frame) -> Outcome:
        """Every core's published snapshot, this core's own taken now, and the supervisor's eBPF
        snapshot (steering and XDP counters, bpf/state.py): only the supervisor holds the
        programs, so a client without access to the data dir gets them here (PROTOCOL.md §4.12)."""
        own = self.metrics.snapshot(self.gauges)
        snaps = [
            s for s in read_snapshots(self.config.data_dir, self.config.cores) if s.get("core") != own["core"]
        ]
        snaps.append(own)
        snaps.sort(key=lambda s: int(s.get("core", 0)))  # type: ignore[call-overload]
        doc = {
            "answered_by": self.config.core_id,
            "cores": self.config.cores,
            "snapshots": snaps,
            "bpf": self.config.bpf_snapshot(),
        }
        return self._reply(frame, m.StatsResponse(core=self.config.core_id, stats_json=json.dumps(doc)))

    # ------------------------------------------------------------------------- housekeeping

    def apply_retention(self) -> int:
        deleted = 0
        for p in self.partitions.values():
            try:
                deleted += p.apply_retention()
            except StorageError as exc:
                log.error("retention on partition %d/%d: %s", p.topic_id, p.index, exc)
        return deleted


def _core_on(node: NodeView | None, topic_id: int, partition: int) -> int:
    """The core of `node` that holds the partition's replica there (-1: the node is not live)."""
    if node is None or not node.cores:
        return -1
    return owner(topic_id, partition, range(node.cores))


def _is_long_poll(frame: Frame) -> bool:
    """A fetch with max_wait_ms > 0: the owner may hold it (read before the frame is decoded)."""
    wait_ms = m.peek_fetch_max_wait_ms(frame)
    return wait_ms is not None and wait_ms > 0


def _is_silent_produce(frame: Frame) -> bool:
    """A produce with acks=0: the owner will send no answer."""
    return m.peek_produce_acks(frame) == m.Acks.NONE


def _wire_limit(value: int | None) -> int:
    return -2 if value is None else value
