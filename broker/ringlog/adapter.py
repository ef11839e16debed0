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
- Each API group lives in a module of its own, as functions of `(ctx, request, frame)`
  (broker/ringlog/context.py), registered in `_dispatch`: records.py (Produce, Fetch,
  ListOffsets), replica_fetch.py, topics.py (Metadata, Create/DeleteTopic, Describe/AlterConfigs),
  groups.py (OffsetCommit/OffsetFetch, Join/Sync/Heartbeat/LeaveGroup) and transactions.py
  (a transactional producer's APIs; WriteTxnMarkers, between cores only), as the Kafka
  adapter's are (broker/kafka/adapter.py); ApiVersions and Stats are here. A new API is a module
  and a line here.
- Our protocol names one partition per request, in the frame header, so a request for another
  core's partition becomes `Forward` before its body is even decoded, except when it came from
  another core (`handle(frame, from_peer=True)`): then it is NOT_OWNER, so a forward can never
  loop. OffsetCommit, OffsetFetch and the group APIs go to the group's coordinator core instead
  (the group read from the body), whose store both protocols share; TxnOffsetCommit too. The
  other transaction APIs go to the core coordinating their transactional id
  (`Core.transactions.coordinator_of`).
- The SASL exchange and the ACL checks of our protocol are `access` (broker/ringlog/access.py),
  over the core's SASL server and ACLs, before a client frame reaches `handle`.
- Errors are the core's (`broker.core.errors.error_of`), answered in our codes. A request that
  fails gets an error response; only a frame that cannot be delimited closes its connection (the
  server's business). Responses leave in request order per connection; the backend guarantees
  it, not this module.
- Every action on a partition is one door of `Partition` (produce, read, read_for_follower,
  list_offset): `handle` decodes the request, and the API's function turns the answer, or the
  exception, into an outcome. It never drives the log or the producer state itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from broker import __version__
from broker.core.core import Core
from broker.core.limits import FETCH_MAX_BYTES_MAX
from broker.core.metrics import read_snapshots
from broker.core.outcomes import Forward, Outcome, Reply, Silent
from broker.ringlog import groups, records, replica_fetch, topics, transactions
from broker.ringlog.access import Access
from broker.ringlog.context import Context
from broker.security.session import ConnectionAuth
from ringlog_proto import messages as m
from ringlog_proto.frames import Buffer, Frame, FrameDecoder, frame_decoder, starts_like_frame

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
        m.ApiKey.TXN_OFFSET_COMMIT,
    }
)
# to the core coordinating the transactional id; answered once the coordinator's write is durable
# (EndTxn after its markers too), so forwarded as long polls
TXN_APIS = frozenset(
    {
        m.ApiKey.INIT_PRODUCER_ID,
        m.ApiKey.ADD_PARTITIONS_TO_TXN,
        m.ApiKey.ADD_OFFSETS_TO_TXN,
        m.ApiKey.END_TXN,
    }
)
# answers that wait at the coordinator for the rest of the group: forwarded as long polls
_WAITING_GROUP_APIS = frozenset({m.ApiKey.JOIN_GROUP, m.ApiKey.SYNC_GROUP})
# the transaction APIs cores send one another (broker/ringlog/transactions.py); a client's: refused
_BETWEEN_CORES = frozenset({m.ApiKey.WRITE_TXN_MARKERS, m.ApiKey.FIND_HELD_TXNS})


class RinglogAdapter:
    """ringlog's protocol on one core, over that core's `Core` (module rules)."""

    frame_name = "a ringlog frame"

    def __init__(self, core: Core) -> None:
        self.core = core
        self.config = core.config
        self.metrics = core.metrics
        self.count_request: Callable[[int, int], int] = core.metrics.request
        self.ctx = Context(core)
        # api key -> its handler, a function of (ctx, request, frame) in the API group's module
        self._dispatch: dict[int, Callable[[Context, m.Request, Frame], Outcome]] = {
            m.ApiKey.API_VERSIONS: _api_versions,
            m.ApiKey.METADATA: topics.metadata,
            m.ApiKey.CREATE_TOPIC: topics.create_topic,
            m.ApiKey.DELETE_TOPIC: topics.delete_topic,
            m.ApiKey.PRODUCE: records.produce,
            m.ApiKey.FETCH: records.fetch,
            m.ApiKey.LIST_OFFSETS: records.list_offsets,
            m.ApiKey.OFFSET_COMMIT: groups.offset_commit,
            m.ApiKey.OFFSET_FETCH: groups.offset_fetch,
            m.ApiKey.STATS: _stats,
            m.ApiKey.JOIN_GROUP: groups.join_group,
            m.ApiKey.SYNC_GROUP: groups.sync_group,
            m.ApiKey.HEARTBEAT: groups.heartbeat,
            m.ApiKey.LEAVE_GROUP: groups.leave_group,
            m.ApiKey.REPLICA_FETCH: replica_fetch.replica_fetch,
            m.ApiKey.DESCRIBE_CONFIGS: topics.describe_configs,
            m.ApiKey.ALTER_CONFIGS: topics.alter_configs,
            m.ApiKey.WRITE_TXN_MARKERS: transactions.write_txn_markers,
            m.ApiKey.INIT_PRODUCER_ID: transactions.init_producer_id,
            m.ApiKey.ADD_PARTITIONS_TO_TXN: transactions.add_partitions_to_txn,
            m.ApiKey.ADD_OFFSETS_TO_TXN: transactions.add_offsets_to_txn,
            m.ApiKey.END_TXN: transactions.end_txn,
            m.ApiKey.TXN_OFFSET_COMMIT: transactions.txn_offset_commit,
            m.ApiKey.FIND_HELD_TXNS: transactions.find_held_txns,
            # SASL belongs to a connection: the backend hands these to `access` (which knows the
            # connection's state) before they could get here; what does is from another core.
            m.ApiKey.SASL_HANDSHAKE: _sasl_elsewhere,
            m.ApiKey.SASL_AUTHENTICATE: _sasl_elsewhere,
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
            return self.ctx.error(frame, m.ErrorCode.UNSUPPORTED_VERSION, reason)
        if frame.api_key in PARTITION_APIS and self.config.cores > 1:
            core = self.core.owner(frame.topic_id, frame.partition)
            if core != self.config.core_id:
                if from_peer:
                    return self.ctx.error(
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
                    return self.ctx.error(
                        frame, m.ErrorCode.NOT_OWNER, f"node {node} coordinates group {group!r}"
                    )
                if core != self.config.core_id:
                    if from_peer:
                        return self.ctx.error(
                            frame, m.ErrorCode.NOT_OWNER, f"core {self.config.core_id} does not coordinate it"
                        )
                    return Forward(core, frame, frame.api_key in _WAITING_GROUP_APIS, True)
        if frame.api_key in TXN_APIS and self.config.cores > 1:
            forward = self._to_txn_coordinator(frame, from_peer)
            if forward is not None:
                return forward
        if from_peer and frame.api_key == m.ApiKey.DELETE_TOPIC:
            return topics.deleted_elsewhere(self.ctx, frame)
        if frame.api_key in _BETWEEN_CORES and not (from_peer or self.core.cluster.clustered):
            return self.ctx.error(
                frame,
                m.ErrorCode.INVALID_REQUEST,
                f"{m.ApiKey(frame.api_key).name} is between brokers' cores only",
            )
        try:
            req = m.decode_request(frame)
            return self._dispatch[frame.api_key](self.ctx, req, frame)
        except Exception as exc:  # every failure becomes an error response
            code, message = self.ctx.failure(frame, exc)
            if _is_silent_produce(frame):
                # acks=0 promises no response at all (docs/PROTOCOL.md §1): an error answer would
                # be taken for the reply to the client's next request. Counted, not sent.
                self.metrics.error()
                log.debug("acks=0 produce refused: %s: %s", code.name, message)
                return Silent()
            return self.ctx.error(frame, code, message)

    def _to_txn_coordinator(self, frame: Frame, from_peer: bool) -> Outcome | None:
        """A transaction request for a transactional id another core coordinates: forwarded
        there (NOT_OWNER when it came from a core already); None to serve it here (ours, a body
        that does not parse, a node that serves no transactions: the handler answers)."""
        if transactions.refusal(self.core) is not None:
            return None
        try:
            txn_id = m.decode_request(frame).txn_id  # type: ignore[attr-defined]
        except Exception as exc:  # answered by the dispatch
            log.debug("transaction request that does not decode: %s", exc)
            return None
        placed = self.core.transactions.coordinator_of(txn_id)
        if placed is None or placed[1] == self.config.core_id:
            return None
        core = placed[1]
        if from_peer:
            return self.ctx.error(
                frame, m.ErrorCode.NOT_OWNER, f"core {self.config.core_id} does not coordinate it"
            )
        return Forward(core, frame, True, True)

    def error_reply(self, frame: Frame, exc: BaseException) -> Reply:
        """The error response for `exc` raised while carrying out an outcome for `frame`."""
        return self.ctx.error_reply(frame, exc)

    def error_answer(self, frame: Frame, code: m.ErrorCode, message: str) -> Reply:
        """The error response with `code` to `frame` (counted in this core's metrics)."""
        return self.ctx.error(frame, code, message)

    def metadata_reply(
        self,
        req: m.MetadataRequest,
        frame: Frame,
        may_describe: Callable[[str], bool] | None = None,
        may_create: Callable[[str], bool] | None = None,
    ) -> Outcome:
        """The Metadata answer with ACLs on (broker/ringlog/access.py): broker/ringlog/topics.py."""
        return topics.metadata_creating(self.ctx, req, frame, may_describe, may_create)


def _api_versions(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    apis = tuple(m.ApiVersion(k, lo, hi) for k, (lo, hi) in sorted(m.SUPPORTED_VERSIONS.items()))
    resp = m.ApiVersionsResponse(
        broker_version=BROKER_VERSION, node_id=ctx.config.node_id, cores=ctx.config.cores, apis=apis
    )
    return ctx.reply(frame, resp)


def _sasl_elsewhere(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    return ctx.error(frame, m.ErrorCode.ILLEGAL_SASL_STATE, "SASL is not spoken between cores")


def _stats(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    """Every core's published snapshot, this core's own taken now, and the supervisor's eBPF
    snapshot (steering and XDP counters, bpf/state.py): only the supervisor holds the
    programs, so a client without access to the data dir gets them here (PROTOCOL.md §4.12)."""
    own = ctx.metrics.snapshot(ctx.core.gauges)
    snaps = [s for s in read_snapshots(ctx.config.data_dir, ctx.config.cores) if s.get("core") != own["core"]]
    snaps.append(own)
    snaps.sort(key=lambda s: int(s.get("core", 0)))
    doc = {
        "answered_by": ctx.config.core_id,
        "cores": ctx.config.cores,
        "snapshots": snaps,
        "bpf": ctx.config.bpf_snapshot(),
    }
    return ctx.reply(frame, m.StatsResponse(core=ctx.config.core_id, stats_json=json.dumps(doc)))


def _is_long_poll(frame: Frame) -> bool:
    """A fetch with max_wait_ms > 0: the owner may hold it (read before the frame is decoded)."""
    wait_ms = m.peek_fetch_max_wait_ms(frame)
    return wait_ms is not None and wait_ms > 0


def _is_silent_produce(frame: Frame) -> bool:
    """A produce with acks=0: the owner will send no answer."""
    return m.peek_produce_acks(frame) == m.Acks.NONE
