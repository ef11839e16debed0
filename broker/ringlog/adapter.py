"""ringlog's own protocol: its frames in, calls on the protocol-neutral core, outcomes out.

Rules this module keeps:
- One `RinglogAdapter` per core, beside the Kafka adapter over the same `Core`
  (broker/core/core.py), made by the worker and handed to the backend (broker/core/adapter.py's
  interface, whose `InternalAdapter` it is: our protocol is also the one between cores); the first
  bytes of a connection pick which one serves it (`recognises`). `handle(frame)`
  returns an `Outcome` saying what to do, never doing the I/O itself: `Reply` (send these
  buffers), `Silent` (send nothing: acks=0), `Append` (run the log writes, then call `complete` or
  `fail`), `Read` (read this extent, then call `finish`), `Wait` (nothing to fetch yet: re-handle
  the frame when the partition grows or the deadline passes), `Forward` (the partition belongs to
  another core: send the frame there and relay its answer), `Notify` (tell other cores about a
  topic change, then answer). Both backends carry out the very same outcomes, so the handlers are
  testable with no server at all.
- Our protocol names one partition per request, in the frame header, so a request for another
  core's partition becomes `Forward` before its body is even decoded, except when it came from
  another core (`handle(frame, from_peer=True)`): then it is NOT_OWNER, so a forward can never
  loop. OffsetCommit, OffsetFetch and the group APIs go to the group's coordinator core instead
  (the group read from the body), whose store both protocols share.
- The SASL exchange and the ACL checks of our protocol are `access` (broker/ringlog/access.py),
  over the core's SASL server and ACLs, before a client frame reaches `handle`.
- Errors are the core's (`broker.core.errors.error_of`), answered in our codes. A request that
  fails gets an error response; only a frame that cannot be delimited closes its connection (the
  server's business). Responses leave in request order per connection; the backend guarantees
  it, not this module.
- Every action on a partition is one door of `Partition` (produce, read, read_for_follower,
  list_offset): the handler decodes the request and turns the answer, or the exception, into an
  outcome. It never drives the log or the producer state itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TypeVar

from broker import __version__
from broker.core.acks import check_acks
from broker.core.coordinator import GroupCode, JoinResult, SyncResult
from broker.core.core import Core
from broker.core.errors import error_of
from broker.core.groups import OFFSET_METADATA_MAX, Committed, check_group
from broker.core.limits import FETCH_MAX_BYTES_MAX, FETCH_WAIT_MS_MAX
from broker.core.metrics import read_snapshots
from broker.core.outcomes import Append, Forward, Gather, Later, Outcome, Read, Reply, Silent, Wait
from broker.core.partition import Diverging, Partition, PendingRead, ReadAnswer, Stored
from broker.core.read_budget import ReadBudget
from broker.core.topic_configs import ConfigChange, ConfigOp, ConfigSource, changing, replacing
from broker.core.topics import Topic
from broker.ringlog.access import Access
from broker.security.session import ConnectionAuth
from broker.storage.diskspace import is_out_of_space
from broker.storage.errors import OffsetOutOfRangeError, OutOfSpaceError
from ringlog_proto import messages as m
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import Buffer, Frame, FrameDecoder, frame_decoder, starts_like_frame

T = TypeVar("T")
log = logging.getLogger(__name__)

BROKER_VERSION = __version__
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
    # our protocol names no instance ids, so none of its requests is fenced; were one, its member
    # id would be one the group no longer has
    GroupCode.FENCED_INSTANCE_ID: m.ErrorCode.UNKNOWN_MEMBER_ID,
}


_SOURCES: dict[ConfigSource, m.ConfigSource] = {
    ConfigSource.TOPIC: m.ConfigSource.TOPIC,
    ConfigSource.STATIC_BROKER: m.ConfigSource.BROKER_FLAG,
    ConfigSource.DEFAULT: m.ConfigSource.DEFAULT,
}
_OPS: dict[m.ConfigOp, ConfigOp] = {
    m.ConfigOp.SET: ConfigOp.SET,
    m.ConfigOp.DELETE: ConfigOp.DELETE,
    m.ConfigOp.APPEND: ConfigOp.APPEND,
    m.ConfigOp.SUBTRACT: ConfigOp.SUBTRACT,
}


class RinglogAdapter:
    """ringlog's protocol on one core, over that core's `Core` (module rules)."""

    frame_name = "a ringlog frame"

    def __init__(self, core: Core) -> None:
        self.core = core
        self.config = core.config
        self.metrics = core.metrics
        self.count_request: Callable[[int, int], int] = core.metrics.request
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
            m.ApiKey.DESCRIBE_CONFIGS: self._describe_configs,
            m.ApiKey.ALTER_CONFIGS: self._alter_configs,
            # SASL belongs to a connection: the backend hands these to `access` (which knows the
            # connection's state) before they could get here; what does is from another core.
            m.ApiKey.SASL_HANDSHAKE: self._sasl_elsewhere,
            m.ApiKey.SASL_AUTHENTICATE: self._sasl_elsewhere,
        }
        # Authentication and ACLs of our protocol, over the core's SASL server and ACLs.
        self.access = Access(self)

    # ------------------------------------------------------------------------- what a backend asks

    @staticmethod
    def recognises(first: Buffer) -> bool | None:
        """Whether a connection's first bytes begin one of our frames (the magic after the length)."""
        return starts_like_frame(first)

    @staticmethod
    def decoder(max_frame_bytes: int, auth: ConnectionAuth) -> FrameDecoder:
        """A connection's decoder: native/frames.c's when it is built (the io_uring backend
        receives straight into its space)."""
        return frame_decoder(max_frame_bytes)

    @staticmethod
    def reply_reserve(frame: Frame) -> int:
        """A fetch's reply may carry its max_bytes (at most the broker's cap): held from the start."""
        if frame.api_key == m.ApiKey.FETCH:
            max_bytes = m.peek_fetch_max_bytes(frame)
            if max_bytes is not None and max_bytes > 0:
                return min(max_bytes, FETCH_MAX_BYTES_MAX)
        return 0

    def handle(self, frame: Frame, auth: ConnectionAuth | None = None, from_peer: bool = False) -> Outcome:
        """The outcome of one request frame: the adapter interface both protocols give the
        backends (`KafkaAdapter.handle(request, auth)` is the other). `auth`: the client
        connection's authentication state, whose frames pass our SASL and ACL gate first
        (`access`; None: no gate, for tests and re-handled waits). `from_peer`: it arrived over
        the inter-core channel (forwarded by, or a notice from, another core of this broker),
        trusted, never gated."""
        if auth is not None and not from_peer and self.access.active:
            decided = self.access.take(frame, auth)
            if decided is not None:
                return decided
        reason = m.unsupported(frame)
        if reason is not None:
            return self._error(frame, m.ErrorCode.UNSUPPORTED_VERSION, reason)
        if frame.api_key in PARTITION_APIS and self.config.cores > 1:
            core = self.core.owner(frame.topic_id, frame.partition)
            if core != self.config.core_id:
                if from_peer:
                    return self._error(
                        frame, m.ErrorCode.NOT_OWNER, f"core {self.config.core_id} does not own it"
                    )
                return Forward(core, frame, _is_long_poll(frame), not _is_silent_produce(frame))
        if frame.api_key in GROUP_APIS and (self.config.cores > 1 or self.core.cluster.clustered):
            try:
                group = m.decode_request(frame).group  # type: ignore[attr-defined]
            except Exception as exc:  # a body that does not parse: answered by the dispatch below
                group = None
                log.debug("group request that does not decode: %s", exc)
            if group:
                node, core = self.core.group_coordinator(group)
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
                self.core.space.saw_full(exc)  # a write failed with ENOSPC (a roll, a commit, a create)
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

    def _api_versions(self, req: m.Request, frame: Frame) -> Outcome:
        apis = tuple(m.ApiVersion(k, lo, hi) for k, (lo, hi) in sorted(m.SUPPORTED_VERSIONS.items()))
        resp = m.ApiVersionsResponse(
            broker_version=BROKER_VERSION, node_id=self.config.node_id, cores=self.config.cores, apis=apis
        )
        return self._reply(frame, resp)

    def _sasl_elsewhere(self, req: m.Request, frame: Frame) -> Outcome:
        return self._error(frame, m.ErrorCode.ILLEGAL_SASL_STATE, "SASL is not spoken between cores")

    def _metadata(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.MetadataRequest)
        return self.metadata_reply(req, frame)

    def metadata_reply(
        self, req: m.MetadataRequest, frame: Frame, may_describe: Callable[[str], bool] | None = None
    ) -> Reply:
        """The Metadata answer. With `may_describe` (ACLs on: broker/ringlog/access.py) a topic the
        principal may not describe is left out of a listing of every topic, and answered
        TOPIC_AUTHORIZATION_FAILED, without its id or settings, when named: whether it exists is
        not told either (Kafka's rule)."""
        view = self.core.metadata_view(req.topics or None)
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
        if req.assignment:
            refusal = self._assignment_refusal(req)
            if refusal is not None:
                return self._error(frame, m.ErrorCode.INVALID_REQUEST, refusal)
        elif req.replication not in (-1, 1) and not self.core.cluster.clustered:
            return self._error(
                frame,
                m.ErrorCode.INVALID_CONFIG,
                f"one node keeps one copy: replication {req.replication} needs a cluster",
            )
        configs = {
            **limit_configs(req.retention_ms, req.retention_bytes, req.segment_bytes),
            **dict(req.configs),
        }
        settings = self.config.cluster
        if settings is not None:
            calls = settings.calls
            registry = self.core.registry

            def create() -> Topic:
                return calls.create_topic(
                    registry,
                    req.name,
                    req.partitions,
                    configs,
                    replication=req.replication,
                    assignment=req.assignment or None,
                )

            return self.core.in_cluster(
                create,
                lambda t: self._reply(frame, m.CreateTopicResponse(topic_id=t.topic_id)),
                lambda exc: self.error_reply(frame, exc),
            )
        topic = self.core.create_topic(req.name, req.partitions, configs)
        return self._reply(frame, m.CreateTopicResponse(topic_id=topic.topic_id))

    def _assignment_refusal(self, req: m.CreateTopicRequest) -> str | None:
        """Why replicas placed by hand cannot be taken as they come (None: they can; a cluster's
        store checks the nodes): one list per partition, as many replicas in each as
        `replication` says (-1: any), and on a single node this node alone in each."""
        counts = {len(replicas) for replicas in req.assignment}
        if len(req.assignment) != req.partitions:
            return f"the assignment places {len(req.assignment)} partition(s), not {req.partitions}"
        if req.replication != -1 and counts != {req.replication}:
            return f"the assignment's replica counts {sorted(counts)} are not replication {req.replication}"
        me = self.config.node_id
        if not self.core.cluster.clustered and any(tuple(r) != (me,) for r in req.assignment):
            return f"a single node (node {me}) keeps the one copy of each partition: assign [{me}] only"
        return None

    def _describe_configs(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.DescribeConfigsRequest)
        entries = self.core.topic_config_entries(req.topic, req.keys or None)
        configs = tuple(
            m.ConfigDescription(e.name, e.value or "", _SOURCES[e.source], e.doc) for e in entries
        )
        return self._reply(frame, m.DescribeConfigsResponse(configs=configs))

    def _alter_configs(self, req: m.Request, frame: Frame) -> Outcome:
        """A topic's configs altered: the same alterations as Kafka's AlterConfigs (replacing)
        and IncrementalAlterConfigs (changing), stored as the core stores them."""
        assert isinstance(req, m.AlterConfigsRequest)
        if req.incremental:
            alteration = changing(ConfigChange(c.name, _OPS[c.op], c.value) for c in req.changes)
        else:
            alteration = replacing({c.name: c.value for c in req.changes})
        settings = self.config.cluster
        if settings is None or req.validate_only:
            self.core.alter_topic_configs(req.topic, alteration, req.validate_only)
            return self._reply(frame, m.AlterConfigsResponse())
        calls, registry = settings.calls, self.core.registry
        self.core.refresh_topics()
        registry.altered(req.topic, alteration)  # refused here, before the store is asked
        stored: list[Topic] = []

        def alter() -> Topic:
            stored.append(calls.alter_topic_configs(registry, req.topic, alteration))
            return stored[0]

        def mirrored(topic: Topic) -> bool:
            current = registry.by_name.get(topic.name)
            return current is not None and current.configs == topic.configs

        return self.core.in_cluster(
            alter,
            lambda _t: self._reply(frame, m.AlterConfigsResponse()),
            lambda exc: self.error_reply(frame, exc),
            until=mirrored,
        )

    def _delete_topic(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.DeleteTopicRequest)
        settings = self.config.cluster
        if settings is not None:
            calls = settings.calls
            return self.core.in_cluster(
                lambda: calls.delete_topic(req.name),
                lambda _t: self._reply(frame, m.DeleteTopicResponse()),
                lambda exc: self.error_reply(frame, exc),
            )
        return self.core.delete_topic(req.name, lambda: self._reply(frame, m.DeleteTopicResponse()), frame)

    def _topic_deleted_elsewhere(self, frame: Frame) -> Outcome:
        """Another core deleted a topic: close our partitions of it before it answers its client."""
        self.core.refresh_topics(force=True)
        return self._reply(frame, m.DeleteTopicResponse())

    def _produce(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.ProduceRequest)
        check_acks(req.acks)  # before the lookup: a bad acks is INVALID_REQUEST whatever the partition
        p = self.core.partition(frame.topic_id, frame.partition)
        try:
            produced = p.produce(req.records, self.core.space, req.acks)
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
            return self.core.stored_reply(p, produced, reply, lambda exc: self.error_reply(frame, exc))

        def answer() -> Reply | Silent:
            if req.acks == m.Acks.NONE:
                return Silent()
            return self._produced(frame, produced.stored())

        def fail(exc: BaseException) -> Reply | Silent:
            produced.fail()
            if is_out_of_space(exc):
                self.core.space.saw_full(exc)
            if req.acks == m.Acks.NONE:
                return Silent()
            return self.error_reply(frame, exc)

        return Append(p, produced.pending, produced.waits, produced.complete, answer, fail)

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

    def _fetch(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.FetchRequest)
        if req.max_bytes <= 0 or req.max_wait_ms < 0:
            raise ValueError(
                f"max_bytes must be > 0 and max_wait_ms >= 0 ({req.max_bytes}, {req.max_wait_ms})"
            )
        p = self.core.partition(frame.topic_id, frame.partition)
        read = p.read(req.offset, min(req.max_bytes, FETCH_MAX_BYTES_MAX))

        def answer(found: ReadAnswer) -> Reply:
            resp = m.FetchResponse(
                high_watermark=found.high_watermark,
                log_start_offset=found.log_start_offset,
                records=found.records,
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
        offset = self.core.partition(frame.topic_id, frame.partition).list_offset(req.spec)
        return self._reply(frame, m.ListOffsetsResponse(offset=offset))

    def _replica_fetch(self, req: m.Request, frame: Frame) -> Outcome:
        """A follower's fetch of every partition it follows on this core. Per partition: a
        diverging epoch (KIP-320) instead of records; else its log end (the fetch offset) is
        taken, which may advance the HW (answering acks=all produces), and the batches from it
        are read (up to the log end: a follower reads past the HW), within the request's
        max_bytes as Kafka's follower fetch is (broker/core/read_budget.py: the first batch of the
        first partition with records whole, then what fits). Waits like Fetch when nothing is
        there, on all its partitions."""
        assert isinstance(req, m.ReplicaFetchRequest)
        if req.max_bytes <= 0 or req.max_wait_ms < 0:
            raise ValueError(
                f"max_bytes must be > 0 and max_wait_ms >= 0 ({req.max_bytes}, {req.max_wait_ms})"
            )
        now = now_ms()
        results: list[m.ReplicaFetchPartitionData] = []
        parts: list[Outcome] = []
        ours: list[Partition] = []
        budget = ReadBudget(min(req.max_bytes, FETCH_MAX_BYTES_MAX))
        readable = 0
        for i, fp in enumerate(req.partitions):
            tid, index = fp.topic_id, fp.partition
            try:
                p = self.core.partition_by_id(tid, index)
                limit = budget.limit(FETCH_MAX_BYTES_MAX)
                read = p.read_for_follower(
                    req.replica_node,
                    fp.fetch_offset,
                    fp.last_fetched_epoch,
                    fp.current_leader_epoch,
                    limit,
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
            read = budget.take(read, limit)
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

        enough = budget.full or readable >= max(1, req.min_bytes) or req.min_bytes <= 0
        if not enough and ours and len(results) == len(ours) and req.max_wait_ms > 0:
            deadline = now + min(req.max_wait_ms, FETCH_WAIT_MS_MAX)
            if not parts:
                return Wait(tuple(ours), frame, deadline, answer)
        if not parts:
            return answer()
        return Gather(parts, answer)

    def _hw_of(self, topic_id: int, index: int) -> int:
        p = self.core.partitions.get((topic_id, index))
        return -1 if p is None else p.high_watermark

    @staticmethod
    def _replica_read(read: PendingRead, results: list[m.ReplicaFetchPartitionData], i: int) -> Read:
        assert read.extent is not None

        def finish(data: Buffer) -> Reply:
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

    def _offset_commit(self, req: m.Request, frame: Frame) -> Outcome:
        """A commit into the coordinator's store: a member's with its generation, or one outside
        membership (generation -1), which is refused while the group has members. The offset is
        not compared with the partition's log (Kafka's coordinator stores any offset: one past
        the high watermark is what librdkafka's tests commit); a negative one is refused, this
        protocol's field being >= 0 (docs/PROTOCOL.md §4.10)."""
        assert isinstance(req, m.OffsetCommitRequest)
        check_group(req.group)
        self.core.topic_of(frame.topic_id, frame.partition)
        if req.offset < 0:
            raise ValueError(f"cannot commit negative offset {req.offset}")
        if len(req.metadata) > OFFSET_METADATA_MAX:
            return self._error(
                frame,
                m.ErrorCode.LIMIT_EXCEEDED,
                f"offset metadata of {len(req.metadata)} characters: at most {OFFSET_METADATA_MAX}",
            )
        self.core.space.check_writable()
        key = (frame.topic_id, frame.partition)

        def start(answer: Callable[[Reply | Silent], None]) -> None:
            # Kafka's coordinator stores any offset: it never compares one with the log's end
            # (docs/KAFKA.md, "Committed offsets")
            try:
                code = self.core.coordinator.commit_check(req.group, req.generation, req.member_id)
                if code != GroupCode.NONE:
                    answer(self._group_error(frame, req.group, code))
                    return
            except Exception as exc:  # an error answer, as in `handle`
                answer(self.error_reply(frame, exc))
                return
            offsets = {key: Committed(req.offset, req.metadata)}
            live = frozenset(self.core.registry.by_id).__contains__

            def stored(result: object) -> None:
                if isinstance(result, BaseException):  # the store's write failed
                    answer(self.error_reply(frame, result))
                else:
                    self.core.coordinator.offsets_exist(req.group)  # stays, Empty, when its members leave
                    answer(self._reply(frame, m.OffsetCommitResponse()))

            offsets_store = self.core.coordinator.offsets
            self.core.offsets_run(lambda: offsets_store.commit(req.group, offsets, live), stored)

        return Later(start)

    def _offset_fetch(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.OffsetFetchRequest)
        check_group(req.group)
        self.core.topic_of(frame.topic_id, frame.partition)
        store = self.core.coordinator.offsets

        def read() -> Committed:
            return store.committed(req.group, frame.topic_id, frame.partition)

        def reply(result: Committed | BaseException) -> Reply:
            if isinstance(result, BaseException):
                return self.error_reply(frame, result)
            return self._reply(frame, m.OffsetFetchResponse(offset=result.offset, metadata=result.metadata))

        return self.core.with_offsets(read, reply)

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

            self.core.coordinator.join(
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
            self.core.coordinator.sync(req.group, req.generation, req.member_id, assignments, done)

        return Later(start)

    def _heartbeat(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.HeartbeatRequest)
        check_group(req.group)
        code = self.core.coordinator.heartbeat(req.group, req.generation, req.member_id)
        if code != GroupCode.NONE:
            return self._group_error(frame, req.group, code)
        return self._reply(frame, m.HeartbeatResponse())

    def _leave_group(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.LeaveGroupRequest)
        check_group(req.group)
        (code,) = self.core.coordinator.leave(req.group, [(req.member_id, None)])
        if code != GroupCode.NONE:
            return self._group_error(frame, req.group, code)
        return self._reply(frame, m.LeaveGroupResponse())

    def _stats(self, req: m.Request, frame: Frame) -> Outcome:
        """Every core's published snapshot, this core's own taken now, and the supervisor's eBPF
        snapshot (steering and XDP counters, bpf/state.py): only the supervisor holds the
        programs, so a client without access to the data dir gets them here (PROTOCOL.md §4.12)."""
        own = self.metrics.snapshot(self.core.gauges)
        snaps = [
            s for s in read_snapshots(self.config.data_dir, self.config.cores) if s.get("core") != own["core"]
        ]
        snaps.append(own)
        snaps.sort(key=lambda s: int(s.get("core", 0)))
        doc = {
            "answered_by": self.config.core_id,
            "cores": self.config.cores,
            "snapshots": snaps,
            "bpf": self.config.bpf_snapshot(),
        }
        return self._reply(frame, m.StatsResponse(core=self.config.core_id, stats_json=json.dumps(doc)))


def _is_long_poll(frame: Frame) -> bool:
    """A fetch with max_wait_ms > 0: the owner may hold it (read before the frame is decoded)."""
    wait_ms = m.peek_fetch_max_wait_ms(frame)
    return wait_ms is not None and wait_ms > 0


def _is_silent_produce(frame: Frame) -> bool:
    """A produce with acks=0: the owner will send no answer."""
    return m.peek_produce_acks(frame) == m.Acks.NONE


def limit_configs(retention_ms: int, retention_bytes: int, segment_bytes: int) -> dict[str, str]:
    """The topic configs a CreateTopic's limits stand for: -1 the broker's default (no override),
    -2 keep forever (Kafka's -1), else the value (checked with the other configs)."""
    configs = {}
    for name, value in (
        ("retention.ms", retention_ms),
        ("retention.bytes", retention_bytes),
        ("segment.bytes", segment_bytes),
    ):
        if value != -1:
            configs[name] = "-1" if value == -2 and name != "segment.bytes" else str(value)
    return configs
